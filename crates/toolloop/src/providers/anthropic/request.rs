//! Request bodies: the conversation and the tool catalog in the Messages format, with prompt-cache
//! breakpoints.

use super::config::{AnthropicConfig, MAX_CACHE_BREAKPOINTS, PROVIDER};
use crate::image::{Image, ImageSource};
use crate::message::Message;
use crate::model::{ModelRequest, ToolChoice};
use crate::providers::adapter::{json_number, merge_extras};
use serde_json::{Map, Value, json};

pub(super) struct Turn {
    role: &'static str,
    blocks: Vec<Value>,
}

pub(super) fn push_blocks(turns: &mut Vec<Turn>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.blocks.extend(blocks),
        _ => turns.push(Turn { role, blocks }),
    }
}

pub(super) fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// An image as an `image` block: a `base64` source for its bytes, a `url` source for a URL.
fn image_block(image: &Image) -> Value {
    let source = match image.source() {
        ImageSource::Data(data) => json!({
            "type": "base64",
            "media_type": image.media_type().unwrap_or("application/octet-stream"),
            "data": data,
        }),
        ImageSource::Url(url) => json!({"type": "url", "url": url}),
    };
    json!({"type": "image", "source": source})
}

/// A tool-use id as Anthropic accepts it (`^[a-zA-Z0-9_-]+$`): other characters become `_`.
/// Applied alike to `tool_use` and `tool_result`, so ids from other providers still pair up.
pub(super) fn wire_id(id: &str) -> String {
    if id.is_empty() {
        return "toolu_missing_id".to_string();
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(super) fn is_thinking(block: &Value) -> bool {
    matches!(
        block["type"].as_str(),
        Some("thinking" | "redacted_thinking")
    )
}

pub(super) fn assistant_blocks(a: &crate::message::AssistantMessage) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
        // A thinking block without its signature is refused by the API; it cannot be replayed.
        if part.data["type"] == "thinking"
            && part.data["signature"].as_str().is_none_or(str::is_empty)
        {
            continue;
        }
        blocks.push(part.data.clone());
    }
    if let Some(text) = a.text.as_deref().filter(|t| !t.trim().is_empty()) {
        blocks.push(text_block(text));
    }
    for call in &a.tool_calls {
        let input = match &call.arguments {
            Value::Object(_) => call.arguments.clone(),
            _ => json!({}),
        };
        let mut block = json!({
            "type": "tool_use",
            "id": wire_id(&call.id),
            "name": call.name,
            "input": input,
        });
        if let Some(Value::Object(extra)) = call.provider_data.as_ref().map(|d| &d[PROVIDER]) {
            for (k, v) in extra {
                block[k.as_str()] = v.clone();
            }
        }
        blocks.push(block);
    }
    blocks
}

/// Puts each user turn's `tool_result` blocks first, in the order of the previous assistant
/// turn's `tool_use` blocks; answers calls that have no result with an error result; turns
/// results that answer nothing into text.
pub(super) fn pair_tool_results(turns: &mut [Turn]) {
    for i in 0..turns.len() {
        if turns[i].role != "user" {
            continue;
        }
        let expected: Vec<String> = match i.checked_sub(1).map(|j| &turns[j]) {
            Some(prev) if prev.role == "assistant" => prev
                .blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .filter_map(|b| b["id"].as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        let blocks = std::mem::take(&mut turns[i].blocks);
        let (mut results, others): (Vec<Value>, Vec<Value>) =
            blocks.into_iter().partition(|b| b["type"] == "tool_result");
        if results.is_empty() && expected.is_empty() {
            turns[i].blocks = others;
            continue;
        }
        let mut ordered = Vec::with_capacity(expected.len() + others.len());
        for id in &expected {
            match results.iter().position(|r| r["tool_use_id"] == id.as_str()) {
                Some(pos) => ordered.push(results.remove(pos)),
                None => ordered.push(json!({
                    "type": "tool_result",
                    "tool_use_id": id,
                    "content": "No result was recorded for this call; it was not executed.",
                    "is_error": true,
                })),
            }
        }
        for orphan in results {
            let id = orphan["tool_use_id"].as_str().unwrap_or("");
            // A result's text: its content, or its first block's (a result with images).
            let content = orphan["content"]
                .as_str()
                .or_else(|| orphan["content"][0]["text"].as_str())
                .unwrap_or("");
            ordered.push(text_block(&format!(
                "Result of tool call {id} (no matching call in the previous turn): {content}"
            )));
        }
        ordered.extend(others);
        turns[i].blocks = ordered;
    }
}

pub(super) fn cache_marker() -> Value {
    json!({"type": "ephemeral"})
}

/// Marks the last block of a turn that can carry `cache_control` (thinking blocks cannot).
pub(super) fn mark_turn(turn: &mut Turn) -> bool {
    match turn.blocks.iter_mut().rev().find(|b| !is_thinking(b)) {
        Some(block) => {
            block["cache_control"] = cache_marker();
            true
        }
        None => false,
    }
}

/// The beta that `context_management` needs (sent in the `anthropic-beta` header).
pub(super) const CONTEXT_MANAGEMENT_BETA: &str = "context-management-2025-06-27";

/// The request's `context_management` field, from the clearing of old tool results it asks
/// of the provider ([`crate::model::ModelSettings::context`]): one `clear_tool_uses_20250919`
/// edit (its trigger, the tool uses it keeps, the least it clears, in input tokens).
pub(super) fn context_management(req: &ModelRequest<'_>) -> Option<Value> {
    let clear = req.settings.context.as_ref()?.clear_tool_results?;
    let mut edit = json!({
        "type": "clear_tool_uses_20250919",
        "keep": {"type": "tool_uses", "value": clear.keep_tool_uses},
    });
    if let Some(t) = clear.trigger_tokens {
        edit["trigger"] = json!({"type": "input_tokens", "value": t});
    }
    if let Some(least) = clear.clear_at_least_tokens {
        edit["clear_at_least"] = json!({"type": "input_tokens", "value": least});
    }
    Some(json!({"edits": [edit]}))
}

/// The `anthropic-beta` values a request needs: [`CONTEXT_MANAGEMENT_BETA`] when it asks the
/// provider to clear old tool results.
pub(super) fn betas(req: &ModelRequest<'_>) -> Option<&'static str> {
    req.settings
        .context
        .as_ref()
        .and_then(|c| c.clear_tool_results)
        .map(|_| CONTEXT_MANAGEMENT_BETA)
}

/// The headers of a request: the configuration's, with the betas the request needs
/// ([`betas`]) added to its `anthropic-beta` header.
pub(super) fn headers(
    config: &AnthropicConfig,
    req: &ModelRequest<'_>,
) -> Result<http::header::HeaderMap, crate::model::ModelError> {
    use http::header::{HeaderName, HeaderValue};
    let mut headers = config.headers()?;
    if let Some(beta) = betas(req) {
        let name = HeaderName::from_static("anthropic-beta");
        let value = match headers.get(&name).and_then(|v| v.to_str().ok()) {
            Some(old) if old.split(',').any(|b| b.trim() == beta) => old.to_string(),
            Some(old) if !old.trim().is_empty() => format!("{old},{beta}"),
            _ => beta.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    Ok(headers)
}

/// The Messages request body for `req`.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn build_request_body(req: &ModelRequest<'_>, config: &AnthropicConfig, stream: bool) -> Value {
    let (prompt, conversation) = req.messages.split_system_prompt();
    let mut system: Vec<Value> = prompt
        .filter(|text| !text.trim().is_empty())
        .map(text_block)
        .collect();
    let mut turns: Vec<Turn> = Vec::new();
    for message in conversation {
        match message {
            Message::System { content } => {
                if !content.trim().is_empty() {
                    let wrapped = format!("<system-reminder>{content}</system-reminder>");
                    push_blocks(&mut turns, "user", vec![text_block(&wrapped)]);
                }
            }
            Message::User { content, images } => {
                // Images before the text, as Anthropic advises.
                let mut blocks: Vec<Value> = images.iter().map(image_block).collect();
                if !content.trim().is_empty() {
                    blocks.push(text_block(content));
                }
                push_blocks(&mut turns, "user", blocks);
            }
            Message::Assistant(a) => {
                push_blocks(&mut turns, "assistant", assistant_blocks(a));
            }
            Message::Tool(r) => {
                // Images go in the result itself, after its text.
                let content = if r.images.is_empty() {
                    json!(r.content)
                } else {
                    let mut blocks = vec![text_block(&r.content)];
                    blocks.extend(r.images.iter().map(image_block));
                    Value::Array(blocks)
                };
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": wire_id(&r.call_id),
                    "content": content,
                });
                if r.is_error {
                    block["is_error"] = json!(true);
                }
                push_blocks(&mut turns, "user", vec![block]);
            }
        }
    }
    pair_tool_results(&mut turns);

    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            let mut schema = match &t.parameters {
                Value::Object(_) => t.parameters.clone(),
                _ => json!({"type": "object", "properties": {}}),
            };
            if schema.get("type").is_none() {
                schema["type"] = json!("object");
            }
            let mut tool = json!({"name": t.name, "input_schema": schema});
            if !t.description.is_empty() {
                tool["description"] = json!(t.description);
            }
            tool
        })
        .collect();

    if config.cache {
        let mut budget = MAX_CACHE_BREAKPOINTS;
        if let Some(last) = tools.last_mut() {
            last["cache_control"] = cache_marker();
            budget -= 1;
        }
        if let Some(last) = system.last_mut() {
            last["cache_control"] = cache_marker();
            budget -= 1;
        }
        // The last stable turn, then the previous round's last stable turn (the user turn before
        // the last assistant turn), so this round both reads the previous prefix exactly where it
        // was written and writes the new one.
        if let Some(last) = turns.len().checked_sub(1) {
            if budget > 0 && mark_turn(&mut turns[last]) {
                budget -= 1;
            }
            let previous = turns[..last]
                .iter()
                .rposition(|t| t.role == "user")
                .filter(|&j| turns[j + 1..last].iter().any(|t| t.role == "assistant"));
            if let Some(j) = previous
                && budget > 0
            {
                mark_turn(&mut turns[j]);
            }
        }
    }

    let reminders: Vec<Value> = req.wrapped_reminders().map(|r| text_block(&r)).collect();
    if !reminders.is_empty() {
        match turns.last_mut() {
            Some(last) if last.role == "user" => last.blocks.extend(reminders),
            _ => turns.push(Turn {
                role: "user",
                blocks: reminders,
            }),
        }
    }

    let messages: Vec<Value> = turns
        .into_iter()
        .map(|t| json!({"role": t.role, "content": t.blocks}))
        .collect();
    let mut body = Map::new();
    body.insert(
        "model".into(),
        json!(req.settings.model.as_deref().unwrap_or(&config.model)),
    );
    body.insert(
        "max_tokens".into(),
        json!(req.settings.max_output_tokens.unwrap_or(config.max_tokens)),
    );
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &req.settings.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::None => Some(json!({"type": "none"})),
            ToolChoice::Required => Some(json!({"type": "any"})),
            ToolChoice::Tool(name) => Some(json!({"type": "tool", "name": name})),
        };
        if let Some(choice) = choice {
            body.insert("tool_choice".into(), choice);
        }
    }
    if let Some(output) = &req.settings.output {
        // Structured outputs (generally available, no beta header): the schema with
        // `additionalProperties: false` on its objects when it has that form.
        let schema = output
            .strict_schema()
            .unwrap_or_else(|| output.schema.clone());
        body.insert(
            "output_config".into(),
            json!({"format": {"type": "json_schema", "schema": schema}}),
        );
    }
    if let Some(t) = req.settings.temperature {
        body.insert("temperature".into(), json_number(t));
    }
    if let Some(edits) = context_management(req) {
        body.insert("context_management".into(), edits);
    }
    if stream {
        body.insert("stream".into(), json!(true));
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
    use super::super::config::DEFAULT_MAX_TOKENS;
    use super::super::response::decode_message;
    use super::*;
    use crate::message::{AssistantMessage, ProviderPart, ToolCall, ToolResult};
    use crate::model::{FinishReason, ModelSettings, ToolSpec};

    fn config() -> AnthropicConfig {
        AnthropicConfig::new("claude-test")
    }

    fn call(id: &str, name: &str, args: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args,
            invalid_arguments: None,
            provider_data: None,
        }
    }

    fn result(id: &str, content: &str, is_error: bool) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            name: "t".into(),
            content: content.into(),
            is_error,
            images: Vec::new(),
        })
    }

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters: json!({"type": "object", "properties": {"x": {"type": "string"}}}),
        }
    }

    fn body(
        messages: &[Message],
        reminders: &[String],
        tools: &[ToolSpec],
        cfg: &AnthropicConfig,
    ) -> Value {
        let settings = ModelSettings::default();
        let req = ModelRequest {
            messages: messages.into(),
            reminders,
            tools,
            settings: &settings,
        };
        build_request_body(&req, cfg, false)
    }

    fn no_cache() -> AnthropicConfig {
        AnthropicConfig {
            cache: false,
            ..config()
        }
    }

    fn thinking_part() -> ProviderPart {
        ProviderPart {
            provider: PROVIDER.into(),
            data: json!({"type": "thinking", "thinking": "plan", "signature": "sig=="}),
        }
    }

    /// A transcript with one parallel round: two calls, results recorded out of order.
    fn round_one() -> Vec<Message> {
        vec![
            Message::system("be brief"),
            Message::user("go"),
            Message::Assistant(AssistantMessage {
                text: Some("calling".into()),
                tool_calls: vec![
                    call("toolu_a", "read", json!({"x": "1"})),
                    call("toolu_b", "read", json!({"x": "2"})),
                ],
                parts: vec![
                    thinking_part(),
                    ProviderPart {
                        provider: "gemini".into(),
                        data: json!({"thoughtSignature": "gem"}),
                    },
                ],
            }),
            result("toolu_b", "second", true),
            result("toolu_a", "first", false),
        ]
    }

    #[test]
    fn a_user_turn_with_images_is_image_blocks_then_its_text() {
        let gif = crate::image::Image::from_bytes(b"GIF89a\x01\x00").unwrap();
        let web = crate::image::Image::from_url("https://example.com/a.png").unwrap();
        let msgs = vec![Message::user_with_images("what is this?", [gif, web])];
        let b = body(&msgs, &[], &[], &no_cache());
        assert_eq!(
            b["messages"][0],
            json!({"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                             "data": "R0lGODlhAQA="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                {"type": "text", "text": "what is this?"},
            ]})
        );
        // Images alone make a turn too.
        let msgs = vec![Message::user_with_images(
            "",
            [crate::image::Image::from_bytes(b"GIF89a").unwrap()],
        )];
        let b = body(&msgs, &[], &[], &no_cache());
        assert_eq!(b["messages"][0]["content"][0]["type"], "image");
    }

    #[test]
    fn system_on_top_and_results_in_one_user_turn_in_call_order() {
        let b = body(&round_one(), &[], &[], &no_cache());
        assert_eq!(b["system"], json!([{"type": "text", "text": "be brief"}]));
        assert_eq!(b["max_tokens"], json!(DEFAULT_MAX_TOKENS));
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[2]["role"], "user");
        assert_eq!(
            msgs[2]["content"],
            json!([
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "first"},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "second", "is_error": true},
            ])
        );
    }

    #[test]
    fn thinking_goes_back_unchanged_first_and_other_providers_parts_are_dropped() {
        let b = body(&round_one(), &[], &[], &no_cache());
        let content = &b["messages"][1]["content"];
        assert_eq!(
            *content,
            json!([
                {"type": "thinking", "thinking": "plan", "signature": "sig=="},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"x": "1"}},
                {"type": "tool_use", "id": "toolu_b", "name": "read", "input": {"x": "2"}},
            ])
        );
    }

    #[test]
    fn same_role_turns_are_merged() {
        let msgs = vec![
            Message::user("a"),
            Message::user("b"),
            Message::assistant("x"),
            Message::assistant("y"),
            Message::user("c"),
        ];
        let b = body(&msgs, &[], &[], &no_cache());
        assert_eq!(
            b["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
                {"role": "user", "content": [{"type": "text", "text": "c"}]},
            ])
        );
    }

    #[test]
    fn results_come_before_user_text_and_missing_or_orphan_results_are_fixed() {
        let msgs = vec![
            Message::user("go"),
            Message::Assistant(AssistantMessage {
                tool_calls: vec![call("c.1", "f", json!({})), call("c2", "f", json!({}))],
                ..AssistantMessage::default()
            }),
            Message::user("also this"),
            result("c.1", "ok", false),
            result("zzz", "stray", false),
        ];
        let b = body(&msgs, &[], &[], &no_cache());
        let content = b["messages"][2]["content"].as_array().unwrap();
        assert_eq!(
            b["messages"][1]["content"][0]["id"], "c_1",
            "ids are sanitized"
        );
        assert_eq!(content[0]["tool_use_id"], "c_1");
        assert_eq!(content[1]["tool_use_id"], "c2");
        assert_eq!(content[1]["is_error"], true);
        assert_eq!(content[2]["type"], "text");
        assert!(content[2]["text"].as_str().unwrap().contains("stray"));
        assert_eq!(content[3], json!({"type": "text", "text": "also this"}));
    }

    #[test]
    fn reminders_close_the_last_user_turn() {
        let reminders = vec!["3 calls left".to_string()];
        let b = body(&round_one(), &reminders, &[], &no_cache());
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        let last = msgs[2]["content"].as_array().unwrap();
        assert_eq!(
            last.last().unwrap(),
            &json!({"type": "text", "text": "<system-reminder>3 calls left</system-reminder>"})
        );
        assert_eq!(last[0]["type"], "tool_result");
        // After an assistant turn, reminders open a user turn of their own.
        let b = body(
            &[Message::user("hi"), Message::assistant("yes")],
            &reminders,
            &[],
            &no_cache(),
        );
        assert_eq!(b["messages"][2]["role"], "user");
    }

    #[test]
    fn later_system_messages_stay_in_place() {
        let msgs = vec![
            Message::system("top"),
            Message::user("a"),
            Message::system("note"),
        ];
        let b = body(&msgs, &[], &[], &no_cache());
        assert_eq!(b["system"][0]["text"], "top");
        assert_eq!(
            b["messages"][0]["content"][1]["text"],
            "<system-reminder>note</system-reminder>"
        );
    }

    fn markers(v: &Value, path: &mut String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if m.contains_key("cache_control") {
                    out.push(path.clone());
                }
                for (k, x) in m {
                    let len = path.len();
                    path.push('/');
                    path.push_str(k);
                    markers(x, path, out);
                    path.truncate(len);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("/{i}"));
                    markers(x, path, out);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }

    fn breakpoints(b: &Value) -> Vec<String> {
        let mut out = Vec::new();
        markers(b, &mut String::new(), &mut out);
        out
    }

    #[test]
    fn breakpoints_on_tools_system_and_last_stable_turn() {
        let tools = [tool("a"), tool("b")];
        let reminders = vec!["r".to_string()];
        let b = body(&round_one(), &reminders, &tools, &config());
        assert_eq!(
            breakpoints(&b),
            vec![
                "/messages/0/content/0", // the previous round's last stable turn
                "/messages/2/content/1", // the last tool_result, not the reminder after it
                "/system/0",
                "/tools/1",
            ]
        );
        assert_eq!(b["tools"][1]["cache_control"], json!({"type": "ephemeral"}));
        assert!(
            b["messages"][2]["content"][2]
                .get("cache_control")
                .is_none()
        );
        assert!(breakpoints(&b).len() <= MAX_CACHE_BREAKPOINTS);
        assert!(breakpoints(&body(&round_one(), &reminders, &tools, &no_cache())).is_empty());
    }

    #[test]
    fn breakpoint_skips_thinking_blocks_and_a_first_turn_gets_one() {
        let msgs = vec![
            Message::user("q"),
            Message::Assistant(AssistantMessage {
                parts: vec![thinking_part()],
                tool_calls: vec![call("t1", "f", json!({}))],
                ..AssistantMessage::default()
            }),
        ];
        let b = body(&msgs, &[], &[], &config());
        assert_eq!(breakpoints(&b), vec!["/messages/1/content/1"]);
        let b = body(&[Message::user("q")], &["r".into()], &[], &config());
        assert_eq!(breakpoints(&b), vec!["/messages/0/content/0"]);
    }

    fn strip_markers(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("cache_control");
                m.values_mut().for_each(strip_markers);
            }
            Value::Array(a) => a.iter_mut().for_each(strip_markers),
            _ => {}
        }
    }

    #[test]
    fn prefix_is_stable_from_round_to_round() {
        let tools = [tool("read")];
        let round1 = round_one();
        let mut round2 = round1.clone();
        round2.push(Message::Assistant(AssistantMessage {
            tool_calls: vec![call("toolu_c", "read", json!({"x": "3"}))],
            ..AssistantMessage::default()
        }));
        round2.push(result("toolu_c", "third", false));
        let b1 = body(&round1, &["first reminder".into()], &tools, &config());
        let b2 = body(&round2, &["second reminder".into()], &tools, &config());

        // Tools and system: identical bytes, markers included.
        assert_eq!(b1["tools"].to_string(), b2["tools"].to_string());
        assert_eq!(b1["system"].to_string(), b2["system"].to_string());
        // Round 2 keeps a breakpoint exactly where round 1 wrote its last one.
        let last1 = b1["messages"].as_array().unwrap().len() - 1;
        let mut p = format!("/messages/{last1}/content/1");
        assert!(breakpoints(&b1).contains(&p));
        assert!(breakpoints(&b2).contains(&p));
        p.push_str("/cache_control");
        assert_eq!(b2.pointer(&p), Some(&json!({"type": "ephemeral"})));

        // Round 1's messages without their reminder are byte for byte the start of round 2's.
        let mut m1 = b1["messages"].clone();
        m1[last1]["content"].as_array_mut().unwrap().pop();
        let mut m2 = b2["messages"].clone();
        strip_markers(&mut m1);
        strip_markers(&mut m2);
        let n = m1.as_array().unwrap().len();
        let head: Vec<Value> = m2.as_array().unwrap()[..n].to_vec();
        assert_eq!(m1.to_string(), Value::Array(head).to_string());
        // The reminder is the very last block, and only the current one is present.
        let text = b2.to_string();
        assert!(!text.contains("first reminder"));
        let last = b2["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(
            last["text"],
            "<system-reminder>second reminder</system-reminder>"
        );
    }

    #[test]
    fn settings_and_extra_reach_the_body() {
        let settings = ModelSettings {
            model: Some("claude-other".into()),
            temperature: Some(0.7),
            max_output_tokens: Some(99),
            tool_choice: ToolChoice::Required,
            extra: Some(json!({"thinking": {"type": "enabled"}})),
            output: None,
            context: None,
        };
        let cfg = AnthropicConfig {
            extra: Some(json!({"thinking": {"budget_tokens": 1024}, "top_k": 5})),
            ..no_cache()
        };
        let tools = [tool("a")];
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &tools,
            settings: &settings,
        };
        let b = build_request_body(&req, &cfg, true);
        assert_eq!(b["model"], "claude-other");
        assert_eq!(b["max_tokens"], 99);
        assert_eq!(b["temperature"], json!(0.7));
        assert_eq!(b["tool_choice"], json!({"type": "any"}));
        assert_eq!(b["stream"], true);
        assert_eq!(b["top_k"], 5);
        assert_eq!(
            b["thinking"],
            json!({"type": "enabled", "budget_tokens": 1024})
        );
        assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
    }

    #[test]
    fn server_tool_blocks_are_parts_not_calls_and_go_back() {
        let r = decode_message(&json!({
            "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "text", "text": "found"},
            ],
            "stop_reason": "end_turn",
        }))
        .unwrap();
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.parts.len(), 2);
        assert_eq!(r.finish_reason, FinishReason::Stop);
        let msgs = vec![Message::user("q"), Message::Assistant(r.to_message())];
        let b = body(&msgs, &[], &[], &no_cache());
        let content = b["messages"][1]["content"].as_array().unwrap();
        assert_eq!(content[0]["type"], "server_tool_use");
        assert_eq!(content[1]["type"], "web_search_tool_result");
        assert_eq!(content[2]["text"], "found");
    }

    #[test]
    fn an_output_schema_is_the_output_config_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                            "required": ["a"]});
        let settings = ModelSettings {
            output: Some(crate::output::OutputSchema::new("Answer", schema)),
            ..ModelSettings::default()
        };
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let b = build_request_body(&req, &no_cache(), false);
        assert_eq!(
            b["output_config"],
            json!({"format": {"type": "json_schema", "schema": {
                "type": "object", "properties": {"a": {"type": "integer"}},
                "required": ["a"], "additionalProperties": false}}})
        );
        assert!(b.get("output_format").is_none(), "the GA field, no beta");
    }

    #[test]
    fn clearing_asked_of_the_provider_is_context_management_with_its_beta() {
        let settings = ModelSettings {
            context: Some(crate::context::NativeContext {
                clear_tool_results: Some(crate::context::NativeClear {
                    trigger_tokens: Some(3200),
                    keep_tool_uses: 8,
                    clear_at_least_tokens: Some(800),
                }),
                compact_at_tokens: None,
            }),
            ..ModelSettings::default()
        };
        let msgs = [Message::user("x")];
        let req = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let b = build_request_body(&req, &no_cache(), false);
        assert_eq!(
            b["context_management"],
            json!({"edits": [{
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 3200},
                "keep": {"type": "tool_uses", "value": 8},
                "clear_at_least": {"type": "input_tokens", "value": 800},
            }]})
        );
        let h = headers(&config(), &req).unwrap();
        assert_eq!(h["anthropic-beta"], CONTEXT_MANAGEMENT_BETA);
        // Nothing asked: no field, no beta.
        let plain = ModelSettings::default();
        let req = ModelRequest {
            settings: &plain,
            ..req
        };
        assert!(
            build_request_body(&req, &no_cache(), false)
                .get("context_management")
                .is_none()
        );
        assert!(
            headers(&config(), &req)
                .unwrap()
                .get("anthropic-beta")
                .is_none()
        );
        // A request with compaction only asks nothing of this API.
        let compaction = ModelSettings {
            context: Some(crate::context::NativeContext {
                clear_tool_results: None,
                compact_at_tokens: Some(6400),
            }),
            ..ModelSettings::default()
        };
        let req = ModelRequest {
            settings: &compaction,
            ..req
        };
        assert!(
            build_request_body(&req, &no_cache(), false)
                .get("context_management")
                .is_none()
        );
    }
}
