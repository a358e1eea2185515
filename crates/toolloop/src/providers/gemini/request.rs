//! Request bodies: the conversation and the tool catalog as `generateContent` contents.

use super::config::{GeminiConfig, PROVIDER};
use crate::image::{Image, ImageSource};
use crate::message::{AssistantMessage, Message, ProviderPart};
use crate::model::{ModelRequest, ToolChoice};
use crate::providers::adapter::{json_number, merge_extras};
use serde_json::{Map, Value, json};

/// A call of a model turn: our id, its name, and the id Gemini gave it, if any.
pub(super) struct CallRef {
    id: String,
    name: String,
    wire_id: Option<String>,
}

#[derive(Default)]
pub(super) struct Turn {
    role: &'static str,
    parts: Vec<Value>,
    calls: Vec<CallRef>,
    /// (call id, is_error, content) of tool results, placed when the turns are complete.
    results: Vec<(String, bool, String)>,
}

pub(super) fn push(turns: &mut Vec<Turn>, turn: Turn) {
    if turn.parts.is_empty() && turn.calls.is_empty() && turn.results.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == turn.role => {
            last.parts.extend(turn.parts);
            last.calls.extend(turn.calls);
            last.results.extend(turn.results);
        }
        _ => turns.push(turn),
    }
}

pub(super) fn user_text(text: String) -> Turn {
    Turn {
        role: "user",
        parts: vec![json!({"text": text})],
        ..Turn::default()
    }
}

/// An image as a part: `inlineData` for its bytes, `fileData` for a URL (Gemini takes public
/// HTTP URLs and its own file URIs there).
fn image_part(image: &Image) -> Value {
    match image.source() {
        ImageSource::Data(data) => json!({"inlineData": {
            "mimeType": image.media_type().unwrap_or("application/octet-stream"),
            "data": data,
        }}),
        ImageSource::Url(url) => match image.media_type() {
            Some(media_type) => json!({"fileData": {"mimeType": media_type, "fileUri": url}}),
            None => json!({"fileData": {"fileUri": url}}),
        },
    }
}

/// A text-part signature is stored as a part holding nothing but `thoughtSignature`.
pub(super) fn text_signature(part: &ProviderPart) -> Option<&Value> {
    match &part.data {
        Value::Object(m) if m.len() == 1 => m.get("thoughtSignature"),
        _ => None,
    }
}

/// The placeholder thought signature Google documents for function calls that have no real one
/// (calls made by another model, or kept in a transcript without their signature): Gemini 3
/// rejects a model turn whose first function call is unsigned, and accepts this value in its
/// place ("skip_thought_signature_validator", in the FAQ of
/// <https://ai.google.dev/gemini-api/docs/thought-signatures> and in Vertex AI's
/// <https://cloud.google.com/vertex-ai/generative-ai/docs/thought-signatures>).
pub const PLACEHOLDER_THOUGHT_SIGNATURE: &str = "skip_thought_signature_validator";

/// Whether `model` checks thought signatures on past function calls: every model but the
/// Gemini 1.x and 2.x ones, which never did (so they get no placeholder).
pub(super) fn validates_signatures(model: &str) -> bool {
    let name = model.trim();
    let name = name.strip_prefix("models/").unwrap_or(name);
    !(name.starts_with("gemini-1") || name.starts_with("gemini-2"))
}

pub(super) fn model_turn(a: &AssistantMessage) -> Turn {
    let mut parts = Vec::new();
    let mut signature = None;
    for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
        match text_signature(part) {
            Some(sig) => {
                signature.get_or_insert(sig.clone());
            }
            None => parts.push(part.data.clone()),
        }
    }
    match a.text.as_deref().filter(|t| !t.is_empty()) {
        Some(text) => {
            let mut part = json!({"text": text});
            if let Some(sig) = signature {
                part["thoughtSignature"] = sig;
            }
            parts.push(part);
        }
        // A signature that came on an empty text part goes back the same way.
        None if a.tool_calls.is_empty() => {
            if let Some(sig) = signature {
                parts.push(json!({"text": "", "thoughtSignature": sig}));
            }
        }
        None => {}
    }
    let mut calls = Vec::new();
    for call in &a.tool_calls {
        let data = call.provider_data.as_ref().map(|d| &d[PROVIDER]);
        let wire_id = data.and_then(|d| d["id"].as_str()).map(str::to_string);
        let args = match &call.arguments {
            Value::Object(_) => call.arguments.clone(),
            _ => json!({}),
        };
        let mut fc = json!({"name": call.name, "args": args});
        if let Some(id) = &wire_id {
            fc["id"] = json!(id);
        }
        let mut part = json!({"functionCall": fc});
        if let Some(sig) = data.and_then(|d| d.get("thoughtSignature")) {
            part["thoughtSignature"] = sig.clone();
        }
        parts.push(part);
        calls.push(CallRef {
            id: call.id.clone(),
            name: call.name.clone(),
            wire_id,
        });
    }
    Turn {
        role: "model",
        parts,
        calls,
        results: Vec::new(),
    }
}

/// Gives the first function call of a model turn the placeholder signature when none of the
/// turn's calls carries a real one (with parallel calls, Gemini signs only the first).
fn sign_unsigned_calls(turn: &mut Turn) {
    let calls = || {
        turn.parts
            .iter()
            .filter(|p| p.get("functionCall").is_some())
    };
    if calls().next().is_none() || calls().any(|p| p.get("thoughtSignature").is_some()) {
        return;
    }
    if let Some(first) = turn
        .parts
        .iter_mut()
        .find(|p| p.get("functionCall").is_some())
    {
        first["thoughtSignature"] = json!(PLACEHOLDER_THOUGHT_SIGNATURE);
    }
}

pub(super) fn response_object(content: &str, is_error: bool) -> Value {
    let value = serde_json::from_str::<Value>(content.trim())
        .unwrap_or_else(|_| Value::String(content.to_string()));
    if is_error {
        json!({"error": value})
    } else {
        json!({"output": value})
    }
}

/// Puts each user turn's function responses first, one per call of the previous model turn, in
/// call order; a call with no result gets an error response, a result that answers no call
/// becomes text.
pub(super) fn place_results(turns: &mut [Turn]) {
    for i in 0..turns.len() {
        if turns[i].role != "user" {
            continue;
        }
        let calls: Vec<(String, String, Option<String>)> = match i.checked_sub(1) {
            Some(j) if turns[j].role == "model" => turns[j]
                .calls
                .iter()
                .map(|c| (c.id.clone(), c.name.clone(), c.wire_id.clone()))
                .collect(),
            _ => Vec::new(),
        };
        let mut results = std::mem::take(&mut turns[i].results);
        if results.is_empty() && calls.is_empty() {
            continue;
        }
        let mut placed = Vec::with_capacity(calls.len() + turns[i].parts.len());
        for (id, name, wire_id) in calls {
            let response = match results.iter().position(|r| r.0 == id) {
                Some(pos) => {
                    let (_, is_error, content) = results.remove(pos);
                    response_object(&content, is_error)
                }
                None => {
                    json!({"error": "No result was recorded for this call; it was not executed."})
                }
            };
            let mut fr = json!({"name": name, "response": response});
            if let Some(wire_id) = wire_id {
                fr["id"] = json!(wire_id);
            }
            placed.push(json!({"functionResponse": fr}));
        }
        for (id, _, content) in results {
            placed.push(json!({
                "text": format!("Result of tool call {id} (no matching call in the previous turn): {content}")
            }));
        }
        placed.append(&mut turns[i].parts);
        turns[i].parts = placed;
    }
}

/// The `generateContent` request body for `req` (the same for the streaming endpoint).
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn build_request_body(req: &ModelRequest<'_>, config: &GeminiConfig, stream: bool) -> Value {
    let _ = stream; // streaming is chosen by the endpoint, not the body
    let (prompt, conversation) = req.messages.split_system_prompt();
    let system: Vec<Value> = prompt
        .filter(|text| !text.trim().is_empty())
        .map(|text| json!({"text": text}))
        .collect();
    let mut turns: Vec<Turn> = Vec::new();
    for message in conversation {
        match message {
            Message::System { content } => {
                if !content.trim().is_empty() {
                    push(
                        &mut turns,
                        user_text(format!("<system-reminder>{content}</system-reminder>")),
                    );
                }
            }
            Message::User { content, images } => {
                let mut turn = Turn {
                    role: "user",
                    parts: images.iter().map(image_part).collect(),
                    ..Turn::default()
                };
                if !content.is_empty() {
                    turn.parts.push(json!({"text": content}));
                }
                push(&mut turns, turn);
            }
            Message::Assistant(a) => {
                let mut turn = model_turn(a);
                if validates_signatures(&config.model) {
                    sign_unsigned_calls(&mut turn);
                }
                push(&mut turns, turn);
            }
            Message::Tool(r) => {
                push(
                    &mut turns,
                    Turn {
                        role: "user",
                        results: vec![(r.call_id.clone(), r.is_error, r.content.clone())],
                        // Images follow the turn's function responses, named by their call.
                        parts: crate::providers::tool_result_images(r)
                            .map(|(text, images)| {
                                std::iter::once(json!({ "text": text }))
                                    .chain(images.iter().map(image_part))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        ..Turn::default()
                    },
                );
            }
        }
    }
    place_results(&mut turns);
    let reminders: Vec<Value> = req
        .wrapped_reminders()
        .map(|r| json!({"text": r}))
        .collect();
    if !reminders.is_empty() {
        match turns.last_mut() {
            Some(last) if last.role == "user" => last.parts.extend(reminders),
            _ => turns.push(Turn {
                role: "user",
                parts: reminders,
                ..Turn::default()
            }),
        }
    }

    let mut body = Map::new();
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    let contents: Vec<Value> = turns
        .into_iter()
        .filter(|t| !t.parts.is_empty())
        .map(|t| json!({"role": t.role, "parts": t.parts}))
        .collect();
    body.insert("contents".into(), Value::Array(contents));
    if !req.tools.is_empty() {
        let declarations: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut d = json!({"name": t.name, "parametersJsonSchema": t.parameters});
                if !t.description.is_empty() {
                    d["description"] = json!(t.description);
                }
                d
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations}]),
        );
        let config = match &req.settings.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::None => Some(json!({"mode": "NONE"})),
            ToolChoice::Required => Some(json!({"mode": "ANY"})),
            ToolChoice::Tool(name) => Some(json!({"mode": "ANY", "allowedFunctionNames": [name]})),
        };
        if let Some(c) = config {
            body.insert("toolConfig".into(), json!({"functionCallingConfig": c}));
        }
    }
    let mut generation = Map::new();
    if let Some(t) = req.settings.temperature {
        generation.insert("temperature".into(), json_number(t));
    }
    if let Some(n) = req.settings.max_output_tokens {
        generation.insert("maxOutputTokens".into(), json!(n));
    }
    if let Some(output) = &req.settings.output {
        // JSON mode with the schema as JSON Schema (`responseJsonSchema`, not the OpenAPI
        // subset `responseSchema` takes).
        generation.insert("responseMimeType".into(), json!("application/json"));
        generation.insert("responseJsonSchema".into(), output.schema.clone());
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    let mut body = Value::Object(body);
    merge_extras(
        &mut body,
        [config.extra.as_ref(), req.settings.extra.as_ref()],
    );
    body
}

#[cfg(test)]
mod tests {
    use super::super::parallel_response;
    use super::super::response::decode_response;
    use super::*;
    use crate::message::{ToolCall, ToolResult};
    use crate::model::{ModelSettings, ToolSpec};

    fn body(messages: &[Message], reminders: &[String], tools: &[ToolSpec]) -> Value {
        let settings = ModelSettings::default();
        let req = ModelRequest {
            messages: messages.into(),
            reminders,
            tools,
            settings: &settings,
        };
        build_request_body(&req, &GeminiConfig::new("gemini-test"), false)
    }

    fn result(id: &str, name: &str, content: &str, is_error: bool) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            name: name.into(),
            content: content.into(),
            is_error,
            images: Vec::new(),
        })
    }

    #[test]
    fn a_user_turn_with_images_is_inline_and_file_data_parts_then_its_text() {
        use crate::image::Image;
        let images = [
            Image::from_bytes(b"GIF89a\x01\x00").unwrap(),
            Image::from_url("https://example.com/a.png").unwrap(),
            Image::from_url("https://example.com/picture").unwrap(),
        ];
        let v = body(
            &[Message::user_with_images("what is this?", images)],
            &[],
            &[],
        );
        assert_eq!(
            v["contents"][0],
            json!({"role": "user", "parts": [
                {"inlineData": {"mimeType": "image/gif", "data": "R0lGODlhAQA="}},
                {"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/a.png"}},
                {"fileData": {"fileUri": "https://example.com/picture"}},
                {"text": "what is this?"},
            ]})
        );
    }

    #[test]
    fn calls_and_signatures_go_back_and_responses_follow_call_order() {
        let r = decode_response(&parallel_response()).unwrap();
        let (a, b) = (r.tool_calls[0].id.clone(), r.tool_calls[1].id.clone());
        let msgs = vec![
            Message::system("sys"),
            Message::user("weather and time?"),
            Message::Assistant(r.to_message()),
            result(&b, "get_time", "{\"time\":\"12:00\"}", false),
            result(&a, "get_weather", "boom", true),
        ];
        let v = body(&msgs, &["hurry".into()], &[]);
        assert_eq!(v["systemInstruction"], json!({"parts": [{"text": "sys"}]}));
        let contents = v["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 3);
        assert_eq!(
            contents[1],
            json!({"role": "model", "parts": [
                {"text": "thinking about it", "thought": true},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "SIG_A"},
                {"functionCall": {"name": "get_time", "args": {"tz": "CET"}}},
            ]})
        );
        assert_eq!(
            contents[2],
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"error": "boom"}}},
                {"functionResponse": {"name": "get_time", "response": {"output": {"time": "12:00"}}}},
                {"text": "<system-reminder>hurry</system-reminder>"},
            ]})
        );
    }

    #[test]
    fn text_signature_goes_back_on_the_text_and_foreign_parts_are_dropped() {
        let r = decode_response(&json!({
            "candidates": [{"content": {"parts": [{"text": "Hello", "thoughtSignature": "T1"}]}, "finishReason": "STOP"}]
        }))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("Hello"));
        let mut message = r.to_message();
        message.parts.push(ProviderPart {
            provider: "anthropic".into(),
            data: json!({"type": "thinking", "signature": "x"}),
        });
        let v = body(
            &[
                Message::user("hi"),
                Message::Assistant(message),
                Message::user("more"),
            ],
            &[],
            &[],
        );
        assert_eq!(
            v["contents"][1]["parts"],
            json!([{"text": "Hello", "thoughtSignature": "T1"}])
        );
    }

    #[test]
    fn wire_ids_missing_results_and_alternation() {
        let mut call = ToolCall::new("f", json!({}));
        call.provider_data = Some(json!({"gemini": {"id": "fc-1"}}));
        let id = call.id.clone();
        let other = ToolCall::new("g", json!({"a": 1}));
        let msgs = vec![
            Message::user("a"),
            Message::user("b"),
            Message::Assistant(AssistantMessage {
                tool_calls: vec![call, other],
                ..AssistantMessage::default()
            }),
            result(&id, "f", "42", false),
            Message::user("c"),
        ];
        let v = body(&msgs, &[], &[]);
        let contents = v["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 3);
        assert_eq!(contents[0]["parts"], json!([{"text": "a"}, {"text": "b"}]));
        assert_eq!(contents[1]["parts"][0]["functionCall"]["id"], "fc-1");
        let parts = contents[2]["parts"].as_array().unwrap();
        assert_eq!(
            parts[0],
            json!({"functionResponse": {"name": "f", "id": "fc-1", "response": {"output": 42}}})
        );
        assert_eq!(parts[1]["functionResponse"]["name"], "g");
        assert!(parts[1]["functionResponse"]["response"]["error"].is_string());
        assert_eq!(parts[2], json!({"text": "c"}));
    }

    #[test]
    fn tools_and_settings() {
        let tools = [ToolSpec {
            name: "f".into(),
            description: "does f".into(),
            parameters: json!({"type": "object", "properties": {"x": {"type": ["string", "null"]}}}),
        }];
        let settings = ModelSettings {
            temperature: Some(0.2),
            max_output_tokens: Some(64),
            tool_choice: ToolChoice::Tool("f".into()),
            extra: Some(json!({"generationConfig": {"topK": 3}})),
            ..ModelSettings::default()
        };
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &tools,
            settings: &settings,
        };
        let v = build_request_body(&req, &GeminiConfig::new("m"), true);
        assert_eq!(
            v["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"],
            tools[0].parameters
        );
        assert_eq!(
            v["toolConfig"]["functionCallingConfig"],
            json!({"mode": "ANY", "allowedFunctionNames": ["f"]})
        );
        assert_eq!(
            v["generationConfig"],
            json!({"temperature": 0.2, "maxOutputTokens": 64, "topK": 3})
        );
    }

    #[test]
    fn an_output_schema_is_json_mode_with_the_json_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let settings = ModelSettings {
            output: Some(crate::output::OutputSchema::new("Answer", schema.clone())),
            ..ModelSettings::default()
        };
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let v = build_request_body(&req, &GeminiConfig::new("m"), false);
        assert_eq!(
            v["generationConfig"],
            json!({"responseMimeType": "application/json", "responseJsonSchema": schema})
        );
    }
}
