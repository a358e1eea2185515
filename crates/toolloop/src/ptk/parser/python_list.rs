//! A Python list of calls (`[get_weather(city="Paris")]`), at the start of a line or after
//! Llama 4's `<|python_start|>` (read, never evaluated).

use super::ParsedCall;
use super::miss::miss;
use super::scanner::Decision;
use super::text::{is_prefix_ci, line_end, starts_with_ci, ws_len};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair::JsonError;
use crate::ptk::pythonic;
use serde_json::Value;

/// Llama 4's `<|python_start|>` followed by a list of calls (and `<|python_end|>`).
pub(super) fn python_start(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let lit = "<|python_start|>".len();
    let start = lit + ws_len(&s[lit..]);
    match s[start..].bytes().next() {
        None if !eof => Decision::NeedMore,
        None => Decision::Strip(s.len()),
        Some(b'[') => pythonic_list(s, start, eof, tools, true),
        Some(_) => match line_end(s, start, eof) {
            Some(end) => Decision::Miss(
                end,
                miss(
                    Dialect::Pythonic,
                    "<|python_start|> must be followed by a list of calls",
                ),
            ),
            None => Decision::NeedMore,
        },
    }
}

/// A Python list of calls starting at `from` (a `[`). Untagged (at the start of a line), it
/// counts as calls only when it starts like one (`[NAME(`) and, when tools are known, names
/// only known tools; broken, it is an attempt only when it names a known tool.
pub(super) fn pythonic_list(
    s: &str,
    from: usize,
    eof: bool,
    tools: &[ToolSpec],
    tagged: bool,
) -> Decision {
    let list = &s[from..];
    let inner = &list[1..];
    let lead = ws_len(inner);
    let first_name = match pythonic::starts_like_call(&inner[lead..]) {
        Err(()) if !eof => return Decision::NeedMore,
        Ok(Some(n)) => &inner[lead..lead + n],
        _ if tagged => "",
        _ => return Decision::Text(1),
    };
    let known = |name: &str| tools.is_empty() || tools.iter().any(|t| t.name == name);
    let attempt = tagged || (!tools.is_empty() && tools.iter().any(|t| t.name == first_name));
    match pythonic::parse_call_list(list) {
        Ok((end, calls)) => {
            if !tagged && !calls.iter().all(|c| known(&c.name)) {
                return Decision::Text(from + end);
            }
            let mut end = from + end;
            if tagged {
                let w = ws_len(&s[end..]);
                let tail = &s[end + w..];
                if starts_with_ci(tail, "<|python_end|>") {
                    end += w + "<|python_end|>".len();
                } else if !eof && (tail.is_empty() || is_prefix_ci(tail, "<|python_end|>")) {
                    return Decision::NeedMore;
                }
            }
            Decision::Calls(
                end,
                calls
                    .into_iter()
                    .map(|c| ParsedCall {
                        name: c.name,
                        arguments: Value::Object(c.arguments),
                        repaired: false,
                        dialect: Dialect::Pythonic,
                    })
                    .collect(),
            )
        }
        Err(JsonError::Incomplete) if !eof => Decision::NeedMore,
        Err(_) if !attempt => Decision::Text(1),
        Err(JsonError::Incomplete) => Decision::Miss(
            s.len(),
            miss(Dialect::Pythonic, "the list of calls ends too early"),
        ),
        Err(JsonError::Invalid { offset, message }) => match line_end(s, from + offset, eof) {
            Some(end) => Decision::Miss(
                end,
                miss(
                    Dialect::Pythonic,
                    format!("the list of calls is not valid Python: {message}"),
                ),
            ),
            None => Decision::NeedMore,
        },
    }
}
