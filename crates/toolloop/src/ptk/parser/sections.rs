//! Sections of special tokens: DeepSeek's `<｜tool▁calls▁begin｜>` (V3, V3.1) and Kimi K2's
//! `<|tool_calls_section_begin|>`.

use super::ParsedCall;
use super::miss::miss;
use super::objects::args_object;
use super::scanner::Decision;
use super::text::{find_ci, is_prefix_ci, read_json, starts_with_ci, ws_len};
use crate::ptk::dialect::Dialect;
use crate::ptk::json_repair::JsonError;
use serde_json::Value;

/// A section of calls between special tokens (DeepSeek's, Kimi K2's).
pub(super) struct Section {
    /// The token opening the section.
    begin: &'static str,
    /// The token opening each call.
    call_begin: &'static str,
    /// The token closing each call.
    call_end: &'static str,
    /// The token closing the section.
    end: &'static str,
    /// The dialect reported in explanations.
    dialect: Dialect,
    /// Reads one call's inside (between `call_begin` and `call_end`, which may be missing at
    /// the end of the reply).
    call: fn(&str, bool) -> CallRead,
}

/// One call read from a section.
enum CallRead {
    NeedMore,
    /// The call and the length of its inside (up to where `call_end` is expected).
    Call(usize, ParsedCall),
    /// What was wrong.
    Bad(String),
}

pub(super) const DEEPSEEK: Section = Section {
    begin: "<｜tool▁calls▁begin｜>",
    call_begin: "<｜tool▁call▁begin｜>",
    call_end: "<｜tool▁call▁end｜>",
    end: "<｜tool▁calls▁end｜>",
    dialect: Dialect::DeepSeek,
    call: deepseek_call,
};

pub(super) const KIMI: Section = Section {
    begin: "<|tool_calls_section_begin|>",
    call_begin: "<|tool_call_begin|>",
    call_end: "<|tool_call_end|>",
    end: "<|tool_calls_section_end|>",
    dialect: Dialect::KimiK2,
    call: kimi_call,
};

/// A section of calls, or a lone call (`call_begin` without the section's `begin`).
pub(super) fn section(s: &str, eof: bool, sec: &Section) -> Decision {
    let mut i = 0;
    let opened = starts_with_ci(s, sec.begin);
    if opened {
        i = sec.begin.len();
    }
    let mut calls = Vec::new();
    loop {
        let w = ws_len(&s[i..]);
        let rest = &s[i + w..];
        if opened && starts_with_ci(rest, sec.end) {
            if calls.is_empty() {
                return Decision::Miss(
                    i + w + sec.end.len(),
                    miss(sec.dialect, format!("{} holds no call", sec.begin)),
                );
            }
            return Decision::Calls(i + w + sec.end.len(), calls);
        }
        if starts_with_ci(rest, sec.call_begin) {
            let at = i + w;
            let inner_start = at + sec.call_begin.len();
            match (sec.call)(&s[inner_start..], eof) {
                CallRead::NeedMore if !eof => return Decision::NeedMore,
                CallRead::NeedMore => {
                    return Decision::Miss(
                        s.len(),
                        miss(
                            sec.dialect,
                            format!("the reply ends inside an unfinished {}", sec.call_begin),
                        ),
                    );
                }
                CallRead::Bad(why) => {
                    // The attempt runs to the end of its call (or of the reply).
                    let end = match find_ci(&s[inner_start..], sec.call_end) {
                        Some(k) => inner_start + k + sec.call_end.len(),
                        None if !eof => return Decision::NeedMore,
                        None => s.len(),
                    };
                    return Decision::Miss(end, miss(sec.dialect, why));
                }
                CallRead::Call(len, call) => {
                    let after = inner_start + len;
                    let w2 = ws_len(&s[after..]);
                    let tail = &s[after + w2..];
                    if starts_with_ci(tail, sec.call_end) {
                        i = after + w2 + sec.call_end.len();
                    } else if !eof && (tail.is_empty() || is_prefix_ci(tail, sec.call_end)) {
                        return Decision::NeedMore;
                    } else {
                        // The closing token is missing: the call ends with its arguments.
                        i = after;
                    }
                    calls.push(call);
                    continue;
                }
            }
        }
        if rest.is_empty() && !eof {
            return Decision::NeedMore;
        }
        if !eof && (is_prefix_ci(rest, sec.end) || is_prefix_ci(rest, sec.call_begin)) {
            return Decision::NeedMore;
        }
        // Anything else ends the section (its closing token is missing).
        if calls.is_empty() {
            // (What follows is not quoted: how much of it has arrived must not change the
            // explanation.)
            let why = if rest.is_empty() {
                format!("the reply ends inside an unfinished {}", sec.begin)
            } else {
                format!("expected {} after {}", sec.call_begin, sec.begin)
            };
            return Decision::Miss(i.max(1), miss(sec.dialect, why));
        }
        return Decision::Calls(i, calls);
    }
}

/// Reads a JSON arguments object at the start of `s` (after whitespace): the arguments, whether
/// they were repaired, and the end.
fn section_args(s: &str, eof: bool, what: &str) -> Result<(Value, bool, usize), CallRead> {
    let w = ws_len(s);
    match read_json(&s[w..], eof) {
        Ok(p) => {
            let (args, repaired) = args_object(p.value, p.repaired)
                .map_err(|e| CallRead::Bad(format!("{what}: {e}")))?;
            Ok((args, repaired, w + p.end))
        }
        Err(JsonError::Incomplete) => Err(CallRead::NeedMore),
        Err(JsonError::Invalid { message, .. }) => Err(CallRead::Bad(format!(
            "the JSON arguments {what} are not valid: {message}"
        ))),
    }
}

/// A DeepSeek call's inside: V3's `function<｜tool▁sep｜>NAME\n```json\n{…}\n```` or V3.1's
/// `NAME<｜tool▁sep｜>{…}`.
fn deepseek_call(s: &str, eof: bool) -> CallRead {
    const SEP: &str = "<｜tool▁sep｜>";
    let sep = match find_ci(s, SEP) {
        Some(k) if k <= 200 => k,
        None if !eof && s.len() < 200 + SEP.len() => return CallRead::NeedMore,
        _ => {
            return CallRead::Bad(format!(
                "a call must name its tool with {SEP} within its first 200 bytes"
            ));
        }
    };
    let head = s[..sep].trim();
    let after_at = sep + SEP.len();
    let after = &s[after_at..];
    let w = ws_len(after);
    let body = &after[w..];
    if body.is_empty() {
        return if eof {
            CallRead::Bad(format!("nothing follows {SEP}"))
        } else {
            CallRead::NeedMore
        };
    }
    if body.starts_with('{') {
        // V3.1: the name before the separator, the arguments after it.
        if head.is_empty() {
            return CallRead::Bad(format!("the tool name before {SEP} is missing"));
        }
        return match section_args(after, eof, &format!("of {head}")) {
            Ok((arguments, repaired, end)) => CallRead::Call(
                after_at + end,
                ParsedCall {
                    name: head.to_string(),
                    arguments,
                    repaired,
                    dialect: Dialect::DeepSeekV31,
                },
            ),
            Err(e) => e,
        };
    }
    // V3: the type before the separator, the name on the rest of the line, fenced JSON below.
    let name_len = match body.find(['\n', '{', '`']) {
        Some(n) if n <= 200 => n,
        None if !eof && body.len() <= 200 => return CallRead::NeedMore,
        _ => return CallRead::Bad(format!("the tool name after {SEP} must end its line")),
    };
    let name = body[..name_len].trim();
    if name.is_empty() || name.contains('<') {
        return CallRead::Bad(format!("the tool name after {SEP} is missing"));
    }
    let mut at = after_at + w + name_len;
    at += ws_len(&s[at..]);
    let mut fenced = false;
    let rest = &s[at..];
    if rest.starts_with("```") {
        match rest.find('\n') {
            Some(nl) if nl <= 12 => {
                at += nl + 1;
                fenced = true;
            }
            None if !eof && rest.len() <= 12 => return CallRead::NeedMore,
            _ => return CallRead::Bad("the code fence of the arguments is not ```json".into()),
        }
    } else if !eof && is_prefix_ci(rest, "```") {
        return CallRead::NeedMore;
    }
    let (arguments, repaired, end) = match section_args(&s[at..], eof, &format!("of {name}")) {
        Ok(r) => r,
        Err(e) => return e,
    };
    at += end;
    if fenced {
        let w2 = ws_len(&s[at..]);
        let tail = &s[at + w2..];
        if tail.starts_with("```") {
            at += w2 + 3;
        } else if !eof && (tail.is_empty() || is_prefix_ci(tail, "```")) {
            return CallRead::NeedMore;
        }
    }
    CallRead::Call(
        at,
        ParsedCall {
            name: name.to_string(),
            arguments,
            repaired,
            dialect: Dialect::DeepSeek,
        },
    )
}

/// A Kimi K2 call's inside: `functions.NAME:IDX<|tool_call_argument_begin|>{…}`.
fn kimi_call(s: &str, eof: bool) -> CallRead {
    const ARGS: &str = "<|tool_call_argument_begin|>";
    let k = match find_ci(s, ARGS) {
        Some(k) if k <= 200 => k,
        None if !eof && s.len() < 200 + ARGS.len() => return CallRead::NeedMore,
        _ => {
            return CallRead::Bad(format!(
                "the call id (functions.NAME:0) must be followed by {ARGS}"
            ));
        }
    };
    let id = s[..k].trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((n, idx)) if !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => id,
    };
    let name = name.trim();
    if name.is_empty() {
        return CallRead::Bad(format!("the tool name before {ARGS} is missing"));
    }
    let at = k + ARGS.len();
    match section_args(&s[at..], eof, &format!("of {name}")) {
        Ok((arguments, repaired, end)) => CallRead::Call(
            at + end,
            ParsedCall {
                name: name.to_string(),
                arguments,
                repaired,
                dialect: Dialect::KimiK2,
            },
        ),
        Err(e) => e,
    }
}
