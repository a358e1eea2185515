//! Llama 3: `<|python_tag|>` followed by JSON calls, and a bare JSON call at the start of a line.

use super::miss::miss;
use super::objects::{Seq, Shape, call_sequence, looks_like_call};
use super::python_list::pythonic_list;
use super::scanner::Decision;
use super::text::{floor_char_boundary, line_end, ws_len};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair::JsonError;
use crate::ptk::pythonic;

/// `<|python_tag|>` followed by JSON calls.
pub(super) fn python_tag(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    let lit = "<|python_tag|>".len();
    let start = lit + ws_len(&s[lit..]);
    let rest = &s[start..];
    if let Some(list) = rest.strip_prefix('[') {
        match pythonic::starts_like_call(list.trim_start()) {
            Err(()) if !eof => return Decision::NeedMore,
            Ok(Some(_)) => return pythonic_list(s, start, eof, tools, true),
            _ => {}
        }
    }
    match rest.bytes().next() {
        None if !eof => return Decision::NeedMore,
        None => return Decision::Strip(s.len()),
        Some(b'{' | b'[') => {}
        Some(_) => {
            return match line_end(s, start, eof) {
                Some(end) => Decision::Miss(
                    end,
                    miss(
                        Dialect::Llama3,
                        "<|python_tag|> must be followed by a JSON object with \"name\" and \"parameters\"",
                    ),
                ),
                None => Decision::NeedMore,
            };
        }
    }
    match call_sequence(rest, eof, tools, Shape::Tagged) {
        Ok((end, calls, None)) => Decision::Calls(start + end, calls),
        Ok((end, _, Some(why))) => Decision::Miss(start + end, miss(Dialect::Llama3, why)),
        Err(Seq::NeedMore) => Decision::NeedMore,
        Err(Seq::Bad(e)) => {
            let from = match &e {
                JsonError::Invalid { offset, .. } => start + offset,
                JsonError::Incomplete => s.len(),
            };
            match line_end(s, from, eof) {
                Some(end) => Decision::Miss(
                    end,
                    miss(
                        Dialect::Llama3,
                        format!("the JSON after <|python_tag|> is not valid: {e}"),
                    ),
                ),
                None => Decision::NeedMore,
            }
        }
    }
}

/// A bare JSON object at the start of a line.
pub(super) fn bare(s: &str, eof: bool, tools: &[ToolSpec]) -> Decision {
    match call_sequence(s, eof, tools, Shape::Strict) {
        Ok((end, calls, None)) => Decision::Calls(end, calls),
        // JSON that is not a call: text, shown as it is.
        Ok((end, _, Some(_))) => Decision::Text(end),
        Err(Seq::NeedMore) => Decision::NeedMore,
        Err(Seq::Bad(e)) => {
            // Broken JSON: an attempted call only if it starts like one.
            // Judged on the first line (at most HEAD bytes), so the verdict does not depend on
            // how much of the reply has arrived.
            const HEAD: usize = 400;
            let head_end = match s.find('\n') {
                Some(i) if i < HEAD => i,
                _ if s.len() >= HEAD => floor_char_boundary(s, HEAD),
                _ if eof => s.len(),
                _ => return Decision::NeedMore,
            };
            if !looks_like_call(&s[..head_end], tools) {
                return Decision::Text(1);
            }
            let end = match s.find("\n\n") {
                Some(i) => i,
                None if eof => s.len(),
                None => return Decision::NeedMore,
            };
            Decision::Miss(
                end,
                miss(
                    Dialect::Llama3,
                    format!("the JSON of the call is not valid: {e}"),
                ),
            )
        }
    }
}
