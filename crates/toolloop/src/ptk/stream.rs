//! The incremental parser for streamed replies.

use super::dialect::Dialect;
use super::parser::{Piece, Scanner};
use super::render::PTK_PROVIDER;
use crate::message::{ProviderPart, new_call_id};
use crate::model::ToolSpec;
use crate::stream::StreamEvent;
use serde_json::json;
use std::sync::Arc;

/// Reads text and tool calls out of a reply as it streams in.
///
/// Text is emitted as it arrives, except for anything that could be the start of a call tag
/// (and whitespace at the edges of the text): that is held back until it is decided, so no
/// fragment of a tag ever reaches the user. Each call is emitted as
/// `ToolCallStart` (with a fresh id), `ToolCallDelta` (the whole arguments), `ToolCallData`
/// (`{"repaired": true}`, only for a repaired call) and `ToolCallEnd` once it is complete. An
/// attempted call that does not parse gives a [`ProviderPart`] of provider `ptk` holding its raw
/// text under `"malformed"`, then [`StreamEvent::MalformedCall`] with the explanation.
/// Reasoning written in `<think>…</think>` (DeepSeek R1, Qwen3, GLM) gives a [`ProviderPart`] of
/// provider `ptk` holding it under `"reasoning"`, never text.
///
/// Cutting a reply into any chunks gives the same events (up to how text is split, and call
/// ids) as [`parse_reply`](super::parse_reply) gives for the whole. No `Finish` event is emitted;
/// that is the caller's.
#[derive(Debug)]
pub struct StreamParser {
    scanner: Scanner,
    next_index: usize,
}

impl StreamParser {
    /// A parser for a reply to a request offering `tools`.
    pub fn new(tools: &[ToolSpec]) -> Self {
        StreamParser {
            scanner: Scanner::new(tools),
            next_index: 0,
        }
    }

    /// [`StreamParser::new`] with the tools shared rather than copied (a parser per reply to
    /// the same catalog copies nothing).
    pub fn shared(tools: Arc<[ToolSpec]>) -> Self {
        StreamParser {
            scanner: Scanner::shared(tools),
            next_index: 0,
        }
    }

    /// The parser, explaining a near miss in `dialect` (the one the model was taught), whatever
    /// format the attempted call resembled.
    pub fn teaching(mut self, dialect: Dialect) -> Self {
        self.scanner.teach = Some(dialect);
        self
    }

    /// A parser for replies that may begin inside reasoning whose `<think>` the chat template
    /// wrote (DeepSeek R1 and Qwen3 thinking models served with such templates): the text up to
    /// a first `</think>` with no `<think>` before it is reasoning. Until that tag arrives
    /// nothing is emitted; a reply without it is read as usual when it ends.
    pub fn with_implicit_think(tools: &[ToolSpec]) -> Self {
        StreamParser {
            scanner: Scanner::with_implicit_think(tools),
            next_index: 0,
        }
    }

    /// Feeds the next piece of the reply.
    pub fn push(&mut self, delta: &str) -> Vec<StreamEvent> {
        let mut pieces = Vec::new();
        self.scanner.push(delta, &mut pieces);
        self.events(pieces)
    }

    /// Ends the reply: decides whatever is still held back.
    pub fn finish(mut self) -> Vec<StreamEvent> {
        let mut pieces = Vec::new();
        self.scanner.finish(&mut pieces);
        self.events(pieces)
    }

    fn events(&mut self, pieces: Vec<Piece>) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => events.push(StreamEvent::TextDelta(t)),
                Piece::Call(call) => {
                    let index = self.next_index;
                    self.next_index += 1;
                    events.push(StreamEvent::ToolCallStart {
                        index,
                        id: Some(new_call_id()),
                        name: call.name,
                    });
                    events.push(StreamEvent::ToolCallDelta {
                        index,
                        arguments: call.arguments.to_string(),
                    });
                    if call.repaired {
                        events.push(StreamEvent::ToolCallData {
                            index,
                            data: json!({"repaired": true}),
                        });
                    }
                    events.push(StreamEvent::ToolCallEnd { index });
                }
                Piece::Reasoning(reasoning) => events.push(StreamEvent::Part(ProviderPart {
                    provider: PTK_PROVIDER.into(),
                    data: json!({ "reasoning": reasoning }),
                })),
                Piece::NearMiss { explanation, raw } => {
                    events.push(StreamEvent::Part(ProviderPart {
                        provider: PTK_PROVIDER.into(),
                        data: json!({ "malformed": raw }),
                    }));
                    events.push(StreamEvent::MalformedCall(explanation));
                }
            }
        }
        events
    }
}
