//! Progress on stderr while a run goes on: a spinner with the current step, and a line for each
//! tool call and how it ended. Hidden when stderr is not a terminal or when `--json` is given.
//!
//! With `--stream`, stdout shows what the transcript holds of the model's replies, and nothing
//! else:
//!
//! - on a terminal, the text is shown as it arrives (escaped, see [`crate::terminal`]); when a
//!   stream breaks and the reply is asked for again, or the run ends while a reply streams, the
//!   unfinished attempt's text is erased. The text then stands in for the spinner (a spinner
//!   redrawn on a line that text is being written to would garble it); the tool lines are still
//!   shown.
//! - to a pipe or a file, nothing of a reply is written before it is accepted (its stream ended
//!   and the loop took it): each reply's text is written whole then, the exact bytes.

use crate::terminal::{Screen, escape};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use toolloop::event::Event;
use toolloop::outcome::CallStatus;

type Out = Box<dyn Write + Send>;

/// Shows a run's progress.
pub(crate) struct Progress {
    /// The spinner, when shown.
    bar: Option<ProgressBar>,
    /// Where the progress lines go when there is no spinner; `None` shows none.
    lines: Option<Mutex<Out>>,
    /// The streamed text, if any.
    text: Option<Mutex<Text>>,
    /// The run was cancelled: nothing more of its replies is shown.
    stopped: AtomicBool,
    /// The model's context window in tokens (0: unknown), for `ctx N%`.
    window: AtomicU64,
    /// The input tokens of the last request (or the estimate after a compaction).
    context_used: AtomicU64,
}

/// Where streamed text goes.
enum Text {
    /// A terminal: written as it arrives, erased if abandoned.
    Screen(Screen<Out>),
    /// A pipe or a file: each reply's text once accepted.
    Pipe {
        out: Out,
        /// The current attempt's text, not accepted yet.
        pending: String,
        /// Whether any text was written.
        wrote: bool,
    },
}

impl Text {
    fn pipe(out: Out) -> Self {
        Text::Pipe {
            out,
            pending: String::new(),
            wrote: false,
        }
    }

    /// A new attempt at a reply begins (a round, or a retry of its stream).
    fn begin(&mut self) {
        match self {
            Text::Screen(s) => s.begin_attempt(),
            Text::Pipe { pending, .. } => pending.clear(),
        }
    }

    fn delta(&mut self, text: &str) {
        match self {
            Text::Screen(s) => s.write_text(text),
            Text::Pipe { pending, .. } => pending.push_str(text),
        }
    }

    /// The attempt's stream broke: its text is void.
    fn retry(&mut self) {
        match self {
            Text::Screen(s) => s.erase_attempt(),
            Text::Pipe { pending, .. } => pending.clear(),
        }
    }

    /// The reply was accepted into the transcript.
    fn accept(&mut self) {
        match self {
            Text::Screen(s) => s.accept(),
            Text::Pipe {
                out,
                pending,
                wrote,
            } => {
                if !pending.is_empty() {
                    let _ = out.write_all(pending.as_bytes());
                    let _ = out.flush();
                    *wrote = true;
                    pending.clear();
                }
            }
        }
    }

    /// The run ended: a reply not accepted is void.
    fn end(&mut self) {
        match self {
            Text::Screen(s) => s.abandon(),
            Text::Pipe { pending, .. } => pending.clear(),
        }
    }

    /// Ends the line of text, if one is open.
    fn end_line(&mut self) {
        match self {
            Text::Screen(s) => s.end_line(),
            Text::Pipe { out, wrote, .. } => {
                if std::mem::take(wrote) {
                    let _ = out.write_all(b"\n");
                    let _ = out.flush();
                }
            }
        }
    }
}

impl Progress {
    /// Progress on stderr when `show`; the model's text streamed to stdout when `stream_text`.
    pub(crate) fn new(show: bool, stream_text: bool) -> Self {
        let stdout = || Box::new(std::io::stdout()) as Out;
        let text = match (stream_text, std::io::stdout().is_terminal()) {
            (false, _) => None,
            (true, true) => Some(Text::Screen(Screen::new(
                stdout(),
                crate::terminal::stdout_width,
            ))),
            (true, false) => Some(Text::pipe(stdout())),
        };
        let on_screen = matches!(text, Some(Text::Screen(_)));
        if !show || on_screen {
            let lines = show.then(|| Box::new(std::io::stderr()) as Out);
            return Self::with_output(lines, text);
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress {
            bar: Some(bar),
            lines: None,
            text: text.map(Mutex::new),
            stopped: Default::default(),
            window: AtomicU64::new(0),
            context_used: AtomicU64::new(0),
        }
    }

    /// Progress lines to `lines` (none when `None`) and streamed text to `text`, without a
    /// spinner.
    fn with_output(lines: Option<Out>, text: Option<Text>) -> Self {
        Progress {
            bar: None,
            lines: lines.map(Mutex::new),
            text: text.map(Mutex::new),
            stopped: Default::default(),
            window: AtomicU64::new(0),
            context_used: AtomicU64::new(0),
        }
    }

    fn text(&self, f: impl FnOnce(&mut Text)) {
        if let Some(text) = &self.text
            && let Ok(mut t) = text.lock()
        {
            f(&mut t);
        }
    }

    fn shown(&self) -> bool {
        self.bar.is_some() || self.lines.is_some()
    }

    /// Writes a line of progress (its parts from the model or a server already escaped).
    fn line(&self, text: String) {
        if let Some(bar) = &self.bar {
            bar.println(text);
        } else if let Some(lines) = &self.lines {
            self.text(Text::end_line);
            if let Ok(mut out) = lines.lock() {
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
        }
    }

    /// The run is being cancelled: the reply streaming now is taken back from the terminal
    /// (the terminal's `^C` with it), nothing more of the run's replies is shown, and `note`
    /// says what happens, on stderr.
    pub(crate) fn interrupted(&self, note: &str) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        // Under the text's lock: no reply's text is written between the erase and the note.
        let mut said = false;
        self.text(|t| {
            t.end();
            t.end_line();
            self.note(note);
            said = true;
        });
        if !said {
            self.note(note);
        }
    }

    /// A line on stderr, shown whether or not progress is: through the spinner, the progress
    /// lines' writer, or stderr.
    fn note(&self, note: &str) {
        if let Some(bar) = &self.bar {
            bar.println(note);
        } else if let Some(lines) = &self.lines {
            if let Ok(mut out) = lines.lock() {
                let _ = writeln!(out, "{note}");
                let _ = out.flush();
            }
        } else {
            eprintln!("{note}");
        }
    }

    /// The model's context window, when known: the progress line shows how much of it the
    /// last request used (`ctx 61%`).
    pub(crate) fn set_window(&self, window: Option<u64>) {
        self.window.store(window.unwrap_or(0), Ordering::Relaxed);
    }

    /// ` · ctx N%` once a request's size is known against a known window.
    fn context_share(&self) -> String {
        let (window, used) = (
            self.window.load(Ordering::Relaxed),
            self.context_used.load(Ordering::Relaxed),
        );
        if window == 0 || used == 0 {
            return String::new();
        }
        format!(" · ctx {}%", (used * 100 / window).min(999))
    }

    /// Updates the display for one event.
    pub(crate) fn event(&self, event: &Event) {
        if self.stopped.load(Ordering::SeqCst) {
            return;
        }
        match event {
            Event::RoundFinished { usage: Some(u), .. } if u.input_tokens > 0 => {
                self.context_used.store(u.input_tokens, Ordering::Relaxed)
            }
            Event::ContextCompacted { tokens_after, .. } => {
                self.context_used.store(*tokens_after, Ordering::Relaxed)
            }
            _ => {}
        }
        match event {
            Event::RoundStarted { .. } => self.text(Text::begin),
            Event::TextDelta { text, .. } => self.text(|t| t.delta(text)),
            Event::ModelRetry { .. } => self.text(Text::retry),
            // What follows a reply the loop took: its calls, or the end of its round.
            Event::ToolCallRequested { .. } | Event::RoundFinished { .. } => {
                self.text(Text::accept)
            }
            Event::RunFinished { .. } => self.text(Text::end),
            _ => {}
        }
        if !self.shown() {
            return;
        }
        match event {
            Event::RoundStarted { round, .. } => self.set(format!(
                "round {round}: waiting for the model{}",
                self.context_share()
            )),
            Event::ContextCompacted {
                tokens_before,
                tokens_after,
                messages_summarised,
                ..
            } => self.line(format!(
                "  ⇣ context compacted: {messages_summarised} messages summarised, about \
                 {tokens_before} → {tokens_after} tokens"
            )),
            Event::ResultSpilled { call_id, bytes, .. } => self.line(format!(
                "  ⇣ result of call {} cut for the model ({bytes} bytes kept whole; it reads \
                 the rest with read_result)",
                escape(call_id, false)
            )),
            Event::ToolStarted {
                round,
                name,
                attempt,
                ..
            } => {
                let again = if *attempt > 1 {
                    format!(" (attempt {attempt})")
                } else {
                    String::new()
                };
                self.set(format!(
                    "round {round}: running {}{again}",
                    escape(name, false)
                ))
            }
            Event::ToolFinished {
                name,
                status,
                duration_ms,
                ..
            } => {
                let mark = if *status == CallStatus::Ok {
                    "✓"
                } else {
                    "✗"
                };
                let status = serde_json::to_value(status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                self.line(format!(
                    "  {mark} {} {status} ({duration_ms} ms)",
                    escape(name, false)
                ));
            }
            Event::DuplicateDetected { call, .. } => self.line(format!(
                "  ↻ {} not run: duplicate call",
                escape(&call.name, false)
            )),
            Event::InvalidToolCall { call, reason, .. } => self.line(format!(
                "  ✗ {} invalid: {}",
                escape(&call.name, false),
                escape(reason, false)
            )),
            Event::ModelRetry { round, reason, .. } => self.line(format!(
                "  ↻ round {round}: the stream broke ({}); asking again",
                escape(reason, false)
            )),
            Event::ToolsChanged {
                added,
                removed,
                changed,
                ..
            } => {
                let names = |mark: &str, list: &[String]| {
                    list.iter()
                        .map(|n| format!("{mark}{}", escape(n, false)))
                        .collect::<Vec<_>>()
                };
                let mut all = names("+", added);
                all.extend(names("-", removed));
                all.extend(names("~", changed));
                self.line(format!("  ⟳ the tools changed: {}", all.join(" ")))
            }
            Event::Child { path, event, .. } => self.child(path, event),
            _ => {}
        }
        if let Event::ModelRetry { .. } = event {
            // The next attempt begins after the line about the retry.
            self.text(Text::begin);
        }
    }

    /// A sub-agent's event: which agent works on what (`└ reviewer: read_file src/lib.rs`).
    fn child(&self, path: &[String], event: &Event) {
        let joined = path.join("/");
        let who = escape(&joined, false);
        match event {
            Event::RoundStarted { .. } => self.set(format!("└ {who}: waiting for the model")),
            Event::ToolCallRequested { call, .. } => {
                let what = call_summary(&call.arguments);
                self.line(format!(
                    "  └ {who}: {}{}",
                    escape(&call.name, false),
                    if what.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", escape(&what, false))
                    }
                ));
            }
            Event::ToolStarted { name, .. } => {
                self.set(format!("└ {who}: running {}", escape(name, false)))
            }
            Event::ToolFinished { name, status, .. } if *status != CallStatus::Ok => {
                let status = serde_json::to_value(status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                self.line(format!("  └ {who}: ✗ {} {status}", escape(name, false)));
            }
            Event::RunFinished { outcome } if !outcome.success => {
                self.line(format!("  └ {who}: stopped ({:?})", outcome.stop_reason));
            }
            _ => {}
        }
    }

    fn set(&self, message: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(message);
        }
    }

    /// Runs `f` with the spinner hidden (a question asked on the terminal).
    pub(crate) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Removes the spinner and ends the streamed text's line.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.text(Text::end_line);
    }

    /// Whether the replies' text was streamed (and the answer is not to be written again).
    pub(crate) fn streamed(&self) -> bool {
        self.text.is_some()
    }
}

/// A call's arguments in a few words: its first string argument (a path, a command), cut at
/// 60 characters.
fn call_summary(arguments: &serde_json::Value) -> String {
    let first = arguments
        .as_object()
        .and_then(|o| o.values().find_map(|v| v.as_str()))
        .unwrap_or_default();
    let line = first.lines().next().unwrap_or_default();
    match line.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use toolloop::message::ToolCall;

    /// A fake terminal: everything written to it, stdout and stderr alike, in order.
    #[derive(Clone, Default)]
    struct Tty(Arc<Mutex<Vec<u8>>>);

    impl Write for Tty {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Tty {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn eighty() -> usize {
        80
    }

    fn on_tty(show: bool) -> (Progress, Tty) {
        let tty = Tty::default();
        let lines = show.then(|| Box::new(tty.clone()) as Out);
        let screen = Screen::new(Box::new(tty.clone()) as Out, eighty);
        (
            Progress::with_output(lines, Some(Text::Screen(screen))),
            tty,
        )
    }

    fn delta(text: &str) -> Event {
        Event::TextDelta {
            round: 1,
            text: text.into(),
        }
    }

    #[test]
    fn tool_names_and_reasons_reach_the_terminal_escaped() {
        let (progress, tty) = on_tty(true);
        let name = "evil\x1b]0;owned\x07\x1b[2J";
        progress.event(&Event::ToolFinished {
            round: 1,
            call_id: "c1".into(),
            name: name.into(),
            success: false,
            status: CallStatus::Failed,
            duration_ms: 3,
        });
        progress.event(&Event::InvalidToolCall {
            round: 1,
            call: ToolCall::new(name, serde_json::json!({})),
            reason: "unknown tool\r\x1b[1A".into(),
        });
        // A server names its tools: a new one's name is escaped too.
        progress.event(&Event::ToolsChanged {
            round: 2,
            added: vec![name.into()],
            removed: vec!["old".into()],
            changed: vec![],
        });
        let shown = tty.text();
        assert!(
            shown.contains("⟳ the tools changed: +evil\\x1b]0;owned\\x07\\x1b[2J -old"),
            "{shown}"
        );
        assert!(!shown.contains('\x1b') && !shown.contains('\x07') && !shown.contains('\r'));
        assert!(
            shown.contains("✗ evil\\x1b]0;owned\\x07\\x1b[2J failed (3 ms)"),
            "{shown}"
        );
        assert!(
            shown.contains("invalid: unknown tool\\r\\x1b[1A"),
            "{shown}"
        );
    }

    #[test]
    fn a_sub_agents_calls_say_which_agent_works() {
        let (progress, tty) = on_tty(true);
        let child = |path: &[&str], event: Event| Event::Child {
            path: path.iter().map(|p| p.to_string()).collect(),
            call_id: "c1".into(),
            event: Box::new(event),
        };
        progress.event(&child(
            &["reviewer"],
            Event::ToolCallRequested {
                round: 1,
                call: ToolCall::new("read_file", serde_json::json!({"path": "src/lib.rs"})),
            },
        ));
        // A grandchild's, by its whole path; a failed call says so.
        progress.event(&child(
            &["planner", "reviewer"],
            Event::ToolFinished {
                round: 1,
                call_id: "c2".into(),
                name: "run_command".into(),
                success: false,
                status: CallStatus::Failed,
                duration_ms: 3,
            },
        ));
        let shown = tty.text();
        assert!(
            shown.contains("  └ reviewer: read_file src/lib.rs\n"),
            "{shown}"
        );
        assert!(
            shown.contains("  └ planner/reviewer: ✗ run_command failed\n"),
            "{shown}"
        );
    }

    #[test]
    fn streamed_text_is_escaped_and_a_broken_attempt_is_erased() {
        let (progress, tty) = on_tty(false);
        progress.event(&Event::RoundStarted {
            round: 1,
            message_count: 1,
        });
        progress.event(&delta("Hello \x1b[2Jwor"));
        progress.event(&Event::ModelRetry {
            round: 1,
            attempt: 2,
            reason: "connection reset".into(),
        });
        progress.event(&delta("Hello world."));
        progress.finish();
        assert_eq!(
            tty.text(),
            "Hello \\x1b[2Jwor\r\x1b[JHello world.\n",
            "the first attempt is erased back to the start of the line, then the final text"
        );
    }

    #[test]
    fn the_line_shows_the_share_of_the_window_the_last_request_used() {
        let (progress, tty) = on_tty(true);
        assert_eq!(progress.context_share(), "");
        progress.set_window(Some(10_000));
        assert_eq!(progress.context_share(), "", "no request yet");
        progress.event(&Event::RoundFinished {
            round: 1,
            finish_reason: Default::default(),
            usage: Some(toolloop::usage::Usage {
                input_tokens: 6_100,
                ..Default::default()
            }),
            total_usage: None,
        });
        assert_eq!(progress.context_share(), " · ctx 61%");
        progress.event(&Event::ContextCompacted {
            round: 2,
            tokens_before: 8_100,
            tokens_after: 1_200,
            messages_summarised: 30,
            usage: None,
        });
        assert_eq!(progress.context_share(), " · ctx 12%");
        assert!(
            tty.text()
                .contains("context compacted: 30 messages summarised, about 8100 → 1200"),
            "{}",
            tty.text()
        );
        progress.set_window(None);
        assert_eq!(progress.context_share(), "");
    }

    fn round_finished() -> Event {
        Event::RoundFinished {
            round: 1,
            finish_reason: Default::default(),
            usage: Default::default(),
            total_usage: Default::default(),
        }
    }

    #[test]
    fn piped_text_is_written_once_its_reply_is_accepted_and_exact() {
        let out = Tty::default();
        let progress = Progress::with_output(None, Some(Text::pipe(Box::new(out.clone()))));
        progress.event(&Event::RoundStarted {
            round: 1,
            message_count: 1,
        });
        progress.event(&delta("Let me \x1b[1mlook"));
        assert_eq!(out.text(), "", "nothing of a reply before it is accepted");
        progress.event(&Event::ToolCallRequested {
            round: 1,
            call: ToolCall::new("read_file", serde_json::json!({})),
        });
        progress.event(&Event::RoundStarted {
            round: 2,
            message_count: 3,
        });
        progress.event(&delta("Hello wor"));
        progress.event(&Event::ModelRetry {
            round: 2,
            attempt: 2,
            reason: "cut".into(),
        });
        progress.event(&delta("Hello world."));
        progress.event(&round_finished());
        progress.finish();
        assert_eq!(out.text(), "Let me \x1b[1mlookHello world.\n");
    }

    #[test]
    fn a_reply_cut_by_the_end_of_the_run_is_not_shown() {
        let out = Tty::default();
        let mut pipe = Text::pipe(Box::new(out.clone()));
        pipe.begin();
        pipe.delta("half a rep");
        pipe.end();
        pipe.end_line();
        assert_eq!(out.text(), "");

        let tty = Tty::default();
        let mut screen = Text::Screen(Screen::new(Box::new(tty.clone()) as Out, eighty));
        screen.begin();
        screen.delta("kept");
        screen.accept();
        screen.end_line();
        screen.begin();
        screen.delta("half a rep");
        screen.end();
        screen.end_line();
        assert_eq!(tty.text(), "kept\nhalf a rep\r\x1b[J");
    }

    /// Ctrl-C while a reply streams over several rows: the whole reply is taken back (the
    /// cursor goes up every row it took), then the note; what the run emits after is not shown.
    #[test]
    fn an_interrupted_reply_is_erased_whole_before_the_note() {
        let tty = Tty::default();
        let screen = Screen::new(Box::new(tty.clone()) as Out, || 10);
        let progress =
            Progress::with_output(Some(Box::new(tty.clone())), Some(Text::Screen(screen)));
        progress.event(&Event::RoundStarted {
            round: 1,
            message_count: 1,
        });
        // 10 columns: "0123456789" fills the first row, "abc" wraps, then a new line.
        progress.event(&delta("0123456789abc\nxy"));
        progress.interrupted("cancelling");
        progress.event(&delta("late text"));
        progress.event(&round_finished());
        progress.finish();
        assert_eq!(
            tty.text(),
            "0123456789abc\nxy\r\x1b[2A\x1b[Jcancelling\n",
            "up two rows to the reply's start, cleared, then the note"
        );
    }

    #[test]
    fn the_retry_line_comes_after_the_erased_attempt() {
        let (progress, tty) = on_tty(true);
        progress.event(&Event::RoundStarted {
            round: 1,
            message_count: 1,
        });
        progress.event(&delta("Hel"));
        progress.event(&Event::ModelRetry {
            round: 1,
            attempt: 2,
            reason: "cut\x1b[H".into(),
        });
        progress.event(&delta("Hello."));
        progress.finish();
        assert_eq!(
            tty.text(),
            "Hel\r\x1b[J  ↻ round 1: the stream broke (cut\\x1b[H); asking again\nHello.\n"
        );
    }
}
