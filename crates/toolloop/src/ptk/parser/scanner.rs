//! The incremental scanner: finds where a call may open, holds the text until it can decide,
//! and hands each opener to its dialect's reader; `<think>` reasoning.

use super::fence::fence;
use super::llama::{bare, python_tag};
use super::miss::reteach;
use super::mistral::mistral;
use super::python_list::{python_start, pythonic_list};
use super::sections::{DEEPSEEK, KIMI, section};
use super::tagged::{Tag, tagged};
use super::text::{find_ci, first_char_len, starts_with_ci};
use super::{ParsedCall, Piece};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use std::sync::Arc;

/// What to do with the text at the front of the buffer.
#[derive(Debug)]
pub(super) enum Decision {
    /// The text so far cannot decide it.
    NeedMore,
    /// These many bytes are plain text.
    Text(usize),
    /// These many bytes are dropped.
    Strip(usize),
    /// These many bytes hold these calls.
    Calls(usize, Vec<ParsedCall>),
    /// These many bytes are an attempted call that does not parse.
    Miss(usize, String),
    /// These many bytes are reasoning; the reasoning itself.
    Reasoning(usize, String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Opener {
    Ptk,
    ToolCall,
    Function,
    ToolCalls,
    PythonTag,
    Fence,
    Strip,
    Bare,
    DeepSeek,
    Kimi,
    Think,
    PythonStart,
    Pythonic,
}

/// What must arrive before a held call is worth examining again. Re-examining costs time
/// linear in the held text, so a long call streamed in small deltas would cost quadratic time
/// without this. A gate only ever delays a decision (which depends on the text alone, never on
/// when it is made), and `finish` always decides, so gates cannot change any result.
#[derive(Debug)]
struct Gate {
    /// The buffer length the gate has seen.
    len: usize,
    kind: GateKind,
}

#[derive(Debug)]
enum GateKind {
    /// Examine on every delta.
    Always,
    /// Wait for this closing tag.
    Close(&'static str),
    /// Wait for a backtick (the end of a code fence).
    Backtick,
    /// Wait until the JSON brackets are balanced again (outside strings).
    Json {
        depth: i64,
        quote: Option<u8>,
        escaped: bool,
    },
}

impl Gate {
    fn new(kind: GateKind, len: usize) -> Self {
        Gate { len, kind }
    }

    fn for_held(opener: Opener, buf: &[u8]) -> Self {
        if buf.len() <= EAGER_LIMIT {
            return Gate::new(GateKind::Always, buf.len());
        }
        let kind = match opener {
            Opener::Ptk => GateKind::Close("</ptk_call>"),
            Opener::ToolCall => GateKind::Close("</tool_call>"),
            Opener::Function => GateKind::Close("</function>"),
            Opener::Fence => GateKind::Backtick,
            Opener::DeepSeek => GateKind::Close("｜>"),
            Opener::Kimi => GateKind::Close("|>"),
            Opener::Think => GateKind::Close("</think>"),
            Opener::ToolCalls
            | Opener::PythonTag
            | Opener::Bare
            | Opener::Pythonic
            | Opener::PythonStart => {
                let mut gate = Gate::new(
                    GateKind::Json {
                        depth: 0,
                        quote: None,
                        escaped: false,
                    },
                    0,
                );
                gate.advance(buf);
                return gate;
            }
            Opener::Strip => GateKind::Always,
        };
        Gate::new(kind, buf.len())
    }

    /// Takes in the bytes after `len`; returns whether the held text should be examined.
    fn advance(&mut self, buf: &[u8]) -> bool {
        let from = self.len.min(buf.len());
        self.len = buf.len();
        match &mut self.kind {
            GateKind::Always => true,
            GateKind::Backtick => buf[from..].contains(&b'`'),
            GateKind::Close(close) => {
                let start = from.saturating_sub(close.len() - 1);
                buf[start..]
                    .windows(close.len())
                    .any(|w| w.eq_ignore_ascii_case(close.as_bytes()))
            }
            GateKind::Json {
                depth,
                quote,
                escaped,
            } => {
                let mut wake = false;
                for &b in &buf[from..] {
                    if let Some(q) = *quote {
                        if *escaped {
                            *escaped = false;
                        } else if b == b'\\' {
                            *escaped = true;
                        } else if b == q {
                            *quote = None;
                        }
                        continue;
                    }
                    match b {
                        b'{' | b'[' => *depth += 1,
                        b'}' | b']' => *depth -= 1,
                        b'"' | b'\'' if *depth > 0 => *quote = Some(b),
                        _ => {}
                    }
                    if *depth <= 0 {
                        wake = true;
                    }
                }
                wake
            }
        }
    }
}

const OPENERS: &[(&str, Opener)] = &[
    ("<ptk_call", Opener::Ptk),
    ("<tool_call", Opener::ToolCall),
    ("<function=", Opener::Function),
    ("<|python_tag|>", Opener::PythonTag),
    ("</ptk_call>", Opener::Strip),
    ("</tool_call>", Opener::Strip),
    ("<|eom_id|>", Opener::Strip),
    ("<|eot_id|>", Opener::Strip),
    ("<|eot|>", Opener::Strip),
    ("<|eom|>", Opener::Strip),
    ("[tool_calls]", Opener::ToolCalls),
    ("<｜tool▁calls▁begin｜>", Opener::DeepSeek),
    ("<｜tool▁call▁begin｜>", Opener::DeepSeek),
    ("<｜tool▁calls▁end｜>", Opener::Strip),
    ("<｜end▁of▁sentence｜>", Opener::Strip),
    ("<|tool_calls_section_begin|>", Opener::Kimi),
    ("<|tool_call_begin|>", Opener::Kimi),
    ("<|tool_calls_section_end|>", Opener::Strip),
    ("<think>", Opener::Think),
    ("</think>", Opener::Strip),
    ("<|python_start|>", Opener::PythonStart),
    ("<|python_end|>", Opener::Strip),
    ("```", Opener::Fence),
];

/// A new held text is re-examined at once while it is short; past this length, only when a
/// character that can end a call arrives (a pure speed-up: decisions never depend on timing).
const EAGER_LIMIT: usize = 512;

/// The incremental scanner shared by [`parse_reply`] and the stream parser.
#[derive(Debug)]
pub(crate) struct Scanner {
    /// The tools offered (shared: a scanner per streamed reply copies no catalog).
    tools: Arc<[ToolSpec]>,
    buf: String,
    /// Whether `buf` starts at the beginning of a line (only spaces since the last newline).
    line_start: bool,
    /// Whether any text has been emitted.
    started: bool,
    /// Whether a call came after the last emitted text.
    after_call: bool,
    /// Whitespace held back at the end of the emitted text.
    pending_ws: String,
    /// Set while the front of the buffer is undecided: what must arrive before it is worth
    /// examining again.
    gate: Option<Gate>,
    /// The reply may begin inside a reasoning block whose `<think>` the chat template wrote
    /// (DeepSeek R1, Qwen3 thinking): until a `</think>` arrives, or the reply ends without
    /// one, nothing is decided.
    implicit_think: bool,
    /// The dialect the model was taught: a near miss's explanation teaches it, whatever the
    /// attempt resembled.
    pub(crate) teach: Option<Dialect>,
}

impl Scanner {
    pub(crate) fn new(tools: &[ToolSpec]) -> Self {
        Scanner::shared(Arc::from(tools))
    }

    /// A scanner for a reply to a request offering `tools`, shared with whoever holds them.
    pub(crate) fn shared(tools: Arc<[ToolSpec]>) -> Self {
        Scanner {
            tools,
            buf: String::new(),
            line_start: true,
            started: false,
            after_call: false,
            pending_ws: String::new(),
            gate: None,
            implicit_think: false,
            teach: None,
        }
    }

    /// A scanner for replies that may begin inside a reasoning block opened by the chat
    /// template: the text up to a first `</think>` with no `<think>` before it is reasoning. A
    /// reply with no `</think>` is read as usual, once it has ended (until then it is held).
    pub(crate) fn with_implicit_think(tools: &[ToolSpec]) -> Self {
        Scanner {
            implicit_think: true,
            ..Scanner::new(tools)
        }
    }

    pub(crate) fn push(&mut self, delta: &str, out: &mut Vec<Piece>) {
        if delta.is_empty() {
            return;
        }
        let old = self.buf.len();
        self.buf.push_str(delta);
        if let Some(gate) = self.gate.as_mut()
            && gate.len == old
            && !gate.advance(self.buf.as_bytes())
        {
            return;
        }
        self.run(false, out);
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<Piece>) {
        self.run(true, out);
        self.pending_ws.clear();
    }

    fn run(&mut self, eof: bool, out: &mut Vec<Piece>) {
        self.gate = None;
        if self.implicit_think && !self.implicit_reasoning(eof, out) {
            return;
        }
        while !self.buf.is_empty() {
            let (pos, opener) = match self.find_opener(eof) {
                Found::At(pos, opener) => (pos, Some(opener)),
                Found::Hold(pos) => (pos, None),
                Found::Nothing => (self.buf.len(), None),
            };
            if pos > 0 {
                self.take_text(pos, out);
                continue;
            }
            let Some(opener) = opener else {
                // A possible opener is cut off at the end of the buffer.
                self.gate = Some(Gate::new(GateKind::Always, self.buf.len()));
                return;
            };
            let decision = self.decide(opener, eof);
            match decision {
                Decision::NeedMore if eof => {
                    // Cannot happen (every rule decides at the end); fall back to text.
                    let n = first_char_len(&self.buf);
                    self.take_text(n, out);
                }
                Decision::NeedMore => {
                    self.gate = Some(Gate::for_held(opener, self.buf.as_bytes()));
                    return;
                }
                Decision::Text(n) => self.take_text(n.max(1), out),
                Decision::Strip(n) => {
                    self.drain(n.max(1));
                }
                Decision::Calls(n, calls) => {
                    self.drain(n.max(1));
                    self.mark_call();
                    out.extend(calls.into_iter().map(Piece::Call));
                }
                Decision::Miss(n, explanation) => {
                    let explanation = match self.teach {
                        Some(dialect) => reteach(explanation, dialect),
                        None => explanation,
                    };
                    let raw = self.drain(n.max(1));
                    self.mark_call();
                    out.push(Piece::NearMiss { explanation, raw });
                }
                Decision::Reasoning(n, reasoning) => {
                    self.drain(n.max(1));
                    // What follows the reasoning starts afresh, as at the start of a reply.
                    self.line_start = true;
                    if !reasoning.is_empty() {
                        out.push(Piece::Reasoning(reasoning));
                    }
                }
            }
        }
    }

    /// Decides whether the reply began inside reasoning; false while that is still open (the
    /// buffer is held).
    fn implicit_reasoning(&mut self, eof: bool, out: &mut Vec<Piece>) -> bool {
        const CLOSE: &str = "</think>";
        let opener = find_ci(&self.buf, "<think>");
        match find_ci(&self.buf, CLOSE) {
            // An explicit `<think>` first: the usual rules read it.
            Some(k) if opener.is_none_or(|o| o > k) => {
                self.implicit_think = false;
                let reasoning = self.buf[..k].trim().to_string();
                self.drain(k + CLOSE.len());
                self.line_start = true;
                if !reasoning.is_empty() {
                    out.push(Piece::Reasoning(reasoning));
                }
                true
            }
            _ if opener.is_some() || eof => {
                self.implicit_think = false;
                true
            }
            _ => {
                self.gate = Some(Gate::new(GateKind::Close(CLOSE), self.buf.len()));
                false
            }
        }
    }

    /// Removes `n` bytes from the front (widened to a char boundary), keeping track of lines.
    fn drain(&mut self, n: usize) -> String {
        let mut n = n.min(self.buf.len());
        while !self.buf.is_char_boundary(n) {
            n += 1;
        }
        let taken: String = self.buf.drain(..n).collect();
        match taken.rfind('\n') {
            Some(i) => self.line_start = taken[i + 1..].bytes().all(|b| b == b' ' || b == b'\t'),
            None => {
                self.line_start = self.line_start && taken.bytes().all(|b| b == b' ' || b == b'\t');
            }
        }
        taken
    }

    fn mark_call(&mut self) {
        self.pending_ws.clear();
        if self.started {
            self.after_call = true;
        }
    }

    fn take_text(&mut self, n: usize, out: &mut Vec<Piece>) {
        let text = self.drain(n);
        let body_end = text.trim_end().len();
        let (body, trailing) = text.split_at(body_end);
        if body.is_empty() {
            if self.started && !self.after_call {
                self.pending_ws.push_str(trailing);
            }
            return;
        }
        let mut emitted = String::new();
        let body = if !self.started {
            self.started = true;
            body.trim_start()
        } else if self.after_call {
            self.after_call = false;
            emitted.push('\n');
            body.trim_start()
        } else {
            emitted.push_str(&self.pending_ws);
            body
        };
        self.pending_ws.clear();
        emitted.push_str(body);
        self.pending_ws.push_str(trailing);
        out.push(Piece::Text(emitted));
    }

    fn find_opener(&self, eof: bool) -> Found {
        let bytes = self.buf.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                b'<' | b'[' | b'`' => {
                    let rest = &bytes[i..];
                    for &(lit, opener) in OPENERS {
                        let lit = lit.as_bytes();
                        if lit[0] != b.to_ascii_lowercase() {
                            continue;
                        }
                        if rest.len() >= lit.len() {
                            if rest[..lit.len()].eq_ignore_ascii_case(lit) {
                                return Found::At(i, opener);
                            }
                        } else if !eof && rest.eq_ignore_ascii_case(&lit[..rest.len()]) {
                            return Found::Hold(i);
                        }
                    }
                    if b == b'[' && self.is_line_start(i) {
                        return Found::At(i, Opener::Pythonic);
                    }
                }
                b'{' if self.is_line_start(i) => return Found::At(i, Opener::Bare),
                _ => {}
            }
        }
        Found::Nothing
    }

    fn is_line_start(&self, i: usize) -> bool {
        let before = &self.buf.as_bytes()[..i];
        match before.iter().rposition(|&b| b == b'\n') {
            Some(nl) => before[nl + 1..].iter().all(|&b| b == b' ' || b == b'\t'),
            None => self.line_start && before.iter().all(|&b| b == b' ' || b == b'\t'),
        }
    }

    fn decide(&self, opener: Opener, eof: bool) -> Decision {
        let s = self.buf.as_str();
        let tools = &self.tools;
        match opener {
            Opener::Strip => Decision::Strip(
                OPENERS
                    .iter()
                    .filter(|(_, o)| *o == Opener::Strip)
                    .map(|(lit, _)| *lit)
                    .find(|lit| starts_with_ci(s, lit))
                    .map_or(1, str::len),
            ),
            Opener::Ptk => tagged(s, eof, tools, Tag::Ptk),
            Opener::ToolCall => tagged(s, eof, tools, Tag::ToolCall),
            Opener::Function => tagged(s, eof, tools, Tag::Function),
            Opener::ToolCalls => mistral(s, eof, tools),
            Opener::PythonTag => python_tag(s, eof, tools),
            Opener::Fence => fence(s, eof, tools),
            Opener::Bare => bare(s, eof, tools),
            Opener::DeepSeek => section(s, eof, &DEEPSEEK),
            Opener::Kimi => section(s, eof, &KIMI),
            Opener::Think => think(s, eof),
            Opener::PythonStart => python_start(s, eof, tools),
            Opener::Pythonic => pythonic_list(s, 0, eof, tools, false),
        }
    }
}

enum Found {
    At(usize, Opener),
    Hold(usize),
    Nothing,
}

/// `<think>…</think>`: reasoning, up to its closing tag (or the end of the reply).
pub(super) fn think(s: &str, eof: bool) -> Decision {
    let body = &s["<think>".len()..];
    match find_ci(body, "</think>") {
        Some(k) => Decision::Reasoning(
            "<think>".len() + k + "</think>".len(),
            body[..k].trim().to_string(),
        ),
        None if !eof => Decision::NeedMore,
        None => Decision::Reasoning(s.len(), body.trim().to_string()),
    }
}
