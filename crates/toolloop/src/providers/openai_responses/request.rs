//! Request bodies: the conversation and the tool catalog as Responses API `input` items.

use super::config::{PROVIDER, ResponsesConfig};
use crate::message::Message;
use crate::model::{ModelRequest, ToolChoice};
use crate::providers::adapter::{json_number, merge_extras};
use serde_json::{Map, Value, json};

/// The JSON body of one Responses API request.
///
/// - Leading system messages become `instructions` (joined by blank lines); a system message
///   later in the conversation is a `system` message item where it stood.
/// - A user turn is a `user` message item; with images, its content is an `input_text` part and
///   an `input_image` part per image (a `data:` URL for an image given by its bytes).
/// - An assistant turn is its reasoning items (this adapter's
///   [`ProviderPart`](crate::message::ProviderPart)s, exactly as received, in their order; parts
///   of other providers are left out), then an `assistant` message with its text, then one
///   `function_call` item per call (`call_id`, `name`, and the always valid
///   [`ToolCall::arguments`](crate::message::ToolCall::arguments) as text: the model's invalid
///   argument text is never sent back).
/// - A tool result is a `function_call_output` item with the call's `call_id`.
/// - A `compaction` item (the server's compaction of the conversation, kept with its turn like
///   a reasoning item) stands for everything before it: the input starts at the latest one
///   (the instructions are still sent).
/// - With compaction asked ([`crate::model::ModelSettings::context`]'s `compact_at_tokens`),
///   `context_management: [{"type": "compaction", "compact_threshold": N}]`.
/// - Transient reminders are trailing `developer` message items.
///
/// `store` is `config.store` (`false` by default); with reasoning requested (see
/// [`ResponsesConfig::reasoning`]) the body asks for `include: ["reasoning.encrypted_content"]`.
/// `config.extra`, then `settings.extra`, are merged into the top level last (objects merged
/// recursively); a value that is not a JSON object is ignored here
/// ([`ResponsesModel`](super::ResponsesModel) refuses it with a clear error).
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn build_request_body(req: &ModelRequest<'_>, config: &ResponsesConfig, stream: bool) -> Value {
    let settings = req.settings;
    let mut body = Map::new();
    let model = settings.model.as_deref().unwrap_or(&config.model);
    body.insert("model".into(), json!(model));

    let leading = req.messages.leading_system();
    let instructions: Vec<&str> = req
        .messages
        .slice(..leading)
        .iter()
        .map(Message::text)
        .filter(|t| !t.is_empty())
        .collect();
    if !instructions.is_empty() {
        body.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    // The latest compaction item stands for everything before it: nothing before its turn is
    // sent, and its turn is sent from the compaction item on.
    let compacted = req
        .messages
        .slice(leading..)
        .iter()
        .rposition(|m| compaction_at(m).is_some())
        .map(|i| i + leading);
    let from = compacted.unwrap_or(leading);
    let mut input = Vec::with_capacity(req.messages.len() - from + req.reminders.len());
    for (i, message) in req.messages.slice(from..).iter().enumerate() {
        match (i, message) {
            (0, Message::Assistant(a)) if compacted.is_some() => {
                let skip = compaction_at(message).unwrap_or(0);
                let mut turn = a.clone();
                turn.parts.drain(..skip);
                push_items(&mut input, &Message::Assistant(turn), config);
            }
            _ => push_items(&mut input, message, config),
        }
    }
    for reminder in req.wrapped_reminders() {
        input.push(json!({"type": "message", "role": "developer", "content": reminder}));
    }
    body.insert("input".into(), Value::Array(input));

    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": config.strict,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &settings.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool(name) => json!({"type": "function", "name": name}),
        };
        body.insert("tool_choice".into(), choice);
        if let Some(parallel) = config.parallel_tool_calls {
            body.insert("parallel_tool_calls".into(), json!(parallel));
        }
    }
    if let Some(output) = &settings.output {
        // The Responses API's structured output: `text.format`, strict only when the schema
        // can be (every object closed, every property required).
        let (schema, is_strict) = output.for_strict_api();
        body.insert(
            "text".into(),
            json!({"format": {
                "type": "json_schema",
                "name": output.name,
                "schema": schema,
                "strict": is_strict,
            }}),
        );
    }
    if let Some(t) = settings.temperature {
        body.insert("temperature".into(), json_number(t));
    }
    if let Some(n) = settings.max_output_tokens {
        body.insert("max_output_tokens".into(), json!(n));
    }
    body.insert("store".into(), json!(config.store));
    if let Some(reasoning) = config.reasoning.as_ref().filter(|r| !r.is_null()) {
        body.insert("reasoning".into(), reasoning.clone());
    }
    if config.wants_reasoning(settings.extra.as_ref()) {
        body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    }
    if let Some(threshold) = settings.context.as_ref().and_then(|c| c.compact_at_tokens) {
        body.insert(
            "context_management".into(),
            json!([{"type": "compaction", "compact_threshold": threshold}]),
        );
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    let mut body = Value::Object(body);
    merge_extras(
        &mut body,
        [config.extra.as_ref(), settings.extra.as_ref()]
            .into_iter()
            .map(|e| e.filter(|e| e.is_object())),
    );
    body
}

/// Whether a kept reasoning or compaction item can be sent back: with `store` on, by its id;
/// without, only with its encrypted content (the server refuses an id it did not store).
fn replayable(item: &Value, config: &ResponsesConfig) -> bool {
    matches!(item["type"].as_str(), Some("reasoning" | "compaction"))
        && (config.store
            || item["encrypted_content"]
                .as_str()
                .is_some_and(|s| !s.is_empty()))
}

/// The index, among an assistant turn's parts, of its last compaction item (one this adapter
/// can send back), if it holds one.
fn compaction_at(message: &Message) -> Option<usize> {
    let Message::Assistant(a) = message else {
        return None;
    };
    a.parts.iter().rposition(|p| {
        p.provider == PROVIDER
            && p.data["type"] == "compaction"
            && p.data["encrypted_content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
    })
}

/// The `input` items of one message.
fn push_items(input: &mut Vec<Value>, message: &Message, config: &ResponsesConfig) {
    match message {
        Message::System { content } => {
            input.push(json!({"type": "message", "role": "system", "content": content}))
        }
        Message::User { content, images } if images.is_empty() => {
            input.push(json!({"type": "message", "role": "user", "content": content}))
        }
        Message::User { content, images } => {
            let mut parts = Vec::with_capacity(images.len() + 1);
            if !content.is_empty() {
                parts.push(json!({"type": "input_text", "text": content}));
            }
            parts.extend(images.iter().map(input_image));
            input.push(json!({"type": "message", "role": "user", "content": parts}))
        }
        Message::Assistant(a) => {
            for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
                if replayable(&part.data, config) {
                    input.push(part.data.clone());
                }
            }
            if let Some(text) = a.text.as_deref().filter(|t| !t.is_empty()) {
                input.push(json!({"type": "message", "role": "assistant", "content": text}));
            }
            for call in &a.tool_calls {
                input.push(json!({
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments.to_string(),
                }));
            }
        }
        Message::Tool(r) if r.images.is_empty() => input.push(json!({
            "type": "function_call_output",
            "call_id": r.call_id,
            "output": r.content,
        })),
        // An output with images is a list of parts: the text, then the images.
        Message::Tool(r) => {
            let mut parts = vec![json!({"type": "input_text", "text": r.content})];
            parts.extend(r.images.iter().map(input_image));
            input.push(json!({
                "type": "function_call_output",
                "call_id": r.call_id,
                "output": parts,
            }))
        }
    }
}

/// An image as an `input_image` part (a `data:` URL for its bytes).
fn input_image(image: &crate::image::Image) -> Value {
    json!({"type": "input_image", "image_url": image.url(), "detail": "auto"})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AssistantMessage, ProviderPart, ToolCall, ToolResult};
    use crate::model::{ModelSettings, ToolSpec};

    fn conversation() -> Vec<Message> {
        let bad = ToolCall::from_raw_arguments("call_2".into(), "write".into(), "{\"path\": ");
        vec![
            Message::system("be brief"),
            Message::system("and kind"),
            Message::user("read a.txt"),
            Message::Assistant(AssistantMessage {
                text: Some("Reading.".into()),
                tool_calls: vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "read".into(),
                        arguments: json!({"path": "a.txt"}),
                        invalid_arguments: None,
                        provider_data: None,
                    },
                    bad,
                ],
                parts: vec![
                    ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({"type": "reasoning", "id": "rs_1", "summary": [],
                                     "encrypted_content": "gAAA"}),
                    },
                    ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({"type": "reasoning", "id": "rs_2", "summary": []}),
                    },
                    ProviderPart {
                        provider: "anthropic".into(),
                        data: json!({"type": "thinking", "thinking": "hmm"}),
                    },
                ],
            }),
            Message::Tool(ToolResult {
                call_id: "call_1".into(),
                name: "read".into(),
                content: "hello".into(),
                is_error: false,
                images: Vec::new(),
            }),
            Message::Tool(ToolResult {
                call_id: "call_2".into(),
                name: "write".into(),
                content: "arguments are not valid JSON".into(),
                is_error: true,
                images: Vec::new(),
            }),
            Message::system("late"),
        ]
    }

    fn body(config: &ResponsesConfig, settings: &ModelSettings, stream: bool) -> Value {
        let messages = conversation();
        let tools = [ToolSpec {
            name: "read".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object"}),
        }];
        let reminders = ["mind the budget".to_string()];
        let req = ModelRequest {
            messages: (&messages).into(),
            reminders: &reminders,
            tools: &tools,
            settings,
        };
        build_request_body(&req, config, stream)
    }

    #[test]
    fn a_user_turn_with_images_is_input_text_then_input_image_parts() {
        use crate::image::Image;
        let messages = [Message::user_with_images(
            "what is this?",
            [
                Image::from_bytes(b"GIF89a\x01\x00").unwrap(),
                Image::from_url("https://example.com/a.png").unwrap(),
            ],
        )];
        let settings = ModelSettings::default();
        let req = ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let b = build_request_body(&req, &ResponsesConfig::new("m"), false);
        assert_eq!(
            b["input"][0],
            json!({"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/gif;base64,R0lGODlhAQA=",
                 "detail": "auto"},
                {"type": "input_image", "image_url": "https://example.com/a.png",
                 "detail": "auto"},
            ]})
        );
    }

    #[test]
    fn an_output_schema_is_asked_for_as_text_format() {
        let closed = json!({"type": "object", "properties": {"a": {"type": "string"}},
                            "required": ["a"]});
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        for (schema, strict) in [(closed, true), (open, false)] {
            let settings = ModelSettings {
                output: Some(crate::output::OutputSchema::new("Answer", schema.clone())),
                ..ModelSettings::default()
            };
            let b = body(&ResponsesConfig::new("gpt-x"), &settings, false);
            let format = &b["text"]["format"];
            assert_eq!(format["type"], "json_schema", "{b}");
            assert_eq!(format["name"], "Answer");
            assert_eq!(format["strict"], strict, "{schema}");
            if strict {
                assert_eq!(format["schema"]["additionalProperties"], false);
            } else {
                assert_eq!(format["schema"], schema);
            }
        }
        let b = body(
            &ResponsesConfig::new("gpt-x"),
            &ModelSettings::default(),
            false,
        );
        assert!(b.get("text").is_none(), "{b}");
    }

    #[test]
    fn items_in_order_with_reasoning_carried_back() {
        let b = body(
            &ResponsesConfig::new("gpt-x"),
            &ModelSettings::default(),
            false,
        );
        assert_eq!(b["model"], "gpt-x");
        assert_eq!(b["instructions"], "be brief\n\nand kind");
        assert_eq!(b["store"], false);
        assert!(b.get("include").is_none() && b.get("stream").is_none());
        let input = b["input"].as_array().unwrap();
        let kinds: Vec<String> = input
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["type"].as_str().unwrap(),
                    i["role"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "message/user",
                "reasoning/",
                "message/assistant",
                "function_call/",
                "function_call/",
                "function_call_output/",
                "function_call_output/",
                "message/system",
                "message/developer",
            ]
        );
        // Only the reasoning item with encrypted content goes back (store is off), unchanged.
        assert_eq!(input[1]["id"], "rs_1");
        assert_eq!(input[1]["encrypted_content"], "gAAA");
        assert_eq!(
            input[3],
            json!({"type": "function_call", "call_id": "call_1", "name": "read",
                   "arguments": "{\"path\":\"a.txt\"}"})
        );
        assert_eq!(
            input[4]["arguments"], "{}",
            "invalid arguments are never replayed"
        );
        assert_eq!(
            input[5],
            json!({"type": "function_call_output", "call_id": "call_1", "output": "hello"})
        );
        assert_eq!(
            input[8]["content"],
            "<system-reminder>mind the budget</system-reminder>"
        );
        assert!(
            !b.to_string().contains("hmm"),
            "other providers' parts are left out"
        );
        assert_eq!(
            b["tools"][0],
            json!({"type": "function", "name": "read", "description": "Reads a file",
                   "parameters": {"type": "object"}, "strict": false})
        );
        assert_eq!(b["tool_choice"], "auto");
    }

    #[test]
    fn settings_reasoning_and_extras() {
        let mut config = ResponsesConfig::new("m");
        config.store = true;
        config.reasoning = Some(json!({"effort": "low"}));
        config.parallel_tool_calls = Some(false);
        config.strict = true;
        config.extra = Some(json!({"top_logprobs": 2, "reasoning": {"summary": "auto"}}));
        let settings = ModelSettings {
            temperature: Some(0.7),
            max_output_tokens: Some(100),
            tool_choice: ToolChoice::Tool("read".into()),
            extra: Some(json!({"top_logprobs": 3})),
            ..ModelSettings::default()
        };
        let b = body(&config, &settings, true);
        assert_eq!(b["stream"], true);
        assert_eq!(b["store"], true);
        assert_eq!(b["max_output_tokens"], 100);
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(b["parallel_tool_calls"], false);
        assert_eq!(b["tools"][0]["strict"], true);
        assert_eq!(
            b["tool_choice"],
            json!({"type": "function", "name": "read"})
        );
        assert_eq!(b["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(b["reasoning"], json!({"effort": "low", "summary": "auto"}));
        assert_eq!(b["top_logprobs"], 3, "the settings' extra comes last");
        // With store on, reasoning items go back by id even without encrypted content.
        let reasoning = b["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "reasoning")
            .count();
        assert_eq!(reasoning, 2);
        // Reasoning asked for by an extra alone also asks for the encrypted content.
        let config = ResponsesConfig {
            extra: Some(json!({"reasoning": {"effort": "high"}})),
            ..ResponsesConfig::new("m")
        };
        let settings = ModelSettings {
            tool_choice: ToolChoice::None,
            ..ModelSettings::default()
        };
        let b = body(&config, &settings, false);
        assert_eq!(b["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(b["tool_choice"], "none");
    }

    #[test]
    fn nothing_before_the_latest_compaction_is_sent_and_compaction_is_asked() {
        let compaction = |n: u32| ProviderPart {
            provider: PROVIDER.into(),
            data: json!({"type": "compaction", "id": format!("cmp_{n}"),
                         "encrypted_content": format!("enc{n}")}),
        };
        let turn = |n: u32, parts: Vec<ProviderPart>| {
            Message::Assistant(AssistantMessage {
                text: None,
                tool_calls: vec![ToolCall {
                    id: format!("call_{n}"),
                    name: "read".into(),
                    arguments: json!({}),
                    invalid_arguments: None,
                    provider_data: None,
                }],
                parts,
            })
        };
        let result = |n: u32| {
            Message::Tool(ToolResult {
                call_id: format!("call_{n}"),
                name: "read".into(),
                content: format!("r{n}"),
                is_error: false,
                images: Vec::new(),
            })
        };
        let reasoning = ProviderPart {
            provider: PROVIDER.into(),
            data: json!({"type": "reasoning", "id": "rs_0", "summary": [],
                         "encrypted_content": "gAAA"}),
        };
        let messages = vec![
            Message::system("be brief"),
            Message::user("task"),
            turn(1, vec![compaction(1)]),
            result(1),
            turn(2, vec![reasoning.clone(), compaction(2), reasoning]),
            result(2),
            turn(3, Vec::new()),
            result(3),
        ];
        let settings = ModelSettings {
            context: Some(crate::context::NativeContext {
                clear_tool_results: None,
                compact_at_tokens: Some(6400),
            }),
            ..ModelSettings::default()
        };
        let req = ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let b = build_request_body(&req, &ResponsesConfig::new("gpt-test"), false);
        assert_eq!(b["instructions"], "be brief");
        assert_eq!(
            b["context_management"],
            json!([{"type": "compaction", "compact_threshold": 6400}])
        );
        let kinds: Vec<String> = b["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                format!(
                    "{}:{}",
                    i["type"].as_str().unwrap_or(""),
                    i["id"].as_str().or(i["call_id"].as_str()).unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "compaction:cmp_2",
                "reasoning:rs_0",
                "function_call:call_2",
                "function_call_output:call_2",
                "function_call:call_3",
                "function_call_output:call_3",
            ]
        );
        // Without compaction asked, no field; the items are sent the same way.
        let plain = ModelSettings::default();
        let req = ModelRequest {
            settings: &plain,
            ..req
        };
        let b = build_request_body(&req, &ResponsesConfig::new("gpt-test"), false);
        assert!(b.get("context_management").is_none());
        assert_eq!(b["input"][0]["type"], "compaction");
    }
}
