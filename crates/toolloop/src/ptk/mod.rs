//! Prompt-based tool calling (PTK), for models without native tool support.
//!
//! The [`Prompted`] adapter wraps any [`Model`](crate::model::Model): it writes the tool catalog
//! and the call format into the system prompt ([`render_system_prompt`]), writes past calls back
//! as the model's own text and tool results as `PTK_RESULT:` messages ([`render_messages`]), and
//! reads the calls out of each reply ([`parse_reply`], or [`StreamParser`] while streaming).
//!
//! The default [`Dialect`] is `<PTK_CALL>{"tool": …, "args": {…}, "reasoning": …}</PTK_CALL>`;
//! the parser also reads the formats open models are trained on (Hermes, Mistral, Llama 3,
//! Qwen3-Coder, fenced JSON), whichever dialect was taught. JSON slips are repaired
//! ([`json_repair`]) and the repaired calls marked; an attempted call that does not parse is a
//! near miss, reported with the exact format expected rather than taken as the answer.
//!
//! [`Auto`] uses a model's native tool calling and switches to [`Prompted`] for good once the
//! server refuses the `tools` parameter. [`Rescue`] recovers the calls that a model behind a
//! native API wrote in its text instead (the OpenAI adapter uses it; see
//! [`OpenAiConfig::rescue_text_tool_calls`](crate::providers::openai::OpenAiConfig::rescue_text_tool_calls)).
//!
//! ```
//! use toolloop::ptk::{parse_reply, Dialect, write_call};
//! use serde_json::json;
//!
//! let reply = "I'll read it.\n<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": \"a\"}}</PTK_CALL>";
//! let parsed = parse_reply(reply, &[]);
//! assert_eq!(parsed.text.as_deref(), Some("I'll read it."));
//! assert_eq!(parsed.calls[0].name, "read_file");
//! assert_eq!(parsed.calls[0].arguments, json!({"path": "a"}));
//!
//! let text = write_call(Dialect::Mistral, "read_file", &json!({"path": "a"}));
//! assert_eq!(text, "[TOOL_CALLS]read_file[ARGS]{\"path\":\"a\"}");
//! ```

mod adapter;
mod auto;
mod dialect;
pub mod json_repair;
mod parser;
mod pythonic;
mod render;
mod rescue;
mod stream;

pub use adapter::{Prompted, PromptedReply, rewrite};
pub use auto::{Auto, catalog_tokens_floor, dropped_tools, empty_reply};
pub use dialect::{Dialect, UnknownDialect};
pub use parser::{ParsedCall, ParsedReply, parse_reply};
pub use render::{
    PTK_PROVIDER, escape_content, render_assistant, render_messages, render_result,
    render_system_prompt, write_call, write_calls,
};
pub use rescue::Rescue;
pub use stream::StreamParser;
