//! Progress on stderr while a run goes on: a spinner with the current step, and a line for each
//! tool call and how it ended. Hidden when stderr is not a terminal or when `--json` is given.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::time::Duration;
use toolloop::event::Event;
use toolloop::outcome::CallStatus;

/// Shows a run's progress.
pub struct Progress {
    bar: Option<ProgressBar>,
    stream_text: bool,
}

impl Progress {
    /// A spinner on stderr when `show`; streamed text goes to stdout when `stream_text`.
    pub fn new(show: bool, stream_text: bool) -> Self {
        let bar = show.then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress { bar, stream_text }
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Updates the display for one event.
    pub fn event(&self, event: &Event) {
        match event {
            Event::TextDelta { text, .. } if self.stream_text => {
                let write = || {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(text.as_bytes());
                    let _ = out.flush();
                };
                match &self.bar {
                    Some(bar) => bar.suspend(write),
                    None => write(),
                }
            }
            _ if self.bar.is_none() => {}
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
                self.set(format!("round {round}: running {name}{again}"))
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
                self.line(format!("  {mark} {name} {status} ({duration_ms} ms)"));
            }
            Event::DuplicateDetected { call, .. } => {
                self.line(format!("  ↻ {} not run: duplicate call", call.name))
            }
            Event::InvalidToolCall { call, reason, .. } => {
                self.line(format!("  ✗ {} invalid: {reason}", call.name))
            }
            Event::ModelRetry { round, reason, .. } => self.line(format!(
                "  ↻ round {round}: the stream broke ({reason}); asking again"
            )),
            _ => {}
        }
    }

    fn set(&self, message: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(message);
        }
    }

    /// Removes the spinner.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
