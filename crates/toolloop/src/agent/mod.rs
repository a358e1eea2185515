//! The agent: a model, a toolbox, limits and hooks, and the async driver that runs the loop.
//!
//! The driver does the I/O the [`Machine`] asks for: model calls (complete or streamed), tool
//! calls (in the machine's schedule, with retries, timeouts and cancellation), and the hooks
//! (`reminders`, `stop_when`, `on_round_limit`), whose answers it logs before feeding them back.
//! It stops at the run's timeout or cancellation, and a stopped run still returns everything it
//! gathered.
//!
//! What calls what, in order (each step in the module named):
//! 1. `builder`: [`AgentBuilder`] checks what it is given (tool names, the output schema, the
//!    context policy) and makes the [`Agent`], looking the model's price and window up once.
//! 2. This module: a run's entry points ([`Agent::run`], [`Agent::prompt`],
//!    [`Agent::run_stream`], [`Agent::continue_from`], ...) list the run's tools (`sources`:
//!    the agent's own, then each [`ToolSource`](crate::tool_source::ToolSource)'s, listed again when its version moves), make the
//!    machine (`steps`: [`Agent::start`]'s system prompt and output schema), and open the run
//!    log.
//! 3. `logged`: a logged run takes its lease and writes its `Started` record
//!    ([`Input::Started`](crate::engine::Input::Started)); [`Agent::resume`] takes the lease of a run that stopped and replays
//!    its log into a fresh machine, deciding what the calls in flight at a crash come to.
//! 4. `drive`: the loop. It asks [`Machine::next_step`] and does each [`Step`](crate::engine::Step) in a function of
//!    its own (reminders, the stop check, the model call, approvals, context edits and
//!    compaction, the round limit, the tool calls); each answer is queued in the run log and then
//!    handed to [`Machine::handle`] (`take`), until [`Step::Finished`](crate::engine::Step::Finished); then it writes the run's
//!    end, gives the lease back and makes the [`Outcome`].
//! 5. What a step does: `model_call` (one model call, complete or streamed, restarted when the
//!    stream breaks, its text redacted), `tool_job` (a batch of tool calls in the machine's
//!    schedule: each call's intent logged before it runs when it has side effects, then the call
//!    with its timeout, retries and panic catching), `steps` (the same steps, public, for a
//!    driver of its own: the hooks' answers, a model call, a tool call, a summary).
//! 6. `run_log`: where every step's record goes: queued, then made durable together, before the
//!    run acts on it or while the next model call goes on.
//!
//! `approvals` lists and records a person's decisions on a logged run's waiting calls, its
//! sub-agents' included ([`Agent::decide_approvals`]).
mod approvals;
mod builder;
mod drive;
mod logged;
mod model_call;
mod run_log;
mod sources;
mod steps;
mod tool_job;

pub use builder::AgentBuilder;
use drive::interrupt;
use run_log::RunLog;
use sources::Sources;
pub use tool_job::ToolCallResult;

use crate::approval::{Answer, PendingApproval};
use crate::config::{Hooks, LoopConfig};
use crate::engine::{Interrupt, Machine};
use crate::event::Event;
use crate::journal::Journal;
use crate::message::{Message, ToolCall};
use crate::model::{Model, ModelSettings};
use crate::outcome::Outcome;
use crate::price::Price;
use crate::redact::Redactor;
use crate::subagent::{Delegation, Inherited, Scope};
use crate::toolbox::Toolbox;
use futures::Stream;
use futures::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Receives every event of a run.
pub type EventHandler = Arc<dyn Fn(&Event) + Send + Sync>;

/// A model with tools, limits and hooks. Cheap to clone: its clones share one allocation (a
/// clone is one reference count), so a process that gives each of thousands of tasks its own
/// clone reads one copy of the agent, not thousands. Runs may go on concurrently.
#[derive(Clone)]
pub struct Agent {
    parts: Arc<Parts>,
}

/// What an agent is made of, shared by its clones.
#[derive(Clone)]
struct Parts {
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

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("model", &self.parts.model.name())
            .field("tools", &self.parts.toolbox)
            .field("config", &self.parts.config)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts building an agent around a model.
    pub fn builder(model: impl Model + 'static) -> AgentBuilder {
        AgentBuilder::new(Arc::new(model))
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.parts.model
    }

    /// The agent's own tools (without its tool sources': see [`Agent::tools_now`]).
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.parts.toolbox
    }

    /// Whether the agent has tool sources ([`AgentBuilder::tool_source`]), whose tools can
    /// change while a run goes on.
    pub fn has_tool_sources(&self) -> bool {
        !self.parts.sources.is_empty()
    }

    /// The limits and policies.
    pub fn config(&self) -> &LoopConfig {
        &self.parts.config
    }

    /// The model settings of its runs.
    pub fn settings(&self) -> &ModelSettings {
        &self.parts.settings
    }

    /// How far delegation to sub-agents goes from its runs ([`AgentBuilder::delegation`]).
    pub fn delegation(&self) -> Delegation {
        self.parts.delegation
    }

    /// The model's price, when the price table knows it.
    pub(crate) fn price(&self) -> Option<&Price> {
        self.parts.price.as_deref()
    }

    /// The model's name as requests give it.
    pub(crate) fn model_name(&self) -> &str {
        self.parts
            .settings
            .model
            .as_deref()
            .unwrap_or_else(|| self.parts.model.name())
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
        let mut child = (*self.parts).clone();
        child.inherited = Some(inherited);
        if journal.is_some() {
            child.journal = journal;
        }
        let own = self.parts.on_event.clone();
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
        if timeout != self.parts.config.timeout {
            let mut config = (*self.parts.config).clone();
            config.timeout = timeout;
            child.config = Arc::new(config);
        }
        Agent {
            parts: Arc::new(child),
        }
    }

    /// The scope a run gives its tools: the sub-agents it calls learn from it where they are
    /// (see [`crate::subagent`]).
    pub(super) fn scope_for(&self, sink: &Option<EventHandler>) -> Arc<Scope> {
        Arc::new(match &self.parts.inherited {
            None => Scope::root(
                sink.clone(),
                self.parts.on_approval.clone(),
                self.parts.journal.clone(),
                self.parts.delegation,
            ),
            Some(inherited) => {
                Scope::child(inherited, self.parts.journal.clone(), self.parts.delegation)
            }
        })
    }

    /// Runs the loop on a single user prompt (after the system prompt, if any).
    ///
    /// Like [`Agent::run`] and [`Agent::run_cancellable`], it hands what it is given straight
    /// to the run's one future (it is not an `async fn` of its own), so that a process holding
    /// many runs in flight holds no wrapper state for each.
    pub fn prompt(&self, prompt: impl Into<String>) -> impl Future<Output = Outcome> + Send + '_ {
        self.run(vec![Message::user(prompt)])
    }

    /// Runs the loop over a conversation the caller owns; the outcome's `messages` is that
    /// conversation plus what the run added. Pass it back in (with a new user message) to keep
    /// the context, or start from fresh messages each time.
    pub fn run(&self, messages: Vec<Message>) -> impl Future<Output = Outcome> + Send + '_ {
        // No token: no one else could cancel it, so the run's steps wait on none.
        self.run_logged(messages, None, self.parts.on_event.clone(), None)
    }

    /// Like [`Agent::run`], stopping early when `cancel` is cancelled.
    pub fn run_cancellable(
        &self,
        messages: Vec<Message>,
        cancel: CancellationToken,
    ) -> impl Future<Output = Outcome> + Send + '_ {
        self.run_logged(messages, Some(cancel), self.parts.on_event.clone(), None)
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
            Some(cancel),
            self.parts.on_event.clone(),
            Some(run_id.to_string()),
        )
        .await
    }

    /// The run, stopped early when `cancel` (if there is one) is cancelled.
    async fn run_logged(
        &self,
        messages: Vec<Message>,
        cancel: Option<CancellationToken>,
        sink: Option<EventHandler>,
        run_id: Option<String>,
    ) -> Outcome {
        // What only some runs do before the loop (listing tool sources, opening a run log) is
        // boxed, and what the run starts from is scoped to this block, which ends before the
        // loop is awaited: a machine borrowed while the log opens would otherwise keep a slot
        // of its own in the future beside the loop's, for the whole run.
        let run = {
            let toolbox = self.run_tools_now().await;
            let machine = self.machine_with(messages, &toolbox);
            let log = match &self.parts.journal {
                Some(_) => Box::pin(self.start_log(&machine, run_id)).await,
                None => Ok(None),
            };
            match log {
                Ok(log) => self.drive(machine, toolbox, cancel, sink, log),
                Err(e) => {
                    let mut m = machine;
                    interrupt(&mut m, Interrupt::StoreFailed);
                    let mut outcome = m.into_outcome(0);
                    if let Some(err) = outcome.error.as_mut() {
                        err.message = format!("{}: {e}", err.message);
                    }
                    return outcome;
                }
            }
        };
        run.await
    }

    /// The tools a run starts with ([`Agent::tools_now`]), listed in a boxed future: only runs
    /// with tool sources wait for a listing.
    async fn run_tools_now(&self) -> Arc<Toolbox> {
        if self.has_tool_sources() {
            Box::pin(self.tools_now()).await
        } else {
            self.parts.toolbox.clone()
        }
    }

    /// Runs the loop and yields its events; the last one is [`Event::RunFinished`] with the
    /// outcome. Dropping the stream cancels the run.
    pub fn run_stream(&self, messages: Vec<Message>) -> impl Stream<Item = Event> + Send + 'static {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let agent = self.clone();
        let cancel = CancellationToken::new();
        let guard = cancel.clone().drop_guard();
        let user_sink = self.parts.on_event.clone();
        let sink: EventHandler = Arc::new(move |e: &Event| {
            if let Some(f) = &user_sink {
                f(e);
            }
            let _ = tx.send(e.clone());
        });
        tokio::spawn(async move {
            agent
                .run_logged(messages, Some(cancel), Some(sink), None)
                .await;
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
        let toolbox = self.run_tools_now().await;
        let machine = Machine::resume(
            self.parts.config.clone(),
            (&self.parts.hooks).into(),
            toolbox.catalog().clone(),
            state,
        );
        self.drive(
            machine,
            toolbox,
            Some(cancel),
            self.parts.on_event.clone(),
            None,
        )
        .await
    }
}
