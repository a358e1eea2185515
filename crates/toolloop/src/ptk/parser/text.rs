//! Small text helpers of the readers (ASCII-case matching, lines, char boundaries).

use crate::ptk::json_repair;
use crate::ptk::json_repair::JsonError;

pub(super) fn first_char_len(s: &str) -> usize {
    s.chars().next().map_or(1, char::len_utf8)
}

/// A name written in a tag (`<function= "f" >`): without spaces and quotes around it.
pub(super) fn clean_name(raw: &str) -> &str {
    raw.trim().trim_matches(|c| c == '"' || c == '\'').trim()
}

/// One JSON value at the start of `s`; at the end of the reply, a number or word running to
/// its end is final.
pub(super) fn read_json(s: &str, eof: bool) -> Result<json_repair::Parsed, JsonError> {
    if eof {
        json_repair::parse_prefix_final(s)
    } else {
        json_repair::parse_prefix(s)
    }
}

pub(super) fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub(super) fn ws_len(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

pub(super) fn starts_with_ci(s: &str, lit: &str) -> bool {
    s.len() >= lit.len() && s.as_bytes()[..lit.len()].eq_ignore_ascii_case(lit.as_bytes())
}

/// Whether `s` is a proper prefix of `lit` (ignoring ASCII case).
pub(super) fn is_prefix_ci(s: &str, lit: &str) -> bool {
    s.len() < lit.len()
        && s.as_bytes()
            .eq_ignore_ascii_case(&lit.as_bytes()[..s.len()])
}

pub(super) fn find_ci(hay: &str, needle: &str) -> Option<usize> {
    let n = needle.len();
    if hay.len() < n {
        return None;
    }
    hay.as_bytes()
        .windows(n)
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// The end of the line containing byte `from` (just past its newline), or `None` when the line
/// is not finished yet.
pub(super) fn line_end(s: &str, from: usize, eof: bool) -> Option<usize> {
    let from = from.min(s.len());
    match s.as_bytes()[from..].iter().position(|&b| b == b'\n') {
        Some(i) => Some(from + i + 1),
        None if eof => Some(s.len()),
        None => None,
    }
}
