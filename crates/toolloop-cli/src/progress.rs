//! Progress on stderr while a run goes on: a spinner with the current step, and a line for each
//! tool call and how it ended. Hidden when stderr is not a terminal or when `--json` is given.
//!
//! With `--stream` and stdout a terminal, the model's text is shown as it arrives (escaped, see
//! [`crate::terminal`]); when a stream breaks and the reply is asked for again, the broken
//! attempt's text is erased, so the terminal ends showing what the transcript holds. The text
//! then stands in for the spinner (a spinner redrawn on a line that text is being written to
//! would garble it); the tool lines are still shown. When stdout is not a terminal, nothing is
//! streamed: the answer is written once it is final (see `run`).

use crate::terminal::{Screen, escape};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;
use toolloop::event::Event;
use toolloop::outcome::CallStatus;

type Out = Box<dyn Write + Send>;

/// Shows a run's progress.
pub struct Progress {
    /// The spinner, when shown.
    bar: Option<ProgressBar>,
    /// Where the progress lines go when there is no spinner; `None` shows none.
    lines: Option<Mutex<Out>>,
    /// The streamed text, when it goes to a terminal.
    screen: Option<Mutex<Screen<Out>>>,
}

impl Progress {
    /// Progress on stderr when `show`; the model's text streamed to stdout when `stream_text`
    /// and stdout is a terminal.
    pub fn new(show: bool, stream_text: bool) -> Self {
        let screen = (stream_text && std::io::stdout().is_terminal()).then(|| {
            Screen::new(
                Box::new(std::io::stdout()) as Out,
                crate::terminal::stdout_width,
            )
        });
        if !show || screen.is_some() {
            let lines = show.then(|| Box::new(std::io::stderr()) as Out);
            return Self::with_output(lines, screen);
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress {
            bar: Some(bar),
            lines: None,
            screen: None,
        }
    }

    /// Progress lines to `lines` (none when `None`) and streamed text to `screen`, without a
    /// spinner.
    fn with_output(lines: Option<Out>, screen: Option<Screen<Out>>) -> Self {
        Progress {
            bar: None,
            lines: lines.map(Mutex::new),
            screen: screen.map(Mutex::new),
        }
    }

    fn screen(&self, f: impl FnOnce(&mut Screen<Out>)) {
        if let Some(screen) = &self.screen
            && let Ok(mut s) = screen.lock()
        {
            f(&mut s);
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
            self.screen(Screen::end_line);
            if let Ok(mut out) = lines.lock() {
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
        }
    }

    /// Updates the display for one event.
    pub fn event(&self, event: &Event) {
        match event {
            Event::RoundStarted { .. } => self.screen(Screen::begin_attempt),
            Event::TextDelta { text, .. } => self.screen(|s| s.write_text(text)),
            Event::ModelRetry { .. } => self.screen(Screen::erase_attempt),
            _ => {}
        }
        if !self.shown() {
            return;
        }
        match event {
            Event::RoundStarted { round, .. } => {
                self.set(format!("round {round}: waiting for the model"))
            }
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
            _ => {}
        }
        if let Event::ModelRetry { .. } = event {
            // The next attempt begins after the line about the retry.
            self.screen(Screen::begin_attempt);
        }
    }

    fn set(&self, message: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(message);
        }
    }

    /// Removes the spinner and ends the streamed text's line.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.screen(Screen::end_line);
    }

    /// Whether the answer was streamed to the terminal (and is not to be written again).
    pub fn streamed(&self) -> bool {
        self.screen.is_some()
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
        (Progress::with_output(lines, Some(screen)), tty)
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
        let shown = tty.text();
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
