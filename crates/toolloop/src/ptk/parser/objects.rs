//! JSON call objects (`{"tool": …, "args": {…}}` and its spellings): which keys name the tool
//! and hold the arguments, arrays of calls, and sequences of objects.

use super::ParsedCall;
use super::text::{read_json, ws_len};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair;
use crate::ptk::json_repair::JsonError;
use serde_json::{Map, Value};

/// Keys that name the tool in a call object, in order of preference.
const NAME_KEYS: &[&str] = &["tool", "name", "tool_name", "function"];
/// Keys that hold the arguments, in order of preference.
const ARG_KEYS: &[&str] = &["args", "arguments", "parameters", "input", "params"];
/// Other keys a call object may carry.
const EXTRA_KEYS: &[&str] = &["reasoning", "id", "type", "thought", "thoughts", "call_id"];

/// Reads call objects separated by `;` (Llama 3), the first at the start of `s`. Followers
/// that are not calls end the sequence before their `;`.
pub(super) fn call_sequence(
    s: &str,
    eof: bool,
    tools: &[ToolSpec],
    shape: Shape,
) -> Result<(usize, Vec<ParsedCall>, Option<String>), Seq> {
    let p = match read_json(s, eof) {
        Ok(p) => p,
        Err(JsonError::Incomplete) if !eof => return Err(Seq::NeedMore),
        Err(e) => return Err(Seq::Bad(e)),
    };
    let mut end = p.end;
    let (mut calls, first_error) =
        match calls_from_value(p.value, p.repaired, Dialect::Llama3, shape, tools) {
            Ok(c) => (c, None),
            Err(e) => return Ok((end, Vec::new(), Some(e))),
        };
    loop {
        let rest = &s[end..];
        let w = ws_len(rest);
        let Some(b) = rest[w..].bytes().next() else {
            if eof {
                break;
            }
            return Err(Seq::NeedMore);
        };
        if b != b';' {
            break;
        }
        let after = &rest[w + 1..];
        let w2 = ws_len(after);
        let next = &after[w2..];
        if next.is_empty() {
            if eof {
                break;
            }
            return Err(Seq::NeedMore);
        }
        if !next.starts_with('{') {
            break;
        }
        match read_json(next, eof) {
            Ok(q) => match calls_from_value(q.value, q.repaired, Dialect::Llama3, shape, tools) {
                Ok(more) => {
                    calls.extend(more);
                    end += w + 1 + w2 + q.end;
                }
                Err(_) => break,
            },
            Err(JsonError::Incomplete) if !eof => return Err(Seq::NeedMore),
            Err(_) => break,
        }
    }
    Ok((end, calls, first_error))
}

pub(super) enum Seq {
    NeedMore,
    Bad(JsonError),
}

/// Whether broken JSON text starts like a call: a name key, an arguments key, and (when tools
/// are known) a known tool's name.
pub(super) fn looks_like_call(text: &str, tools: &[ToolSpec]) -> bool {
    let head: String = text.chars().take(400).collect();
    let has_key = |keys: &[&str]| {
        keys.iter().any(|k| {
            head.contains(&format!("\"{k}\""))
                || head.contains(&format!("'{k}'"))
                || head.contains(&format!("{k}:"))
        })
    };
    has_key(&["tool", "name"])
        && has_key(ARG_KEYS)
        && (tools.is_empty() || tools.iter().any(|t| head.contains(t.name.as_str())))
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Shape {
    /// Inside a call tag: any call-like object.
    Tagged,
    /// Bare or fenced JSON: exactly a name key and an arguments key, naming a known tool.
    Strict,
}

pub(super) fn calls_from_value(
    value: Value,
    repaired: bool,
    dialect: Dialect,
    shape: Shape,
    tools: &[ToolSpec],
) -> Result<Vec<ParsedCall>, String> {
    match value {
        Value::Array(items) => {
            if items.is_empty() {
                return Err("the list of calls is empty".into());
            }
            items
                .into_iter()
                .map(|item| match item {
                    Value::Object(map) => call_from_object(map, repaired, dialect, shape, tools),
                    other => Err(format!(
                        "each call must be a JSON object, found {}",
                        kind(&other)
                    )),
                })
                .collect()
        }
        Value::Object(map) => {
            call_from_object(map, repaired, dialect, shape, tools).map(|c| vec![c])
        }
        other => Err(format!(
            "expected a JSON object with the tool name and its arguments, found {}",
            kind(&other)
        )),
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn call_from_object(
    mut map: Map<String, Value>,
    repaired: bool,
    dialect: Dialect,
    shape: Shape,
    tools: &[ToolSpec],
) -> Result<ParsedCall, String> {
    // OpenAI's nesting: {"type": "function", "function": {"name": …, "arguments": …}}.
    if let Some(Value::Object(inner)) = map.get("function")
        && NAME_KEYS.iter().any(|k| inner.contains_key(*k))
    {
        let extra = map
            .keys()
            .any(|k| k != "function" && !EXTRA_KEYS.contains(&k.as_str()));
        if shape == Shape::Strict && extra {
            return Err("unexpected keys next to \"function\"".into());
        }
        let Some(Value::Object(inner)) = map.remove("function") else {
            return Err("\"function\" must be an object".into());
        };
        return call_from_object(inner, repaired, dialect, shape, tools);
    }
    let name_key = NAME_KEYS.iter().find(|k| map.contains_key(**k));
    let Some(name_key) = name_key else {
        return Err(format!(
            "the call has no tool name: expected a \"{}\" key holding the tool's name",
            name_key_for(dialect)
        ));
    };
    let name = match map.remove(*name_key) {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        _ => {
            return Err(format!(
                "\"{name_key}\" must hold the tool's name as a non-empty string"
            ));
        }
    };
    let args_key = ARG_KEYS.iter().find(|k| map.contains_key(**k)).copied();
    if shape == Shape::Strict {
        let known = tools.is_empty() || tools.iter().any(|t| t.name == name);
        let only_call_keys = map
            .keys()
            .all(|k| ARG_KEYS.contains(&k.as_str()) || EXTRA_KEYS.contains(&k.as_str()));
        if args_key.is_none() || !known || !only_call_keys {
            return Err("not a call".into());
        }
    }
    let (arguments, repaired) = match args_key {
        Some(key) => {
            let raw = map.remove(key).unwrap_or(Value::Null);
            args_object(raw, repaired).map_err(|e| format!("for the tool \"{name}\": {e}"))?
        }
        None => {
            // Arguments written next to the name instead of inside an arguments object.
            for k in EXTRA_KEYS {
                map.remove(*k);
            }
            let flattened = !map.is_empty();
            (Value::Object(map), repaired || flattened)
        }
    };
    Ok(ParsedCall {
        name,
        arguments,
        repaired,
        dialect,
    })
}

fn name_key_for(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Ptk => "tool",
        _ => "name",
    }
}

/// The arguments as an object: `null` and `""` mean `{}`, a string holding JSON is decoded.
pub(super) fn args_object(value: Value, repaired: bool) -> Result<(Value, bool), String> {
    match value {
        Value::Object(_) => Ok((value, repaired)),
        Value::Null => Ok((Value::Object(Map::new()), repaired)),
        Value::String(s) if s.trim().is_empty() => Ok((Value::Object(Map::new()), repaired)),
        Value::String(s) => match json_repair::parse(&s) {
            Ok((v @ Value::Object(_), r)) => Ok((v, repaired || r)),
            _ => Err(format!(
                "the arguments must be a JSON object, found the string {}",
                Value::String(s)
            )),
        },
        other => Err(format!(
            "the arguments must be a JSON object, found {}",
            kind(&other)
        )),
    }
}
