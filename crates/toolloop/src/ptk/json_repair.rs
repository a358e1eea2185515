//! Tolerant JSON: the slips models make in hand-written JSON, repaired before giving up.
//!
//! Strict JSON is tried first (with `serde_json`, so valid input means exactly what JSON says).
//! When that fails, a lenient parser accepts: trailing commas, missing commas between members,
//! single-quoted strings, unquoted keys, raw newlines and unknown escapes inside strings,
//! `//` and `/* */` comments, the Python literals `True`, `False` and `None`, and (for a whole
//! text) a surrounding Markdown code fence. A value obtained that way is marked `repaired`.
//!
//! Errors say whether the text merely stopped too early ([`JsonError::Incomplete`], which a
//! streaming caller answers by waiting for more) or is wrong ([`JsonError::Invalid`], with the
//! byte offset and what was expected there).

use serde_json::{Map, Number, Value};

/// The deepest nesting accepted (as `serde_json`'s default).
const MAX_DEPTH: usize = 128;

/// Why a text is not (yet) a JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    /// The text ended before the value did.
    Incomplete,
    /// The text is not JSON, even after repairs.
    Invalid {
        /// The byte offset of the problem.
        offset: usize,
        /// What was wrong, and what was expected there.
        message: String,
    },
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonError::Incomplete => {
                f.write_str("the JSON ends too early (unclosed brace, bracket or string)")
            }
            JsonError::Invalid { offset, message } => write!(f, "{message} at byte {offset}"),
        }
    }
}

impl std::error::Error for JsonError {}

/// A value read from text.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The value.
    pub value: Value,
    /// The byte offset just after the value.
    pub end: usize,
    /// Whether the text needed a repair to parse.
    pub repaired: bool,
}

/// Reads one JSON value at the start of `text` (after whitespace), leaving whatever follows it.
///
/// `text` may be the first part of a longer text: a value whose end cannot be known yet (a
/// number or a word running to the end of `text`) is [`JsonError::Incomplete`], so the answer
/// never changes when more text arrives. See [`parse_prefix_final`] when `text` is all there is.
pub fn parse_prefix(text: &str) -> Result<Parsed, JsonError> {
    prefix(text, false)
}

/// Like [`parse_prefix`], for a text known to be complete: a number or word at its very end is
/// taken as it is.
pub fn parse_prefix_final(text: &str) -> Result<Parsed, JsonError> {
    prefix(text, true)
}

fn prefix(text: &str, complete: bool) -> Result<Parsed, JsonError> {
    let mut strict = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match strict.next() {
        Some(Ok(value)) => {
            let end = strict.byte_offset();
            let scalar = !(value.is_object() || value.is_array() || value.is_string());
            if scalar && !complete && end == text.len() {
                return Err(JsonError::Incomplete);
            }
            return Ok(Parsed {
                value,
                end,
                repaired: false,
            });
        }
        None => return Err(JsonError::Incomplete),
        Some(Err(_)) => {}
    }
    let mut p = Lenient {
        s: text.as_bytes(),
        text,
        pos: 0,
        complete,
    };
    p.skip_ws()?;
    let value = p.value(0)?;
    Ok(Parsed {
        value,
        end: p.pos,
        repaired: true,
    })
}

/// Reads a whole text as one JSON value: strips a surrounding code fence, then requires nothing
/// but whitespace after the value. Returns the value and whether it needed a repair.
pub fn parse(text: &str) -> Result<(Value, bool), JsonError> {
    let (body, fenced) = strip_fence(text);
    let parsed = parse_prefix_final(body)?;
    let rest = &body[parsed.end..];
    let mut tail = Lenient {
        s: rest.as_bytes(),
        text: rest,
        pos: 0,
        complete: true,
    };
    // Comments after the value are tolerated; anything else is an error.
    match tail.skip_ws() {
        Ok(()) if tail.pos == rest.len() => {}
        _ => {
            return Err(JsonError::Invalid {
                offset: parsed.end,
                message: "unexpected text after the JSON value".into(),
            });
        }
    }
    let had_comment = !rest.trim().is_empty();
    let repaired = parsed.repaired || fenced || had_comment;
    Ok((parsed.value, repaired))
}

/// Removes a Markdown code fence around `text` (```` ```json … ``` ````), if there is one.
pub fn strip_fence(text: &str) -> (&str, bool) {
    let t = text.trim();
    let Some(after) = t.strip_prefix("```") else {
        return (text, false);
    };
    let Some(nl) = after.find('\n') else {
        return (text, false);
    };
    let info = after[..nl].trim();
    if !info
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return (text, false);
    }
    let body = &after[nl + 1..];
    let body = body.trim_end();
    let body = body.strip_suffix("```").unwrap_or(body);
    (body, true)
}

struct Lenient<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    /// Whether the text is all there is (else a number or word at its end may go on).
    complete: bool,
}

type R<T> = Result<T, JsonError>;

impl<'a> Lenient<'a> {
    fn invalid<T>(&self, message: impl Into<String>) -> R<T> {
        Err(JsonError::Invalid {
            offset: self.pos,
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) -> R<()> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.pos += 1,
                Some(b'/') => match self.s.get(self.pos + 1) {
                    Some(b'/') => {
                        while let Some(c) = self.peek() {
                            if c == b'\n' {
                                break;
                            }
                            self.pos += 1;
                        }
                    }
                    Some(b'*') => match self.text[self.pos + 2..].find("*/") {
                        Some(i) => self.pos += 2 + i + 2,
                        None => return Err(JsonError::Incomplete),
                    },
                    None => return Err(JsonError::Incomplete),
                    _ => return Ok(()),
                },
                _ => return Ok(()),
            }
        }
    }

    fn value(&mut self, depth: usize) -> R<Value> {
        if depth > MAX_DEPTH {
            return self.invalid("JSON nested too deeply");
        }
        match self.peek() {
            None => Err(JsonError::Incomplete),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(q @ (b'"' | b'\'')) => self.string(q).map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(c) if c.is_ascii_alphabetic() => {
                let word = self.word();
                let at_end = self.pos == self.s.len();
                if at_end && !self.complete {
                    return Err(JsonError::Incomplete);
                }
                match word {
                    "true" | "True" => Ok(Value::Bool(true)),
                    "false" | "False" => Ok(Value::Bool(false)),
                    "null" | "None" => Ok(Value::Null),
                    _ => {
                        self.pos -= word.len();
                        self.invalid(format!(
                            "unexpected word `{word}`; expected a JSON value (a string in double quotes, a number, true, false, null, an object or an array)"
                        ))
                    }
                }
            }
            Some(_) => self.invalid(
                "expected a JSON value (a string in double quotes, a number, true, false, null, an object or an array)",
            ),
        }
    }

    fn word(&mut self) -> &'a str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'$' {
                self.pos += 1;
            } else {
                break;
            }
        }
        &self.text[start..self.pos]
    }

    fn number(&mut self) -> R<Value> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-') {
                self.pos += 1;
            } else {
                break;
            }
        }
        if self.pos == self.s.len() && !self.complete {
            return Err(JsonError::Incomplete);
        }
        let token = &self.text[start..self.pos];
        if let Ok(v @ Value::Number(_)) = serde_json::from_str::<Value>(token) {
            return Ok(v);
        }
        // Leading zeros and the like: read as a float, keep integers integral.
        match token.parse::<f64>() {
            Ok(f) if f.is_finite() => {
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Ok(Value::Number(Number::from(f as i64)))
                } else {
                    Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
                }
            }
            _ => {
                self.pos = start;
                self.invalid(format!("`{token}` is not a number"))
            }
        }
    }

    fn string(&mut self, quote: u8) -> R<String> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let rest = &self.text[self.pos..];
            // Copy the run up to the next quote or backslash in one go.
            let stop = rest
                .bytes()
                .position(|b| b == quote || b == b'\\')
                .ok_or(JsonError::Incomplete)?;
            out.push_str(&rest[..stop]);
            self.pos += stop;
            if self.s[self.pos] == quote {
                self.pos += 1;
                return Ok(out);
            }
            // A backslash escape.
            self.pos += 1;
            let Some(c) = self.peek() else {
                return Err(JsonError::Incomplete);
            };
            self.pos += 1;
            match c {
                b'"' => out.push('"'),
                b'\\' => out.push('\\'),
                b'/' => out.push('/'),
                b'\'' => out.push('\''),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                b'u' => {
                    let hi = self.hex4()?;
                    let ch = if (0xD800..0xDC00).contains(&hi) {
                        if self.text[self.pos..].starts_with("\\u") {
                            let save = self.pos;
                            self.pos += 2;
                            let lo = self.hex4()?;
                            if (0xDC00..0xE000).contains(&lo) {
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                            } else {
                                self.pos = save;
                                None
                            }
                        } else {
                            None
                        }
                    } else {
                        char::from_u32(hi)
                    };
                    out.push(ch.unwrap_or('\u{FFFD}'));
                }
                _ => {
                    // An unknown escape: keep the character it escapes.
                    self.pos -= 1;
                    let ch = self.text[self.pos..].chars().next().unwrap_or('\u{FFFD}');
                    self.pos += ch.len_utf8();
                    out.push(ch);
                }
            }
        }
    }

    fn hex4(&mut self) -> R<u32> {
        let digits = self.s.get(self.pos..self.pos + 4);
        let Some(digits) = digits else {
            if self.s[self.pos..].iter().all(u8::is_ascii_hexdigit) {
                return Err(JsonError::Incomplete);
            }
            return self.invalid("expected four hex digits after \\u");
        };
        let mut v = 0u32;
        for &d in digits {
            let Some(x) = (d as char).to_digit(16) else {
                return self.invalid("expected four hex digits after \\u");
            };
            v = v * 16 + x;
        }
        self.pos += 4;
        Ok(v)
    }

    fn key(&mut self) -> R<String> {
        match self.peek() {
            None => Err(JsonError::Incomplete),
            Some(q @ (b'"' | b'\'')) => self.string(q),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b'$' => {
                let start = self.pos;
                while let Some(c) = self.peek() {
                    if c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'-') {
                        self.pos += 1;
                    } else {
                        break;
                    }
                }
                if self.pos == self.s.len() {
                    return Err(JsonError::Incomplete);
                }
                Ok(self.text[start..self.pos].to_string())
            }
            Some(_) => self.invalid("expected an object key in double quotes"),
        }
    }

    fn object(&mut self, depth: usize) -> R<Value> {
        self.pos += 1;
        let mut map = Map::new();
        loop {
            self.skip_ws()?;
            match self.peek() {
                None => return Err(JsonError::Incomplete),
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                Some(b',') if !map.is_empty() => {
                    // Doubled comma: skip it.
                    self.pos += 1;
                    continue;
                }
                _ => {}
            }
            let key = self.key()?;
            self.skip_ws()?;
            match self.peek() {
                None => return Err(JsonError::Incomplete),
                Some(b':') => self.pos += 1,
                Some(_) => return self.invalid(format!("expected `:` after the key \"{key}\"")),
            }
            self.skip_ws()?;
            let v = self.value(depth + 1)?;
            map.insert(key, v);
            self.skip_ws()?;
            match self.peek() {
                None => return Err(JsonError::Incomplete),
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                // A missing comma before the next key.
                Some(b'"' | b'\'') => {}
                Some(_) => return self.invalid("expected `,` or `}` after an object member"),
            }
        }
    }

    fn array(&mut self, depth: usize) -> R<Value> {
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            self.skip_ws()?;
            match self.peek() {
                None => return Err(JsonError::Incomplete),
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                Some(b',') if !items.is_empty() => {
                    self.pos += 1;
                    continue;
                }
                _ => {}
            }
            items.push(self.value(depth + 1)?);
            self.skip_ws()?;
            match self.peek() {
                None => return Err(JsonError::Incomplete),
                Some(b',') => self.pos += 1,
                Some(b']') => {}
                Some(b'{' | b'[' | b'"' | b'\'') => {}
                Some(_) => return self.invalid("expected `,` or `]` after an array item"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(text: &str) -> (Value, bool) {
        parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn strict_json_is_not_repaired() {
        assert_eq!(
            ok(r#" {"a": [1, 2.5, "x"], "b": null} "#),
            (json!({"a": [1, 2.5, "x"], "b": null}), false)
        );
    }

    #[test]
    fn repairs_common_slips() {
        let cases = [
            (r#"{"a": 1,}"#, json!({"a": 1})),
            (r#"{"a": [1, 2,],}"#, json!({"a": [1, 2]})),
            (r#"{'a': 'it\'s'}"#, json!({"a": "it's"})),
            (r#"{a: 1, b_2: "x"}"#, json!({"a": 1, "b_2": "x"})),
            (
                r#"{"a": True, "b": False, "c": None}"#,
                json!({"a": true, "b": false, "c": null}),
            ),
            ("```json\n{\"a\": 1}\n```", json!({"a": 1})),
            ("{\"a\": \"line1\nline2\"}", json!({"a": "line1\nline2"})),
            ("{\"a\": 1 \"b\": 2}", json!({"a": 1, "b": 2})),
            ("{\"a\": 1, // note\n \"b\": 2}", json!({"a": 1, "b": 2})),
            (r#"{"a": "\d"}"#, json!({"a": "d"})),
            (
                r#"{"path": 'src/main.rs', "n": 007}"#,
                json!({"path": "src/main.rs", "n": 7}),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(ok(text), (want, true), "{text}");
        }
    }

    #[test]
    fn incomplete_and_invalid_are_told_apart() {
        for t in [
            r#"{"a": "#,
            r#"{"a": "x"#,
            r#"{"a": [1, "#,
            "{\"a\": tr",
            "[",
            "{a",
        ] {
            assert_eq!(parse_prefix(t), Err(JsonError::Incomplete), "{t}");
        }
        for t in [r#"{"a": @}"#, r#"{"a" 1}"#, "{\"a\": yes}", "}"] {
            assert!(
                matches!(parse_prefix(t), Err(JsonError::Invalid { .. })),
                "{t}"
            );
        }
        let e = parse(r#"{"a": 1} extra"#).unwrap_err();
        assert!(e.to_string().contains("after the JSON value"), "{e}");
    }

    #[test]
    fn prefix_reports_where_the_value_ends() {
        let p = parse_prefix(r#" {"a": 1}; {"b": 2}"#).unwrap();
        assert_eq!(p.value, json!({"a": 1}));
        assert_eq!(p.end, 9);
        let p = parse_prefix("{'a': 1} tail").unwrap();
        assert_eq!((p.end, p.repaired), (8, true));
    }

    #[test]
    fn a_value_running_to_the_end_may_go_on() {
        // Found by fuzzing: "333" then "\"" must not read as 333 early.
        assert_eq!(parse_prefix("333"), Err(JsonError::Incomplete));
        assert_eq!(parse_prefix("None"), Err(JsonError::Incomplete));
        assert_eq!(parse_prefix_final("333").map(|p| p.value), Ok(json!(333)));
        assert_eq!(parse("None"), Ok((json!(null), true)));
        assert_eq!(parse("7"), Ok((json!(7), false)));
        let p = parse_prefix("333 ").unwrap();
        assert_eq!((p.value, p.end), (json!(333), 3));
    }

    #[test]
    fn surrogates_and_depth() {
        assert_eq!(ok(r#"["\ud83d\ude00"]"#).0, json!(["😀"]));
        assert_eq!(ok(r#"["\ud800x"]"#), (json!(["\u{FFFD}x"]), true));
        let deep = "[".repeat(500) + &"]".repeat(500);
        assert!(matches!(parse(&deep), Err(JsonError::Invalid { .. })));
    }
}
