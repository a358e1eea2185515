//! The message model every provider adapter translates to and from.
//!
//! A transcript is a `Vec<Message>`. Its serde form is stable and documented:
//!
//! ```json
//! [
//!   {"role": "system", "content": "You are terse."},
//!   {"role": "user", "content": "What is in Cargo.toml?"},
//!   {"role": "assistant", "text": "Reading it.",
//!    "tool_calls": [{"id": "call_1", "name": "read_file", "arguments": {"path": "Cargo.toml"}}]},
//!   {"role": "tool", "call_id": "call_1", "name": "read_file",
//!    "content": "{\"success\":true,\"message\":\"ok\",\"data\":\"...\"}", "is_error": false},
//!   {"role": "assistant", "text": "It declares a workspace."}
//! ]
//! ```
//!
//! Optional fields are left out when empty, and a transcript saved as JSON loads back identical.

use crate::image::Image;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The person or program the agent works for.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// A system prompt.
    System {
        /// The instructions.
        content: String,
    },
    /// A user turn.
    User {
        /// What the user said.
        content: String,
        /// Images that go with it (see [`crate::image`]); left out of the serde form when
        /// there are none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<Image>,
    },
    /// A model turn: text, tool calls, and opaque provider parts.
    Assistant(AssistantMessage),
    /// The result of one tool call.
    Tool(ToolResult),
}

/// A model turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// The user-visible text, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The tool calls the model asked for, in the model's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Provider-specific parts (signed thinking blocks, for example), kept opaque and sent back
    /// unchanged to the provider that produced them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<ProviderPart>,
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id; every call gets exactly one [`ToolResult`] with the same id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments. Always a valid JSON value: when the model's argument text was not JSON,
    /// this is `{}` and [`ToolCall::invalid_arguments`] keeps the text.
    pub arguments: Value,
    /// The model's argument text, when it did not parse as JSON. It is never sent back to a
    /// provider (strict servers reject it); the tool result carries the parse error instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_arguments: Option<String>,
    /// Opaque provider data attached to this call (a Gemini thought signature, for example).
    /// A JSON `null` here reads back as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_data: Option<Value>,
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The name of the tool that was called (Gemini needs it on the wire).
    pub name: String,
    /// What the model reads: by default the JSON object `{success, message, data}`.
    pub content: String,
    /// Whether the call failed.
    #[serde(default)]
    pub is_error: bool,
    /// Images the tool gave the model ([`crate::tool::ToolOutput::images`]). Anthropic, the
    /// Responses API and Gemini take them in the result itself; Chat Completions takes no
    /// images in a tool message, so they go in a user message after the round's results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
}

/// An opaque provider-specific part of an assistant turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderPart {
    /// The provider that produced it (`"anthropic"`, `"gemini"`, …). Only that provider's adapter
    /// sends it back; others leave it out.
    pub provider: String,
    /// The part exactly as the provider sent it.
    pub data: Value,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::System {
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: content.into(),
            images: Vec::new(),
        }
    }

    /// A user message with images (see [`crate::image::Image`]).
    pub fn user_with_images(
        content: impl Into<String>,
        images: impl IntoIterator<Item = Image>,
    ) -> Self {
        Message::User {
            content: content.into(),
            images: images.into_iter().collect(),
        }
    }

    /// The images of a user message; none for other messages.
    pub fn images(&self) -> &[Image] {
        match self {
            Message::User { images, .. } => images,
            _ => &[],
        }
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message::Assistant(AssistantMessage {
            text: Some(text.into()),
            ..AssistantMessage::default()
        })
    }

    /// The role of this message.
    pub fn role(&self) -> Role {
        match self {
            Message::System { .. } => Role::System,
            Message::User { .. } => Role::User,
            Message::Assistant(_) => Role::Assistant,
            Message::Tool(_) => Role::Tool,
        }
    }

    /// The message's text: the content of system, user and tool messages, the text of an
    /// assistant turn (or `""` when it has none).
    pub fn text(&self) -> &str {
        match self {
            Message::System { content } | Message::User { content, .. } => content,
            Message::Assistant(a) => a.text.as_deref().unwrap_or(""),
            Message::Tool(r) => &r.content,
        }
    }
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        ToolCall {
            id: new_call_id(),
            name: name.into(),
            arguments,
            invalid_arguments: None,
            provider_data: None,
        }
    }

    /// Builds a call from the model's argument text. An empty text means `{}`; a text that is not
    /// JSON is kept in [`ToolCall::invalid_arguments`]. A JSON string that itself holds a JSON
    /// object (double-encoded arguments, as some servers send) is decoded once more.
    pub fn from_raw_arguments(id: String, name: String, raw: &str) -> Self {
        let (arguments, invalid_arguments) = parse_arguments(raw);
        ToolCall {
            id,
            name,
            arguments,
            invalid_arguments,
            provider_data: None,
        }
    }

    /// Whether two calls have the same arguments: equal JSON values (object key order does not
    /// matter), or the same invalid argument text. Agrees with comparing
    /// [`ToolCall::canonical_arguments`], without writing either out.
    pub fn same_arguments(&self, other: &ToolCall) -> bool {
        match (&self.invalid_arguments, &other.invalid_arguments) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.arguments == other.arguments,
            _ => false,
        }
    }

    /// The arguments in canonical form (object keys sorted, no spaces).
    pub fn canonical_arguments(&self) -> String {
        match &self.invalid_arguments {
            Some(raw) => format!("invalid:{raw}"),
            None => canonical_json(&self.arguments),
        }
    }
}

/// Parses argument text into a JSON value; see [`ToolCall::from_raw_arguments`].
pub fn parse_arguments(raw: &str) -> (Value, Option<String>) {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return (Value::Object(Default::default()), None);
    }
    match serde_json::from_str::<Value>(trimmed) {
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v @ Value::Object(_)) => (v, None),
            _ => (Value::String(inner), None),
        },
        Ok(v) => (v, None),
        Err(_) => (Value::Object(Default::default()), Some(raw.to_string())),
    }
}

/// Writes a JSON value with object keys sorted at every level and no insignificant spaces.
pub fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_json(k, out);
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, out);
                }
                out.push(']');
            }
            other => push_json(other, out),
        }
    }
    // `serde_json::to_string` writes straight to a buffer; `Value::to_string` goes through the
    // formatter, several times slower.
    fn push_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut String) {
        out.push_str(&serde_json::to_string(value).unwrap_or_default());
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// What makes this process's call ids differ from another's: the clock and the process id.
#[cfg(not(target_arch = "wasm32"))]
fn call_id_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// In WebAssembly (no process id, no system clock): a time-ordered UUID's clock and random bits,
/// from JavaScript.
#[cfg(target_arch = "wasm32")]
fn call_id_seed() -> u64 {
    let v = uuid::Uuid::now_v7().as_u128();
    (v >> 80) as u64 ^ v as u64
}

/// A fresh tool-call id, unique within this process and unlikely to collide across processes.
pub fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(call_id_seed);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("call_{:012x}{:06x}", seed & 0xffff_ffff_ffff, n & 0xff_ffff)
}

/// A conversation to send, read in place: the messages of a [`crate::model::ModelRequest`].
///
/// Without a context policy it is the transcript itself (a slice). With one it is the policy's
/// *view* (see [`crate::context::policy`]) read over the transcript without copying it: the
/// view's own messages (after a compaction, the system prompt and the summary), then the
/// transcript's from some point on, with the results the policy spilled or cleared read from
/// their replacements. It is `Copy`, indexes like a slice (`messages[i]`, [`Messages::get`],
/// [`Messages::slice`]) and iterates as `&Message` (`for m in messages`). Build one from a
/// slice with `Messages::from(&slice[..])`, or `(&vec).into()`.
#[derive(Clone, Copy)]
pub struct Messages<'a> {
    /// The messages before the transcript's part.
    head: &'a [Message],
    /// The transcript's part.
    tail: &'a [Message],
    /// Messages replaced, by index in `head` and `tail` read as one, in order of it.
    edited: &'a [(usize, Message)],
    /// The range of that whole sequence this value covers.
    start: usize,
    end: usize,
}

impl<'a> Messages<'a> {
    /// `head` then `tail`, with `edited`'s messages in place of theirs (indices into `head` and
    /// `tail` read as one sequence, increasing).
    pub(crate) fn edited(
        head: &'a [Message],
        tail: &'a [Message],
        edited: &'a [(usize, Message)],
    ) -> Self {
        debug_assert!(edited.windows(2).all(|w| w[0].0 < w[1].0));
        Messages {
            head,
            tail,
            edited,
            start: 0,
            end: head.len() + tail.len(),
        }
    }

    /// How many messages it holds.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The message at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&'a Message> {
        let k = self.start.checked_add(index)?;
        (k < self.end).then(|| self.at(k))
    }

    /// The first message.
    pub fn first(&self) -> Option<&'a Message> {
        self.get(0)
    }

    /// The last message.
    pub fn last(&self) -> Option<&'a Message> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// How many messages at the start are system messages: the system prompt, which an adapter
    /// whose API has a field for it sends there (a later system message stands where it is).
    pub(crate) fn leading_system(&self) -> usize {
        self.iter()
            .take_while(|m| matches!(m, Message::System { .. }))
            .count()
    }

    /// The system prompt and the conversation after it: the texts of the system messages at the
    /// start (see [`Messages::leading_system`]), and the messages from the first other one on.
    pub(crate) fn split_system_prompt(
        &self,
    ) -> (impl Iterator<Item = &'a str> + use<'a>, Messages<'a>) {
        let leading = self.leading_system();
        let prompt = self.slice(..leading).iter().map(Message::text);
        (prompt, self.slice(leading..))
    }

    /// The messages in `range` (of this value's indices), as a slice of it would hold.
    ///
    /// # Panics
    ///
    /// When the range is out of bounds or decreasing, as slicing a slice would.
    pub fn slice(&self, range: impl std::ops::RangeBounds<usize>) -> Messages<'a> {
        use std::ops::Bound;
        // A bound past `usize::MAX` (`..=usize::MAX`) is out of range, as a slice has it, not a
        // wrap to 0.
        let past =
            || -> usize { panic!("messages past usize::MAX out of the {} held", self.len()) };
        let from = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.checked_add(1).unwrap_or_else(past),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(&i) => i.checked_add(1).unwrap_or_else(past),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => self.len(),
        };
        assert!(
            from <= to && to <= self.len(),
            "messages {from}..{to} out of the {} held",
            self.len()
        );
        Messages {
            start: self.start + from,
            end: self.start + to,
            ..*self
        }
    }

    /// The messages in order.
    pub fn iter(&self) -> MessagesIter<'a> {
        MessagesIter {
            next_edit: self.edited.partition_point(|(i, _)| *i < self.start),
            front: self.start,
            back: self.end,
            messages: *self,
        }
    }

    /// The messages, copied.
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }

    /// The messages as one slice, when they are one (no message of them replaced, none of
    /// them before the transcript's part, or all).
    pub fn as_slice(&self) -> Option<&'a [Message]> {
        let lo = self.edited.partition_point(|(i, _)| *i < self.start);
        if self.edited.get(lo).is_some_and(|(i, _)| *i < self.end) {
            return None;
        }
        let h = self.head.len();
        if self.end <= h {
            Some(&self.head[self.start..self.end])
        } else if self.start >= h {
            Some(&self.tail[self.start - h..self.end - h])
        } else {
            None
        }
    }

    fn at(&self, k: usize) -> &'a Message {
        if !self.edited.is_empty()
            && let Ok(j) = self.edited.binary_search_by_key(&k, |(i, _)| *i)
        {
            return &self.edited[j].1;
        }
        self.base(k)
    }

    fn base(&self, k: usize) -> &'a Message {
        match k.checked_sub(self.head.len()) {
            None => &self.head[k],
            Some(t) => &self.tail[t],
        }
    }
}

impl Default for Messages<'_> {
    /// No messages.
    fn default() -> Self {
        Messages::from(&[][..])
    }
}

impl<'a> From<&'a [Message]> for Messages<'a> {
    fn from(messages: &'a [Message]) -> Self {
        Messages::edited(messages, &[], &[])
    }
}

impl<'a> From<&'a Vec<Message>> for Messages<'a> {
    fn from(messages: &'a Vec<Message>) -> Self {
        Messages::from(messages.as_slice())
    }
}

impl<'a, const N: usize> From<&'a [Message; N]> for Messages<'a> {
    fn from(messages: &'a [Message; N]) -> Self {
        Messages::from(messages.as_slice())
    }
}

impl std::ops::Index<usize> for Messages<'_> {
    type Output = Message;

    fn index(&self, index: usize) -> &Message {
        match self.get(index) {
            Some(m) => m,
            None => panic!("message {index} out of the {} held", self.len()),
        }
    }
}

impl std::fmt::Debug for Messages<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Messages<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<[Message]> for Messages<'_> {
    fn eq(&self, other: &[Message]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<Message>> for Messages<'_> {
    fn eq(&self, other: &Vec<Message>) -> bool {
        *self == other[..]
    }
}

impl Serialize for Messages<'_> {
    /// As the slice of its messages would: a JSON array in the transcript's form.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'a> IntoIterator for Messages<'a> {
    type Item = &'a Message;
    type IntoIter = MessagesIter<'a>;

    fn into_iter(self) -> MessagesIter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &Messages<'a> {
    type Item = &'a Message;
    type IntoIter = MessagesIter<'a>;

    fn into_iter(self) -> MessagesIter<'a> {
        self.iter()
    }
}

/// The iterator of [`Messages`].
#[derive(Clone)]
pub struct MessagesIter<'a> {
    messages: Messages<'a>,
    front: usize,
    back: usize,
    /// The first replaced message at `front` or after.
    next_edit: usize,
}

impl<'a> Iterator for MessagesIter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        if self.front >= self.back {
            return None;
        }
        let k = self.front;
        self.front += 1;
        let edited = self.messages.edited;
        while edited.get(self.next_edit).is_some_and(|(i, _)| *i < k) {
            self.next_edit += 1;
        }
        match edited.get(self.next_edit) {
            Some((i, m)) if *i == k => Some(m),
            _ => Some(self.messages.base(k)),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<&'a Message> {
        // Skipped in O(log n): an encoder resuming after the messages it encoded before.
        self.front = self.front.saturating_add(n).min(self.back);
        let edited = self.messages.edited;
        let front = self.front;
        self.next_edit +=
            edited[self.next_edit.min(edited.len())..].partition_point(|(i, _)| *i < front);
        self.next()
    }
}

impl DoubleEndedIterator for MessagesIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        Some(self.messages.at(self.back))
    }
}

impl ExactSizeIterator for MessagesIter<'_> {}

impl std::iter::FusedIterator for MessagesIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(".*", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn message() -> impl Strategy<Value = Message> {
        // A JSON `null` as provider data reads back as none.
        let data = json_value().prop_filter("not null", |v| !v.is_null());
        let call = (
            ".*",
            ".*",
            json_value(),
            proptest::option::of(".*"),
            proptest::option::of(data),
        )
            .prop_map(
                |(id, name, arguments, invalid_arguments, provider_data)| ToolCall {
                    id,
                    name,
                    arguments,
                    invalid_arguments,
                    provider_data,
                },
            );
        let part =
            (".*", json_value()).prop_map(|(provider, data)| ProviderPart { provider, data });
        let image = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..16).prop_map(|mut bytes| {
                bytes.splice(0..0, *b"GIF89a");
                Image::from_bytes(&bytes).unwrap()
            }),
            "[a-z]{1,8}"
                .prop_map(|host| Image::from_url(&format!("https://{host}/a.png")).unwrap()),
        ];
        prop_oneof![
            ".*".prop_map(Message::system),
            ".*".prop_map(Message::user),
            (".*", proptest::collection::vec(image, 1..3))
                .prop_map(|(text, images)| Message::user_with_images(text, images)),
            (
                proptest::option::of(".*"),
                proptest::collection::vec(call, 0..3),
                proptest::collection::vec(part, 0..2)
            )
                .prop_map(|(text, tool_calls, parts)| Message::Assistant(
                    AssistantMessage {
                        text,
                        tool_calls,
                        parts
                    }
                )),
            (".*", ".*", ".*", any::<bool>()).prop_map(|(call_id, name, content, is_error)| {
                Message::Tool(ToolResult {
                    call_id,
                    name,
                    content,
                    is_error,
                    images: Vec::new(),
                })
            }),
        ]
    }

    proptest! {
        #[test]
        fn transcripts_load_back_identical(messages in proptest::collection::vec(message(), 0..6)) {
            let json = serde_json::to_string(&messages).unwrap();
            let back: Vec<Message> = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back, messages);
        }
    }

    #[test]
    fn arguments_parse_quirks() {
        assert_eq!(parse_arguments(""), (json!({}), None));
        assert_eq!(parse_arguments(" {\"a\":1} "), (json!({"a": 1}), None));
        assert_eq!(
            parse_arguments("\"{\\\"a\\\":1}\""),
            (json!({"a": 1}), None)
        );
        let (v, bad) = parse_arguments("{\"a\":");
        assert_eq!(v, json!({}));
        assert_eq!(bad.as_deref(), Some("{\"a\":"));
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v = json!({"b": [1, {"d": 1, "c": 2}], "a": "x"});
        assert_eq!(canonical_json(&v), r#"{"a":"x","b":[1,{"c":2,"d":1}]}"#);
    }

    proptest::proptest! {
        #[test]
        fn same_arguments_agrees_with_canonical_forms(
            a in arguments(), b in arguments(), swap in proptest::bool::ANY,
        ) {
            let call = |raw: &str| ToolCall::from_raw_arguments("c".into(), "t".into(), raw);
            let (x, y) = (call(&a), call(if swap { &a } else { &b }));
            proptest::prop_assert_eq!(
                x.same_arguments(&y),
                x.canonical_arguments() == y.canonical_arguments()
            );
        }
    }

    /// Argument texts: objects whose keys come in any order, scalars, and invalid text.
    fn arguments() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let scalar = prop_oneof![
            Just("1".to_string()),
            Just("1.0".to_string()),
            Just("\"1\"".to_string()),
            Just("null".to_string()),
            Just("[1,{\"a\":2}]".to_string()),
        ];
        prop_oneof![
            4 => proptest::collection::vec((proptest::sample::select(vec!["a", "b", "c"]), scalar.clone()), 0..4)
                .prop_map(|fields| {
                    let inner: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", inner.join(","))
                }),
            1 => scalar,
            1 => Just("{oops".to_string()),
            1 => Just("{\"a\":".to_string()),
        ]
    }

    #[test]
    fn call_ids_are_unique() {
        let a = new_call_id();
        let b = new_call_id();
        assert_ne!(a, b);
        assert!(a.starts_with("call_"));
    }

    #[test]
    fn serde_form_is_documented_shape() {
        let m = Message::Tool(ToolResult {
            call_id: "c".into(),
            name: "t".into(),
            content: "x".into(),
            is_error: true,
            images: Vec::new(),
        });
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(
            v,
            json!({"role": "tool", "call_id": "c", "name": "t", "content": "x", "is_error": true})
        );
        let a = Message::assistant("hi");
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"role": "assistant", "text": "hi"})
        );
    }

    /// A view of two parts with replaced messages reads as the sequence it stands for, by
    /// index, by slice, forwards, backwards and skipping.
    #[test]
    fn messages_read_parts_and_edits_as_one_sequence() {
        let head = vec![Message::system("s"), Message::user("summary")];
        let tail: Vec<Message> = (0..6).map(|i| Message::user(format!("t{i}"))).collect();
        let edited = vec![
            (1, Message::user("S")),
            (4, Message::user("T2")),
            (7, Message::user("T5")),
        ];
        let view = Messages::edited(&head, &tail, &edited);
        let expected: Vec<Message> = ["s", "S", "t0", "t1", "T2", "t3", "t4", "T5"]
            .into_iter()
            .map(|t| {
                if t == "s" {
                    Message::system(t)
                } else {
                    Message::user(t)
                }
            })
            .collect();
        assert_eq!(view.len(), expected.len());
        assert_eq!(view.to_vec(), expected);
        assert_eq!(view, expected);
        for (i, m) in expected.iter().enumerate() {
            assert_eq!(&view[i], m, "message {i}");
            assert_eq!(view.get(i), Some(m), "message {i}");
        }
        assert_eq!(view.get(expected.len()), None);
        assert_eq!(view.last(), expected.last());
        let back: Vec<&Message> = view.iter().rev().collect();
        assert_eq!(back, expected.iter().rev().collect::<Vec<_>>());
        for from in 0..=expected.len() {
            for to in from..=expected.len() {
                let part = view.slice(from..to);
                assert_eq!(part.to_vec(), expected[from..to], "{from}..{to}");
                for skip in 0..=to - from {
                    assert_eq!(
                        part.iter().nth(skip),
                        expected[from..to].get(skip),
                        "{from}..{to} skipping {skip}"
                    );
                    let mut it = part.iter();
                    if skip > 0 {
                        it.nth(skip - 1);
                    }
                    assert_eq!(
                        it.collect::<Vec<_>>(),
                        expected[from + skip..to].iter().collect::<Vec<_>>()
                    );
                }
            }
        }
        // One slice when no message of the range is replaced and the range is in one part.
        assert_eq!(view.slice(5..7).as_slice(), Some(&tail[3..5]));
        assert_eq!(view.slice(..1).as_slice(), Some(&head[..1]));
        assert_eq!(view.slice(..3).as_slice(), None);
        assert_eq!(view.slice(3..5).as_slice(), None);
        let whole = Messages::from(&tail);
        assert_eq!(whole.as_slice(), Some(&tail[..]));
        assert_eq!(format!("{whole:?}"), format!("{tail:?}"));
    }

    /// A range past `usize::MAX` is out of bounds, as for a slice: a panic that says so, never
    /// a wrap to an empty range.
    #[test]
    #[should_panic(expected = "out of the 1 held")]
    fn a_slice_to_usize_max_inclusive_is_out_of_bounds() {
        let messages = [Message::user("a")];
        let view = Messages::from(&messages);
        let _ = view.slice(..=usize::MAX);
    }

    /// A view serialises as the messages it stands for would, replacements in place: what a
    /// driver hands a host as JSON is the conversation sent.
    #[test]
    fn messages_serialise_as_the_sequence_they_read_as() {
        let head = vec![Message::system("s")];
        let tail = vec![Message::user("a"), Message::user("b"), Message::user("c")];
        let edited = vec![(2, Message::user("B"))];
        let view = Messages::edited(&head, &tail, &edited);
        assert_eq!(
            serde_json::to_value(view).unwrap(),
            json!([
                {"role": "system", "content": "s"},
                {"role": "user", "content": "a"},
                {"role": "user", "content": "B"},
                {"role": "user", "content": "c"},
            ])
        );
        assert_eq!(
            serde_json::to_string(&view.slice(1..3)).unwrap(),
            serde_json::to_string(&[Message::user("a"), Message::user("B")]).unwrap()
        );
    }
}
