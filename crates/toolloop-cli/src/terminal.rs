//! Text from a model or a server, shown on a terminal.
//!
//! A model's text and tool names, and an error body from a server, are hostile bytes: written
//! raw to a terminal, an escape sequence can move the cursor, clear the screen, rewrite what was
//! shown before, set the window title or, on some terminals, answer back as if typed. Every
//! write of such text to a terminal goes through [`escape`], which shows control characters as
//! visible escapes (`\x1b`, `\u{202e}`) instead of sending them. Text written to a pipe or a
//! file is left as it is: those bytes are data.
//!
//! [`Screen`] writes streamed text to a terminal and can take back the text of a reply that was
//! abandoned (a stream that broke and is asked for again), so that the terminal ends showing
//! what the transcript holds.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write;
use unicode_width::UnicodeWidthChar;

/// Whether `c` must not reach a terminal as it is: C0 controls (but `\n` and `\t` when
/// `multiline`), DEL, C1 controls, and the Unicode bidirectional controls that reorder what is
/// shown (a "Trojan Source" line looks like something other than what it is).
fn is_unsafe(c: char, multiline: bool) -> bool {
    match c {
        '\n' | '\t' => !multiline,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
            true
        }
        _ => false,
    }
}

/// `text`, safe to show on a terminal: each control character is written as a visible escape
/// (`\x1b` for ESC, `\r`, `\u{9b}`, `\u{202e}`), so nothing in the text can move the cursor,
/// erase, recolour, set the title or reorder the line. `multiline` keeps `\n` and `\t` (an
/// answer); without it they are escaped too (a one-line progress message). Borrowed when there
/// is nothing to escape.
pub(crate) fn escape(text: &str, multiline: bool) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c, multiline)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !is_unsafe(c, multiline) {
            out.push(c);
            continue;
        }
        let _ = match c {
            '\n' => write!(out, "\\n"),
            '\t' => write!(out, "\\t"),
            '\r' => write!(out, "\\r"),
            c if (c as u32) < 0x80 => write!(out, "\\x{:02x}", c as u32),
            c => write!(out, "\\u{{{:x}}}", c as u32),
        };
    }
    Cow::Owned(out)
}

/// The most lines of a message [`diagnostic`] shows, and how many of them come from its end.
const DIAGNOSTIC_LINES: usize = 16;
const DIAGNOSTIC_TAIL: usize = 12;
/// The most characters of one line [`diagnostic`] shows.
const DIAGNOSTIC_WIDTH: usize = 300;

/// A message from a server or a model (an error body, a Python traceback), as a diagnostic on
/// stderr: over several lines as it was written, each control character escaped, continuation
/// lines indented, each line cut at 300 characters, and at most 16 lines: the first 4 and the
/// last 12 (a traceback's end says what failed), with a line saying how many were left out.
pub(crate) fn diagnostic(text: &str) -> String {
    let text = text.replace("\r\n", "\n");
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let line = |l: &str| -> String {
        let shown = escape(l, false);
        match shown.char_indices().nth(DIAGNOSTIC_WIDTH) {
            Some((at, _)) => format!("{}…", &shown[..at]),
            None => shown.into_owned(),
        }
    };
    let mut shown: Vec<String> = Vec::new();
    if lines.len() > DIAGNOSTIC_LINES {
        let head = DIAGNOSTIC_LINES - DIAGNOSTIC_TAIL;
        shown.extend(lines[..head].iter().map(|l| line(l)));
        shown.push(format!(
            "… ({} lines left out)",
            lines.len() - DIAGNOSTIC_LINES
        ));
        shown.extend(
            lines[lines.len() - DIAGNOSTIC_TAIL..]
                .iter()
                .map(|l| line(l)),
        );
    } else {
        shown.extend(lines.iter().map(|l| line(l)));
    }
    shown.join("\n    ")
}

/// `text` as it should go to stdout: escaped for a terminal, exact for a pipe or a file.
pub(crate) fn for_stdout(text: &str, terminal: bool) -> Cow<'_, str> {
    if terminal {
        escape(text, true)
    } else {
        Cow::Borrowed(text)
    }
}

/// Streamed text on a terminal, with what is needed to erase the current reply's text when its
/// attempt is abandoned: the cursor's column, and the rows and column where the attempt began.
///
/// The count follows the terminal's wrapping (a character that does not fit on the row goes to
/// the next; wide characters count two columns); it is exact unless the terminal is resized
/// while an attempt streams.
pub(crate) struct Screen<W: Write> {
    out: W,
    width: fn() -> usize,
    /// The cursor's column; `width` when a character filled the row's last column (the next
    /// one wraps).
    col: usize,
    /// Rows moved down since the attempt began.
    rows: usize,
    /// The column where the attempt began.
    start_col: usize,
    /// Whether the current attempt's text may still be abandoned (it began and its reply was
    /// not accepted yet).
    open: bool,
}

impl<W: Write> Screen<W> {
    /// Text to `out`, a terminal `width()` columns wide (asked at each write).
    pub(crate) fn new(out: W, width: fn() -> usize) -> Self {
        Screen {
            out,
            width,
            col: 0,
            rows: 0,
            start_col: 0,
            open: false,
        }
    }

    fn width(&self) -> usize {
        (self.width)().max(1)
    }

    /// Marks where a new attempt at a reply begins.
    pub(crate) fn begin_attempt(&mut self) {
        self.rows = 0;
        self.start_col = self.col;
        self.open = true;
    }

    /// The current attempt's reply was accepted: its text stays.
    pub(crate) fn accept(&mut self) {
        self.open = false;
    }

    /// Erases the current attempt's text unless its reply was accepted (the run ended while the
    /// reply was streaming, or its stream broke for good).
    pub(crate) fn abandon(&mut self) {
        if self.open {
            self.erase_attempt();
            self.open = false;
        }
    }

    /// Writes `text`, escaped.
    pub(crate) fn write_text(&mut self, text: &str) {
        let text = escape(text, true);
        let width = self.width();
        for c in text.chars() {
            match c {
                '\n' => {
                    self.rows += 1;
                    self.col = 0;
                }
                '\t' => {
                    if self.col >= width {
                        self.rows += 1;
                        self.col = 0;
                    }
                    self.col = ((self.col / 8 + 1) * 8).min(width - 1);
                }
                c => {
                    let w = c.width().unwrap_or(0);
                    if self.col + w > width {
                        self.rows += 1;
                        self.col = 0;
                    }
                    self.col += w;
                }
            }
        }
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }

    /// Erases the text written since [`Screen::begin_attempt`]: the cursor goes back where the
    /// attempt began and everything after it on the screen is cleared.
    pub(crate) fn erase_attempt(&mut self) {
        if self.rows == 0 && self.col == self.start_col {
            return;
        }
        let width = self.width();
        let (mut up, mut right) = (self.rows, self.start_col);
        if self.start_col >= width {
            // The attempt began with the cursor past the row's end: its first character wrapped.
            up = up.saturating_sub(1);
            right = 0;
        }
        let mut seq = String::from("\r");
        if up > 0 {
            let _ = write!(seq, "\x1b[{up}A");
        }
        if right > 0 {
            let _ = write!(seq, "\x1b[{right}C");
        }
        seq.push_str("\x1b[J");
        let _ = self.out.write_all(seq.as_bytes());
        let _ = self.out.flush();
        self.col = right;
        self.rows = 0;
        self.start_col = right;
    }

    /// Ends the current line, if text is on it (before a line of progress, and at the end).
    pub(crate) fn end_line(&mut self) {
        if self.col > 0 {
            let _ = self.out.write_all(b"\n");
            let _ = self.out.flush();
            self.col = 0;
            self.rows += 1;
        }
    }

    /// The writer, for the tests.
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> W {
        self.out
    }
}

/// The width of the terminal on stdout (80 when it cannot be told).
pub(crate) fn stdout_width() -> usize {
    console::Term::stdout()
        .size_checked()
        .map_or(80, |(_, cols)| usize::from(cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_sent() {
        let hostile = "a\x1b[2J\x1b]0;pwned\x07b\rc\u{9b}31m\u{7f}d\u{202e}e\u{2066}f\0";
        let shown = escape(hostile, true);
        assert_eq!(
            shown,
            "a\\x1b[2J\\x1b]0;pwned\\x07b\\rc\\u{9b}31m\\x7fd\\u{202e}e\\u{2066}f\\x00"
        );
        assert!(!shown.chars().any(|c| is_unsafe(c, false) && c != '\n'));
    }

    #[test]
    fn newlines_and_tabs_stay_in_answers_only() {
        assert_eq!(escape("one\n\ttwo", true), "one\n\ttwo");
        assert_eq!(escape("one\n\ttwo", false), "one\\n\\ttwo");
        assert!(matches!(escape("plain é 中文 ✓", false), Cow::Borrowed(_)));
    }

    #[test]
    fn a_traceback_reads_over_several_lines_escaped_and_capped() {
        let traceback = "Traceback (most recent call last):\r\n  File \"app.py\", line 1\n\
                         \x1b[2Jraise\nValueError: bad";
        assert_eq!(
            diagnostic(traceback),
            "Traceback (most recent call last):\n      File \"app.py\", line 1\n    \
             \\x1b[2Jraise\n    ValueError: bad"
        );
        let long: Vec<String> = (1..=40).map(|i| format!("line {i}")).collect();
        let shown = diagnostic(&long.join("\n"));
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 17, "{shown}");
        assert_eq!(lines[0], "line 1");
        assert_eq!(lines[4], "    … (24 lines left out)");
        assert_eq!(lines[16], "    line 40");
        let wide = "x".repeat(1000);
        assert_eq!(diagnostic(&wide).chars().count(), 301);
    }

    #[test]
    fn stdout_is_exact_when_not_a_terminal() {
        let text = "a\x1b[31mred\x1b[0m\r\n";
        assert_eq!(for_stdout(text, false), text);
        assert_eq!(for_stdout(text, true), "a\\x1b[31mred\\x1b[0m\\r\n");
    }

    fn ten() -> usize {
        10
    }

    fn written(screen: Screen<Vec<u8>>) -> String {
        String::from_utf8(screen.into_inner()).unwrap()
    }

    #[test]
    fn an_abandoned_attempt_is_erased_back_to_where_it_began() {
        let mut s = Screen::new(Vec::new(), ten);
        s.write_text("ab");
        s.begin_attempt();
        // 8 more columns fill the row; "x" wraps to the second row; "\n" to the third.
        s.write_text("Hello wor\x1b[2Jx\nyz");
        s.erase_attempt();
        s.write_text("Hi");
        assert_eq!(
            written(s),
            "abHello wor\\x1b[2Jx\nyz\r\x1b[2A\x1b[2C\x1b[JHi",
            "from column 2, `r` wraps to the second row, the newline goes to the third"
        );
    }

    #[test]
    fn wide_characters_and_exact_fills_are_counted() {
        let mut s = Screen::new(Vec::new(), ten);
        s.begin_attempt();
        s.write_text("中文中文中"); // 10 columns: the row is full, no wrap yet.
        s.erase_attempt();
        assert!(written(s).ends_with("\r\x1b[J"));

        let mut s = Screen::new(Vec::new(), ten);
        s.begin_attempt();
        s.write_text("中文中文中文"); // the sixth wraps.
        s.erase_attempt();
        assert!(written(s).ends_with("\r\x1b[1A\x1b[J"));
    }

    #[test]
    fn nothing_to_erase_writes_nothing() {
        let mut s = Screen::new(Vec::new(), ten);
        s.write_text("done");
        s.end_line();
        s.begin_attempt();
        s.erase_attempt();
        s.end_line();
        assert_eq!(written(s), "done\n");
    }
}
