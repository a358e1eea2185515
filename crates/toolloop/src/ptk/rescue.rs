//! Rescue: tool calls that a model wrote in the text of a native response.

use super::render::PTK_PROVIDER;
use super::stream::StreamParser;
use crate::model::{FinishReason, ModelResponse, ToolSpec};
use crate::stream::{Accumulator, StreamEvent};
use serde_json::{Value, json};
use std::sync::Arc;

/// Recovers tool calls that a model wrote as text in a response of a native tool-calling API
/// (Ollama and vLLM pass a call through as `content` when their own parser misses it, with
/// `tool_calls: []`).
///
/// The response's text goes through a [`StreamParser`]: ordinary text comes out as it arrives
/// (anything that could start a call tag is held back until decided, so no fragment of a tag
/// ever reaches the user), and the calls found, in any dialect, are kept aside. At the end, when
/// the response carried no native tool call, they become its tool calls: fresh ids, and
/// `provider_data` `{"rescued": true}` (plus `"repaired": true` when the call's JSON needed a
/// repair). When it did carry native calls, the calls found in the text are dropped (they are
/// nearly always the same calls, leaked twice) and the native ones win.
///
/// Only real calls are rescued: an attempted call that does not parse (a near miss) is put back
/// into the text as it was written, never turned into an error, since a model answering in
/// natural language may well show a tag. Reasoning written in `<think>…</think>` leaves the text
/// for a `ptk` [`ProviderPart`](crate::message::ProviderPart) (under `"reasoning"`). Whitespace at the edges of the text, and around calls
/// and near misses, is normalized as [`parse_reply`](super::parse_reply) does (trimmed, pieces
/// separated by a newline); text with nothing that looks like a call is left as it is, but for
/// the trimming.
///
/// [`Rescue::apply`] does the same to a complete response, so a complete and a streamed response
/// give the same transcript. With no tools offered, nothing is rescued and the text passes
/// through untouched.
#[derive(Debug)]
pub struct Rescue {
    parser: Option<StreamParser>,
    held: Vec<StreamEvent>,
    calls: usize,
}

impl Rescue {
    /// A rescue for a response to a request offering `tools` (none: text passes through).
    pub fn new(tools: &[ToolSpec]) -> Self {
        Rescue {
            parser: (!tools.is_empty()).then(|| StreamParser::new(tools)),
            held: Vec::new(),
            calls: 0,
        }
    }

    /// [`Rescue::new`] with the tools shared rather than copied (a rescue per streamed reply to
    /// the same catalog copies nothing).
    pub fn shared(tools: &Arc<[ToolSpec]>) -> Self {
        Rescue {
            parser: (!tools.is_empty()).then(|| StreamParser::shared(tools.clone())),
            held: Vec::new(),
            calls: 0,
        }
    }

    /// Feeds a piece of the response's text; gives the text events to pass on now.
    pub fn push(&mut self, delta: &str) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.push_into(delta, &mut out);
        out
    }

    /// [`Rescue::push`], the events appended to `out`.
    pub(crate) fn push_into(&mut self, delta: &str, out: &mut Vec<StreamEvent>) {
        match self.parser.as_mut() {
            None => out.push(StreamEvent::TextDelta(delta.to_string())),
            Some(p) => {
                let events = p.push(delta);
                self.sort(events, out);
            }
        }
    }

    /// Ends the text: the text events still held back, then, when `native_calls` is false, the
    /// rescued calls' events (indices from 0). Also gives how many calls were rescued.
    pub fn finish(mut self, native_calls: bool) -> (Vec<StreamEvent>, usize) {
        let mut out = Vec::new();
        if let Some(p) = self.parser.take() {
            let events = p.finish();
            self.sort(events, &mut out);
        }
        if native_calls || self.calls == 0 {
            return (out, 0);
        }
        out.append(&mut self.held);
        (out, self.calls)
    }

    /// Text out now (appended to `out`), calls aside, near misses back to text.
    fn sort(&mut self, events: Vec<StreamEvent>, out: &mut Vec<StreamEvent>) {
        for event in events {
            match event {
                StreamEvent::TextDelta(_) => out.push(event),
                StreamEvent::Part(part) if part.provider == PTK_PROVIDER => {
                    if let Some(raw) = part.data.get("malformed").and_then(Value::as_str) {
                        out.push(StreamEvent::TextDelta(raw.to_string()));
                    } else {
                        // `<think>` reasoning: kept, out of the text.
                        out.push(StreamEvent::Part(part));
                    }
                }
                StreamEvent::MalformedCall(_) => {}
                StreamEvent::ToolCallStart { index, id, name } => {
                    self.calls += 1;
                    self.held
                        .push(StreamEvent::ToolCallStart { index, id, name });
                    self.held.push(StreamEvent::ToolCallData {
                        index,
                        data: json!({"rescued": true}),
                    });
                }
                StreamEvent::ToolCallData { index, data } => {
                    // The last data wins in the accumulator: merge the marks.
                    let mut merged = json!({"rescued": true});
                    if let (Value::Object(m), Value::Object(d)) = (&mut merged, data) {
                        m.extend(d);
                    }
                    self.held.push(StreamEvent::ToolCallData {
                        index,
                        data: merged,
                    });
                }
                other => self.held.push(other),
            }
        }
    }

    /// Rescues the calls in a complete response's text, as streaming it would: the text loses
    /// the calls, the calls join the response (when it has no native call) and a `Stop` becomes
    /// `ToolCalls`.
    pub fn apply(mut response: ModelResponse, tools: &[ToolSpec]) -> ModelResponse {
        let Some(text) = response.text.take() else {
            return response;
        };
        if !tools.is_empty() && !text.bytes().any(|b| matches!(b, b'<' | b'[' | b'`' | b'{')) {
            // Nothing in the text can open a call: only the edges' whitespace changes, as the
            // parser would change it (a property test holds the two equal).
            response.text = Self::trimmed(text);
            return response;
        }
        response.text = Some(text);
        Self::apply_parsed(response, tools)
    }

    /// `text` with the whitespace at its edges trimmed as the parser trims it.
    fn trimmed(text: String) -> Option<String> {
        let t = text.trim();
        if t.is_empty() {
            None
        } else if t.len() == text.len() {
            Some(text)
        } else {
            Some(t.to_string())
        }
    }

    fn apply_parsed(mut response: ModelResponse, tools: &[ToolSpec]) -> ModelResponse {
        let Some(text) = response.text.take() else {
            return response;
        };
        let mut rescue = Rescue::new(tools);
        let mut events = rescue.push(&text);
        let (rest, rescued) = rescue.finish(!response.tool_calls.is_empty());
        events.extend(rest);
        let mut acc = Accumulator::new();
        events.into_iter().for_each(|e| acc.push(e));
        let found = acc.finish();
        response.text = found.text;
        if rescued > 0 {
            response.tool_calls = found.tool_calls;
            if response.finish_reason == FinishReason::Stop {
                response.finish_reason = FinishReason::ToolCalls;
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn text_with_no_opener_skips_the_parser_and_ends_the_same(
            text in "[ \t\r\n\u{a0}\u{2003}\u{0b}\u{0c}a-zA-Z0-9.,!?:;()'\"=/-]{0,40}",
        ) {
            let tools = tools();
            let fast = Rescue::apply(ModelResponse::text(text.clone()), &tools);
            let parsed = Rescue::apply_parsed(ModelResponse::text(text), &tools);
            prop_assert_eq!(fast.text, parsed.text);
            prop_assert_eq!(fast.tool_calls, parsed.tool_calls);
            prop_assert_eq!(fast.finish_reason, parsed.finish_reason);
        }
    }

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "get_weather".into(),
            description: "Weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }]
    }

    #[test]
    fn calls_in_text_become_tool_calls_and_text_stays() {
        let r = Rescue::apply(
            ModelResponse::text(
                "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            ),
            &tools(),
        );
        assert_eq!(r.text.as_deref(), Some("Let me check."));
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(
            r.tool_calls[0].provider_data,
            Some(json!({"rescued": true}))
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert!(r.tool_calls[0].id.starts_with("call_"));
    }

    #[test]
    fn near_misses_stay_text_and_native_calls_win() {
        let r = Rescue::apply(
            ModelResponse::text("Use <tool_call>{oops</tool_call> like that."),
            &tools(),
        );
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.malformed_call, None);
        assert_eq!(r.finish_reason, FinishReason::Stop);
        let text = r.text.unwrap();
        assert!(text.contains("<tool_call>{oops</tool_call>"), "{text}");

        let mut native = ModelResponse::tool_calls(vec![crate::message::ToolCall::new(
            "get_weather",
            json!({"city": "Rome"}),
        )]);
        native.text = Some("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}".into());
        let r = Rescue::apply(native, &tools());
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].arguments, json!({"city": "Rome"}));
        assert_eq!(r.text, None);
    }

    #[test]
    fn without_tools_text_passes_untouched() {
        let text = "  <PTK_CALL>{\"tool\": \"x\", \"args\": {}}</PTK_CALL> \n";
        let r = Rescue::apply(ModelResponse::text(text), &[]);
        assert_eq!(r.text.as_deref(), Some(text));
        assert!(r.tool_calls.is_empty());
    }
}
