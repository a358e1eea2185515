//! Reading tool calls out of a model's text, in every [`Dialect`].
//!
//! One incremental scanner does the work for both the complete and the streamed case:
//! [`parse_reply`] feeds it the whole reply at once, [`StreamParser`](super::StreamParser) feeds
//! it deltas. The scanner only decides about a piece of text once no later text can change the
//! decision, so both give the same result however the reply is cut.
//!
//! What it recognises (tags are matched without regard to ASCII case):
//! - `<PTK_CALL>…</PTK_CALL>` and `<tool_call>…</tool_call>` holding JSON (one call, an array of
//!   calls, or several objects) or Qwen3-Coder `<function=…>` XML;
//! - `<function=NAME>…</function>` on its own (Qwen3-Coder parameters, or a JSON object as
//!   Llama 3.1 writes it);
//! - `[TOOL_CALLS]` followed by a JSON array, an object, or `NAME[ARGS]{…}` (with an optional
//!   `[CALL_ID]…`);
//! - `<|python_tag|>` followed by JSON objects separated by `;`;
//! - a fenced ```` ```json ```` block holding a call object (or an array of them);
//! - a bare JSON call object at the start of a line (Llama 3 without its tag);
//! - DeepSeek's `<｜tool▁calls▁begin｜>` section (V3's `function<｜tool▁sep｜>NAME` with fenced
//!   JSON, or V3.1's `NAME<｜tool▁sep｜>{…}`) and Kimi K2's `<|tool_calls_section_begin|>`
//!   section (`functions.NAME:IDX<|tool_call_argument_begin|>{…}`);
//! - GLM 4.5's `<tool_call>NAME` with `<arg_key>`/`<arg_value>` pairs;
//! - a Python list of calls (`[get_weather(city="Paris")]`) at the start of a line, after Llama
//!   4's `<|python_start|>` or after `<|python_tag|>`;
//! - `<think>…</think>` reasoning (DeepSeek R1, Qwen3, GLM), kept out of the text.
//!
//! A closing tag missing at the very end of the reply is tolerated. Stray closing tags and
//! end-of-message tokens (Llama's, DeepSeek's) are dropped. Fenced and bare JSON count as calls only when shaped
//! exactly like a call (a name key and an arguments key) and naming a known tool, so JSON shown
//! to the user stays text.

use super::dialect::Dialect;
use super::json_repair::{self, JsonError};
use super::pythonic;
use super::render::escape_content;
use crate::model::ToolSpec;
use serde_json::{Map, Value};

/// One tool call read from text.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The tool's name.
    pub name: String,
    /// The arguments (always a JSON object).
    pub arguments: Value,
    /// Whether the call's text needed a repair (tolerant JSON, a missing `>`, flattened
    /// arguments) to be read.
    pub repaired: bool,
    /// The dialect the call was written in.
    pub dialect: Dialect,
}

/// What a reply holds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    /// The text around the calls, trimmed, with the pieces between calls joined by a newline;
    /// `None` when there is none.
    pub text: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
    /// Set when the reply holds something that looks like an attempted call but does not parse:
    /// what was wrong and the exact format expected (addressed to the model).
    pub near_miss: Option<String>,
    /// The raw text of each attempted call that did not parse, in order.
    pub malformed: Vec<String>,
    /// The reasoning written in `<think>…</think>` blocks, trimmed and joined by a newline;
    /// `None` when there is none.
    pub reasoning: Option<String>,
}

/// Reads the text and tool calls out of a complete reply. `tools` gives the schemas that convert
/// Qwen3-Coder parameter values and the names that make bare or fenced JSON count as a call
/// (with no tools, any call-shaped JSON counts).
pub fn parse_reply(text: &str, tools: &[ToolSpec]) -> ParsedReply {
    let mut scanner = Scanner::new(tools);
    let mut pieces = Vec::new();
    scanner.push(text, &mut pieces);
    scanner.finish(&mut pieces);
    let mut reply = ParsedReply::default();
    let mut out_text = String::new();
    let mut misses: Vec<String> = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => out_text.push_str(&t),
            Piece::Call(c) => reply.calls.push(c),
            Piece::NearMiss { explanation, raw } => {
                misses.push(explanation);
                reply.malformed.push(raw);
            }
            Piece::Reasoning(r) => {
                let all = reply.reasoning.get_or_insert_with(String::new);
                if !all.is_empty() {
                    all.push('\n');
                }
                all.push_str(&r);
            }
        }
    }
    reply.text = (!out_text.is_empty()).then_some(out_text);
    reply.near_miss = (!misses.is_empty()).then(|| misses.join("\n\n"));
    reply
}

/// One decided piece of a reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    /// User-visible text.
    Text(String),
    /// A complete call.
    Call(ParsedCall),
    /// An attempted call that does not parse.
    NearMiss {
        /// What was wrong, and the format expected.
        explanation: String,
        /// The text of the attempt.
        raw: String,
    },
    /// Reasoning (`<think>…</think>`), trimmed.
    Reasoning(String),
}

/// What to do with the text at the front of the buffer.
#[derive(Debug)]
enum Decision {
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

/// Keys that name the tool in a call object, in order of preference.
const NAME_KEYS: &[&str] = &["tool", "name", "tool_name", "function"];
/// Keys that hold the arguments, in order of preference.
const ARG_KEYS: &[&str] = &["args", "arguments", "parameters", "input", "params"];
/// Other keys a call object may carry.
const EXTRA_KEYS: &[&str] = &["reasoning", "id", "type", "thought", "thoughts", "call_id"];

/// A new held text is re-examined at once while it is short; past this length, only when a
/// character that can end a call arrives (a pure speed-up: decisions never depend on timing).
const EAGER_LIMIT: usize = 512;

/// The incremental scanner shared by [`parse_reply`] and the stream parser.
#[derive(Debug)]
pub(crate) struct Scanner {
    tools: Vec<ToolSpec>,
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
        Scanner {
            tools: tools.to_vec(),
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

fn first_char_len(s: &str) -> usize {
    s.chars().next().map_or(1, char::len_utf8)
}

/// A name written in a tag (`<function= "f" >`): without spaces and quotes around it.
fn clean_name(raw: &str) -> &str {
    raw.trim().trim_matches(|c| c == '"' || c == '\'').trim()
}

/// One JSON value at the start of `s`; at the end of the reply, a number or word running to
/// its end is final.
fn read_json(s: &str, eof: bool) -> Result<json_repair::Parsed, JsonError> {
    if eof {
        json_repair::parse_prefix_final(s)
    } else {
        json_repair::parse_prefix(s)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ws_len(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

fn starts_with_ci(s: &str, lit: &str) -> bool {
    s.len() >= lit.len() && s.as_bytes()[..lit.len()].eq_ignore_ascii_case(lit.as_bytes())
}

/// Whether `s` is a proper prefix of `lit` (ignoring ASCII case).
fn is_prefix_ci(s: &str, lit: &str) -> bool {
    s.len() < lit.len()
        && s.as_bytes()
            .eq_ignore_ascii_case(&lit.as_bytes()[..s.len()])
}

fn find_ci(hay: &str, needle: &str) -> Option<usize> {
    let n = needle.len();
    if hay.len() < n {
        return None;
    }
    hay.as_bytes()
        .windows(n)
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// The end of the line containing byte `from` (just past its newline), or `None` when the line
/// is not finished yet.
fn line_end(s: &str, from: usize, eof: bool) -> Option<usize> {
    let from = from.min(s.len());
    match s.as_bytes()[from..].iter().position(|&b| b == b'\n') {
        Some(i) => Some(from + i + 1),
        None if eof => Some(s.len()),
        None => None,
    }
}

/// The model's own text as an explanation quotes it: its first 40 characters, escaped so that
/// the quote cannot pose as a call when the explanation is sent back (the explanation itself is
/// not escaped: the format it teaches must read exactly as written).
fn quote(text: &str) -> String {
    escape_content(&text.chars().take(40).collect::<String>())
}

fn miss(dialect: Dialect, what: impl std::fmt::Display) -> String {
    format!(
        "Your tool call could not be read: {what}. {}",
        teaching(dialect)
    )
}

/// Where the format an explanation teaches begins (see [`teaching`]).
const TEACHING: &str = "Write each tool call exactly like this:\n";

/// The end of a near miss's explanation: the exact format of `dialect`, and how its arguments
/// are written.
fn teaching(dialect: Dialect) -> String {
    let arguments = match dialect {
        Dialect::Qwen3Coder => "Each argument goes in a <parameter=NAME> block of its own.",
        Dialect::Glm => "Each argument goes in an <arg_key> and <arg_value> pair of its own.",
        Dialect::Pythonic => "The arguments are NAME=VALUE pairs, the values Python literals.",
        _ => "The arguments must be one JSON object with double-quoted keys and strings.",
    };
    format!("{TEACHING}{}\n{arguments}", dialect.format())
}

/// `explanation` teaching `dialect` instead of the format it was written for (the one the
/// attempted call resembled).
fn reteach(mut explanation: String, dialect: Dialect) -> String {
    if let Some(at) = explanation.rfind(TEACHING) {
        explanation.truncate(at);
        explanation.push_str(&teaching(dialect));
    }
    explanation
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tag {
    Ptk,
    ToolCall,
    Function,
}

impl Tag {
    fn open(self) -> &'static str {
        match self {
            Tag::Ptk => "<PTK_CALL>",
            Tag::ToolCall => "<tool_call>",
            Tag::Function => "<function=",
        }
    }

    fn close(self) -> &'static str {
        match self {
            Tag::Ptk => "</PTK_CALL>",
            Tag::ToolCall => "</tool_call>",
            Tag::Function => "</function>",
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Tag::Ptk => Dialect::Ptk,
            Tag::ToolCall => Dialect::Hermes,
            Tag::Function => Dialect::Qwen3Coder,
        }
    }
}

/// `<PTK_CALL>`, `<tool_call>` or `<function=NAME>`, up to the closing tag.
fn tagged(s: &str, eof: bool, tools: &[ToolSpec], tag: Tag) -> Decision {
    let lit_len = match tag {
        Tag::Ptk => "<ptk_call".len(),
        Tag::ToolCall => "<tool_call".len(),
        Tag::Function => "<function=".len(),
    };
    let after = &s[lit_len..];
    let mut repaired = false;
    let mut function_name = None;
    let open_end = match tag {
        Tag::Ptk | Tag::ToolCall => {
            let w = ws_len(after);
            match after[w..].bytes().next() {
                None if !eof => return Decision::NeedMore,
                None => {
                    return Decision::Miss(
                        s.len(),
                        miss(
                            tag.dialect(),
                            format!("the reply ends inside an unfinished {}", tag.open()),
                        ),
                    );
                }
                Some(b'>') => lit_len + w + 1,
                Some(b'{' | b'[') => {
                    repaired = true;
                    lit_len + w
                }
                // `<tool_calls>`, `<tool_call_id>`…: not our tag.
                Some(_) => return Decision::Text(1),
            }
        }
        Tag::Function => match after.find('>') {
            Some(gt) if gt <= 200 && !after[..gt].contains('\n') => {
                let name = clean_name(&after[..gt]);
                if name.is_empty() {
                    return Decision::Text(1);
                }
                function_name = Some(name.to_string());
                lit_len + gt + 1
            }
            None if !eof && after.len() <= 200 && !after.contains('\n') => {
                return Decision::NeedMore;
            }
            _ => return Decision::Text(1),
        },
    };
    let body = &s[open_end..];
    let close = tag.close();
    if !eof && find_ci(body, close).is_none() {
        // Without a closing tag every rule below waits for more.
        return Decision::NeedMore;
    }

    // A JSON body is read first, so that a closing tag inside a JSON string does not end it.
    let lead = ws_len(body);
    let jb = &body[lead..];
    if jb.starts_with('{') || jb.starts_with('[') {
        match read_json(jb, eof) {
            Ok(p) => {
                let after = &jb[p.end..];
                let w = ws_len(after);
                let rest = &after[w..];
                let end = open_end + lead + p.end + w;
                if starts_with_ci(rest, close) {
                    return finish_json_call(
                        p.value,
                        p.repaired || repaired,
                        end + close.len(),
                        tag,
                        function_name,
                        tools,
                    );
                }
                if eof && find_ci(rest, close).is_none() && !is_prefix_ci(rest, close) {
                    // The closing tag is missing and text follows: the call ends with its JSON.
                    return finish_json_call(
                        p.value,
                        p.repaired || repaired,
                        end,
                        tag,
                        function_name,
                        tools,
                    );
                }
                if rest.is_empty() || is_prefix_ci(rest, close) {
                    if !eof {
                        return Decision::NeedMore;
                    }
                    {
                        // The closing tag is missing (or cut short) at the very end of the reply.
                        return finish_json_call(
                            p.value,
                            p.repaired || repaired,
                            s.len(),
                            tag,
                            function_name,
                            tools,
                        );
                    }
                }
            }
            Err(JsonError::Incomplete) if !eof => return Decision::NeedMore,
            Err(_) => {}
        }
    }

    // Otherwise the body runs to the first closing tag (or to the end of the reply).
    let (inner, end, closed) = match find_ci(body, close) {
        Some(c) => (&body[..c], open_end + c + close.len(), true),
        None if !eof => return Decision::NeedMore,
        None => (body, s.len(), false),
    };
    match parse_body(inner, tag, function_name.as_deref(), tools) {
        Ok(mut calls) => {
            if repaired {
                calls.iter_mut().for_each(|c| c.repaired = true);
            }
            Decision::Calls(end, calls)
        }
        Err((dialect, why)) => {
            let why = if !closed && inner.trim().is_empty() {
                format!("the reply ends inside an unfinished {}", tag.open())
            } else if closed {
                why
            } else {
                format!("{why} (and the closing {close} tag is missing)")
            };
            Decision::Miss(end, miss(dialect, why))
        }
    }
}

fn finish_json_call(
    value: Value,
    repaired: bool,
    end: usize,
    tag: Tag,
    function_name: Option<String>,
    tools: &[ToolSpec],
) -> Decision {
    let result = match (tag, function_name) {
        (Tag::Function, Some(name)) => args_object(value, repaired)
            .map(|(arguments, repaired)| {
                vec![ParsedCall {
                    name,
                    arguments,
                    repaired,
                    dialect: Dialect::Llama3,
                }]
            })
            .map_err(|e| miss(Dialect::Qwen3Coder, e)),
        _ => calls_from_value(value, repaired, tag.dialect(), Shape::Tagged, tools)
            .map_err(|e| miss(tag.dialect(), e)),
    };
    match result {
        Ok(calls) => Decision::Calls(end, calls),
        Err(why) => Decision::Miss(end, why),
    }
}

/// The inside of a tag: JSON (one or more values) or Qwen3-Coder XML.
fn parse_body(
    inner: &str,
    tag: Tag,
    function_name: Option<&str>,
    tools: &[ToolSpec],
) -> Result<Vec<ParsedCall>, (Dialect, String)> {
    if let (Tag::Function, Some(name)) = (tag, function_name) {
        return parse_function_content(name, inner, tools)
            .map(|c| vec![c])
            .map_err(|e| (Dialect::Qwen3Coder, e));
    }
    let t = inner.trim();
    if starts_with_ci(t, "<function=") {
        return parse_functions(t, tools).map_err(|e| (Dialect::Qwen3Coder, e));
    }
    if tag == Tag::ToolCall && !t.is_empty() && !t.starts_with(['{', '[', '`']) {
        return parse_glm(t, tools)
            .map(|c| vec![c])
            .map_err(|e| (Dialect::Glm, e));
    }
    let dialect = tag.dialect();
    let (body, fenced) = json_repair::strip_fence(t);
    let body = body.trim();
    if body.is_empty() {
        return Err((
            dialect,
            format!("{} holds nothing; it must hold a JSON object", tag.open()),
        ));
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let p = json_repair::parse_prefix_final(rest).map_err(|e| {
            (
                dialect,
                match e {
                    JsonError::Incomplete => format!(
                        "the JSON inside {} ends too early (an unclosed brace, bracket or string)",
                        tag.open()
                    ),
                    JsonError::Invalid { message, .. } => {
                        format!("the JSON inside {} is not valid: {message}", tag.open())
                    }
                },
            )
        })?;
        let found = calls_from_value(p.value, p.repaired || fenced, dialect, Shape::Tagged, tools)
            .map_err(|e| (dialect, e))?;
        calls.extend(found);
        rest = rest[p.end..].trim_start();
        rest = rest
            .strip_prefix(',')
            .or_else(|| rest.strip_prefix(';'))
            .unwrap_or(rest)
            .trim_start();
    }
    Ok(calls)
}

/// `[TOOL_CALLS]` followed by a JSON array or object, or by `NAME[ARGS]{…}`.
fn mistral(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let lit = "[TOOL_CALLS]".len();
    let w = ws_len(&s[lit..]);
    let start = lit + w;
    let rest = &s[start..];
    let Some(first) = rest.bytes().next() else {
        if !eof {
            return Decision::NeedMore;
        }
        return Decision::Miss(
            s.len(),
            miss(Dialect::Mistral, "nothing follows [TOOL_CALLS]"),
        );
    };
    let (json_start, name) = if first == b'[' || first == b'{' {
        (start, None)
    } else if first.is_ascii_alphanumeric() || first == b'_' {
        let n = rest
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
            .unwrap_or(rest.len());
        if n == rest.len() && !eof {
            return Decision::NeedMore;
        }
        let name = rest[..n].to_string();
        let after = &rest[n..];
        let w2 = ws_len(after);
        let tail = &after[w2..];
        let args_at = if starts_with_ci(tail, "[ARGS]") {
            start + n + w2 + "[ARGS]".len()
        } else if starts_with_ci(tail, "[CALL_ID]") {
            let id_part = &tail["[CALL_ID]".len()..];
            match find_ci(id_part, "[ARGS]") {
                Some(i) if i <= 64 => start + n + w2 + "[CALL_ID]".len() + i + "[ARGS]".len(),
                None if !eof && id_part.len() < 64 + "[ARGS]".len() => {
                    return Decision::NeedMore;
                }
                _ => {
                    return mistral_miss(s, start, eof, "a [CALL_ID] must be followed by [ARGS]");
                }
            }
        } else if tail.starts_with('{') {
            start + n + w2
        } else if !eof && (is_prefix_ci(tail, "[ARGS]") || is_prefix_ci(tail, "[CALL_ID]")) {
            return Decision::NeedMore;
        } else {
            return mistral_miss(
                s,
                start,
                eof,
                format!(
                    "after [TOOL_CALLS]{name} comes [ARGS] and then the arguments as a JSON object"
                ),
            );
        };
        let a = args_at + ws_len(&s[args_at..]);
        (a, Some(name))
    } else {
        return mistral_miss(
            s,
            start,
            eof,
            "[TOOL_CALLS] must be followed by the tool name and [ARGS], or by a JSON array of calls",
        );
    };
    let json = &s[json_start..];
    match read_json(json, eof) {
        Ok(p) => {
            let end = json_start + p.end;
            let result = match name {
                Some(name) => args_object(p.value, p.repaired).map(|(arguments, repaired)| {
                    vec![ParsedCall {
                        name,
                        arguments,
                        repaired,
                        dialect: Dialect::Mistral,
                    }]
                }),
                None => {
                    calls_from_value(p.value, p.repaired, Dialect::Mistral, Shape::Tagged, tools)
                }
            };
            match result {
                Ok(calls) => Decision::Calls(end, calls),
                Err(why) => Decision::Miss(end, miss(Dialect::Mistral, why)),
            }
        }
        Err(JsonError::Incomplete) if !eof => Decision::NeedMore,
        Err(JsonError::Incomplete) => Decision::Miss(
            s.len(),
            miss(
                Dialect::Mistral,
                "the JSON after [TOOL_CALLS] ends too early",
            ),
        ),
        Err(JsonError::Invalid { offset, message }) => mistral_miss(
            s,
            json_start + offset,
            eof,
            format!("the JSON after [TOOL_CALLS] is not valid: {message}"),
        ),
    }
}

fn mistral_miss(s: &str, from: usize, eof: bool, why: impl std::fmt::Display) -> Decision {
    match line_end(s, from, eof) {
        Some(end) => Decision::Miss(end, miss(Dialect::Mistral, why)),
        None => Decision::NeedMore,
    }
}

/// Reads call objects separated by `;` (Llama 3), the first at the start of `s`. Followers
/// that are not calls end the sequence before their `;`.
fn call_sequence(
    s: &str,
    eof: bool,
    tools: &[ToolSpec],
    shape: Shape,
) -> Result<(usize, Vec<ParsedCall>, Option<String>), Seq> {
    let p = match read_json(s, eof) {
        Ok(p) => p,
        Err(JsonError::Incomplete) if !eof => return Err(Seq::NeedMore),
        Err(e) => return Err(Seq::Bad(e)),
    };
    let mut end = p.end;
    let (mut calls, first_error) =
        match calls_from_value(p.value, p.repaired, Dialect::Llama3, shape, tools) {
            Ok(c) => (c, None),
            Err(e) => return Ok((end, Vec::new(), Some(e))),
        };
    loop {
        let rest = &s[end..];
        let w = ws_len(rest);
        let Some(b) = rest[w..].bytes().next() else {
            if eof {
                break;
            }
            return Err(Seq::NeedMore);
        };
        if b != b';' {
            break;
        }
        let after = &rest[w + 1..];
        let w2 = ws_len(after);
        let next = &after[w2..];
        if next.is_empty() {
            if eof {
                break;
            }
            return Err(Seq::NeedMore);
        }
        if !next.starts_with('{') {
            break;
        }
        match read_json(next, eof) {
            Ok(q) => match calls_from_value(q.value, q.repaired, Dialect::Llama3, shape, tools) {
                Ok(more) => {
                    calls.extend(more);
                    end += w + 1 + w2 + q.end;
                }
                Err(_) => break,
            },
            Err(JsonError::Incomplete) if !eof => return Err(Seq::NeedMore),
            Err(_) => break,
        }
    }
    Ok((end, calls, first_error))
}

enum Seq {
    NeedMore,
    Bad(JsonError),
}

/// `<|python_tag|>` followed by JSON calls.
fn python_tag(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let lit = "<|python_tag|>".len();
    let start = lit + ws_len(&s[lit..]);
    let rest = &s[start..];
    if let Some(list) = rest.strip_prefix('[') {
        match pythonic::starts_like_call(list.trim_start()) {
            Err(()) if !eof => return Decision::NeedMore,
            Ok(Some(_)) => return pythonic_list(s, start, eof, tools, true),
            _ => {}
        }
    }
    match rest.bytes().next() {
        None if !eof => return Decision::NeedMore,
        None => return Decision::Strip(s.len()),
        Some(b'{' | b'[') => {}
        Some(_) => {
            return match line_end(s, start, eof) {
                Some(end) => Decision::Miss(
                    end,
                    miss(
                        Dialect::Llama3,
                        "<|python_tag|> must be followed by a JSON object with \"name\" and \"parameters\"",
                    ),
                ),
                None => Decision::NeedMore,
            };
        }
    }
    match call_sequence(rest, eof, tools, Shape::Tagged) {
        Ok((end, calls, None)) => Decision::Calls(start + end, calls),
        Ok((end, _, Some(why))) => Decision::Miss(start + end, miss(Dialect::Llama3, why)),
        Err(Seq::NeedMore) => Decision::NeedMore,
        Err(Seq::Bad(e)) => {
            let from = match &e {
                JsonError::Invalid { offset, .. } => start + offset,
                JsonError::Incomplete => s.len(),
            };
            match line_end(s, from, eof) {
                Some(end) => Decision::Miss(
                    end,
                    miss(
                        Dialect::Llama3,
                        format!("the JSON after <|python_tag|> is not valid: {e}"),
                    ),
                ),
                None => Decision::NeedMore,
            }
        }
    }
}

/// A bare JSON object at the start of a line.
fn bare(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    match call_sequence(s, eof, tools, Shape::Strict) {
        Ok((end, calls, None)) => Decision::Calls(end, calls),
        // JSON that is not a call: text, shown as it is.
        Ok((end, _, Some(_))) => Decision::Text(end),
        Err(Seq::NeedMore) => Decision::NeedMore,
        Err(Seq::Bad(e)) => {
            // Broken JSON: an attempted call only if it starts like one.
            // Judged on the first line (at most HEAD bytes), so the verdict does not depend on
            // how much of the reply has arrived.
            const HEAD: usize = 400;
            let head_end = match s.find('\n') {
                Some(i) if i < HEAD => i,
                _ if s.len() >= HEAD => floor_char_boundary(s, HEAD),
                _ if eof => s.len(),
                _ => return Decision::NeedMore,
            };
            if !looks_like_call(&s[..head_end], tools) {
                return Decision::Text(1);
            }
            let end = match s.find("\n\n") {
                Some(i) => i,
                None if eof => s.len(),
                None => return Decision::NeedMore,
            };
            Decision::Miss(
                end,
                miss(
                    Dialect::Llama3,
                    format!("the JSON of the call is not valid: {e}"),
                ),
            )
        }
    }
}

/// A fenced code block that may hold a call.
fn fence(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let after = &s[3..];
    // The info string must end within 40 bytes (judged on those bytes alone, so the verdict
    // does not depend on how much has arrived).
    let nl = match after.find('\n') {
        Some(i) if i <= 40 => i,
        None if !eof && after.len() <= 40 => return Decision::NeedMore,
        _ => return Decision::Text(3),
    };
    let info = after[..nl].trim().to_ascii_lowercase();
    if !matches!(
        info.as_str(),
        "" | "json" | "json5" | "jsonc" | "tool_call" | "tool_code" | "tool"
    ) {
        return Decision::Text(3);
    }
    let body_start = 3 + nl + 1;
    let body = &s[body_start..];
    let lead = ws_len(body);
    match body[lead..].bytes().next() {
        None if !eof => return Decision::NeedMore,
        None => return Decision::Text(3),
        Some(b'{' | b'[') => {}
        Some(_) => return Decision::Text(3),
    }
    let json = &body[lead..];
    match read_json(json, eof) {
        Ok(p) => {
            let after = &json[p.end..];
            let w = ws_len(after);
            let rest = &after[w..];
            let close_at = body_start + lead + p.end + w;
            if rest.starts_with("```") || (eof && rest.is_empty()) {
                let end = if rest.is_empty() {
                    s.len()
                } else {
                    close_at + 3
                };
                return match calls_from_value(
                    p.value,
                    p.repaired,
                    Dialect::FencedJson,
                    Shape::Strict,
                    tools,
                ) {
                    Ok(calls) => Decision::Calls(end, calls),
                    Err(_) => Decision::Text(end),
                };
            }
            if !eof && (rest.is_empty() || is_prefix_ci(rest, "```")) {
                return Decision::NeedMore;
            }
        }
        Err(JsonError::Incomplete) if !eof => return Decision::NeedMore,
        Err(_) => {}
    }
    // Not a single value up to the fence: read everything up to the closing fence.
    let (inner, end) = match body.find("```") {
        Some(c) => (&body[..c], body_start + c + 3),
        None if !eof => return Decision::NeedMore,
        None => (body, s.len()),
    };
    match json_repair::parse(inner) {
        Ok((value, repaired)) => {
            match calls_from_value(value, repaired, Dialect::FencedJson, Shape::Strict, tools) {
                Ok(calls) => Decision::Calls(end, calls),
                Err(_) => Decision::Text(end),
            }
        }
        Err(e) if looks_like_call(inner, tools) => Decision::Miss(
            end,
            miss(
                Dialect::FencedJson,
                format!("the JSON in the code block is not valid: {e}"),
            ),
        ),
        Err(_) => Decision::Text(end),
    }
}

/// Whether broken JSON text starts like a call: a name key, an arguments key, and (when tools
/// are known) a known tool's name.
fn looks_like_call(text: &str, tools: &[ToolSpec]) -> bool {
    let head: String = text.chars().take(400).collect();
    let has_key = |keys: &[&str]| {
        keys.iter().any(|k| {
            head.contains(&format!("\"{k}\""))
                || head.contains(&format!("'{k}'"))
                || head.contains(&format!("{k}:"))
        })
    };
    has_key(&["tool", "name"])
        && has_key(ARG_KEYS)
        && (tools.is_empty() || tools.iter().any(|t| head.contains(t.name.as_str())))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// Inside a call tag: any call-like object.
    Tagged,
    /// Bare or fenced JSON: exactly a name key and an arguments key, naming a known tool.
    Strict,
}

fn calls_from_value(
    value: Value,
    repaired: bool,
    dialect: Dialect,
    shape: Shape,
    tools: &[ToolSpec],
) -> Result<Vec<ParsedCall>, String> {
    match value {
        Value::Array(items) => {
            if items.is_empty() {
                return Err("the list of calls is empty".into());
            }
            items
                .into_iter()
                .map(|item| match item {
                    Value::Object(map) => call_from_object(map, repaired, dialect, shape, tools),
                    other => Err(format!(
                        "each call must be a JSON object, found {}",
                        kind(&other)
                    )),
                })
                .collect()
        }
        Value::Object(map) => {
            call_from_object(map, repaired, dialect, shape, tools).map(|c| vec![c])
        }
        other => Err(format!(
            "expected a JSON object with the tool name and its arguments, found {}",
            kind(&other)
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn call_from_object(
    mut map: Map<String, Value>,
    repaired: bool,
    dialect: Dialect,
    shape: Shape,
    tools: &[ToolSpec],
) -> Result<ParsedCall, String> {
    // OpenAI's nesting: {"type": "function", "function": {"name": …, "arguments": …}}.
    if let Some(Value::Object(inner)) = map.get("function")
        && NAME_KEYS.iter().any(|k| inner.contains_key(*k))
    {
        let extra = map
            .keys()
            .any(|k| k != "function" && !EXTRA_KEYS.contains(&k.as_str()));
        if shape == Shape::Strict && extra {
            return Err("unexpected keys next to \"function\"".into());
        }
        let Some(Value::Object(inner)) = map.remove("function") else {
            return Err("\"function\" must be an object".into());
        };
        return call_from_object(inner, repaired, dialect, shape, tools);
    }
    let name_key = NAME_KEYS.iter().find(|k| map.contains_key(**k));
    let Some(name_key) = name_key else {
        return Err(format!(
            "the call has no tool name: expected a \"{}\" key holding the tool's name",
            name_key_for(dialect)
        ));
    };
    let name = match map.remove(*name_key) {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        _ => {
            return Err(format!(
                "\"{name_key}\" must hold the tool's name as a non-empty string"
            ));
        }
    };
    let args_key = ARG_KEYS.iter().find(|k| map.contains_key(**k)).copied();
    if shape == Shape::Strict {
        let known = tools.is_empty() || tools.iter().any(|t| t.name == name);
        let only_call_keys = map
            .keys()
            .all(|k| ARG_KEYS.contains(&k.as_str()) || EXTRA_KEYS.contains(&k.as_str()));
        if args_key.is_none() || !known || !only_call_keys {
            return Err("not a call".into());
        }
    }
    let (arguments, repaired) = match args_key {
        Some(key) => {
            let raw = map.remove(key).unwrap_or(Value::Null);
            args_object(raw, repaired).map_err(|e| format!("for the tool \"{name}\": {e}"))?
        }
        None => {
            // Arguments written next to the name instead of inside an arguments object.
            for k in EXTRA_KEYS {
                map.remove(*k);
            }
            let flattened = !map.is_empty();
            (Value::Object(map), repaired || flattened)
        }
    };
    Ok(ParsedCall {
        name,
        arguments,
        repaired,
        dialect,
    })
}

fn name_key_for(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Ptk => "tool",
        _ => "name",
    }
}

/// The arguments as an object: `null` and `""` mean `{}`, a string holding JSON is decoded.
fn args_object(value: Value, repaired: bool) -> Result<(Value, bool), String> {
    match value {
        Value::Object(_) => Ok((value, repaired)),
        Value::Null => Ok((Value::Object(Map::new()), repaired)),
        Value::String(s) if s.trim().is_empty() => Ok((Value::Object(Map::new()), repaired)),
        Value::String(s) => match json_repair::parse(&s) {
            Ok((v @ Value::Object(_), r)) => Ok((v, repaired || r)),
            _ => Err(format!(
                "the arguments must be a JSON object, found the string {}",
                Value::String(s)
            )),
        },
        other => Err(format!(
            "the arguments must be a JSON object, found {}",
            kind(&other)
        )),
    }
}

/// One or more `<function=NAME>…</function>` blocks.
fn parse_functions(text: &str, tools: &[ToolSpec]) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        if !starts_with_ci(rest, "<function=") {
            return Err(format!(
                "expected <function=NAME> inside <tool_call>, found `{}`",
                quote(rest)
            ));
        }
        let after = &rest["<function=".len()..];
        let Some(gt) = after.find('>') else {
            return Err("the <function=NAME> tag is not closed with `>`".into());
        };
        let name = clean_name(&after[..gt]);
        if name.is_empty() {
            return Err("<function=> has no tool name".into());
        }
        let body = &after[gt + 1..];
        let (content, next) = match find_ci(body, "</function>") {
            Some(c) => (&body[..c], &body[c + "</function>".len()..]),
            None => (body, ""),
        };
        calls.push(parse_function_content(name, content, tools)?);
        rest = next.trim();
    }
    if calls.is_empty() {
        return Err("<tool_call> holds no <function=NAME> block".into());
    }
    Ok(calls)
}

/// The inside of `<function=NAME>`: `<parameter=P>` blocks, or a JSON object.
fn parse_function_content(
    name: &str,
    content: &str,
    tools: &[ToolSpec],
) -> Result<ParsedCall, String> {
    let t = content.trim();
    if t.starts_with('{') {
        let (value, repaired) = json_repair::parse(t)
            .map_err(|e| format!("the JSON arguments of <function={name}> are not valid: {e}"))?;
        let (arguments, repaired) = args_object(value, repaired)?;
        return Ok(ParsedCall {
            name: name.to_string(),
            arguments,
            repaired,
            dialect: Dialect::Llama3,
        });
    }
    let schema = tools
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut args = Map::new();
    let mut repaired = false;
    let mut rest = content;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if !starts_with_ci(rest, "<parameter=") {
            return Err(format!(
                "expected <parameter=NAME> inside <function={}>, found `{}`",
                quote(name),
                quote(rest)
            ));
        }
        let after = &rest["<parameter=".len()..];
        let Some(gt) = after.find('>') else {
            return Err("a <parameter=NAME> tag is not closed with `>`".into());
        };
        let pname = clean_name(&after[..gt]);
        if pname.is_empty() {
            return Err(format!("a <parameter=> of <function={name}> has no name"));
        }
        let value_part = &after[gt + 1..];
        let close = find_ci(value_part, "</parameter>");
        let next_param = find_ci(value_part, "<parameter=");
        let (raw, consumed) = match (close, next_param) {
            (Some(c), n) if n.is_none_or(|n| c < n) => (&value_part[..c], c + "</parameter>".len()),
            (_, Some(n)) => {
                repaired = true;
                (&value_part[..n], n)
            }
            (_, None) => {
                repaired = true;
                (value_part, value_part.len())
            }
        };
        let param_schema = schema.and_then(|s| s.get(pname));
        args.insert(pname.to_string(), convert_param(raw, param_schema));
        rest = &value_part[consumed..];
    }
    Ok(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(args),
        repaired,
        dialect: Dialect::Qwen3Coder,
    })
}

/// A Qwen3-Coder parameter value: one newline after the opening tag and one before the closing
/// tag belong to the format, not the value.
fn strip_param_newlines(raw: &str) -> &str {
    let v = raw
        .strip_prefix("\r\n")
        .or_else(|| raw.strip_prefix('\n'))
        .unwrap_or(raw);
    v.strip_suffix('\n').unwrap_or(v)
}

/// Converts a Qwen3-Coder parameter's text through its JSON Schema.
fn convert_param(raw: &str, schema: Option<&Value>) -> Value {
    convert_text(strip_param_newlines(raw), schema)
}

/// Converts an argument written as text (Qwen3-Coder, GLM) through its JSON Schema: kept as
/// text for a string, read as JSON otherwise (and, with no schema, when it is JSON other than a
/// string).
fn convert_text(text: &str, schema: Option<&Value>) -> Value {
    let t = text.trim();
    let mut nullable = false;
    let ty: Option<&str> = match schema.and_then(|s| s.get("type")) {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Array(types)) => {
            nullable = types.iter().any(|t| t == "null");
            types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
        }
        _ => None,
    };
    if nullable && t == "null" {
        return Value::Null;
    }
    let any = || match serde_json::from_str::<Value>(t) {
        Ok(v) if !v.is_string() => v,
        _ => Value::String(text.to_string()),
    };
    match ty {
        Some("string") => Value::String(text.to_string()),
        Some("integer") => {
            if let Ok(i) = t.parse::<i64>() {
                Value::from(i)
            } else if let Ok(u) = t.parse::<u64>() {
                Value::from(u)
            } else {
                any()
            }
        }
        Some("number") => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Number(_)) => v,
            _ => any(),
        },
        Some("boolean") => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => any(),
        },
        Some("null") if t == "null" || t.is_empty() => Value::Null,
        Some("object" | "array") => match json_repair::parse(t) {
            Ok((v, _)) => v,
            Err(_) => Value::String(text.to_string()),
        },
        _ => any(),
    }
}

/// A section of calls between special tokens (DeepSeek's, Kimi K2's).
struct Section {
    /// The token opening the section.
    begin: &'static str,
    /// The token opening each call.
    call_begin: &'static str,
    /// The token closing each call.
    call_end: &'static str,
    /// The token closing the section.
    end: &'static str,
    /// The dialect reported in explanations.
    dialect: Dialect,
    /// Reads one call's inside (between `call_begin` and `call_end`, which may be missing at
    /// the end of the reply).
    call: fn(&str, bool) -> CallRead,
}

/// One call read from a section.
enum CallRead {
    NeedMore,
    /// The call and the length of its inside (up to where `call_end` is expected).
    Call(usize, ParsedCall),
    /// What was wrong.
    Bad(String),
}

const DEEPSEEK: Section = Section {
    begin: "<｜tool▁calls▁begin｜>",
    call_begin: "<｜tool▁call▁begin｜>",
    call_end: "<｜tool▁call▁end｜>",
    end: "<｜tool▁calls▁end｜>",
    dialect: Dialect::DeepSeek,
    call: deepseek_call,
};

const KIMI: Section = Section {
    begin: "<|tool_calls_section_begin|>",
    call_begin: "<|tool_call_begin|>",
    call_end: "<|tool_call_end|>",
    end: "<|tool_calls_section_end|>",
    dialect: Dialect::KimiK2,
    call: kimi_call,
};

/// A section of calls, or a lone call (`call_begin` without the section's `begin`).
fn section(s: &str, eof: bool, sec: &Section) -> Decision {
    let mut i = 0;
    let opened = starts_with_ci(s, sec.begin);
    if opened {
        i = sec.begin.len();
    }
    let mut calls = Vec::new();
    loop {
        let w = ws_len(&s[i..]);
        let rest = &s[i + w..];
        if opened && starts_with_ci(rest, sec.end) {
            if calls.is_empty() {
                return Decision::Miss(
                    i + w + sec.end.len(),
                    miss(sec.dialect, format!("{} holds no call", sec.begin)),
                );
            }
            return Decision::Calls(i + w + sec.end.len(), calls);
        }
        if starts_with_ci(rest, sec.call_begin) {
            let at = i + w;
            let inner_start = at + sec.call_begin.len();
            match (sec.call)(&s[inner_start..], eof) {
                CallRead::NeedMore if !eof => return Decision::NeedMore,
                CallRead::NeedMore => {
                    return Decision::Miss(
                        s.len(),
                        miss(
                            sec.dialect,
                            format!("the reply ends inside an unfinished {}", sec.call_begin),
                        ),
                    );
                }
                CallRead::Bad(why) => {
                    // The attempt runs to the end of its call (or of the reply).
                    let end = match find_ci(&s[inner_start..], sec.call_end) {
                        Some(k) => inner_start + k + sec.call_end.len(),
                        None if !eof => return Decision::NeedMore,
                        None => s.len(),
                    };
                    return Decision::Miss(end, miss(sec.dialect, why));
                }
                CallRead::Call(len, call) => {
                    let after = inner_start + len;
                    let w2 = ws_len(&s[after..]);
                    let tail = &s[after + w2..];
                    if starts_with_ci(tail, sec.call_end) {
                        i = after + w2 + sec.call_end.len();
                    } else if !eof && (tail.is_empty() || is_prefix_ci(tail, sec.call_end)) {
                        return Decision::NeedMore;
                    } else {
                        // The closing token is missing: the call ends with its arguments.
                        i = after;
                    }
                    calls.push(call);
                    continue;
                }
            }
        }
        if rest.is_empty() && !eof {
            return Decision::NeedMore;
        }
        if !eof && (is_prefix_ci(rest, sec.end) || is_prefix_ci(rest, sec.call_begin)) {
            return Decision::NeedMore;
        }
        // Anything else ends the section (its closing token is missing).
        if calls.is_empty() {
            // (What follows is not quoted: how much of it has arrived must not change the
            // explanation.)
            let why = if rest.is_empty() {
                format!("the reply ends inside an unfinished {}", sec.begin)
            } else {
                format!("expected {} after {}", sec.call_begin, sec.begin)
            };
            return Decision::Miss(i.max(1), miss(sec.dialect, why));
        }
        return Decision::Calls(i, calls);
    }
}

/// Reads a JSON arguments object at the start of `s` (after whitespace): the arguments, whether
/// they were repaired, and the end.
fn section_args(s: &str, eof: bool, what: &str) -> Result<(Value, bool, usize), CallRead> {
    let w = ws_len(s);
    match read_json(&s[w..], eof) {
        Ok(p) => {
            let (args, repaired) = args_object(p.value, p.repaired)
                .map_err(|e| CallRead::Bad(format!("{what}: {e}")))?;
            Ok((args, repaired, w + p.end))
        }
        Err(JsonError::Incomplete) => Err(CallRead::NeedMore),
        Err(JsonError::Invalid { message, .. }) => Err(CallRead::Bad(format!(
            "the JSON arguments {what} are not valid: {message}"
        ))),
    }
}

/// A DeepSeek call's inside: V3's `function<｜tool▁sep｜>NAME\n```json\n{…}\n```` or V3.1's
/// `NAME<｜tool▁sep｜>{…}`.
fn deepseek_call(s: &str, eof: bool) -> CallRead {
    const SEP: &str = "<｜tool▁sep｜>";
    let sep = match find_ci(s, SEP) {
        Some(k) if k <= 200 => k,
        None if !eof && s.len() < 200 + SEP.len() => return CallRead::NeedMore,
        _ => {
            return CallRead::Bad(format!(
                "a call must name its tool with {SEP} within its first 200 bytes"
            ));
        }
    };
    let head = s[..sep].trim();
    let after_at = sep + SEP.len();
    let after = &s[after_at..];
    let w = ws_len(after);
    let body = &after[w..];
    if body.is_empty() {
        return if eof {
            CallRead::Bad(format!("nothing follows {SEP}"))
        } else {
            CallRead::NeedMore
        };
    }
    if body.starts_with('{') {
        // V3.1: the name before the separator, the arguments after it.
        if head.is_empty() {
            return CallRead::Bad(format!("the tool name before {SEP} is missing"));
        }
        return match section_args(after, eof, &format!("of {head}")) {
            Ok((arguments, repaired, end)) => CallRead::Call(
                after_at + end,
                ParsedCall {
                    name: head.to_string(),
                    arguments,
                    repaired,
                    dialect: Dialect::DeepSeekV31,
                },
            ),
            Err(e) => e,
        };
    }
    // V3: the type before the separator, the name on the rest of the line, fenced JSON below.
    let name_len = match body.find(['\n', '{', '`']) {
        Some(n) if n <= 200 => n,
        None if !eof && body.len() <= 200 => return CallRead::NeedMore,
        _ => return CallRead::Bad(format!("the tool name after {SEP} must end its line")),
    };
    let name = body[..name_len].trim();
    if name.is_empty() || name.contains('<') {
        return CallRead::Bad(format!("the tool name after {SEP} is missing"));
    }
    let mut at = after_at + w + name_len;
    at += ws_len(&s[at..]);
    let mut fenced = false;
    let rest = &s[at..];
    if rest.starts_with("```") {
        match rest.find('\n') {
            Some(nl) if nl <= 12 => {
                at += nl + 1;
                fenced = true;
            }
            None if !eof && rest.len() <= 12 => return CallRead::NeedMore,
            _ => return CallRead::Bad("the code fence of the arguments is not ```json".into()),
        }
    } else if !eof && is_prefix_ci(rest, "```") {
        return CallRead::NeedMore;
    }
    let (arguments, repaired, end) = match section_args(&s[at..], eof, &format!("of {name}")) {
        Ok(r) => r,
        Err(e) => return e,
    };
    at += end;
    if fenced {
        let w2 = ws_len(&s[at..]);
        let tail = &s[at + w2..];
        if tail.starts_with("```") {
            at += w2 + 3;
        } else if !eof && (tail.is_empty() || is_prefix_ci(tail, "```")) {
            return CallRead::NeedMore;
        }
    }
    CallRead::Call(
        at,
        ParsedCall {
            name: name.to_string(),
            arguments,
            repaired,
            dialect: Dialect::DeepSeek,
        },
    )
}

/// A Kimi K2 call's inside: `functions.NAME:IDX<|tool_call_argument_begin|>{…}`.
fn kimi_call(s: &str, eof: bool) -> CallRead {
    const ARGS: &str = "<|tool_call_argument_begin|>";
    let k = match find_ci(s, ARGS) {
        Some(k) if k <= 200 => k,
        None if !eof && s.len() < 200 + ARGS.len() => return CallRead::NeedMore,
        _ => {
            return CallRead::Bad(format!(
                "the call id (functions.NAME:0) must be followed by {ARGS}"
            ));
        }
    };
    let id = s[..k].trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((n, idx)) if !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => id,
    };
    let name = name.trim();
    if name.is_empty() {
        return CallRead::Bad(format!("the tool name before {ARGS} is missing"));
    }
    let at = k + ARGS.len();
    match section_args(&s[at..], eof, &format!("of {name}")) {
        Ok((arguments, repaired, end)) => CallRead::Call(
            at + end,
            ParsedCall {
                name: name.to_string(),
                arguments,
                repaired,
                dialect: Dialect::KimiK2,
            },
        ),
        Err(e) => e,
    }
}

/// `<think>…</think>`: reasoning, up to its closing tag (or the end of the reply).
fn think(s: &str, eof: bool) -> Decision {
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

/// Llama 4's `<|python_start|>` followed by a list of calls (and `<|python_end|>`).
fn python_start(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let lit = "<|python_start|>".len();
    let start = lit + ws_len(&s[lit..]);
    match s[start..].bytes().next() {
        None if !eof => Decision::NeedMore,
        None => Decision::Strip(s.len()),
        Some(b'[') => pythonic_list(s, start, eof, tools, true),
        Some(_) => match line_end(s, start, eof) {
            Some(end) => Decision::Miss(
                end,
                miss(
                    Dialect::Pythonic,
                    "<|python_start|> must be followed by a list of calls",
                ),
            ),
            None => Decision::NeedMore,
        },
    }
}

/// A Python list of calls starting at `from` (a `[`). Untagged (at the start of a line), it
/// counts as calls only when it starts like one (`[NAME(`) and, when tools are known, names
/// only known tools; broken, it is an attempt only when it names a known tool.
fn pythonic_list(s: &str, from: usize, eof: bool, tools: &[ToolSpec], tagged: bool) -> Decision {
    let list = &s[from..];
    let inner = &list[1..];
    let lead = ws_len(inner);
    let first_name = match pythonic::starts_like_call(&inner[lead..]) {
        Err(()) if !eof => return Decision::NeedMore,
        Ok(Some(n)) => &inner[lead..lead + n],
        _ if tagged => "",
        _ => return Decision::Text(1),
    };
    let known = |name: &str| tools.is_empty() || tools.iter().any(|t| t.name == name);
    let attempt = tagged || (!tools.is_empty() && tools.iter().any(|t| t.name == first_name));
    match pythonic::parse_call_list(list) {
        Ok((end, calls)) => {
            if !tagged && !calls.iter().all(|c| known(&c.name)) {
                return Decision::Text(from + end);
            }
            let mut end = from + end;
            if tagged {
                let w = ws_len(&s[end..]);
                let tail = &s[end + w..];
                if starts_with_ci(tail, "<|python_end|>") {
                    end += w + "<|python_end|>".len();
                } else if !eof && (tail.is_empty() || is_prefix_ci(tail, "<|python_end|>")) {
                    return Decision::NeedMore;
                }
            }
            Decision::Calls(
                end,
                calls
                    .into_iter()
                    .map(|c| ParsedCall {
                        name: c.name,
                        arguments: Value::Object(c.arguments),
                        repaired: false,
                        dialect: Dialect::Pythonic,
                    })
                    .collect(),
            )
        }
        Err(JsonError::Incomplete) if !eof => Decision::NeedMore,
        Err(_) if !attempt => Decision::Text(1),
        Err(JsonError::Incomplete) => Decision::Miss(
            s.len(),
            miss(Dialect::Pythonic, "the list of calls ends too early"),
        ),
        Err(JsonError::Invalid { offset, message }) => match line_end(s, from + offset, eof) {
            Some(end) => Decision::Miss(
                end,
                miss(
                    Dialect::Pythonic,
                    format!("the list of calls is not valid Python: {message}"),
                ),
            ),
            None => Decision::NeedMore,
        },
    }
}

/// The inside of a GLM `<tool_call>`: the tool's name on the first line, then
/// `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` pairs, values converted through the
/// tool's schema.
fn parse_glm(t: &str, tools: &[ToolSpec]) -> Result<ParsedCall, String> {
    const KEY: &str = "<arg_key>";
    const KEY_END: &str = "</arg_key>";
    const VALUE: &str = "<arg_value>";
    const VALUE_END: &str = "</arg_value>";
    let name_end = match (t.find('\n'), find_ci(t, KEY)) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(t.len()),
    };
    let name = clean_name(&t[..name_end]);
    let plausible = !name.is_empty()
        && !name.contains(|c: char| {
            c.is_whitespace() || matches!(c, '<' | '>' | '{' | '}' | '[' | ']' | '(' | ')' | '"')
        });
    if !plausible {
        return Err(format!(
            "<tool_call> holds neither a JSON call nor a tool name with its arguments; found `{}`",
            quote(&t[..name_end])
        ));
    }
    let schema = tools
        .iter()
        .find(|tool| tool.name == name)
        .and_then(|tool| tool.parameters.get("properties"));
    let mut args = Map::new();
    let mut rest = &t[name_end..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if !starts_with_ci(rest, KEY) {
            return Err(format!(
                "expected {KEY} inside <tool_call>{}, found `{}`",
                quote(name),
                quote(rest)
            ));
        }
        let after = &rest[KEY.len()..];
        let Some(k_end) = find_ci(after, KEY_END) else {
            return Err(format!("an {KEY} is not closed with {KEY_END}"));
        };
        let key = after[..k_end].trim();
        if key.is_empty() {
            return Err(format!("an {KEY} of {} is empty", quote(name)));
        }
        let value_part = after[k_end + KEY_END.len()..].trim_start();
        if !starts_with_ci(value_part, VALUE) {
            return Err(format!(
                "{KEY}{}{KEY_END} must be followed by {VALUE}…{VALUE_END}",
                quote(key)
            ));
        }
        let value_part = &value_part[VALUE.len()..];
        let Some(v_end) = find_ci(value_part, VALUE_END) else {
            return Err(format!(
                "the {VALUE} of {} is not closed with {VALUE_END}",
                quote(key)
            ));
        };
        let param_schema = schema.and_then(|s| s.get(key));
        args.insert(
            key.to_string(),
            convert_text(&value_part[..v_end], param_schema),
        );
        rest = &value_part[v_end + VALUE_END.len()..];
    }
    Ok(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(args),
        repaired: false,
        dialect: Dialect::Glm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, props: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters: json!({"type": "object", "properties": props}),
        }
    }

    fn tools() -> Vec<ToolSpec> {
        vec![
            tool(
                "read_file",
                json!({"path": {"type": "string"}, "limit": {"type": "integer"}}),
            ),
            tool(
                "get_weather",
                json!({"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                       "tags": {"type": "array"}, "ratio": {"type": ["number", "null"]}}),
            ),
        ]
    }

    fn one(text: &str) -> ParsedReply {
        parse_reply(text, &tools())
    }

    fn names_args(r: &ParsedReply) -> Vec<(String, Value)> {
        r.calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect()
    }

    #[test]
    fn seed_ptk_call_with_text_before() {
        let r = one(
            "I'll read the package.json file.\n<PTK_CALL>\n{\n  \"tool\": \"read_file\",\n  \"args\": {\"path\": \"package.json\"},\n  \"reasoning\": \"Need to read package.json to get version\"\n}\n</PTK_CALL>",
        );
        assert_eq!(r.text.as_deref(), Some("I'll read the package.json file."));
        assert_eq!(
            names_args(&r),
            vec![("read_file".into(), json!({"path": "package.json"}))]
        );
        assert_eq!(r.calls[0].dialect, Dialect::Ptk);
        assert!(!r.calls[0].repaired);
        assert_eq!(r.near_miss, None);
    }

    #[test]
    fn hermes_several_calls_and_text_after() {
        let r = one(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\nDone.",
        );
        assert_eq!(
            names_args(&r),
            vec![
                ("get_weather".into(), json!({"city": "Paris"})),
                ("read_file".into(), json!({"path": "a"}))
            ]
        );
        assert_eq!(r.text.as_deref(), Some("Done."));
        assert_eq!(r.calls[0].dialect, Dialect::Hermes);
    }

    #[test]
    fn mistral_array_and_args_forms() {
        let r = one(
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}, {\"name\": \"read_file\", \"arguments\": {\"path\": \"x\"}}]",
        );
        assert_eq!(r.calls.len(), 2);
        assert_eq!(r.calls[1].arguments, json!({"path": "x"}));
        let r = one(
            "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]read_file[ARGS]{\"path\": \"y\"}",
        );
        assert_eq!(
            names_args(&r),
            vec![
                ("get_weather".into(), json!({"city": "Paris"})),
                ("read_file".into(), json!({"path": "y"}))
            ]
        );
        assert_eq!(r.text.as_deref(), Some("Checking."));
        let r = one("[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Oslo\"}");
        assert_eq!(
            names_args(&r),
            vec![("get_weather".into(), json!({"city": "Oslo"}))]
        );
        assert_eq!(r.calls[0].dialect, Dialect::Mistral);
    }

    #[test]
    fn llama3_json_with_and_without_python_tag() {
        let r = one(
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"SF\"}}; {\"name\": \"read_file\", \"parameters\": {\"path\": \"b\"}}<|eom_id|>",
        );
        assert_eq!(r.calls.len(), 2, "{r:?}");
        assert_eq!(r.calls[0].arguments, json!({"city": "SF"}));
        assert_eq!(r.text, None);
        let r = one("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"SF\"}}");
        assert_eq!(
            names_args(&r),
            vec![("get_weather".into(), json!({"city": "SF"}))]
        );
        assert_eq!(r.calls[0].dialect, Dialect::Llama3);
        // JSON for the user (not a known tool, not call-shaped) stays text.
        let r = one("{\"name\": \"Bob\", \"age\": 3}");
        assert!(r.calls.is_empty());
        assert_eq!(r.text.as_deref(), Some("{\"name\": \"Bob\", \"age\": 3}"));
        let r = one("{\"name\": \"unknown_tool\", \"parameters\": {}}");
        assert!(r.calls.is_empty() && r.near_miss.is_none());
    }

    #[test]
    fn qwen3_coder_xml_converts_through_the_schema() {
        let r = one(
            "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=ratio>\nnull\n</parameter>\n</function>\n</tool_call>",
        );
        assert_eq!(
            names_args(&r),
            vec![(
                "get_weather".into(),
                json!({"city": "San Francisco", "days": 3, "metric": true, "tags": ["a", "b"], "ratio": null})
            )]
        );
        assert_eq!(r.calls[0].dialect, Dialect::Qwen3Coder);
        assert_eq!(r.text.as_deref(), Some("Let me check."));
        // A string parameter that looks like a number stays a string.
        let r = one(
            "<tool_call><function=read_file><parameter=path>42</parameter><parameter=limit>10</parameter></function></tool_call>",
        );
        assert_eq!(r.calls[0].arguments, json!({"path": "42", "limit": 10}));
        // Without the wrapper, and without a schema.
        let r = parse_reply(
            "<function=other>\n<parameter=n>\n7\n</parameter>\n<parameter=s>\nhi\n</parameter>\n</function>",
            &[],
        );
        assert_eq!(r.calls[0].arguments, json!({"n": 7, "s": "hi"}));
    }

    #[test]
    fn names_in_tags_are_cleaned_like_json_names() {
        // Found by fuzzing: a quoted name with a space inside the quotes.
        let r = parse_reply("<function=\" f\">{}</function>", &[]);
        assert_eq!(r.calls[0].name, "f");
        let back = parse_reply(
            &super::super::write_call(Dialect::Ptk, &r.calls[0].name, &json!({})),
            &[],
        );
        assert_eq!(back.calls[0].name, "f");
        let r = parse_reply(
            "<tool_call><function='g'><parameter= \"p\" >1</parameter></function></tool_call>",
            &[],
        );
        assert_eq!(
            (r.calls[0].name.as_str(), &r.calls[0].arguments),
            ("g", &json!({"p": 1}))
        );
    }

    #[test]
    fn llama31_function_tag_with_json() {
        let r = one("<function=get_weather>{\"city\": \"Rome\"}</function>");
        assert_eq!(
            names_args(&r),
            vec![("get_weather".into(), json!({"city": "Rome"}))]
        );
    }

    #[test]
    fn fenced_json_calls_and_plain_code_blocks() {
        let r = one(
            "Sure.\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"c\"}}\n```\n",
        );
        assert_eq!(
            names_args(&r),
            vec![("read_file".into(), json!({"path": "c"}))]
        );
        assert_eq!(r.calls[0].dialect, Dialect::FencedJson);
        assert_eq!(r.text.as_deref(), Some("Sure."));
        let code = "Here:\n```json\n{\"version\": \"1.2.3\"}\n```\nand\n```rust\nfn main() {}\n```";
        let r = one(code);
        assert!(r.calls.is_empty());
        assert_eq!(r.text.as_deref(), Some(code));
    }

    #[test]
    fn repairs_are_marked() {
        let r = one(
            "<PTK_CALL>{'tool': 'read_file', 'args': {path: 'a.txt', 'limit': None,},}</PTK_CALL>",
        );
        assert_eq!(
            names_args(&r),
            vec![("read_file".into(), json!({"path": "a.txt", "limit": null}))]
        );
        assert!(r.calls[0].repaired);
        let r = one(
            "<PTK_CALL>```json\n{\"tool\": \"read_file\", \"args\": {\"path\": \"a\"}}\n```</PTK_CALL>",
        );
        assert!(r.calls[0].repaired, "{r:?}");
        // Arguments flattened next to the name.
        let r = one("<tool_call>{\"name\": \"read_file\", \"path\": \"z\"}</tool_call>");
        assert_eq!(r.calls[0].arguments, json!({"path": "z"}));
        assert!(r.calls[0].repaired);
        // Double-encoded arguments are decoded, as servers send them.
        let r = one(
            "<tool_call>{\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"q\\\"}\"}</tool_call>",
        );
        assert_eq!(r.calls[0].arguments, json!({"path": "q"}));
    }

    #[test]
    fn missing_closing_tag_at_the_end_is_tolerated() {
        let r = one("<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}");
        assert_eq!(
            names_args(&r),
            vec![("read_file".into(), json!({"path": "a"}))]
        );
        let r = one("<PTK_CALL>{\"tool\": \"read_file\", \"args\": {}}\nthen text");
        assert_eq!(r.calls.len(), 1, "{r:?}");
    }

    #[test]
    fn closing_tag_inside_a_json_string_does_not_end_the_call() {
        let r = one(
            "<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": \"</PTK_CALL>\"}}</PTK_CALL>",
        );
        assert_eq!(r.calls[0].arguments, json!({"path": "</PTK_CALL>"}));
        assert_eq!(r.text, None);
    }

    /// A near miss is explained in the dialect the run taught, whatever format the attempt
    /// resembled, and never with a sentence about arguments that the format contradicts.
    #[test]
    fn near_misses_teach_the_dialect_the_run_taught() {
        let explain = |text: &str, taught: Dialect| -> String {
            let mut scanner = Scanner::new(&tools());
            scanner.teach = Some(taught);
            let mut pieces = Vec::new();
            scanner.push(text, &mut pieces);
            scanner.finish(&mut pieces);
            pieces
                .into_iter()
                .find_map(|p| match p {
                    Piece::NearMiss { explanation, .. } => Some(explanation),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no near miss for {text}"))
        };
        // A bare fenced block, in a run taught hermes: told to write hermes, not a fence.
        let fenced =
            "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\" \"x\": ]}\n```";
        let why = explain(fenced, Dialect::Hermes);
        assert!(why.contains(Dialect::Hermes.format()), "{why}");
        assert!(!why.contains("```json"), "{why}");
        assert!(why.contains("one JSON object"), "{why}");
        // Plain text in a <tool_call>: GLM's look-alike is not taught to a hermes run.
        let why = explain(
            "<tool_call>read the file please</tool_call>",
            Dialect::Hermes,
        );
        assert!(why.contains(Dialect::Hermes.format()), "{why}");
        assert!(!why.contains("<arg_key>"), "{why}");
        // A GLM run is taught GLM, without the JSON sentence that contradicts it.
        let why = explain(fenced, Dialect::Glm);
        assert!(why.contains("<arg_key>"), "{why}");
        assert!(!why.contains("JSON object"), "{why}");
        // The model's own words stay in the explanation.
        assert!(
            why.starts_with("Your tool call could not be read: "),
            "{why}"
        );
    }

    #[test]
    fn near_misses_explain_the_format() {
        let cases = [
            (
                "<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": @}}</PTK_CALL>",
                "<PTK_CALL>",
            ),
            (
                "<PTK_CALL>{\"args\": {\"path\": \"a\"}}</PTK_CALL>",
                "\"tool\"",
            ),
            (
                "<PTK_CALL>{\"tool\": \"read_file\", \"args\": [1]}</PTK_CALL>",
                "JSON object",
            ),
            (
                "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"\n",
                "<tool_call>",
            ),
            ("[TOOL_CALLS]read_file(path=a)\n", "[ARGS]"),
            (
                "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\" \"x\": ]}\n```",
                "```json",
            ),
            (
                "{\"name\": \"read_file\", \"arguments\": {\"path\": oops}}",
                "\"parameters\"",
            ),
            (
                "<tool_call><function=read_file><parameter=path>a</parameter>junk</function></tool_call>",
                "<parameter=",
            ),
            ("I will call it now: <PTK_CALL>", "unfinished"),
            (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{\"path\": oops}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                "<｜tool▁sep｜>",
            ),
            (
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>{\"path\": [}<|tool_call_end|><|tool_calls_section_end|>",
                "<|tool_call_argument_begin|>",
            ),
            (
                "<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>a\n</tool_call>",
                "<arg_value>",
            ),
            ("[read_file(path=\"a\", 42)]", "ARGUMENT_NAME=VALUE"),
        ];
        for (text, expect) in cases {
            let r = one(text);
            assert!(r.calls.is_empty(), "{text}: {r:?}");
            let why = r
                .near_miss
                .unwrap_or_else(|| panic!("no near miss for {text}"));
            assert!(why.contains(expect), "{text}: {why}");
            assert!(why.contains("exactly like this"), "{why}");
            assert_eq!(r.malformed.len(), 1, "{text}");
        }
    }

    #[test]
    fn deepseek_v3_v31_and_r1_reasoning() {
        let r = one(
            "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{\"path\": \"<｜tool▁call▁end｜>\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        );
        assert_eq!(
            names_args(&r),
            vec![
                ("get_weather".into(), json!({"city": "Paris", "days": 2})),
                ("read_file".into(), json!({"path": "<｜tool▁call▁end｜>"}))
            ]
        );
        assert_eq!(r.calls[0].dialect, Dialect::DeepSeek);
        assert_eq!(r.text.as_deref(), Some("Let me look."));
        let r = one(
            "<think>\nThe user wants Paris.\n</think>\n\nOK.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
        assert_eq!(
            names_args(&r),
            vec![("get_weather".into(), json!({"city": "Paris"}))]
        );
        assert_eq!(r.calls[0].dialect, Dialect::DeepSeekV31);
        assert_eq!(r.text.as_deref(), Some("OK."));
        assert_eq!(r.reasoning.as_deref(), Some("The user wants Paris."));
        // Reasoning cut off by the end of the reply is still reasoning, never text.
        let r = one("<think>still thinking");
        assert_eq!(
            (r.text, r.reasoning.as_deref()),
            (None, Some("still thinking"))
        );
        // A lone call without the section tokens.
        let r =
            one("<｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{\"path\": \"a\"}<｜tool▁call▁end｜>");
        assert_eq!(
            names_args(&r),
            vec![("read_file".into(), json!({"path": "a"}))]
        );
    }

    #[test]
    fn kimi_k2_calls() {
        let r = one(
            "Checking. <|tool_calls_section_begin|> <|tool_call_begin|>\nfunctions.get_weather:0 <|tool_call_argument_begin|> {\"city\": \"Beijing\"} <|tool_call_end|><|tool_call_begin|>read_file:1<|tool_call_argument_begin|>{}<|tool_call_end|> <|tool_calls_section_end|> Done.",
        );
        assert_eq!(
            names_args(&r),
            vec![
                ("get_weather".into(), json!({"city": "Beijing"})),
                ("read_file".into(), json!({}))
            ]
        );
        assert_eq!(r.calls[0].dialect, Dialect::KimiK2);
        assert_eq!(r.text.as_deref(), Some("Checking.\nDone."));
    }

    #[test]
    fn glm_values_are_converted_by_the_schema() {
        let r = one(
            "I'll check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\"]</arg_value>\n</tool_call>",
        );
        assert_eq!(
            names_args(&r),
            vec![(
                "get_weather".into(),
                json!({"city": "42", "days": 3, "metric": true, "tags": ["a"]})
            )]
        );
        assert_eq!(r.calls[0].dialect, Dialect::Glm);
        // Without a schema, JSON values are read as JSON and the rest stays text.
        let r = parse_reply(
            "<tool_call>other<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>s</arg_key><arg_value>hi there</arg_value></tool_call>",
            &[],
        );
        assert_eq!(r.calls[0].arguments, json!({"n": 7, "s": "hi there"}));
        // No arguments at all.
        let r = one("<tool_call>read_file\n</tool_call>");
        assert_eq!(names_args(&r), vec![("read_file".into(), json!({}))]);
    }

    #[test]
    fn pythonic_calls_are_read_never_evaluated() {
        let r = one(
            "[get_weather(city=\"San Francisco\", days=3, metric=True, tags=['a', \"b\"]), read_file(path='a\\'b', limit=None)]<|eot|>",
        );
        assert_eq!(
            names_args(&r),
            vec![
                (
                    "get_weather".into(),
                    json!({"city": "San Francisco", "days": 3, "metric": true, "tags": ["a", "b"]})
                ),
                ("read_file".into(), json!({"path": "a'b", "limit": null}))
            ]
        );
        assert_eq!(r.calls[0].dialect, Dialect::Pythonic);
        assert_eq!(r.text, None);
        // Llama 4's tags, and after <|python_tag|>.
        for text in [
            "<|python_start|>[read_file(path=\"x\")]<|python_end|>",
            "<|python_tag|>[read_file(path=\"x\")]",
        ] {
            let r = one(text);
            assert_eq!(
                names_args(&r),
                vec![("read_file".into(), json!({"path": "x"}))],
                "{text}"
            );
            assert_eq!(r.text, None, "{text}");
        }
        // Code is not a value: an attempted call, explained, never run.
        let r = one("[read_file(path=__import__('os').system('rm -rf /'))]");
        assert!(r.calls.is_empty());
        assert!(r.near_miss.unwrap().contains("not valid Python"));
        // Prose and Markdown that start with a bracket stay text.
        for text in [
            "[1, 2, 3] are numbers",
            "[x] done\n[link](http://a.b)",
            "[Note (important)] read this",
            "[unknown_tool(a=1)]",
        ] {
            let r = one(text);
            assert!(r.calls.is_empty() && r.near_miss.is_none(), "{text}: {r:?}");
            assert_eq!(r.text.as_deref(), Some(text), "{text}");
        }
        // Not at the start of a line: text.
        let r = one("Call it like read_file(path=\"a\") or [read_file(path=\"a\")].");
        assert!(r.calls.is_empty());
    }

    #[test]
    fn prose_is_left_alone() {
        for text in [
            "a < b and c > d, [1, 2] and `code` and {braces}",
            "Use the <b>bold</b> tag; the array [TOOL] is fine.",
            "{ this is not json }",
            "",
        ] {
            let r = one(text);
            assert!(r.calls.is_empty() && r.near_miss.is_none(), "{text}: {r:?}");
            assert_eq!(r.text.as_deref().unwrap_or(""), text.trim());
        }
        // Stray closing tags and end tokens are dropped.
        assert_eq!(
            one("done</tool_call><|eot_id|>").text.as_deref(),
            Some("done")
        );
    }
}
