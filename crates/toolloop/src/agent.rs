//! The agent: a model, a toolbox, limits and hooks, and the async driver that runs the loop.
//!
//! The driver does the I/O the [`Machine`] asks for: model calls (complete or streamed), tool
//! calls (in the machine's schedule, with retries, timeouts and cancellation), and the
//! `on_round_limit` hook. It stops at the run's timeout or cancellation, and a stopped run still
//! returns everything it gathered.

use crate::config::{Hooks, LoopConfig, LoopView, RoundCall, RoundLimitDecision};
use crate::engine::{Batch, Interrupt, Machine, Step};
use crate::event::Event;
use crate::message::{Message, ToolCall};
use crate::model::{Model, ModelError, ModelRequest, ModelResponse, ModelSettings, ToolChoice};
use crate::outcome::Outcome;
use crate::price::PriceTable;
use crate::stream::{Accumulator, StreamEvent};
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput};
use crate::toolbox::{Toolbox, ToolboxError};
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Receives every event of a run.
pub type EventHandler = Arc<dyn Fn(&Event) + Send + Sync>;

/// A model with tools, limits and hooks. Cheap to clone; runs may go on concurrently.
#[derive(Clone)]
pub struct Agent {
    model: Arc<dyn Model>,
    toolbox: Arc<Toolbox>,
    config: Arc<LoopConfig>,
    hooks: Hooks,
    settings: Arc<ModelSettings>,
    system: Option<Arc<str>>,
    prices: Arc<PriceTable>,
    on_event: Option<EventHandler>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("model", &self.model.name())
            .field("tools", &self.toolbox)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Agent`].
pub struct AgentBuilder {
    model: Arc<dyn Model>,
    toolbox: Toolbox,
    error: Option<ToolboxError>,
    config: LoopConfig,
    hooks: Hooks,
    settings: ModelSettings,
    system: Option<String>,
    prices: PriceTable,
    on_event: Option<EventHandler>,
}

impl Agent {
    /// Starts building an agent around a model.
    pub fn builder(model: impl Model + 'static) -> AgentBuilder {
        AgentBuilder::new(Arc::new(model))
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.model
    }

    /// The toolbox.
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.toolbox
    }

    /// The limits and policies.
    pub fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// Runs the loop on a single user prompt (after the system prompt, if any).
    pub async fn prompt(&self, prompt: impl Into<String>) -> Outcome {
        self.run(vec![Message::user(prompt)]).await
    }

    /// Runs the loop over a conversation the caller owns; the outcome's `messages` is that
    /// conversation plus what the run added. Pass it back in (with a new user message) to keep
    /// the context, or start from fresh messages each time.
    pub async fn run(&self, messages: Vec<Message>) -> Outcome {
        self.run_cancellable(messages, CancellationToken::new())
            .await
    }

    /// Like [`Agent::run`], stopping early when `cancel` is cancelled.
    pub async fn run_cancellable(
        &self,
        messages: Vec<Message>,
        cancel: CancellationToken,
    ) -> Outcome {
        let sink = self.on_event.clone();
        self.drive(self.machine(messages), cancel, sink).await
    }

    /// Runs the loop and yields its events; the last one is [`Event::RunFinished`] with the
    /// outcome. Dropping the stream cancels the run.
    pub fn run_stream(&self, messages: Vec<Message>) -> impl Stream<Item = Event> + Send + 'static {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let agent = self.clone();
        let cancel = CancellationToken::new();
        let guard = cancel.clone().drop_guard();
        let user_sink = self.on_event.clone();
        let sink: EventHandler = Arc::new(move |e: &Event| {
            if let Some(f) = &user_sink {
                f(e);
            }
            let _ = tx.send(e.clone());
        });
        tokio::spawn(async move {
            let machine = agent.machine(messages);
            agent.drive(machine, cancel, Some(sink)).await;
        });
        futures::stream::unfold((rx, Some(guard)), |(mut rx, guard)| async move {
            rx.recv().await.map(|e| (e, (rx, guard)))
        })
    }

    /// Continues a run from a saved state (see [`crate::engine::LoopState`]).
    pub async fn resume(
        &self,
        state: crate::engine::LoopState,
        cancel: CancellationToken,
    ) -> Outcome {
        let machine = Machine::resume(
            self.config.clone(),
            self.hooks.clone(),
            self.toolbox.clone(),
            state,
        );
        self.drive(machine, cancel, self.on_event.clone()).await
    }

    fn machine(&self, mut messages: Vec<Message>) -> Machine {
        if let Some(system) = &self.system
            && !matches!(messages.first(), Some(Message::System { .. }))
        {
            messages.insert(0, Message::system(system.to_string()));
        }
        Machine::new(
            self.config.clone(),
            self.hooks.clone(),
            self.toolbox.clone(),
            messages,
        )
    }

    async fn drive(
        &self,
        mut machine: Machine,
        cancel: CancellationToken,
        sink: Option<EventHandler>,
    ) -> Outcome {
        let started = Instant::now();
        let deadline = self.config.timeout.map(|t| tokio::time::Instant::now() + t);
        let emit = |machine: &mut Machine| {
            if let Some(sink) = &sink {
                for e in machine.take_events() {
                    sink(&e);
                }
            } else {
                machine.take_events().for_each(drop);
            }
        };
        loop {
            emit(&mut machine);
            match machine.next_step() {
                Step::Finished => break,
                Step::CallModel { round, reminders } => {
                    emit(&mut machine);
                    let request = ModelRequest {
                        messages: machine.messages(),
                        reminders: &reminders,
                        tools: self.toolbox.specs(),
                        settings: &self.settings,
                    };
                    let call = self.call_model(request, round, sink.as_ref());
                    match guard(call, &cancel, deadline).await {
                        Ok(Ok(response)) => {
                            let cost = response
                                .usage
                                .and_then(|u| self.prices.cost(self.model_name(), &u));
                            machine.model_responded(response, cost);
                        }
                        Ok(Err(e)) => machine.model_failed(&e),
                        Err(why) => machine.interrupt(why),
                    }
                }
                Step::DecideRoundLimit => {
                    let decision = match &self.hooks.on_round_limit {
                        Some(f) => f(machine.view()),
                        None => Box::pin(async { RoundLimitDecision::Stop }),
                    };
                    match guard(decision, &cancel, deadline).await {
                        Ok(d) => machine.round_limit_decided(d),
                        Err(why) => machine.interrupt(why),
                    }
                }
                Step::RunTools(batches) => {
                    let tool_cancel = cancel.child_token();
                    for batch in batches {
                        let run =
                            self.run_batch(&mut machine, batch, &tool_cancel, deadline, &sink);
                        if let Err(why) = guard_interrupt(run, &cancel, deadline).await {
                            tool_cancel.cancel();
                            machine.interrupt(why);
                            break;
                        }
                        emit(&mut machine);
                    }
                }
            }
        }
        let outcome = machine.into_outcome(started.elapsed().as_millis() as u64);
        if let Some(sink) = &sink {
            sink(&Event::RunFinished {
                outcome: Box::new(outcome.clone()),
            });
        }
        outcome
    }

    fn model_name(&self) -> &str {
        self.settings
            .model
            .as_deref()
            .unwrap_or_else(|| self.model.name())
    }

    async fn call_model(
        &self,
        request: ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        if !self.config.stream {
            return self.model.complete(&request).await;
        }
        let mut stream = self.model.stream(&request).await?;
        let mut acc = Accumulator::new();
        while let Some(event) = stream.next().await {
            let event = event?;
            if let (StreamEvent::TextDelta(text), Some(sink)) = (&event, sink) {
                sink(&Event::TextDelta {
                    round,
                    text: text.clone(),
                });
            }
            acc.push(event);
        }
        Ok(acc.finish())
    }

    /// Runs one batch, reporting each call to the machine as it finishes. Returns when all are
    /// done; the caller races it against cancellation.
    async fn run_batch(
        &self,
        machine: &mut Machine,
        batch: Batch,
        cancel: &CancellationToken,
        deadline: Option<tokio::time::Instant>,
        sink: &Option<EventHandler>,
    ) {
        let round = machine.round();
        let jobs: Vec<_> = batch
            .calls
            .iter()
            .filter_map(|&i| machine.round_call(i).map(|c| (i, c.clone())))
            .map(|(i, call)| {
                let tool = self.toolbox.get(&call.name).cloned();
                let job = ToolJob {
                    round,
                    tool,
                    call,
                    cancel: cancel.clone(),
                    deadline,
                    config: self.config.clone(),
                    sink: sink.clone(),
                };
                job.run().map(move |r| (i, r))
            })
            .collect();
        let limit = if batch.parallel {
            self.config.max_parallel.max(1)
        } else {
            1
        };
        let mut results = futures::stream::iter(jobs).buffer_unordered(limit);
        while let Some((i, (result, duration_ms, attempts))) = results.next().await {
            machine.tool_finished(i, result, duration_ms, attempts);
            if let Some(sink) = sink {
                for e in machine.take_events() {
                    sink(&e);
                }
            }
        }
    }
}

struct ToolJob {
    round: u32,
    tool: Option<Arc<dyn Tool>>,
    call: ToolCall,
    cancel: CancellationToken,
    deadline: Option<tokio::time::Instant>,
    config: Arc<LoopConfig>,
    sink: Option<EventHandler>,
}

impl ToolJob {
    async fn run(self) -> (Result<ToolOutput, ToolError>, u64, u32) {
        let started = Instant::now();
        let Some(tool) = self.tool else {
            let e = ToolError::new(format!("unknown tool `{}`", self.call.name));
            return (Err(e), 0, 0);
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            if let Some(sink) = &self.sink {
                sink(&Event::ToolStarted {
                    round: self.round,
                    call_id: self.call.id.clone(),
                    name: self.call.name.clone(),
                    attempt,
                });
            }
            let ctx = ToolContext {
                call_id: self.call.id.clone(),
                tool_name: self.call.name.clone(),
                cancel: self.cancel.clone(),
                deadline: self.deadline,
                attempt,
                idempotency_key: self.call.id.clone(),
            };
            let call = AssertUnwindSafe(tool.call(self.call.arguments.clone(), ctx)).catch_unwind();
            let result = match self.config.tool_timeout {
                Some(limit) => match tokio::time::timeout(limit, call).await {
                    Ok(r) => r,
                    Err(_) => Ok(Err(ToolError::retryable(format!(
                        "the tool did not finish within {:.1}s",
                        limit.as_secs_f64()
                    )))),
                },
                None => call.await,
            };
            let result = result.unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(ToolError::new(format!("the tool crashed: {what}")))
            });
            match result {
                Err(e) if e.retryable && attempt <= self.config.tool_retries => {
                    let backoff = self
                        .config
                        .tool_retry_backoff
                        .saturating_mul(1 << (attempt - 1).min(10));
                    tokio::time::sleep(backoff).await;
                }
                r => return (r, started.elapsed().as_millis() as u64, attempt),
            }
        }
    }
}

/// Races `fut` against cancellation and the deadline.
async fn guard<T>(
    fut: impl Future<Output = T>,
    cancel: &CancellationToken,
    deadline: Option<tokio::time::Instant>,
) -> Result<T, Interrupt> {
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Interrupt::Cancelled),
        _ = sleep => Err(Interrupt::Timeout),
        v = fut => Ok(v),
    }
}

async fn guard_interrupt(
    fut: impl Future<Output = ()>,
    cancel: &CancellationToken,
    deadline: Option<tokio::time::Instant>,
) -> Result<(), Interrupt> {
    guard(fut, cancel, deadline).await
}

impl AgentBuilder {
    /// A builder around a shared model.
    pub fn new(model: Arc<dyn Model>) -> Self {
        AgentBuilder {
            model,
            toolbox: Toolbox::new(),
            error: None,
            config: LoopConfig::default(),
            hooks: Hooks::default(),
            settings: ModelSettings::default(),
            system: None,
            prices: PriceTable::builtin(),
            on_event: None,
        }
    }

    /// Adds a tool. Two tools with one name make [`AgentBuilder::build`] fail.
    pub fn tool(self, tool: impl Tool + 'static) -> Self {
        self.tool_arc(Arc::new(tool))
    }

    /// Adds a shared tool.
    pub fn tool_arc(mut self, tool: Arc<dyn Tool>) -> Self {
        if let Err(e) = self.toolbox.add_arc(tool)
            && self.error.is_none()
        {
            self.error = Some(e);
        }
        self
    }

    /// Adds several shared tools.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        for t in tools {
            self = self.tool_arc(t);
        }
        self
    }

    /// The system prompt, put first unless the conversation starts with one.
    pub fn system(mut self, prompt: impl Into<String>) -> Self {
        self.system = Some(prompt.into());
        self
    }

    /// Replaces all limits and policies.
    pub fn config(mut self, config: LoopConfig) -> Self {
        self.config = config;
        self
    }

    /// Model calls per run (default 10).
    pub fn max_rounds(mut self, n: u32) -> Self {
        self.config.max_rounds = n;
        self
    }

    /// Tool executions per run (default 20).
    pub fn max_tool_calls(mut self, n: u32) -> Self {
        self.config.max_tool_calls = n;
        self
    }

    /// Wall-clock limit for a run.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// Streams model responses (text deltas become events).
    pub fn stream(mut self, on: bool) -> Self {
        self.config.stream = on;
        self
    }

    /// Model settings (name override, temperature, output limit, tool choice, extra fields).
    pub fn settings(mut self, settings: ModelSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Sampling temperature.
    pub fn temperature(mut self, t: f32) -> Self {
        self.settings.temperature = Some(t);
        self
    }

    /// The most output tokens per model call.
    pub fn max_output_tokens(mut self, n: u32) -> Self {
        self.settings.max_output_tokens = Some(n);
        self
    }

    /// Tool choice.
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.settings.tool_choice = choice;
        self
    }

    /// Seed 002's CheckTerminal: after every call of a round ran, a signal ends the run.
    pub fn stop_when(
        mut self,
        f: impl Fn(&[RoundCall<'_>]) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.stop_when = Some(Arc::new(f));
        self
    }

    /// Seed 002's OnIterationLimit: called at `max_rounds`; it stops (with or without a signal)
    /// or grants more rounds.
    pub fn on_round_limit(
        mut self,
        f: impl Fn(LoopView<'_>) -> BoxFuture<'static, RoundLimitDecision> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.on_round_limit = Some(Arc::new(f));
        self
    }

    /// Seed 001's reminder channel: strings for the next request only.
    pub fn reminders(
        mut self,
        f: impl Fn(LoopView<'_>) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.reminders = Some(Arc::new(f));
        self
    }

    /// Receives every event.
    pub fn on_event(mut self, f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(f));
        self
    }

    /// Replaces the price table (default: [`PriceTable::builtin`]).
    pub fn prices(mut self, prices: PriceTable) -> Self {
        self.prices = prices;
        self
    }

    /// The agent, or the first toolbox error.
    pub fn build(self) -> Result<Agent, ToolboxError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        Ok(Agent {
            model: self.model,
            toolbox: Arc::new(self.toolbox),
            config: Arc::new(self.config),
            hooks: self.hooks,
            settings: Arc::new(self.settings),
            system: self.system.map(Arc::from),
            prices: Arc::new(self.prices),
            on_event: self.on_event,
        })
    }
}
