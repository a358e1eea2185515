//! Near misses: the explanation sent back for an attempted call that does not parse, with the
//! exact format to use.

use crate::ptk::dialect::Dialect;
use crate::ptk::render::escape_content;

/// The model's own text as an explanation quotes it: its first 40 characters, escaped so that
/// the quote cannot pose as a call when the explanation is sent back (the explanation itself is
/// not escaped: the format it teaches must read exactly as written).
pub(super) fn quote(text: &str) -> String {
    escape_content(&text.chars().take(40).collect::<String>())
}

pub(super) fn miss(dialect: Dialect, what: impl std::fmt::Display) -> String {
    format!(
        "Your tool call could not be read: {what}. {}",
        teaching(dialect)
    )
}

/// Where the format an explanation teaches begins (see [`teaching`]).
const TEACHING: &str = "Write each tool call exactly like this:\n";

/// The end of a near miss's explanation: the exact format of `dialect`, and how its arguments
/// are written.
fn teaching(dialect: Dialect) -> String {
    let arguments = match dialect {
        Dialect::Qwen3Coder => "Each argument goes in a <parameter=NAME> block of its own.",
        Dialect::Glm => "Each argument goes in an <arg_key> and <arg_value> pair of its own.",
        Dialect::Pythonic => "The arguments are NAME=VALUE pairs, the values Python literals.",
        _ => "The arguments must be one JSON object with double-quoted keys and strings.",
    };
    format!("{TEACHING}{}\n{arguments}", dialect.format())
}

/// `explanation` teaching `dialect` instead of the format it was written for (the one the
/// attempted call resembled).
pub(super) fn reteach(mut explanation: String, dialect: Dialect) -> String {
    if let Some(at) = explanation.rfind(TEACHING) {
        explanation.truncate(at);
        explanation.push_str(&teaching(dialect));
    }
    explanation
}
