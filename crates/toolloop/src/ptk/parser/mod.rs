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
//!
//! Where each part lives: `scanner` (finding openers, holding text until it can decide,
//! `<think>`), one module per dialect family (`tagged`, `mistral`, `llama`, `fence`, `xml`,
//! `sections`, `python_list`), `objects` (JSON call objects), `miss` (near misses and the
//! format they teach) and `text` (small text helpers).

mod fence;
mod llama;
mod miss;
mod mistral;
mod objects;
mod python_list;
mod scanner;
mod sections;
mod tagged;
#[cfg(test)]
mod tests;
mod text;
mod xml;

use super::dialect::Dialect;
use crate::model::ToolSpec;
pub(crate) use scanner::Scanner;
use serde_json::Value;

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
