//! Streamed responses: Messages stream events decoded into [`StreamEvent`]s.

use super::config::PROVIDER;
use super::error::stream_error;
use super::response::{WireUsage, call_extras, finish_reason};
use crate::message::ProviderPart;
use crate::model::ModelError;
use crate::providers::adapter::{SseDecode, snippet};
use crate::stream::StreamEvent;
use crate::transport::sse::SseEvent;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(super) enum Block {
    Text,
    ToolUse {
        index: usize,
        id: Option<String>,
        name: String,
        initial: Value,
        extras: Option<Value>,
        started: bool,
        args_seen: bool,
    },
    Other {
        block: Value,
        json: String,
    },
}

/// Turns Messages stream events into [`StreamEvent`]s.
#[derive(Default)]
pub(crate) struct StreamDecoder {
    blocks: BTreeMap<u64, Block>,
    usage: WireUsage,
    stop_reason: Option<String>,
    stopped: bool,
    calls: usize,
    reported_calls: usize,
}

impl SseDecode for StreamDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        // A corrupted or cut-short event is as retryable as a broken connection (never
        // replayed once output was delivered).
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a Messages stream event is not JSON ({e}): {}",
                snippet(data.as_bytes(), 300)
            ),
            retryable: true,
        })?;
        let kind = v["type"]
            .as_str()
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let index = v["index"].as_u64();
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage").filter(|u| u.is_object()) {
                    self.usage.update(u);
                    out.extend(self.usage.usage().map(StreamEvent::Usage));
                }
            }
            "content_block_start" => {
                let (Some(index), Some(block)) = (index, v.get("content_block")) else {
                    return Err(ModelError::InvalidResponse(
                        "unexpected Messages stream: a content_block_start event without index \
                         or block"
                            .into(),
                    ));
                };
                let state = match block["type"].as_str() {
                    Some("text") => {
                        if let Some(t) = block["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => {
                        let call = self.calls;
                        self.calls += 1;
                        Block::ToolUse {
                            index: call,
                            id: block["id"].as_str().map(str::to_string),
                            name: block["name"].as_str().unwrap_or("").to_string(),
                            initial: block["input"].clone(),
                            extras: call_extras(block),
                            started: false,
                            args_seen: false,
                        }
                    }
                    _ => Block::Other {
                        block: block.clone(),
                        json: String::new(),
                    },
                };
                if let Some(old) = self.blocks.insert(index, state) {
                    self.close(old, true, out);
                }
            }
            "content_block_delta" => {
                let delta = &v["delta"];
                let block = index.and_then(|i| self.blocks.get_mut(&i));
                match (delta["type"].as_str(), block) {
                    (Some("text_delta"), _) => {
                        if let Some(t) = delta["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                    }
                    (Some("input_json_delta"), Some(block)) => {
                        let fragment = delta["partial_json"].as_str().unwrap_or("");
                        match block {
                            Block::ToolUse {
                                index,
                                id,
                                name,
                                started,
                                args_seen,
                                ..
                            } => {
                                if !fragment.is_empty() {
                                    if !*started {
                                        *started = true;
                                        out.push(StreamEvent::ToolCallStart {
                                            index: *index,
                                            id: id.clone(),
                                            name: name.clone(),
                                        });
                                    }
                                    *args_seen = true;
                                    out.push(StreamEvent::ToolCallDelta {
                                        index: *index,
                                        arguments: fragment.to_string(),
                                    });
                                }
                            }
                            Block::Other { json, .. } => json.push_str(fragment),
                            Block::Text => {}
                        }
                    }
                    (Some("thinking_delta"), Some(Block::Other { block, .. })) => {
                        let piece = delta["thinking"].as_str().unwrap_or("");
                        let joined = format!("{}{piece}", block["thinking"].as_str().unwrap_or(""));
                        block["thinking"] = json!(joined);
                    }
                    (Some("signature_delta"), Some(Block::Other { block, .. })) => {
                        let piece = delta["signature"].as_str().unwrap_or("");
                        let joined =
                            format!("{}{piece}", block["signature"].as_str().unwrap_or(""));
                        block["signature"] = json!(joined);
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(block) = index.and_then(|i| self.blocks.remove(&i)) {
                    self.close(block, true, out);
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage.update(u);
                    out.extend(self.usage.usage().map(StreamEvent::Usage));
                }
                out.extend(super::response::applied_edits(&v).map(StreamEvent::ContextEdited));
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(ModelError::Api(stream_error(&v))),
            _ => {} // ping, and event types added later
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let open = std::mem::take(&mut self.blocks);
        for (_, block) in open {
            self.close(block, false, out);
        }
        if !self.stopped && self.stop_reason.is_none() {
            return Err(ModelError::Transport {
                message: "the Messages stream ended before message_stop".into(),
                retryable: true,
            });
        }
        out.push(StreamEvent::Finish(finish_reason(
            self.stop_reason.as_deref(),
            self.reported_calls > 0,
        )));
        Ok(())
    }
}

impl StreamDecoder {
    /// Ends a block. `complete` is false for a block the stream never closed (cut by
    /// `max_tokens`): a call that received argument text is reported with it (incomplete, so it
    /// will not parse and will not run); one that received none is left out.
    fn close(&mut self, block: Block, complete: bool, out: &mut Vec<StreamEvent>) {
        match block {
            Block::Text => {}
            Block::ToolUse {
                index,
                id,
                name,
                initial,
                extras,
                started,
                args_seen,
            } => {
                if !started {
                    if !complete {
                        return;
                    }
                    out.push(StreamEvent::ToolCallStart { index, id, name });
                }
                if !args_seen && initial.as_object().is_some_and(|o| !o.is_empty()) {
                    out.push(StreamEvent::ToolCallDelta {
                        index,
                        arguments: initial.to_string(),
                    });
                }
                if let Some(data) = extras {
                    out.push(StreamEvent::ToolCallData { index, data });
                }
                out.push(StreamEvent::ToolCallEnd { index });
                self.reported_calls += 1;
            }
            Block::Other { mut block, json } => {
                if !json.is_empty()
                    && let Ok(input) = serde_json::from_str::<Value>(&json)
                {
                    block["input"] = input;
                }
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: block,
                }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode_recorded;

    #[test]
    fn stream_error_event_and_truncated_stream() {
        let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n\
                   event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let d = decode_recorded(200, sse.as_bytes(), true);
        let e = d.error.unwrap();
        assert_eq!(e.error_type.as_deref(), Some("overloaded_error"));
        assert!(e.retryable);
        let d = decode_recorded(
            200,
            b"data: {\"type\":\"message_start\",\"message\":{}}\n\n",
            true,
        );
        assert!(d.error.unwrap().message.contains("before message_stop"));
    }
}
