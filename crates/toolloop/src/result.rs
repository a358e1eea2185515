//! Tool results as the model reads them: serialized as JSON `{success, message, data}` and
//! capped in length, keeping the head and the tail.

use crate::tool::{ToolError, ToolOutput};

/// Serializes a result as `{"success": …, "message": …, "data": …}`, in that key order
/// (`data` left out when there is none).
pub fn serialize(result: &Result<ToolOutput, ToolError>) -> String {
    let (success, message, data) = match result {
        Ok(o) => (true, &o.message, &o.data),
        Err(e) => (false, &e.message, &e.data),
    };
    // Written straight into bytes, as serde_json writes them (see `providers::json_write`):
    // several times faster than a value's `Display`.
    let mut out = Vec::with_capacity(64 + message.len());
    out.extend_from_slice(if success {
        b"{\"success\":true,\"message\":"
    } else {
        b"{\"success\":false,\"message\":"
    });
    crate::providers::json_write::write_str(&mut out, message);
    if let Some(d) = data {
        out.extend_from_slice(b",\"data\":");
        crate::providers::json_write::write_value(&mut out, d);
    }
    out.push(b'}');
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// An error result with just a message.
pub fn error_content(message: &str) -> String {
    serialize(&Err(ToolError::new(message)))
}

/// The most characters of a name (a tool name, a call id) that a message or an event repeats;
/// see [`shorten`].
pub const ECHO_CHARS: usize = 64;

/// `text` as a message repeats it: at most `max_chars` characters, and when it is longer, its
/// head and a note of how many characters were left out. A model's tool name or call id can be
/// any length; an error message that names it must not grow with it.
pub fn shorten(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    // No more bytes than `max_chars`: no more characters either (the usual name, at once).
    if text.len() <= max_chars {
        return std::borrow::Cow::Borrowed(text);
    }
    match text.char_indices().nth(max_chars) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => {
            let rest = text[end..].chars().count();
            std::borrow::Cow::Owned(format!("{}…[{rest} more characters]", &text[..end]))
        }
    }
}

/// Caps `content` at `max_chars` characters, keeping the head and the tail with a marker in
/// between saying how many characters were cut. `max_chars == 0` means no cap.
pub fn cap(content: String, max_chars: usize) -> String {
    // No more bytes than the cap: no more characters either.
    if max_chars == 0 || content.len() <= max_chars {
        return content;
    }
    let total = content.chars().count();
    if total <= max_chars {
        return content;
    }
    // The marker's own length counts against the cap.
    let marker_len = 40;
    let keep = max_chars.saturating_sub(marker_len).max(2);
    let head_n = keep / 2;
    let tail_n = keep - head_n;
    let cut = total - head_n - tail_n;
    let head_end = content
        .char_indices()
        .nth(head_n)
        .map_or(content.len(), |(i, _)| i);
    let tail_start = content
        .char_indices()
        .nth(total - tail_n)
        .map_or(content.len(), |(i, _)| i);
    format!(
        "{}…[truncated {cut} characters]…{}",
        &content[..head_end],
        &content[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    #[test]
    fn serializes_seed_shape() {
        let ok = serialize(&Ok(ToolOutput::data(json!({"n": 1})).with_message("done")));
        assert_eq!(ok, r#"{"success":true,"message":"done","data":{"n":1}}"#);
        assert_eq!(
            serde_json::from_str::<Value>(&ok).unwrap(),
            json!({"success": true, "message": "done", "data": {"n": 1}})
        );
        let err = error_content("boom");
        assert_eq!(
            serde_json::from_str::<Value>(&err).unwrap(),
            json!({"success": false, "message": "boom"})
        );
    }

    #[test]
    fn caps_keep_head_and_tail() {
        let s: String = (0..10_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let c = cap(s.clone(), 4000);
        assert!(c.chars().count() <= 4000, "{}", c.chars().count());
        assert!(c.starts_with(&s[..100]));
        assert!(c.ends_with(&s[s.len() - 100..]));
        assert!(c.contains("[truncated 6040 characters]"), "{c}");
        assert_eq!(cap("short".into(), 4000), "short");
        assert_eq!(cap(s.clone(), 0), s);
    }

    #[test]
    fn shorten_keeps_short_text_and_cuts_long_text() {
        assert_eq!(shorten("read_file", ECHO_CHARS), "read_file");
        let long = "é".repeat(1000);
        let s = shorten(&long, 10);
        assert!(s.starts_with(&"é".repeat(10)), "{s}");
        assert!(s.ends_with("…[990 more characters]"), "{s}");
    }

    proptest! {
        #[test]
        fn serialized_results_read_back(message in ".{0,40}", text in ".{0,40}", ok in any::<bool>(), with_data in any::<bool>()) {
            let data = with_data.then(|| json!({"text": text, "n": [1, 2.5, null]}));
            let result = if ok {
                Ok(ToolOutput { message: message.clone(), data: data.clone(), ..ToolOutput::text("") })
            } else {
                Err(ToolError { message: message.clone(), data: data.clone(), ..ToolError::new("") })
            };
            let mut expected = json!({"success": ok, "message": message});
            if let Some(d) = data {
                expected["data"] = d;
            }
            prop_assert_eq!(serde_json::from_str::<Value>(&serialize(&result)).unwrap(), expected);
        }

        #[test]
        fn cap_never_exceeds_and_respects_char_boundaries(s in ".{0,300}", max in 45usize..200) {
            let c = cap(s.clone(), max);
            prop_assert!(c.chars().count() <= max.max(s.chars().count().min(max)));
            if s.chars().count() <= max { prop_assert_eq!(c, s); }
        }
    }
}
