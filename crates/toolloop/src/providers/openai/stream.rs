//! Streamed responses: `chat.completion.chunk` events decoded into [`StreamEvent`]s.

use super::config::PROVIDER;
use super::error::{api_error_from_value, preview};
use super::response::{arguments_text, content_text, map_finish, settle_finish, usage_of};
use crate::message::ProviderPart;
use crate::model::{FinishReason, ModelError};
use crate::providers::adapter::SseDecode;
use crate::ptk::Rescue;
use crate::stream::StreamEvent;
use crate::transport::sse::SseEvent;
use serde_json::{Value, json};

/// One tool call being streamed.
#[derive(Debug)]
pub(super) struct Slot {
    /// The server's `index`, when it sent one.
    wire: Option<u64>,
    /// The first non-empty id.
    id: Option<String>,
    has_name: bool,
}

/// Reads a Chat Completions SSE stream and emits normalized [`StreamEvent`]s: our tool-call
/// indices count from 0 in order of first appearance, whatever the server's indices were.
#[derive(Debug)]
pub(crate) struct ChunkDecoder {
    /// HTTP status, reported with an in-stream error.
    status: u16,
    slots: Vec<Slot>,
    /// The choice followed (the first one seen).
    choice: Option<u64>,
    finish: Option<FinishReason>,
    reasoning: String,
    refusal: String,
    /// The text-call rescue, when on for this request.
    pub(super) rescue: Option<Rescue>,
    /// `[DONE]` or the end was reached and the closing events emitted.
    done: bool,
    /// Whether any SSE event came.
    seen: bool,
}

impl ChunkDecoder {
    pub(super) fn new(status: u16) -> Self {
        ChunkDecoder {
            status,
            slots: Vec::new(),
            choice: None,
            finish: None,
            reasoning: String::new(),
            refusal: String::new(),
            rescue: None,
            done: false,
            seen: false,
        }
    }

    fn delta(&mut self, d: &Value, out: &mut Vec<StreamEvent>) {
        if let Some(t) = content_text(d.get("content")).filter(|t| !t.is_empty()) {
            match self.rescue.as_mut() {
                Some(rescue) => out.extend(rescue.push(&t)),
                None => out.push(StreamEvent::TextDelta(t)),
            }
        }
        if let Some(r) = d.get("reasoning_content").and_then(Value::as_str) {
            self.reasoning.push_str(r);
        }
        if let Some(r) = d.get("refusal").and_then(Value::as_str) {
            self.refusal.push_str(r);
        }
        if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
            for tc in calls {
                self.tool_delta(tc, out);
            }
        }
    }

    fn tool_delta(&mut self, tc: &Value, out: &mut Vec<StreamEvent>) {
        let f = tc.get("function");
        let wire = tc
            .get("index")
            .and_then(Value::as_u64)
            .or_else(|| f.and_then(|f| f.get("index")).and_then(Value::as_u64));
        let id = tc
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let name = f
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let args = arguments_text(f.and_then(|f| f.get("arguments")));

        let (index, is_new) = self.slot_for(wire, id, name.is_some());
        let slot = &mut self.slots[index];
        let new_id = slot.id.is_none() && id.is_some();
        let new_name = !slot.has_name && name.is_some();
        if is_new || new_id || new_name {
            out.push(StreamEvent::ToolCallStart {
                index,
                id: id.map(str::to_string),
                name: name.unwrap_or_default().to_string(),
            });
            if new_id {
                slot.id = id.map(str::to_string);
            }
            slot.has_name |= name.is_some();
        }
        if !args.is_empty() {
            out.push(StreamEvent::ToolCallDelta {
                index,
                arguments: args,
            });
        }
        if let Some(x) = tc.get("extra_content").filter(|x| !x.is_null()) {
            out.push(StreamEvent::ToolCallData {
                index,
                data: json!({"extra_content": x}),
            });
        }
    }

    /// The call a delta belongs to, and whether it is new.
    fn slot_for(&mut self, wire: Option<u64>, id: Option<&str>, has_name: bool) -> (usize, bool) {
        let found = match wire {
            // The latest call with this index, unless the delta brings a different id (servers
            // that give every parallel call the same index).
            Some(w) => self
                .slots
                .iter()
                .rposition(|s| s.wire == Some(w))
                .filter(|&p| match (id, &self.slots[p].id) {
                    (Some(new), Some(old)) => new == old,
                    _ => true,
                }),
            None => match id {
                Some(id) => self.slots.iter().rposition(|s| s.id.as_deref() == Some(id)),
                // No index and no id: a continuation of the last call, unless it names a tool
                // again while the last call already has its name.
                None => self
                    .slots
                    .len()
                    .checked_sub(1)
                    .filter(|&last| !(has_name && self.slots[last].has_name)),
            },
        };
        match found {
            Some(p) => (p, false),
            None => {
                self.slots.push(Slot {
                    wire,
                    id: None,
                    has_name: false,
                });
                (self.slots.len() - 1, true)
            }
        }
    }

    /// The closing events: parts, call ends, the finish reason.
    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        if self.done {
            return;
        }
        self.done = true;
        for (field, text) in [
            ("reasoning_content", std::mem::take(&mut self.reasoning)),
            ("refusal", std::mem::take(&mut self.refusal)),
        ] {
            if !text.is_empty() {
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: json!({ field: text }),
                }));
            }
        }
        let mut rescued = 0;
        if let Some(rescue) = self.rescue.take() {
            let (events, n) = rescue.finish(!self.slots.is_empty());
            out.extend(events);
            rescued = n;
        }
        for index in 0..self.slots.len() {
            out.push(StreamEvent::ToolCallEnd { index });
        }
        out.push(StreamEvent::Finish(settle_finish(
            self.finish,
            !self.slots.is_empty() || rescued > 0,
        )));
    }
}

impl SseDecode for ChunkDecoder {
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        self.seen = true;
        if self.done {
            return Ok(());
        }
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.end(out);
            return Ok(());
        }
        // A 2xx stream with an event that is not JSON was corrupted or cut short on the way:
        // as retryable as a broken connection (never replayed once output was delivered).
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a stream event is not JSON ({e}); expected a chat.completion.chunk object, \
                 got: {}",
                preview(data)
            ),
            retryable: true,
        })?;
        let has_error = v.get("error").is_some_and(|e| !e.is_null());
        if has_error || ev.event.as_deref() == Some("error") {
            if self.finish.is_none() {
                return Err(ModelError::Api(api_error_from_value(self.status, &v, None)));
            }
            // After a finish_reason, an error chunk only restates why the generation ended
            // (OpenRouter's "Token limit reached" after `length`); its usage still counts.
            tracing::debug!(chunk = %preview(data), "error chunk after the finish, ignored");
        }
        if let Some(u) = usage_of(&v) {
            out.push(StreamEvent::Usage(u));
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            for c in choices {
                let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                if *self.choice.get_or_insert(idx) != idx {
                    continue;
                }
                if let Some(delta) = c.get("delta").or_else(|| c.get("message")) {
                    self.delta(delta, out);
                }
                if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                    self.finish = Some(map_finish(f));
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if !self.done {
            if !self.seen {
                return Err(super::error::empty_stream());
            }
            if self.finish.is_none() {
                return Err(ModelError::Transport {
                    message: "the stream ended before the response was complete (no \
                              finish_reason and no [DONE] marker)"
                        .into(),
                    retryable: true,
                });
            }
            self.end(out);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::super::response::decode_response;
    use super::super::{decode_recorded, without_ids};
    use super::*;
    use crate::model::{ModelResponse, ToolSpec};
    use crate::providers::Decoded;
    use crate::providers::adapter;
    use proptest::prelude::*;

    fn decode_stream(body: &str) -> Decoded {
        decode_recorded(200, body.as_bytes(), true)
    }

    fn sse(chunks: &[Value]) -> String {
        let mut s = String::new();
        for c in chunks {
            s.push_str(&format!("data: {c}\n\n"));
        }
        s.push_str("data: [DONE]\n\n");
        s
    }

    #[test]
    fn parallel_calls_sharing_one_index_are_told_apart_by_id() {
        let d = decode_stream(&sse(&[
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ]));
        let calls = &d.response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].id.as_str(), calls[0].name.as_str()), ("a", "f"));
        assert_eq!(calls[0].arguments, json!({"x": 1}));
        assert_eq!((calls[1].id.as_str(), calls[1].name.as_str()), ("b", "g"));
    }

    #[test]
    fn calls_without_index_or_id_in_one_delta_stay_apart() {
        let d = decode_stream(&sse(&[json!({"choices":[{"delta":{"tool_calls":[
            {"function":{"name":"f","arguments":{"a":1}}},
            {"function":{"name":"g","arguments":"{\"b\":2}"}}
        ]},"finish_reason":"stop"}]})]));
        let calls = &d.response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"a": 1}), "object arguments");
        assert_eq!(calls[1].arguments, json!({"b": 2}));
        assert!(calls[0].id.starts_with("call_") && calls[0].id != calls[1].id);
        assert_eq!(
            d.response.finish_reason,
            FinishReason::ToolCalls,
            "stop with calls"
        );
    }

    #[test]
    fn a_stream_cut_short_is_an_error_and_a_refusal_is_kept_apart() {
        let d = decode_recorded(
            200,
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            true,
        );
        assert_eq!(d.response.text.as_deref(), Some("hi"));
        assert!(d.error.unwrap().message.contains("ended before"));

        let d = decode_stream(&sse(&[
            json!({"choices":[{"index":0,"delta":{"refusal":"I can't"}}]}),
            json!({"choices":[{"index":0,"delta":{"refusal":" help."},"finish_reason":"stop"}]}),
        ]));
        assert_eq!(d.response.text, None);
        assert_eq!(
            d.response.parts,
            vec![ProviderPart {
                provider: PROVIDER.into(),
                data: json!({"refusal": "I can't help."})
            }]
        );
        assert_eq!(d.response.finish_reason, FinishReason::Stop);
    }
    const STREAMS: &[&str] = &[
        include_str!("../../../tests/conformance/openai-stream-parallel-two-tools/response.sse"),
        include_str!(
            "../../../tests/conformance/mistral-stream-incremental-empty-name/response.sse"
        ),
        include_str!(
            "../../../tests/conformance/anthropic-compat-stream-tool-index-1/response.sse"
        ),
        include_str!(
            "../../../tests/conformance/openrouter-stream-comments-error-chunk/response.sse"
        ),
        include_str!(
            "../../../tests/conformance/groq-stream-error-event-tool-use-failed/response.sse"
        ),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"18°C — ünïcödé ✓\"},\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n",
    ];

    /// Decodes `body` fed in the given pieces, as events (so ids made up for missing ones do not
    /// differ between runs).
    fn events_in_pieces(body: &[u8], cuts: &[usize]) -> (Vec<StreamEvent>, Option<String>) {
        let mut d = adapter::SseReader::new(ChunkDecoder::new(200));
        let mut out = Vec::new();
        let mut last = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut result = Ok(());
        for c in cuts.into_iter().chain([body.len()]) {
            result = result.and_then(|()| d.push(&body[last..c], &mut out));
            last = c;
        }
        let result = result.and_then(|()| d.finish(&mut out));
        (out, result.err().map(|e| e.to_string()))
    }

    /// Decodes a stream whose content is `text` cut at `cuts`, with the rescue on for `tools`.
    fn rescued_stream(
        text: &str,
        cuts: &[usize],
        tools: &[ToolSpec],
    ) -> (ModelResponse, Vec<String>) {
        let chars: Vec<char> = text.chars().collect();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain([chars.len()]) {
            if c > last {
                let piece: String = chars[last..c].iter().collect();
                chunks.push(json!({"choices":[{"index":0,"delta":{"content": piece}}]}));
            }
            last = c;
        }
        chunks.push(json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}));
        let body = sse(&chunks);
        let mut decoder = ChunkDecoder::new(200);
        decoder.rescue = Some(Rescue::new(tools));
        let mut reader = adapter::SseReader::new(decoder);
        let mut events = Vec::new();
        reader.push(body.as_bytes(), &mut events).unwrap();
        reader.finish(&mut events).unwrap();
        let deltas = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::TextDelta(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        let mut acc = crate::stream::Accumulator::new();
        events.into_iter().for_each(|e| acc.push(e));
        (acc.finish(), deltas)
    }
    const LEAKED: &[&str] = &[
        "Let me look.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>\n<tool_call>{\"name\": \"read\", \"arguments\": {'path': 'b',}}</tool_call>",
        "[TOOL_CALLS]read[ARGS]{\"path\": \"x\"}",
        "Sure: <PTK_CALL>{\"tool\": \"read\", \"args\": {\"path\": \"é\"}}</PTK_CALL> done.",
        "```json\n{\"name\": \"read\", \"arguments\": {\"path\": \"c\"}}\n```",
        "Use <tool_call> tags, like <tool_call>{oops</tool_call>, to call.",
        "Just text, with a < sign and [brackets].",
    ];

    proptest! {
        #[test]
        fn rescued_streams_decode_like_the_complete_body(
            which in 0..LEAKED.len(),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let text = LEAKED[which];
            let tools = [ToolSpec {
                name: "read".into(),
                description: "Reads".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            }];
            let body = json!({"choices":[{"index":0,"finish_reason":"stop",
                "message":{"role":"assistant","content": text}}]});
            let complete = Rescue::apply(decode_response(body.to_string().as_bytes()).unwrap(), &tools);
            let (streamed, deltas) = rescued_stream(text, &cuts, &tools);
            prop_assert_eq!(without_ids(streamed), without_ids(complete.clone()));
            if which < 4 {
                for d in &deltas {
                    prop_assert!(
                        !d.contains(['<', '[', '`', '{', '}']),
                        "a call fragment streamed: {:?}",
                        deltas
                    );
                }
                prop_assert!(!complete.tool_calls.is_empty());
                prop_assert_eq!(complete.finish_reason, FinishReason::ToolCalls);
                for c in &complete.tool_calls {
                    prop_assert_eq!(c.provider_data.as_ref().and_then(|d| d.get("rescued")), Some(&json!(true)));
                }
            } else {
                // A near miss stays text, never an error; plain text is left as it is.
                prop_assert!(complete.tool_calls.is_empty());
                prop_assert_eq!(complete.malformed_call.clone(), None);
                prop_assert_eq!(complete.finish_reason, FinishReason::Stop);
                let got = complete.text.clone().unwrap_or_default();
                if which == 4 {
                    prop_assert!(got.contains("<tool_call>{oops</tool_call>"), "{}", got);
                } else {
                    prop_assert_eq!(got, text);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn any_chunking_decodes_like_one_chunk(
            which in 0..STREAMS.len(),
            cuts in proptest::collection::vec(0usize..100_000, 0..12),
        ) {
            let body = STREAMS[which].as_bytes();
            let whole = events_in_pieces(body, &[]);
            prop_assert!(!whole.0.is_empty() || whole.1.is_some());
            prop_assert_eq!(events_in_pieces(body, &cuts), whole);
        }
    }
}
