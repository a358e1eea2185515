//! Arguments written as markup, converted through the tool's schema: Qwen3-Coder's
//! `<function=NAME><parameter=KEY>…` and GLM 4.5's `<arg_key>`/`<arg_value>` pairs.

use super::ParsedCall;
use super::miss::quote;
use super::objects::args_object;
use super::text::{clean_name, find_ci, starts_with_ci};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair;
use serde_json::{Map, Value};

/// One or more `<function=NAME>…</function>` blocks.
pub(super) fn parse_functions(text: &str, tools: &[ToolSpec]) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        if !starts_with_ci(rest, "<function=") {
            return Err(format!(
                "expected <function=NAME> inside <tool_call>, found `{}`",
                quote(rest)
            ));
        }
        let after = &rest["<function=".len()..];
        let Some(gt) = after.find('>') else {
            return Err("the <function=NAME> tag is not closed with `>`".into());
        };
        let name = clean_name(&after[..gt]);
        if name.is_empty() {
            return Err("<function=> has no tool name".into());
        }
        let body = &after[gt + 1..];
        let (content, next) = match find_ci(body, "</function>") {
            Some(c) => (&body[..c], &body[c + "</function>".len()..]),
            None => (body, ""),
        };
        calls.push(parse_function_content(name, content, tools)?);
        rest = next.trim();
    }
    if calls.is_empty() {
        return Err("<tool_call> holds no <function=NAME> block".into());
    }
    Ok(calls)
}

/// The inside of `<function=NAME>`: `<parameter=P>` blocks, or a JSON object.
pub(super) fn parse_function_content(
    name: &str,
    content: &str,
    tools: &[ToolSpec],
) -> Result<ParsedCall, String> {
    let t = content.trim();
    if t.starts_with('{') {
        let (value, repaired) = json_repair::parse(t)
            .map_err(|e| format!("the JSON arguments of <function={name}> are not valid: {e}"))?;
        let (arguments, repaired) = args_object(value, repaired)?;
        return Ok(ParsedCall {
            name: name.to_string(),
            arguments,
            repaired,
            dialect: Dialect::Llama3,
        });
    }
    let schema = tools
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut args = Map::new();
    let mut repaired = false;
    let mut rest = content;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if !starts_with_ci(rest, "<parameter=") {
            return Err(format!(
                "expected <parameter=NAME> inside <function={}>, found `{}`",
                quote(name),
                quote(rest)
            ));
        }
        let after = &rest["<parameter=".len()..];
        let Some(gt) = after.find('>') else {
            return Err("a <parameter=NAME> tag is not closed with `>`".into());
        };
        let pname = clean_name(&after[..gt]);
        if pname.is_empty() {
            return Err(format!("a <parameter=> of <function={name}> has no name"));
        }
        let value_part = &after[gt + 1..];
        let close = find_ci(value_part, "</parameter>");
        let next_param = find_ci(value_part, "<parameter=");
        let (raw, consumed) = match (close, next_param) {
            (Some(c), n) if n.is_none_or(|n| c < n) => (&value_part[..c], c + "</parameter>".len()),
            (_, Some(n)) => {
                repaired = true;
                (&value_part[..n], n)
            }
            (_, None) => {
                repaired = true;
                (value_part, value_part.len())
            }
        };
        let param_schema = schema.and_then(|s| s.get(pname));
        args.insert(pname.to_string(), convert_param(raw, param_schema));
        rest = &value_part[consumed..];
    }
    Ok(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(args),
        repaired,
        dialect: Dialect::Qwen3Coder,
    })
}

/// A Qwen3-Coder parameter value: one newline after the opening tag and one before the closing
/// tag belong to the format, not the value.
fn strip_param_newlines(raw: &str) -> &str {
    let v = raw
        .strip_prefix("\r\n")
        .or_else(|| raw.strip_prefix('\n'))
        .unwrap_or(raw);
    v.strip_suffix('\n').unwrap_or(v)
}

/// Converts a Qwen3-Coder parameter's text through its JSON Schema.
fn convert_param(raw: &str, schema: Option<&Value>) -> Value {
    convert_text(strip_param_newlines(raw), schema)
}

/// Converts an argument written as text (Qwen3-Coder, GLM) through its JSON Schema: kept as
/// text for a string, read as JSON otherwise (and, with no schema, when it is JSON other than a
/// string).
fn convert_text(text: &str, schema: Option<&Value>) -> Value {
    let t = text.trim();
    let mut nullable = false;
    let ty: Option<&str> = match schema.and_then(|s| s.get("type")) {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Array(types)) => {
            nullable = types.iter().any(|t| t == "null");
            types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
        }
        _ => None,
    };
    if nullable && t == "null" {
        return Value::Null;
    }
    let any = || match serde_json::from_str::<Value>(t) {
        Ok(v) if !v.is_string() => v,
        _ => Value::String(text.to_string()),
    };
    match ty {
        Some("string") => Value::String(text.to_string()),
        Some("integer") => {
            if let Ok(i) = t.parse::<i64>() {
                Value::from(i)
            } else if let Ok(u) = t.parse::<u64>() {
                Value::from(u)
            } else {
                any()
            }
        }
        Some("number") => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Number(_)) => v,
            _ => any(),
        },
        Some("boolean") => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => any(),
        },
        Some("null") if t == "null" || t.is_empty() => Value::Null,
        Some("object" | "array") => match json_repair::parse(t) {
            Ok((v, _)) => v,
            Err(_) => Value::String(text.to_string()),
        },
        _ => any(),
    }
}

/// The inside of a GLM `<tool_call>`: the tool's name on the first line, then
/// `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` pairs, values converted through the
/// tool's schema.
pub(super) fn parse_glm(t: &str, tools: &[ToolSpec]) -> Result<ParsedCall, String> {
    const KEY: &str = "<arg_key>";
    const KEY_END: &str = "</arg_key>";
    const VALUE: &str = "<arg_value>";
    const VALUE_END: &str = "</arg_value>";
    let name_end = match (t.find('\n'), find_ci(t, KEY)) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(t.len()),
    };
    let name = clean_name(&t[..name_end]);
    let plausible = !name.is_empty()
        && !name.contains(|c: char| {
            c.is_whitespace() || matches!(c, '<' | '>' | '{' | '}' | '[' | ']' | '(' | ')' | '"')
        });
    if !plausible {
        return Err(format!(
            "<tool_call> holds neither a JSON call nor a tool name with its arguments; found `{}`",
            quote(&t[..name_end])
        ));
    }
    let schema = tools
        .iter()
        .find(|tool| tool.name == name)
        .and_then(|tool| tool.parameters.get("properties"));
    let mut args = Map::new();
    let mut rest = &t[name_end..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if !starts_with_ci(rest, KEY) {
            return Err(format!(
                "expected {KEY} inside <tool_call>{}, found `{}`",
                quote(name),
                quote(rest)
            ));
        }
        let after = &rest[KEY.len()..];
        let Some(k_end) = find_ci(after, KEY_END) else {
            return Err(format!("an {KEY} is not closed with {KEY_END}"));
        };
        let key = after[..k_end].trim();
        if key.is_empty() {
            return Err(format!("an {KEY} of {} is empty", quote(name)));
        }
        let value_part = after[k_end + KEY_END.len()..].trim_start();
        if !starts_with_ci(value_part, VALUE) {
            return Err(format!(
                "{KEY}{}{KEY_END} must be followed by {VALUE}…{VALUE_END}",
                quote(key)
            ));
        }
        let value_part = &value_part[VALUE.len()..];
        let Some(v_end) = find_ci(value_part, VALUE_END) else {
            return Err(format!(
                "the {VALUE} of {} is not closed with {VALUE_END}",
                quote(key)
            ));
        };
        let param_schema = schema.and_then(|s| s.get(key));
        args.insert(
            key.to_string(),
            convert_text(&value_part[..v_end], param_schema),
        );
        rest = &value_part[v_end + VALUE_END.len()..];
    }
    Ok(ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(args),
        repaired: false,
        dialect: Dialect::Glm,
    })
}
