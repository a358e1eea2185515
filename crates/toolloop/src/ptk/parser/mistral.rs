//! Mistral's `[TOOL_CALLS]`: a JSON array or object, or `NAME[ARGS]{…}`.

use super::ParsedCall;
use super::miss::miss;
use super::objects::{Shape, args_object, calls_from_value};
use super::scanner::Decision;
use super::text::{find_ci, is_prefix_ci, line_end, read_json, starts_with_ci, ws_len};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair::JsonError;

/// `[TOOL_CALLS]` followed by a JSON array or object, or by `NAME[ARGS]{…}`.
pub(super) fn mistral(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let lit = "[TOOL_CALLS]".len();
    let w = ws_len(&s[lit..]);
    let start = lit + w;
    let rest = &s[start..];
    let Some(first) = rest.bytes().next() else {
        if !eof {
            return Decision::NeedMore;
        }
        return Decision::Miss(
            s.len(),
            miss(Dialect::Mistral, "nothing follows [TOOL_CALLS]"),
        );
    };
    let (json_start, name) = if first == b'[' || first == b'{' {
        (start, None)
    } else if first.is_ascii_alphanumeric() || first == b'_' {
        let n = rest
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
            .unwrap_or(rest.len());
        if n == rest.len() && !eof {
            return Decision::NeedMore;
        }
        let name = rest[..n].to_string();
        let after = &rest[n..];
        let w2 = ws_len(after);
        let tail = &after[w2..];
        let args_at = if starts_with_ci(tail, "[ARGS]") {
            start + n + w2 + "[ARGS]".len()
        } else if starts_with_ci(tail, "[CALL_ID]") {
            let id_part = &tail["[CALL_ID]".len()..];
            match find_ci(id_part, "[ARGS]") {
                Some(i) if i <= 64 => start + n + w2 + "[CALL_ID]".len() + i + "[ARGS]".len(),
                None if !eof && id_part.len() < 64 + "[ARGS]".len() => {
                    return Decision::NeedMore;
                }
                _ => {
                    return mistral_miss(s, start, eof, "a [CALL_ID] must be followed by [ARGS]");
                }
            }
        } else if tail.starts_with('{') {
            start + n + w2
        } else if !eof && (is_prefix_ci(tail, "[ARGS]") || is_prefix_ci(tail, "[CALL_ID]")) {
            return Decision::NeedMore;
        } else {
            return mistral_miss(
                s,
                start,
                eof,
                format!(
                    "after [TOOL_CALLS]{name} comes [ARGS] and then the arguments as a JSON object"
                ),
            );
        };
        let a = args_at + ws_len(&s[args_at..]);
        (a, Some(name))
    } else {
        return mistral_miss(
            s,
            start,
            eof,
            "[TOOL_CALLS] must be followed by the tool name and [ARGS], or by a JSON array of calls",
        );
    };
    let json = &s[json_start..];
    match read_json(json, eof) {
        Ok(p) => {
            let end = json_start + p.end;
            let result = match name {
                Some(name) => args_object(p.value, p.repaired).map(|(arguments, repaired)| {
                    vec![ParsedCall {
                        name,
                        arguments,
                        repaired,
                        dialect: Dialect::Mistral,
                    }]
                }),
                None => {
                    calls_from_value(p.value, p.repaired, Dialect::Mistral, Shape::Tagged, tools)
                }
            };
            match result {
                Ok(calls) => Decision::Calls(end, calls),
                Err(why) => Decision::Miss(end, miss(Dialect::Mistral, why)),
            }
        }
        Err(JsonError::Incomplete) if !eof => Decision::NeedMore,
        Err(JsonError::Incomplete) => Decision::Miss(
            s.len(),
            miss(
                Dialect::Mistral,
                "the JSON after [TOOL_CALLS] ends too early",
            ),
        ),
        Err(JsonError::Invalid { offset, message }) => mistral_miss(
            s,
            json_start + offset,
            eof,
            format!("the JSON after [TOOL_CALLS] is not valid: {message}"),
        ),
    }
}

fn mistral_miss(s: &str, from: usize, eof: bool, why: impl std::fmt::Display) -> Decision {
    match line_end(s, from, eof) {
        Some(end) => Decision::Miss(end, miss(Dialect::Mistral, why)),
        None => Decision::NeedMore,
    }
}
