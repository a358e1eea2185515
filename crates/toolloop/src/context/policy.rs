//! The context policy: what a run does so that its requests stay inside the model's context
//! window, as data ([`ContextPolicy`]), and the texts it writes (the stub of a cleared result,
//! the preview of a spilled one, the summariser's prompt).
//!
//! The machine applies the policy at the start of each round, on the conversation it sends (the
//! *view*; the transcript itself is kept whole), in three stages, each journaled as an input so
//! that a replay or a resume rebuilds the same view without calling a model again:
//!
//! 1. **spill**: a tool result longer than [`ContextPolicy::spill_over`] bytes is sent as its
//!    head and tail with a handle (the call's id); the model pages through the whole of it with
//!    the `read_result` tool ([`READ_RESULT`]), which the machine answers itself from the
//!    transcript, offered once a result has been spilled. Lost from the view: the middle of
//!    the result, until the model reads it.
//! 2. **clear**: the results of calls older than the last [`ContextPolicy::keep_rounds`]
//!    rounds become a one-line stub naming the call ([`cleared_stub`]), in batches: once `K`
//!    rounds beyond the last `K` have gathered, all of them at once (so a provider's prompt
//!    cache is invalidated once every `K` rounds, not every round; between `K` and `2K` rounds
//!    keep their results). Every call keeps exactly one result. Lost from the view: the
//!    content of old results (the calls, their arguments and the model's own text stay).
//! 3. **compact**: when the estimated size of the next request passes [`ContextPolicy::compact_at`]
//!    of the window, the results of every round but the last are cleared first (one edit,
//!    no model call), when that frees at least a quarter of the threshold (clearing less
//!    would change the conversation's prefix, and invalidate a prompt cache, round after
//!    round); when the estimate still passes it, the older part of the conversation (all
//!    but the system prompt and the most recent turns) is summarised by one model call with
//!    [`COMPACT_PROMPT`], and replaced by a user message holding the summary
//!    ([`SUMMARY_HEADER`]). Lost from the view: everything in the summarised part that the
//!    summary does not say.
//!
//! **Provider-native stages.** With [`ContextPolicy::native`] on (the default), a stage that the
//! provider's API does itself, by its adapter's declaration
//! ([`crate::model::Model::native_context`]), is asked of the provider instead
//! ([`ContextPolicy::native_request`], sent as [`crate::model::ModelSettings::context`]):
//!
//! - *clear*, by an API that clears old tool results (Anthropic's `clear_tool_uses_20250919`):
//!   once the request passes half the compaction threshold, the provider clears the results
//!   the machine's own clearing would (the same batches, the same clearing under pressure: the
//!   request names how many of the latest calls keep theirs,
//!   [`crate::engine::Machine::native_request`]); the machine logs its clearing edits as ever
//!   but sends the results whole (the provider clears them on its side). A summary is still
//!   made by the machine when the provider's clearing is not enough.
//! - *compact*, by an API that compacts (the Responses API's `compaction`): the request asks it
//!   to compact at the threshold; the machine then starts no summarisation of its own on its
//!   estimate (a provider's refusal of a request for its size still makes it compact and
//!   retry). The provider's compaction is an opaque item kept with its turn, and the adapter
//!   sends nothing before the latest one.
//!
//! What the provider did comes back as [`crate::model::ModelResponse::context_edited`], logged
//! with the response. The request field is a function of the policy alone, so a resumed run
//! asks the same.
//!
//! A provider's refusal of a request too large for its window
//! ([`crate::model::ModelError::ContextOverflow`]) makes the machine compact and retry that call
//! once; refused again, the run stops with
//! [`crate::outcome::StopReason::ContextExhausted`], its transcript kept.

use crate::context::native::{NativeClear, NativeContext, NativeSupport};
use serde::{Deserialize, Serialize};

/// The name of the tool with which the model reads a spilled result.
pub const READ_RESULT: &str = "read_result";

/// The most bytes one `read_result` call returns.
pub const READ_RESULT_MAX: usize = 16 * 1024;

/// The first line of the user message that replaces a compacted part of the conversation.
pub const SUMMARY_HEADER: &str =
    "[Summary of the earlier part of this conversation, written when it was compacted]";

/// The instruction sent to the summariser (as the system prompt of the summarisation call; the
/// part to summarise follows as a user message, rendered as text by [`render_for_summary`]).
pub const COMPACT_PROMPT: &str = "You are compacting the history of an agent's conversation \
so that the agent can go on with its task in a smaller context. Write a summary that the agent \
will read in place of the messages below. Keep, in this order and with exact names, paths, \
identifiers and numbers:\n\
1. The task: what the user asked for, with every requirement and constraint.\n\
2. Decisions made and why, and what was tried and failed.\n\
3. Open threads: what is still to do, and what the agent was doing last.\n\
4. Files and resources touched: each path, URL or record, and what was done to it.\n\
5. Facts learnt from tool results that are still needed.\n\
Leave out pleasantries and anything no longer needed. Write plain text, no preamble.";

/// The line that marks the start of the conversation to summarise, in the user message of a
/// summarisation request.
pub const COMPACT_MARKER: &str = "--- conversation to summarise ---";

/// A context policy (see the [module docs](self)). [`ContextPolicy::default`] gives the
/// documented defaults; [`ContextPolicy::off`] does nothing (the conversation is sent whole).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContextPolicy {
    /// The model's context window in tokens, overriding the model's known one
    /// ([`crate::context::LimitTable`]). With neither, no compaction is started by the
    /// estimate (a provider's overflow error still starts one).
    pub window: Option<u64>,
    /// Compact when the estimated next request passes this share of the window (default 0.8).
    pub compact_at: f64,
    /// Keep the results of this many most recent rounds whole; older ones are cleared to a
    /// stub (default 8; 0: never clear).
    pub keep_rounds: u32,
    /// Spill a tool result longer than this many bytes (default 16 KiB; `None`: never).
    pub spill_over: Option<usize>,
    /// Bytes of a spilled result shown at its head and again at its tail (default 1 KiB).
    pub spill_preview: usize,
    /// Whether to compact at all (default true).
    pub compact: bool,
    /// Hand the stages the provider's API does itself to it (see the [module docs](self);
    /// default true).
    pub native: bool,
    /// What the provider's API does itself, as the model's adapter declared it when the agent
    /// was built ([`crate::model::Model::native_context`]); not read from a configuration.
    #[serde(skip)]
    pub provider: NativeSupport,
}

impl Default for ContextPolicy {
    fn default() -> Self {
        ContextPolicy {
            window: None,
            compact_at: 0.8,
            keep_rounds: 8,
            spill_over: Some(16 * 1024),
            spill_preview: 1024,
            compact: true,
            native: true,
            provider: NativeSupport::default(),
        }
    }
}

impl ContextPolicy {
    /// A policy that does nothing: no spill, no clearing, no compaction.
    pub fn off() -> Self {
        ContextPolicy {
            window: None,
            compact_at: 1.0,
            keep_rounds: 0,
            spill_over: None,
            spill_preview: 0,
            compact: false,
            native: false,
            provider: NativeSupport::default(),
        }
    }

    /// The token count past which the next request starts a compaction, when the window is
    /// known.
    pub fn threshold(&self) -> Option<u64> {
        let window = self.window?;
        let share = if self.compact_at.is_finite() {
            self.compact_at.clamp(0.05, 1.0)
        } else {
            0.8
        };
        Some(((window as f64) * share) as u64)
    }

    /// Whether the provider clears old tool results (the machine does not).
    pub fn native_clears(&self) -> bool {
        self.native && self.provider.clear_tool_results && self.keep_rounds > 0
    }

    /// Whether the provider compacts at the threshold (the machine does not, on its estimate).
    pub fn native_compacts(&self) -> bool {
        self.native && self.provider.compaction && self.compact && self.threshold().is_some()
    }

    /// What a request asks of the provider itself, if anything (see the [module docs](self)).
    pub fn native_request(&self) -> Option<NativeContext> {
        // Keeps the results of the last `keep_rounds` calls; a machine refines that to its
        // batches ([`crate::engine::Machine::native_request`]).
        let clear_tool_results = self.native_clears().then(|| NativeClear {
            trigger_tokens: self.threshold().map(|t| (t / 2).max(1)),
            keep_tool_uses: self.keep_rounds,
            clear_at_least_tokens: None,
        });
        let compact_at_tokens = if self.native_compacts() {
            self.threshold()
        } else {
            None
        };
        let request = NativeContext {
            clear_tool_results,
            compact_at_tokens,
        };
        (!request.is_empty()).then_some(request)
    }

    /// Checks the figures: `compact_at` in (0, 1], a window above 0, a preview that leaves
    /// something to spill.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.compact_at > 0.0 && self.compact_at <= 1.0) {
            return Err(format!(
                "compact_at is {}; it is a share of the window, above 0 and at most 1",
                self.compact_at
            ));
        }
        if self.window == Some(0) {
            return Err("the context window is 0 tokens; it must be above 0".into());
        }
        if let Some(over) = self.spill_over
            && over < 2 * self.spill_preview.max(1)
        {
            return Err(format!(
                "spill_over ({over} bytes) must be at least twice spill_preview ({} bytes)",
                self.spill_preview
            ));
        }
        Ok(())
    }
}

/// The stub that replaces a cleared result.
pub fn cleared_stub(name: &str, call_id: &str, bytes: usize) -> String {
    // Built piece by piece at its exact length: one allocation per cleared result, no
    // formatting machinery (a batch clears many).
    let name = crate::result::shorten(name, crate::result::ECHO_CHARS);
    let call_id = crate::result::shorten(call_id, crate::result::ECHO_CHARS);
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = bytes;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let digits = &digits[at..];
    let pieces = [
        "[result of `",
        &name,
        "` (call ",
        &call_id,
        ") cleared from the context to save space: ",
    ];
    let mut stub = String::with_capacity(
        pieces.iter().map(|p| p.len()).sum::<usize>() + digits.len() + " bytes]".len(),
    );
    for p in pieces {
        stub.push_str(p);
    }
    // ASCII digits, one `char` each.
    stub.extend(digits.iter().map(|&d| char::from(d)));
    stub.push_str(" bytes]");
    stub
}

/// The length in bytes of [`cleared_stub`]`(name, call_id, bytes)`, counted without building
/// it: whether clearing a result makes it shorter is known before anything is allocated.
pub fn cleared_stub_len(name: &str, call_id: &str, bytes: usize) -> usize {
    STUB_FIXED
        + shortened_len(name, crate::result::ECHO_CHARS)
        + shortened_len(call_id, crate::result::ECHO_CHARS)
        + decimal_len(bytes)
}

/// The digits of `n` in decimal.
fn decimal_len(n: usize) -> usize {
    crate::context::estimate::decimal_len(n as u64) as usize
}

/// The length of [`cleared_stub`]`(name, call_id, bytes)` when it is shorter than the
/// `bytes` of the result it would replace (clearing the result saves something), else `None`.
/// A result no longer than the shortest stub is known not to shrink at once.
pub fn shorter_stub_len(name: &str, call_id: &str, bytes: usize) -> Option<usize> {
    if bytes <= STUB_FIXED + 1 {
        return None;
    }
    let len = cleared_stub_len(name, call_id, bytes);
    (len < bytes).then_some(len)
}

/// The bytes of every stub besides the name, the call id and the digits of the size.
const STUB_FIXED: usize =
    "[result of `` (call ) cleared from the context to save space:  bytes]".len();

/// The length of [`crate::result::shorten`]`(text, max_chars)`, counted without building it.
fn shortened_len(text: &str, max_chars: usize) -> usize {
    // No more bytes than `max_chars`: no more characters either, and nothing is cut.
    if text.len() <= max_chars {
        return text.len();
    }
    match text.char_indices().nth(max_chars) {
        None => text.len(),
        Some((end, _)) => {
            let rest = text[end..].chars().count();
            // `…[{rest} more characters]`
            end + "…[".len() + decimal_len(rest) + " more characters]".len()
        }
    }
}

/// What the model reads of a spilled result: its first and last `preview` bytes (cut at
/// character boundaries) and how to read the rest.
pub fn spilled_preview(content: &str, call_id: &str, preview: usize) -> String {
    let head_end = floor_boundary(content, preview);
    let tail_start = ceil_boundary(content, content.len().saturating_sub(preview)).max(head_end);
    let omitted = tail_start - head_end;
    format!(
        "{}\n[… {omitted} of {} bytes not shown. The whole result is kept: read it with \
         {READ_RESULT}(handle=\"{call_id}\", offset, limit), offsets in bytes …]\n{}",
        &content[..head_end],
        content.len(),
        &content[tail_start..]
    )
}

/// The part of a spilled result that a `read_result` call asks for: `limit` bytes (at most
/// [`READ_RESULT_MAX`]) from byte `offset`, cut at character boundaries, with a header saying
/// which bytes they are.
pub fn read_page(content: &str, offset: usize, limit: usize) -> String {
    let start = ceil_boundary(content, offset.min(content.len()));
    let end = floor_boundary(
        content,
        start.saturating_add(limit.clamp(1, READ_RESULT_MAX)),
    )
    .max(start);
    format!(
        "[bytes {start}..{end} of {}{}]\n{}",
        content.len(),
        if end < content.len() {
            format!("; read on from offset {end}")
        } else {
            "; the end".to_string()
        },
        &content[start..end]
    )
}

/// The largest character boundary at or below `at`.
fn floor_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary at or above `at`.
fn ceil_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// The JSON Schema of `read_result`'s arguments.
pub fn read_result_spec() -> crate::model::ToolSpec {
    crate::model::ToolSpec {
        name: READ_RESULT.to_string(),
        description: "Read part of a tool result that was too long to show whole. The handle \
                      is the one given where the result was cut (the call's id); offset and \
                      limit are in bytes."
            .to_string(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {
                "handle": {"type": "string", "description": "The handle of the cut result."},
                "offset": {"type": "integer", "minimum": 0, "description": "First byte to read (default 0)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Bytes to read (default and most: 16384)."}
            },
            "required": ["handle"],
            "additionalProperties": false
        }),
    }
}

/// The conversation to summarise as one text (each message on its own lines, tool calls with
/// their arguments, results), at most about `max_bytes` long: each tool result is cut to its
/// share of half of `max_bytes` (its head and tail kept; every call and result keeps its line),
/// cut further (down to its line alone) while the whole is too long, and when the whole is
/// still longer, its middle is cut (the task at the start and the latest work at the end are
/// what the summary needs most).
pub fn render_for_summary(messages: &[crate::message::Message], max_bytes: usize) -> String {
    use crate::message::Message;
    let results = messages
        .iter()
        .filter(|m| matches!(m, Message::Tool(_)))
        .count()
        .max(1);
    let share = (max_bytes / 2 / results).clamp(160, 8192);
    let mut out = String::new();
    for per_result in [share, 64, 0] {
        out = render_with(messages, per_result);
        if out.len() <= max_bytes {
            return out;
        }
    }
    let half = max_bytes / 2;
    let head = floor_boundary(&out, half);
    let tail = ceil_boundary(&out, out.len() - half).max(head);
    format!(
        "{}\n[… {} bytes of the conversation cut …]\n{}",
        &out[..head],
        tail - head,
        &out[tail..]
    )
}

/// [`render_for_summary`] with each tool result cut to `per_result` bytes.
fn render_with(messages: &[crate::message::Message], per_result: usize) -> String {
    use crate::message::Message;
    let mut out = String::new();
    for m in messages {
        match m {
            Message::System { content } => {
                out.push_str("[system]\n");
                out.push_str(content);
            }
            Message::User { content, images } => {
                out.push_str("[user]\n");
                out.push_str(content);
                if !images.is_empty() {
                    out.push_str(&format!("\n({} images)", images.len()));
                }
            }
            Message::Assistant(a) => {
                out.push_str("[assistant]");
                if let Some(text) = &a.text {
                    out.push('\n');
                    out.push_str(text);
                }
                for call in &a.tool_calls {
                    let args = match &call.invalid_arguments {
                        Some(raw) => raw.clone(),
                        None => call.arguments.to_string(),
                    };
                    out.push_str(&format!("\n[tool call {} {}] {args}", call.id, call.name));
                }
            }
            Message::Tool(r) => {
                out.push_str(&format!("[tool result {} {}", r.call_id, r.name));
                out.push_str(if r.is_error { ", error]\n" } else { "]\n" });
                if r.content.len() > per_result {
                    let head = floor_boundary(&r.content, per_result / 2);
                    let tail =
                        ceil_boundary(&r.content, r.content.len() - per_result / 2).max(head);
                    out.push_str(&r.content[..head]);
                    out.push_str(&format!(" [… {} bytes cut …] ", tail - head));
                    out.push_str(&r.content[tail..]);
                } else {
                    out.push_str(&r.content);
                }
            }
        }
        out.push_str("\n\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stub is what the model has always been sent for a cleared result (a request's
    /// bytes must not change): byte counts of every width, long and non-ASCII names and ids
    /// shortened as before.
    #[test]
    fn cleared_stub_is_the_documented_line() {
        let long = "é".repeat(80);
        let (at_cap, past_cap) = ("x".repeat(64), "x".repeat(65));
        let mixed = format!("{}{}", "é".repeat(40), "y".repeat(30));
        for (name, id, bytes) in [
            (at_cap.as_str(), past_cap.as_str(), 7usize),
            (mixed.as_str(), "é", 1_000),
            ("echo", "call_7", 0usize),
            ("read_file", "call_abc", 9),
            ("read_file", "call_abc", 10),
            ("grep", "c", 123_456_789),
            (long.as_str(), long.as_str(), usize::MAX),
            ("", "", 1),
        ] {
            let expected = format!(
                "[result of `{}` (call {}) cleared from the context to save space: {bytes} bytes]",
                crate::result::shorten(name, crate::result::ECHO_CHARS),
                crate::result::shorten(id, crate::result::ECHO_CHARS),
            );
            let stub = cleared_stub(name, id, bytes);
            assert_eq!(stub, expected);
            assert_eq!(stub.capacity(), stub.len(), "built at its exact length");
            assert_eq!(cleared_stub_len(name, id, bytes), stub.len());
            // Whether a result of about the stub's length shrinks, at every length near it.
            for result in stub.len().saturating_sub(2)..stub.len() + 2 {
                let shrinks = cleared_stub(name, id, result).len() < result;
                assert_eq!(
                    shorter_stub_len(name, id, result),
                    shrinks.then(|| cleared_stub(name, id, result).len()),
                    "{name:?} {id:?} {result}"
                );
            }
        }
        assert_eq!(
            cleared_stub("echo", "call_7", 42),
            "[result of `echo` (call call_7) cleared from the context to save space: 42 bytes]"
        );
    }

    #[test]
    fn previews_and_pages_cut_at_character_boundaries() {
        let content = "é".repeat(100); // 200 bytes
        let p = spilled_preview(&content, "call_1", 11);
        assert!(p.starts_with(&"é".repeat(5)), "{p}");
        assert!(p.contains("read_result(handle=\"call_1\""), "{p}");
        assert!(p.contains("of 200 bytes"), "{p}");
        let page = read_page(&content, 1, 5);
        assert!(page.starts_with("[bytes 2..6 of 200; read on from offset 6]\n"));
        assert!(read_page(&content, 190, 100).ends_with(&"é".repeat(5)));
        assert!(read_page(&content, 1_000, 10).starts_with("[bytes 200..200 of 200; the end]"));
    }

    #[test]
    fn policies_are_checked() {
        assert!(ContextPolicy::default().validate().is_ok());
        assert!(ContextPolicy::off().validate().is_ok());
        for bad in [
            ContextPolicy {
                compact_at: 0.0,
                ..Default::default()
            },
            ContextPolicy {
                compact_at: f64::NAN,
                ..Default::default()
            },
            ContextPolicy {
                window: Some(0),
                ..Default::default()
            },
            ContextPolicy {
                spill_over: Some(100),
                spill_preview: 100,
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let p = ContextPolicy {
            window: Some(10_000),
            ..Default::default()
        };
        assert_eq!(p.threshold(), Some(8_000));
    }

    #[test]
    fn a_long_rendering_keeps_its_ends() {
        let messages = vec![
            crate::message::Message::user(format!("TASK {}", "x".repeat(5_000))),
            crate::message::Message::user(format!("{} LAST", "y".repeat(5_000))),
        ];
        let r = render_for_summary(&messages, 1_000);
        assert!(r.len() < 1_100, "{}", r.len());
        assert!(
            r.starts_with("[user]\nTASK") && r.trim_end().ends_with("LAST"),
            "{r}"
        );
    }
}
