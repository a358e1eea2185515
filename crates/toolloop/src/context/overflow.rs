//! A request larger than the model's context window, as the provider reported it.
//!
//! Each adapter recognises its provider's own shape of this error (in its `error` module) and
//! turns it into [`crate::model::ModelError::ContextOverflow`]; the transport does not retry
//! it, since the same request would be refused again. This module holds the type and the
//! small readers of numbers the adapters share.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What the provider said when it refused a request for its size. The counts are the
/// provider's own, when its message gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextOverflow {
    /// The HTTP status (200 for an error event inside a successful stream).
    pub status: u16,
    /// The provider's error code or type, when it gave one (`context_length_exceeded`,
    /// `exceed_context_size_error`, `INVALID_ARGUMENT`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The provider's message (with secrets removed, like every error message).
    pub message: String,
    /// The input tokens the request held, as the provider counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// The output tokens the request reserved (its `max_tokens`), when the provider counted
    /// them against the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// The window the request had to fit, as the provider stated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl fmt::Display for ContextOverflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the request does not fit the model's context window")?;
        match (self.input_tokens, self.output_tokens, self.limit) {
            (Some(i), Some(o), Some(l)) => write!(f, " ({i} input + {o} output tokens > {l})")?,
            (Some(i), None, Some(l)) => write!(f, " ({i} tokens > {l})")?,
            (Some(i), _, None) => write!(f, " ({i} tokens)")?,
            (None, _, Some(l)) => write!(f, " (the window is {l} tokens)")?,
            (None, _, None) => {}
        }
        write!(f, "; HTTP {}: {}", self.status, self.message)
    }
}

impl ContextOverflow {
    /// An overflow with a status and a message and no counts yet.
    pub fn new(status: u16, code: Option<String>, message: impl Into<String>) -> Self {
        ContextOverflow {
            status,
            code,
            message: message.into(),
            input_tokens: None,
            output_tokens: None,
            limit: None,
        }
    }
}

/// The whole number that follows the first occurrence of `marker` in `text` (ASCII case
/// ignored), past at most a few separator characters (spaces, quotes, colons, parentheses,
/// `=`): `number_after("count (1200) exceeds", "count")` is 1200. `None` when the marker is
/// missing or no number follows it, or the number does not fit.
pub(crate) fn number_after(text: &str, marker: &str) -> Option<u64> {
    let at = find_ignore_case(text, marker)?;
    let rest = &text[at + marker.len()..];
    let start = rest
        .char_indices()
        .take(4)
        .find(|(_, c)| !matches!(c, ' ' | '"' | '\'' | ':' | '(' | '=' | '\\'))
        .map(|(i, _)| i)?;
    let digits: &str = {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        &tail[..end]
    };
    digits.parse().ok()
}

/// Where `needle` first occurs in `haystack`, ignoring ASCII case.
pub(crate) fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    (0..=h.len() - n.len())
        .find(|&i| haystack.is_char_boundary(i) && h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Whether `haystack` holds `needle`, ignoring ASCII case.
pub(crate) fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    find_ignore_case(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_their_markers() {
        let t = "The input token count (1200293) exceeds the maximum number of tokens allowed \
                 (1048576).";
        assert_eq!(number_after(t, "input token count"), Some(1_200_293));
        assert_eq!(number_after(t, "TOKENS ALLOWED"), Some(1_048_576));
        assert_eq!(number_after(r#""n_ctx":4096}"#, "n_ctx"), Some(4096));
        assert_eq!(number_after(r#"\"n_ctx\":4096}"#, "n_ctx"), Some(4096));
        assert_eq!(number_after("too long: 12 tokens", "too long:"), Some(12));
        assert_eq!(number_after("count is many", "count"), None);
        assert_eq!(number_after("count", "count"), None);
        assert_eq!(number_after("count 99999999999999999999999", "count"), None);
        assert_eq!(
            number_after("count     7", "count"),
            None,
            "too far from its marker"
        );
        assert_eq!(number_after("é count 7", "count"), Some(7));
        assert_eq!(number_after("", ""), None);
        assert!(contains_ignore_case(
            "Prompt Is Too Long",
            "prompt is too long"
        ));
        assert!(!contains_ignore_case("é", "éé"));
    }

    #[test]
    fn display_gives_the_counts_it_has() {
        let mut o = ContextOverflow::new(400, None, "prompt is too long");
        assert_eq!(
            o.to_string(),
            "the request does not fit the model's context window; HTTP 400: prompt is too long"
        );
        o.input_tokens = Some(208_310);
        o.limit = Some(200_000);
        assert!(o.to_string().contains("(208310 tokens > 200000)"), "{o}");
        o.output_tokens = Some(512);
        assert!(
            o.to_string()
                .contains("(208310 input + 512 output tokens > 200000)")
        );
    }
}
