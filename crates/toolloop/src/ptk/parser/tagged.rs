//! `<PTK_CALL>`, `<tool_call>` (Hermes, with JSON, Qwen3-Coder XML or GLM pairs inside) and
//! `<function=NAME>` (Qwen3-Coder, Llama 3.1).

use super::ParsedCall;
use super::miss::miss;
use super::objects::{Shape, args_object, calls_from_value};
use super::scanner::Decision;
use super::text::{clean_name, find_ci, is_prefix_ci, read_json, starts_with_ci, ws_len};
use super::xml::{parse_function_content, parse_functions, parse_glm};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair;
use crate::ptk::json_repair::JsonError;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Tag {
    Ptk,
    ToolCall,
    Function,
}

impl Tag {
    fn open(self) -> &'static str {
        match self {
            Tag::Ptk => "<PTK_CALL>",
            Tag::ToolCall => "<tool_call>",
            Tag::Function => "<function=",
        }
    }

    fn close(self) -> &'static str {
        match self {
            Tag::Ptk => "</PTK_CALL>",
            Tag::ToolCall => "</tool_call>",
            Tag::Function => "</function>",
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Tag::Ptk => Dialect::Ptk,
            Tag::ToolCall => Dialect::Hermes,
            Tag::Function => Dialect::Qwen3Coder,
        }
    }
}

/// `<PTK_CALL>`, `<tool_call>` or `<function=NAME>`, up to the closing tag.
pub(super) fn tagged(s: &str, eof: bool, tools: &[ToolSpec], tag: Tag) -> Decision {
    let lit_len = match tag {
        Tag::Ptk => "<ptk_call".len(),
        Tag::ToolCall => "<tool_call".len(),
        Tag::Function => "<function=".len(),
    };
    let after = &s[lit_len..];
    let mut repaired = false;
    let mut function_name = None;
    let open_end = match tag {
        Tag::Ptk | Tag::ToolCall => {
            let w = ws_len(after);
            match after[w..].bytes().next() {
                None if !eof => return Decision::NeedMore,
                None => {
                    return Decision::Miss(
                        s.len(),
                        miss(
                            tag.dialect(),
                            format!("the reply ends inside an unfinished {}", tag.open()),
                        ),
                    );
                }
                Some(b'>') => lit_len + w + 1,
                Some(b'{' | b'[') => {
                    repaired = true;
                    lit_len + w
                }
                // `<tool_calls>`, `<tool_call_id>`…: not our tag.
                Some(_) => return Decision::Text(1),
            }
        }
        Tag::Function => match after.find('>') {
            Some(gt) if gt <= 200 && !after[..gt].contains('\n') => {
                let name = clean_name(&after[..gt]);
                if name.is_empty() {
                    return Decision::Text(1);
                }
                function_name = Some(name.to_string());
                lit_len + gt + 1
            }
            None if !eof && after.len() <= 200 && !after.contains('\n') => {
                return Decision::NeedMore;
            }
            _ => return Decision::Text(1),
        },
    };
    let body = &s[open_end..];
    let close = tag.close();
    if !eof && find_ci(body, close).is_none() {
        // Without a closing tag every rule below waits for more.
        return Decision::NeedMore;
    }

    // A JSON body is read first, so that a closing tag inside a JSON string does not end it.
    let lead = ws_len(body);
    let jb = &body[lead..];
    if jb.starts_with('{') || jb.starts_with('[') {
        match read_json(jb, eof) {
            Ok(p) => {
                let after = &jb[p.end..];
                let w = ws_len(after);
                let rest = &after[w..];
                let end = open_end + lead + p.end + w;
                if starts_with_ci(rest, close) {
                    return finish_json_call(
                        p.value,
                        p.repaired || repaired,
                        end + close.len(),
                        tag,
                        function_name,
                        tools,
                    );
                }
                if eof && find_ci(rest, close).is_none() && !is_prefix_ci(rest, close) {
                    // The closing tag is missing and text follows: the call ends with its JSON.
                    return finish_json_call(
                        p.value,
                        p.repaired || repaired,
                        end,
                        tag,
                        function_name,
                        tools,
                    );
                }
                if rest.is_empty() || is_prefix_ci(rest, close) {
                    if !eof {
                        return Decision::NeedMore;
                    }
                    {
                        // The closing tag is missing (or cut short) at the very end of the reply.
                        return finish_json_call(
                            p.value,
                            p.repaired || repaired,
                            s.len(),
                            tag,
                            function_name,
                            tools,
                        );
                    }
                }
            }
            Err(JsonError::Incomplete) if !eof => return Decision::NeedMore,
            Err(_) => {}
        }
    }

    // Otherwise the body runs to the first closing tag (or to the end of the reply).
    let (inner, end, closed) = match find_ci(body, close) {
        Some(c) => (&body[..c], open_end + c + close.len(), true),
        None if !eof => return Decision::NeedMore,
        None => (body, s.len(), false),
    };
    match parse_body(inner, tag, function_name.as_deref(), tools) {
        Ok(mut calls) => {
            if repaired {
                calls.iter_mut().for_each(|c| c.repaired = true);
            }
            Decision::Calls(end, calls)
        }
        Err((dialect, why)) => {
            let why = if !closed && inner.trim().is_empty() {
                format!("the reply ends inside an unfinished {}", tag.open())
            } else if closed {
                why
            } else {
                format!("{why} (and the closing {close} tag is missing)")
            };
            Decision::Miss(end, miss(dialect, why))
        }
    }
}

fn finish_json_call(
    value: Value,
    repaired: bool,
    end: usize,
    tag: Tag,
    function_name: Option<String>,
    tools: &[ToolSpec],
) -> Decision {
    let result = match (tag, function_name) {
        (Tag::Function, Some(name)) => args_object(value, repaired)
            .map(|(arguments, repaired)| {
                vec![ParsedCall {
                    name,
                    arguments,
                    repaired,
                    dialect: Dialect::Llama3,
                }]
            })
            .map_err(|e| miss(Dialect::Qwen3Coder, e)),
        _ => calls_from_value(value, repaired, tag.dialect(), Shape::Tagged, tools)
            .map_err(|e| miss(tag.dialect(), e)),
    };
    match result {
        Ok(calls) => Decision::Calls(end, calls),
        Err(why) => Decision::Miss(end, why),
    }
}

/// The inside of a tag: JSON (one or more values) or Qwen3-Coder XML.
fn parse_body(
    inner: &str,
    tag: Tag,
    function_name: Option<&str>,
    tools: &[ToolSpec],
) -> Result<Vec<ParsedCall>, (Dialect, String)> {
    if let (Tag::Function, Some(name)) = (tag, function_name) {
        return parse_function_content(name, inner, tools)
            .map(|c| vec![c])
            .map_err(|e| (Dialect::Qwen3Coder, e));
    }
    let t = inner.trim();
    if starts_with_ci(t, "<function=") {
        return parse_functions(t, tools).map_err(|e| (Dialect::Qwen3Coder, e));
    }
    if tag == Tag::ToolCall && !t.is_empty() && !t.starts_with(['{', '[', '`']) {
        return parse_glm(t, tools)
            .map(|c| vec![c])
            .map_err(|e| (Dialect::Glm, e));
    }
    let dialect = tag.dialect();
    let (body, fenced) = json_repair::strip_fence(t);
    let body = body.trim();
    if body.is_empty() {
        return Err((
            dialect,
            format!("{} holds nothing; it must hold a JSON object", tag.open()),
        ));
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let p = json_repair::parse_prefix_final(rest).map_err(|e| {
            (
                dialect,
                match e {
                    JsonError::Incomplete => format!(
                        "the JSON inside {} ends too early (an unclosed brace, bracket or string)",
                        tag.open()
                    ),
                    JsonError::Invalid { message, .. } => {
                        format!("the JSON inside {} is not valid: {message}", tag.open())
                    }
                },
            )
        })?;
        let found = calls_from_value(p.value, p.repaired || fenced, dialect, Shape::Tagged, tools)
            .map_err(|e| (dialect, e))?;
        calls.extend(found);
        rest = rest[p.end..].trim_start();
        rest = rest
            .strip_prefix(',')
            .or_else(|| rest.strip_prefix(';'))
            .unwrap_or(rest)
            .trim_start();
    }
    Ok(calls)
}
