//! Python call syntax, as Llama 3.2 and Llama 4 write tool calls:
//! `[get_weather(city="Paris", days=3), other(flag=True)]`.
//!
//! Read by a small parser of Python literals (never evaluated): strings in single or double
//! quotes with Python's escapes, integers and floats, `True`/`False`/`None` (and JSON's
//! `true`/`false`/`null`), lists, tuples (read as lists) and dicts with string keys. Arguments
//! must be keyword arguments.

use super::json_repair::JsonError;
use serde_json::{Map, Number, Value};

/// The deepest nesting accepted.
const MAX_DEPTH: usize = 128;

/// One call read from Python syntax.
pub(crate) struct PyCall {
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// Whether `name` can be written as a call's name (letters, digits, `_`, `.`, `-`, not starting
/// with a digit, `.` or `-`).
pub(crate) fn is_call_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Whether `key` can be written as a keyword argument (a Python identifier, ASCII only).
pub(crate) fn is_keyword(key: &str) -> bool {
    let mut bytes = key.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The length of the call name at the start of `s`, if `s` starts like `NAME(` (spaces allowed
/// before the parenthesis): `Ok(Some(n))` when it does, `Ok(None)` when it cannot, `Err(())`
/// when `s` ends before that is known.
pub(crate) fn starts_like_call(s: &str) -> Result<Option<usize>, ()> {
    let b = s.as_bytes();
    let Some(&first) = b.first() else {
        return Err(());
    };
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return Ok(None);
    }
    let n = b
        .iter()
        .position(|&c| !(c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')))
        .unwrap_or(b.len());
    if n > 200 {
        return Ok(None);
    }
    let rest = &b[n..];
    let w = rest
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(rest.len());
    match rest.get(w) {
        None => Err(()),
        Some(b'(') => Ok(Some(n)),
        Some(_) => Ok(None),
    }
}

/// Reads a list of calls at the start of `s` (which starts with `[`): the calls and the byte
/// offset just after the closing `]`.
pub(crate) fn parse_call_list(s: &str) -> Result<(usize, Vec<PyCall>), JsonError> {
    let mut p = Parser { s, i: 0 };
    p.expect(b'[', "`[`")?;
    let mut calls = Vec::new();
    loop {
        p.ws();
        if p.peek()? == b']' && !calls.is_empty() {
            p.i += 1;
            break;
        }
        calls.push(p.call()?);
        p.ws();
        match p.peek()? {
            b',' => p.i += 1,
            b']' => {
                p.i += 1;
                break;
            }
            _ => return Err(p.invalid("expected `,` or `]` after a call")),
        }
    }
    Ok((p.i, calls))
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn invalid(&self, message: &str) -> JsonError {
        JsonError::Invalid {
            offset: self.i,
            message: message.to_string(),
        }
    }

    fn peek(&self) -> Result<u8, JsonError> {
        self.s
            .as_bytes()
            .get(self.i)
            .copied()
            .ok_or(JsonError::Incomplete)
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.as_bytes().get(self.i) {
            self.i += 1;
        }
    }

    fn expect(&mut self, b: u8, what: &str) -> Result<(), JsonError> {
        if self.peek()? == b {
            self.i += 1;
            Ok(())
        } else {
            Err(self.invalid(&format!("expected {what}")))
        }
    }

    fn word(&mut self, call_name: bool) -> &str {
        let start = self.i;
        let bytes = self.s.as_bytes();
        while let Some(&c) = bytes.get(self.i) {
            let ok = c.is_ascii_alphanumeric()
                || c == b'_'
                || (call_name && self.i > start && matches!(c, b'.' | b'-'));
            if !ok {
                break;
            }
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    fn call(&mut self) -> Result<PyCall, JsonError> {
        let c = self.peek()?;
        if !(c.is_ascii_alphabetic() || c == b'_') {
            return Err(self.invalid("expected a call like tool_name(arg=value)"));
        }
        let name = self.word(true).to_string();
        self.ws();
        self.expect(b'(', "`(` after the tool name")?;
        let mut arguments = Map::new();
        loop {
            self.ws();
            if self.peek()? == b')' {
                self.i += 1;
                break;
            }
            let c = self.peek()?;
            if !(c.is_ascii_alphabetic() || c == b'_') {
                return Err(self.invalid("expected a keyword argument like name=value"));
            }
            let key = self.word(false).to_string();
            self.ws();
            if self.i == self.s.len() {
                return Err(JsonError::Incomplete);
            }
            self.expect(
                b'=',
                "`=` after the argument name (arguments are name=value)",
            )?;
            self.ws();
            let value = self.value(0)?;
            arguments.insert(key, value);
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b')' => {
                    self.i += 1;
                    break;
                }
                _ => return Err(self.invalid("expected `,` or `)` after an argument")),
            }
        }
        Ok(PyCall { name, arguments })
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.invalid("nested too deeply"));
        }
        match self.peek()? {
            b'"' | b'\'' => self.string().map(Value::String),
            b'[' => self.sequence(b']', depth).map(Value::Array),
            b'(' => self.sequence(b')', depth).map(Value::Array),
            b'{' => self.dict(depth),
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(),
            c if c.is_ascii_alphabetic() => {
                let start = self.i;
                let w = self.word(false).to_string();
                let at_end = self.i == self.s.len();
                let v = match w.as_str() {
                    "True" | "true" => Value::Bool(true),
                    "False" | "false" => Value::Bool(false),
                    "None" | "null" => Value::Null,
                    _ if at_end => return Err(JsonError::Incomplete),
                    _ => {
                        self.i = start;
                        return Err(self.invalid(
                            "expected a value (a quoted string, a number, True, False, None, a list or a dict)",
                        ));
                    }
                };
                if at_end {
                    // `None` may be the start of a longer word.
                    return Err(JsonError::Incomplete);
                }
                Ok(v)
            }
            _ => Err(self.invalid(
                "expected a value (a quoted string, a number, True, False, None, a list or a dict)",
            )),
        }
    }

    fn sequence(&mut self, close: u8, depth: usize) -> Result<Vec<Value>, JsonError> {
        self.i += 1;
        let mut items = Vec::new();
        loop {
            self.ws();
            if self.peek()? == close {
                self.i += 1;
                return Ok(items);
            }
            items.push(self.value(depth + 1)?);
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                c if c == close => {
                    self.i += 1;
                    return Ok(items);
                }
                _ => return Err(self.invalid("expected `,` or the end of the list")),
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.i += 1;
        let mut map = Map::new();
        loop {
            self.ws();
            match self.peek()? {
                b'}' => {
                    self.i += 1;
                    return Ok(Value::Object(map));
                }
                b'"' | b'\'' => {}
                _ => return Err(self.invalid("expected a quoted dict key")),
            }
            let key = self.string()?;
            self.ws();
            self.expect(b':', "`:` after a dict key")?;
            self.ws();
            let value = self.value(depth + 1)?;
            map.insert(key, value);
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.invalid("expected `,` or `}` in a dict")),
            }
        }
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.i;
        let bytes = self.s.as_bytes();
        while let Some(&c) = bytes.get(self.i) {
            let sign_after_e = matches!(c, b'+' | b'-')
                && self.i > start
                && matches!(bytes[self.i - 1], b'e' | b'E');
            if c.is_ascii_digit()
                || matches!(c, b'.' | b'e' | b'E' | b'_')
                || sign_after_e
                || (self.i == start && matches!(c, b'+' | b'-'))
            {
                self.i += 1;
            } else {
                break;
            }
        }
        if self.i == self.s.len() {
            return Err(JsonError::Incomplete);
        }
        let raw: String = self.s[start..self.i]
            .chars()
            .filter(|&c| c != '_')
            .collect();
        let raw = raw.strip_prefix('+').unwrap_or(&raw);
        let (neg, digits) = match raw.strip_prefix('-') {
            Some(d) => ("-", d),
            None => ("", raw),
        };
        // Python writes `1.` and `.5`; JSON wants `1.0` and `0.5`.
        let mut norm = String::from(neg);
        if digits.starts_with('.') {
            norm.push('0');
        }
        norm.push_str(digits);
        if norm.ends_with('.') {
            norm.push('0');
        }
        let norm = norm.replace(".e", ".0e").replace(".E", ".0E");
        match serde_json::from_str::<Number>(&norm) {
            Ok(n) => Ok(Value::Number(n)),
            Err(_) => {
                self.i = start;
                Err(self.invalid("not a number"))
            }
        }
    }

    fn string(&mut self) -> Result<String, JsonError> {
        let quote = self.peek()?;
        self.i += 1;
        let mut out = String::new();
        loop {
            let rest = &self.s[self.i..];
            let Some(c) = rest.chars().next() else {
                return Err(JsonError::Incomplete);
            };
            self.i += c.len_utf8();
            if c as u32 == u32::from(quote) {
                return Ok(out);
            }
            match c {
                '\\' => {
                    let Some(e) = self.s[self.i..].chars().next() else {
                        return Err(JsonError::Incomplete);
                    };
                    self.i += e.len_utf8();
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        'a' => out.push('\u{7}'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'v' => out.push('\u{b}'),
                        '\n' => {}
                        'x' => out.push(self.hex(2)?),
                        'u' => out.push(self.hex(4)?),
                        'U' => out.push(self.hex(8)?),
                        '\\' | '\'' | '"' => out.push(e),
                        other => {
                            // Python keeps unknown escapes as they are.
                            out.push('\\');
                            out.push(other);
                        }
                    }
                }
                '\n' => {
                    self.i -= 1;
                    return Err(self.invalid("a quoted string runs past the end of its line"));
                }
                c => out.push(c),
            }
        }
    }

    fn hex(&mut self, n: usize) -> Result<char, JsonError> {
        let bytes = self.s.as_bytes();
        let mut code: u32 = 0;
        for _ in 0..n {
            let Some(&b) = bytes.get(self.i) else {
                return Err(JsonError::Incomplete);
            };
            let d = (b as char)
                .to_digit(16)
                .ok_or_else(|| self.invalid("expected hexadecimal digits in an escape"))?;
            code = code * 16 + d;
            self.i += 1;
        }
        char::from_u32(code).ok_or_else(|| self.invalid("an escape names no character"))
    }
}

/// A JSON value written as a Python literal that [`parse_call_list`] reads back as the same
/// value.
pub(crate) fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(k, out);
                out.push_str(": ");
                write_value(v, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One call in Python syntax (without the surrounding list), or `None` when the name or an
/// argument name cannot be written in it.
pub(crate) fn write_call(name: &str, arguments: &Map<String, Value>) -> Option<String> {
    if !is_call_name(name) || !arguments.keys().all(|k| is_keyword(k)) {
        return None;
    }
    let mut out = format!("{name}(");
    for (i, (k, v)) in arguments.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(k);
        out.push('=');
        write_value(v, &mut out);
    }
    out.push(')');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn calls(s: &str) -> Vec<(String, Value)> {
        let (end, calls) = parse_call_list(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(end, s.len());
        calls
            .into_iter()
            .map(|c| (c.name, Value::Object(c.arguments)))
            .collect()
    }

    #[test]
    fn reads_python_literals() {
        assert_eq!(
            calls(
                r#"[get_weather(city='San Francisco', days=3, metric=True, x=None), f(), g(a=[1, -2.5, .5, 1e3, 1_000], b={"k": (1, 'two')}, c="q\"\n\x41\u00e9")]"#
            ),
            vec![
                (
                    "get_weather".into(),
                    json!({"city": "San Francisco", "days": 3, "metric": true, "x": null})
                ),
                ("f".into(), json!({})),
                (
                    "g".into(),
                    json!({"a": [1, -2.5, 0.5, 1000.0, 1000], "b": {"k": [1, "two"]}, "c": "q\"\nAé"})
                ),
            ]
        );
    }

    #[test]
    fn incomplete_and_invalid_are_told_apart() {
        for s in [
            "[f(a=1",
            "[f(a='x",
            "[f(a=Tru",
            "[f(a=[1, 2]",
            "[f",
            "[f(a=1)",
        ] {
            assert_eq!(parse_call_list(s).err(), Some(JsonError::Incomplete), "{s}");
        }
        for s in [
            "[f(1)]",
            "[f(a=os.system('x'))]",
            "[f(a=1 b=2)]",
            "[f(a={1: 2})]",
            "[]",
            "[f(a='x\n')]",
        ] {
            assert!(
                matches!(parse_call_list(s), Err(JsonError::Invalid { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn written_values_read_back() {
        let args = json!({"s": "a\"b\\c\nd\u{1}é", "n": -1.5e300, "i": 12345678901234u64, "l": [null, true, {"k": []}]});
        let text = format!("[{}]", write_call("t", args.as_object().unwrap()).unwrap());
        assert_eq!(calls(&text), vec![("t".into(), args)]);
        assert!(write_call("t", json!({"a b": 1}).as_object().unwrap()).is_none());
        assert!(write_call("1t", &Map::new()).is_none());
    }
}
