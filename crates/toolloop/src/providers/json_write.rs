//! JSON text written straight into a byte buffer, byte for byte as `serde_json` writes it, for
//! the request bodies the adapters send on every round.
//!
//! `serde_json` writes a string through its formatter: one write, and so one `memcpy` call, per
//! run of bytes between two escapes, and a JSON text inside a JSON string (a call's
//! `arguments`) has to be written to a string of its own first, then escaped (every quote of it
//! again a run). Here a string is read eight bytes at a time and appended a word at a time with
//! fixed-size copies made inline (see [`escape`]), with no call per run; and a value is written as a JSON string directly ([`write_value_as_string`]), escaping as it
//! goes. The output is the same bytes as `serde_json::to_vec` of the same string or value (the
//! module's property tests compare them over arbitrary input).

use serde_json::Value;

/// A buffer JSON text is written into: a `Vec<u8>`, or the `BytesMut` an OpenAI session writes
/// its request bodies in (frozen into the body sent, and reclaimed for the next one, without a
/// copy or an allocation).
pub(crate) trait JsonBuf {
    /// The bytes written so far.
    fn len(&self) -> usize;
    /// Appends one byte.
    fn push(&mut self, b: u8);
    /// Appends `bytes`.
    fn extend_from_slice(&mut self, bytes: &[u8]);
    /// Makes room for `additional` more bytes.
    fn reserve(&mut self, additional: usize);
    /// Keeps the first `len` bytes.
    fn truncate(&mut self, len: usize);
}

impl JsonBuf for Vec<u8> {
    #[inline(always)]
    fn len(&self) -> usize {
        Vec::len(self)
    }
    #[inline(always)]
    fn push(&mut self, b: u8) {
        Vec::push(self, b);
    }
    #[inline(always)]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
    #[inline(always)]
    fn reserve(&mut self, additional: usize) {
        Vec::reserve(self, additional);
    }
    #[inline(always)]
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
}

impl JsonBuf for bytes::BytesMut {
    #[inline(always)]
    fn len(&self) -> usize {
        bytes::BytesMut::len(self)
    }
    #[inline(always)]
    fn push(&mut self, b: u8) {
        bytes::BytesMut::extend_from_slice(self, &[b]);
    }
    #[inline(always)]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        bytes::BytesMut::extend_from_slice(self, bytes);
    }
    #[inline(always)]
    fn reserve(&mut self, additional: usize) {
        bytes::BytesMut::reserve(self, additional);
    }
    #[inline(always)]
    fn truncate(&mut self, len: usize) {
        bytes::BytesMut::truncate(self, len);
    }
}

/// What follows the backslash in the escape of each byte (`u`: `\u00XX`), 0 for a byte written
/// as it is: serde_json's table (control characters, the quote and the backslash; nothing else,
/// not DEL, U+2028 or U+2029).
const ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The escape of each byte that needs one, at each depth, padded to eight bytes, and its
/// length (the rest of the table: zeros).
struct Escapes {
    text: [[u8; 8]; 256],
    len: [u8; 256],
}

const fn escapes(depth: Depth) -> Escapes {
    let mut table = Escapes {
        text: [[0; 8]; 256],
        len: [0; 256],
    };
    let mut b = 0;
    while b < 256 {
        let code = ESCAPE[b];
        let hex = [HEX[b >> 4], HEX[b & 0xf]];
        let (text, len): ([u8; 8], u8) = match (depth, code) {
            (_, 0) => ([0; 8], 0),
            (Depth::One, b'u') => ([b'\\', b'u', b'0', b'0', hex[0], hex[1], 0, 0], 6),
            (Depth::One, _) => ([b'\\', code, 0, 0, 0, 0, 0, 0], 2),
            (Depth::Two, b'u') => ([b'\\', b'\\', b'u', b'0', b'0', hex[0], hex[1], 0], 7),
            // `\"` and `\\` escaped once more: their second character needs its own backslash.
            (Depth::Two, b'"' | b'\\') => ([b'\\', b'\\', b'\\', code, 0, 0, 0, 0], 4),
            (Depth::Two, _) => ([b'\\', b'\\', code, 0, 0, 0, 0, 0], 3),
        };
        table.text[b] = text;
        table.len[b] = len;
        b += 1;
    }
    table
}

static ESCAPES_ONE: Escapes = escapes(Depth::One);
static ESCAPES_TWO: Escapes = escapes(Depth::Two);

/// How deep in strings the text being written is: in one JSON string, or in a JSON string
/// inside a JSON text that is itself written as a JSON string (then every escape is escaped
/// again: a quote in a string of the inner text is `\\\"`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    One,
    Two,
}

/// Writes `s` as a JSON string (quotes included), as `serde_json::to_writer(out, s)` does.
#[inline(always)]
pub(crate) fn write_str(out: &mut impl JsonBuf, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    escape(out, s.as_bytes(), Depth::One);
    out.push(b'"');
}

/// Writes `value` as JSON text, as `serde_json::to_writer(out, value)` does.
pub(crate) fn write_value(out: &mut impl JsonBuf, value: &Value) {
    value_text(out, value, Depth::One);
}

/// Writes the JSON text of `value` as a JSON string (a call's `arguments`), as
/// `serde_json::to_writer(out, &serde_json::to_string(value)?)` does, without making the text
/// first.
pub(crate) fn write_value_as_string(out: &mut impl JsonBuf, value: &Value) {
    out.push(b'"');
    value_text(out, value, Depth::Two);
    out.push(b'"');
}

/// The JSON text of `value`, escaped for `depth - 1` strings around it.
fn value_text(out: &mut impl JsonBuf, value: &Value, depth: Depth) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // A number's text has nothing to escape.
        Value::Number(n) => number(out, n),
        Value::String(s) => {
            out.reserve(s.len() + 4);
            quote(out, depth);
            escape(out, s.as_bytes(), depth);
            quote(out, depth);
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                value_text(out, item, depth);
            }
            out.push(b']');
        }
        Value::Object(fields) => {
            out.push(b'{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                quote(out, depth);
                escape(out, k.as_bytes(), depth);
                quote(out, depth);
                out.push(b':');
                value_text(out, v, depth);
            }
            out.push(b'}');
        }
    }
}

/// A string's quote at `depth`.
fn quote(out: &mut impl JsonBuf, depth: Depth) {
    match depth {
        Depth::One => out.push(b'"'),
        Depth::Two => out.extend_from_slice(b"\\\""),
    }
}

/// A number as serde_json writes it: an integer's digits (by `itoa`, as serde_json writes
/// them), a float through serde_json.
fn number(out: &mut impl JsonBuf, n: &serde_json::Number) {
    let mut digits = itoa::Buffer::new();
    if let Some(u) = n.as_u64() {
        out.extend_from_slice(digits.format(u).as_bytes());
    } else if let Some(i) = n.as_i64() {
        out.extend_from_slice(digits.format(i).as_bytes());
    } else {
        // Floats are rare in requests (a temperature, a schema's bound); a number always
        // serializes.
        if let Ok(text) = serde_json::to_vec(n) {
            out.extend_from_slice(&text);
        }
    }
}

/// The bytes of a word (eight bytes, little-endian) that need escaping (a control character, a
/// quote or a backslash), as the high bit of each: the lowest bit set is exactly the first such
/// byte (a bit above it may be set wrongly, by a borrow), and none is set when there is none.
#[inline]
fn escape_mask(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20; a byte equal to the quote or the backslash (XOR makes it zero). A
    // subtraction borrows only from a byte that is one of these, and only into the bytes above.
    let below = word.wrapping_sub(ONES * 0x20) & !word & HIGH;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    below | zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\')))
}

/// The bytes of a string, escaped for `depth`, without quotes.
///
/// Eight bytes at a time: each word is appended whole (a fixed-size copy, made inline), then
/// cut after its bytes that need no escaping, before the first one that does, which is written
/// escaped; the next word starts after it. The last bytes of a string of eight or more are read
/// as the end of its last eight. Only a string shorter than a word goes byte by byte.
#[inline]
fn escape(out: &mut impl JsonBuf, bytes: &[u8], depth: Depth) {
    let mut rest = bytes;
    loop {
        let (word, valid) = match rest.first_chunk::<8>() {
            Some(word) => (u64::from_le_bytes(*word), 8),
            None => match bytes.last_chunk::<8>() {
                Some(last) if !rest.is_empty() => {
                    // `rest` is the end of the last eight bytes: shifted down, zeros above.
                    let shift = 8 * (8 - rest.len());
                    (u64::from_le_bytes(*last) >> shift, rest.len())
                }
                _ => break,
            },
        };
        // (`valid` is 1 to 8.)
        let mask = escape_mask(word) & (u64::MAX >> (64 - 8 * valid));
        let at = out.len();
        out.extend_from_slice(&word.to_le_bytes());
        if mask == 0 {
            // A whole word is the common case: nothing to cut (`BytesMut::truncate` is a call).
            if valid < 8 {
                out.truncate(at + valid);
            }
            rest = &rest[valid..];
        } else {
            let clean = (mask.trailing_zeros() / 8) as usize;
            out.truncate(at + clean);
            escaped(out, (word >> (8 * clean)) as u8, depth);
            rest = rest.get(clean + 1..).unwrap_or_default();
        }
    }
    for &b in rest {
        match ESCAPE[usize::from(b)] {
            0 => out.push(b),
            _ => escaped(out, b, depth),
        }
    }
}

/// The escape of `b` (a byte that needs one), escaped again at depth two: its table entry
/// appended whole (a fixed-size copy), then cut to its length.
#[inline]
fn escaped(out: &mut impl JsonBuf, b: u8, depth: Depth) {
    let table = match depth {
        Depth::One => &ESCAPES_ONE,
        Depth::Two => &ESCAPES_TWO,
    };
    let at = out.len();
    out.extend_from_slice(&table.text[usize::from(b)]);
    out.truncate(at + usize::from(table.len[usize::from(b)]));
}

/// Strategies for property tests of JSON writing: strings full of what needs escaping, and
/// values made of them.
#[cfg(test)]
pub(crate) mod arbitrary {
    use proptest::prelude::*;
    use serde_json::Value;

    /// Strings made mostly of what needs escaping or is multi-byte, in runs of all lengths.
    pub(crate) fn text() -> impl Strategy<Value = String> + Clone {
        let pieces = prop_oneof![
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\u{2028}\u{2029}".to_string()),
            Just("é€😀".to_string()),
            Just("\u{7f}/<>&'".to_string()),
            (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap_or('?').to_string()),
            "[a-z ]{0,17}",
            any::<String>(),
        ];
        proptest::collection::vec(pieces, 0..12).prop_map(|p| p.concat())
    }

    /// JSON values of every kind, nested, with such strings as keys and values.
    pub(crate) fn value() -> impl Strategy<Value = Value> + Clone {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            (-1e3f64..1e3).prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(text(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::arbitrary::{text, value};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn a_string_is_written_as_serde_json_writes_it(s in text()) {
            let mut out = b"[".to_vec();
            write_str(&mut out, &s);
            prop_assert_eq!(&out[1..], &serde_json::to_vec(&s).unwrap()[..]);
        }

        #[test]
        fn a_value_is_written_as_serde_json_writes_it(v in value()) {
            let mut out = Vec::new();
            write_value(&mut out, &v);
            prop_assert_eq!(out, serde_json::to_vec(&v).unwrap());
        }

        #[test]
        fn a_value_as_a_string_is_its_text_written_as_a_string(v in value()) {
            let mut out = Vec::new();
            write_value_as_string(&mut out, &v);
            let text = serde_json::to_string(&v).unwrap();
            prop_assert_eq!(out, serde_json::to_vec(&text).unwrap());
        }
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_escapes_it_at_every_offset() {
        // Each character alone, and at each position of an eight-byte word.
        for c in (0u32..0x100).filter_map(char::from_u32) {
            for before in 0..9 {
                let s = format!("{}{c}{}", "a".repeat(before), "b".repeat(9 - before));
                let mut out = Vec::new();
                write_str(&mut out, &s);
                assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{s:?}");
                let v = Value::String(s);
                let mut out = Vec::new();
                write_value_as_string(&mut out, &v);
                let text = serde_json::to_string(&v).unwrap();
                assert_eq!(out, serde_json::to_vec(&text).unwrap(), "{v}");
            }
        }
    }

    #[test]
    fn the_word_test_finds_exactly_the_bytes_to_escape() {
        for b in 0..=255u8 {
            for at in 0..8 {
                let mut word = *b"abcdefgh";
                word[at] = b;
                let mask = escape_mask(u64::from_le_bytes(word));
                if ESCAPE[usize::from(b)] == 0 {
                    assert_eq!(mask, 0, "byte {b:#x} at {at}");
                } else {
                    assert_eq!(mask.trailing_zeros() / 8, at as u32, "byte {b:#x} at {at}");
                }
            }
        }
    }

    #[test]
    fn every_pair_of_ascii_bytes_is_escaped_as_serde_json_escapes_it_at_every_offset() {
        // Two bytes side by side: a borrow from the first can mark the second (a quote then
        // `#`, a backslash then `]`, a control character then a space).
        for a in (0u32..0x80).filter_map(char::from_u32) {
            for b in (0u32..0x80).filter_map(char::from_u32) {
                for before in [0, 3, 6, 7] {
                    let s = format!("{}{a}{b}{}", "x".repeat(before), "y".repeat(8 - before));
                    let mut out = Vec::new();
                    write_str(&mut out, &s);
                    assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{s:?}");
                    let v = Value::String(s);
                    let mut out = Vec::new();
                    write_value_as_string(&mut out, &v);
                    let text = serde_json::to_string(&v).unwrap();
                    assert_eq!(out, serde_json::to_vec(&text).unwrap(), "{v}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn the_word_test_finds_the_first_byte_to_escape(word in any::<[u8; 8]>()) {
            let mask = escape_mask(u64::from_le_bytes(word));
            match word.iter().position(|&b| ESCAPE[usize::from(b)] != 0) {
                None => prop_assert_eq!(mask, 0),
                Some(first) => prop_assert_eq!(mask.trailing_zeros() / 8, first as u32),
            }
        }
    }
}
