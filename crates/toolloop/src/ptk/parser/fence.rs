//! A fenced ```` ```json ```` block holding a call object or an array of them.

use super::miss::miss;
use super::objects::{Shape, calls_from_value, looks_like_call};
use super::scanner::Decision;
use super::text::{is_prefix_ci, read_json, ws_len};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair;
use crate::ptk::json_repair::JsonError;

/// A fenced code block that may hold a call.
pub(super) fn fence(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let after = &s[3..];
    // The info string must end within 40 bytes (judged on those bytes alone, so the verdict
    // does not depend on how much has arrived).
    let nl = match after.find('\n') {
        Some(i) if i <= 40 => i,
        None if !eof && after.len() <= 40 => return Decision::NeedMore,
        _ => return Decision::Text(3),
    };
    let info = after[..nl].trim().to_ascii_lowercase();
    if !matches!(
        info.as_str(),
        "" | "json" | "json5" | "jsonc" | "tool_call" | "tool_code" | "tool"
    ) {
        return Decision::Text(3);
    }
    let body_start = 3 + nl + 1;
    let body = &s[body_start..];
    let lead = ws_len(body);
    match body[lead..].bytes().next() {
        None if !eof => return Decision::NeedMore,
        None => return Decision::Text(3),
        Some(b'{' | b'[') => {}
        Some(_) => return Decision::Text(3),
    }
    let json = &body[lead..];
    match read_json(json, eof) {
        Ok(p) => {
            let after = &json[p.end..];
            let w = ws_len(after);
            let rest = &after[w..];
            let close_at = body_start + lead + p.end + w;
            if rest.starts_with("```") || (eof && rest.is_empty()) {
                let end = if rest.is_empty() {
                    s.len()
                } else {
                    close_at + 3
                };
                return match calls_from_value(
                    p.value,
                    p.repaired,
                    Dialect::FencedJson,
                    Shape::Strict,
                    tools,
                ) {
                    Ok(calls) => Decision::Calls(end, calls),
                    Err(_) => Decision::Text(end),
                };
            }
            if !eof && (rest.is_empty() || is_prefix_ci(rest, "```")) {
                return Decision::NeedMore;
            }
        }
        Err(JsonError::Incomplete) if !eof => return Decision::NeedMore,
        Err(_) => {}
    }
    // Not a single value up to the fence: read everything up to the closing fence.
    let (inner, end) = match body.find("```") {
        Some(c) => (&body[..c], body_start + c + 3),
        None if !eof => return Decision::NeedMore,
        None => (body, s.len()),
    };
    match json_repair::parse(inner) {
        Ok((value, repaired)) => {
            match calls_from_value(value, repaired, Dialect::FencedJson, Shape::Strict, tools) {
                Ok(calls) => Decision::Calls(end, calls),
                Err(_) => Decision::Text(end),
            }
        }
        Err(e) if looks_like_call(inner, tools) => Decision::Miss(
            end,
            miss(
                Dialect::FencedJson,
                format!("the JSON in the code block is not valid: {e}"),
            ),
        ),
        Err(_) => Decision::Text(end),
    }
}
