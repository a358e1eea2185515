//! Context management done by the server, as the real APIs do it: Anthropic Messages'
//! `context_management` (the `clear_tool_uses_20250919` edit, behind the
//! `context-management-2025-06-27` beta) and the Responses API's compaction
//! (`context_management: [{"type": "compaction", "compact_threshold": N}]`).
//!
//! - Anthropic: once the request passes the edit's trigger, the results of all tool uses but
//!   the last `keep` (and those of `exclude_tools`) are taken as cleared: the request counts
//!   as that much smaller (for the window and the usage), unless less than `clear_at_least`
//!   would go. The applied edit is reported in `context_management.applied_edits` (in the
//!   message, or in the stream's `message_delta`). The client keeps sending the whole
//!   conversation, as with the real API.
//! - Responses: a request over `compact_threshold` tokens is compacted: the response starts
//!   with a `compaction` item whose opaque `encrypted_content` carries where the task stands,
//!   and the request counts as its instructions, tools and that item only. A later request
//!   that sends the compaction item back goes on from it (what comes before it is not needed).

use axum::http::HeaderMap;
use serde_json::{Value, json};

/// The beta Anthropic's `context_management` needs.
pub(crate) const ANTHROPIC_BETA: &str = "context-management-2025-06-27";

/// What replaces a cleared tool result on the server's side (its size counts).
const CLEARED: &str = "[cleared to save context]";

/// The Anthropic API's default trigger (input tokens) and kept tool uses.
const DEFAULT_TRIGGER: u64 = 100_000;
const DEFAULT_KEEP: u64 = 3;

/// The Responses API's threshold when `compact_threshold` is not given.
const DEFAULT_COMPACT_THRESHOLD: u64 = 200_000;

/// An Anthropic clearing applied to a request.
pub(crate) struct Cleared {
    /// Bytes the request counts as having lost.
    pub bytes: usize,
    /// The report, as the API writes it (`context_management`).
    pub report: Value,
}

/// Applies an Anthropic request's `context_management`, if it has one: `Err` with the API's
/// message for a request that may not carry it (no beta header) or carries it malformed.
pub(crate) fn anthropic(
    headers: &HeaderMap,
    body: &[u8],
    management: Option<&Value>,
) -> Result<Option<Cleared>, String> {
    let Some(management) = management else {
        return Ok(None);
    };
    let beta = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|b| b.trim() == ANTHROPIC_BETA);
    if !beta {
        return Err(format!(
            "context_management: Extra inputs are not permitted (it needs the \
             `anthropic-beta: {ANTHROPIC_BETA}` header)"
        ));
    }
    let edits = management
        .get("edits")
        .and_then(Value::as_array)
        .ok_or("context_management.edits: Field required (a list of edits)")?;
    let request: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let mut cleared: Option<Cleared> = None;
    for (n, edit) in edits.iter().enumerate() {
        match edit.get("type").and_then(Value::as_str) {
            Some("clear_tool_uses_20250919") => {
                if let Some(c) = clear_tool_uses(&request, body.len(), edit, n)? {
                    cleared = Some(c);
                }
            }
            // Thinking blocks: this mock model does not think; nothing to clear.
            Some("clear_thinking_20251015") => {}
            other => {
                return Err(format!(
                    "context_management.edits.{n}: Input tag '{}' found using 'type' does not \
                     match any of the expected tags: 'clear_tool_uses_20250919', \
                     'clear_thinking_20251015'",
                    other.unwrap_or("")
                ));
            }
        }
    }
    Ok(cleared)
}

/// `{"type": kind, "value": N}` (the figure of a trigger, keep or clear_at_least), checked.
fn figure(
    edit: &Value,
    key: &str,
    kinds: &[&str],
    n: usize,
) -> Result<Option<(String, u64)>, String> {
    let Some(v) = edit.get(key) else {
        return Ok(None);
    };
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    let value = v.get("value").and_then(Value::as_u64);
    match value {
        Some(value) if kinds.contains(&kind) => Ok(Some((kind.to_string(), value))),
        _ => Err(format!(
            "context_management.edits.{n}.{key}: expected {{\"type\": one of {kinds:?}, \
             \"value\": a whole number}}"
        )),
    }
}

fn clear_tool_uses(
    request: &Value,
    body_len: usize,
    edit: &Value,
    n: usize,
) -> Result<Option<Cleared>, String> {
    let trigger = figure(edit, "trigger", &["input_tokens", "tool_uses"], n)?;
    let keep = figure(edit, "keep", &["tool_uses"], n)?.map_or(DEFAULT_KEEP, |(_, v)| v);
    let least = figure(edit, "clear_at_least", &["input_tokens"], n)?.map(|(_, v)| v);
    let exclude: Vec<&str> = edit
        .get("exclude_tools")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let inputs_too = edit.get("clear_tool_inputs").and_then(Value::as_bool) == Some(true);
    // Every tool use, in order: its name, its input's size, its result's size.
    let mut uses: Vec<(String, &str, usize, usize)> = Vec::new();
    for message in request
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for block in message
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match block.get("type").and_then(Value::as_str) {
                Some("tool_use") => uses.push((
                    block["id"].as_str().unwrap_or("").to_string(),
                    block["name"].as_str().unwrap_or(""),
                    block.get("input").map_or(0, |i| i.to_string().len()),
                    0,
                )),
                Some("tool_result") => {
                    let id = block["tool_use_id"].as_str().unwrap_or("");
                    let size = block.get("content").map_or(0, |c| c.to_string().len());
                    if let Some(u) = uses.iter_mut().rev().find(|u| u.0 == id) {
                        u.3 = size;
                    }
                }
                _ => {}
            }
        }
    }
    let tokens = super::engine::request_tokens(body_len);
    let triggered = match trigger {
        Some((kind, v)) if kind == "tool_uses" => uses.len() as u64 > v,
        Some((_, v)) => tokens > v,
        None => tokens > DEFAULT_TRIGGER,
    };
    if !triggered {
        return Ok(None);
    }
    let clearable = uses.len().saturating_sub(keep as usize);
    let mut bytes = 0usize;
    let mut count = 0u64;
    for (_, name, input, result) in &uses[..clearable] {
        if exclude.contains(name) {
            continue;
        }
        let mut gone = result.saturating_sub(CLEARED.len() + 2);
        if inputs_too {
            gone += input.saturating_sub(2);
        }
        if gone > 0 {
            bytes += gone;
            count += 1;
        }
    }
    let cleared_tokens = (bytes / 4) as u64;
    if count == 0 || least.is_some_and(|l| cleared_tokens < l) {
        return Ok(None);
    }
    Ok(Some(Cleared {
        bytes,
        report: json!({"applied_edits": [{
            "type": "clear_tool_uses_20250919",
            "cleared_tool_uses": count,
            "cleared_input_tokens": cleared_tokens,
        }]}),
    }))
}

/// The compaction threshold a Responses request asks for, if it asks for compaction: `Err`
/// with the API's message for a malformed `context_management`.
pub(crate) fn responses_threshold(request: &Value) -> Result<Option<u64>, String> {
    let Some(management) = request.get("context_management") else {
        return Ok(None);
    };
    let entries = management
        .as_array()
        .ok_or("Invalid type for 'context_management': expected an array of objects.")?;
    let mut threshold = None;
    for (i, entry) in entries.iter().enumerate() {
        if entry.get("type").and_then(Value::as_str) != Some("compaction") {
            return Err(format!(
                "Invalid value for 'context_management[{i}].type': only 'compaction' is \
                 supported."
            ));
        }
        threshold = Some(match entry.get("compact_threshold") {
            None | Some(Value::Null) => DEFAULT_COMPACT_THRESHOLD,
            Some(v) => v.as_u64().filter(|&t| t > 0).ok_or(format!(
                "Invalid value for 'context_management[{i}].compact_threshold': expected a \
                 positive integer."
            ))?,
        });
    }
    Ok(threshold)
}

/// The prefix of the mock's compaction items' encrypted content.
const COMPACTION: &str = "mock-compaction.";

/// A compaction item that carries where the task stands (`rounds` rounds of calls, `results`
/// results).
pub(crate) fn compaction_item(id: u64, rounds: u32, results: u32) -> Value {
    // Opaque to the client, as the real one is: the figures, then a checksum.
    let sum = rounds
        .wrapping_mul(31)
        .wrapping_add(results)
        .wrapping_add(0x5eed);
    json!({
        "type": "compaction",
        "id": format!("cmp_mock{id:016x}"),
        "encrypted_content": format!("{COMPACTION}{rounds:x}.{results:x}.{sum:x}"),
    })
}

/// Where the task stood when a compaction item of this server was made: `None` for content
/// it did not make.
pub(crate) fn read_compaction(encrypted: &str) -> Option<(u32, u32)> {
    let mut parts = encrypted.strip_prefix(COMPACTION)?.split('.');
    let mut next = || u32::from_str_radix(parts.next()?, 16).ok();
    let (rounds, results, sum) = (next()?, next()?, next()?);
    (sum == rounds
        .wrapping_mul(31)
        .wrapping_add(results)
        .wrapping_add(0x5eed))
    .then_some((rounds, results))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_items_carry_the_task() {
        let item = compaction_item(7, 41, 40);
        let content = item["encrypted_content"].as_str().unwrap();
        assert_eq!(read_compaction(content), Some((41, 40)));
        assert_eq!(read_compaction("mock-compaction.29.28.0"), None);
        assert_eq!(read_compaction("gAAAA"), None);
    }
}
