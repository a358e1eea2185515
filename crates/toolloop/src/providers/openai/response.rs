//! Complete responses: a `chat.completion` body decoded into a [`ModelResponse`].

use super::config::PROVIDER;
use super::error::{api_error_from_value, preview};
use super::request::REPLAYED_MESSAGE_FIELDS;
use crate::message::{ProviderPart, ToolCall, new_call_id};
use crate::model::{FinishReason, ModelError, ModelResponse};
use crate::usage::Usage;
use serde_json::{Value, json};

/// Decodes a complete response: through typed, borrowing structures when the body has the usual
/// shape, and through a JSON value otherwise (every quirk, and errors that say what was wrong).
/// Both give the same response for any body the first accepts.
pub(super) fn decode_response(body: &[u8]) -> Result<ModelResponse, ModelError> {
    match typed::decode(body) {
        Some(response) => Ok(response),
        None => decode_value(body),
    }
}

/// The typed fast path of [`decode_response`].
pub(super) mod typed {
    use super::super::in_place::{self, Fields, InPlace, Object, Seq, Str};
    use super::{
        PROVIDER, ProviderPart, REPLAYED_MESSAGE_FIELDS, ToolCall, map_finish, new_call_id,
        parse_usage, settle_finish,
    };
    use crate::message::parse_arguments;
    use crate::model::ModelResponse;
    use crate::usage::Usage;
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value, json};
    use std::borrow::Cow;
    use std::fmt;

    /// A usage object of whole counts (anything else goes the value path), read in place.
    #[derive(Default)]
    pub(in crate::providers::openai) struct WireUsage {
        prompt_tokens: Option<u64>,
        completion_tokens: Option<u64>,
        prompt_tokens_details: Option<Details>,
        cached_tokens: Option<u64>,
        prompt_cache_hit_tokens: Option<u64>,
        num_cached_tokens: Option<u64>,
        completion_tokens_details: Option<Details>,
    }

    #[derive(Default)]
    pub(in crate::providers::openai) struct Details {
        cached_tokens: Option<u64>,
        reasoning_tokens: Option<u64>,
    }

    impl<'de> Fields<'de> for WireUsage {
        const NAMES: &'static [&'static str] = &[
            "prompt_tokens",
            "completion_tokens",
            "prompt_tokens_details",
            "cached_tokens",
            "prompt_cache_hit_tokens",
            "num_cached_tokens",
            "completion_tokens_details",
        ];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.prompt_tokens = map.next_value()?,
                1 => self.completion_tokens = map.next_value()?,
                2 => map.next_value_seed(Object(&mut self.prompt_tokens_details))?,
                3 => self.cached_tokens = map.next_value()?,
                4 => self.prompt_cache_hit_tokens = map.next_value()?,
                5 => self.num_cached_tokens = map.next_value()?,
                _ => map.next_value_seed(Object(&mut self.completion_tokens_details))?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for Details {
        const NAMES: &'static [&'static str] = &["cached_tokens", "reasoning_tokens"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.cached_tokens = map.next_value()?,
                _ => self.reasoning_tokens = map.next_value()?,
            }
            Ok(())
        }
    }

    impl WireUsage {
        /// The usage, or `None` without a prompt or completion count (then the tokens are
        /// unknown, not zero).
        pub(in crate::providers::openai) fn usage(&self) -> Option<Usage> {
            if self.prompt_tokens.is_none() && self.completion_tokens.is_none() {
                return None;
            }
            let cache_read = self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .or(self.cached_tokens)
                .or(self.prompt_cache_hit_tokens)
                .or(self.num_cached_tokens)
                .unwrap_or(0);
            Some(Usage {
                input_tokens: self.prompt_tokens.unwrap_or(0),
                output_tokens: self.completion_tokens.unwrap_or(0),
                cache_read_tokens: cache_read,
                cache_write_tokens: 0,
                reasoning_tokens: self
                    .completion_tokens_details
                    .as_ref()
                    .and_then(|d| d.reasoning_tokens)
                    .unwrap_or(0),
            })
        }
    }

    /// A string, borrowed from the input when it holds no escape.
    struct CowStr;

    impl<'de> Visitor<'de> for CowStr {
        type Value = Cow<'de, str>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Cow::Borrowed(v))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v))
        }
    }

    /// `#[serde(deserialize_with = "opt_str")]` for an `Option<Cow<str>>` that borrows from the
    /// input when the string has no escapes: serde's own `Option<Cow<str>>` always copies (its
    /// `borrow` attribute reaches a `Cow` only when the `Cow` is the field's type itself).
    pub(in crate::providers::openai) fn opt_str<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Cow<'de, str>>, D::Error> {
        struct OptStr;
        impl<'de> serde::de::Visitor<'de> for OptStr {
            type Value = Option<Cow<'de, str>>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or null")
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_str(CowStr).map(Some)
            }
        }
        d.deserialize_option(OptStr)
    }

    /// A JSON array that nearly always holds one element (a chunk's `choices`, a delta's
    /// `tool_calls`): the first is kept inline, so reading it allocates nothing; any others go
    /// to a `Vec`.
    pub(in crate::providers::openai) struct Few<T> {
        /// The first element, if any.
        pub(in crate::providers::openai) first: Option<T>,
        /// The others, in order (empty without a first).
        pub(in crate::providers::openai) rest: Vec<T>,
    }

    impl<T> Default for Few<T> {
        fn default() -> Self {
            Few {
                first: None,
                rest: Vec::new(),
            }
        }
    }

    impl<T> IntoIterator for Few<T> {
        type Item = T;
        type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;
        fn into_iter(self) -> Self::IntoIter {
            self.first.into_iter().chain(self.rest)
        }
    }

    impl<'b, T> IntoIterator for &'b Few<T> {
        type Item = &'b T;
        type IntoIter = std::iter::Chain<std::option::Iter<'b, T>, std::slice::Iter<'b, T>>;
        fn into_iter(self) -> Self::IntoIter {
            self.first.iter().chain(&self.rest)
        }
    }

    impl<T> Few<T> {
        /// The elements, in order.
        pub(in crate::providers::openai) fn iter(&self) -> <&Self as IntoIterator>::IntoIter {
            self.into_iter()
        }
    }

    /// A `chat.completion` read in place (see [`in_place`]): strings borrowed from the body where
    /// they hold no escape, the tool calls written straight into the [`ToolCall`]s the response
    /// keeps, each call's argument text parsed as it is read (an escaped one from serde_json's
    /// scratch buffer, never copied into a `String` of its own).
    #[derive(Default)]
    struct Completion<'a> {
        /// A non-null `error`.
        error: bool,
        /// `choices` (required, an array).
        choices: Few<Choice<'a>>,
        usage: Option<WireUsage>,
        x_groq: Option<Value>,
    }

    #[derive(Default)]
    struct Choice<'a> {
        index: Option<u64>,
        message: Option<Message<'a>>,
        finish_reason: Option<Cow<'a, str>>,
    }

    #[derive(Default)]
    struct Message<'a> {
        content: Option<Cow<'a, str>>,
        /// `tool_calls` (absent or `null`: none), each call's id empty when absent, `null` or
        /// empty.
        tool_calls: Vec<ToolCall>,
        /// The fields of [`REPLAYED_MESSAGE_FIELDS`], in its order.
        replayed: [Option<Value>; 3],
    }

    /// A call of the message, read into the [`ToolCall`] the response keeps: `function` and
    /// its `name` are required (`null` is not a name).
    struct Call<'p>(&'p mut ToolCall);

    /// A call's `function` object, read into its [`ToolCall`].
    struct Function<'p>(&'p mut ToolCall);

    impl<'de> Fields<'de> for Completion<'de> {
        const NAMES: &'static [&'static str] = &["error", "choices", "usage", "x_groq"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.error = map.next_value::<Option<IgnoredAny>>()?.is_some(),
                1 => map.next_value_seed(Seq(&mut self.choices))?,
                2 => map.next_value_seed(Object(&mut self.usage))?,
                _ => self.x_groq = map.next_value()?,
            }
            Ok(())
        }
        fn missing(seen: u32) -> Option<&'static str> {
            (seen & 0b10 == 0).then_some("choices")
        }
    }

    impl<'de> Fields<'de> for Choice<'de> {
        const NAMES: &'static [&'static str] = &["index", "message", "finish_reason"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.index = map.next_value()?,
                1 => map.next_value_seed(Object(&mut self.message))?,
                _ => self.finish_reason = map.next_value_seed(Str)?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for Message<'de> {
        const NAMES: &'static [&'static str] = &[
            "content",
            "tool_calls",
            REPLAYED_MESSAGE_FIELDS[0],
            REPLAYED_MESSAGE_FIELDS[1],
            REPLAYED_MESSAGE_FIELDS[2],
        ];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.content = map.next_value_seed(Str)?,
                1 => map.next_value_seed(Calls(&mut self.tool_calls))?,
                n => self.replayed[n - 2] = map.next_value()?,
            }
            Ok(())
        }
    }

    impl<'de> Fields<'de> for Call<'_> {
        const NAMES: &'static [&'static str] = &["id", "function", "extra_content"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => {
                    if let Some(id) = map.next_value_seed(Str)? {
                        self.0.id = id.into_owned();
                    }
                }
                1 => map.next_value_seed(InPlace(&mut Function(self.0)))?,
                _ => {
                    self.0.provider_data = map
                        .next_value::<Option<Value>>()?
                        .map(|x| json!({ "extra_content": x }));
                }
            }
            Ok(())
        }
        fn missing(seen: u32) -> Option<&'static str> {
            (seen & 0b10 == 0).then_some("function")
        }
    }

    impl<'de> Fields<'de> for Function<'_> {
        const NAMES: &'static [&'static str] = &["name", "arguments"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.0.name = map.next_value_seed(Name)?.into_owned(),
                _ => map.next_value_seed(Arguments(self.0))?,
            }
            Ok(())
        }
        fn missing(seen: u32) -> Option<&'static str> {
            (seen & 0b1 == 0).then_some("name")
        }
    }

    /// A call's name: a string (not `null`), borrowed when it holds no escape.
    struct Name;

    impl<'de> DeserializeSeed<'de> for Name {
        type Value = Cow<'de, str>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(CowStr)
        }
    }

    /// Reads a JSON array of calls or `null` (left empty) into the message's calls in place.
    struct Calls<'p>(&'p mut Vec<ToolCall>);

    impl<'de> DeserializeSeed<'de> for Calls<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_option(self)
        }
    }

    impl<'de> Visitor<'de> for Calls<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON array or null")
        }
        fn visit_none<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let calls = self.0;
            loop {
                calls.push(ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: Value::Object(Map::new()),
                    invalid_arguments: None,
                    provider_data: None,
                });
                let call = calls.last_mut().expect("just pushed");
                if seq.next_element_seed(InPlace(&mut Call(call)))?.is_none() {
                    calls.pop();
                    return Ok(());
                }
            }
        }
    }

    /// A call's argument text (a string, or `null` for none), parsed into its [`ToolCall`] as
    /// [`ToolCall::from_raw_arguments`] does, straight from the text serde_json read (the body
    /// itself, or its scratch buffer for a text with escapes).
    struct Arguments<'p>(&'p mut ToolCall);

    impl<'de> DeserializeSeed<'de> for Arguments<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_option(self)
        }
    }

    impl<'de> Visitor<'de> for Arguments<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or null")
        }
        fn visit_none<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_str(self)
        }
        fn visit_str<E>(self, raw: &str) -> Result<(), E> {
            (self.0.arguments, self.0.invalid_arguments) = parse_arguments(raw);
            Ok(())
        }
    }

    /// The response, or `None` when the body is not of the usual shape (or is an error).
    pub(super) fn decode(body: &[u8]) -> Option<ModelResponse> {
        // One check of the whole body is cheaper than serde_json's check of each string.
        let body = std::str::from_utf8(body).ok()?;
        let mut c = Completion::default();
        in_place::parse(body, &mut c).ok()?;
        if c.error {
            return None;
        }
        let usage = match (&c.usage, &c.x_groq) {
            (Some(u), _) => u.usage(),
            (None, Some(x)) => x
                .get("usage")
                .filter(|u| u.is_object())
                .and_then(parse_usage),
            (None, None) => None,
        };
        let index = c
            .choices
            .iter()
            .position(|c| c.index.unwrap_or(0) == 0)
            .unwrap_or(0);
        let choice = c.choices.into_iter().nth(index)?;
        let mut response = ModelResponse {
            text: None,
            finish_reason: settle_finish(None, false),
            tool_calls: Vec::new(),
            usage,
            parts: Vec::new(),
            malformed_call: None,
            context_edited: None,
        };
        if let Some(msg) = choice.message {
            response.text = msg.content.filter(|t| !t.is_empty()).map(Cow::into_owned);
            for (field, value) in REPLAYED_MESSAGE_FIELDS.iter().zip(msg.replayed) {
                let kept = match &value {
                    Some(Value::String(s)) => !s.is_empty(),
                    Some(Value::Null) | None => false,
                    Some(_) => true,
                };
                if let (true, Some(value)) = (kept, value) {
                    response.parts.push(ProviderPart {
                        provider: PROVIDER.into(),
                        data: json!({ *field: value }),
                    });
                }
            }
            response.tool_calls = msg.tool_calls;
            for call in &mut response.tool_calls {
                if call.name.is_empty() {
                    // The value path says which call and why.
                    return None;
                }
                if call.id.is_empty() {
                    call.id = new_call_id();
                }
            }
        }
        let finish = choice.finish_reason.as_deref().map(map_finish);
        response.finish_reason = settle_finish(finish, !response.tool_calls.is_empty());
        Some(response)
    }
}

/// The value path of [`decode_response`].
pub(super) fn decode_value(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "the response body is not JSON ({e}); expected a chat.completion object, got: {}",
            preview(&String::from_utf8_lossy(body))
        ))
    })?;
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Err(ModelError::Api(api_error_from_value(200, &v, None)));
    }
    let choices = v.get("choices").and_then(Value::as_array).ok_or_else(|| {
        ModelError::InvalidResponse(format!(
            "the response has no `choices` array; expected a chat.completion object, got: {}",
            preview(&v.to_string())
        ))
    })?;
    let choice = choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        .or_else(|| choices.first())
        .ok_or_else(|| {
            ModelError::InvalidResponse("the response's `choices` array is empty".into())
        })?;
    let usage = usage_of(&v);
    let empty = Value::Null;
    let msg = choice.get("message").unwrap_or(&empty);

    let text = content_text(msg.get("content")).filter(|t| !t.is_empty());
    let mut parts = Vec::new();
    for field in REPLAYED_MESSAGE_FIELDS {
        if let Some(value) = msg.get(*field).filter(|x| match x {
            Value::String(s) => !s.is_empty(),
            Value::Null => false,
            _ => true,
        }) {
            parts.push(ProviderPart {
                provider: PROVIDER.into(),
                data: json!({ *field: value }),
            });
        }
    }
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for (n, c) in calls.iter().enumerate() {
            let f = c.get("function").unwrap_or(&empty);
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map_or_else(new_call_id, str::to_string);
            let raw = arguments_text(f.get("arguments"));
            if name.is_empty() {
                return Err(ModelError::InvalidResponse(format!(
                    "tool call {n} of the response has no function name: {}",
                    preview(&c.to_string())
                )));
            }
            let mut call = ToolCall::from_raw_arguments(id, name.to_string(), &raw);
            if let Some(x) = c.get("extra_content").filter(|x| !x.is_null()) {
                call.provider_data = Some(json!({"extra_content": x}));
            }
            tool_calls.push(call);
        }
    }
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(map_finish);
    Ok(ModelResponse {
        text,
        finish_reason: settle_finish(finish, !tool_calls.is_empty()),
        tool_calls,
        usage,
        parts,
        malformed_call: None,
        context_edited: None,
    })
}

/// The text of a `content` field: a string, or the `text` parts of an array of parts.
pub(super) fn content_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p {
                    Value::String(s) => out.push_str(s),
                    Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                        if let Some(t) = o.get("text").and_then(Value::as_str) {
                            out.push_str(t);
                        }
                    }
                    _ => {}
                }
            }
            Some(out)
        }
        _ => None,
    }
}

/// Argument text: a string as it is, a JSON object or array serialized, nothing as `""`.
pub(super) fn arguments_text(arguments: Option<&Value>) -> String {
    match arguments {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

pub(super) fn map_finish(reason: &str) -> FinishReason {
    match reason {
        "stop" | "end_turn" | "eos" | "stop_sequence" => FinishReason::Stop,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "length" | "max_tokens" => FinishReason::Length,
        "content_filter" | "safety" | "refusal" => FinishReason::ContentFilter,
        "error" => FinishReason::Error,
        other => {
            tracing::debug!(
                finish_reason = other,
                "unknown finish_reason, taken as stop"
            );
            FinishReason::Stop
        }
    }
}

/// The finish reason of a reply: a `stop` that came with tool calls (as some servers say) is
/// `ToolCalls`; a missing one is `ToolCalls` or `Stop` by whether calls came.
pub(super) fn settle_finish(finish: Option<FinishReason>, has_calls: bool) -> FinishReason {
    match finish {
        Some(FinishReason::Stop) | None if has_calls => FinishReason::ToolCalls,
        Some(f) => f,
        None => FinishReason::Stop,
    }
}

pub(super) fn as_count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// The usage object of a response or chunk (`usage`, else Groq's `x_groq.usage`).
pub(super) fn usage_of(v: &Value) -> Option<Usage> {
    let u = v
        .get("usage")
        .filter(|u| u.is_object())
        .or_else(|| v.pointer("/x_groq/usage").filter(|u| u.is_object()))?;
    parse_usage(u)
}

/// The usage in a usage object, or `None` without a prompt or completion count (then the
/// tokens are unknown, not zero).
pub(super) fn parse_usage(u: &Value) -> Option<Usage> {
    let input = as_count(u.get("prompt_tokens"));
    let output = as_count(u.get("completion_tokens"));
    if input.is_none() && output.is_none() {
        return None;
    }
    // Chained lookups: `pointer` allocates for every path segment.
    let cache_read = as_count(
        u.get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens")),
    )
    .or_else(|| as_count(u.get("cached_tokens")))
    .or_else(|| as_count(u.get("prompt_cache_hit_tokens")))
    .or_else(|| as_count(u.get("num_cached_tokens")))
    .unwrap_or(0);
    Some(Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cache_read_tokens: cache_read,
        cache_write_tokens: 0,
        reasoning_tokens: as_count(
            u.get("completion_tokens_details")
                .and_then(|d| d.get("reasoning_tokens")),
        )
        .unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::super::json_text::JsonText;
    use super::super::request::WireMessage;
    use super::super::without_ids;
    use super::*;
    use crate::message::Message;
    use proptest::prelude::*;

    #[test]
    fn complete_reply_keeps_reasoning_and_usage_details() {
        let body = include_bytes!(
            "../../../tests/conformance/deepseek-parallel-tool-calls-reasoning/response.json"
        );
        let r = decode_response(body).unwrap();
        assert_eq!(r.parts.len(), 1);
        assert!(
            r.parts[0].data["reasoning_content"]
                .as_str()
                .unwrap()
                .starts_with("Great")
        );
        assert_eq!(r.usage.unwrap().reasoning_tokens, 26);
        let body = include_bytes!(
            "../../../tests/conformance/openai-tool-call-cached-tokens/response.json"
        );
        let u = decode_response(body).unwrap().usage.unwrap();
        assert_eq!((u.input_tokens, u.cache_read_tokens), (1187, 1152));
        // The reasoning goes back to the server on the next turn.
        let msg = Message::Assistant(r.to_message());
        assert!(serde_json::to_value(WireMessage(&msg)).unwrap()["reasoning_content"].is_string());
        // Gemini's thought signature on a tool call survives the round trip.
        let body = br#"{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"},"extra_content":{"google":{"thought_signature":"sig"}}}]}}]}"#;
        let r = decode_response(body).unwrap();
        let wire = serde_json::to_value(WireMessage(&Message::Assistant(r.to_message()))).unwrap();
        assert_eq!(
            wire["tool_calls"][0]["extra_content"]["google"]["thought_signature"],
            "sig"
        );
    }

    #[test]
    fn bad_bodies_say_what_was_wrong() {
        let e = decode_response(b"<html>").unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
        let e = decode_response(b"{\"object\":\"list\"}").unwrap_err();
        assert!(e.to_string().contains("choices"), "{e}");
        let e = decode_response(br#"{"choices":[{"message":{"tool_calls":[{"id":"x","function":{"arguments":"{}"}}]}}]}"#).unwrap_err();
        assert!(e.to_string().contains("no function name"), "{e}");
    }
    /// The typed path, where it accepts a body, decodes it as the value path does.
    fn paths_agree(body: &[u8]) -> Result<bool, String> {
        let Some(fast) = typed::decode(body) else {
            return Ok(false);
        };
        match decode_value(body) {
            Ok(slow) if without_ids(fast.clone()) == without_ids(slow.clone()) => Ok(true),
            other => Err(format!(
                "typed {fast:?}\nvalue {other:?}\nbody {}",
                String::from_utf8_lossy(body)
            )),
        }
    }

    #[test]
    fn typed_and_value_decoding_agree_on_the_corpus() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let mut typed = 0;
        for case in std::fs::read_dir(&dir).unwrap() {
            let case = case.unwrap().path();
            let Ok(meta) = std::fs::read(case.join("meta.json")) else {
                continue;
            };
            let meta: Value = serde_json::from_slice(&meta).unwrap();
            if meta["api"] != "openai-chat" || meta["stream"] == true {
                continue;
            }
            let file = meta["response_file"].as_str().unwrap_or("response.json");
            let body = std::fs::read(case.join(file)).unwrap();
            match paths_agree(&body) {
                Ok(took) => typed += usize::from(took),
                Err(e) => panic!("{}: {e}", case.display()),
            }
        }
        // Every successful complete reply in the corpus has the usual shape.
        assert!(
            typed >= 12,
            "the typed path took only {typed} corpus bodies"
        );
    }

    /// Completion bodies built from the usual fields, each absent, of the right type, or odd:
    /// null, of the wrong type, empty, escaped.
    fn completion_body() -> BoxedStrategy<String> {
        let g = JsonText::new(0.85);
        let function = g.object(vec![
            (
                "name",
                g.pick(&["\"read\"", "\"read\"", "\"\"", "\"r\\u00e9ad\""]),
            ),
            (
                "arguments",
                g.pick(&[
                    "\"{\\\"a\\\":1}\"",
                    "\"\"",
                    "{\"a\":1}",
                    "\"{bad\"",
                    "\"\\\"{}\\\"\"",
                ]),
            ),
        ]);
        let call = g.object(vec![
            ("id", g.pick(&["\"call_1\"", "\"\"", "\"call_\\u00e9\""])),
            ("type", g.pick(&["\"function\""])),
            ("function", g.either(function)),
            (
                "extra_content",
                g.pick(&["{\"google\":{\"thought_signature\":\"s\"}}", "null"]),
            ),
        ]);
        let message = g.object(vec![
            ("role", g.pick(&["\"assistant\""])),
            ("content", g.pick(&["\"hi\"", "\"\"", "\"a\\\"b\""])),
            ("tool_calls", g.either(g.array(call))),
            ("reasoning_content", g.pick(&["\"why\"", "\"\""])),
            ("refusal", g.pick(&["\"no\"", "\"\""])),
            ("extra_content", g.pick(&["{\"k\":1}"])),
        ]);
        let choice = g.object(vec![
            ("index", g.pick(&["0", "1"])),
            ("message", g.either(message)),
            (
                "finish_reason",
                g.pick(&["\"stop\"", "\"tool_calls\"", "\"length\"", "\"odd\""]),
            ),
        ]);
        let usage = g.object(vec![
            ("prompt_tokens", g.pick(&["3", "3", "3", "3.0"])),
            ("completion_tokens", g.pick(&["2"])),
            (
                "prompt_tokens_details",
                g.pick(&["{\"cached_tokens\":1}", "{\"cached_tokens\":null}", "null"]),
            ),
            ("cached_tokens", g.pick(&["4"])),
            ("prompt_cache_hit_tokens", g.pick(&["5"])),
            ("num_cached_tokens", g.pick(&["6"])),
            (
                "completion_tokens_details",
                g.pick(&["{\"reasoning_tokens\":7}", "{}"]),
            ),
        ]);
        let groq = "{\"usage\":{\"prompt_tokens\":5}}";
        g.object(vec![
            ("id", g.pick(&["\"chatcmpl-1\""])),
            ("choices", g.either(g.array(choice))),
            ("usage", g.either(usage)),
            ("x_groq", g.pick(&[groq])),
            (
                "error",
                g.pick(&["null", "null", "null", "{\"message\":\"bad\"}"]),
            ),
        ])
    }

    /// Completion bodies as lenient servers write them (see [`JsonText::loose_object`]): fields
    /// in any order, repeated, spelled with escapes, unknown fields of any shape, escaped ids,
    /// names and argument texts, `null` anywhere.
    fn loose_completion_body() -> BoxedStrategy<String> {
        let g = JsonText::new(0.9);
        let function = g.loose_object(vec![
            (
                "name",
                g.pick(&[
                    "\"read\"",
                    "\"read\"",
                    "\"read\"",
                    "\"\"",
                    "\"r\\u00e9ad\"",
                    "\"a\\\"b\"",
                ]),
            ),
            (
                "arguments",
                g.pick(&[
                    "\"{\\\"path\\\":\\\"a.txt\\\"}\"",
                    "\"{\\\"s\\\":\\\"\\\\ud83d\\\\ude00 \\\\n\\\"}\"",
                    "\" {} \"",
                    "\"\"",
                    "\"{bad\"",
                    "\"{\\\"s\\\":\\\"\\\\ud800\\\"}\"",
                    "\"\\\"{\\\\\\\"a\\\\\\\":1}\\\"\"",
                    "\"[1,2]\"",
                    "\"\\ud83d\\ude00\"",
                    "\"\\ud800\"",
                ]),
            ),
        ]);
        let call = g.loose_object(vec![
            (
                "id",
                g.pick(&[
                    "\"call_1\"",
                    "\"\"",
                    "\"call_\\u00e9\"",
                    "\"c\\\"1\"",
                    "null",
                ]),
            ),
            ("type", g.pick(&["\"function\""])),
            ("function", g.either(function)),
            (
                "extra_content",
                g.pick(&["{\"google\":{\"thought_signature\":\"s\"}}", "null"]),
            ),
        ]);
        let message = g.loose_object(vec![
            ("role", g.pick(&["\"assistant\""])),
            ("content", g.pick(&["\"hi\"", "\"\"", "\"a\\\"b\"", "null"])),
            ("tool_calls", g.either(g.array(call))),
            ("reasoning_content", g.pick(&["\"why\"", "\"\"", "null"])),
            ("refusal", g.pick(&["\"no\"", "null"])),
            ("extra_content", g.pick(&["{\"k\":1}", "null"])),
        ]);
        let choice = g.loose_object(vec![
            ("index", g.pick(&["0", "1", "null"])),
            ("message", g.either(message)),
            ("logprobs", g.pick(&["null"])),
            (
                "finish_reason",
                g.pick(&["\"stop\"", "\"tool_calls\"", "\"t\\u006fol_calls\"", "null"]),
            ),
        ]);
        let usage = g.loose_object(vec![
            ("prompt_tokens", g.pick(&["3", "3", "3.0", "null"])),
            ("completion_tokens", g.pick(&["2"])),
            ("total_tokens", g.pick(&["5"])),
            (
                "prompt_tokens_details",
                g.pick(&["{\"cached_tokens\":1}", "null"]),
            ),
        ]);
        let groq = "{\"usage\":{\"prompt_tokens\":5}}";
        g.loose_object(vec![
            ("id", g.pick(&["\"chatcmpl-1\"", "\"chatcmpl-\\u00e9\""])),
            ("created", g.pick(&["1700000000"])),
            ("choices", g.either(g.array(choice))),
            ("usage", g.either(usage)),
            ("x_groq", g.pick(&[groq, "null"])),
            (
                "error",
                g.pick(&[
                    "null",
                    "null",
                    "null",
                    "null",
                    "null",
                    "null",
                    "null",
                    "{\"message\":\"bad\"}",
                ]),
            ),
        ])
    }

    /// An unknown field is skipped unread: a reply whose known fields are sound decodes on the
    /// typed path, as if the field were absent, even where the value (reading the whole body)
    /// would refuse it (a lone surrogate, a number out of range, nesting past 128).
    #[test]
    fn a_reply_decodes_whatever_its_unknown_fields_hold() {
        let reply = |extra: &str| {
            format!(
                r#"{{"id":"x",{extra}"choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{{"id":"c1","type":"function","function":{{"name":"read","arguments":"{{\"p\":1}}"}}}}]}},"finish_reason":"tool_calls"}}],"usage":{{"prompt_tokens":3,"completion_tokens":2}}}}"#
            )
        };
        let plain = typed::decode(reply("").as_bytes()).expect("the usual reply decodes");
        let deep = format!(r#""x":{}{},"#, "[".repeat(200), "]".repeat(200));
        for extra in [
            r#""model":"\ud800","#.to_string(),
            r#""x":[1e400],"#.to_string(),
            r#""x":{"\udc00":1},"#.to_string(),
            deep,
        ] {
            let body = reply(&extra);
            assert!(decode_value(body.as_bytes()).is_err(), "{body}");
            let fast = typed::decode(body.as_bytes());
            assert_eq!(
                fast.map(without_ids),
                Some(without_ids(plain.clone())),
                "{body}"
            );
        }
    }

    #[test]
    fn in_place_decoding_agrees_with_the_value_path_on_loose_bodies() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = loose_completion_body();
        let (mut typed, mut calls, cases) = (0, 0, 4000);
        for _ in 0..cases {
            let body = strategy.new_tree(&mut runner).unwrap().current();
            match paths_agree(body.as_bytes()) {
                Ok(took) => typed += usize::from(took),
                Err(e) => panic!("{e}"),
            }
            if let Some(r) = typed::decode(body.as_bytes()) {
                calls += r.tool_calls.len();
            }
        }
        // The bodies must exercise the typed path and its calls, not only the fallback.
        assert!(
            typed * 12 > cases && calls * 40 > cases,
            "the typed path took only {typed} of {cases} bodies ({calls} calls)"
        );
    }

    #[test]
    fn typed_decoding_agrees_with_the_value_path() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = completion_body();
        let (mut typed, cases) = (0, 3000);
        for _ in 0..cases {
            let body = strategy.new_tree(&mut runner).unwrap().current();
            match paths_agree(body.as_bytes()) {
                Ok(took) => typed += usize::from(took),
                Err(e) => panic!("{e}"),
            }
        }
        // The bodies must exercise the typed path, not only the fallback.
        assert!(
            typed * 12 > cases,
            "the typed path took only {typed} of {cases} bodies"
        );
    }
}
