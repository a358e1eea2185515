//! The loop over the machine, its I/O through the [`Host`].

use crate::host::{Host, now_ms};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use toolloop::engine::{HookFlags, Input, Interrupt, Machine, Snapshot, Step};
use toolloop::event::Event;
use toolloop::message::Message;
use toolloop::model::{ModelError, ModelRequest, ModelResponse, ModelSettings, ToolSpec};
use toolloop::providers::anthropic::AnthropicConfig;
use toolloop::providers::gemini::GeminiConfig;
use toolloop::providers::openai::OpenAiConfig;
use toolloop::providers::openai_responses::ResponsesConfig;
use toolloop::providers::wire::WireAdapter;
use toolloop::ptk::{Dialect, PromptedReply};
use toolloop::stream::{Accumulator, StreamEvent};
use toolloop::toolbox::{Catalog, CatalogEntry};
use toolloop::{LoopConfig, ToolError, ToolOutput};

/// The largest reply body read, complete or streamed (as the native transport's default).
const MAX_BODY: usize = 32 * 1024 * 1024;

/// A run, as the JavaScript wrapper describes it (JSON, camelCase).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunSpec {
    /// The model.
    pub model: ModelSpec,
    /// The tools' descriptions (the host runs them).
    #[serde(default)]
    pub tools: Vec<ToolDecl>,
    /// The conversation to start from (ignored when `state` is given).
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Limits and policies.
    #[serde(default)]
    pub limits: Limits,
    /// A saved state to go on from (the `state` of an earlier result or checkpoint).
    #[serde(default)]
    pub state: Option<Snapshot>,
    /// Whether the host hears a `checkpoint` event, with the state, after each model call
    /// and each round's tools.
    #[serde(default)]
    pub checkpoints: bool,
}

/// Which model, and how it is called.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// `openai`, `openai-responses`, `anthropic`, `gemini` (called over HTTP), or `host` (the
    /// host's `complete`).
    pub provider: String,
    /// The model's name.
    #[serde(default)]
    pub model: Option<String>,
    /// The server's base URL (the provider's own by default).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The API key.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Whether replies are streamed.
    #[serde(default)]
    pub stream: bool,
    /// Prompt-based tool calling in this dialect (`ptk`, `hermes`, …), for a model without
    /// native tools.
    #[serde(default)]
    pub prompted: Option<Dialect>,
}

/// A tool as the model is offered it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDecl {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of its arguments.
    #[serde(default = "any_object")]
    pub parameters: Value,
}

fn any_object() -> Value {
    json!({"type": "object"})
}

/// The run's limits (each optional; toolloop's defaults otherwise).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Model calls per run.
    pub max_rounds: Option<u32>,
    /// Tool calls per run.
    pub max_tool_calls: Option<u32>,
    /// Whether a call repeating an earlier one (same tool, same arguments) is refused.
    pub detect_duplicates: Option<bool>,
    /// The longest tool result sent to the model, in characters.
    pub max_result_chars: Option<usize>,
    /// Retries of a model call that failed with a retryable error (a network failure, 429,
    /// 5xx) before it delivered output (default 2, as natively).
    pub model_retries: Option<u32>,
}

impl Limits {
    fn config(&self, stream: bool) -> LoopConfig {
        let mut c = LoopConfig::default();
        if let Some(n) = self.max_rounds {
            c.max_rounds = n;
        }
        if let Some(n) = self.max_tool_calls {
            c.max_tool_calls = n;
        }
        if let Some(d) = self.detect_duplicates {
            c.detect_duplicates = d;
        }
        if let Some(n) = self.max_result_chars {
            c.max_result_chars = n;
        }
        c.stream = stream;
        c
    }
}

/// How the model is reached.
enum Caller {
    Wire(Box<WireAdapter>),
    Host,
}

struct ModelCall {
    caller: Caller,
    stream: bool,
    prompted: Option<Dialect>,
}

fn wire_adapter(spec: &ModelSpec) -> Result<WireAdapter, String> {
    let name = spec.model.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(format!(
            "the model (provider `{}`) needs a name",
            spec.provider
        ));
    }
    let base = spec.base_url.clone();
    let key = spec.api_key.clone();
    if let Some(url) = &base {
        toolloop::providers::check_base_url(url)
            .map_err(|e| format!("the model's baseUrl: {e}"))?;
    }
    Ok(match spec.provider.as_str() {
        "openai" => {
            let mut c = OpenAiConfig::new(name);
            if let Some(b) = base {
                c.base_url = b;
            }
            c.api_key = key;
            WireAdapter::from(c)
        }
        "openai-responses" => {
            let mut c = ResponsesConfig::new(name);
            if let Some(b) = base {
                c.base_url = b;
            }
            c.api_key = key;
            WireAdapter::from(c)
        }
        "anthropic" => {
            let mut c = AnthropicConfig::new(name);
            if let Some(b) = base {
                c.base_url = b;
            }
            c.api_key = key;
            WireAdapter::from(c)
        }
        "gemini" => {
            let mut c = GeminiConfig::new(name);
            if let Some(b) = base {
                c.base_url = b;
            }
            c.api_key = key;
            WireAdapter::from(c)
        }
        other => {
            return Err(format!(
                "unknown provider `{other}` (expected openai, openai-responses, anthropic, \
                 gemini, or a model object with complete())"
            ));
        }
    })
}

fn transport(message: String) -> ModelError {
    ModelError::Transport {
        message,
        retryable: false,
    }
}

/// A failure of the connection (`fetch` rejected, a body read failed): retried, as the native
/// transport retries it.
fn network(message: String) -> ModelError {
    ModelError::Transport {
        message,
        retryable: true,
    }
}

/// The first wait before a model call is made again; it doubles on each retry.
const RETRY_BASE_MS: f64 = 500.0;
/// The longest wait, and the longest server-requested one honoured (as natively).
const RETRY_MAX_MS: f64 = 30_000.0;

/// The wait before retry number `attempt` (1-based), as the native transport's policy: the
/// server's `retry-after` when it gave one, else the base doubled per retry with ±50 % jitter,
/// both capped.
fn retry_delay_ms(attempt: u32, error: &ModelError) -> f64 {
    if let ModelError::Api(a) = error
        && let Some(hint) = a.retry_after
    {
        return (hint.as_secs_f64() * 1000.0).min(RETRY_MAX_MS);
    }
    let exp = RETRY_BASE_MS * f64::from(1u32 << attempt.saturating_sub(1).min(16));
    (exp * (0.5 + js_sys::Math::random())).min(RETRY_MAX_MS)
}

impl ModelCall {
    fn new(spec: &ModelSpec) -> Result<Self, String> {
        let caller = match spec.provider.as_str() {
            "host" => Caller::Host,
            _ => Caller::Wire(Box::new(wire_adapter(spec)?)),
        };
        Ok(ModelCall {
            caller,
            stream: spec.stream,
            prompted: spec.prompted,
        })
    }

    /// One model call: the response, the text deltas told to the host as they come.
    async fn call(
        &self,
        host: &Host,
        request: &ModelRequest<'_>,
        mut delta: impl FnMut(&str),
    ) -> Result<ModelResponse, ModelError> {
        let Some(dialect) = self.prompted else {
            return self.inner(host, request, &mut delta).await;
        };
        let (messages, reminders, settings) = toolloop::ptk::rewrite(request, dialect);
        let inner = ModelRequest {
            messages: (&messages).into(),
            reminders: &reminders,
            tools: &[],
            settings: &settings,
        };
        let mut reply = PromptedReply::new(request.tools, dialect, false);
        let mut acc = Accumulator::new();
        let mut take = |events: Vec<StreamEvent>, acc: &mut Accumulator| {
            for e in events {
                if let StreamEvent::TextDelta(t) = &e {
                    delta(t);
                }
                acc.push(e);
            }
        };
        let response = self.inner(host, &inner, &mut |_| {}).await?;
        for e in response.into_events() {
            take(reply.push(e), &mut acc);
        }
        take(reply.finish(), &mut acc);
        Ok(acc.finish())
    }

    /// A call of the model itself (prompt-based calling aside).
    async fn inner(
        &self,
        host: &Host,
        request: &ModelRequest<'_>,
        delta: &mut dyn FnMut(&str),
    ) -> Result<ModelResponse, ModelError> {
        match &self.caller {
            Caller::Host => {
                let text = serde_json::to_string(&json!({
                    "messages": request.messages.iter().collect::<Vec<_>>(),
                    "reminders": request.reminders,
                    "tools": request.tools,
                    "settings": request.settings,
                }))
                .map_err(|e| ModelError::Other(e.to_string()))?;
                let answer = host.complete(&text).await.map_err(transport)?;
                let response: ModelResponse = serde_json::from_str(&answer).map_err(|e| {
                    ModelError::Other(format!("the model's answer does not parse: {e}"))
                })?;
                if let Some(t) = &response.text {
                    delta(t);
                }
                Ok(response)
            }
            Caller::Wire(adapter) => {
                let call = adapter.call(request, self.stream)?;
                let reply = host
                    .post(&call.url, &call.headers, &call.body)
                    .await
                    .map_err(|e| network(call.redactor().redact(&e)))?;
                if !self.stream || !(200..300).contains(&reply.status) {
                    let body = reply
                        .body(MAX_BODY)
                        .await
                        .map_err(|e| network(call.redactor().redact(&e)))?;
                    let r = adapter.response(request, &call, reply.status, &reply.headers, &body);
                    if let Ok(r) = &r
                        && let Some(t) = &r.text
                    {
                        delta(t);
                    }
                    return r;
                }
                let mut reader = adapter.stream_reader(request, &call);
                let mut acc = Accumulator::new();
                let mut events = Vec::new();
                let mut take = |events: &mut Vec<StreamEvent>, acc: &mut Accumulator| {
                    for e in events.drain(..) {
                        if let StreamEvent::TextDelta(t) = &e {
                            delta(t);
                        }
                        acc.push(e);
                    }
                };
                // A stream is held to the complete body's limit, as natively: a server that
                // never ends one would otherwise grow the module's memory until it aborts.
                let mut seen = 0usize;
                while !reader.done() {
                    let chunk = reply
                        .next()
                        .await
                        .map_err(|e| network(call.redactor().redact(&e)))?;
                    let r = match chunk {
                        Some(bytes) => {
                            seen = seen.saturating_add(bytes.len());
                            if seen > MAX_BODY {
                                Err(ModelError::BodyTooLarge { limit: MAX_BODY })
                            } else {
                                reader.push(&bytes, &mut events)
                            }
                        }
                        None => reader.finish(&mut events),
                    };
                    take(&mut events, &mut acc);
                    r?;
                }
                Ok(acc.finish())
            }
        }
    }
}

/// The result handed back to JavaScript.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RunResult<'a> {
    text: &'a Option<String>,
    stop_reason: &'a toolloop::StopReason,
    tool_calls: &'a [toolloop::outcome::ExecutedCall],
    messages: &'a [Message],
    usage: &'a Option<toolloop::Usage>,
    outcome: &'a toolloop::Outcome,
    state: &'a Snapshot,
}

/// What a tool's answer (JSON text from the host) means.
#[derive(Deserialize)]
struct ToolAnswer {
    #[serde(default)]
    ok: Option<Value>,
    #[serde(default)]
    error: Option<String>,
}

fn tool_result(answer: Result<String, String>) -> Result<ToolOutput, ToolError> {
    let text = answer.map_err(ToolError::new)?;
    let a: ToolAnswer = serde_json::from_str(&text)
        .map_err(|e| ToolError::new(format!("the tool's answer does not parse: {e}")))?;
    match (a.error, a.ok) {
        (Some(e), _) => Err(ToolError::new(e)),
        (None, Some(v)) => Ok(ToolOutput::json(&v)),
        (None, None) => Ok(ToolOutput::json(&Value::Null)),
    }
}

struct Run<'h> {
    host: &'h Host,
    machine: Machine,
    events: bool,
    checkpoints: bool,
}

impl Run<'_> {
    fn flush(&mut self) {
        if !self.events {
            return;
        }
        let events: Vec<Event> = self.machine.take_events().collect();
        for e in events {
            if let Ok(text) = serde_json::to_string(&e) {
                self.host.event(&text);
            }
        }
    }

    fn feed(&mut self, input: Input) -> Result<(), String> {
        self.machine
            .handle(input)
            .map_err(|e| format!("the engine refused an input: {e}"))?;
        self.flush();
        Ok(())
    }

    /// Tells the host an event the driver makes (the machine makes the others).
    fn emit(&self, event: &Event) {
        if self.events
            && let Ok(text) = serde_json::to_string(event)
        {
            self.host.event(&text);
        }
    }

    fn checkpoint(&self) {
        if self.checkpoints
            && let Ok(state) = serde_json::to_string(&self.machine.snapshot())
        {
            self.host
                .event(&format!(r#"{{"type":"checkpoint","state":{state}}}"#));
        }
    }

    fn interrupt(&mut self) -> Result<(), String> {
        self.feed(Input::Interrupted {
            why: Interrupt::Cancelled,
        })
    }
}

/// Runs `spec` with `host` doing the I/O; the result as JSON text.
pub(crate) async fn run_spec(spec: RunSpec, host: &Host) -> Result<String, String> {
    let started = now_ms();
    let config = Arc::new(spec.limits.config(spec.model.stream));
    let model_retries = spec.limits.model_retries.unwrap_or(2);
    let stream_restarts = config.stream_restarts;
    let entries = spec
        .tools
        .into_iter()
        .map(|t| CatalogEntry {
            name: t.name,
            description: t.description,
            parameters: t.parameters,
            side_effect: Default::default(),
            parallel_safe: false,
            terminal: false,
            default_approval: None,
        })
        .collect();
    let catalog = Arc::new(Catalog::new(entries).map_err(|e| format!("the tools: {e}"))?);
    let specs: Vec<ToolSpec> = catalog.specs().to_vec();
    let model = ModelCall::new(&spec.model)?;
    let hooks = HookFlags::default();
    let machine = match spec.state {
        Some(state) => Machine::resume(config, hooks, catalog, state),
        None => Machine::new(config, hooks, catalog, spec.messages),
    };
    let mut run = Run {
        host,
        machine,
        events: host.has("event"),
        checkpoints: spec.checkpoints,
    };
    run.machine.set_events(run.events);
    run.flush();
    let settings = ModelSettings::default();
    loop {
        let step = run.machine.next_step();
        run.flush();
        if !matches!(step, Step::Finished) && host.aborted() {
            run.interrupt()?;
            continue;
        }
        match step {
            Step::Finished => break,
            Step::CallModel { round, reminders } => {
                let request = ModelRequest {
                    messages: run.machine.sent_messages(),
                    reminders: &reminders,
                    tools: &specs,
                    settings: &settings,
                };
                let events = run.events;
                // Retries as the native agent's: a retryable failure before any output is
                // made again after a backoff; a stream that broke after delivering output is
                // restarted (`model_retry` tells listeners to drop its deltas).
                let (mut retries, mut restarts) = (0u32, 0u32);
                let result = loop {
                    let delivered = std::cell::Cell::new(false);
                    let result = model
                        .call(host, &request, |t| {
                            delivered.set(true);
                            if events
                                && let Ok(text) = serde_json::to_string(&Event::TextDelta {
                                    round,
                                    text: t.to_string(),
                                })
                            {
                                host.event(&text);
                            }
                        })
                        .await;
                    let e = match result {
                        Err(e) if e.is_retryable() && !host.aborted() => e,
                        other => break other,
                    };
                    if delivered.get() {
                        if restarts >= stream_restarts {
                            break Err(e);
                        }
                        restarts += 1;
                    } else {
                        if retries >= model_retries {
                            break Err(e);
                        }
                        retries += 1;
                        host.sleep(retry_delay_ms(retries, &e)).await;
                        if host.aborted() {
                            break Err(e);
                        }
                    }
                    run.emit(&Event::ModelRetry {
                        round,
                        attempt: retries + restarts + 1,
                        reason: e.to_string(),
                    });
                };
                if host.aborted() {
                    run.interrupt()?;
                    continue;
                }
                let input = match result {
                    Ok(response) => Input::ModelResponded {
                        round,
                        response,
                        cost: None,
                        subjects: Vec::new(),
                    },
                    Err(e) => toolloop::context::driver::failed_call_input(&run.machine, round, e),
                };
                run.feed(input)?;
                run.checkpoint();
            }
            Step::RunTools(batches) => {
                let round = run.machine.round();
                'batches: for batch in batches {
                    for index in batch.calls {
                        let Some(call) = run.machine.shared_round_call(index) else {
                            continue;
                        };
                        run.feed(Input::ToolStarted {
                            round,
                            index,
                            call_id: call.id.clone(),
                        })?;
                        run.emit(&Event::ToolStarted {
                            round,
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            attempt: 1,
                        });
                        let started = now_ms();
                        let args = call.arguments.to_string();
                        let answer = host.tool(&call.name, &args, &call.id).await;
                        let duration_ms = (now_ms() - started).max(0.0) as u64;
                        if host.aborted() {
                            run.interrupt()?;
                            break 'batches;
                        }
                        run.feed(Input::ToolFinished {
                            round,
                            index,
                            result: tool_result(answer),
                            duration_ms,
                            attempts: 1,
                        })?;
                    }
                }
                run.checkpoint();
            }
            step @ Step::EditContext { .. } => {
                if let Some(input) = toolloop::context::driver::edits_input(step) {
                    run.feed(input)?;
                }
            }
            other => {
                return Err(format!(
                    "the engine asked for {other:?}, which this driver does not do"
                ));
            }
        }
    }
    let state = run.machine.snapshot();
    let events = run.events;
    let outcome = run
        .machine
        .into_outcome((now_ms() - started).max(0.0) as u64);
    if events
        && let Ok(text) = serde_json::to_string(&Event::RunFinished {
            outcome: Box::new(outcome.clone()),
        })
    {
        host.event(&text);
    }
    serde_json::to_string(&RunResult {
        text: &outcome.text,
        stop_reason: &outcome.stop_reason,
        tool_calls: &outcome.tool_calls,
        messages: &outcome.messages,
        usage: &outcome.usage,
        outcome: &outcome,
        state: &state,
    })
    .map_err(|e| format!("the result does not serialize: {e}"))
}
