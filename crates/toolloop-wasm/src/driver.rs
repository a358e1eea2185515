//! The loop over the machine, its I/O through the [`Host`].

use crate::host::{Host, now_ms};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use toolloop::approval::{Action, Answer, Approvals, Decision, Rule, Subject};
use toolloop::config::RoundLimitDecision;
use toolloop::context::policy::ContextPolicy;
use toolloop::engine::{Compaction, HookFlags, Input, Interrupt, Machine, Snapshot, Step};
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
    /// The context policy: what the run does to stay inside the model's context window.
    #[serde(default)]
    pub context: Option<ContextOptions>,
    /// Approval rules: which calls run, which wait for the host's `approve`, which never run.
    #[serde(default)]
    pub approvals: Option<ApprovalOptions>,
}

/// Approval rules as JavaScript gives them: toolloop's [`Approvals`], each rule a glob over
/// the tool's name and, optionally, one over the call's approval subject (the tool's
/// `approvalSubject`, else the call's canonical JSON arguments).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalOptions {
    /// The rules; `deny` wins over `ask`, and `ask` over `allow`, whatever their order.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// The action when no rule matches (the tool's own otherwise: ask with `needsApproval`,
    /// else allow).
    #[serde(default)]
    pub default: Option<Action>,
}

/// One approval rule ([`Rule`]).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// `allow`, `ask` or `deny`.
    pub action: Action,
    /// A glob over the tool's name.
    pub tool: String,
    /// A glob over the call's approval subject (every call of the tool without it).
    #[serde(default)]
    pub subject: Option<String>,
}

impl ApprovalOptions {
    /// toolloop's [`Approvals`], every glob checked (an error names the rule that does not
    /// compile).
    fn approvals(self) -> Result<Approvals, String> {
        let rules = self
            .rules
            .into_iter()
            .map(|r| {
                let rule = Rule {
                    action: r.action,
                    tool: r.tool,
                    subject: r.subject,
                };
                rule.check()
                    .map_err(|e| format!("the approval rule `{rule}`: {e}"))?;
                Ok(rule)
            })
            .collect::<Result<_, String>>()?;
        Ok(Approvals {
            rules,
            default: self.default,
        })
    }
}

/// The context policy as JavaScript gives it (each field optional: toolloop's defaults
/// otherwise; see [`ContextPolicy`]).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContextOptions {
    /// The model's context window in tokens (no compaction is started by the estimate
    /// without it; a provider's refusal for size still starts one).
    pub window: Option<u64>,
    /// Compact when the estimated next request passes this share of the window.
    pub compact_at: Option<f64>,
    /// Keep the results of this many most recent rounds whole; older ones are cleared.
    pub keep_rounds: Option<u32>,
    /// Spill a result longer than this many bytes (`null`: never); the model reads it with
    /// `read_result`, which the engine answers.
    #[serde(default, deserialize_with = "some_or_null")]
    pub spill_over: Option<Option<usize>>,
    /// Bytes of a spilled result shown at its head and at its tail.
    pub spill_preview: Option<usize>,
    /// Whether to compact at all.
    pub compact: Option<bool>,
}

/// A field that may be given as `null` (`Some(None)`), apart from left out (`None`).
fn some_or_null<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

impl ContextOptions {
    fn policy(&self) -> ContextPolicy {
        let mut p = ContextPolicy {
            // The requests of this driver ask nothing of the provider itself.
            native: false,
            ..ContextPolicy::default()
        };
        p.window = self.window;
        if let Some(v) = self.compact_at {
            p.compact_at = v;
        }
        if let Some(v) = self.keep_rounds {
            p.keep_rounds = v;
        }
        if let Some(v) = self.spill_over {
            p.spill_over = v;
        }
        if let Some(v) = self.spill_preview {
            p.spill_preview = v;
        }
        if let Some(v) = self.compact {
            p.compact = v;
        }
        p
    }
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
    /// Whether each call waits for a person's approval (the host's `approve`) before it runs.
    #[serde(default)]
    pub needs_approval: bool,
    /// Whether calls of the tool may run at the same time as other parallel-safe calls of
    /// the round (at most `limits.maxParallel` at once).
    #[serde(default)]
    pub parallel_safe: bool,
    /// Whether the tool gives its calls' approval subject itself (the host's `subject`);
    /// otherwise a call's subject is its canonical JSON arguments.
    #[serde(default)]
    pub approval_subject: bool,
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
    /// The run's wall-clock limit in milliseconds: past it the run stops with `timeout` (the
    /// host aborts what is under way at that time; the driver checks between steps).
    pub timeout_ms: Option<f64>,
    /// The limit of one attempt of a tool call in milliseconds: past it the attempt fails
    /// with a retryable error (the host enforces it; the driver passes it on).
    pub tool_timeout_ms: Option<f64>,
    /// Retries of a tool call whose attempt failed with a retryable error (default 2, as
    /// natively).
    pub tool_retries: Option<u32>,
    /// The most parallel-safe tool calls of a round running at once (default 10, as
    /// natively).
    pub max_parallel: Option<usize>,
    /// The first wait before a tool call is made again, in milliseconds; it doubles on each
    /// retry (default 200, as natively).
    pub tool_retry_backoff_ms: Option<f64>,
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
        if let Some(n) = self.tool_retries {
            c.tool_retries = n;
        }
        if let Some(n) = self.max_parallel {
            c.max_parallel = n.max(1);
        }
        if let Some(ms) = self.tool_retry_backoff_ms {
            c.tool_retry_backoff = duration_ms(ms);
        }
        if let Some(ms) = self.tool_timeout_ms {
            c.tool_timeout = Some(duration_ms(ms));
        }
        if let Some(ms) = self.timeout_ms {
            c.timeout = Some(duration_ms(ms));
        }
        c.stream = stream;
        c
    }
}

/// `ms` milliseconds as a duration (a negative or not-a-number value is none, one too large
/// is the largest).
fn duration_ms(ms: f64) -> std::time::Duration {
    if ms.is_nan() || ms <= 0.0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(std::time::Duration::MAX)
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
    /// What a JavaScript model's wrapper holds from earlier requests: the messages and the
    /// tools. A request carries only what differs, so that the conversation crosses into
    /// JavaScript once, not once per round.
    held: std::cell::RefCell<Held>,
    /// The machine's [`ViewMark`] for the round's call (set by the driver before it).
    view_mark: std::cell::Cell<Option<ViewMark>>,
}

/// What changes when the machine changes messages it already sent (a clearing of old results,
/// a compaction): between two requests with the same mark the conversation only grew, so the
/// messages held need no comparing (which would cost the conversation's length each round).
/// Without a context policy the transcript is only ever appended to.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ViewMark {
    compactions: u32,
    cleared_upto: usize,
    native_refused: bool,
}

impl ViewMark {
    fn of(machine: &Machine) -> ViewMark {
        match machine.context_state() {
            Some(c) => ViewMark {
                compactions: c.compactions,
                cleared_upto: c.cleared_upto,
                native_refused: c.native_refused,
            },
            None => ViewMark {
                compactions: 0,
                cleared_upto: 0,
                native_refused: false,
            },
        }
    }
}

/// See [`ModelCall::held`].
#[derive(Default)]
struct Held {
    messages: Vec<Message>,
    tools: Option<Vec<ToolSpec>>,
    settings: Option<ModelSettings>,
    /// The machine's mark when the messages were sent.
    mark: Option<ViewMark>,
}

/// A request to a JavaScript model, as its wrapper (`npm/toolloop.js`) reads it: it keeps the
/// messages before `from` (from earlier requests), puts `messages` after them, and takes
/// `tools` and `settings` when they are given (they did not change otherwise). A summarisation
/// (`summary`) carries its whole conversation, which the wrapper does not keep.
#[derive(Serialize)]
struct HostRequest<'a> {
    from: usize,
    messages: Vec<&'a Message>,
    reminders: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a [ToolSpec]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    settings: Option<&'a ModelSettings>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    summary: bool,
}

impl<'a> HostRequest<'a> {
    /// A summarisation's request: all of it, kept apart from the conversation.
    fn summary(request: &ModelRequest<'a>) -> Self {
        HostRequest {
            from: 0,
            messages: request.messages.iter().collect(),
            reminders: request.reminders,
            tools: None,
            settings: Some(request.settings),
            summary: true,
        }
    }
}

impl Held {
    /// The request for `request`, as the difference from what the wrapper holds; what it holds
    /// then. With the same `mark` as the last request's (the conversation only grew), what is
    /// held is a prefix of it, checked by its last message; otherwise (another mark, or none:
    /// messages rendered anew each call) the common part is found by comparing messages in
    /// memory. Either way only what changed is encoded and crosses.
    fn request<'a>(
        &mut self,
        request: &ModelRequest<'a>,
        mark: Option<ViewMark>,
    ) -> HostRequest<'a> {
        let held = self.messages.len();
        let grown = mark.is_some()
            && mark == self.mark
            && held <= request.messages.len()
            && (held == 0 || request.messages.get(held - 1) == self.messages.last());
        self.mark = mark;
        let from = if grown {
            held
        } else {
            self.messages
                .iter()
                .zip(request.messages.iter())
                .take_while(|(held, sent)| held == sent)
                .count()
        };
        self.messages.truncate(from);
        let messages: Vec<&Message> = request.messages.iter().skip(from).collect();
        self.messages.extend(messages.iter().map(|&m| m.clone()));
        let tools = (self.tools.as_deref() != Some(request.tools)).then(|| {
            self.tools = Some(request.tools.to_vec());
            request.tools
        });
        let settings = (self.settings.as_ref() != Some(request.settings)).then(|| {
            self.settings = Some(request.settings.clone());
            request.settings
        });
        HostRequest {
            from,
            messages,
            reminders: request.reminders,
            tools,
            settings,
            summary: false,
        }
    }
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
            held: Default::default(),
            view_mark: Default::default(),
        })
    }

    /// One model call: the response, the text deltas told to the host as they come.
    /// `summary`: a summarisation of the conversation (the context policy's), not a round.
    async fn call(
        &self,
        host: &Host,
        request: &ModelRequest<'_>,
        summary: bool,
        mut delta: impl FnMut(&str),
    ) -> Result<ModelResponse, ModelError> {
        let Some(dialect) = self.prompted else {
            return self.inner(host, request, summary, &mut delta).await;
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
        let response = self.inner(host, &inner, summary, &mut |_| {}).await?;
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
        summary: bool,
        delta: &mut dyn FnMut(&str),
    ) -> Result<ModelResponse, ModelError> {
        match &self.caller {
            Caller::Host => {
                let request = if summary {
                    HostRequest::summary(request)
                } else {
                    // Prompt-based calling renders the messages anew each call: compared.
                    let mark = self.view_mark.get().filter(|_| self.prompted.is_none());
                    self.held.borrow_mut().request(request, mark)
                };
                let text =
                    serde_json::to_string(&request).map_err(|e| ModelError::Other(e.to_string()));
                let answer = match text {
                    Ok(text) => host.complete(&text).await,
                    Err(e) => Err(e.to_string()),
                };
                // What the wrapper holds is unsure after a failure: the next request carries
                // everything.
                let answer = answer.inspect_err(|_| *self.held.borrow_mut() = Held::default());
                let answer = answer.map_err(transport)?;
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
    /// Whether the error is worth another attempt (a thrown error with `retryable: true`,
    /// an attempt past the tool's time limit).
    #[serde(default)]
    retryable: bool,
}

fn tool_result(answer: Result<String, String>) -> Result<ToolOutput, ToolError> {
    let text = answer.map_err(ToolError::new)?;
    let a: ToolAnswer = serde_json::from_str(&text)
        .map_err(|e| ToolError::new(format!("the tool's answer does not parse: {e}")))?;
    match (a.error, a.ok) {
        (Some(e), _) if a.retryable => Err(ToolError::retryable(e)),
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
    /// When the run's time is up (milliseconds since the epoch), with a time limit.
    deadline: Option<f64>,
}

/// What a tool call under way needs of its run, apart from the machine: the host, whether it
/// hears events, and when the run's time is up. Calls of a batch running at once each hold
/// one, while the run hands the machine the results of those that finished.
#[derive(Clone, Copy)]
struct Ctl<'h> {
    host: &'h Host,
    events: bool,
    deadline: Option<f64>,
}

impl Ctl<'_> {
    /// Tells the host an event the driver makes (the machine makes the others).
    fn emit(&self, event: &Event) {
        if self.events
            && let Ok(text) = serde_json::to_string(event)
        {
            self.host.event(&text);
        }
    }

    /// Why the run must stop now, if it must: its time is up, or the caller cancelled.
    fn interrupted(&self) -> Option<Interrupt> {
        if self.deadline.is_some_and(|d| now_ms() >= d) {
            return Some(Interrupt::Timeout);
        }
        self.host.interrupted()
    }
}

/// How a tool call's attempts are made (as the native agent's): its time limit, retries of
/// retryable failures, and the first backoff, doubling.
#[derive(Clone, Copy)]
struct ToolRetry {
    timeout_ms: Option<f64>,
    retries: u32,
    backoff: std::time::Duration,
}

/// Runs one tool call through the host, attempt after attempt: an attempt that fails with a
/// retryable error (one past the tool's time limit among them) is made again after a backoff
/// that doubles, up to `retries` times. Its result, duration in milliseconds and attempts.
async fn run_call(
    ctl: Ctl<'_>,
    call: &toolloop::message::ToolCall,
    round: u32,
    retry: ToolRetry,
) -> (Result<ToolOutput, ToolError>, u64, u32) {
    let started = now_ms();
    let args = call.arguments.to_string();
    let mut attempt = 0u32;
    let result = loop {
        attempt += 1;
        ctl.emit(&Event::ToolStarted {
            round,
            call_id: call.id.clone(),
            name: call.name.clone(),
            attempt,
        });
        let answer = ctl
            .host
            .tool(&call.name, &args, &call.id, attempt, retry.timeout_ms)
            .await;
        match tool_result(answer) {
            Err(e) if e.retryable && attempt <= retry.retries && ctl.interrupted().is_none() => {
                let wait = retry.backoff.saturating_mul(1 << (attempt - 1).min(10));
                ctl.host.sleep(wait.as_secs_f64() * 1000.0).await;
                if ctl.interrupted().is_some() {
                    break Err(e);
                }
            }
            result => break result,
        }
    };
    let duration_ms = (now_ms() - started).max(0.0) as u64;
    (result, duration_ms, attempt)
}

impl<'h> Run<'h> {
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

    /// What a tool call under way needs of the run ([`Ctl`]).
    fn ctl(&self) -> Ctl<'h> {
        Ctl {
            host: self.host,
            events: self.events,
            deadline: self.deadline,
        }
    }

    /// Tells the host an event the driver makes (the machine makes the others).
    fn emit(&self, event: &Event) {
        self.ctl().emit(event);
    }

    fn checkpoint(&self) {
        if self.checkpoints
            && let Ok(state) = serde_json::to_string(&self.machine.snapshot())
        {
            self.host
                .event(&format!(r#"{{"type":"checkpoint","state":{state}}}"#));
        }
    }

    /// Why the run must stop now, if it must: its time is up, or the caller cancelled.
    fn interrupted(&self) -> Option<Interrupt> {
        self.ctl().interrupted()
    }

    fn interrupt(&mut self, why: Interrupt) -> Result<(), String> {
        self.feed(Input::Interrupted { why })
    }
}

/// The loop as the `reminders` and `onRoundLimit` hooks see it (JSON text):
/// `{ round, toolCalls, usage, lastCall }`.
fn view_json(machine: &Machine) -> String {
    let view = machine.view();
    json!({
        "round": view.round,
        "toolCalls": view.tool_calls,
        "usage": view.usage,
        "lastCall": view.last_call,
    })
    .to_string()
}

/// The round a [`Step::GetReminders`] is for: the one about to start.
fn view_round(machine: &Machine) -> u32 {
    machine.round() + 1
}

/// The approval subjects of a response's calls, as the machine weighs them: a call that
/// needs one (a rule names its tool, or it is not simply allowed) is weighed by what its tool's
/// `approvalSubject` gives (the host's `subject`), else by its canonical arguments, as a native
/// tool is by default; others by nothing (empty when none is). A subject the tool fails to
/// give is uncertain: every `deny` and `ask` rule of the tool matches the call.
fn approval_subjects(
    machine: &Machine,
    response: &ModelResponse,
    own_subject: &std::collections::HashSet<String>,
    host: &Host,
) -> Vec<Option<Subject>> {
    let approvals = &machine.config().approvals;
    let subjects: Vec<Option<Subject>> = response
        .tool_calls
        .iter()
        .map(|call| {
            let default = machine
                .catalog()
                .get(&call.name)
                .map_or(Action::Allow, CatalogEntry::approval_default);
            approvals.weighs_subject(&call.name, default).then(|| {
                let canonical = call.canonical_arguments();
                if !own_subject.contains(&call.name) {
                    return Subject::new(canonical);
                }
                match host.subject(&call.name, &call.arguments.to_string()) {
                    Ok(text) => Subject::new(text),
                    Err(e) => Subject::new(canonical)
                        .uncertain(format!("its tool's approvalSubject failed: {e}")),
                }
            })
        })
        .collect();
    if subjects.iter().all(Option::is_none) {
        return Vec::new();
    }
    subjects
}

/// Runs `spec` with `host` doing the I/O; the result as JSON text.
pub(crate) async fn run_spec(spec: RunSpec, host: &Host) -> Result<String, String> {
    let started = now_ms();
    let mut config = spec.limits.config(spec.model.stream);
    if let Some(options) = &spec.context {
        // As the native agent's: the policy checked, and the model's known window when none
        // is given.
        let mut policy = options.policy();
        policy
            .validate()
            .map_err(|e| format!("the context policy: {e}"))?;
        if policy.window.is_none()
            && let Some(name) = &spec.model.model
        {
            policy.window = toolloop::context::LimitTable::builtin().context_window(name);
        }
        config.context = Some(policy);
    }
    if let Some(approvals) = spec.approvals {
        config.approvals = approvals.approvals()?;
    }
    let config = Arc::new(config);
    let model_retries = spec.limits.model_retries.unwrap_or(2);
    let stream_restarts = config.stream_restarts;
    let retry = ToolRetry {
        timeout_ms: config.tool_timeout.map(|d| d.as_secs_f64() * 1000.0),
        retries: config.tool_retries,
        backoff: config.tool_retry_backoff,
    };
    let max_parallel = config.max_parallel;
    let deadline = config.timeout.map(|d| started + d.as_secs_f64() * 1000.0);
    // The tools that give their calls' approval subject themselves.
    let own_subject: std::collections::HashSet<String> = spec
        .tools
        .iter()
        .filter(|t| t.approval_subject)
        .map(|t| t.name.clone())
        .collect();
    let entries = spec
        .tools
        .into_iter()
        .map(|t| CatalogEntry {
            name: t.name,
            description: t.description,
            parameters: t.parameters,
            side_effect: Default::default(),
            parallel_safe: t.parallel_safe,
            terminal: false,
            default_approval: Some(if t.needs_approval {
                Action::Ask
            } else {
                Action::Allow
            }),
        })
        .collect();
    let catalog = Arc::new(Catalog::new(entries).map_err(|e| format!("the tools: {e}"))?);
    let specs: Vec<ToolSpec> = catalog.specs().to_vec();
    let model = ModelCall::new(&spec.model)?;
    // The hooks the host has: asked by the machine as natively ([`Step::GetReminders`],
    // [`Step::CheckStop`]).
    let hooks = HookFlags {
        reminders: host.has("reminders"),
        stop_when: host.has("stopWhen"),
        on_round_limit: host.has("onRoundLimit"),
    };
    let machine = match spec.state {
        Some(state) => Machine::resume(config, hooks, catalog, state),
        None => Machine::new(config, hooks, catalog, spec.messages),
    };
    let mut run = Run {
        host,
        machine,
        events: host.has("event"),
        checkpoints: spec.checkpoints,
        deadline,
    };
    run.machine.set_events(run.events);
    run.flush();
    let settings = ModelSettings::default();
    // The state of a round whose calls wait for approvals, when the run stopped for them.
    let mut waiting_state = None;
    loop {
        let step = run.machine.next_step();
        run.flush();
        if !matches!(step, Step::Finished)
            && let Some(why) = run.interrupted()
        {
            run.interrupt(why)?;
            continue;
        }
        match step {
            Step::Finished => break,
            Step::CallModel { round, reminders } => {
                // `read_result` is offered once a result was spilled (the machine answers it).
                let tools = toolloop::context::driver::request_tools(&run.machine, &specs);
                let settings = toolloop::context::driver::request_settings(&run.machine, &settings);
                let request = ModelRequest {
                    messages: run.machine.sent_messages(),
                    reminders: &reminders,
                    tools: &tools,
                    settings: &settings,
                };
                let events = run.events;
                model.view_mark.set(Some(ViewMark::of(&run.machine)));
                // Retries as the native agent's: a retryable failure before any output is
                // made again after a backoff; a stream that broke after delivering output is
                // restarted (`model_retry` tells listeners to drop its deltas).
                let (mut retries, mut restarts) = (0u32, 0u32);
                let result = loop {
                    let delivered = std::cell::Cell::new(false);
                    let result = model
                        .call(host, &request, false, |t| {
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
                        Err(e) if e.is_retryable() && run.interrupted().is_none() => e,
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
                        if run.interrupted().is_some() {
                            break Err(e);
                        }
                    }
                    run.emit(&Event::ModelRetry {
                        round,
                        attempt: retries + restarts + 1,
                        reason: e.to_string(),
                    });
                };
                if let Some(why) = run.interrupted() {
                    run.interrupt(why)?;
                    continue;
                }
                let input = match result {
                    Ok(response) => Input::ModelResponded {
                        round,
                        subjects: approval_subjects(&run.machine, &response, &own_subject, host),
                        response,
                        cost: None,
                    },
                    Err(e) => toolloop::context::driver::failed_call_input(&run.machine, round, e),
                };
                run.feed(input)?;
                run.checkpoint();
            }
            Step::RunTools(batches) => {
                let round = run.machine.round();
                'batches: for batch in batches {
                    // A batch of parallel-safe calls runs at most `max_parallel` at once, as
                    // natively: each call is started with the machine first, and its result
                    // handed back as it finishes (the machine keeps the round's order).
                    let limit = if batch.parallel {
                        max_parallel.max(1)
                    } else {
                        1
                    };
                    let mut calls = Vec::with_capacity(batch.calls.len());
                    for index in batch.calls {
                        let Some(call) = run.machine.shared_round_call(index) else {
                            continue;
                        };
                        run.feed(Input::ToolStarted {
                            round,
                            index,
                            call_id: call.id.clone(),
                        })?;
                        calls.push((index, call));
                    }
                    let ctl = run.ctl();
                    let jobs = calls.into_iter().map(|(index, call)| async move {
                        (index, run_call(ctl, &call, round, retry).await)
                    });
                    let mut finished = futures::stream::iter(jobs).buffer_unordered(limit);
                    while let Some((index, (result, duration_ms, attempts))) = finished.next().await
                    {
                        if let Some(why) = run.interrupted() {
                            run.interrupt(why)?;
                            break 'batches;
                        }
                        run.feed(Input::ToolFinished {
                            round,
                            index,
                            result,
                            duration_ms,
                            attempts,
                        })?;
                    }
                }
                run.checkpoint();
            }
            Step::Approve(requests) => {
                // Each call's decision, by a rule, or by the host's `approve` (a person);
                // without one, the calls that ask wait, and the run stops for them
                // (`awaiting_approval`): its state, resumed with an `approve`, asks again.
                let mut waiting = false;
                let mut interrupted = None;
                for r in requests {
                    let call = &r.pending.call;
                    let decision = match Decision::by_rule(call, &r.verdict) {
                        Some(decision) => decision,
                        None => {
                            run.emit(&r.pending.requested());
                            if !host.has("approve") {
                                waiting = true;
                                continue;
                            }
                            let pending = serde_json::to_string(&r.pending)
                                .map_err(|e| format!("the approval request: {e}"))?;
                            let answer = host.approve(&pending).await;
                            if let Some(why) = run.interrupted() {
                                interrupted = Some(why);
                                break;
                            }
                            // An answer that is not one (the handler threw, or gave something
                            // else) denies: a call that needs an approval never runs without.
                            let answer = answer
                                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
                                .unwrap_or_else(|e| Answer::Deny {
                                    reason: Some(format!("the approval handler failed: {e}")),
                                });
                            Decision::by_person(call, answer)
                        }
                    };
                    run.feed(Input::ApprovalDecided {
                        round: r.pending.round,
                        index: r.pending.index,
                        decision,
                    })?;
                }
                if let Some(why) = interrupted {
                    run.interrupt(why)?;
                } else if waiting {
                    // The state to go on from is the round's, its calls waiting: the machine
                    // ends the run here (a native run goes on from its log, which holds the
                    // round).
                    waiting_state = Some(run.machine.snapshot());
                    run.machine
                        .await_approval()
                        .map_err(|e| format!("the engine refused to wait for approvals: {e}"))?;
                    run.flush();
                }
            }
            Step::GetReminders => {
                // The round about to start, as the hook sees it; its strings go with that
                // round's request only. A hook that fails adds none.
                let view = view_json(&run.machine);
                let answer = host.hook("reminders", &view).await;
                if let Some(why) = run.interrupted() {
                    run.interrupt(why)?;
                    continue;
                }
                let reminders: Vec<String> = answer
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or_default();
                let round = view_round(&run.machine);
                run.feed(Input::RemindersGiven { round, reminders })?;
            }
            Step::DecideRoundLimit => {
                // `maxRounds` is reached: the hook grants more rounds (`{ "extend": n }`),
                // ends the run with a signal (`{ "signal": text }`), or stops it (`"stop"`),
                // as `on_round_limit` does natively. A hook that fails, or answers something
                // else, stops the run with `max_rounds`.
                let answer = host.hook("onRoundLimit", &view_json(&run.machine)).await;
                if let Some(why) = run.interrupted() {
                    run.interrupt(why)?;
                    continue;
                }
                let decision = match answer.ok().and_then(|t| serde_json::from_str(&t).ok()) {
                    // The machine adds the rounds to its limit, which is at most the rounds
                    // run: held where the sum fits.
                    Some(RoundLimitDecision::Extend(n)) => {
                        RoundLimitDecision::Extend(n.min(u32::MAX - run.machine.round()))
                    }
                    Some(decision) => decision,
                    None => RoundLimitDecision::Stop,
                };
                run.feed(Input::RoundLimitDecided { decision })?;
            }
            Step::CheckStop => {
                // Every call of the round ran: the hook may end the run with a signal (its
                // text), as `stop_when` does natively. A hook that fails does not stop it.
                let calls: Vec<Value> = run
                    .machine
                    .round_calls()
                    .iter()
                    .map(|c| {
                        json!({
                            "call": c.call,
                            "result": match c.result {
                                Some(Ok(o)) => json!({ "ok": o }),
                                Some(Err(e)) => json!({ "error": e.message }),
                                None => Value::Null,
                            },
                        })
                    })
                    .collect();
                let answer = host
                    .hook("stopWhen", &Value::Array(calls).to_string())
                    .await;
                if let Some(why) = run.interrupted() {
                    run.interrupt(why)?;
                    continue;
                }
                let signal: Option<String> = answer
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .flatten();
                let round = run.machine.round();
                run.feed(Input::StopChecked { round, signal })?;
            }
            step @ Step::EditContext { .. } => {
                if let Some(input) = toolloop::context::driver::edits_input(step) {
                    run.feed(input)?;
                }
            }
            Step::Compact(request) => {
                // The conversation's older part summarised by the run's model, as natively.
                let summary_settings =
                    toolloop::context::driver::summary_settings(&settings, false);
                let call = ModelRequest {
                    messages: (&request.messages).into(),
                    reminders: &[],
                    tools: &[],
                    settings: &summary_settings,
                };
                let result = model.call(host, &call, true, |_| {}).await;
                if let Some(why) = run.interrupted() {
                    run.interrupt(why)?;
                    continue;
                }
                let input = match result.map(|r| (r.text.filter(|t| !t.trim().is_empty()), r.usage))
                {
                    Ok((Some(summary), usage)) => Input::Compacted {
                        round: request.round,
                        compaction: Compaction {
                            cut: request.cut,
                            summary,
                            usage,
                            cost: None,
                        },
                    },
                    Ok((None, _)) => Input::CompactionFailed {
                        round: request.round,
                        message: "the summariser answered with no text".into(),
                    },
                    Err(e) => Input::CompactionFailed {
                        round: request.round,
                        message: e.to_string(),
                    },
                };
                run.feed(input)?;
                run.checkpoint();
            }
            other => {
                return Err(format!(
                    "the engine asked for {other:?}, which this driver does not do"
                ));
            }
        }
    }
    let state = waiting_state.unwrap_or_else(|| run.machine.snapshot());
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
