//! Streaming events from a model call, and the one accumulator that turns them into a response.
//!
//! Adapters normalise their wire quirks (missing or shifted indices, repeated ids, arguments
//! split across deltas) before they emit these events: each call has one `index` of the
//! adapter's choosing, and calls are ordered by the first appearance of their index.

use crate::context::NativeReport;
use crate::message::{ProviderPart, ToolCall, new_call_id};
use crate::model::{FinishReason, ModelResponse};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One event of a streamed model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// A piece of user-visible text.
    TextDelta(String),
    /// A tool call begins. A missing id is made up when the call completes.
    ToolCallStart {
        /// The adapter's index for this call.
        index: usize,
        /// The call id, when the provider sent one.
        id: Option<String>,
        /// The tool's name.
        name: String,
    },
    /// A fragment of a call's argument text.
    ToolCallDelta {
        /// The call's index.
        index: usize,
        /// The fragment.
        arguments: String,
    },
    /// Opaque provider data for a call (a Gemini thought signature).
    ToolCallData {
        /// The call's index.
        index: usize,
        /// The data, sent back unchanged.
        data: Value,
    },
    /// A tool call is complete.
    ToolCallEnd {
        /// The call's index.
        index: usize,
    },
    /// A complete opaque provider part (a signed thinking block).
    Part(ProviderPart),
    /// Token usage; a later report replaces an earlier one.
    Usage(Usage),
    /// The reply attempted a tool call that could not be parsed; see
    /// [`ModelResponse::malformed_call`].
    MalformedCall(String),
    /// Why the model stopped.
    Finish(FinishReason),
    /// What the provider did to the request's context itself (see
    /// [`ModelResponse::context_edited`]); several reports add up.
    ContextEdited(NativeReport),
}

/// Appends `piece` to `text`, taking the piece's buffer when `text` is still empty (the first
/// delta, or a reply that comes in one piece, is not copied).
fn append(text: &mut String, piece: String) {
    if text.is_empty() {
        *text = piece;
    } else {
        text.push_str(&piece);
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    index: usize,
    id: Option<String>,
    name: String,
    arguments: String,
    data: Option<Value>,
}

/// Builds a [`ModelResponse`] from [`StreamEvent`]s.
#[derive(Debug, Default)]
pub struct Accumulator {
    text: String,
    calls: Vec<PartialCall>,
    parts: Vec<ProviderPart>,
    usage: Option<Usage>,
    malformed: Option<String>,
    finish: Option<FinishReason>,
    context_edited: Option<NativeReport>,
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Accumulator::default()
    }

    fn call(&mut self, index: usize) -> &mut PartialCall {
        // Calls are few; a linear search keeps first-appearance order without a map.
        match self.calls.iter().position(|c| c.index == index) {
            Some(i) => &mut self.calls[i],
            None => {
                self.calls.push(PartialCall {
                    index,
                    ..PartialCall::default()
                });
                self.calls.last_mut().expect("just pushed")
            }
        }
    }

    /// Adds one event.
    pub fn push(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::TextDelta(t) => append(&mut self.text, t),
            StreamEvent::ToolCallStart { index, id, name } => {
                let call = self.call(index);
                if call.id.is_none() {
                    call.id = id.filter(|s| !s.is_empty());
                }
                if call.name.is_empty() {
                    call.name = name;
                }
            }
            StreamEvent::ToolCallDelta { index, arguments } => {
                append(&mut self.call(index).arguments, arguments)
            }
            StreamEvent::ToolCallData { index, data } => self.call(index).data = Some(data),
            StreamEvent::ToolCallEnd { index } => {
                self.call(index);
            }
            StreamEvent::Part(p) => self.parts.push(p),
            StreamEvent::Usage(u) => self.usage = Some(u),
            StreamEvent::MalformedCall(why) => self.malformed = Some(why),
            StreamEvent::Finish(f) => self.finish = Some(f),
            StreamEvent::ContextEdited(r) => self
                .context_edited
                .get_or_insert_with(NativeReport::default)
                .merge(r),
        }
    }

    /// Whether any text or tool call has arrived (a stream that delivered output is never
    /// replayed).
    pub fn has_output(&self) -> bool {
        !self.text.is_empty() || !self.calls.is_empty() || !self.parts.is_empty()
    }

    /// The response. Argument text is parsed here; see [`ToolCall::from_raw_arguments`].
    pub fn finish(self) -> ModelResponse {
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|c| {
                let mut call = ToolCall::from_raw_arguments(
                    c.id.unwrap_or_else(new_call_id),
                    c.name,
                    &c.arguments,
                );
                call.provider_data = c.data;
                call
            })
            .collect();
        let finish_reason = self.finish.unwrap_or(if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        });
        ModelResponse {
            text: (!self.text.is_empty()).then_some(self.text),
            tool_calls,
            finish_reason,
            usage: self.usage,
            parts: self.parts,
            malformed_call: self.malformed,
            context_edited: self.context_edited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn first_id_and_name_win_and_fragments_join() {
        let mut acc = Accumulator::new();
        for e in [
            StreamEvent::ToolCallStart {
                index: 1,
                id: Some("a".into()),
                name: "f".into(),
            },
            StreamEvent::ToolCallDelta {
                index: 1,
                arguments: "{\"x\":".into(),
            },
            StreamEvent::ToolCallStart {
                index: 1,
                id: Some(String::new()),
                name: String::new(),
            },
            StreamEvent::ToolCallDelta {
                index: 1,
                arguments: "1}".into(),
            },
            StreamEvent::ToolCallStart {
                index: 0,
                id: None,
                name: "g".into(),
            },
        ] {
            acc.push(e);
        }
        let r = acc.finish();
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[0].id, "a");
        assert_eq!(r.tool_calls[0].name, "f");
        assert_eq!(r.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(r.tool_calls[1].name, "g");
        assert!(r.tool_calls[1].id.starts_with("call_"));
        assert_eq!(r.tool_calls[1].arguments, json!({}));
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.text, None);
    }
}
