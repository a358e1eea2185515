//! Request bodies: the conversation and the tool catalog in the Chat Completions format.

use super::config::{OpenAiConfig, PROVIDER, ReminderRole};
use crate::image::Image;
use crate::message::{AssistantMessage, Message, Messages, ToolCall};
use crate::model::{
    ModelRequest, ModelSettings, ToolChoice, ToolSpec, catalog_fingerprint, message_fingerprint,
};
use crate::output::OutputSchema;
use crate::providers::adapter::json_number;
use crate::providers::json_write::{JsonBuf, write_str, write_value, write_value_as_string};
use bytes::{Bytes, BytesMut};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The JSON body of one Chat Completions request, as a JSON value (for inspection and tests; the
/// adapter itself serializes [`WireRequest`] straight to bytes, with no intermediate tree, and
/// an [`OpenAiSession`](super::OpenAiSession) writes the messages it adds by hand, to the same
/// bytes).
///
/// Assistant turns carry `tool_calls` with the (always valid) [`ToolCall::arguments`] serialized
/// as text, never the model's invalid argument text; tool turns carry `tool_call_id`. Parts made
/// by other providers are left out. Reminders follow the conversation (see [`ReminderRole`]).
/// An output schema becomes `response_format` of type `json_schema` (strict when the schema
/// allows it).
/// `config.extra`, then `settings.extra`, are merged into the top level last; a value that is not
/// a JSON object is ignored here ([`OpenAiModel`](super::OpenAiModel) refuses it with a clear
/// error).
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn build_request_body(req: &ModelRequest<'_>, config: &OpenAiConfig, stream: bool) -> Value {
    // Serializing into a value cannot fail: every map key is a string.
    serde_json::to_value(WireRequest::new(req, config, stream)).unwrap_or(Value::Null)
}

/// A Chat Completions request body that serializes straight from the conversation, borrowing
/// it; [`build_request_body`] is the same body as a JSON value.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct WireRequest<'a> {
    req: &'a ModelRequest<'a>,
    config: &'a OpenAiConfig,
    stream: bool,
    /// The extras' fields, later ones replacing earlier ones; they go last and replace any field
    /// of the same name.
    extras: Vec<(&'a str, &'a Value)>,
    /// Leave `tool_choice` out, whatever the choice (the server refused it).
    omit_tool_choice: bool,
    /// Ask for `json_object` output, with the schema's instructions after the conversation,
    /// instead of `json_schema` (the server refused it); the loop validates the answer.
    json_object_output: bool,
}

#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
impl<'a> WireRequest<'a> {
    /// The body of `req` for a server configured by `config`, streamed or not.
    pub fn new(req: &'a ModelRequest<'a>, config: &'a OpenAiConfig, stream: bool) -> Self {
        let mut extras: Vec<(&str, &Value)> = Vec::new();
        for extra in [config.extra.as_ref(), req.settings.extra.as_ref()]
            .into_iter()
            .flatten()
        {
            if let Value::Object(fields) = extra {
                for (k, v) in fields {
                    match extras.iter_mut().find(|(name, _)| name == k) {
                        Some(slot) => slot.1 = v,
                        None => extras.push((k, v)),
                    }
                }
            }
        }
        WireRequest {
            req,
            config,
            stream,
            extras,
            omit_tool_choice: false,
            json_object_output: false,
        }
    }

    /// The same body asking for `json_object` output with the output schema's instructions in
    /// the prompt, for a server that refused `json_schema` (no change without an output
    /// schema).
    pub fn json_object_output(mut self, on: bool) -> Self {
        self.json_object_output = on;
        self
    }

    /// The messages, with the output schema's instructions after them when `json_object`
    /// output stands in for `json_schema`.
    fn messages(&self) -> WireMessages<'a> {
        WireMessages {
            req: self.req,
            role: self.config.reminder_role,
            note: self
                .req
                .settings
                .output
                .as_ref()
                .filter(|_| self.json_object_output)
                .map(OutputSchema::instructions),
        }
    }

    /// The same body without `tool_choice`, for a server that refused it.
    pub fn without_tool_choice(mut self, omit: bool) -> Self {
        self.omit_tool_choice = omit;
        self
    }

    /// Writes one field, unless an extra replaces it.
    fn field<M: SerializeMap, T: Serialize + ?Sized>(
        &self,
        map: &mut M,
        name: &str,
        value: &T,
    ) -> Result<(), M::Error> {
        if self.extras.iter().any(|(extra, _)| *extra == name) {
            Ok(())
        } else {
            map.serialize_entry(name, value)
        }
    }
}

impl Serialize for WireRequest<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let settings: &ModelSettings = self.req.settings;
        let mut map = s.serialize_map(None)?;
        let model = settings.model.as_deref().unwrap_or(&self.config.model);
        self.field(&mut map, "model", model)?;
        self.field(&mut map, "messages", &self.messages())?;
        if !self.req.tools.is_empty() {
            self.field(&mut map, "tools", &WireTools(self.req.tools))?;
            // `auto` is sent to the servers that need it said (see
            // `OpenAiConfig::explicit_tool_choice`).
            match &settings.tool_choice {
                _ if self.omit_tool_choice => {}
                ToolChoice::Auto if self.config.explicit_tool_choice => {
                    self.field(&mut map, "tool_choice", "auto")?
                }
                ToolChoice::Auto => {}
                ToolChoice::None => self.field(&mut map, "tool_choice", "none")?,
                ToolChoice::Required => self.field(&mut map, "tool_choice", "required")?,
                ToolChoice::Tool(name) => {
                    let choice = json!({"type": "function", "function": {"name": name}});
                    self.field(&mut map, "tool_choice", &choice)?
                }
            }
        }
        if let Some(output) = &settings.output {
            if self.json_object_output {
                self.field(&mut map, "response_format", &json!({"type": "json_object"}))?;
            } else {
                self.field(&mut map, "response_format", &response_format(output))?;
            }
        }
        if let Some(t) = settings.temperature {
            self.field(&mut map, "temperature", &json_number(t))?;
        }
        if let Some(n) = settings.max_output_tokens {
            let name = if self.config.is_openai() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            self.field(&mut map, name, &n)?;
        }
        if self.stream {
            self.field(&mut map, "stream", &true)?;
            let options = json!({"include_usage": true});
            self.field(&mut map, "stream_options", &options)?;
        }
        for (name, value) in &self.extras {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// Whether a request says `tool_choice` (before any refusal is taken into account): it offers
/// tools and the choice is not `auto`, or it is `auto` and the server needs it said.
pub(super) fn sends_tool_choice(req: &ModelRequest<'_>, config: &OpenAiConfig) -> bool {
    !req.tools.is_empty()
        && (config.explicit_tool_choice || !matches!(req.settings.tool_choice, ToolChoice::Auto))
}

/// The `response_format` of a request with an output schema: `json_schema`, strict when the
/// schema asks for it and has a strict form (see [`OutputSchema::strict_schema`]).
fn response_format(output: &OutputSchema) -> Value {
    let (schema, is_strict) = output.for_strict_api();
    json!({
        "type": "json_schema",
        "json_schema": {"name": output.name, "schema": schema, "strict": is_strict},
    })
}

/// The `messages` array: the conversation, then the reminders.
pub(super) struct WireMessages<'a> {
    req: &'a ModelRequest<'a>,
    role: ReminderRole,
    /// A note that follows the reminders (the output schema's instructions).
    note: Option<String>,
}

impl<'a> WireMessages<'a> {
    /// The messages sent as they are (all of them, or all but a last user turn that the
    /// reminders are appended to), and what follows them: `(role, content, images)` messages.
    fn split(&self) -> (Messages<'a>, Vec<Tail<'a>>) {
        let messages = self.req.messages;
        let mut reminders: Vec<String> = self.req.wrapped_reminders().collect();
        reminders.extend(self.note.clone());
        if reminders.is_empty() {
            return (messages, Vec::new());
        }
        match self.role {
            ReminderRole::System => (
                messages,
                reminders
                    .into_iter()
                    .map(|r| Tail {
                        role: "system",
                        content: r,
                        images: &[],
                    })
                    .collect(),
            ),
            ReminderRole::User => {
                let joined = reminders.join("\n");
                // Appended to a last user turn, so that no two user turns follow each other.
                match messages.last() {
                    Some(Message::User { content, images }) => (
                        messages.slice(..messages.len() - 1),
                        vec![Tail {
                            role: "user",
                            content: format!("{content}\n\n{joined}"),
                            images,
                        }],
                    ),
                    _ => (
                        messages,
                        vec![Tail {
                            role: "user",
                            content: joined,
                            images: &[],
                        }],
                    ),
                }
            }
        }
    }
}

impl Serialize for WireMessages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (head, tail) = self.split();
        let mut seq = s.serialize_seq(None)?;
        for (i, m) in head.iter().enumerate() {
            seq.serialize_element(&WireMessage(m))?;
            if let Some(images) = ToolImages::after(head, i) {
                seq.serialize_element(&images)?;
            }
        }
        for t in &tail {
            seq.serialize_element(t)?;
        }
        seq.end()
    }
}

/// What an [`OpenAiSession`](super::OpenAiSession) keeps between the requests of its run: the
/// run's previous request body, whose beginning encodes the conversation's first `count`
/// messages, and the tool catalog's encoding.
#[derive(Default)]
pub(super) struct EncodedPrefix {
    /// How many messages `body[..end]` encodes, and the fingerprint of the last of them (to
    /// check that the conversation still begins with them).
    count: usize,
    last: u64,
    /// The previous body: `{"messages":[` and those messages' encodings, then the rest. Its
    /// buffer is reused for the next body when nothing else holds it any more.
    body: Bytes,
    end: usize,
    /// The fingerprint of the catalog encoded in `tools_json` (none: none kept).
    catalog: u64,
    tools_json: Option<Arc<[u8]>>,
    /// What the fields after `messages` and `tools` in `rest_json` were written from (none:
    /// nothing kept). They are the same on every request of a run; they are written again when
    /// any of it changes.
    rest: Option<RestKey>,
    rest_json: Vec<u8>,
}

impl EncodedPrefix {
    /// The length of the last body encoded (0 before the first).
    pub(super) fn last_body_len(&self) -> usize {
        self.body.len()
    }
}

/// The encoding of the tool catalog last offered, and its fingerprint, shared by the sessions of
/// a model: the runs of a model most often offer the same catalog, so a new run neither encodes
/// it again nor keeps a copy of its own.
#[derive(Default)]
pub(super) struct SharedCatalog(Mutex<Option<(u64, Arc<[u8]>)>>);

impl std::fmt::Debug for SharedCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCatalog").finish_non_exhaustive()
    }
}

impl SharedCatalog {
    /// The encoding of `tools`, whose fingerprint is `catalog`: the one kept when it is the
    /// same catalog, else a new one, kept for the next.
    fn encoding(&self, tools: &[ToolSpec], catalog: u64) -> serde_json::Result<Arc<[u8]>> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((fingerprint, json)) = kept.as_ref()
            && *fingerprint == catalog
        {
            return Ok(json.clone());
        }
        let json: Arc<[u8]> = serde_json::to_vec(&WireTools(tools))?.into();
        *kept = Some((catalog, json.clone()));
        Ok(json)
    }
}

/// The room a run's first body has for its conversation besides the catalog and the fields
/// after it, until the model's runs have shown how long theirs grow (see [`BodyRoom`]): a
/// system prompt and a task, and the first rounds; a longer conversation grows the buffer a
/// doubling at a time. The buffer is kept while the run waits on its model, so with thousands
/// of runs in flight each byte of room counts thousands of times: 2 KiB holds a short run's
/// whole conversation, and a longer run pays one copy of its body per doubling.
const FIRST_BODY_ROOM: usize = 2048;

/// The most room a run's first body is given from what earlier runs needed (64 KiB): runs whose
/// bodies grow past it hold no more than that from their start, before they need it (with
/// thousands in flight, each byte counts thousands of times), and each of their rounds sends so
/// much that a copy of the body when it grows is a small part of the round's cost.
const MOST_LEARNED_ROOM: usize = 64 << 10;

/// How long the last bodies of a model's runs have been, learned as its sessions end: a new
/// run's first body is given a buffer that holds what such a run grows to, so that a run like
/// the earlier ones never copies its body into a larger buffer (each copy reads the whole body,
/// long gone from the cache, and writes it again), and a run of short conversations holds no
/// more room than they take. As hyper sizes its read buffer from the reads it has seen, this
/// follows the runs it sees: an average that moves an eighth of the way to each run's length
/// (at most [`MOST_LEARNED_ROOM`]), so one long run does not make every later one hold its
/// room. Until a run has ended, runs start with the fixed [`FIRST_BODY_ROOM`].
#[derive(Debug, Default)]
pub(super) struct BodyRoom(AtomicUsize);

impl BodyRoom {
    /// Notes the length of a run's last body.
    pub(super) fn observe(&self, last_body: usize) {
        let last_body = last_body.min(MOST_LEARNED_ROOM);
        // A lost update (two runs ending at once) only weighs one run less.
        let typical = self.0.load(Ordering::Relaxed);
        let next = if typical == 0 {
            last_body
        } else if last_body >= typical {
            typical + (last_body - typical) / 8
        } else {
            typical - (typical - last_body) / 8
        };
        if next != typical {
            self.0.store(next.max(1), Ordering::Relaxed);
        }
    }

    /// The capacity of a run's first body, whose catalog and fields after the conversation take
    /// `fixed` bytes: what the model's runs grew to, with an eighth more, or the fixed room
    /// before any run has ended.
    fn first_capacity(&self, fixed: usize) -> usize {
        match self.0.load(Ordering::Relaxed) {
            0 => FIRST_BODY_ROOM + fixed,
            typical => (typical + typical / 8).max(fixed + 64),
        }
    }
}

/// `buf` as a body, its buffer kept for the next body of the run. A `BytesMut` that holds its
/// buffer as a plain vector (a `fresh` one) makes an allocation of its own every time it is
/// frozen (the shared header `Bytes` counts its references in); one whose buffer is shared
/// already keeps that header, frozen and taken back as often as the run sends requests. So a
/// fresh buffer is made shared once, here (`split_off` at its end shares it, and the empty rest
/// is dropped): the run's later bodies then cost no allocation at all for their buffer. Only
/// the cost depends on this; the bytes are the same either way.
fn freeze(mut buf: BytesMut, fresh: bool) -> Bytes {
    if fresh {
        drop(buf.split_off(buf.len()));
    }
    buf.freeze()
}

/// What the fields after `messages` and `tools` are written from, besides the configuration
/// (which is the session's model's own and never changes).
#[derive(PartialEq)]
struct RestKey {
    settings: ModelSettings,
    stream: bool,
    offers_tools: bool,
    omit_tool_choice: bool,
    json_object_output: bool,
}

impl WireRequest<'_> {
    /// The body, reusing the encoding of the conversation's beginning (and of the tool catalog)
    /// kept in `prefix` from the run's previous request: the previous body's buffer is truncated
    /// after those messages and the new ones are appended, so neither the beginning nor the
    /// buffer is made again. Gives the same JSON as serializing `self`, with `messages` (and
    /// `tools`) first, and updates `prefix` for the next request.
    pub(super) fn encode_cached(
        &self,
        prefix: &mut EncodedPrefix,
        catalogs: &SharedCatalog,
        room: &BodyRoom,
    ) -> serde_json::Result<Bytes> {
        if self.extras.iter().any(|(name, _)| *name == "messages") {
            return serde_json::to_vec(self).map(Bytes::from);
        }
        let messages = self.messages();
        let (head, tail) = messages.split();
        // A tool result's encoding ends with the round's images when it is the round's last
        // result; a result appended after it since makes it another encoding.
        let reusable = prefix.count > 0
            && prefix.count <= head.len()
            && message_fingerprint(&head[prefix.count - 1]) == prefix.last
            && !(matches!(head[prefix.count - 1], Message::Tool(_))
                && matches!(head.get(prefix.count), Some(Message::Tool(_))));
        // The catalog's encoding first: a new buffer is sized for it.
        let tools = self.req.tools;
        let cache_tools =
            !tools.is_empty() && !self.extras.iter().any(|(name, _)| *name == "tools");
        if cache_tools {
            let catalog = catalog_fingerprint(tools);
            if prefix.tools_json.is_none() || prefix.catalog != catalog {
                prefix.catalog = catalog;
                prefix.tools_json = Some(catalogs.encoding(tools, catalog)?);
            }
        }
        let previous = std::mem::take(&mut prefix.body);
        // The previous body's buffer, when nothing else holds it any more: taken back as a
        // `BytesMut` (made a `Vec` again, it would be moved onto itself, a `memmove` of the
        // whole body), with no copy and no allocation.
        let previous = previous.try_into_mut();
        let fresh = previous.is_err();
        let mut buf: BytesMut = match (reusable, previous) {
            (true, Ok(mut mine)) => {
                mine.truncate(prefix.end);
                mine
            }
            (true, Err(shared)) => {
                let mut b = BytesMut::with_capacity(shared.len() + 1024);
                b.extend_from_slice(&shared[..prefix.end]);
                b
            }
            (false, reclaimed) => {
                // A new buffer (a run's first body) holds the catalog and the fields after it
                // with room for the conversation, rather than growing to them a doubling at a
                // time (an allocation and a copy each).
                let mut b = reclaimed.unwrap_or_else(|_| {
                    let catalog = prefix.tools_json.as_ref().map_or(0, |json| json.len());
                    BytesMut::with_capacity(room.first_capacity(catalog + prefix.rest_json.len()))
                });
                b.clear();
                b.extend_from_slice(b"{\"messages\":[");
                prefix.count = 0;
                b
            }
        };
        for (i, m) in head.iter().enumerate().skip(prefix.count) {
            if buf.last() != Some(&b'[') {
                buf.push(b',');
            }
            write_message(&mut buf, m);
            if let Some(images) = ToolImages::after(head, i) {
                buf.push(b',');
                images.write(&mut buf);
            }
        }
        prefix.end = buf.len();
        if let Some(last) = head.last()
            && prefix.count != head.len()
        {
            prefix.last = message_fingerprint(last);
        }
        prefix.count = head.len();
        for t in &tail {
            if buf.last() != Some(&b'[') {
                buf.push(b',');
            }
            t.write(&mut buf);
        }
        buf.push(b']');
        if cache_tools && let Some(json) = &prefix.tools_json {
            buf.extend_from_slice(b",\"tools\":");
            buf.extend_from_slice(json);
        }
        let settings: &ModelSettings = self.req.settings;
        let offers_tools = !tools.is_empty();
        let kept = prefix.rest.as_ref().is_some_and(|k| {
            k.stream == self.stream
                && k.offers_tools == offers_tools
                && k.omit_tool_choice == self.omit_tool_choice
                && k.json_object_output == self.json_object_output
                && k.settings == *settings
        });
        if !kept {
            prefix.rest_json.clear();
            // Room for the usual fields (model, tool choice, limits) at once.
            prefix.rest_json.reserve(128);
            self.write_rest(&mut prefix.rest_json);
            prefix.rest = Some(RestKey {
                settings: settings.clone(),
                stream: self.stream,
                offers_tools,
                omit_tool_choice: self.omit_tool_choice,
                json_object_output: self.json_object_output,
            });
        }
        buf.extend_from_slice(&prefix.rest_json);
        buf.push(b'}');
        let body = freeze(buf, fresh);
        prefix.body = body.clone();
        Ok(body)
    }

    /// Writes `key` (`,"name":`) and gives `true`, unless an extra replaces the field `name`.
    #[inline(always)]
    fn key(&self, out: &mut impl JsonBuf, name: &str, key: &[u8]) -> bool {
        if self.extras.iter().any(|(extra, _)| *extra == name) {
            return false;
        }
        out.extend_from_slice(key);
        true
    }

    /// Writes the fields after `messages` and `tools`, each after a comma, in the order (and
    /// with the values) of serializing `self`.
    fn write_rest(&self, out: &mut impl JsonBuf) {
        let settings: &ModelSettings = self.req.settings;
        if self.key(out, "model", br#","model":"#) {
            write_str(out, settings.model.as_deref().unwrap_or(&self.config.model));
        }
        // `auto` is sent to the servers that need it said (see
        // `OpenAiConfig::explicit_tool_choice`).
        let tool_choice = match &settings.tool_choice {
            _ if self.req.tools.is_empty() || self.omit_tool_choice => None,
            ToolChoice::Auto if !self.config.explicit_tool_choice => None,
            choice => Some(choice),
        };
        if let Some(choice) = tool_choice
            && self.key(out, "tool_choice", br#","tool_choice":"#)
        {
            match choice {
                ToolChoice::Auto => write_str(out, "auto"),
                ToolChoice::None => write_str(out, "none"),
                ToolChoice::Required => write_str(out, "required"),
                ToolChoice::Tool(name) => write_value(
                    out,
                    &json!({"type": "function", "function": {"name": name}}),
                ),
            }
        }
        if let Some(output) = &settings.output
            && self.key(out, "response_format", br#","response_format":"#)
        {
            if self.json_object_output {
                out.extend_from_slice(br#"{"type":"json_object"}"#);
            } else {
                write_value(out, &response_format(output));
            }
        }
        if let Some(t) = settings.temperature
            && self.key(out, "temperature", br#","temperature":"#)
        {
            write_value(out, &json_number(t));
        }
        if let Some(n) = settings.max_output_tokens {
            let (name, key): (&str, &[u8]) = if self.config.is_openai() {
                ("max_completion_tokens", br#","max_completion_tokens":"#)
            } else {
                ("max_tokens", br#","max_tokens":"#)
            };
            if self.key(out, name, key) {
                write_value(out, &Value::from(n));
            }
        }
        if self.stream {
            if self.key(out, "stream", br#","stream":"#) {
                out.extend_from_slice(b"true");
            }
            if self.key(out, "stream_options", br#","stream_options":"#) {
                out.extend_from_slice(br#"{"include_usage":true}"#);
            }
        }
        for (name, value) in &self.extras {
            out.push(b',');
            write_str(out, name);
            out.push(b':');
            write_value(out, value);
        }
    }
}

/// Writes one message of the conversation: the same bytes as serializing [`WireMessage`].
fn write_message(out: &mut impl JsonBuf, message: &Message) {
    match message {
        Message::System { content } => write_plain(out, "system", content),
        Message::User { content, images } if images.is_empty() => write_plain(out, "user", content),
        Message::User { content, images } => write_user(out, content, images),
        Message::Tool(r) => {
            out.extend_from_slice(br#"{"role":"tool","tool_call_id":"#);
            write_str(out, &r.call_id);
            out.extend_from_slice(br#","content":"#);
            write_str(out, &r.content);
            out.push(b'}');
        }
        Message::Assistant(a) => {
            out.extend_from_slice(br#"{"role":"assistant","content":"#);
            write_str(out, a.text.as_deref().unwrap_or(""));
            if let Some((first, others)) = a.tool_calls.split_first() {
                out.extend_from_slice(br#","tool_calls":["#);
                write_call(out, first);
                for call in others {
                    out.push(b',');
                    write_call(out, call);
                }
                out.push(b']');
            }
            for (k, v) in replayed_fields(a) {
                out.push(b',');
                write_str(out, k);
                out.push(b':');
                write_value(out, v);
            }
            out.push(b'}');
        }
    }
}

/// Writes a [`Plain`] message.
fn write_plain(out: &mut impl JsonBuf, role: &str, content: &str) {
    out.extend_from_slice(br#"{"role":"#);
    write_str(out, role);
    out.extend_from_slice(br#","content":"#);
    write_str(out, content);
    out.push(b'}');
}

/// Writes a [`WireUser`] message.
fn write_user(out: &mut impl JsonBuf, content: &str, images: &[Image]) {
    out.extend_from_slice(br#"{"role":"user","content":["#);
    let text = !content.is_empty();
    if text {
        write_text_part(out, content);
    }
    for (i, image) in images.iter().enumerate() {
        if text || i > 0 {
            out.push(b',');
        }
        write_image_part(out, image);
    }
    out.extend_from_slice(b"]}");
}

/// A `text` content part (its fields in the order of the `json!` object it stands for).
fn write_text_part(out: &mut impl JsonBuf, text: &str) {
    out.extend_from_slice(br#"{"text":"#);
    write_str(out, text);
    out.extend_from_slice(br#","type":"text"}"#);
}

/// An `image_url` content part (its fields in the order of the `json!` object it stands for).
fn write_image_part(out: &mut impl JsonBuf, image: &Image) {
    out.extend_from_slice(br#"{"image_url":{"url":"#);
    write_str(out, &image.url());
    out.extend_from_slice(br#"},"type":"image_url"}"#);
}

/// Writes a [`WireToolCall`]: its `arguments` are written as a JSON string straight from the
/// value, with no text made first.
fn write_call(out: &mut impl JsonBuf, call: &ToolCall) {
    out.extend_from_slice(br#"{"id":"#);
    write_str(out, &call.id);
    out.extend_from_slice(br#","type":"function","function":{"name":"#);
    write_str(out, &call.name);
    out.extend_from_slice(br#","arguments":"#);
    write_value_as_string(out, &call.arguments);
    out.push(b'}');
    if let Some(extra) = extra_content(call) {
        out.extend_from_slice(br#","extra_content":"#);
        write_value(out, extra);
    }
    out.push(b'}');
}

/// A message that follows the conversation: reminders, alone or appended to its last user turn
/// (whose images stay with it).
pub(super) struct Tail<'a> {
    role: &'static str,
    content: String,
    images: &'a [Image],
}

impl Tail<'_> {
    /// Writes the message: the same bytes as serializing it.
    fn write(&self, out: &mut impl JsonBuf) {
        if self.images.is_empty() {
            write_plain(out, self.role, &self.content);
        } else {
            write_user(out, &self.content, self.images);
        }
    }
}

impl Serialize for Tail<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.images.is_empty() {
            Plain {
                role: self.role,
                content: &self.content,
            }
            .serialize(s)
        } else {
            WireUser {
                content: &self.content,
                images: self.images,
            }
            .serialize(s)
        }
    }
}

/// A user turn with images: its content is a `text` part, then an `image_url` part per image (a
/// `data:` URL for an image given by its bytes).
struct WireUser<'a> {
    content: &'a str,
    images: &'a [Image],
}

impl Serialize for WireUser<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Parts<'a>(&'a WireUser<'a>);
        impl Serialize for Parts<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let text = !self.0.content.is_empty();
                let mut seq = s.serialize_seq(Some(self.0.images.len() + usize::from(text)))?;
                if text {
                    seq.serialize_element(&json!({"type": "text", "text": self.0.content}))?;
                }
                for image in self.0.images {
                    seq.serialize_element(&json!({
                        "type": "image_url",
                        "image_url": {"url": image.url()},
                    }))?;
                }
                seq.end()
            }
        }
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("role", "user")?;
        map.serialize_entry("content", &Parts(self))?;
        map.end()
    }
}

/// The images of a round's tool results: Chat Completions takes no images in a tool message,
/// so they follow the round's last result as one user message (a line naming each call, then
/// its images). Whether a message is followed by one depends only on it and its neighbours
/// within the round, so a run's cached encoding stays valid as the conversation grows.
struct ToolImages<'a>(Vec<&'a crate::message::ToolResult>);

impl<'a> ToolImages<'a> {
    /// The images to send after `messages[i]`: when it is the last tool result of a round
    /// whose results hold images.
    fn after(messages: Messages<'a>, i: usize) -> Option<ToolImages<'a>> {
        if !matches!(messages.get(i), Some(Message::Tool(_)))
            || matches!(messages.get(i + 1), Some(Message::Tool(_)))
        {
            return None;
        }
        let mut with_images: Vec<&crate::message::ToolResult> = messages
            .slice(..=i)
            .iter()
            .rev()
            .map_while(|m| match m {
                Message::Tool(r) => Some(r),
                _ => None,
            })
            .filter(|r| !r.images.is_empty())
            .collect();
        with_images.reverse();
        (!with_images.is_empty()).then_some(ToolImages(with_images))
    }
}

impl ToolImages<'_> {
    /// Writes the message: the same bytes as serializing it.
    fn write(&self, out: &mut impl JsonBuf) {
        out.extend_from_slice(br#"{"role":"user","content":["#);
        let mut first = true;
        for result in &self.0 {
            if let Some((caption, images)) = crate::providers::tool_result_images(result) {
                if !first {
                    out.push(b',');
                }
                first = false;
                write_text_part(out, &caption);
                for image in images {
                    out.push(b',');
                    write_image_part(out, image);
                }
            }
        }
        out.extend_from_slice(b"]}");
    }
}

impl Serialize for ToolImages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut parts = Vec::new();
        for result in &self.0 {
            if let Some((caption, images)) = crate::providers::tool_result_images(result) {
                parts.push(json!({"type": "text", "text": caption}));
                parts.extend(
                    images.iter().map(
                        |image| json!({"type": "image_url", "image_url": {"url": image.url()}}),
                    ),
                );
            }
        }
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("role", "user")?;
        map.serialize_entry("content", &parts)?;
        map.end()
    }
}

/// A message that is only a role and text.
#[derive(Serialize)]
pub(super) struct Plain<'a> {
    role: &'a str,
    content: &'a str,
}

/// One message of the conversation on the wire. A session writes the same bytes by hand
/// (`write_message`); this serialization is the reference the property tests hold it to, and
/// what a body encoded whole uses.
pub(super) struct WireMessage<'a>(pub(super) &'a Message);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Message::System { content } => Plain {
                role: "system",
                content,
            }
            .serialize(s),
            Message::User { content, images } if images.is_empty() => Plain {
                role: "user",
                content,
            }
            .serialize(s),
            Message::User { content, images } => WireUser { content, images }.serialize(s),
            Message::Tool(r) => {
                let mut map = s.serialize_map(Some(3))?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", &r.call_id)?;
                map.serialize_entry("content", &r.content)?;
                map.end()
            }
            Message::Assistant(a) => {
                let mut map = s.serialize_map(None)?;
                map.serialize_entry("role", "assistant")?;
                // Never `null`: llama-cpp-python's server refuses a `null` content with a 500,
                // and an empty string is accepted everywhere (OpenAI, vLLM, Mistral, Groq,
                // Ollama, llama.cpp), with or without tool calls.
                map.serialize_entry("content", a.text.as_deref().unwrap_or(""))?;
                if !a.tool_calls.is_empty() {
                    let calls: Vec<WireToolCall> = a.tool_calls.iter().map(WireToolCall).collect();
                    map.serialize_entry("tool_calls", &calls)?;
                }
                for (k, v) in replayed_fields(a) {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// The fields of an assistant turn kept in this adapter's own parts and sent back, a later part
/// replacing an earlier one's field (in the first one's place).
fn replayed_fields(a: &AssistantMessage) -> Vec<(&str, &Value)> {
    let mut replayed: Vec<(&str, &Value)> = Vec::new();
    for part in a.parts.iter().filter(|p| p.provider == PROVIDER) {
        if let Value::Object(fields) = &part.data {
            for (k, v) in fields {
                if !REPLAYED_MESSAGE_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                match replayed.iter_mut().find(|(name, _)| name == k) {
                    Some(slot) => slot.1 = v,
                    None => replayed.push((k, v)),
                }
            }
        }
    }
    replayed
}

/// A call's `extra_content`, kept in its provider data.
fn extra_content(call: &ToolCall) -> Option<&Value> {
    call.provider_data
        .as_ref()
        .and_then(|d| d.get("extra_content"))
}

/// Assistant-message fields kept in this adapter's parts and sent back.
pub(super) const REPLAYED_MESSAGE_FIELDS: &[&str] =
    &["reasoning_content", "refusal", "extra_content"];

/// One tool call of an assistant turn on the wire.
///
/// `arguments` is always valid JSON; the model's invalid text (`invalid_arguments`) is never sent
/// back, because strict servers reject the whole request over it.
pub(super) struct WireToolCall<'a>(&'a ToolCall);

impl Serialize for WireToolCall<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let call = self.0;
        let extra = extra_content(call);
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("id", &call.id)?;
        map.serialize_entry("type", "function")?;
        // The arguments as JSON text, written into a buffer kept for the purpose (`to_string` on
        // a value goes through the formatter, several times slower, and a fresh string each
        // time would be an allocation per call).
        thread_local! {
            static TEXT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        TEXT.with(|text| {
            let mut text = text.try_borrow_mut().map_err(serde::ser::Error::custom)?;
            text.clear();
            serde_json::to_writer(&mut *text, &call.arguments)
                .map_err(serde::ser::Error::custom)?;
            let arguments = std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?;
            let written = map.serialize_entry(
                "function",
                &WireFunction {
                    name: &call.name,
                    arguments,
                },
            );
            // A very large argument does not stay held by the thread.
            if text.capacity() > 64 * 1024 {
                *text = Vec::new();
            }
            written
        })?;
        if let Some(extra) = extra {
            map.serialize_entry("extra_content", extra)?;
        }
        map.end()
    }
}

#[derive(Serialize)]
pub(super) struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// The `tools` array.
pub(super) struct WireTools<'a>(&'a [ToolSpec]);

impl Serialize for WireTools<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            description: &'a str,
            parameters: &'a Value,
        }
        #[derive(Serialize)]
        struct Tool<'a> {
            r#type: &'a str,
            function: Function<'a>,
        }
        s.collect_seq(self.0.iter().map(|t| Tool {
            r#type: "function",
            function: Function {
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::OpenAiModel;
    use super::super::OpenAiSession;
    use super::*;
    use crate::message::{AssistantMessage, ProviderPart, ToolResult};
    use proptest::prelude::*;

    fn settings() -> ModelSettings {
        ModelSettings::default()
    }

    fn conversation() -> Vec<Message> {
        let good = ToolCall {
            id: "call_1".into(),
            name: "read".into(),
            arguments: json!({"path": "a.txt"}),
            invalid_arguments: None,
            provider_data: None,
        };
        let bad = ToolCall::from_raw_arguments("call_2".into(), "write".into(), "{\"path\": ");
        vec![
            Message::system("be brief"),
            Message::user("read a.txt"),
            Message::Assistant(AssistantMessage {
                text: None,
                tool_calls: vec![good, bad],
                parts: vec![
                    ProviderPart {
                        provider: "anthropic".into(),
                        data: json!({"type": "thinking", "thinking": "hmm", "signature": "s"}),
                    },
                    ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({"reasoning_content": "I should read it"}),
                    },
                ],
            }),
            Message::Tool(ToolResult {
                call_id: "call_1".into(),
                name: "read".into(),
                content: "hello".into(),
                is_error: false,
                images: Vec::new(),
            }),
            Message::Tool(ToolResult {
                call_id: "call_2".into(),
                name: "write".into(),
                content: "arguments are not valid JSON".into(),
                is_error: true,
                images: Vec::new(),
            }),
        ]
    }

    /// One step of a growing conversation, for the prefix-cache property.
    #[derive(Debug, Clone)]
    enum Step {
        /// Append this message of [`conversation`] (by index, cycling).
        Append(usize),
        /// Set the number of reminders for the next requests.
        Reminders(usize),
        /// Break the promise: change the last message (the cache must notice).
        EditLast,
        /// Drop the last message (the cache must notice).
        Shrink,
        /// Start a new run on the other of two models (a new session, with nothing kept).
        NewRun,
        /// Start a new run on the same model (a new session, sharing the model's catalog).
        NewSession,
        /// Offer another tool catalog (none, one tool, or that tool described differently).
        Tools(usize),
        /// Change the settings to one of [`knobs`] (the fields after the conversation).
        Settings(usize),
        /// Stream the next requests, or stop streaming them.
        Stream,
    }

    /// Settings whose fields after the conversation take each of their forms.
    fn knobs(which: usize) -> ModelSettings {
        let mut settings = settings();
        match which {
            0 => {}
            1 => {
                settings.temperature = Some(0.7);
                settings.max_output_tokens = Some(100);
                settings.model = Some("other \"model\"".into());
            }
            2 => {
                settings.tool_choice = ToolChoice::Required;
                settings.output = Some(OutputSchema::new(
                    "Answer",
                    json!({"type": "object", "properties": {"a": {"type": "string"}},
                           "required": ["a"]}),
                ));
            }
            3 => {
                settings.tool_choice = ToolChoice::Tool("read \"x\"".into());
                settings.extra = Some(json!({"seed": 7, "max_tokens": 9}));
                settings.max_output_tokens = Some(100);
            }
            _ => {
                settings.tool_choice = ToolChoice::None;
                settings.temperature = Some(1.1);
            }
        }
        settings
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0usize..8).prop_map(Step::Append),
            2 => (0usize..3).prop_map(Step::Reminders),
            1 => Just(Step::EditLast),
            1 => Just(Step::Shrink),
            1 => Just(Step::NewRun),
            1 => Just(Step::NewSession),
            1 => (0usize..3).prop_map(Step::Tools),
            1 => (0usize..5).prop_map(Step::Settings),
            1 => Just(Step::Stream),
        ]
    }

    proptest! {
        #[test]
        fn cached_encoding_is_the_full_encoding(
            steps in proptest::collection::vec(step(), 1..24),
            user_role in proptest::bool::ANY,
            mut stream in proptest::bool::ANY,
            extra in 0usize..3,
            keep in proptest::collection::vec(proptest::bool::ANY, 24),
            first_settings in 0usize..5,
        ) {
            let mut template = conversation();
            template.push(Message::user_with_images("and this?", [
                Image::from_bytes(b"GIF89a\x01\x00").unwrap(),
                Image::from_url("https://example.com/a.png").unwrap(),
            ]));
            // A tool result with an image (its round's images follow its round's last result).
            template.push(Message::Tool(ToolResult {
                call_id: "call_1".into(),
                name: "read".into(),
                content: "a chart".into(),
                is_error: false,
                images: vec![Image::from_bytes(b"GIF89a\x01\x00").unwrap()],
            }));
            let mut configs = [
                OpenAiConfig::new("m").with_base_url("http://127.0.0.1:1/v1"),
                OpenAiConfig::new("m2").with_base_url("http://127.0.0.1:1/v1"),
            ];
            for c in &mut configs {
                c.reminder_role = if user_role { ReminderRole::User } else { ReminderRole::System };
                c.extra = match extra {
                    0 => None,
                    // (`extra` may not set the fields the adapter owns: see OWNED_FIELDS.)
                    1 => Some(json!({"top_k": 20, "temperature": 0.5})),
                    _ => Some(json!({"metadata": {"tools": [{"name": "x"}]}})),
                };
            }
            let models = configs.clone().map(OpenAiModel::new);
            let catalog = |description: &str| vec![ToolSpec {
                name: "read".into(),
                description: description.into(),
                parameters: json!({"type": "object"}),
            }];
            let catalogs = [catalog("Reads"), Vec::new(), catalog("Reads \"quoted\"")];
            let mut tools = &catalogs[0];
            let mut settings = knobs(first_settings);
            let mut session = OpenAiSession::new(&models[0]);
            let (mut messages, mut reminders, mut which) = (vec![Message::user("go")], Vec::new(), 0);
            // Bodies still held elsewhere (as by a transport retrying): their buffer must not be
            // reused.
            let mut held = Vec::new();
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Append(i) => messages.push(template[i % template.len()].clone()),
                    Step::Reminders(n) => reminders = (0..n).map(|i| format!("r{i}")).collect(),
                    Step::EditLast => {
                        if let Some(Message::User { content, .. } | Message::System { content }) = messages.last_mut() {
                            content.push('!');
                        } else {
                            messages.push(Message::user("edited"));
                        }
                    }
                    Step::Shrink => {
                        messages.pop();
                    }
                    Step::NewRun => {
                        which = 1 - which;
                        session = OpenAiSession::new(&models[which]);
                    }
                    Step::NewSession => session = OpenAiSession::new(&models[which]),
                    Step::Tools(i) => tools = &catalogs[i],
                    Step::Settings(i) => settings = knobs(i),
                    Step::Stream => stream = !stream,
                }
                let request = ModelRequest {
                    messages: (&messages).into(),
                    reminders: &reminders,
                    tools,
                    settings: &settings,
                };
                let body = session.request_body(&request, stream).unwrap();
                let cached: Value = serde_json::from_slice(&body).unwrap();
                if keep[i] {
                    held.push((body.clone(), cached.clone()));
                }
                for (body, value) in &held {
                    prop_assert_eq!(&serde_json::from_slice::<Value>(body).unwrap(), value);
                }
                prop_assert_eq!(cached, build_request_body(&request, &configs[which], stream));
            }
        }
    }

    /// Messages of every shape, their strings and values full of what needs escaping.
    fn message() -> impl Strategy<Value = Message> {
        use crate::providers::json_write::arbitrary::{text, value};
        let image = prop_oneof![
            Just(Image::from_bytes(b"GIF89a\x01\x00").unwrap()),
            Just(Image::from_url("https://example.com/a.png?q=1&r=%22").unwrap()),
        ];
        let images = proptest::collection::vec(image, 0..3);
        let call = (
            text(),
            text(),
            value(),
            proptest::option::of(prop_oneof![
                value(),
                value().prop_map(|v| json!({"extra_content": v, "other": 1})),
            ]),
        )
            .prop_map(|(id, name, arguments, provider_data)| ToolCall {
                id,
                name,
                arguments,
                invalid_arguments: None,
                provider_data,
            });
        let part = (
            proptest::sample::select(vec![PROVIDER, "anthropic"]),
            proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "reasoning_content",
                        "refusal",
                        "extra_content",
                        "thinking",
                    ]),
                    value(),
                ),
                0..3,
            ),
        )
            .prop_map(|(provider, fields)| ProviderPart {
                provider: provider.into(),
                data: Value::Object(fields.into_iter().map(|(k, v)| (k.into(), v)).collect()),
            });
        prop_oneof![
            text().prop_map(|content| Message::System { content }),
            (text(), images.clone())
                .prop_map(|(content, images)| Message::User { content, images }),
            (text(), text(), text(), images).prop_map(|(call_id, name, content, images)| {
                Message::Tool(ToolResult {
                    call_id,
                    name,
                    content,
                    is_error: false,
                    images,
                })
            }),
            (
                proptest::option::of(text()),
                proptest::collection::vec(call, 0..3),
                proptest::collection::vec(part, 0..3),
            )
                .prop_map(|(text, tool_calls, parts)| {
                    Message::Assistant(AssistantMessage {
                        text,
                        tool_calls,
                        parts,
                    })
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// The messages a session writes itself are serde's bytes: each message, the images
        /// after a round's results, and the reminders after the conversation.
        #[test]
        fn written_messages_are_serde_json_bytes(
            messages in proptest::collection::vec(message(), 1..6),
            reminders in proptest::collection::vec(crate::providers::json_write::arbitrary::text(), 0..3),
            user_role in proptest::bool::ANY,
        ) {
            let head: Messages<'_> = (&messages).into();
            for (i, m) in messages.iter().enumerate() {
                let mut out = b"[".to_vec();
                write_message(&mut out, m);
                prop_assert_eq!(&out[1..], &serde_json::to_vec(&WireMessage(m)).unwrap()[..]);
                if let Some(images) = ToolImages::after(head, i) {
                    let mut out = Vec::new();
                    images.write(&mut out);
                    prop_assert_eq!(out, serde_json::to_vec(&images).unwrap());
                }
            }
            let settings = settings();
            let req = ModelRequest {
                messages: head,
                reminders: &reminders,
                tools: &[],
                settings: &settings,
            };
            let wire = WireMessages {
                req: &req,
                role: if user_role { ReminderRole::User } else { ReminderRole::System },
                note: None,
            };
            for t in &wire.split().1 {
                let mut out = Vec::new();
                t.write(&mut out);
                prop_assert_eq!(out, serde_json::to_vec(t).unwrap());
            }
        }
    }

    #[test]
    fn the_sessions_of_a_model_share_the_encoding_of_its_catalog() {
        let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url("http://127.0.0.1:1/v1"));
        let tools = vec![ToolSpec {
            name: "read".into(),
            description: "Reads".into(),
            parameters: json!({"type": "object"}),
        }];
        let settings = settings();
        let messages = vec![Message::user("go")];
        let request = |tools| ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools,
            settings: &settings,
        };
        let encoding = |session: &OpenAiSession| {
            let prefix = session.model.prefix.as_ref().unwrap().lock().unwrap();
            prefix.tools_json.clone().unwrap()
        };
        let (a, b) = (OpenAiSession::new(&model), OpenAiSession::new(&model));
        a.request_body(&request(&tools), false).unwrap();
        // Another run's catalog, equal but not the same memory: the same encoding.
        let copy = tools.clone();
        b.request_body(&request(&copy), false).unwrap();
        assert!(Arc::ptr_eq(&encoding(&a), &encoding(&b)));
        // Another catalog: its own encoding, sent.
        let mut other = tools.clone();
        other[0].description = "Reads \"more\"".into();
        let body = b.request_body(&request(&other), false).unwrap();
        assert!(!Arc::ptr_eq(&encoding(&a), &encoding(&b)));
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["tools"][0]["function"]["description"],
            "Reads \"more\""
        );
        // The first session still sends its own catalog.
        let body: Value =
            serde_json::from_slice(&a.request_body(&request(&tools), false).unwrap()).unwrap();
        assert_eq!(body["tools"][0]["function"]["description"], "Reads");
    }

    fn body(
        messages: &[Message],
        reminders: &[String],
        config: &OpenAiConfig,
        s: &ModelSettings,
    ) -> Value {
        let tools = [ToolSpec {
            name: "read".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }];
        let req = ModelRequest {
            messages: messages.into(),
            reminders,
            tools: &tools,
            settings: s,
        };
        build_request_body(&req, config, false)
    }
    #[test]
    fn assistant_turns_carry_tool_calls_and_tool_turns_their_call_id() {
        let b = body(
            &conversation(),
            &[],
            &OpenAiConfig::new("gpt-x"),
            &settings(),
        );
        let m = &b["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "read a.txt"}));
        assert_eq!(m[2]["role"], "assistant");
        // Never `null`: llama-cpp-python's server refuses it.
        assert_eq!(m[2]["content"], "");
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "call_1", "type": "function",
                   "function": {"name": "read", "arguments": "{\"path\":\"a.txt\"}"}})
        );
        // Our own part is sent back as its field; Anthropic's is dropped.
        assert_eq!(m[2]["reasoning_content"], "I should read it");
        assert!(m[2].get("thinking").is_none() && m[2].get("signature").is_none());
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "hello"})
        );
        assert_eq!(m[4]["tool_call_id"], "call_2");
        assert_eq!(b["model"], "gpt-x");
        assert_eq!(b["tools"][0]["type"], "function");
        assert_eq!(b["tools"][0]["function"]["name"], "read");
        assert!(
            b.get("tool_choice").is_none(),
            "auto is left out for OpenAI"
        );
        let other = OpenAiConfig::new("m").with_base_url("http://localhost:8080/v1");
        let b = body(&conversation(), &[], &other, &settings());
        assert_eq!(b["tool_choice"], "auto", "and said to other servers");
        assert_eq!(b["messages"][2]["content"], "");
        assert!(b.get("stream").is_none());
    }

    #[test]
    fn invalid_arguments_are_never_replayed() {
        let b = body(&conversation(), &[], &OpenAiConfig::new("m"), &settings());
        let sent = b.to_string();
        assert!(
            !sent.contains("{\\\"path\\\": \""),
            "raw invalid text leaked: {sent}"
        );
        let args = b["messages"][2]["tool_calls"][1]["function"]["arguments"]
            .as_str()
            .unwrap();
        assert_eq!(serde_json::from_str::<Value>(args).unwrap(), json!({}));
    }

    #[test]
    fn reminders_follow_the_conversation_as_system_messages_for_openai() {
        let config = OpenAiConfig::new("m");
        assert_eq!(config.reminder_role, ReminderRole::System);
        let reminders = vec!["one".to_string(), "two".to_string()];
        let b = body(&conversation(), &reminders, &config, &settings());
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 7);
        assert_eq!(
            m[5],
            json!({"role": "system", "content": "<system-reminder>one</system-reminder>"})
        );
        assert_eq!(
            m[6],
            json!({"role": "system", "content": "<system-reminder>two</system-reminder>"})
        );
    }

    #[test]
    fn reminders_are_one_trailing_user_message_for_other_servers() {
        let config = OpenAiConfig::new("m").with_base_url("http://127.0.0.1:11434/v1");
        assert_eq!(config.reminder_role, ReminderRole::User);
        assert!(config.rescue_text_tool_calls);
        let reminders = vec!["one".to_string(), "two".to_string()];
        let b = body(&conversation(), &reminders, &config, &settings());
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(
            m[5],
            json!({"role": "user", "content":
                "<system-reminder>one</system-reminder>\n<system-reminder>two</system-reminder>"})
        );
        // A conversation ending with a user turn gets the reminders appended to it instead.
        let convo = vec![Message::system("s"), Message::user("hi")];
        let b = body(&convo, &reminders[..1], &config, &settings());
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[1]["content"],
            "hi\n\n<system-reminder>one</system-reminder>"
        );
        // The user can choose system messages anywhere.
        let mut config = config;
        config.reminder_role = ReminderRole::System;
        let b = body(&convo, &reminders[..1], &config, &settings());
        assert_eq!(b["messages"][2]["role"], "system");
        assert_eq!(b["messages"][1]["content"], "hi");
    }

    #[test]
    fn a_user_turn_with_images_is_a_text_part_then_image_url_parts() {
        let gif = Image::from_bytes(b"GIF89a\x01\x00").unwrap();
        let web = Image::from_url("https://example.com/a.png").unwrap();
        let convo = vec![Message::user_with_images("what is this?", [gif, web])];
        let expected = json!([
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGODlhAQA="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]);
        let config = OpenAiConfig::new("m");
        let b = body(&convo, &[], &config, &settings());
        assert_eq!(b["messages"][0]["role"], "user");
        assert_eq!(b["messages"][0]["content"], expected);
        // Reminders appended to the last user turn keep its images.
        let config = OpenAiConfig::new("m").with_base_url("http://127.0.0.1:11434/v1");
        let b = body(&convo, &["one".to_string()], &config, &settings());
        let content = &b["messages"][0]["content"];
        assert_eq!(
            content[0]["text"],
            "what is this?\n\n<system-reminder>one</system-reminder>"
        );
        assert_eq!(content[1], expected[1]);
        assert_eq!(content[2], expected[2]);
        // A turn without images stays a plain string.
        let b = body(&[Message::user("hi")], &[], &config, &settings());
        assert_eq!(b["messages"][0]["content"], "hi");
    }

    #[test]
    fn settings_limits_stream_options_and_extra_merge() {
        let mut s = settings();
        s.temperature = Some(0.7);
        s.max_output_tokens = Some(100);
        s.tool_choice = ToolChoice::Tool("read".into());
        s.extra = Some(json!({"top_k": 20, "temperature": 0.1}));
        let mut config = OpenAiConfig::new("m");
        config.extra = Some(json!({"seed": 7, "top_k": 5}));
        let msgs = [Message::user("x")];
        let tools = [];
        let req = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &tools,
            settings: &s,
        };
        let b = build_request_body(&req, &config, true);
        assert_eq!(b["max_completion_tokens"], 100);
        assert!(b.get("max_tokens").is_none());
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
        assert!(b.get("tool_choice").is_none(), "no tools, no tool_choice");
        assert_eq!(b["seed"], 7);
        assert_eq!(b["top_k"], 20, "settings' extra wins over the config's");
        assert_eq!(b["temperature"], 0.1, "extra is merged last");

        let config = OpenAiConfig::new("m").with_base_url("http://localhost:8000/v1");
        s.extra = None;
        let b = body(&msgs, &[], &config, &s);
        assert_eq!(b["max_tokens"], 100);
        assert!(b.get("max_completion_tokens").is_none());
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(
            b["tool_choice"],
            json!({"type": "function", "function": {"name": "read"}})
        );
        s.tool_choice = ToolChoice::Required;
        assert_eq!(body(&msgs, &[], &config, &s)["tool_choice"], "required");
    }

    #[test]
    fn an_output_schema_is_a_json_schema_response_format_strict_only_when_it_can_be() {
        let closed = json!({"type": "object", "properties": {"a": {"type": "string"}},
                            "required": ["a"]});
        let mut s = settings();
        s.output = Some(crate::output::OutputSchema::new("Answer", closed.clone()));
        let b = body(&[Message::user("x")], &[], &OpenAiConfig::new("m"), &s);
        let format = &b["response_format"];
        assert_eq!(format["type"], "json_schema");
        assert_eq!(format["json_schema"]["name"], "Answer");
        assert_eq!(format["json_schema"]["strict"], true);
        assert_eq!(
            format["json_schema"]["schema"]["additionalProperties"], false,
            "closed for strict decoding"
        );
        // An optional property: no strict form.
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        s.output = Some(crate::output::OutputSchema::new("Answer", open.clone()));
        let b = body(&[Message::user("x")], &[], &OpenAiConfig::new("m"), &s);
        assert_eq!(b["response_format"]["json_schema"]["strict"], false);
        assert_eq!(b["response_format"]["json_schema"]["schema"], open);
        // Not asked for strict: sent as it is.
        s.output =
            Some(crate::output::OutputSchema::new("Answer", closed.clone()).with_strict(false));
        let b = body(&[Message::user("x")], &[], &OpenAiConfig::new("m"), &s);
        assert_eq!(b["response_format"]["json_schema"]["strict"], false);
        assert_eq!(b["response_format"]["json_schema"]["schema"], closed);
        assert!(
            body(
                &[Message::user("x")],
                &[],
                &OpenAiConfig::new("m"),
                &settings()
            )
            .get("response_format")
            .is_none()
        );
    }

    #[test]
    fn a_models_first_body_room_follows_the_length_its_runs_reach() {
        let room = BodyRoom::default();
        // Before any run has ended: the fixed room beside the catalog and the other fields.
        assert_eq!(room.first_capacity(500), FIRST_BODY_ROOM + 500);
        // The first run's length is taken as it is, with an eighth more.
        room.observe(8000);
        assert_eq!(room.first_capacity(500), 9000);
        // Later runs move it an eighth of the way, up or down.
        room.observe(16000);
        assert_eq!(room.first_capacity(500), 9000 + 1125);
        room.observe(1000);
        assert_eq!(room.0.load(Ordering::Relaxed), 9000 - 1000);
        // Never less than the catalog and the other fields, with a little room.
        let short = BodyRoom::default();
        short.observe(10);
        assert_eq!(short.first_capacity(500), 564);
        // A huge run counts as 64 KiB.
        let huge = BodyRoom::default();
        huge.observe(usize::MAX);
        assert_eq!(huge.0.load(Ordering::Relaxed), MOST_LEARNED_ROOM);
    }
}
