//! Streamed responses: Responses API stream events decoded into [`StreamEvent`]s.

use super::config::PROVIDER;
use super::error::event_error;
use super::response::{
    arguments_of, call_id_of, finish_reason, message_text, refusal_part, usage_of,
};
use crate::message::ProviderPart;
use crate::model::{FinishReason, ModelError};
use crate::providers::adapter::{SseDecode, snippet};
use crate::stream::StreamEvent;
use crate::transport::sse::SseEvent;
use serde_json::Value;

/// What an output item being streamed is.
#[derive(Debug)]
enum Kind {
    /// A function call, with our call index.
    Call {
        index: usize,
        has_id: bool,
        has_name: bool,
        args_seen: bool,
        ended: bool,
    },
    /// An assistant message; whether text deltas came for it.
    Message { text_seen: bool },
    /// A reasoning item or an item this adapter does not use.
    Other,
}

/// One output item being streamed: where it is, and what it is.
#[derive(Debug)]
struct Item {
    output_index: Option<u64>,
    id: Option<String>,
    kind: Kind,
    /// `output_item.done` came for it.
    done: bool,
}

/// Turns Responses API stream events into [`StreamEvent`]s. Calls are numbered from 0 in order
/// of first appearance; unknown events are ignored; the stream is complete at
/// `response.completed` or `response.incomplete`.
#[derive(Debug)]
pub(crate) struct StreamDecoder {
    /// HTTP status, reported with an in-stream error.
    status: u16,
    items: Vec<Item>,
    calls: usize,
    text: bool,
    refused: bool,
    done: bool,
}

impl StreamDecoder {
    pub(super) fn new(status: u16) -> Self {
        StreamDecoder {
            status,
            items: Vec::new(),
            calls: 0,
            text: false,
            refused: false,
            done: false,
        }
    }

    /// The item an event is about: by `output_index`, else by `item_id`.
    fn find(&self, output_index: Option<u64>, id: Option<&str>) -> Option<usize> {
        if let Some(at) = output_index
            && let Some(p) = self.items.iter().position(|i| i.output_index == Some(at))
        {
            return Some(p);
        }
        let id = id?;
        self.items.iter().position(|i| i.id.as_deref() == Some(id))
    }

    /// The item an event is about, made (of the kind `item` says) when it is new.
    fn slot(
        &mut self,
        output_index: Option<u64>,
        id: Option<&str>,
        item: Option<&Value>,
        out: &mut Vec<StreamEvent>,
    ) -> usize {
        if let Some(p) = self.find(output_index, id) {
            return p;
        }
        let kind_name = item.and_then(|i| i.get("type")).and_then(Value::as_str);
        let kind = match kind_name {
            Some("function_call") => {
                let index = self.calls;
                self.calls += 1;
                let call_id = item.and_then(call_id_of);
                let name = item
                    .and_then(|i| i.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                out.push(StreamEvent::ToolCallStart {
                    index,
                    id: call_id.clone(),
                    name: name.to_string(),
                });
                Kind::Call {
                    index,
                    has_id: call_id.is_some(),
                    has_name: !name.is_empty(),
                    args_seen: false,
                    ended: false,
                }
            }
            Some("message") => Kind::Message { text_seen: false },
            _ => Kind::Other,
        };
        self.items.push(Item {
            output_index,
            id: id.map(str::to_string),
            kind,
            done: false,
        });
        self.items.len() - 1
    }

    /// A call's argument text.
    fn arguments(&mut self, slot: usize, text: &str, out: &mut Vec<StreamEvent>) {
        if let Kind::Call {
            index, args_seen, ..
        } = &mut self.items[slot].kind
        {
            *args_seen = true;
            if !text.is_empty() {
                out.push(StreamEvent::ToolCallDelta {
                    index: *index,
                    arguments: text.to_string(),
                });
            }
        }
    }

    /// An output item is complete: whatever of it did not come as deltas is emitted now.
    fn item_done(&mut self, output_index: Option<u64>, item: &Value, out: &mut Vec<StreamEvent>) {
        let id = item.get("id").and_then(Value::as_str);
        let slot = self.slot(output_index, id, Some(item), out);
        if std::mem::replace(&mut self.items[slot].done, true) {
            return;
        }
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let Kind::Call {
                    index,
                    has_id,
                    has_name,
                    args_seen,
                    ..
                } = self.items[slot].kind
                else {
                    return;
                };
                let call_id = call_id_of(item);
                let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                if (!has_id && call_id.is_some()) || (!has_name && !name.is_empty()) {
                    out.push(StreamEvent::ToolCallStart {
                        index,
                        id: call_id,
                        name: name.to_string(),
                    });
                }
                if !args_seen {
                    self.arguments(slot, &arguments_of(item), out);
                }
                if let Kind::Call { ended, .. } = &mut self.items[slot].kind {
                    *ended = true;
                }
                out.push(StreamEvent::ToolCallEnd { index });
            }
            Some("message") => {
                let (text, refusal) = message_text(item);
                if matches!(self.items[slot].kind, Kind::Message { text_seen: false })
                    && !text.is_empty()
                {
                    self.text = true;
                    out.push(StreamEvent::TextDelta(text));
                }
                if let Some(refusal) = refusal {
                    self.refused = true;
                    out.push(StreamEvent::Part(refusal_part(&refusal)));
                }
            }
            Some("reasoning") => out.push(StreamEvent::Part(ProviderPart {
                provider: PROVIDER.into(),
                data: item.clone(),
            })),
            Some("compaction") => {
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: item.clone(),
                }));
                out.push(StreamEvent::ContextEdited(
                    super::response::compaction_report(),
                ));
            }
            _ => {}
        }
    }

    /// The response is complete (`response.completed` or `response.incomplete`).
    fn end(&mut self, response: &Value, out: &mut Vec<StreamEvent>) {
        // Items the stream did not complete (a server that only sends the final object): what
        // did not come as deltas comes from the final object (an item already done is skipped).
        if let Some(output) = response.get("output").and_then(Value::as_array) {
            for (at, item) in output.iter().enumerate() {
                if item.is_object() {
                    self.item_done(Some(at as u64), item, out);
                }
            }
        }
        for item in &mut self.items {
            if let Kind::Call { index, ended, .. } = &mut item.kind
                && !*ended
            {
                *ended = true;
                out.push(StreamEvent::ToolCallEnd { index: *index });
            }
        }
        if let Some(u) = usage_of(response.get("usage")) {
            out.push(StreamEvent::Usage(u));
        }
        let mut finish = finish_reason(response, self.calls > 0);
        if finish == FinishReason::Error {
            finish = FinishReason::Stop;
        }
        if self.refused && !self.text && self.calls == 0 {
            finish = FinishReason::ContentFilter;
        }
        out.push(StreamEvent::Finish(finish));
        self.done = true;
    }
}

impl SseDecode for StreamDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        let data = ev.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        // A corrupted or cut-short event is as retryable as a broken connection (never
        // replayed once output was delivered).
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a Responses API stream event is not JSON ({e}): {}",
                snippet(data.as_bytes(), 300)
            ),
            retryable: true,
        })?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let output_index = v.get("output_index").and_then(Value::as_u64);
        let item_id = v.get("item_id").and_then(Value::as_str);
        match kind {
            "response.output_item.added" => {
                if let Some(item) = v.get("item").filter(|i| i.is_object()) {
                    let id = item.get("id").and_then(Value::as_str);
                    let slot = self.slot(output_index, id, Some(item), out);
                    let args = arguments_of(item);
                    if !args.is_empty() {
                        self.arguments(slot, &args, out);
                    }
                }
            }
            "response.output_text.delta" => {
                let slot = self.slot(output_index, item_id, None, out);
                if let Kind::Other = self.items[slot].kind {
                    self.items[slot].kind = Kind::Message { text_seen: false };
                }
                if let Kind::Message { text_seen } = &mut self.items[slot].kind {
                    *text_seen = true;
                }
                if let Some(t) = v
                    .get("delta")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    self.text = true;
                    out.push(StreamEvent::TextDelta(t.to_string()));
                }
            }
            "response.function_call_arguments.delta" | "response.function_call_arguments.done" => {
                let shell = serde_json::json!({"type": "function_call"});
                let slot = self.slot(output_index, item_id, Some(&shell), out);
                let seen = matches!(
                    self.items[slot].kind,
                    Kind::Call {
                        args_seen: true,
                        ..
                    }
                );
                if kind.ends_with(".delta") {
                    let delta = v.get("delta").and_then(Value::as_str).unwrap_or("");
                    self.arguments(slot, delta, out);
                } else if !seen {
                    let args = arguments_of(&v);
                    self.arguments(slot, &args, out);
                }
            }
            "response.output_item.done" => {
                if let Some(item) = v.get("item").filter(|i| i.is_object()) {
                    self.item_done(output_index, item, out);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = v.get("response").unwrap_or(&Value::Null);
                self.end(response, out);
            }
            "response.failed" => {
                let response = v.get("response").unwrap_or(&v);
                let error = response
                    .get("error")
                    .filter(|e| e.is_object())
                    .unwrap_or(response);
                return Err(ModelError::Api(event_error(self.status, error)));
            }
            "error" => return Err(ModelError::Api(event_error(self.status, &v))),
            // An error object with no event type (proxies, servers that reuse Chat Completions'
            // error chunks).
            "" if v.get("error").is_some_and(Value::is_object) => {
                return Err(ModelError::Api(event_error(self.status, &v)));
            }
            // response.created, response.in_progress, content parts, reasoning summaries,
            // annotations, and event types added later.
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        Err(ModelError::Transport {
            message: "the Responses API stream ended before the response was complete (no \
                      response.completed or response.incomplete event)"
                .into(),
            retryable: true,
        })
    }

    fn done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode_recorded;
    use super::*;
    use crate::providers::Decoded;
    use proptest::prelude::*;
    use serde_json::json;

    fn sse(events: &[Value]) -> String {
        events
            .iter()
            .map(|e| {
                format!(
                    "event: {}\ndata: {e}\n\n",
                    e["type"].as_str().unwrap_or("x")
                )
            })
            .collect()
    }

    fn decode(body: &str) -> Decoded {
        decode_recorded(200, body.as_bytes(), true)
    }

    fn call_stream() -> Vec<Value> {
        vec![
            json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            json!({"type": "response.output_item.done", "output_index": 0,
                   "item": {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}}),
            json!({"type": "response.output_item.added", "output_index": 1,
                   "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
            json!({"type": "response.output_text.delta", "output_index": 1, "item_id": "msg_1", "content_index": 0, "delta": "Let me "}),
            json!({"type": "response.output_text.delta", "output_index": 1, "item_id": "msg_1", "content_index": 0, "delta": "look."}),
            json!({"type": "response.output_item.done", "output_index": 1,
                   "item": {"type": "message", "id": "msg_1", "role": "assistant",
                            "content": [{"type": "output_text", "text": "Let me look."}]}}),
            json!({"type": "response.output_item.added", "output_index": 2,
                   "item": {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "read", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 2, "item_id": "fc_1", "delta": "{\"path\":"}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 2, "item_id": "fc_1", "delta": "\"a\"}"}),
            json!({"type": "response.function_call_arguments.done", "output_index": 2, "item_id": "fc_1", "arguments": "{\"path\":\"a\"}"}),
            json!({"type": "response.output_item.done", "output_index": 2,
                   "item": {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "read", "arguments": "{\"path\":\"a\"}"}}),
            json!({"type": "response.output_item.added", "output_index": 3,
                   "item": {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "list", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.done", "output_index": 3, "item_id": "fc_2", "arguments": "{}"}),
            json!({"type": "response.output_item.done", "output_index": 3,
                   "item": {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "list", "arguments": "{}"}}),
            json!({"type": "response.some_future_event", "whatever": true}),
            json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
                   "output": [], "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 10},
                   "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 5}}}}),
        ]
    }

    #[test]
    fn a_streamed_round_of_calls() {
        let d = decode(&sse(&call_stream()));
        assert!(d.error.is_none(), "{:?}", d.error);
        let r = d.response;
        assert_eq!(r.text.as_deref(), Some("Let me look."));
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            (r.tool_calls[0].id.as_str(), r.tool_calls[0].name.as_str()),
            ("call_a", "read")
        );
        assert_eq!(r.tool_calls[0].arguments, json!({"path": "a"}));
        assert_eq!(
            (
                r.tool_calls[1].id.as_str(),
                r.tool_calls[1].arguments.clone()
            ),
            ("call_b", json!({}))
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.parts.len(), 1);
        assert_eq!(r.parts[0].data["encrypted_content"], "gAAA");
        let u = r.usage.unwrap();
        assert_eq!(
            (
                u.input_tokens,
                u.cache_read_tokens,
                u.output_tokens,
                u.reasoning_tokens
            ),
            (50, 10, 20, 5)
        );
    }

    #[test]
    fn streamed_and_complete_decodings_agree() {
        let body = json!({
            "status": "completed",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
                {"type": "message", "id": "msg_1", "content": [{"type": "output_text", "text": "Let me look."}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "read", "arguments": "{\"path\":\"a\"}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "list", "arguments": "{}"}
            ],
            "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 10},
                      "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 5}}
        });
        let complete = super::super::response::decode_response(&body).unwrap();
        assert_eq!(decode(&sse(&call_stream())).response, complete);
        // A server that sends only the final object gives the same response.
        let only_final = json!({"type": "response.completed", "response": body});
        assert_eq!(decode(&sse(&[only_final])).response, complete);
    }

    #[test]
    fn failures_cuts_and_incomplete() {
        let d = decode(&sse(&[
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"}),
            json!({"type": "error", "code": "server_error", "message": "The server had an error", "param": null}),
        ]));
        assert_eq!(d.response.text.as_deref(), Some("Hi"));
        let e = d.error.unwrap();
        assert!(e.retryable && e.message.contains("server had an error"));
        let d = decode(&sse(&[
            json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": "invalid_prompt", "message": "bad prompt"}}}),
        ]));
        let e = d.error.unwrap();
        assert!(!e.retryable);
        assert_eq!(e.code.as_deref(), Some("invalid_prompt"));
        let d = decode(&sse(&call_stream()[..10]));
        assert!(d.error.unwrap().message.contains("ended before"));
        let d = decode(&sse(&[
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"}),
            json!({"type": "response.incomplete", "response": {"status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"}, "output": [],
                "usage": {"input_tokens": 3, "output_tokens": 16}}}),
        ]));
        assert!(d.error.is_none());
        assert_eq!(d.response.finish_reason, FinishReason::Length);
        assert_eq!(d.response.usage.unwrap().output_tokens, 16);
        let d = decode("data: {not json\n\n");
        assert!(d.error.unwrap().retryable);
    }

    /// Events of a Responses stream, some broken or out of place.
    fn event() -> impl Strategy<Value = String> {
        let kinds = prop_oneof![
            Just("response.output_item.added"),
            Just("response.output_item.done"),
            Just("response.output_text.delta"),
            Just("response.function_call_arguments.delta"),
            Just("response.function_call_arguments.done"),
            Just("response.completed"),
            Just("response.incomplete"),
            Just("response.failed"),
            Just("error"),
            Just("response.created"),
        ];
        let item = prop_oneof![
            Just(
                json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":"})
            ),
            Just(json!({"type": "message", "content": [{"type": "output_text", "text": "x"}]})),
            Just(json!({"type": "reasoning", "id": "rs"})),
            Just(json!(7)),
            Just(json!(null)),
        ];
        (kinds, 0u64..3, item, ".{0,6}", proptest::bool::ANY).prop_map(
            |(kind, at, item, delta, broken)| {
                if broken {
                    return format!("data: {{\"type\":\"{kind}\",\"output_index\":\n\n");
                }
                let v = json!({"type": kind, "output_index": at, "item": item, "delta": delta,
                    "arguments": delta, "response": {"status": "completed", "output": [item],
                    "usage": {"input_tokens": at}}});
                format!("data: {v}\n\n")
            },
        )
    }

    proptest! {
        /// Hostile or shuffled events never panic, and the events before an error still arrive.
        #[test]
        fn hostile_streams_never_panic(events in proptest::collection::vec(event(), 0..12),
                                       cut in 0usize..400) {
            let body: String = events.concat();
            let _ = decode(&body);
            let bytes = body.as_bytes();
            let _ = decode_recorded(200, &bytes[..cut.min(bytes.len())], true);
        }
    }
}
