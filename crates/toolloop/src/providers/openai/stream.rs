//! Streamed responses: `chat.completion.chunk` events decoded into [`StreamEvent`]s.

use super::config::PROVIDER;
use super::error::{api_error_from_value, preview};
use super::in_place::Fields;
use super::response::typed::{Few, WireUsage};
use super::response::{
    arguments_text, content_text, map_finish, parse_usage, settle_finish, usage_of,
};
use crate::message::ProviderPart;
use crate::model::{FinishReason, ModelError};
use crate::providers::adapter::SseDecode;
use crate::ptk::Rescue;
use crate::stream::StreamEvent;
use crate::transport::sse::SseEvent;
use serde_json::{Value, json};
use std::borrow::Cow;

/// One tool call being streamed.
#[derive(Debug)]
pub(super) struct Slot {
    /// The server's `index`, when it sent one.
    wire: Option<u64>,
    /// The first non-empty id.
    id: Option<String>,
    has_name: bool,
}

/// Reads a Chat Completions SSE stream and emits normalized [`StreamEvent`]s: our tool-call
/// indices count from 0 in order of first appearance, whatever the server's indices were.
#[derive(Debug)]
pub(crate) struct ChunkDecoder {
    /// HTTP status, reported with an in-stream error.
    status: u16,
    slots: Vec<Slot>,
    /// The choice followed (the first one seen).
    choice: Option<u64>,
    finish: Option<FinishReason>,
    reasoning: String,
    refusal: String,
    /// The text-call rescue, when on for this request.
    pub(super) rescue: Option<Rescue>,
    /// `[DONE]` or the end was reached and the closing events emitted.
    done: bool,
    /// Whether any SSE event came.
    seen: bool,
    /// Every chunk takes the value path (to check that both paths agree).
    value_only: bool,
    /// The members every chunk repeats before the ones read, skipped after the first chunk.
    head: Head,
    /// The last chunk read that held only a piece of text or of arguments, around that piece.
    frame: Frame,
    /// Chunks read through the typed path (to check that the usual ones take it).
    #[cfg(test)]
    typed_chunks: usize,
    /// Chunks read through the [`Frame`] of the chunk before them.
    #[cfg(test)]
    framed_chunks: usize,
    /// Every chunk is read whole, never through a [`Frame`] (to check that frames change
    /// nothing).
    #[cfg(test)]
    no_frames: bool,
    /// Chunks read through the typed path without their head (see [`Head`]).
    #[cfg(test)]
    headless_chunks: usize,
}

impl ChunkDecoder {
    pub(super) fn new(status: u16) -> Self {
        ChunkDecoder {
            status,
            slots: Vec::new(),
            choice: None,
            finish: None,
            reasoning: String::new(),
            refusal: String::new(),
            rescue: None,
            done: false,
            seen: false,
            value_only: false,
            head: Head::default(),
            frame: Frame::default(),
            #[cfg(test)]
            typed_chunks: 0,
            #[cfg(test)]
            framed_chunks: 0,
            #[cfg(test)]
            no_frames: false,
            #[cfg(test)]
            headless_chunks: 0,
        }
    }

    /// A decoder that reads every chunk as a JSON value, never through the typed path.
    #[cfg(test)]
    fn value_only(status: u16) -> Self {
        ChunkDecoder {
            value_only: true,
            ..ChunkDecoder::new(status)
        }
    }

    /// The value path's delta (a `delta` or `message` object of a chunk's choice).
    fn delta(&mut self, d: &Value, out: &mut Vec<StreamEvent>) {
        if let Some(t) = content_text(d.get("content")) {
            self.text(&t, out);
        }
        if let Some(r) = d.get("reasoning_content").and_then(Value::as_str) {
            self.reasoning.push_str(r);
        }
        if let Some(r) = d.get("refusal").and_then(Value::as_str) {
            self.refusal.push_str(r);
        }
        if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
            for tc in calls {
                let f = tc.get("function");
                let wire = tc
                    .get("index")
                    .and_then(Value::as_u64)
                    .or_else(|| f.and_then(|f| f.get("index")).and_then(Value::as_u64));
                let id = tc.get("id").and_then(Value::as_str);
                let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                let args = arguments_text(f.and_then(|f| f.get("arguments")));
                let extra = tc.get("extra_content").filter(|x| !x.is_null()).cloned();
                self.tool_delta(wire, id, name, Cow::Owned(args), extra, out);
            }
        }
    }

    /// A piece of text (through the rescue when it is on). Text that follows text among the
    /// events of one read joins it: one event, one string.
    fn text(&mut self, t: &str, out: &mut Vec<StreamEvent>) {
        if t.is_empty() {
            return;
        }
        match self.rescue.as_mut() {
            Some(rescue) => rescue.push_into(t, out),
            None => match out.last_mut() {
                Some(StreamEvent::TextDelta(text)) => text.push_str(t),
                _ => out.push(StreamEvent::TextDelta(t.to_string())),
            },
        }
    }

    /// Whether a choice with this index is the one followed (the first one seen).
    fn follows(&mut self, index: u64) -> bool {
        *self.choice.get_or_insert(index) == index
    }

    /// One tool call's delta: its wire index, id, name, argument text and `extra_content`.
    /// Argument text that follows the same call's argument text among the events of one read
    /// joins it: one event, one string, however many pieces the server cut it into.
    fn tool_delta(
        &mut self,
        wire: Option<u64>,
        id: Option<&str>,
        name: Option<&str>,
        args: Cow<'_, str>,
        extra: Option<Value>,
        out: &mut Vec<StreamEvent>,
    ) {
        let id = id.filter(|s| !s.is_empty());
        let name = name.filter(|s| !s.is_empty());
        let (index, is_new) = self.slot_for(wire, id, name.is_some());
        let slot = &mut self.slots[index];
        let new_id = slot.id.is_none() && id.is_some();
        let new_name = !slot.has_name && name.is_some();
        if is_new || new_id || new_name {
            out.push(StreamEvent::ToolCallStart {
                index,
                id: id.map(str::to_string),
                name: name.unwrap_or_default().to_string(),
            });
            if new_id {
                slot.id = id.map(str::to_string);
            }
            slot.has_name |= name.is_some();
        }
        if !args.is_empty() {
            match out.last_mut() {
                Some(StreamEvent::ToolCallDelta {
                    index: last,
                    arguments,
                }) if *last == index => arguments.push_str(&args),
                _ => out.push(StreamEvent::ToolCallDelta {
                    index,
                    arguments: args.into_owned(),
                }),
            }
        }
        if let Some(x) = extra {
            out.push(StreamEvent::ToolCallData {
                index,
                data: json!({"extra_content": x}),
            });
        }
    }

    /// Reads the chunk in `text` through the typed path, if it is of the usual shape; whether
    /// it was.
    fn typed(&mut self, text: &str, out: &mut Vec<StreamEvent>) -> bool {
        if self.framed(text, out) {
            #[cfg(test)]
            {
                self.typed_chunks += 1;
                self.framed_chunks += 1;
            }
            return true;
        }
        let mut chunk = typed::Chunk::default();
        if !typed::parse(text, &mut chunk) {
            return false;
        }
        #[cfg(test)]
        {
            self.typed_chunks += 1;
        }
        self.frame.learn(text, &chunk);
        self.typed_chunk(&mut chunk, out);
        true
    }

    /// Reads the chunk in `text` through the [`Frame`], if it is the frame's chunk with another
    /// string in its place; whether it was. The events are those [`ChunkDecoder::typed_chunk`]
    /// gives for the chunk: the frame's piece, with this chunk's string.
    fn framed(&mut self, text: &str, out: &mut Vec<StreamEvent>) -> bool {
        #[cfg(test)]
        if self.no_frames {
            return false;
        }
        let Some(piece) = self.frame.piece else {
            return false;
        };
        let Some(value) = self.frame.string_of(text) else {
            return false;
        };
        if self.follows(self.frame.choice) {
            match piece {
                Piece::Text => self.text(&value, out),
                Piece::Arguments { wire } => self.tool_delta(wire, None, None, value, None, out),
            }
        }
        true
    }

    /// A chunk of the usual shape, read through typed, borrowing structures: the same events
    /// as [`ChunkDecoder::value_chunk`] gives for it. Owned strings are taken, not copied.
    fn typed_chunk(&mut self, chunk: &mut typed::Chunk<'_>, out: &mut Vec<StreamEvent>) {
        if let Some(u) = chunk.usage() {
            out.push(StreamEvent::Usage(u));
        }
        let choices = &mut chunk.choices;
        for choice in choices.first.iter_mut().chain(&mut choices.rest) {
            if !self.follows(choice.index.unwrap_or(0)) {
                continue;
            }
            if let Some(delta) = &mut choice.delta {
                if let Some(t) = &delta.content {
                    self.text(t, out);
                }
                if let Some(r) = &delta.reasoning_content {
                    self.reasoning.push_str(r);
                }
                if let Some(r) = &delta.refusal {
                    self.refusal.push_str(r);
                }
                let calls = &mut delta.tool_calls;
                for call in calls.first.iter_mut().chain(&mut calls.rest) {
                    let f = call.function.as_mut();
                    let wire = call.index.or_else(|| f.as_ref().and_then(|f| f.index));
                    let (name, args) = match f {
                        Some(f) => (f.name.as_deref(), f.arguments.take()),
                        None => (None, None),
                    };
                    self.tool_delta(
                        wire,
                        call.id.as_deref(),
                        name,
                        args.unwrap_or_default(),
                        call.extra_content.take(),
                        out,
                    );
                }
            }
            if let Some(f) = &choice.finish_reason {
                self.finish = Some(map_finish(f));
            }
        }
    }

    /// Any chunk, read as a JSON value: every quirk, and errors inside the stream.
    fn value_chunk(
        &mut self,
        ev: &SseEvent,
        data: &str,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), ModelError> {
        // A 2xx stream with an event that is not JSON was corrupted or cut short on the way:
        // as retryable as a broken connection (never replayed once output was delivered).
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::Transport {
            message: format!(
                "a stream event is not JSON ({e}); expected a chat.completion.chunk object, \
                 got: {}",
                preview(data)
            ),
            retryable: true,
        })?;
        let has_error = v.get("error").is_some_and(|e| !e.is_null());
        if has_error || ev.event.as_deref() == Some("error") {
            if self.finish.is_none() {
                return Err(ModelError::Api(api_error_from_value(self.status, &v, None)));
            }
            // After a finish_reason, an error chunk only restates why the generation ended
            // (OpenRouter's "Token limit reached" after `length`); its usage still counts.
            tracing::debug!(chunk = %preview(data), "error chunk after the finish, ignored");
        }
        if let Some(u) = usage_of(&v) {
            out.push(StreamEvent::Usage(u));
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            for c in choices {
                let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                if !self.follows(idx) {
                    continue;
                }
                if let Some(delta) = c.get("delta").or_else(|| c.get("message")) {
                    self.delta(delta, out);
                }
                if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                    self.finish = Some(map_finish(f));
                }
            }
        }
        Ok(())
    }

    /// The call a delta belongs to, and whether it is new.
    fn slot_for(&mut self, wire: Option<u64>, id: Option<&str>, has_name: bool) -> (usize, bool) {
        let found = match wire {
            // The latest call with this index, unless the delta brings a different id (servers
            // that give every parallel call the same index).
            Some(w) => self
                .slots
                .iter()
                .rposition(|s| s.wire == Some(w))
                .filter(|&p| match (id, &self.slots[p].id) {
                    (Some(new), Some(old)) => new == old,
                    _ => true,
                }),
            None => match id {
                Some(id) => self.slots.iter().rposition(|s| s.id.as_deref() == Some(id)),
                // No index and no id: a continuation of the last call, unless it names a tool
                // again while the last call already has its name.
                None => self
                    .slots
                    .len()
                    .checked_sub(1)
                    .filter(|&last| !(has_name && self.slots[last].has_name)),
            },
        };
        match found {
            Some(p) => (p, false),
            None => {
                self.slots.push(Slot {
                    wire,
                    id: None,
                    has_name: false,
                });
                (self.slots.len() - 1, true)
            }
        }
    }

    /// The closing events: parts, call ends, the finish reason.
    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        if self.done {
            return;
        }
        self.done = true;
        for (field, text) in [
            ("reasoning_content", std::mem::take(&mut self.reasoning)),
            ("refusal", std::mem::take(&mut self.refusal)),
        ] {
            if !text.is_empty() {
                out.push(StreamEvent::Part(ProviderPart {
                    provider: PROVIDER.into(),
                    data: json!({ field: text }),
                }));
            }
        }
        let mut rescued = 0;
        if let Some(rescue) = self.rescue.take() {
            let (events, n) = rescue.finish(!self.slots.is_empty());
            out.extend(events);
            rescued = n;
        }
        for index in 0..self.slots.len() {
            out.push(StreamEvent::ToolCallEnd { index });
        }
        out.push(StreamEvent::Finish(settle_finish(
            self.finish,
            !self.slots.is_empty() || rescued > 0,
        )));
    }
}

impl SseDecode for ChunkDecoder {
    /// Reads the event as [`SseDecode::event_mut`] does, on a copy (the reader lends events
    /// mutably; this is for a caller that cannot).
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        self.event_mut(&mut ev.clone(), out)
    }

    /// Reads one event. A chunk that starts with the stream's [`Head`] is read without it, in
    /// place: the `,` that ends the head becomes a `{` for the reading, and a `,` again after
    /// it (the value path, if it is to read the chunk, reads it whole).
    fn event_mut(
        &mut self,
        ev: &mut SseEvent,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), ModelError> {
        self.seen = true;
        if self.done {
            return Ok(());
        }
        // `ev.data[start..end]`: the data without the whitespace around it.
        let end = ev.data.trim_end().len();
        let start = end - ev.data[..end].trim_start().len();
        let data = &ev.data[start..end];
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.end(out);
            return Ok(());
        }
        // The usual chunk takes the typed path; anything else (an error, an odd shape) the
        // value path, which gives the same events for every chunk the typed path reads.
        if !self.value_only && ev.event.as_deref() != Some("error") {
            // A chunk that starts with the head is read without it, in the event's own string:
            // the head's `,` made a `{` at `at`. Both are ASCII, so the string stays text and
            // nothing needs checking again.
            let at = start + self.head.len.saturating_sub(1);
            let headless = self.head.starts(data);
            let from = if headless {
                ev.data.replace_range(at..at + 1, "{");
                at
            } else {
                start
            };
            // From an ASCII byte to the end of the data: always whole characters.
            let read = self.typed(&ev.data[from..end], out);
            if headless {
                #[cfg(test)]
                {
                    self.headless_chunks += usize::from(read);
                }
                ev.data.replace_range(at..at + 1, ",");
            }
            if read {
                if !self.head.learned {
                    self.head.learn(&ev.data[start..end]);
                }
                return Ok(());
            }
        }
        self.value_chunk(ev, &ev.data[start..end], out)
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if !self.done {
            if !self.seen {
                return Err(super::error::empty_stream());
            }
            if self.finish.is_none() {
                return Err(ModelError::Transport {
                    message: "the stream ended before the response was complete (no \
                              finish_reason and no [DONE] marker)"
                        .into(),
                    retryable: true,
                });
            }
            self.end(out);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// The members every chunk of a stream repeats before the ones the decoder reads
/// (`"id":…,"object":"chat.completion.chunk","created":…,"model":…,`): learned from the first
/// chunk read through the typed path, and not read again in the later chunks that start with the
/// same bytes, which are read as `{` and the rest.
///
/// That reads a chunk as reading it whole does: the head holds only members of fields the decoder
/// does not know (skipped unread either way), each a key and a string without escapes or a plain
/// token, read whole and found sound in the chunk the head was learned from; and a chunk is read
/// without its head only when what follows the head opens another member (a `"`), so that `{`
/// and the rest is an object exactly when the whole chunk is one.
#[derive(Debug)]
struct Head {
    /// `bytes[..len]`: the head, from the opening `{` to the `,` after its last member.
    bytes: [u8; HEAD_MAX],
    len: usize,
    /// Whether a chunk was looked at for the head (the first one read through the typed path).
    learned: bool,
}

/// A chunk that held only one piece of text or of one call's arguments (one choice, no finish
/// reason, no usage, a delta with only `content`, or only one call with only its index and
/// `function.arguments`), kept around that piece, so that a chunk that differs from it only in
/// the piece's string is read by reading that string alone. Streams send such chunks one after
/// another: each piece of a reply's text, or of one call's arguments, in the same frame.
///
/// That reads a chunk as reading it whole does. The frame is the chunk's text up to the
/// string's opening quote and from its closing quote, the string's place known from the reading
/// itself (the text of the value read, borrowed from the chunk). A chunk that starts with the
/// first part and ends with the second, with between them (quotes included) exactly one JSON
/// string, read as the reading reads a string, is read by JSON's grammar as the frame's chunk
/// with that string in its place: the same members, in the same order, with the same values
/// but that one, so the same events with that string.
#[derive(Debug, Default)]
struct Frame {
    /// The chunk's text up to the string's opening quote, included (`bytes[..split]`), then
    /// from its closing quote, included (`bytes[split..]`).
    bytes: Vec<u8>,
    split: usize,
    /// What the string is; `None` until a frame is learned.
    piece: Option<Piece>,
    /// The chunk's choice index (0 when it has none).
    choice: u64,
}

/// What a [`Frame`]'s string is.
#[derive(Debug, Clone, Copy)]
enum Piece {
    /// A piece of the reply's text.
    Text,
    /// A piece of the arguments of the call with this index (the call's, else its function's).
    Arguments { wire: Option<u64> },
}

impl Frame {
    /// Keeps `chunk`, read from `text`, as the frame, if it holds only one piece.
    fn learn(&mut self, text: &str, chunk: &typed::Chunk<'_>) {
        let Some((choice, piece, raw)) = chunk.single_piece() else {
            return;
        };
        // Where the string's text lies in `text` (it is borrowed from it).
        let start = (raw.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
        let Some(end) = start
            .checked_add(raw.len())
            .filter(|&end| end <= text.len())
        else {
            return;
        };
        if raw.len() < 2 || !raw.starts_with('"') || !raw.ends_with('"') {
            return;
        }
        let text = text.as_bytes();
        self.bytes.clear();
        self.bytes.extend_from_slice(&text[..start + 1]);
        self.bytes.extend_from_slice(&text[end - 1..]);
        self.split = start + 1;
        self.piece = Some(piece);
        self.choice = choice;
    }

    /// The string in the frame's place in the chunk in `text`, if `text` is the frame's chunk
    /// with exactly one JSON string in that place.
    fn string_of<'a>(&self, text: &'a str) -> Option<Cow<'a, str>> {
        let (head, tail) = self.bytes.split_at(self.split);
        let bytes = text.as_bytes();
        if bytes.len() < head.len() + tail.len()
            || !bytes.starts_with(head)
            || !bytes.ends_with(tail)
        {
            return None;
        }
        // From the head's last byte, the opening quote, to the tail's first, the closing one.
        let token = text.get(head.len() - 1..text.len() - tail.len() + 1)?;
        typed::string_token(token)
    }
}

/// The longest head kept (a longer one is kept up to the end of a member before this length).
const HEAD_MAX: usize = 256;

impl Default for Head {
    fn default() -> Self {
        Head {
            bytes: [0; HEAD_MAX],
            len: 0,
            learned: false,
        }
    }
}

impl Head {
    /// Learns the head of `data`, a chunk the typed path read.
    fn learn(&mut self, data: &str) {
        self.learned = true;
        let len = head_len(data.as_bytes(), typed::Chunk::NAMES, HEAD_MAX);
        self.bytes[..len].copy_from_slice(&data.as_bytes()[..len]);
        self.len = len;
    }

    /// Whether the chunk in `data` starts with the head, followed by another member.
    fn starts(&self, data: &str) -> bool {
        let len = self.len;
        len > 0
            && data.as_bytes().get(..len) == Some(&self.bytes[..len])
            && data.as_bytes()[len..]
                .iter()
                .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
                == Some(&b'"')
    }
}

/// The length of the head of the chunk in `data`: from its `{` to the `,` after the last of the
/// members that open it whose keys are not in `known`, each a key and a value that are strings
/// without escapes or control characters, or a plain token (a number, `true`, `false`, `null`),
/// with no whitespace, and that end within `max` bytes. 0 when there is no such member.
fn head_len(data: &[u8], known: &[&str], max: usize) -> usize {
    if data.first() != Some(&b'{') {
        return 0;
    }
    let mut end = 0;
    let mut at = 1;
    loop {
        let Some(key_end) = plain_string(data, at) else {
            return end;
        };
        let key = &data[at + 1..key_end - 1];
        if known.iter().any(|k| k.as_bytes() == key) || data.get(key_end) != Some(&b':') {
            return end;
        }
        let value = key_end + 1;
        let value_end = match data.get(value) {
            Some(b'"') => plain_string(data, value),
            Some(_) => token(data, value),
            None => None,
        };
        match value_end {
            Some(value_end) if value_end < max && data.get(value_end) == Some(&b',') => {
                end = value_end + 1;
                at = end;
            }
            _ => return end,
        }
    }
}

/// The end (past its closing quote) of the string that opens at `at`, if it holds no escape and
/// no control character.
fn plain_string(data: &[u8], at: usize) -> Option<usize> {
    if data.get(at) != Some(&b'"') {
        return None;
    }
    let body = &data[at + 1..];
    let close = memchr::memchr2(b'"', b'\\', body)?;
    (body[close] == b'"' && body[..close].iter().all(|&b| b >= 0x20)).then_some(at + 1 + close + 1)
}

/// The end of the plain token (a number, `true`, `false`, `null`) that starts at `at`, if any.
fn token(data: &[u8], at: usize) -> Option<usize> {
    let len = data[at..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
        .count();
    (len > 0).then_some(at + len)
}

/// The usual `chat.completion.chunk`, read without building a JSON value: strings borrowed
/// from the event where they hold no escape. A field of another type than these (content as an
/// array of parts, arguments as an object, a fractional count), a repeated field, a `message`
/// in place of a `delta`, or an error makes [`typed::parse`] give `false`, and the chunk goes the
/// value path.
///
/// The chunk is read in place (see [`in_place`](super::super::in_place)): a choice into the
/// chunk's `choices`, a call into the delta's `tool_calls`; `null` for any field counts as
/// absent.
mod typed {
    use super::super::in_place::{self, Array, Fields, Object, Str};
    use super::super::response::typed::opt_str;
    use super::{Few, Value, WireUsage, parse_usage};
    use crate::usage::Usage;
    use serde::Deserialize;
    use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess};
    use serde_json::value::RawValue;
    use std::borrow::Cow;

    #[derive(Default)]
    pub(super) struct Chunk<'a> {
        /// A non-null `error`.
        error: bool,
        /// `choices` (absent or `null`: none).
        pub(super) choices: Few<Choice<'a>>,
        usage: Option<WireUsage>,
        x_groq: Option<Value>,
    }

    impl<'a> Chunk<'a> {
        /// The chunk's one piece, when that is all it holds: its choice's index, what the piece
        /// is, and the text of its string value in the chunk (see [`super::Frame`]).
        pub(super) fn single_piece(&self) -> Option<(u64, super::Piece, &'a str)> {
            if self.usage.is_some() || self.x_groq.is_some() || !self.choices.rest.is_empty() {
                return None;
            }
            let choice = self.choices.first.as_ref()?;
            if choice.finish_reason.is_some() || choice.message {
                return None;
            }
            let delta = choice.delta.as_ref()?;
            if delta.reasoning_content.is_some()
                || delta.refusal.is_some()
                || !delta.tool_calls.rest.is_empty()
            {
                return None;
            }
            let index = choice.index.unwrap_or(0);
            match (&delta.content, &delta.tool_calls.first) {
                (Some(_), None) => Some((index, super::Piece::Text, delta.content_raw)),
                (None, Some(call)) => {
                    let f = call.function.as_ref()?;
                    if call.id.is_some()
                        || call.extra_content.is_some()
                        || f.name.is_some()
                        || f.arguments.is_none()
                    {
                        return None;
                    }
                    let wire = call.index.or(f.index);
                    Some((index, super::Piece::Arguments { wire }, f.arguments_raw))
                }
                _ => None,
            }
        }
    }

    impl Chunk<'_> {
        /// The usage (`usage`, else Groq's `x_groq.usage`), as the value path reads it.
        pub(super) fn usage(&self) -> Option<Usage> {
            match (&self.usage, &self.x_groq) {
                (Some(u), _) => u.usage(),
                (None, Some(x)) => x
                    .get("usage")
                    .filter(|u| u.is_object())
                    .and_then(parse_usage),
                (None, None) => None,
            }
        }
    }

    #[derive(Default)]
    pub(super) struct Choice<'a> {
        pub(super) index: Option<u64>,
        pub(super) delta: Option<Delta<'a>>,
        /// A non-null `message`.
        message: bool,
        pub(super) finish_reason: Option<Cow<'a, str>>,
    }

    #[derive(Default)]
    pub(super) struct Delta<'a> {
        pub(super) content: Option<Cow<'a, str>>,
        /// `content` as it lies in the chunk (see [`RawStr`]).
        pub(super) content_raw: &'a str,
        pub(super) reasoning_content: Option<Cow<'a, str>>,
        pub(super) refusal: Option<Cow<'a, str>>,
        /// `tool_calls` (absent or `null`: none).
        pub(super) tool_calls: Few<CallDelta<'a>>,
    }

    #[derive(Default)]
    pub(super) struct CallDelta<'a> {
        pub(super) index: Option<u64>,
        pub(super) id: Option<Cow<'a, str>>,
        pub(super) function: Option<FunctionDelta<'a>>,
        pub(super) extra_content: Option<Value>,
    }

    #[derive(Default)]
    pub(super) struct FunctionDelta<'a> {
        pub(super) index: Option<u64>,
        pub(super) name: Option<Cow<'a, str>>,
        pub(super) arguments: Option<Cow<'a, str>>,
        /// `arguments` as it lies in the chunk (see [`RawStr`]).
        pub(super) arguments_raw: &'a str,
    }

    /// A string or `null`, as [`Str`] reads it, with the value's own text in the input: the
    /// value is skipped as serde_json skips any value, then its text read as [`Str`] reads it.
    /// What either refuses is refused, so a chunk reads as it would through [`Str`] (a string
    /// that only skipping accepts is refused by the reading that follows).
    struct RawStr;

    impl<'de> DeserializeSeed<'de> for RawStr {
        type Value = (Option<Cow<'de, str>>, &'de str);
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            let raw = <&'de RawValue>::deserialize(d)?.get();
            let mut de = serde_json::Deserializer::from_str(raw);
            let value = opt_str(&mut de)
                .and_then(|value| de.end().map(|()| value))
                .map_err(D::Error::custom)?;
            Ok((value, raw))
        }
    }

    /// The value of the JSON string `token` (its quotes included, nothing around it), read as
    /// [`Str`] reads a value: `None` when `token` is not exactly one string.
    pub(super) fn string_token(token: &str) -> Option<Cow<'_, str>> {
        if !token.starts_with('"') {
            return None;
        }
        let mut de = serde_json::Deserializer::from_str(token);
        let value = opt_str(&mut de).ok()?;
        de.end().ok()?;
        value
    }

    impl<'de> Fields<'de> for Chunk<'de> {
        const NAMES: &'static [&'static str] = &["error", "choices", "usage", "x_groq"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.error = map.next_value::<Option<IgnoredAny>>()?.is_some(),
                1 => map.next_value_seed(Array(&mut self.choices))?,
                2 => map.next_value_seed(Object(&mut self.usage))?,
                _ => self.x_groq = map.next_value()?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for Choice<'de> {
        const NAMES: &'static [&'static str] = &["index", "delta", "message", "finish_reason"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.index = map.next_value()?,
                1 => map.next_value_seed(Object(&mut self.delta))?,
                2 => self.message = map.next_value::<Option<IgnoredAny>>()?.is_some(),
                _ => self.finish_reason = map.next_value_seed(Str)?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for Delta<'de> {
        const NAMES: &'static [&'static str] =
            &["content", "reasoning_content", "refusal", "tool_calls"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => (self.content, self.content_raw) = map.next_value_seed(RawStr)?,
                1 => self.reasoning_content = map.next_value_seed(Str)?,
                2 => self.refusal = map.next_value_seed(Str)?,
                _ => map.next_value_seed(Array(&mut self.tool_calls))?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for CallDelta<'de> {
        const NAMES: &'static [&'static str] = &["index", "id", "function", "extra_content"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.index = map.next_value()?,
                1 => self.id = map.next_value_seed(Str)?,
                2 => map.next_value_seed(Object(&mut self.function))?,
                _ => self.extra_content = map.next_value()?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for FunctionDelta<'de> {
        const NAMES: &'static [&'static str] = &["index", "name", "arguments"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.index = map.next_value()?,
                1 => self.name = map.next_value_seed(Str)?,
                _ => (self.arguments, self.arguments_raw) = map.next_value_seed(RawStr)?,
            }
            Ok(())
        }
    }

    /// Reads the chunk in `data` into `chunk` (a default one); `false` when it is not of the
    /// usual shape (or holds an error), then `chunk` is to be dropped.
    pub(super) fn parse<'a>(data: &'a str, chunk: &mut Chunk<'a>) -> bool {
        in_place::parse(data, chunk).is_ok()
            && !chunk.error
            && !chunk.choices.iter().any(|c| c.message)
    }
}

#[cfg(test)]
mod tests {
    use super::super::json_text::JsonText;
    use super::super::response::decode_response;
    use super::super::{decode_recorded, without_ids};
    use super::*;
    use crate::model::{ModelResponse, ToolSpec};
    use crate::providers::Decoded;
    use crate::providers::adapter;
    use proptest::prelude::*;

    fn decode_stream(body: &str) -> Decoded {
        decode_recorded(200, body.as_bytes(), true)
    }

    fn sse(chunks: &[Value]) -> String {
        let mut s = String::new();
        for c in chunks {
            s.push_str(&format!("data: {c}\n\n"));
        }
        s.push_str("data: [DONE]\n\n");
        s
    }

    #[test]
    fn parallel_calls_sharing_one_index_are_told_apart_by_id() {
        let d = decode_stream(&sse(&[
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ]));
        let calls = &d.response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].id.as_str(), calls[0].name.as_str()), ("a", "f"));
        assert_eq!(calls[0].arguments, json!({"x": 1}));
        assert_eq!((calls[1].id.as_str(), calls[1].name.as_str()), ("b", "g"));
    }

    #[test]
    fn calls_without_index_or_id_in_one_delta_stay_apart() {
        let d = decode_stream(&sse(&[json!({"choices":[{"delta":{"tool_calls":[
            {"function":{"name":"f","arguments":{"a":1}}},
            {"function":{"name":"g","arguments":"{\"b\":2}"}}
        ]},"finish_reason":"stop"}]})]));
        let calls = &d.response.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"a": 1}), "object arguments");
        assert_eq!(calls[1].arguments, json!({"b": 2}));
        assert!(calls[0].id.starts_with("call_") && calls[0].id != calls[1].id);
        assert_eq!(
            d.response.finish_reason,
            FinishReason::ToolCalls,
            "stop with calls"
        );
    }

    #[test]
    fn a_stream_cut_short_is_an_error_and_a_refusal_is_kept_apart() {
        let d = decode_recorded(
            200,
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            true,
        );
        assert_eq!(d.response.text.as_deref(), Some("hi"));
        assert!(d.error.unwrap().message.contains("ended before"));

        let d = decode_stream(&sse(&[
            json!({"choices":[{"index":0,"delta":{"refusal":"I can't"}}]}),
            json!({"choices":[{"index":0,"delta":{"refusal":" help."},"finish_reason":"stop"}]}),
        ]));
        assert_eq!(d.response.text, None);
        assert_eq!(
            d.response.parts,
            vec![ProviderPart {
                provider: PROVIDER.into(),
                data: json!({"refusal": "I can't help."})
            }]
        );
        assert_eq!(d.response.finish_reason, FinishReason::Stop);
    }
    const STREAMS: &[&str] = &[
        include_str!("../../../tests/conformance/openai-stream-parallel-two-tools/response.sse"),
        include_str!(
            "../../../tests/conformance/mistral-stream-incremental-empty-name/response.sse"
        ),
        include_str!(
            "../../../tests/conformance/anthropic-compat-stream-tool-index-1/response.sse"
        ),
        include_str!(
            "../../../tests/conformance/openrouter-stream-comments-error-chunk/response.sse"
        ),
        include_str!(
            "../../../tests/conformance/groq-stream-error-event-tool-use-failed/response.sse"
        ),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"18°C — ünïcödé ✓\"},\"finish_reason\":\"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n",
    ];

    /// Decodes `body` fed in the given pieces, as events (so ids made up for missing ones do not
    /// differ between runs).
    fn events_in_pieces(body: &[u8], cuts: &[usize]) -> (Vec<StreamEvent>, Option<String>) {
        let mut d = adapter::SseReader::new(ChunkDecoder::new(200));
        let mut out = Vec::new();
        let mut last = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut result = Ok(());
        for c in cuts.into_iter().chain([body.len()]) {
            result = result.and_then(|()| d.push(&body[last..c], &mut out));
            last = c;
        }
        let result = result.and_then(|()| d.finish(&mut out));
        (out, result.err().map(|e| e.to_string()))
    }

    /// Decodes a stream whose content is `text` cut at `cuts`, with the rescue on for `tools`.
    fn rescued_stream(
        text: &str,
        cuts: &[usize],
        tools: &[ToolSpec],
    ) -> (ModelResponse, Vec<String>) {
        let chars: Vec<char> = text.chars().collect();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain([chars.len()]) {
            if c > last {
                let piece: String = chars[last..c].iter().collect();
                chunks.push(json!({"choices":[{"index":0,"delta":{"content": piece}}]}));
            }
            last = c;
        }
        chunks.push(json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}));
        let body = sse(&chunks);
        let mut decoder = ChunkDecoder::new(200);
        decoder.rescue = Some(Rescue::new(tools));
        let mut reader = adapter::SseReader::new(decoder);
        let mut events = Vec::new();
        reader.push(body.as_bytes(), &mut events).unwrap();
        reader.finish(&mut events).unwrap();
        let deltas = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::TextDelta(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        let mut acc = crate::stream::Accumulator::new();
        events.into_iter().for_each(|e| acc.push(e));
        (acc.finish(), deltas)
    }
    const LEAKED: &[&str] = &[
        "Let me look.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>\n<tool_call>{\"name\": \"read\", \"arguments\": {'path': 'b',}}</tool_call>",
        "[TOOL_CALLS]read[ARGS]{\"path\": \"x\"}",
        "Sure: <PTK_CALL>{\"tool\": \"read\", \"args\": {\"path\": \"é\"}}</PTK_CALL> done.",
        "```json\n{\"name\": \"read\", \"arguments\": {\"path\": \"c\"}}\n```",
        "Use <tool_call> tags, like <tool_call>{oops</tool_call>, to call.",
        "Just text, with a < sign and [brackets].",
    ];

    proptest! {
        #[test]
        fn rescued_streams_decode_like_the_complete_body(
            which in 0..LEAKED.len(),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let text = LEAKED[which];
            let tools = [ToolSpec {
                name: "read".into(),
                description: "Reads".into(),
                parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            }];
            let body = json!({"choices":[{"index":0,"finish_reason":"stop",
                "message":{"role":"assistant","content": text}}]});
            let complete = Rescue::apply(decode_response(body.to_string().as_bytes()).unwrap(), &tools);
            let (streamed, deltas) = rescued_stream(text, &cuts, &tools);
            prop_assert_eq!(without_ids(streamed), without_ids(complete.clone()));
            if which < 4 {
                for d in &deltas {
                    prop_assert!(
                        !d.contains(['<', '[', '`', '{', '}']),
                        "a call fragment streamed: {:?}",
                        deltas
                    );
                }
                prop_assert!(!complete.tool_calls.is_empty());
                prop_assert_eq!(complete.finish_reason, FinishReason::ToolCalls);
                for c in &complete.tool_calls {
                    prop_assert_eq!(c.provider_data.as_ref().and_then(|d| d.get("rescued")), Some(&json!(true)));
                }
            } else {
                // A near miss stays text, never an error; plain text is left as it is.
                prop_assert!(complete.tool_calls.is_empty());
                prop_assert_eq!(complete.malformed_call.clone(), None);
                prop_assert_eq!(complete.finish_reason, FinishReason::Stop);
                let got = complete.text.clone().unwrap_or_default();
                if which == 4 {
                    prop_assert!(got.contains("<tool_call>{oops</tool_call>"), "{}", got);
                } else {
                    prop_assert_eq!(got, text);
                }
            }
        }
    }

    /// The events and the error of a whole SSE body decoded by `decoder`, with the number of
    /// chunks that took the typed path.
    fn decode_with(
        body: &[u8],
        decoder: ChunkDecoder,
    ) -> (Vec<StreamEvent>, Option<String>, usize) {
        let mut reader = adapter::SseReader::new(decoder);
        let mut out = Vec::new();
        let result = reader
            .push(body, &mut out)
            .and_then(|()| reader.finish(&mut out));
        let typed = reader.decoder().typed_chunks;
        (out, result.err().map(|e| e.to_string()), typed)
    }

    /// Both paths give the same events and error for `body`; `Ok` says how many chunks took the
    /// typed path.
    fn paths_agree(body: &[u8]) -> Result<usize, String> {
        let (events, error, typed) = decode_with(body, ChunkDecoder::new(200));
        let (value_events, value_error, _) = decode_with(body, ChunkDecoder::value_only(200));
        if (&events, &error) == (&value_events, &value_error) {
            Ok(typed)
        } else {
            Err(format!(
                "typed {events:?} {error:?}\nvalue {value_events:?} {value_error:?}\nbody {}",
                String::from_utf8_lossy(body)
            ))
        }
    }

    #[test]
    fn typed_and_value_chunks_agree_on_the_corpus() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let (mut typed, mut streams) = (0, 0);
        for case in std::fs::read_dir(&dir).unwrap() {
            let case = case.unwrap().path();
            let Ok(meta) = std::fs::read(case.join("meta.json")) else {
                continue;
            };
            let meta: Value = serde_json::from_slice(&meta).unwrap();
            if meta["api"] != "openai-chat" || meta["stream"] != true {
                continue;
            }
            let file = meta["response_file"].as_str().unwrap_or("response.sse");
            let body = std::fs::read(case.join(file)).unwrap();
            streams += 1;
            match paths_agree(&body) {
                Ok(n) => typed += n,
                Err(e) => panic!("{}: {e}", case.display()),
            }
        }
        assert!(streams >= 12, "only {streams} streams in the corpus");
        // The servers' usual chunks are read without a JSON value.
        assert!(
            typed >= 60,
            "the typed path took only {typed} corpus chunks"
        );
    }

    /// The in-place reader accepts what the derived structures did: fields in any order, keys
    /// spelled with escapes, unknown fields of any shape; a known field given twice (which the
    /// value path reads as its last value) sends the chunk down the value path.
    #[test]
    fn chunk_objects_read_in_place_agree_with_the_value_path() {
        let typed = |chunks: &[&str]| {
            let mut body = String::new();
            for c in chunks {
                body.push_str(&format!("data: {c}\n\n"));
            }
            body.push_str("data: [DONE]\n\n");
            paths_agree(body.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
        };
        let usual = [
            r#"{"usage":null,"choices":[{"finish_reason":null,"delta":{"content":"a"},"index":0}],"id":"x"}"#,
            r#"{"\u0063hoices":[{"d\u0065lta":{"tool_calls":[{"function":{"arguments":"{}","name":"f"},"id":"c","\u0069ndex":0}]}}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","x":{"a":[1,{"b":null}]},"refusal":"no"},"logprobs":{"content":[]}}],"system_fingerprint":"fp"}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"completion_tokens":2,"prompt_tokens":3}}"#,
        ];
        assert_eq!(
            typed(&usual),
            usual.len(),
            "the usual chunks take the typed path"
        );
        let repeated = [
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"index":0,"index":1,"delta":{"content":"a"}}]}"#,
            r#"{"choices":[],"choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","name":"g"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","id":"b","function":{"name":"f"}}]}}]}"#,
            r#"{"choices":[{"delta":null,"delta":{"content":"a"}}]}"#,
            r#"{"error":null,"error":null,"choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"},"finish_reason":null,"finish_reason":"stop"}]}"#,
        ];
        for chunk in repeated {
            assert_eq!(
                typed(&[chunk]),
                0,
                "a repeated field took the typed path: {chunk}"
            );
        }
        // An unknown field is skipped unread, as a derived `Deserialize` skips it: what only
        // reading it as a JSON value refuses does not stop a chunk whose known fields are sound.
        let unread = [
            r#"{"id":"\ud800","choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a","x":[1e400]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"c","x":{"\udc00":1},"function":{"name":"f"}}]}}]}"#,
        ];
        for chunk in unread {
            let body = format!("data: {chunk}\n\ndata: [DONE]\n\n");
            let (events, error, typed) = decode_with(body.as_bytes(), ChunkDecoder::new(200));
            assert_eq!(
                (typed, &error),
                (1, &None),
                "the typed path refused {chunk}"
            );
            assert!(!events.is_empty(), "{chunk}");
            // The value path, which reads the whole event, refuses it.
            let (_, value_error, _) = decode_with(body.as_bytes(), ChunkDecoder::value_only(200));
            assert!(value_error.is_some(), "{chunk}");
        }
    }

    /// Chunks built from the usual fields, each absent, of the right type, or odd: null, of the
    /// wrong type, empty, escaped.
    fn chunk_body() -> BoxedStrategy<String> {
        let g = JsonText::new(0.7);
        let function = g.object(vec![
            ("index", g.pick(&["0", "1"])),
            ("name", g.pick(&["\"read\"", "\"\"", "\"r\\u00e9ad\""])),
            (
                "arguments",
                g.pick(&["\"{\\\"a\\\":\"", "\"1}\"", "\"\"", "{\"a\":1}", "null"]),
            ),
        ]);
        let call = g.object(vec![
            ("index", g.pick(&["0", "1", "null"])),
            ("id", g.pick(&["\"call_1\"", "\"call_2\"", "\"\"", "null"])),
            ("type", g.pick(&["\"function\""])),
            ("function", g.either(function)),
            (
                "extra_content",
                g.pick(&["{\"google\":{\"thought_signature\":\"s\"}}", "null"]),
            ),
        ]);
        let delta = g.object(vec![
            ("role", g.pick(&["\"assistant\""])),
            ("content", g.pick(&["\"hi\"", "\"\"", "\"a\\\"b\"", "null"])),
            ("tool_calls", g.either(g.array(call))),
            ("reasoning_content", g.pick(&["\"why\"", "\"\""])),
            ("refusal", g.pick(&["\"no\"", "null"])),
        ]);
        let choice = g.object(vec![
            ("index", g.pick(&["0", "0", "1"])),
            ("delta", g.either(delta.clone())),
            ("message", g.pick(&["null"])),
            ("logprobs", g.pick(&["null"])),
            (
                "finish_reason",
                g.pick(&["\"stop\"", "\"tool_calls\"", "\"length\"", "null"]),
            ),
        ]);
        let usage = g.object(vec![
            ("prompt_tokens", g.pick(&["3", "3", "3.0"])),
            ("completion_tokens", g.pick(&["2"])),
            (
                "prompt_tokens_details",
                g.pick(&["{\"cached_tokens\":1}", "null"]),
            ),
            (
                "completion_tokens_details",
                g.pick(&["{\"reasoning_tokens\":7}", "{}"]),
            ),
        ]);
        let groq = "{\"usage\":{\"prompt_tokens\":5}}";
        g.object(vec![
            ("id", g.pick(&["\"chatcmpl-1\""])),
            ("object", g.pick(&["\"chat.completion.chunk\""])),
            ("choices", g.either(g.array(choice))),
            ("usage", g.pick(&["null"]).prop_union(usage).boxed()),
            ("x_groq", g.pick(&[groq])),
            (
                "error",
                g.pick(&["null", "null", "null", "{\"message\":\"bad\"}"]),
            ),
        ])
    }

    #[test]
    fn typed_chunks_agree_with_the_value_path() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let chunks = proptest::collection::vec(chunk_body(), 1..6);
        let (mut typed, mut all, cases) = (0, 0, 2000);
        for n in 0..cases {
            let chunks = chunks.new_tree(&mut runner).unwrap().current();
            all += chunks.len();
            let mut body = String::new();
            for c in &chunks {
                // Now and then an `error` event name, which the value path reads.
                let event = if n % 50 == 0 { "event: error\n" } else { "" };
                body.push_str(&format!("{event}data: {c}\n\n"));
            }
            if n % 3 != 0 {
                body.push_str("data: [DONE]\n\n");
            }
            match paths_agree(body.as_bytes()) {
                Ok(n) => typed += n,
                Err(e) => panic!("{e}"),
            }
        }
        // The chunks must exercise the typed path, not only the fallback.
        assert!(
            typed * 8 > all,
            "the typed path took only {typed} of {all} chunks"
        );
    }

    /// A stream as the usual servers send it: every chunk opens with the same members.
    fn headed_stream(head: &str, rests: &[&str]) -> String {
        let mut body = String::new();
        for rest in rests {
            body.push_str(&format!("data: {{{head}{rest}\n\n"));
        }
        body.push_str("data: [DONE]\n\n");
        body
    }

    const HEAD: &str =
        r#""id":"chatcmpl-1","object":"chat.completion.chunk","created":1764222222,"model":"m-1","#;

    #[test]
    fn later_chunks_are_read_without_the_head_they_repeat() {
        let rests = [
            r#""choices":[{"index":0,"delta":{"role":"assistant","content":null},"logprobs":null,"finish_reason":null}]}"#,
            r#""choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"read","arguments":""}}]},"logprobs":null,"finish_reason":null}]}"#,
            r#""choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]},"logprobs":null,"finish_reason":null}]}"#,
            r#""choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a.txt\"}"}}]},"logprobs":null,"finish_reason":null}]}"#,
            r#""choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        ];
        let body = headed_stream(HEAD, &rests);
        assert_eq!(paths_agree(body.as_bytes()), Ok(rests.len()));
        let mut reader = adapter::SseReader::new(ChunkDecoder::new(200));
        let mut out = Vec::new();
        reader.push(body.as_bytes(), &mut out).unwrap();
        assert_eq!(reader.decoder().headless_chunks, rests.len() - 1);
        // The events of a decoder lent each event unchanged (read whole) are the same.
        let mut decoder = ChunkDecoder::new(200);
        let mut lent = Vec::new();
        crate::transport::sse::SseDecoder::new()
            .push_each(body.as_bytes(), |ev| decoder.event(ev, &mut lent))
            .unwrap();
        assert_eq!(lent, out);
        let response = adapter::accumulate(out, Ok(())).0;
        assert_eq!(response.tool_calls[0].arguments, json!({"path": "a.txt"}));
        assert_eq!(response.usage.map(|u| u.output_tokens), Some(2));
    }

    /// Chunks read through the frame of the chunk before them, decoding `body`.
    fn framed(body: &[u8]) -> usize {
        let mut reader = adapter::SseReader::new(ChunkDecoder::new(200));
        let mut out = Vec::new();
        let _ = reader
            .push(body, &mut out)
            .and_then(|()| reader.finish(&mut out));
        reader.decoder().framed_chunks
    }

    /// A reply's text, and each call's arguments, come in chunks that differ only in their
    /// string: after the first of them, the others are read through its frame, with the same
    /// events as when each is read whole.
    #[test]
    fn pieces_in_the_frame_of_the_chunk_before_are_read_through_it() {
        let tail = r#","logprobs":null,"finish_reason":null}],"usage":null}"#;
        let args = |index: u32, piece: &str| {
            format!(
                r#""choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{index},"function":{{"arguments":"{piece}"}}}}]}}{tail}"#
            )
        };
        let open = |index: u32, id: &str| {
            format!(
                r#""choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{index},"id":"{id}","type":"function","function":{{"name":"read","arguments":""}}}}]}}{tail}"#
            )
        };
        let text = |piece: &str| {
            format!(r#""choices":[{{"index":0,"delta":{{"content":"{piece}"}}{tail}"#)
        };
        let rests = [
            r#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#.to_string(),
            text("Let me "),
            text(r#"read \"a\" é"#),
            text(""),
            open(0, "c1"),
            args(0, r#"{\"path\":"#),
            args(0, r#"\"a.txt\"}"#),
            open(1, "c2"),
            args(1, r#"{\"path\""#),
            args(1, r#":\"b\u00e9\"}"#),
            r#""choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}"#.to_string(),
        ];
        let rests: Vec<&str> = rests.iter().map(String::as_str).collect();
        let body = headed_stream(HEAD, &rests);
        assert_eq!(paths_agree(body.as_bytes()), Ok(rests.len()));
        // The text after the first piece, and each call's second piece of arguments.
        assert_eq!(framed(body.as_bytes()), 4);
        let (events, error, _) = decode_with(body.as_bytes(), ChunkDecoder::new(200));
        assert_eq!(error, None);
        let response = adapter::accumulate(events, Ok(())).0;
        assert_eq!(response.text.as_deref(), Some("Let me read \"a\" é"));
        let arguments: Vec<&Value> = response.tool_calls.iter().map(|c| &c.arguments).collect();
        assert_eq!(
            arguments,
            [&json!({"path": "a.txt"}), &json!({"path": "bé"})]
        );
    }

    proptest! {
        /// Whatever stands in the frame's place (a string, or text that closes it early and
        /// adds members, escapes cut short, lone surrogates, control characters), the chunk reads
        /// as it reads whole: the same events, the same error, the same chunks on the typed path.
        #[test]
        fn whatever_stands_in_a_frame_reads_as_the_whole_chunk(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "a", "é", "\\\"", "\"", "\\\\", "\\", "\\u00e9", "\\ud800", "\\udc00",
                    "\\ud83d\\ude00", "\\n", "\u{1}", "\t", ",", "}", "]", "\",\"content\":\"x",
                    "\",\"index\":1,\"x\":\"", "\\u12", "\\x", "null",
                ]),
                0..6,
            ),
            arguments in proptest::bool::ANY,
        ) {
            let tail = r#","logprobs":null,"finish_reason":null}],"usage":null}"#;
            let chunk = |piece: &str| if arguments {
                format!(r#""choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{piece}"}}}}]}}{tail}"#)
            } else {
                format!(r#""choices":[{{"index":0,"delta":{{"content":"{piece}"}}{tail}"#)
            };
            let open = r#""choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f"}}]}}]}"#;
            let rests = [open.to_string(), chunk("first"), chunk(&pieces.concat()), chunk("last")];
            let rests: Vec<&str> = rests.iter().map(String::as_str).collect();
            let body = headed_stream(HEAD, &rests);
            let (events, error, typed) = decode_with(body.as_bytes(), ChunkDecoder::new(200));
            let whole = ChunkDecoder {
                no_frames: true,
                ..ChunkDecoder::new(200)
            };
            let (whole_events, whole_error, whole_typed) = decode_with(body.as_bytes(), whole);
            prop_assert_eq!(
                (&events, &error, typed),
                (&whole_events, &whole_error, whole_typed),
                "{}",
                body
            );
            // One JSON string in the frame: it and the last chunk are read through the frame.
            let middle = format!("\"{}\"", pieces.concat());
            if typed::string_token(&middle).is_some() {
                prop_assert_eq!(framed(body.as_bytes()), 2, "{}", body);
            }
        }
    }

    /// A chunk that repeats the head but is not sound, or whose head is not of the shape that is
    /// skipped, reads as it reads whole: the same events and errors as the value path.
    #[test]
    fn a_chunk_read_without_its_head_reads_as_the_whole_chunk() {
        let first = r#""choices":[{"index":0,"delta":{"content":"a"}}]}"#;
        let cases: &[(&str, &[&str])] = &[
            // The object ends after the head's comma: not JSON.
            (HEAD, &[first, "}"]),
            (HEAD, &[first, " }"]),
            // Whitespace before the next member; a member of the head again.
            (HEAD, &[first, r#" "choices":[{"delta":{"content":"b"}}]}"#]),
            (
                HEAD,
                &[first, r#""id":"x","choices":[{"delta":{"content":"b"}}]}"#],
            ),
            // An error, and a known field given twice, after the head.
            (HEAD, &[first, r#""error":{"message":"bad"},"choices":[]}"#]),
            (
                HEAD,
                &[
                    first,
                    r#""choices":[],"choices":[{"delta":{"content":"b"}}]}"#,
                ],
            ),
            // Not a chunk after the head; nothing after it.
            (HEAD, &[first, r#""choices":[{"delta":{"content":"b"}}]"#]),
            (HEAD, &[first, ""]),
            // A head spelled with escapes, or holding a known field, stops before them.
            (
                r#""id":"a\"b","\u006dodel":"m","#,
                &[first, r#""choices":[{"delta":{"content":"b"}}]}"#],
            ),
            (
                r#""id":"a","usage":null,"object":"x","#,
                &[first, r#""usage":{"prompt_tokens":1},"choices":[]}"#],
            ),
            // Odd tokens: refused in the first chunk, so never learned.
            (r#""id":nul,"#, &[first, first]),
        ];
        for (head, rests) in cases {
            let body = headed_stream(head, rests);
            if let Err(e) = paths_agree(body.as_bytes()) {
                panic!("{e}");
            }
        }
        // A head that changes: the chunk is read whole.
        let body = format!(
            "data: {{{HEAD}{first}\n\ndata: {{\"id\":\"chatcmpl-2\",{}{first}\n\ndata: [DONE]\n\n",
            &HEAD[18..]
        );
        let (events, error, typed) = decode_with(body.as_bytes(), ChunkDecoder::new(200));
        assert_eq!((typed, error), (2, None));
        assert!(matches!(&events[0], StreamEvent::TextDelta(t) if t == "aa"));
    }

    #[test]
    fn heads_stop_before_the_first_member_not_skipped() {
        let known = typed::Chunk::NAMES;
        let len = |s: &str| head_len(s.as_bytes(), known, HEAD_MAX);
        assert_eq!(len(&format!("{{{HEAD}\"choices\":[]}}")), HEAD.len() + 1);
        assert_eq!(len(r#"{"id":"a","choices":[],"model":"m"}"#), 10);
        assert_eq!(len(r#"{"id":"a","x":{"b":1},"model":"m"}"#), 10);
        assert_eq!(len(r#"{"id":"a" ,"model":"m"}"#), 0);
        assert_eq!(len(r#"{"id":"a\n","model":"m"}"#), 0);
        assert_eq!(len(r#"{"id":"a""#), 0);
        assert_eq!(len(r#"{"id":"a","#), 10);
        assert_eq!(len(r#"{"n":-1.5e+3,"t":true,"z":null,"#), 31);
        assert_eq!(len(r#"{"n":,"#), 0);
        assert_eq!(len(r#"["id","a"]"#), 0);
        assert_eq!(len(""), 0);
        // Kept up to the last member that ends within the limit.
        let long = format!(
            "{{\"a\":\"{}\",\"b\":1,\"choices\":[]}}",
            "x".repeat(HEAD_MAX)
        );
        assert_eq!(len(&long), 0);
        let long = format!(
            "{{\"b\":1,\"a\":\"{}\",\"choices\":[]}}",
            "x".repeat(HEAD_MAX)
        );
        assert_eq!(len(&long), 7);
        let edge = format!("{{\"a\":\"{}\",", "x".repeat(HEAD_MAX - 8));
        assert_eq!((edge.len(), len(&edge)), (HEAD_MAX, HEAD_MAX));
    }

    /// Pieces of text, and of one call's arguments, that come in one read make one event each;
    /// pieces read apart stay apart. Either way the response is the same.
    #[test]
    fn pieces_read_together_make_one_event() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"content":"Let "}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"me look."}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"x\":"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1,"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"y\":2}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ]);
        // Read at once.
        let (together, error) = events_in_pieces(body.as_bytes(), &[]);
        assert_eq!(error, None);
        let pieces = |events: &[StreamEvent]| {
            events
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        StreamEvent::TextDelta(_) | StreamEvent::ToolCallDelta { .. }
                    )
                })
                .count()
        };
        assert_eq!(pieces(&together), 3, "{together:?}");
        assert!(
            together.contains(&StreamEvent::ToolCallDelta {
                index: 0,
                arguments: "{\"x\":1,\"y\":2}".into()
            }),
            "{together:?}"
        );
        // Read event by event, each read's events handed on before the next read.
        let mut reader = adapter::SseReader::new(ChunkDecoder::new(200));
        let (mut apart, mut out) = (Vec::new(), Vec::new());
        for event in body.split_inclusive("\n\n") {
            reader.push(event.as_bytes(), &mut out).unwrap();
            apart.append(&mut out);
        }
        reader.finish(&mut out).unwrap();
        apart.append(&mut out);
        assert_eq!(pieces(&apart), 6, "{apart:?}");
        let response = |events: Vec<StreamEvent>| adapter::accumulate(events, Ok(())).0;
        assert_eq!(response(together), response(apart));
    }

    proptest! {
        #[test]
        fn any_chunking_decodes_like_one_chunk(
            which in 0..STREAMS.len(),
            cuts in proptest::collection::vec(0usize..100_000, 0..12),
        ) {
            let body = STREAMS[which].as_bytes();
            let whole = events_in_pieces(body, &[]);
            prop_assert!(!whole.0.is_empty() || whole.1.is_some());
            prop_assert_eq!(events_in_pieces(body, &cuts), whole);
        }
    }
}
