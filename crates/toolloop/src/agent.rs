//! The agent: a model, a toolbox, limits and hooks, and the async driver that runs the loop.
//!
//! The driver does the I/O the [`Machine`] asks for: model calls (complete or streamed), tool
//! calls (in the machine's schedule, with retries, timeouts and cancellation), and the hooks
//! (`reminders`, `stop_when`, `on_round_limit`), whose answers it logs before feeding them back.
//! It stops at the run's timeout or cancellation, and a stopped run still returns everything it
//! gathered.

use crate::approval::{
    Answer, ApprovalError, Approvals, DecidedBy, Decision, PendingApproval, Subject, Verdict,
};
use crate::config::{Hooks, LoopConfig, LoopView, RoundCall, RoundLimitDecision};
use crate::engine::{Batch, Input, Interrupt, Machine, Phase, PhaseError, Step};
use crate::event::Event;
use crate::journal::{Journal, JournalError, new_run_id};
use crate::message::{Message, ToolCall};
use crate::model::{Model, ModelError, ModelRequest, ModelResponse, ModelSettings, ToolChoice};
use crate::outcome::{ErrorCode, Outcome, StopReason};
use crate::output::OutputSchema;
use crate::price::{Price, PriceTable};
use crate::redact::{Redactor, StreamRedactor};
use crate::stream::{Accumulator, StreamEvent};
use crate::subagent::{Delegation, Inherited, Scope};
use crate::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use crate::tool_source::ToolSource;
use crate::toolbox::{Toolbox, ToolboxError};
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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
    /// The model's price, looked up once when the agent is built.
    price: Option<Arc<Price>>,
    on_event: Option<EventHandler>,
    journal: Option<Arc<dyn Journal>>,
    on_in_flight: Option<OnInFlight>,
    on_approval: Option<OnApproval>,
    /// Where tools beside the agent's own come from, and what they listed last.
    sources: Arc<Sources>,
    /// Secrets taken out of the model's text (see [`AgentBuilder::redact`]).
    redactor: Option<Arc<Redactor>>,
    /// The model that summarises a conversation being compacted, when not the run's own, and
    /// its price.
    context_model: Option<PricedModel>,
    /// How far the agent's delegation goes (see [`crate::subagent`]).
    delegation: Delegation,
    /// For a sub-agent's run: what it inherits from its parent's.
    inherited: Option<Arc<Inherited>>,
}

/// A model and its price, when known.
type PricedModel = (Arc<dyn Model>, Option<Arc<Price>>);

/// How long a tool source may take to list its tools; one that takes longer keeps the tools it
/// listed last, and is asked again once its version moves or [`SOURCE_SILENCE`] has passed (so
/// that a source that hangs does not hold up every round).
const SOURCE_LISTING: Duration = Duration::from_secs(30);
/// How long a source that did not answer is left alone, unless its version moves.
const SOURCE_SILENCE: Duration = Duration::from_secs(60);

/// The tool sources of an agent and the toolbox they made last.
#[derive(Default)]
struct Sources {
    sources: Vec<Arc<dyn ToolSource>>,
    listed: tokio::sync::Mutex<Option<Listed>>,
}

/// A toolbox made of the agent's tools and its sources', and what it was made from.
struct Listed {
    /// Each source's listing, in order.
    sources: Vec<SourceListing>,
    toolbox: Arc<Toolbox>,
}

/// What a source listed last.
#[derive(Clone)]
struct SourceListing {
    /// Its version when it was listed (`None`: its listing failed; it is asked again).
    version: Option<u64>,
    /// For a source that did not answer: when it is asked again (unless its version moves).
    silent_until: Option<tokio::time::Instant>,
    /// Its tools as listed last.
    tools: Vec<Arc<dyn Tool>>,
}

impl SourceListing {
    /// Whether this listing still stands for a source now at `version`.
    fn fresh(&self, version: u64, now: tokio::time::Instant) -> bool {
        self.version == Some(version) && self.silent_until.is_none_or(|t| now < t)
    }
}

/// Answers a call that waits for approval (see [`crate::approval`]). It runs in the driver;
/// its answer is logged before it is acted on, so a resumed run never asks it twice.
pub type OnApproval = Arc<dyn Fn(&PendingApproval) -> BoxFuture<'static, Answer> + Send + Sync>;

/// What to do, on resume, with a side-effecting call that was in flight at a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightDecision {
    /// Run it again (the tool de-duplicates with the idempotency key, say).
    Retry,
    /// Do not run it; the model reads "outcome unknown".
    Unknown,
}

/// Decides what to do with a side-effecting call that was in flight at a crash.
pub type OnInFlight = Arc<dyn Fn(&ToolCall) -> InFlightDecision + Send + Sync>;

fn holder_id() -> String {
    format!("pid {} ({})", std::process::id(), new_run_id())
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
    journal: Option<Arc<dyn Journal>>,
    on_in_flight: Option<OnInFlight>,
    on_approval: Option<OnApproval>,
    sources: Vec<Arc<dyn ToolSource>>,
    redactor: Option<Arc<Redactor>>,
    context_model: Option<Arc<dyn Model>>,
    limits: crate::context::LimitTable,
    delegation: Delegation,
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

    /// The agent's own tools (without its tool sources': see [`Agent::tools_now`]).
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.toolbox
    }

    /// Whether the agent has tool sources ([`AgentBuilder::tool_source`]), whose tools can
    /// change while a run goes on.
    pub fn has_tool_sources(&self) -> bool {
        !self.sources.sources.is_empty()
    }

    /// The tools a run offers now: the agent's own, then each tool source's (listed again when
    /// its version moved; see [`crate::tool_source`]). The same toolbox while nothing changed.
    pub async fn tools_now(&self) -> Arc<Toolbox> {
        let sources = &self.sources.sources;
        if sources.is_empty() {
            return self.toolbox.clone();
        }
        let mut listed = self.sources.listed.lock().await;
        let versions: Vec<u64> = sources.iter().map(|s| s.version()).collect();
        let now = tokio::time::Instant::now();
        if let Some(l) = listed.as_ref()
            && l.sources
                .iter()
                .zip(&versions)
                .all(|(s, &v)| s.fresh(v, now))
        {
            return l.toolbox.clone();
        }
        let reserved: Vec<&str> = self.toolbox.names().collect();
        let mut toolbox = Toolbox::new();
        for tool in self.toolbox.tools() {
            // The agent's own tools passed these checks when it was built.
            let _ = toolbox.add_arc(tool.clone());
        }
        let mut made = Vec::with_capacity(sources.len());
        for (i, (source, version)) in sources.iter().zip(versions).enumerate() {
            // Cloned, not taken: a run cancelled while a source lists keeps the cache whole.
            let previous = listed.as_ref().and_then(|l| l.sources.get(i)).cloned();
            let listing = match previous {
                // Its version has not moved: it keeps the tools it listed (one that did not
                // answer, until it is due to be asked again).
                Some(p) if p.fresh(version, now) => p,
                previous => {
                    let before = previous.map(|p| p.tools).unwrap_or_default();
                    let answer =
                        tokio::time::timeout(SOURCE_LISTING, source.tools(&reserved)).await;
                    match answer {
                        Ok(Ok(tools)) => SourceListing {
                            version: Some(version),
                            silent_until: None,
                            tools,
                        },
                        Ok(Err(e)) => {
                            tracing::warn!(source = source.name(), "tools not listed: {e}");
                            SourceListing {
                                version: None,
                                silent_until: None,
                                tools: before,
                            }
                        }
                        Err(_) => {
                            tracing::warn!(
                                source = source.name(),
                                "tools not listed: no answer within {}s; asked again in {}s",
                                SOURCE_LISTING.as_secs(),
                                SOURCE_SILENCE.as_secs()
                            );
                            SourceListing {
                                version: Some(version),
                                silent_until: Some(tokio::time::Instant::now() + SOURCE_SILENCE),
                                tools: before,
                            }
                        }
                    }
                }
            };
            for tool in &listing.tools {
                if let Err(e) = toolbox.add_arc(tool.clone()) {
                    tracing::warn!(source = source.name(), "a tool is left out: {e}");
                }
            }
            made.push(listing);
        }
        let toolbox = Arc::new(toolbox);
        *listed = Some(Listed {
            sources: made,
            toolbox: toolbox.clone(),
        });
        toolbox
    }

    /// The limits and policies.
    pub fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// The model settings of its runs.
    pub fn settings(&self) -> &ModelSettings {
        &self.settings
    }

    /// How far delegation to sub-agents goes from its runs ([`AgentBuilder::delegation`]).
    pub fn delegation(&self) -> Delegation {
        self.delegation
    }

    /// The model's price, when the price table knows it.
    pub(crate) fn price(&self) -> Option<&Price> {
        self.price.as_deref()
    }

    /// The model's name as requests give it.
    pub(crate) fn model_name(&self) -> &str {
        self.settings
            .model
            .as_deref()
            .unwrap_or_else(|| self.model.name())
    }

    /// The agent as a sub-agent's run makes it: logged in the parent's journal, its events to
    /// `on_event`, the root's approval handler (the child's own without one), its timeout
    /// bounded by the parent's time left.
    pub(crate) fn for_child(
        &self,
        inherited: Arc<Inherited>,
        journal: Option<Arc<dyn Journal>>,
        on_event: Option<EventHandler>,
        on_approval: Option<OnApproval>,
        timeout: Option<Duration>,
    ) -> Agent {
        let mut child = self.clone();
        child.inherited = Some(inherited);
        if journal.is_some() {
            child.journal = journal;
        }
        let own = self.on_event.clone();
        child.on_event = match (own, on_event) {
            (Some(own), Some(up)) => Some(Arc::new(move |e: &Event| {
                own(e);
                up(e);
            })),
            (own, up) => up.or(own),
        };
        if on_approval.is_some() {
            child.on_approval = on_approval;
        }
        if timeout != self.config.timeout {
            let mut config = (*self.config).clone();
            config.timeout = timeout;
            child.config = Arc::new(config);
        }
        child
    }

    /// The scope a run gives its tools: the sub-agents it calls learn from it where they are
    /// (see [`crate::subagent`]).
    fn scope_for(&self, sink: &Option<EventHandler>) -> Arc<Scope> {
        Arc::new(match &self.inherited {
            None => Scope::root(
                sink.clone(),
                self.on_approval.clone(),
                self.journal.clone(),
                self.delegation,
            ),
            Some(inherited) => Scope::child(inherited, self.journal.clone(), self.delegation),
        })
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
        self.run_inner(messages, cancel, self.on_event.clone())
            .await
    }

    /// Like [`Agent::run_cancellable`], logging the run under `run_id` instead of a fresh id
    /// (an id the caller derives, so that it can find the run again: a workflow's step, say).
    /// The id must be new to the journal: a run already logged under it is continued with
    /// [`Agent::resume`]. Without a journal the id is unused.
    pub async fn run_with_id(
        &self,
        run_id: &str,
        messages: Vec<Message>,
        cancel: CancellationToken,
    ) -> Outcome {
        self.run_logged(
            messages,
            cancel,
            self.on_event.clone(),
            Some(run_id.to_string()),
        )
        .await
    }

    async fn run_inner(
        &self,
        messages: Vec<Message>,
        cancel: CancellationToken,
        sink: Option<EventHandler>,
    ) -> Outcome {
        self.run_logged(messages, cancel, sink, None).await
    }

    async fn run_logged(
        &self,
        messages: Vec<Message>,
        cancel: CancellationToken,
        sink: Option<EventHandler>,
        run_id: Option<String>,
    ) -> Outcome {
        let toolbox = self.tools_now().await;
        let machine = self.machine_with(messages, &toolbox);
        match self.start_log(&machine, run_id).await {
            Ok(log) => self.drive(machine, toolbox, cancel, sink, log).await,
            Err(e) => {
                let mut m = machine;
                interrupt(&mut m, Interrupt::StoreFailed);
                let mut outcome = m.into_outcome(0);
                if let Some(err) = outcome.error.as_mut() {
                    err.message = format!("{}: {e}", err.message);
                }
                outcome
            }
        }
    }

    /// Opens the run log for a new run: a fresh id and the `started` record.
    async fn start_log(
        &self,
        machine: &Machine,
        run_id: Option<String>,
    ) -> Result<Option<RunLog>, JournalError> {
        let Some(journal) = &self.journal else {
            return Ok(None);
        };
        let log = match run_id {
            Some(id) => {
                let log = RunLog::new(journal.clone(), id);
                log.journal.acquire(&log.run_id, &log.holder).await?;
                log
            }
            // A fresh id is no run's yet: nothing to look up.
            None => {
                let log = RunLog::new(journal.clone(), new_run_id());
                log.journal.acquire_new(&log.run_id, &log.holder).await?;
                log
            }
        };
        let started = Input::Started {
            messages: machine.messages().to_vec(),
            output_schema: machine.output_schema().cloned(),
        };
        if self.has_tool_sources() {
            // Tools that can change are logged, so that a replay judges calls by these (the
            // machine was made with them).
            let tools = Input::ToolsChanged {
                round: 0,
                tools: machine.catalog().clone(),
            };
            log.journal
                .append_all(&log.run_id, &[started, tools])
                .await?;
        } else {
            log.journal.append(&log.run_id, &started).await?;
        }
        Ok(Some(log))
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
            agent.run_inner(messages, cancel, Some(sink)).await;
        });
        futures::stream::unfold((rx, Some(guard)), |(mut rx, guard)| async move {
            rx.recv().await.map(|e| (e, (rx, guard)))
        })
    }

    /// Continues a run from a saved state (see [`crate::engine::Snapshot`]), without a run log.
    pub async fn continue_from(
        &self,
        state: crate::engine::Snapshot,
        cancel: CancellationToken,
    ) -> Outcome {
        let toolbox = self.tools_now().await;
        let machine = Machine::resume(
            self.config.clone(),
            (&self.hooks).into(),
            toolbox.catalog().clone(),
            state,
        );
        self.drive(machine, toolbox, cancel, self.on_event.clone(), None)
            .await
    }

    /// Continues a logged run from its last durable step (after a crash, say). Model calls that
    /// returned are not made again and tool calls that finished are not run again. A call that
    /// was in flight is run again when its tool is read-only or idempotent; for a
    /// side-effecting tool the `on_in_flight` policy decides (default: report "outcome
    /// unknown" to the model). A run that had already finished just gives its outcome.
    ///
    /// Fails when no journal is configured, the run is unknown, its log does not replay, or
    /// another process holds it.
    pub async fn resume(
        &self,
        run_id: &str,
        cancel: CancellationToken,
    ) -> Result<Outcome, JournalError> {
        let journal = self
            .journal
            .clone()
            .ok_or_else(|| JournalError::Store("no run log (journal) is configured".into()))?;
        let log = RunLog::new(journal, run_id.to_string());
        let (mut machine, toolbox) = self.take_and_replay(&log).await?;
        let log = Some(log);
        for index in machine.in_flight() {
            let Some(call) = machine.round_call(index).cloned() else {
                continue;
            };
            if !self.retries_in_flight(&toolbox, &call) {
                // Goes with the next durable write: decided again if lost.
                let round = machine.round();
                take(&mut machine, &log, Input::ToolUnknown { round, index });
            }
        }
        Ok(self
            .drive(machine, toolbox, cancel, self.on_event.clone(), log)
            .await)
    }

    /// The outcome of a logged run as its log holds it, without running or changing anything
    /// (no lease is taken): a finished run's outcome; an unfinished one's so far, as if
    /// cancelled. Its `messages` (or, with a context policy, its `context` view) is the
    /// conversation the run's next model call would have been sent: after a run that failed on
    /// a model error ([`StopReason::ModelError`]), a new run started from it goes on where the
    /// failed call left off, with nothing the run did made or run again.
    ///
    /// Fails when no journal is configured, the run is unknown, or its log does not replay.
    pub async fn logged_outcome(&self, run_id: &str) -> Result<Outcome, JournalError> {
        let journal = self
            .journal
            .clone()
            .ok_or_else(|| JournalError::Store("no run log (journal) is configured".into()))?;
        let mut records = journal.load(run_id).await?;
        let live = self.tools_now().await;
        crate::journal::upgrade(&mut records, &live, &self.config.approvals);
        let machine = Machine::replay(
            self.config.clone(),
            (&self.hooks).into(),
            live.catalog().clone(),
            records,
        )
        .map_err(|source| JournalError::Corrupt {
            run_id: run_id.to_string(),
            source,
        })?;
        let mut outcome = machine.into_outcome(0);
        outcome.run_id = Some(run_id.to_string());
        Ok(outcome)
    }

    /// Takes the run's lease and rebuilds its machine from its log (the lease is given back on
    /// failure), with the toolbox the run has now: the live tools, judged by the catalog the
    /// log holds last, if it holds one.
    async fn take_and_replay(&self, log: &RunLog) -> Result<(Machine, Arc<Toolbox>), JournalError> {
        let run_id = log.run_id.as_str();
        log.journal.acquire(run_id, &log.holder).await?;
        let mut records = match log.journal.load(run_id).await {
            Ok(r) => r,
            Err(e) => {
                let _ = log.journal.release(run_id, &log.holder).await;
                return Err(e);
            }
        };
        let live = self.tools_now().await;
        crate::journal::upgrade(&mut records, &live, &self.config.approvals);
        let replayed = Machine::replay(
            self.config.clone(),
            (&self.hooks).into(),
            live.catalog().clone(),
            records,
        );
        match replayed {
            Ok(machine) => {
                let toolbox = if Arc::ptr_eq(machine.catalog(), live.catalog()) {
                    live
                } else {
                    Arc::new(Toolbox::from_catalog(machine.catalog().clone(), &live))
                };
                Ok((machine, toolbox))
            }
            Err(source) => {
                let _ = log.journal.release(run_id, &log.holder).await;
                Err(JournalError::Corrupt {
                    run_id: run_id.to_string(),
                    source,
                })
            }
        }
    }

    /// The calls of a logged run that wait for a person's approval (a run that stopped with
    /// [`StopReason::AwaitingApproval`], or one that crashed while a person was asked). Empty
    /// when none does.
    pub async fn pending_approvals(
        &self,
        run_id: &str,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        self.decide_approvals(run_id, None, None).await
    }

    /// Records a person's decision on calls of a logged run that wait for approval: `calls`
    /// names them by call id (`None`: every waiting call). Returns the calls decided. The
    /// decisions are bound to the calls' exact arguments and take effect when the run is
    /// resumed ([`Agent::resume`]), in this process or another. `answer` `None` decides
    /// nothing and returns the waiting calls.
    pub async fn decide_approvals(
        &self,
        run_id: &str,
        calls: Option<&[String]>,
        answer: Option<Answer>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        Box::pin(self.decide_approvals_in(run_id, calls, answer)).await
    }

    /// [`Agent::decide_approvals`]: the run's own calls, or else its children's (sub-agents of
    /// calls in flight: see [`crate::subagent`]), each decided in the child's own log.
    async fn decide_approvals_in(
        &self,
        run_id: &str,
        calls: Option<&[String]>,
        answer: Option<Answer>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        let journal = self
            .journal
            .clone()
            .ok_or_else(|| JournalError::Store("no run log (journal) is configured".into()))?;
        let log = RunLog::new(journal.clone(), run_id.to_string());
        let (mut machine, toolbox) = self.take_and_replay(&log).await?;
        let waiting: Vec<PendingApproval> = match machine.next_step() {
            Step::Approve(requests) => requests
                .into_iter()
                .filter(|r| r.verdict == Verdict::Ask)
                .map(|r| r.pending)
                .collect(),
            _ => Vec::new(),
        };
        // Children of calls in flight, when the run's own calls wait for nothing.
        let children: Vec<(String, String, Agent)> = if waiting.is_empty() {
            machine
                .in_flight()
                .into_iter()
                .filter_map(|i| machine.round_call(i))
                .filter_map(|call| {
                    let sub = toolbox.get(&call.name)?.sub_agent()?;
                    let mut agent = sub.agent().clone();
                    agent.journal = Some(journal.clone());
                    Some((
                        sub.name().to_string(),
                        crate::subagent::SubAgent::child_run_id(run_id, &call.id),
                        agent,
                    ))
                })
                .collect()
        } else {
            Vec::new()
        };
        if !children.is_empty() {
            let _ = log.journal.release(run_id, &log.holder).await;
            return self.decide_children(run_id, children, calls, answer).await;
        }
        let result = (|| {
            let Some(answer) = answer else {
                return Ok((waiting, Vec::new()));
            };
            let chosen: Vec<PendingApproval> = match calls {
                None => waiting.clone(),
                Some(ids) => {
                    let mut chosen = Vec::new();
                    for id in ids {
                        match waiting.iter().find(|p| &p.call.id == id) {
                            Some(p) => chosen.push(p.clone()),
                            None => {
                                return Err(ApprovalError::NotWaiting {
                                    run_id: run_id.to_string(),
                                    call_id: id.clone(),
                                    waiting: waiting.iter().map(|p| p.call.id.clone()).collect(),
                                });
                            }
                        }
                    }
                    chosen
                }
            };
            let records = chosen
                .iter()
                .map(|p| {
                    let (approved, reason) = match &answer {
                        Answer::Approve => (true, None),
                        Answer::Deny { reason } => (false, reason.clone()),
                    };
                    Input::ApprovalDecided {
                        round: p.round,
                        index: p.index,
                        decision: Decision::new(&p.call, approved, reason, DecidedBy::Person),
                    }
                })
                .collect();
            Ok((chosen, records))
        })();
        let written = match &result {
            Ok((_, records)) if !records.is_empty() => {
                log.journal.append_all(run_id, records).await
            }
            _ => Ok(()),
        };
        let _ = log.journal.release(run_id, &log.holder).await;
        written?;
        result.map(|(chosen, _)| chosen)
    }

    /// Lists or decides what the children of a run's calls in flight wait for: `children` are
    /// each child's name, run id and agent.
    async fn decide_children(
        &self,
        run_id: &str,
        children: Vec<(String, String, Agent)>,
        calls: Option<&[String]>,
        answer: Option<Answer>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        let below = |name: &str, child_id: &str, mut p: PendingApproval| {
            p.path.insert(0, name.to_string());
            if p.run_id.is_none() {
                p.run_id = Some(child_id.to_string());
            }
            p
        };
        let mut waiting = Vec::new();
        for (name, child_id, agent) in &children {
            match agent.decide_approvals(child_id, None, None).await {
                Ok(list) => waiting.extend(list.into_iter().map(|p| below(name, child_id, p))),
                // A child that never started its log waits for nothing.
                Err(ApprovalError::Journal(JournalError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        let Some(answer) = answer else {
            return Ok(waiting);
        };
        if let Some(ids) = calls
            && let Some(id) = ids
                .iter()
                .find(|id| !waiting.iter().any(|p| &p.call.id == *id))
        {
            return Err(ApprovalError::NotWaiting {
                run_id: run_id.to_string(),
                call_id: id.clone(),
                waiting: waiting.iter().map(|p| p.call.id.clone()).collect(),
            });
        }
        let mut decided = Vec::new();
        for (name, child_id, agent) in &children {
            let mine: Vec<String> = waiting
                .iter()
                .filter(|p| p.path.first() == Some(name) && p.run_id.is_some())
                .filter(|p| {
                    // The child's subtree: its own calls and its children's.
                    p.run_id.as_deref() == Some(child_id.as_str())
                        || p.run_id
                            .as_deref()
                            .is_some_and(|r| r.starts_with(&format!("{child_id}/")))
                })
                .filter(|p| calls.is_none_or(|ids| ids.contains(&p.call.id)))
                .map(|p| p.call.id.clone())
                .collect();
            if mine.is_empty() {
                continue;
            }
            let list = agent
                .decide_approvals(child_id, Some(&mine), Some(answer.clone()))
                .await?;
            decided.extend(list.into_iter().map(|p| below(name, child_id, p)));
        }
        Ok(decided)
    }

    /// The machine of a new run on `messages`, the agent's system prompt first (unless the
    /// messages start with one), with the agent's own tools ([`Agent::toolbox`]). For a driver
    /// of its own, one that journals each step elsewhere (a durable-execution engine, say): it
    /// asks [`Machine::next_step`], does each step with the methods below, and hands what came
    /// of it to [`Machine::handle`] as an [`Input`], as [`Agent::run`] does. With tool
    /// sources, such a driver gives the machine the run's tools ([`Input::ToolsChanged`])
    /// before each model call, from a catalog it journaled ([`Agent::tools_now`],
    /// [`Toolbox::catalog`]), and runs the calls with [`Toolbox::from_catalog`].
    pub fn start(&self, messages: Vec<Message>) -> Machine {
        self.machine_with(messages, &self.toolbox)
    }

    /// The hooks (a driver journals their answers: they may not answer the same twice).
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The answer of the `reminders` hook for [`Step::GetReminders`] (none without the hook).
    pub fn reminders_for(&self, machine: &Machine) -> Vec<String> {
        match &self.hooks.reminders {
            Some(f) => f(machine.view()),
            None => Vec::new(),
        }
    }

    /// The answer of the `stop_when` hook for [`Step::CheckStop`] (none without the hook).
    pub fn stop_signal_for(&self, machine: &Machine) -> Option<String> {
        match &self.hooks.stop_when {
            Some(f) => f(&machine.round_calls()),
            None => None,
        }
    }

    /// The answer of the `on_round_limit` hook for [`Step::DecideRoundLimit`] (stop without
    /// the hook).
    pub fn round_limit_for(&self, machine: &Machine) -> BoxFuture<'static, RoundLimitDecision> {
        match &self.hooks.on_round_limit {
            Some(f) => f(machine.view()),
            None => Box::pin(async { RoundLimitDecision::Stop }),
        }
    }

    /// The model call of [`Step::CallModel`]: the machine's transcript, the round's
    /// reminders, the tools the machine knows ([`Machine::catalog`]) and the settings, streamed
    /// when the agent streams (text deltas go to `sink`). `model` is the run's session
    /// ([`Model::session`] of [`Agent::model`]).
    pub async fn call_model_for(
        &self,
        model: &dyn Model,
        machine: &Machine,
        round: u32,
        reminders: &[String],
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        let tools = crate::context::driver::request_tools(machine, machine.catalog().specs());
        let settings = crate::context::driver::request_settings(machine, &self.settings);
        let request = ModelRequest {
            messages: machine.sent_messages(),
            reminders,
            tools: &tools,
            settings: &settings,
        };
        self.call_model(model, request, round, sink).await
    }

    /// What a response cost, when the model's price is known.
    pub fn cost(&self, response: &ModelResponse) -> Option<f64> {
        response
            .usage
            .and_then(|u| self.price.as_ref().map(|p| p.cost(&u)))
    }

    /// The input that brings a model's response to the machine: the response, its cost, and
    /// its calls' approval subjects, taken from the run's tools `toolbox` where the agent's
    /// approval policy weighs them ([`Toolbox::approval_subjects`]).
    pub fn response_input(&self, toolbox: &Toolbox, round: u32, response: ModelResponse) -> Input {
        Input::ModelResponded {
            round,
            cost: self.cost(&response),
            subjects: toolbox.approval_subjects(&self.config.approvals, &response.tool_calls),
            response,
        }
    }

    /// One tool call of [`Step::RunTools`] as the agent makes it: the tool's timeout, retries
    /// of retryable errors with backoff, a panic caught as an error, an unknown tool an error
    /// the model reads. The tool gets `idempotency_key` in its [`ToolContext`]. `toolbox` is the
    /// run's (with tool sources, it can differ from the agent's own).
    ///
    /// `weighed` is the approval subject the call was weighed by
    /// ([`Machine::weighed_subject`]): when the tool now gives another (a call before it changed
    /// a link, say), the call is not run, and its result says why (the model can call it again
    /// to have it weighed anew). The result is what the driver journals
    /// ([`Input::ToolFinished`]), so a replay reads it rather than checking again.
    #[allow(clippy::too_many_arguments)]
    pub async fn call_tool(
        &self,
        toolbox: &Toolbox,
        round: u32,
        call: &ToolCall,
        weighed: Option<&Subject>,
        idempotency_key: String,
        cancel: &CancellationToken,
        deadline: Option<tokio::time::Instant>,
        sink: Option<&EventHandler>,
    ) -> ToolCallResult {
        let Some(tool) = toolbox.get(&call.name) else {
            return ToolCallResult {
                result: Err(ToolError::new(format!("unknown tool `{}`", call.name))),
                duration_ms: 0,
                attempts: 0,
            };
        };
        if let Some(changed) = subject_changed(tool.as_ref(), call, weighed) {
            return changed;
        }
        call_tool_with(
            tool,
            &self.config,
            round,
            call,
            idempotency_key,
            cancel,
            deadline,
            sink,
            None,
            None,
        )
        .await
    }

    /// Whether a call that was in flight at a crash runs again: read-only and idempotent
    /// tools do; a side-effecting one only when the `on_in_flight` handler says so
    /// (otherwise the model reads "outcome unknown"). An unknown tool counts as
    /// side-effecting. `toolbox` is the run's.
    pub fn retries_in_flight(&self, toolbox: &Toolbox, call: &ToolCall) -> bool {
        let side_effect = toolbox
            .get(&call.name)
            .map_or(SideEffect::SideEffecting, |t| t.side_effect());
        match side_effect {
            SideEffect::ReadOnly | SideEffect::Idempotent => true,
            SideEffect::SideEffecting => self
                .on_in_flight
                .as_ref()
                .is_some_and(|f| f(call) == InFlightDecision::Retry),
        }
    }

    fn machine_with(&self, mut messages: Vec<Message>, toolbox: &Toolbox) -> Machine {
        if let Some(system) = &self.system
            && !matches!(messages.first(), Some(Message::System { .. }))
        {
            messages.insert(0, Message::system(system.to_string()));
        }
        let mut machine = Machine::new(
            self.config.clone(),
            (&self.hooks).into(),
            toolbox.catalog().clone(),
            messages,
        );
        // The schema compiled when the agent was built, so this cannot fail; were it to, the
        // run would go on with no schema rather than stop.
        if let Err(e) = machine.set_output_schema(self.settings.output.clone()) {
            tracing::error!("the output schema is not used: {e}");
        }
        machine
    }

    /// Drives the machine to its end, inside the run's `invoke_agent` span.
    async fn drive(
        &self,
        machine: Machine,
        toolbox: Arc<Toolbox>,
        cancel: CancellationToken,
        sink: Option<EventHandler>,
        log: Option<RunLog>,
    ) -> Outcome {
        let agent = self
            .inherited
            .as_ref()
            .and_then(|i| i.path.last())
            .map_or("toolloop", String::as_str);
        let span = crate::telemetry::run_span(self.model.name(), agent);
        let outcome = self
            .drive_in_span(machine, toolbox, cancel, sink, log)
            .instrument(span.clone())
            .await;
        crate::telemetry::run_finished(&span, &outcome);
        outcome
    }

    async fn drive_in_span(
        &self,
        mut machine: Machine,
        mut toolbox: Arc<Toolbox>,
        cancel: CancellationToken,
        sink: Option<EventHandler>,
        log: Option<RunLog>,
    ) -> Outcome {
        let started = Instant::now();
        // A timeout too large to add to the clock (`Duration::MAX`, say) is no deadline at all.
        let deadline = self
            .config
            .timeout
            .and_then(|t| tokio::time::Instant::now().checked_add(t));
        machine.set_events(sink.is_some());
        let emit = |machine: &mut Machine| {
            if let Some(sink) = &sink {
                for e in machine.take_events() {
                    sink(&e);
                }
            } else {
                machine.take_events().for_each(drop);
            }
        };
        let mut store_error: Option<JournalError> = None;
        // A resumed run keeps the output schema it started with, whatever the agent's now.
        let settings: std::borrow::Cow<'_, ModelSettings> =
            if machine.output_schema() == self.settings.output.as_ref() {
                std::borrow::Cow::Borrowed(&*self.settings)
            } else {
                let mut s = (*self.settings).clone();
                s.output = machine.output_schema().cloned();
                std::borrow::Cow::Owned(s)
            };
        // The transcript only grows during a run, so adapters may reuse their encoding of it.
        let model = self.model.session();
        // Cancelled, with the tools' work, when the run is interrupted; the caller's token is
        // left alone.
        let tool_cancel = cancel.child_token();
        let scope = self.scope_for(&sink);
        loop {
            emit(&mut machine);
            match machine.next_step() {
                Step::Finished => {
                    // What the last step settled (a round's end, when a limit stops the run).
                    emit(&mut machine);
                    break;
                }
                Step::GetReminders => {
                    // Durable with the round's response: asked again on resume if lost.
                    let input = Input::RemindersGiven {
                        round: machine.round() + 1,
                        reminders: self.reminders_for(&machine),
                    };
                    take(&mut machine, &log, input);
                }
                Step::CheckStop => {
                    // Durable with the next step's records: asked again on resume if lost.
                    let input = Input::StopChecked {
                        round: machine.round(),
                        signal: self.stop_signal_for(&machine),
                    };
                    take(&mut machine, &log, input);
                }
                Step::CallModel { round, reminders } => {
                    if self.has_tool_sources() {
                        let now = match guard(self.tools_now(), &cancel, deadline).await {
                            Ok(now) => now,
                            Err(why) => {
                                take(&mut machine, &log, Input::Interrupted { why });
                                continue;
                            }
                        };
                        if !Arc::ptr_eq(&now, &toolbox) {
                            // Durable with the round's response: listed again on resume if
                            // lost. The machine knows the same catalog already.
                            if !now.same_catalog(&toolbox) {
                                let tools = Input::ToolsChanged {
                                    round,
                                    tools: now.catalog().clone(),
                                };
                                take(&mut machine, &log, tools);
                            }
                            toolbox = now;
                        }
                    }
                    emit(&mut machine);
                    // Not waited for: a call lost to a crash is made again on resume.
                    take(&mut machine, &log, Input::ModelRequested { round });
                    let tools = crate::context::driver::request_tools(&machine, toolbox.specs());
                    // With what the machine asks of the provider itself this round (a function
                    // of its view: a resumed run asks the same).
                    let settings = crate::context::driver::request_settings(&machine, &settings);
                    let request = ModelRequest {
                        messages: machine.sent_messages(),
                        reminders: &reminders,
                        tools: &tools,
                        settings: &settings,
                    };
                    let span = crate::telemetry::chat_span(self.model.name(), round);
                    let call = self
                        .call_model(&*model, request, round, sink.as_ref())
                        .instrument(span.clone());
                    let called = guard(call, &cancel, deadline).await;
                    if let Ok(r) = &called {
                        crate::telemetry::chat_finished(&span, r);
                        match r {
                            Ok(response) => {
                                tracing::info!(
                                    round,
                                    tool_calls = response.tool_calls.len(),
                                    finish = ?response.finish_reason,
                                    "model answered"
                                );
                                tracing::debug!(
                                    round,
                                    text_chars = response.text.as_deref().map_or(0, |t| t.chars().count()),
                                    input_tokens = response.usage.map(|u| u.input_tokens),
                                    output_tokens = response.usage.map(|u| u.output_tokens),
                                    calls = %response.tool_calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "),
                                    "model answer"
                                );
                            }
                            Err(e) => tracing::info!(round, error = %e, "model call failed"),
                        }
                    }
                    // The previous round's results were written during the call: a response
                    // is taken only on a log that holds them.
                    if let (Ok(Ok(_)), Some(log)) = (&called, &log)
                        && let Err(e) = log.settle().await
                    {
                        store_error = Some(e);
                        interrupt(&mut machine, Interrupt::StoreFailed);
                        continue;
                    }
                    let input = match called {
                        // Durable with the intents of the calls it asks for (or with the run's
                        // end).
                        Ok(Ok(response)) => self.response_input(&toolbox, round, response),
                        // The failure ends the run (a refusal for size starts a compaction);
                        // it is durable with the run's end (or the compaction's summary).
                        Ok(Err(e)) => crate::context::driver::failed_call_input(&machine, round, e),
                        Err(why) => Input::Interrupted { why },
                    };
                    take(&mut machine, &log, input);
                }
                Step::Approve(requests) => {
                    // Before a person is asked, what the round holds is durable: a crash while
                    // asking asks again on resume, about the same calls.
                    if requests.iter().any(|r| r.verdict == Verdict::Ask)
                        && self.on_approval.is_some()
                        && let Some(log) = &log
                        && let Err(e) = log.flush().await
                    {
                        store_error = Some(e);
                        interrupt(&mut machine, Interrupt::StoreFailed);
                        continue;
                    }
                    let mut deferred = Vec::new();
                    let mut interrupted = None;
                    for r in requests {
                        let call = &r.pending.call;
                        let decision = match Decision::by_rule(call, &r.verdict) {
                            Some(decision) => decision,
                            None => {
                                if let Some(sink) = &sink {
                                    sink(&Event::ApprovalRequested {
                                        round: r.pending.round,
                                        call: call.clone(),
                                        subject: r.pending.subject.clone(),
                                    });
                                }
                                let Some(ask) = &self.on_approval else {
                                    deferred.push(r.pending);
                                    continue;
                                };
                                match guard(ask(&r.pending), &cancel, deadline).await {
                                    Ok(answer) => Decision::by_person(call, answer),
                                    Err(why) => {
                                        interrupted = Some(why);
                                        break;
                                    }
                                }
                            }
                        };
                        // Durable before the call runs (with its intent), or with the run's
                        // stop: a decision lost to a crash is taken again.
                        let input = Input::ApprovalDecided {
                            round: r.pending.round,
                            index: r.pending.index,
                            decision,
                        };
                        take(&mut machine, &log, input);
                    }
                    if let Some(why) = interrupted {
                        take(&mut machine, &log, Input::Interrupted { why });
                    } else if !deferred.is_empty() {
                        fed(machine.await_approval());
                    }
                }
                step @ Step::EditContext { .. } => {
                    // Durable with the round's response: made again on resume if lost.
                    if let Some(input) = crate::context::driver::edits_input(step) {
                        take(&mut machine, &log, input);
                    }
                }
                Step::Compact(request) => {
                    let input =
                        match guard(self.summarise(&settings, &request), &cancel, deadline).await {
                            Ok(input) => input,
                            Err(why) => Input::Interrupted { why },
                        };
                    take(&mut machine, &log, input);
                    // The summary is durable before the run goes on: a resumed run does not
                    // ask for it again.
                    if let Some(log) = &log
                        && let Err(e) = log.flush().await
                    {
                        store_error = Some(e);
                        interrupt(&mut machine, Interrupt::StoreFailed);
                    }
                }
                Step::DecideRoundLimit => {
                    let decision = self.round_limit_for(&machine);
                    // Asked again on resume if lost to a crash.
                    let input = match guard(decision, &cancel, deadline).await {
                        Ok(decision) => Input::RoundLimitDecided { decision },
                        Err(why) => Input::Interrupted { why },
                    };
                    take(&mut machine, &log, input);
                }
                Step::RunTools(batches) => {
                    let mut stopped = false;
                    for batch in batches {
                        let run = self.run_batch(
                            &mut machine,
                            &toolbox,
                            batch,
                            &tool_cancel,
                            deadline,
                            &sink,
                            &log,
                            &scope,
                        );
                        let interrupted = match guard(run, &cancel, deadline).await {
                            Ok(Ok(())) => None,
                            Ok(Err(e)) => {
                                store_error = Some(e);
                                Some((Interrupt::StoreFailed, false))
                            }
                            Err(why) => Some((why, true)),
                        };
                        if let Some((why, logged)) = interrupted {
                            tool_cancel.cancel();
                            let input = Input::Interrupted { why };
                            if logged {
                                take(&mut machine, &log, input);
                            } else {
                                fed(machine.handle(input));
                            }
                            stopped = true;
                            break;
                        }
                        emit(&mut machine);
                        if scope.has_awaiting() {
                            // A child waits for approvals: the round's later calls wait too.
                            break;
                        }
                    }
                    let waiting = scope.take_awaiting();
                    // The round's results are written while the next model call goes on (the
                    // call needs nothing durable: one lost to a crash is made again); the next
                    // flush, before any tool runs, waits for them. A crash before they are
                    // written leaves the calls in flight, as a crash just before would.
                    if !stopped
                        && let Some(log) = &log
                        && let Err(e) = log.flush_behind().await
                    {
                        store_error = Some(e);
                        interrupt(&mut machine, Interrupt::StoreFailed);
                        stopped = true;
                    }
                    if !stopped && !waiting.is_empty() {
                        // Not logged: the children's calls stay in flight, and run again (each
                        // child resuming from its log) when the run is resumed.
                        fed(machine.await_child_approvals(waiting));
                    }
                }
            }
        }
        // A run that waits for approvals is not over: its log stays open for the decisions and
        // the resume.
        let awaiting = matches!(
            machine.state().phase,
            Phase::Done {
                stop_reason: StopReason::AwaitingApproval,
                ..
            }
        );
        if let Some(log) = &log {
            if !awaiting {
                log.soon(Input::Finished);
            }
            if let Err(e) = log.flush().await {
                tracing::warn!(run_id = %log.run_id, "the run's end was not logged: {e}");
            }
        }
        let mut outcome = machine.into_outcome(started.elapsed().as_millis() as u64);
        // The run log's own error, on the error of a run it stopped (and of no other).
        if let (Some(e), Some(err)) = (store_error, outcome.error.as_mut())
            && err.code == ErrorCode::StoreFailed
        {
            err.message = format!("{}: {e}", err.message);
        }
        if let Some(log) = &log {
            outcome.run_id = Some(log.run_id.clone());
            let _ = log.journal.release(&log.run_id, &log.holder).await;
        }
        if let Some(sink) = &sink {
            sink(&Event::RunFinished {
                outcome: Box::new(outcome.clone()),
            });
        }
        outcome
    }

    /// The summarisation call of a [`Step::Compact`], with the agent's context model
    /// ([`AgentBuilder::context_model`]) or the run's own.
    pub async fn summarise(
        &self,
        settings: &ModelSettings,
        request: &crate::engine::CompactRequest,
    ) -> Input {
        use crate::context::driver::{summarise, summary_settings};
        let mut input = match &self.context_model {
            Some((model, price)) => {
                let settings = summary_settings(settings, true);
                summarise(&**model, &settings, price.as_deref(), request).await
            }
            None => {
                let settings = summary_settings(settings, false);
                summarise(&*self.model, &settings, self.price.as_deref(), request).await
            }
        };
        // The summary is the model's text, sent on and stored: redacted as an answer is.
        if let Some(r) = &self.redactor
            && let Input::Compacted { compaction, .. } = &mut input
        {
            compaction.summary = r.redact(&compaction.summary);
        }
        input
    }

    async fn call_model(
        &self,
        model: &dyn Model,
        request: ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        let mut response = self.call_model_raw(model, request, round, sink).await?;
        if let Some(r) = &self.redactor
            && let Some(text) = &mut response.text
        {
            *text = r.redact(text);
        }
        Ok(response)
    }

    async fn call_model_raw(
        &self,
        model: &dyn Model,
        request: ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        if !self.config.stream {
            return model.complete(&request).await;
        }
        let mut attempt = 1;
        loop {
            match self.stream_once(model, &request, round, sink).await {
                Err(ModelError::StreamInterrupted(reason))
                    if attempt <= self.config.stream_restarts =>
                {
                    attempt += 1;
                    tracing::info!(round, attempt, %reason, "the model's stream broke; asking again");
                    if let Some(sink) = sink {
                        sink(&Event::ModelRetry {
                            round,
                            attempt,
                            reason,
                        });
                    }
                }
                other => return other,
            }
        }
    }

    async fn stream_once(
        &self,
        model: &dyn Model,
        request: &ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        let mut stream = model.stream(request).await?;
        let mut acc = Accumulator::new();
        let mut held = self.redactor.as_deref().map(StreamRedactor::new);
        let emit = |text: String| {
            if let Some(sink) = sink
                && !text.is_empty()
            {
                sink(&Event::TextDelta { round, text });
            }
        };
        while let Some(event) = stream.next().await {
            let event = event?;
            if let StreamEvent::TextDelta(text) = &event {
                match &mut held {
                    Some(held) => emit(held.push(text)),
                    None => emit(text.clone()),
                }
            }
            acc.push(event);
        }
        if let Some(held) = held {
            emit(held.finish());
        }
        Ok(acc.finish())
    }

    /// Runs one batch, reporting each call to the machine (and the run log) as it finishes.
    /// Returns when all are done, or at the first run-log failure; the caller races it against
    /// cancellation.
    #[allow(clippy::too_many_arguments)]
    async fn run_batch(
        &self,
        machine: &mut Machine,
        toolbox: &Toolbox,
        batch: Batch,
        cancel: &CancellationToken,
        deadline: Option<tokio::time::Instant>,
        sink: &Option<EventHandler>,
        log: &Option<RunLog>,
        scope: &Arc<Scope>,
    ) -> Result<(), JournalError> {
        let round = machine.round();
        let limit = if batch.parallel {
            self.config.max_parallel.max(1)
        } else {
            1
        };
        // When every call starts at once, their intents are durable together before any runs;
        // otherwise each call makes its own durable before it starts. Calls of read-only and
        // idempotent tools run again on resume whether or not their intent was written, so
        // theirs need not be durable first: they are written with the round's results, in the
        // round's one commit (the response, the intents and the results together).
        let intents_first = batch.calls.len() <= limit;
        let mut rerun_safe = true;
        for &index in &batch.calls {
            let Some(call) = machine.round_call(index) else {
                continue;
            };
            rerun_safe &= toolbox.get(&call.name).is_none_or(|t| !intent_first(t));
            let intent = Input::ToolStarted {
                round,
                index,
                call_id: call.id.clone(),
            };
            if intents_first {
                take(machine, log, intent);
            } else {
                // Each job logs its own intent as it starts.
                fed(machine.handle(intent));
            }
        }
        if intents_first
            && !rerun_safe
            && let Some(log) = log
        {
            log.flush().await?;
        }
        let jobs: Vec<_> = batch
            .calls
            .iter()
            .filter_map(|&i| machine.shared_round_call(i).map(|c| (i, c)))
            .map(|(index, call)| {
                let job = ToolJob {
                    weighed: machine.weighed_subject(index).cloned(),
                    intent_logged: intents_first,
                    round,
                    index,
                    tool: toolbox.get(&call.name),
                    call,
                    cancel,
                    deadline,
                    config: &self.config,
                    sink,
                    log,
                    scope,
                };
                let span = crate::telemetry::tool_span(&job.call);
                let on_end = span.clone();
                let call = job.call.clone();
                job.run().instrument(span).map(move |r| {
                    if let Ok((result, ms, attempts)) = &r {
                        let text = match result {
                            Ok(o) => o.message.as_str(),
                            Err(e) => e.message.as_str(),
                        };
                        crate::telemetry::tool_finished(&on_end, result.is_ok(), *attempts, text);
                        tracing::info!(parent: &on_end, tool = %call.name, ok = result.is_ok(), ms, attempts, "tool call finished");
                        tracing::debug!(parent: &on_end, tool = %call.name, arguments = %crate::result::shorten(&call.arguments.to_string(), 300), result_chars = text.chars().count(), "tool call");
                    }
                    (index, r)
                })
            })
            .collect();
        let mut results = futures::stream::iter(jobs).buffer_unordered(limit);
        while let Some((index, done)) = results.next().await {
            // Results are durable with the next batch's intents, or together when the round's
            // calls are over (a result lost to a crash makes the call "in flight" on resume,
            // never run twice when it has side effects).
            let (result, duration_ms, attempts) = done?;
            if machine
                .round_call(index)
                .is_some_and(|c| scope.is_awaiting(&c.id))
            {
                // Its child waits for approvals: the call has no result yet.
                continue;
            }
            let finished = Input::ToolFinished {
                round,
                index,
                result,
                duration_ms,
                attempts,
            };
            take(machine, log, finished);
            if let Some(sink) = sink {
                for e in machine.take_events() {
                    sink(&e);
                }
            }
        }
        Ok(())
    }
}

/// Logs an input (durable with the run's next write, when the run is logged) and hands it to
/// the machine.
fn take(machine: &mut Machine, log: &Option<RunLog>, input: Input) {
    if let Some(log) = log {
        log.soon(input.clone());
    }
    fed(machine.handle(input));
}

/// Stops the run without logging why (the run log is what failed, or there is none).
fn interrupt(machine: &mut Machine, why: Interrupt) {
    fed(machine.handle(Input::Interrupted { why }));
}

/// Checks an input the driver fed the machine. The driver only feeds what the machine asked
/// for, so a refusal is a bug in the driver: it fails tests (debug builds) and is logged.
fn fed(result: Result<(), PhaseError>) {
    if let Err(e) = result {
        debug_assert!(
            false,
            "the driver fed the loop an input it did not ask for: {e}"
        );
        tracing::error!(error = %e, "the driver fed the loop an input it did not ask for");
    }
}

/// Where a logged run writes its records: queued by [`RunLog::soon`], made durable together by
/// [`RunLog::flush`] (waited for: before the run acts on them) or [`RunLog::flush_behind`]
/// (written while the run goes on; the next flush waits for it first). Flushes of one run go one
/// at a time and in order; a record queued while another flush is under way goes with the next
/// one, and a flush finds its records already written when an earlier flush took them. After a
/// failed flush every later one fails: nothing queued after a lost record is reported durable,
/// and nothing is written after it (the log never has a gap).
struct RunLog {
    journal: Arc<dyn Journal>,
    run_id: String,
    holder: String,
    queued: std::sync::Mutex<Vec<Input>>,
    flushing: tokio::sync::Mutex<Flushing>,
}

/// The state of a run's flushes.
#[derive(Default)]
struct Flushing {
    /// Set by the first failed flush.
    failed: Option<JournalError>,
    /// A flush still being written ([`RunLog::flush_behind`]).
    behind: Option<BoxFuture<'static, Result<(), JournalError>>>,
    /// How the flush being written ended, when it was found over without being awaited.
    behind_done: Option<Result<(), JournalError>>,
}

impl Flushing {
    /// Waits for the flush being written, if any; the first failure, if any.
    async fn settle(&mut self) -> Result<(), JournalError> {
        let written = match (self.behind_done.take(), self.behind.take()) {
            (Some(done), _) => Some(done),
            (None, Some(behind)) => Some(behind.await),
            (None, None) => None,
        };
        if let Some(Err(e)) = written {
            self.failed = Some(e);
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl RunLog {
    fn new(journal: Arc<dyn Journal>, run_id: String) -> Self {
        RunLog {
            journal,
            run_id,
            holder: holder_id(),
            queued: std::sync::Mutex::new(Vec::new()),
            flushing: tokio::sync::Mutex::new(Flushing::default()),
        }
    }

    /// Queues a record for the next flush.
    fn soon(&self, record: Input) {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }

    /// The queued records, without those the others imply.
    fn take_queued(&self) -> Vec<Input> {
        let mut records =
            std::mem::take(&mut *self.queued.lock().unwrap_or_else(|p| p.into_inner()));
        crate::journal::drop_implied(&mut records);
        records
    }

    /// Makes every queued record durable (after any flush still being written).
    async fn flush(&self) -> Result<(), JournalError> {
        let mut state = self.flushing.lock().await;
        state.settle().await?;
        let records = self.take_queued();
        if records.is_empty() {
            return Ok(());
        }
        let written = self.journal.append_all(&self.run_id, &records).await;
        if let Err(e) = &written {
            state.failed = Some(e.clone());
        }
        written
    }

    /// Starts writing every queued record and returns at once: for records the run does not
    /// act on, so that their commit overlaps what the run does next (a model call); the next
    /// flush waits for it first. Fails only when an earlier flush failed.
    async fn flush_behind(&self) -> Result<(), JournalError> {
        let mut state = self.flushing.lock().await;
        if let Some(behind) = state.behind.as_mut()
            && let Some(done) = behind.now_or_never()
        {
            state.behind = None;
            state.behind_done = Some(done);
        }
        if state.behind_done.is_some() || state.failed.is_some() {
            state.settle().await?;
        }
        let records = self.take_queued();
        if records.is_empty() {
            return Ok(());
        }
        // One at a time: a flush still being written is waited for (it has had a whole step).
        state.settle().await?;
        let mut behind = self.journal.clone().append_behind(&self.run_id, records);
        // A write that is over at once (a journal in memory) is not kept waiting.
        match (&mut behind).now_or_never() {
            Some(done) => state.behind_done = Some(done),
            None => state.behind = Some(behind),
        }
        Ok(())
    }

    /// Waits for a flush still being written; fails when it (or an earlier one) failed.
    async fn settle(&self) -> Result<(), JournalError> {
        self.flushing.lock().await.settle().await
    }

    /// Queues a record and makes it durable, with everything queued before it.
    async fn now(&self, record: Input) -> Result<(), JournalError> {
        self.soon(record);
        self.flush().await
    }
}

/// One call to run. It borrows what the run shares (nothing shared by every run is touched per
/// call) and holds the call itself through the machine's `Arc`.
struct ToolJob<'a> {
    /// The approval subject the call was weighed by, where the policy weighs it
    /// ([`Machine::weighed_subject`]).
    weighed: Option<Subject>,
    /// Whether the batch already made this call's intent durable.
    intent_logged: bool,
    round: u32,
    index: usize,
    tool: Option<&'a Arc<dyn Tool>>,
    call: Arc<ToolCall>,
    cancel: &'a CancellationToken,
    deadline: Option<tokio::time::Instant>,
    config: &'a LoopConfig,
    sink: &'a Option<EventHandler>,
    log: &'a Option<RunLog>,
    scope: &'a Arc<Scope>,
}

/// A finished call: its result, duration in milliseconds and attempts; or a run-log failure.
type JobResult = Result<(Result<ToolOutput, ToolError>, u64, u32), JournalError>;

impl ToolJob<'_> {
    async fn run(self) -> JobResult {
        let started = Instant::now();
        let Some(tool) = self.tool else {
            let e = ToolError::new(format!("unknown tool `{}`", self.call.name));
            return Ok((Err(e), 0, 0));
        };
        // The intent is durable before the call runs (a read-only or idempotent call's is
        // written with the next flush: it runs again on resume either way).
        if let Some(log) = self.log
            && !self.intent_logged
        {
            let intent = Input::ToolStarted {
                round: self.round,
                index: self.index,
                call_id: self.call.id.clone(),
            };
            if intent_first(tool) {
                log.now(intent).await?;
            } else {
                log.soon(intent);
            }
        }
        let idempotency_key = match self.log {
            Some(log) => format!("{}/{}", log.run_id, self.call.id),
            None => self.call.id.clone(),
        };
        // What the call touches is weighed again: the verdict holds only for the same.
        let done = match subject_changed(tool.as_ref(), &self.call, self.weighed.as_ref()) {
            Some(changed) => changed,
            None => {
                call_tool_with(
                    tool,
                    self.config,
                    self.round,
                    &self.call,
                    idempotency_key,
                    self.cancel,
                    self.deadline,
                    self.sink.as_ref(),
                    self.log.as_ref().map(|l| l.run_id.as_str()),
                    Some(self.scope),
                )
                .await
            }
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        Ok((done.result, duration_ms, done.attempts))
    }
}

/// Whether a call's intent is durable before it runs: a side-effecting tool's (a crash leaves
/// it in flight, never silently repeated), and a sub-agent's (its run is logged under the
/// call's id, which the log must hold for a resume to find that run again).
fn intent_first(tool: &Arc<dyn Tool>) -> bool {
    tool.side_effect() == SideEffect::SideEffecting || tool.sub_agent().is_some()
}

/// What one tool call came to: its result, how long it took and in how many attempts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolCallResult {
    /// The tool's output, or the error the model reads.
    pub result: Result<ToolOutput, ToolError>,
    /// Milliseconds from the first attempt's start to the last one's end.
    pub duration_ms: u64,
    /// Attempts made (0: the tool is unknown).
    pub attempts: u32,
}

/// The result of a call not run because what it touches changed after it was weighed: `tool`
/// now gives another approval subject than `weighed`, the one the policy (or a person) judged
/// it by. `None` when nothing was weighed or the subject is the same: the call runs.
fn subject_changed(
    tool: &dyn Tool,
    call: &ToolCall,
    weighed: Option<&Subject>,
) -> Option<ToolCallResult> {
    let weighed = weighed?;
    let now = crate::toolbox::subject_of(tool, &call.arguments);
    if *weighed == now {
        return None;
    }
    let shown =
        |s: &Subject| crate::result::shorten(&s.text, crate::result::ECHO_CHARS).into_owned();
    let change = if weighed.person != now.person {
        format!(
            "`{}` {} a person's approval now",
            shown(&now),
            if now.person {
                "needs"
            } else {
                "no longer needs"
            }
        )
    } else if weighed.text == now.text {
        format!("`{}` now resolves to something else", shown(weighed))
    } else {
        format!("`{}` is now `{}`", shown(weighed), shown(&now))
    };
    Some(ToolCallResult {
        result: Err(ToolError::new(format!(
            "not run: what this call touches changed after its approval was weighed \
             ({change}); call it again to have it weighed anew"
        ))),
        duration_ms: 0,
        attempts: 0,
    })
}

/// One tool call with the loop's retries, timeout and panic catching.
#[allow(clippy::too_many_arguments)]
async fn call_tool_with(
    tool: &Arc<dyn Tool>,
    config: &LoopConfig,
    round: u32,
    call: &ToolCall,
    idempotency_key: String,
    cancel: &CancellationToken,
    deadline: Option<tokio::time::Instant>,
    sink: Option<&EventHandler>,
    run_id: Option<&str>,
    scope: Option<&Arc<Scope>>,
) -> ToolCallResult {
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        if let Some(sink) = sink {
            sink(&Event::ToolStarted {
                round,
                call_id: call.id.clone(),
                name: call.name.clone(),
                attempt,
            });
        }
        let ctx = ToolContext {
            call_id: call.id.clone(),
            tool_name: call.name.clone(),
            cancel: cancel.clone(),
            deadline,
            attempt,
            idempotency_key: idempotency_key.clone(),
            run_id: run_id.map(str::to_string),
            scope: scope.cloned(),
        };
        let running = AssertUnwindSafe(tool.call(call.arguments.clone(), ctx)).catch_unwind();
        let result = match config.tool_timeout {
            Some(limit) => match tokio::time::timeout(limit, running).await {
                Ok(r) => r,
                Err(_) => Ok(Err(ToolError::retryable(format!(
                    "the tool did not finish within {:.1}s",
                    limit.as_secs_f64()
                )))),
            },
            None => running.await,
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
            Err(e) if e.retryable && attempt <= config.tool_retries => {
                let backoff = config
                    .tool_retry_backoff
                    .saturating_mul(1 << (attempt - 1).min(10));
                tokio::time::sleep(backoff).await;
            }
            result => {
                return ToolCallResult {
                    result,
                    duration_ms: started.elapsed().as_millis() as u64,
                    attempts: attempt,
                };
            }
        }
    }
}

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
            journal: None,
            on_in_flight: None,
            on_approval: None,
            sources: Vec::new(),
            redactor: None,
            context_model: None,
            limits: crate::context::LimitTable::builtin(),
            delegation: Delegation::default(),
        }
    }

    /// Replaces the secrets of `redactor` (an API key a model repeats, in any of the forms
    /// [`Redactor`] knows) with [`REDACTED`](crate::redact::REDACTED) in the model's text: in
    /// the text of every response, the final answer included, and in the streamed
    /// [`Event::TextDelta`]s (which hold back a piece that could be the beginning of a secret
    /// until the next piece shows it is not). The text is redacted before the run log, the
    /// events and the outcome see it. Default: nothing is redacted.
    pub fn redact(mut self, redactor: Redactor) -> Self {
        self.redactor = (!redactor.is_empty()).then(|| Arc::new(redactor));
        self
    }

    /// How far delegation to sub-agents goes from this agent's runs: how deep, and how many
    /// children at once (see [`crate::subagent`]).
    pub fn delegation(mut self, delegation: Delegation) -> Self {
        self.delegation = delegation;
        self
    }

    /// The approval policy: which calls run, wait for approval, or are denied (see
    /// [`crate::approval`]).
    pub fn approvals(mut self, approvals: Approvals) -> Self {
        self.config.approvals = approvals;
        self
    }

    /// Asks `f` about every call the policy says to ask about; its answer is logged before
    /// it is acted on. Without it, such a call stops the run with
    /// [`StopReason::AwaitingApproval`] (see [`Agent::decide_approvals`]).
    pub fn on_approval(
        mut self,
        f: impl Fn(&PendingApproval) -> BoxFuture<'static, Answer> + Send + Sync + 'static,
    ) -> Self {
        self.on_approval = Some(Arc::new(f));
        self
    }

    /// Logs every step of every run to `journal`, so runs can be resumed after a crash.
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// On resume, decides whether a side-effecting call that was in flight runs again
    /// (default: never; the model reads "outcome unknown").
    pub fn on_in_flight(
        mut self,
        f: impl Fn(&ToolCall) -> InFlightDecision + Send + Sync + 'static,
    ) -> Self {
        self.on_in_flight = Some(Arc::new(f));
        self
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

    /// Adds a source of tools that can change while a run goes on (MCP servers, say: see
    /// [`crate::tool_source`]). Its tools come after the agent's own; each run lists them when
    /// it starts and again before a model call when the source's version moved.
    pub fn tool_source(self, source: impl ToolSource + 'static) -> Self {
        self.tool_source_arc(Arc::new(source))
    }

    /// Adds a shared tool source (see [`AgentBuilder::tool_source`]).
    pub fn tool_source_arc(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.sources.push(source);
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

    /// What the run does to stay inside the model's context window (see
    /// [`crate::context::policy`]). A policy without a window takes the model's from
    /// [`AgentBuilder::limits`] (the built-in table by default) when it is known.
    /// [`AgentBuilder::build`] fails on a policy whose figures are out of range.
    pub fn context(mut self, policy: crate::context::ContextPolicy) -> Self {
        self.config.context = Some(policy);
        self
    }

    /// The model that summarises the conversation when it is compacted (default: the run's
    /// own); a cheaper one, say. Its usage and cost are counted apart
    /// ([`Outcome::context`]).
    pub fn context_model(self, model: impl Model + 'static) -> Self {
        self.context_model_arc(Arc::new(model))
    }

    /// A shared model that summarises the conversation (see [`AgentBuilder::context_model`]).
    pub fn context_model_arc(mut self, model: Arc<dyn Model>) -> Self {
        self.context_model = Some(model);
        self
    }

    /// The models' context windows, for a context policy that does not give one (default:
    /// [`crate::context::LimitTable::builtin`]).
    pub fn limits(mut self, limits: crate::context::LimitTable) -> Self {
        self.limits = limits;
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

    /// The Go toolloop's CheckTerminal: after every call of a round ran, a signal ends the run.
    pub fn stop_when(
        mut self,
        f: impl Fn(&[RoundCall<'_>]) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.stop_when = Some(Arc::new(f));
        self
    }

    /// The Go toolloop's OnIterationLimit: called at `max_rounds`; it stops (with or without a signal)
    /// or grants more rounds.
    pub fn on_round_limit(
        mut self,
        f: impl Fn(LoopView<'_>) -> BoxFuture<'static, RoundLimitDecision> + Send + Sync + 'static,
    ) -> Self {
        self.hooks.on_round_limit = Some(Arc::new(f));
        self
    }

    /// The planner loop's reminder channel: strings for the next request only.
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

    /// The run's final answer must be a `T`: its JSON Schema (generated by `schemars`) is sent
    /// with every request, and the loop validates the answer against it (see
    /// [`crate::output`]). Read the value with [`Outcome::parse`].
    ///
    /// ```
    /// use schemars::JsonSchema;
    /// use serde::Deserialize;
    /// use toolloop::providers::scripted::ScriptedModel;
    /// use toolloop::{Agent, ModelResponse};
    ///
    /// #[derive(Deserialize, JsonSchema)]
    /// struct City {
    ///     name: String,
    ///     population: u64,
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let model = ScriptedModel::new(vec![ModelResponse::text(
    ///     r#"{"name": "Lyon", "population": 522250}"#,
    /// )]);
    /// let agent = Agent::builder(model).output_type::<City>().build().unwrap();
    /// let outcome = agent.prompt("The largest city of the Rhône?").await;
    /// let city: City = outcome.parse().unwrap();
    /// assert_eq!(city.name, "Lyon");
    /// # });
    /// ```
    pub fn output_type<T: schemars::JsonSchema>(self) -> Self {
        self.output_schema(OutputSchema::for_type::<T>())
    }

    /// The run's final answer must match this JSON Schema (see [`crate::output`]); the
    /// validated value is in [`Outcome::output`]. [`AgentBuilder::build`] fails when the schema
    /// does not compile. (Set after [`AgentBuilder::settings`], which replaces it.)
    pub fn output_schema(mut self, schema: OutputSchema) -> Self {
        self.settings.output = Some(schema);
        self
    }

    /// The agent, or the first toolbox error (an output schema that does not compile
    /// included).
    pub fn build(self) -> Result<Agent, ToolboxError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if let Some(schema) = &self.settings.output {
            schema.compile().map_err(ToolboxError::OutputSchema)?;
        }
        let model_name = self
            .settings
            .model
            .as_deref()
            .unwrap_or_else(|| self.model.name());
        let price = self.prices.get(model_name).cloned().map(Arc::new);
        let mut config = self.config;
        if let Some(policy) = config.context.as_mut() {
            policy.validate().map_err(ToolboxError::ContextPolicy)?;
            if policy.window.is_none() {
                policy.window = self.limits.context_window(model_name);
            }
            policy.provider = self.model.native_context();
        }
        let context_model = self.context_model.map(|m| {
            let price = self.prices.get(m.name()).cloned().map(Arc::new);
            (m, price)
        });
        Ok(Agent {
            model: self.model,
            toolbox: Arc::new(self.toolbox),
            config: Arc::new(config),
            hooks: self.hooks,
            settings: Arc::new(self.settings),
            system: self.system.map(Arc::from),
            price,
            on_event: self.on_event,
            journal: self.journal,
            on_in_flight: self.on_in_flight,
            on_approval: self.on_approval,
            sources: Arc::new(Sources {
                sources: self.sources,
                listed: tokio::sync::Mutex::new(None),
            }),
            redactor: self.redactor,
            context_model,
            delegation: self.delegation,
            inherited: None,
        })
    }
}
