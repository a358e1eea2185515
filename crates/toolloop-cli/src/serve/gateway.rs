//! The gateway (`model: "gateway:SPEC"`): native tool calls for a model that has none.
//!
//! The client's tools are offered to the backend model SPEC through prompt-based tool calling
//! ([`toolloop::ptk::Prompted`]: the catalog in the system prompt, past calls written back as
//! the model's text and results as `PTK_RESULT:` messages, calls read out of the reply in every
//! dialect). The client gets standard `tool_calls`; nothing is run on the server.
//!
//! Each request is a run of the engine, logged in the store like an agent's: the client's tools
//! are the run's tools, each [terminal](toolloop::tool::Tool::terminal) and run by no one here
//! ([`ClientTool`]), so a round whose calls are valid ends the run and the calls go to the
//! client. A reply the engine cannot use (a call written wrong, a tool that does not exist,
//! arguments that do not fit the schema) is sent back to the backend to correct, as in any
//! run, within the engine's budget of invalid calls in a row ([`REASKS`]); when that runs out,
//! the client gets an error (`malformed_tool_call`). The reply is known good only once the
//! backend's reply is whole, so a streamed answer comes at once when it is: no broken call, nor
//! the text of a reply sent back, ever reaches the client.

use super::wire::{self, ChatRequest};
use crate::args::{ProviderArgs, ToolProtocol};
use crate::cx::Cx;
use crate::spec::model_from_args;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use toolloop::agent::Agent;
use toolloop::config::{InvalidCallPolicy, LoopConfig};
use toolloop::journal::Journal;
use toolloop::message::{Message, ToolCall};
use toolloop::model::ModelSettings;
use toolloop::model::ToolSpec;
use toolloop::outcome::{CallStatus, Outcome, StopReason};
use toolloop::ptk::Prompted;
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::usage::Usage;

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
        self.cx
            .config
            .resolve_model(&mut args)
            .map_err(|e| crate::error::chain(&e))?;
        // The spec is the client's: only a provider's model, never one that reads a file on
        // the server (`scripted:FILE`, `replay:FILE`, which would also set the cassette of
        // every model made after it) nor the built-in test model.
        let provider = args.model.trim().split(':').next().unwrap_or("").trim();
        if matches!(provider, "test" | "scripted" | "replay") {
            return Err(format!(
                "`gateway:{}`: expected a provider's model (openai:NAME, anthropic:NAME, …)",
                toolloop::result::shorten(spec, 80)
            ));
        }
        let inner = model_from_args(&self.cx, &args).map_err(|e| crate::error::chain(&e))?;
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

/// How many replies in a row the backend may get wrong (a call that does not parse, an unknown
/// tool, arguments that do not fit) before the request fails: each is sent back to it to
/// correct. The engine's default budget, as a `toolloop run` has.
pub(crate) const REASKS: u32 = 2;

/// The signal of a round whose calls go to the client.
const CLIENT_CALLS: &str = "client_tool_calls";

/// A tool of the client's: offered to the backend, never run here. A valid call of it ends the
/// run after its round, and goes to the client as a `tool_calls` entry. Nothing happens here,
/// so it is read-only (a retry may "run" it again) and parallel-safe.
fn client_tool(spec: &ToolSpec) -> Arc<dyn Tool> {
    let call = |_: Value, _: ToolContext| async {
        Ok::<_, ToolError>(ToolOutput {
            message: "the client runs this call; its result comes with the next request".into(),
            signal: Some(CLIENT_CALLS.into()),
            ..ToolOutput::default()
        })
    };
    Arc::new(
        tool_fn(spec.name.clone(), spec.description.clone(), call)
            .with_parameters(spec.parameters.clone())
            .allow_parallel()
            .make_terminal()
            .with_side_effect(SideEffect::ReadOnly),
    )
}

/// The run of one gateway request: `backend` with the request's tools and settings, logged in
/// `journal`.
pub(crate) fn agent(
    backend: Arc<Prompted>,
    request: &ChatRequest,
    journal: Option<Arc<dyn Journal>>,
) -> Result<Agent, String> {
    let config = LoopConfig {
        // The first round, and one for each reply sent back to be corrected.
        max_rounds: 1 + REASKS + 1,
        max_tool_calls: 10_000,
        // A call the conversation made before is the client's business: it may ask again.
        detect_duplicates: false,
        invalid_calls: InvalidCallPolicy::Feedback { budget: REASKS },
        ..LoopConfig::default()
    };
    let mut builder = toolloop::agent::AgentBuilder::new(backend)
        .config(config)
        .settings(ModelSettings {
            temperature: request.temperature,
            max_output_tokens: request.max_tokens,
            tool_choice: request.tool_choice.clone(),
            ..ModelSettings::default()
        })
        .tools(request.tools.iter().map(client_tool));
    if let Some(journal) = journal {
        builder = builder.journal(journal);
    }
    builder.build().map_err(|e| format!("`tools`: {e}"))
}

/// What a gateway run answers.
pub(crate) struct Answer {
    /// The text of the reply that holds the calls (or of the answer).
    pub text: Option<String>,
    /// The calls for the client to run.
    pub calls: Vec<ToolCall>,
    /// `finish_reason`.
    pub finish: &'static str,
    /// The backend's usage over the run (replies sent back included).
    pub usage: Option<Usage>,
}

/// A gateway run that gave the client nothing to use: the HTTP status, the error code, and
/// what happened.
pub(crate) struct Failure {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

/// The client's answer from a gateway run's outcome.
pub(crate) fn answer(o: &Outcome) -> Result<Answer, Failure> {
    let last_text = || {
        o.messages.iter().rev().find_map(|m| match m {
            Message::Assistant(a) => Some(a.text.clone()),
            _ => None,
        })
    };
    match o.stop_reason {
        StopReason::TerminalSignal => Ok(Answer {
            text: last_text().flatten(),
            // Every valid call (a round may hold valid calls beside one sent back to be
            // corrected: those were not run either).
            calls: o
                .tool_calls
                .iter()
                .filter(|c| c.status == CallStatus::Ok)
                .map(|c| c.call.clone())
                .collect(),
            finish: "tool_calls",
            usage: o.usage,
        }),
        StopReason::Answered => Ok(Answer {
            text: o.text.clone(),
            calls: Vec::new(),
            finish: "stop",
            usage: o.usage,
        }),
        StopReason::OutputTruncated | StopReason::MaxRounds => Ok(Answer {
            text: o.text.clone().or_else(|| last_text().flatten()),
            calls: Vec::new(),
            finish: "length",
            usage: o.usage,
        }),
        StopReason::TooManyInvalidCalls => Err(Failure {
            status: 502,
            code: "malformed_tool_call",
            message: format!(
                "the backend model wrote tool calls that could not be used {} times in a \
                 row (each was sent back to it to correct){}",
                REASKS + 1,
                o.error
                    .as_ref()
                    .map(|e| format!(": {}", e.message))
                    .unwrap_or_default()
            ),
        }),
        other => {
            let reason = serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let code = if other == StopReason::ModelError {
                "backend_error"
            } else {
                "run_failed"
            };
            Err(Failure {
                status: 502,
                code,
                message: format!(
                    "the gateway's run stopped ({reason}){}",
                    o.error
                        .as_ref()
                        .map(|e| format!(": {}", e.message))
                        .unwrap_or_default()
                ),
            })
        }
    }
}

/// A whole answer: a `chat.completion`.
pub(crate) fn completion(id: &str, model: &str, a: &Answer) -> Value {
    wire::completion(
        id,
        model,
        a.text.as_deref(),
        &a.calls,
        a.finish,
        a.usage.as_ref(),
    )
}

/// The rest of a streamed answer, after its first chunk: the text as one delta, each call as
/// OpenAI streams them (its id and name, then its arguments), the finish reason, the usage when
/// asked for, and `[DONE]`.
pub(crate) fn chunks(id: &str, model: &str, a: &Answer, include_usage: bool) -> bytes::Bytes {
    let mut out = Vec::new();
    if let Some(t) = a.text.as_deref().filter(|t| !t.is_empty()) {
        out.extend_from_slice(&wire::sse(&wire::chunk(
            id,
            model,
            json!({"content": t}),
            None,
        )));
    }
    for (index, call) in a.calls.iter().enumerate() {
        out.extend_from_slice(&wire::sse(&wire::chunk(
            id,
            model,
            json!({"tool_calls": [{
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]}),
            None,
        )));
        out.extend_from_slice(&wire::sse(&wire::chunk(
            id,
            model,
            json!({"tool_calls": [{"index": index, "function": {"arguments": call.arguments.to_string()}}]}),
            None,
        )));
    }
    out.extend_from_slice(&wire::sse(&wire::chunk(
        id,
        model,
        json!({}),
        Some(a.finish),
    )));
    if include_usage {
        out.extend_from_slice(&wire::sse(&wire::usage_chunk(id, model, a.usage.as_ref())));
    }
    out.extend_from_slice(&wire::sse_done());
    bytes::Bytes::from(out)
}
