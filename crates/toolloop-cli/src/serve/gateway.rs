//! The gateway (`model: "gateway:SPEC"`): native tool calls for a model that has none.
//!
//! The client's tools are offered to the backend model SPEC through prompt-based tool calling
//! ([`toolloop::ptk::Prompted`]: the catalog in the system prompt, past calls written back as
//! the model's text and results as `PTK_RESULT:` messages, calls read out of the reply in every
//! dialect, with holdback while streaming so that no fragment of a call tag reaches the
//! client). The client gets standard `tool_calls`, streamed as OpenAI streams them; nothing is
//! run on the server.

use super::wire::{self, ChatRequest};
use crate::args::{ProviderArgs, ToolProtocol};
use crate::cx::Cx;
use crate::spec::model_from_args;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use toolloop::model::{Model, ModelError, ModelRequest, ModelSettings};
use toolloop::ptk::Prompted;
use toolloop::stream::StreamEvent;

/// The backends the gateway has made, by spec (each keeps its HTTP connections).
pub(crate) struct Gateway {
    cx: Arc<Cx>,
    base: ProviderArgs,
    models: Mutex<HashMap<String, Arc<Prompted>>>,
}

/// The most backends kept at once (a client choosing ever new specs cannot grow it further).
const MAX_BACKENDS: usize = 64;

impl Gateway {
    /// A gateway whose backends take the provider flags of `base` (`--base-url`,
    /// `--api-key-env`, `--dialect`, `--extra`, …) with their own model spec.
    pub(crate) fn new(cx: Arc<Cx>, base: ProviderArgs) -> Gateway {
        Gateway {
            cx,
            base,
            models: Mutex::new(HashMap::new()),
        }
    }

    /// The backend for `spec`, teaching the dialect of `--dialect`.
    pub(crate) fn backend(&self, spec: &str) -> Result<Arc<Prompted>, String> {
        if let Some(m) = self.models.lock().ok().and_then(|m| m.get(spec).cloned()) {
            return Ok(m);
        }
        let mut args = self.base.clone();
        args.model = spec.to_string();
        args.tool_protocol = ToolProtocol::Native;
        self.cx.config.resolve_model(&mut args)?;
        if args.model.trim() == "test" || args.model.starts_with("scripted:") {
            return Err(format!(
                "`gateway:{spec}`: expected a provider's model (openai:NAME, anthropic:NAME, …)"
            ));
        }
        let inner = model_from_args(&self.cx, &args)?;
        let prompted = Arc::new(
            Prompted::new(inner, self.base.dialect).implicit_think(self.base.implicit_think),
        );
        if let Ok(mut models) = self.models.lock() {
            if models.len() >= MAX_BACKENDS {
                models.clear();
            }
            models.insert(spec.to_string(), prompted.clone());
        }
        Ok(prompted)
    }
}

/// The settings of one request.
fn settings(request: &ChatRequest) -> ModelSettings {
    ModelSettings {
        temperature: request.temperature,
        max_output_tokens: request.max_tokens,
        tool_choice: request.tool_choice.clone(),
        ..ModelSettings::default()
    }
}

/// A whole answer: a `chat.completion` with the calls the backend wrote as text.
pub(crate) async fn complete(
    backend: &Prompted,
    request: &ChatRequest,
    id: &str,
) -> Result<Value, ModelError> {
    let settings = settings(request);
    let model_request = ModelRequest {
        messages: (&request.messages).into(),
        reminders: &[],
        tools: &request.tools,
        settings: &settings,
    };
    let response = backend.complete(&model_request).await?;
    let finish = wire::finish_reason(response.finish_reason, !response.tool_calls.is_empty());
    Ok(wire::completion(
        id,
        &request.model,
        response.text.as_deref(),
        &response.tool_calls,
        finish,
        response.usage.as_ref(),
    ))
}

/// A streamed answer: `chat.completion.chunk` events (text deltas, then each call as a
/// `tool_calls` delta with its id and name, then its arguments), the finish reason, the usage
/// when asked for, and `[DONE]`. A failure after the stream began ends it with an `error`
/// event.
pub(crate) async fn stream(
    backend: Arc<Prompted>,
    request: ChatRequest,
    id: String,
) -> Result<futures::stream::BoxStream<'static, bytes::Bytes>, ModelError> {
    let settings = settings(&request);
    let model_request = ModelRequest {
        messages: (&request.messages).into(),
        reminders: &[],
        tools: &request.tools,
        settings: &settings,
    };
    let events = backend.stream(&model_request).await?;
    let model = request.model.clone();
    let include_usage = request.include_usage;
    let first = wire::sse(&wire::chunk(
        &id,
        &model,
        json!({"role": "assistant", "content": ""}),
        None,
    ));
    struct St {
        events: toolloop::model::EventStream,
        id: String,
        model: String,
        include_usage: bool,
        usage: Option<toolloop::usage::Usage>,
        calls: usize,
        done: bool,
    }
    let st = St {
        events,
        id,
        model,
        include_usage,
        usage: None,
        calls: 0,
        done: false,
    };
    let rest = futures::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            let out = match st.events.next().await {
                Some(Ok(event)) => {
                    match event {
                        StreamEvent::TextDelta(t) if !t.is_empty() => Some(wire::sse(
                            &wire::chunk(&st.id, &st.model, json!({"content": t}), None),
                        )),
                        StreamEvent::ToolCallStart { index, id, name } => {
                            st.calls += 1;
                            let call_id = id.unwrap_or_else(toolloop::message::new_call_id);
                            Some(wire::sse(&wire::chunk(
                                &st.id,
                                &st.model,
                                json!({"tool_calls": [{
                                    "index": index,
                                    "id": call_id,
                                    "type": "function",
                                    "function": {"name": name, "arguments": ""},
                                }]}),
                                None,
                            )))
                        }
                        StreamEvent::ToolCallDelta { index, arguments } => {
                            Some(wire::sse(&wire::chunk(
                                &st.id,
                                &st.model,
                                json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}),
                                None,
                            )))
                        }
                        StreamEvent::Usage(u) => {
                            st.usage = Some(u);
                            None
                        }
                        StreamEvent::Finish(reason) => {
                            st.done = true;
                            let finish = wire::finish_reason(reason, st.calls > 0);
                            let mut out =
                                wire::sse(&wire::chunk(&st.id, &st.model, json!({}), Some(finish)))
                                    .to_vec();
                            if st.include_usage {
                                out.extend_from_slice(&wire::sse(&wire::usage_chunk(
                                    &st.id,
                                    &st.model,
                                    st.usage.as_ref(),
                                )));
                            }
                            out.extend_from_slice(&wire::sse_done());
                            Some(bytes::Bytes::from(out))
                        }
                        _ => None,
                    }
                }
                Some(Err(e)) => {
                    st.done = true;
                    Some(wire::sse(&json!({"error": {
                        "message": format!("the backend model failed: {e}"),
                        "type": "server_error",
                    }})))
                }
                None => {
                    st.done = true;
                    // A stream that ends without a finish still ends as OpenAI's do.
                    Some(wire::sse_done())
                }
            };
            if let Some(bytes) = out {
                return Some((bytes, st));
            }
        }
    });
    Ok(futures::stream::once(async move { first })
        .chain(rest)
        .boxed())
}
