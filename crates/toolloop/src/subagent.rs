//! Delegation: an agent as another agent's tool.
//!
//! A [`SubAgent`] is a [`Tool`] that runs an [`Agent`] (the child) on a task the calling agent
//! (the parent) writes. The child has its own model, system prompt, tools and limits; it answers
//! with its final text (or its typed output), and a child that fails or runs out of budget gives
//! the parent an error result that says why, and the parent goes on.
//!
//! ```
//! use toolloop::providers::scripted::ScriptedModel;
//! use toolloop::Agent;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let reviewer = Agent::builder(ScriptedModel::from_json(r#"[{"text": "Looks right."}]"#).unwrap())
//!     .system("You review code.")
//!     .build()
//!     .unwrap();
//! let parent = Agent::builder(ScriptedModel::from_json(r#"[
//!     {"tool_calls": [{"name": "reviewer", "arguments": {"task": "Review src/lib.rs"}}]},
//!     {"text": "The reviewer says it looks right."}
//! ]"#).unwrap())
//!     .tool(reviewer.as_tool("reviewer", "Reviews code; give it what to review.").unwrap())
//!     .build()
//!     .unwrap();
//! let outcome = parent.prompt("Is src/lib.rs right?").await;
//! assert_eq!(outcome.text.as_deref(), Some("The reviewer says it looks right."));
//! assert!(outcome.tool_calls[0].content.contains("Looks right."));
//! # });
//! ```
//!
//! What holds:
//! - **Limits.** A child keeps its agent's limits (rounds, tool calls, timeout) and may have a
//!   token and a cost budget ([`SubAgent::max_tokens`], [`SubAgent::max_cost`]). The parent's
//!   remaining time bounds the child's timeout, and a parent's remaining budget bounds its
//!   child's. The child's usage and cost count in the parent's ([`crate::Outcome::usage`],
//!   [`crate::Outcome::cost`]), and each child's are reported with its call
//!   ([`crate::outcome::ExecutedCall::spent`]).
//! - **Caps.** Delegation goes at most [`Delegation::max_depth`] levels deep (default 2): a
//!   deeper call gets an error result. An agent that lists itself among its own sub-agents, at
//!   any depth, is refused when the tool is made ([`SubAgent::new`] checks the names). At most
//!   [`Delegation::max_children`] children of one run go at once; children whose tools are all
//!   read-only are parallel-safe, and run together under the parent's scheduling
//!   ([`crate::config::LoopConfig::max_parallel`]).
//! - **Durability.** When the parent's run is logged, the child's run is logged in the same
//!   journal under `{parent run id}/{call id}`. A resumed parent runs the call again (the tool
//!   is idempotent), which resumes the child from its own log: its finished model calls and tool
//!   calls are not made again, and a finished child just gives its outcome. The call's intent
//!   is logged before the child starts, so a resume finds the child's run by the call's id.
//!   A driver of its own (the Restate driver's child invocations) runs the child's machine
//!   itself: [`SubAgent::child_messages`] gives its conversation and [`SubAgent::result_of`]
//!   the parent's result.
//! - **Approvals.** A child's calls that wait for approval go to the root run's handler
//!   ([`crate::AgentBuilder::on_approval`]). With none, the root run stops with
//!   [`crate::StopReason::AwaitingApproval`] and lists them with their path
//!   ([`crate::approval::PendingApproval::path`]); [`Agent::decide_approvals`] on the root run
//!   decides them, and a resume finishes the run.
//! - **Events.** The child's events come to the root's event handler as [`Event::Child`], and
//!   the child's `invoke_agent` span is a child of the parent's `execute_tool` span.

use crate::agent::{Agent, EventHandler, OnApproval};
use crate::approval::PendingApproval;
use crate::event::Event;
use crate::journal::{Journal, JournalError, Record};
use crate::message::Message;
use crate::outcome::{Outcome, StopReason};
use crate::price::Price;
use crate::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use crate::usage::Spent;
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How far an agent's delegation goes: set on the root agent with
/// [`crate::AgentBuilder::delegation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delegation {
    /// How many levels of sub-agents below the root may run (default 2: the root's children
    /// and theirs). Set on the root; a child's own setting is not used.
    pub max_depth: u32,
    /// How many children of one run may run at once (default 4); a run's further calls of
    /// sub-agents wait for one to finish.
    pub max_children: usize,
}

impl Default for Delegation {
    fn default() -> Self {
        Delegation {
            max_depth: 2,
            max_children: 4,
        }
    }
}

/// Why a [`SubAgent`] could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DelegationError {
    /// The agent lists itself among its sub-agents, directly or through others.
    #[error("the agent `{name}` lists itself as a sub-agent ({})", cycle.join(" → "))]
    Recursive {
        /// The agent.
        name: String,
        /// The chain of sub-agents that comes back to it.
        cycle: Vec<String>,
    },
    /// A cost budget needs the model's price, and the price table does not know the model.
    #[error(
        "the agent `{name}` has a cost budget, but the price of its model `{model}` is unknown"
    )]
    NoPrice {
        /// The agent.
        name: String,
        /// The model.
        model: String,
    },
}

/// Finds a cycle in a graph of agents given by name: each agent with the names of the agents
/// it delegates to. Returns the first cycle found, as a [`DelegationError::Recursive`]. For
/// definitions read from a file (the `toolloop` command's `[agents.NAME]`), checked before any
/// agent is built.
pub fn check_graph<'a>(
    agents: impl IntoIterator<Item = (&'a str, Vec<&'a str>)>,
) -> Result<(), DelegationError> {
    let graph: std::collections::BTreeMap<&str, Vec<&str>> = agents.into_iter().collect();
    fn visit<'a>(
        node: &'a str,
        graph: &std::collections::BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut std::collections::BTreeSet<&'a str>,
    ) -> Result<(), DelegationError> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
            cycle.push(node.to_string());
            return Err(DelegationError::Recursive {
                name: node.to_string(),
                cycle,
            });
        }
        if done.contains(node) {
            return Ok(());
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if graph.contains_key(next) {
                visit(next, graph, stack, done)?;
            }
        }
        stack.pop();
        done.insert(node);
        Ok(())
    }
    let mut done = std::collections::BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done)?;
    }
    Ok(())
}

/// An agent as a tool: see the [module docs](self).
pub struct SubAgent {
    name: String,
    description: String,
    parameters: Value,
    /// Whether the arguments are the default `{"task": …}`.
    task_only: bool,
    agent: Agent,
    max_tokens: Option<u64>,
    max_cost: Option<f64>,
    read_only: bool,
}

impl std::fmt::Debug for SubAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubAgent")
            .field("name", &self.name)
            .field("agent", &self.agent)
            .field("max_tokens", &self.max_tokens)
            .field("max_cost", &self.max_cost)
            .finish_non_exhaustive()
    }
}

impl SubAgent {
    /// Makes `agent` a tool named `name`, described to the parent's model by `description`.
    /// The tool takes one string argument, `task`: the child's prompt. Fails when the agent
    /// has a sub-agent named `name` among its tools, at any depth.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        agent: Agent,
    ) -> Result<Self, DelegationError> {
        let name = name.into();
        if let Some(mut cycle) = find_self(&name, &agent) {
            cycle.insert(0, name.clone());
            return Err(DelegationError::Recursive { name, cycle });
        }
        let read_only = !agent.has_tool_sources()
            && agent
                .toolbox()
                .tools()
                .all(|t| t.side_effect() == SideEffect::ReadOnly);
        Ok(SubAgent {
            name,
            description: description.into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "task": {
                        "type": "string",
                        "description": "What to do, with everything needed to do it: the agent sees nothing else of this conversation."
                    }
                },
                "required": ["task"],
                "additionalProperties": false
            }),
            task_only: true,
            agent,
            max_tokens: None,
            max_cost: None,
            read_only,
        })
    }

    /// Declares the tool's arguments with a JSON Schema instead of the one `task` string; the
    /// child's prompt is then the arguments, as JSON. The schema is checked when the tool joins
    /// a toolbox, as every tool's is.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.parameters = schema;
        self.task_only = false;
        self
    }

    /// A token budget (input plus output tokens, the child's own children's included): the
    /// child stops at the end of the round that passes it, and the parent reads why.
    pub fn max_tokens(mut self, n: u64) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// A cost budget in US dollars (the child's own children's included), priced by the
    /// child's price table: the child stops at the end of the round that passes it. Fails when
    /// the price of the child's model is unknown.
    pub fn max_cost(mut self, usd: f64) -> Result<Self, DelegationError> {
        if self.agent.price().is_none() {
            return Err(DelegationError::NoPrice {
                name: self.name,
                model: self.agent.model_name().to_string(),
            });
        }
        self.max_cost = Some(usd);
        Ok(self)
    }

    /// The agent the tool runs.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The tool's name (the child's name in paths and events).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's run id for a call `call_id` of the run `parent_run_id`.
    pub fn child_run_id(parent_run_id: &str, call_id: &str) -> String {
        format!("{parent_run_id}/{call_id}")
    }

    /// The token and cost budgets set with [`SubAgent::max_tokens`] and
    /// [`SubAgent::max_cost`].
    pub fn budget(&self) -> (Option<u64>, Option<f64>) {
        (self.max_tokens, self.max_cost)
    }

    /// The child's conversation for a call's arguments: the task (or, with an
    /// [`input_schema`](SubAgent::input_schema), the arguments as JSON) as its one user
    /// message. For a driver that runs the child itself (a durable-execution engine's child
    /// invocation), with [`SubAgent::result_of`].
    pub fn child_messages(&self, args: &Value) -> Vec<Message> {
        vec![Message::user(self.prompt(args))]
    }

    /// The parent's result for the outcome of a child run by a driver of its own (see
    /// [`SubAgent::child_messages`]): its answer, or an error result that says why it did not
    /// finish (a child stopped as cancelled that spent more than its
    /// [`budget`](SubAgent::budget) went over it). Either carries what the child spent.
    pub fn result_of(&self, outcome: Outcome) -> Result<ToolOutput, ToolError> {
        let spent = self.spent_by(&outcome);
        let tokens = outcome.usage.map_or(0, |u| u.total_tokens());
        let over = match (self.max_tokens, self.max_cost) {
            (Some(max), _) if tokens > max => {
                Some(format!("it used {tokens} tokens, and its limit is {max}"))
            }
            (_, Some(max)) if outcome.cost.unwrap_or(0.0) > max => Some(format!(
                "it cost ${:.6}, and its limit is ${max:.6}",
                outcome.cost.unwrap_or(0.0)
            )),
            _ => None,
        };
        self.finished(outcome, spent, over)
    }

    /// What a child's outcome says it spent, for the parent's usage and cost.
    fn spent_by(&self, outcome: &Outcome) -> Spent {
        Spent {
            path: vec![self.name.clone()],
            run_id: outcome.run_id.clone(),
            usage: outcome.usage,
            calls_without_usage: outcome.calls_without_usage,
            cost: outcome.cost,
            rounds: outcome.rounds,
        }
    }

    /// The child's prompt for the call's arguments.
    fn prompt(&self, args: &Value) -> String {
        match (self.task_only, args.get("task").and_then(Value::as_str)) {
            (true, Some(task)) => task.to_string(),
            _ => crate::message::canonical_json(args),
        }
    }

    /// Runs the child for one call.
    async fn delegate(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let name = &self.name;
        let root;
        let scope = match &ctx.scope {
            Some(scope) => scope,
            None => {
                // Called outside an agent's run (a test, a script): the call is its own root.
                root = Arc::new(Scope::root(None, None, None, Delegation::default()));
                &root
            }
        };
        let depth = scope.depth + 1;
        if depth > scope.max_depth {
            return Err(ToolError::new(format!(
                "the agent `{name}` was not run: delegation would go {depth} levels deep, and \
                 the limit is {}; do this part yourself",
                scope.max_depth
            )));
        }
        let budget = Budget::child(&scope.budget, self.max_tokens, self.max_cost);
        if let Some(why) = budget.exhausted() {
            return Err(ToolError::new(format!(
                "the agent `{name}` was not run: {why}"
            )));
        }
        let mut path = scope.path.clone();
        path.push(name.clone());
        let run_id = match (&ctx.run_id, &scope.journal) {
            (Some(parent), Some(_)) => Some(Self::child_run_id(parent, &ctx.call_id)),
            _ => None,
        };
        // What the child already spent (a resumed child): its budget counts from there.
        if let (Some(id), Some(journal)) = (&run_id, &scope.journal) {
            match journal.load(id).await {
                Ok(records) => {
                    let (tokens, cost) = spent_in(&records);
                    budget.spend(tokens, cost);
                }
                Err(JournalError::NotFound(_)) => {}
                Err(e) => {
                    return Err(ToolError::new(format!(
                        "the agent `{name}` could not read its run log {id}: {e}"
                    )));
                }
            }
        }
        let _permit = match scope.running.acquire().await {
            Ok(p) => p,
            Err(_) => return Err(ToolError::new("the run is over")),
        };
        let cancel = ctx.cancel.child_token();
        budget.watch(cancel.clone());
        let timeout = match (self.agent.config().timeout, ctx.deadline) {
            (own, None) => own,
            (own, Some(deadline)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                Some(own.map_or(left, |t| t.min(left)))
            }
        };
        if timeout == Some(Duration::ZERO) {
            return Err(ToolError::new(format!(
                "the agent `{name}` was not run: the run has no time left"
            )));
        }
        let inherited = Arc::new(Inherited {
            depth,
            max_depth: scope.max_depth,
            path: path.clone(),
            root_sink: scope.root_sink.clone(),
            on_approval: scope.on_approval.clone(),
            budget: budget.clone(),
        });
        let sink = child_sink(
            &inherited,
            ctx.call_id.clone(),
            self.agent.price().cloned(),
            &budget,
        );
        let child = self.agent.for_child(
            inherited,
            scope.journal.clone(),
            sink,
            scope.on_approval.clone(),
            timeout,
        );
        let messages = vec![Message::user(self.prompt(&args))];
        let outcome = match &run_id {
            Some(id) => match child.resume(id, cancel.clone()).await {
                Ok(outcome) => outcome,
                Err(JournalError::NotFound(_)) => {
                    child.run_with_id(id, messages, cancel.clone()).await
                }
                Err(e) => {
                    return Err(ToolError::new(format!(
                        "the agent `{name}` could not resume its run {id}: {e}"
                    )));
                }
            },
            None => child.run_cancellable(messages, cancel.clone()).await,
        };
        let spent = self.spent_by(&outcome);
        self.answer(outcome, spent, &budget, scope, &ctx, run_id.is_some())
    }

    /// The parent's result for the child's outcome.
    fn answer(
        &self,
        outcome: Outcome,
        spent: Spent,
        budget: &Budget,
        scope: &Scope,
        ctx: &ToolContext,
        logged: bool,
    ) -> Result<ToolOutput, ToolError> {
        let name = &self.name;
        if outcome.stop_reason == StopReason::AwaitingApproval && logged {
            let waiting = outcome
                .pending_approvals
                .iter()
                .cloned()
                .map(|mut p| {
                    p.path.insert(0, name.clone());
                    if p.run_id.is_none() {
                        p.run_id = outcome.run_id.clone();
                    }
                    p
                })
                .collect();
            scope.defer(&ctx.call_id, waiting);
            return Err(ToolError {
                spent: Some(Box::new(spent)),
                ..ToolError::new(format!("the agent `{name}` waits for approvals"))
            });
        }
        self.finished(outcome, spent, budget.over())
    }

    /// The parent's result for a child's last outcome: its answer, or why it did not finish
    /// (`over`: what budget it went over, when it did).
    fn finished(
        &self,
        outcome: Outcome,
        spent: Spent,
        over: Option<String>,
    ) -> Result<ToolOutput, ToolError> {
        let name = &self.name;
        if outcome.success {
            let out = match (&outcome.output, &outcome.text) {
                (Some(output), _) => ToolOutput::data(output.clone()),
                (None, Some(text)) => ToolOutput::text(text.clone()),
                (None, None) => ToolOutput::text(match &outcome.signal {
                    Some(signal) => format!("the agent `{name}` stopped with the signal {signal}"),
                    None => format!("the agent `{name}` finished without an answer"),
                }),
            };
            return Ok(ToolOutput {
                spent: Some(Box::new(spent)),
                ..out
            });
        }
        let why = match (outcome.stop_reason, over) {
            (StopReason::Cancelled, Some(over)) => format!("it went over its budget: {over}"),
            _ => {
                let detail = outcome
                    .error
                    .as_ref()
                    .map(|e| e.message.clone())
                    .unwrap_or_else(|| format!("{:?}", outcome.stop_reason));
                format!("{}: {detail}", stop_words(outcome.stop_reason))
            }
        };
        let mut message = format!("the agent `{name}` did not finish: {why}");
        if let Some(text) = outcome.text.as_deref().filter(|t| !t.trim().is_empty()) {
            message.push_str(&format!("; its last words: {text}"));
        }
        Err(ToolError {
            spent: Some(Box::new(spent)),
            ..ToolError::new(message)
        })
    }
}

/// How a run's stop reads in a child's error result.
fn stop_words(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxRounds => "it used all its rounds",
        StopReason::MaxToolCalls => "it used all its tool calls",
        StopReason::Timeout => "it ran out of time",
        StopReason::Cancelled => "it was cancelled",
        StopReason::TooManyInvalidCalls => "it made too many invalid calls",
        StopReason::OutputTruncated => "its output was cut off",
        StopReason::ModelError => "its model call failed",
        StopReason::StoreFailed => "its run log could not be written",
        StopReason::AwaitingApproval => "its calls wait for approval and no one can give it",
        StopReason::EmptyAnswer => "its model answered with nothing",
        StopReason::ContextExhausted => "its conversation no longer fit its model's context window",
        StopReason::Answered | StopReason::TerminalSignal => "it stopped",
    }
}

/// A chain of sub-agents from `agent` that leads back to `name`, if any.
fn find_self(name: &str, agent: &Agent) -> Option<Vec<String>> {
    for tool in agent.toolbox().tools() {
        if let Some(sub) = tool.sub_agent() {
            if sub.name == name {
                return Some(vec![name.to_string()]);
            }
            if let Some(mut rest) = find_self(name, &sub.agent) {
                rest.insert(0, sub.name.clone());
                return Some(rest);
            }
        }
    }
    None
}

/// Tokens and cost a run's log shows spent: its model calls' and its children's.
fn spent_in(records: &[Record]) -> (u64, f64) {
    let mut tokens = 0;
    let mut cost = 0.0;
    for r in records {
        match r {
            Record::ModelResponded {
                response, cost: c, ..
            } => {
                tokens += response.usage.map_or(0, |u| u.total_tokens());
                cost += c.unwrap_or(0.0);
            }
            Record::ToolFinished { result, .. } => {
                let spent = match result {
                    Ok(o) => o.spent.as_deref(),
                    Err(e) => e.spent.as_deref(),
                };
                if let Some(s) = spent {
                    tokens += s.usage.map_or(0, |u| u.total_tokens());
                    cost += s.cost.unwrap_or(0.0);
                }
            }
            _ => {}
        }
    }
    (tokens, cost)
}

/// The child's event handler: its events go to the root's as [`Event::Child`], and its rounds'
/// usage is counted against its budget. `None` when neither is needed.
fn child_sink(
    inherited: &Arc<Inherited>,
    call_id: String,
    price: Option<Price>,
    budget: &Arc<Budget>,
) -> Option<EventHandler> {
    if inherited.root_sink.is_none() && !budget.limited() {
        return None;
    }
    let root = inherited.root_sink.clone();
    let path = inherited.path.clone();
    let budget = budget.clone();
    Some(Arc::new(move |e: &Event| {
        if let Event::RoundFinished { usage: Some(u), .. } = e {
            budget.spend(u.total_tokens(), price.as_ref().map_or(0.0, |p| p.cost(u)));
        }
        if let Some(root) = &root {
            root(&Event::Child {
                path: path.clone(),
                call_id: call_id.clone(),
                event: Box::new(e.clone()),
            });
        }
    }))
}

#[async_trait]
impl Tool for SubAgent {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    /// A child whose tools all only read may run beside other parallel-safe calls.
    fn parallel_safe(&self) -> bool {
        self.read_only
    }
    /// Read-only when the child's tools are; otherwise idempotent: calling it again resumes
    /// the child from its log, so nothing it did is done twice.
    fn side_effect(&self) -> SideEffect {
        if self.read_only {
            SideEffect::ReadOnly
        } else {
            SideEffect::Idempotent
        }
    }
    fn sub_agent(&self) -> Option<&SubAgent> {
        Some(self)
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.delegate(args, ctx).await
    }
}

impl Agent {
    /// This agent as a tool named `name` for another agent, described to that agent's model by
    /// `description` (see [`SubAgent`]): one string argument, `task`. Fails when this agent has
    /// a sub-agent named `name` among its tools, at any depth.
    pub fn as_tool(
        &self,
        name: impl Into<String>,
        description: impl Into<String>,
    ) -> Result<SubAgent, DelegationError> {
        SubAgent::new(name, description, self.clone())
    }
}

/// What a sub-agent tool learns of the run that calls it (carried by
/// [`ToolContext::scope`]): where the run is in the tree of agents, the root's event handler
/// and approval handler, the run log, and the budget.
pub struct Scope {
    /// The calling run's depth (0 for the root).
    pub(crate) depth: u32,
    pub(crate) max_depth: u32,
    /// The calling run's path from the root (empty for the root).
    pub(crate) path: Vec<String>,
    pub(crate) root_sink: Option<EventHandler>,
    pub(crate) on_approval: Option<OnApproval>,
    pub(crate) journal: Option<Arc<dyn Journal>>,
    /// The calling run's children running now.
    running: Semaphore,
    /// The calling run's budget.
    budget: Arc<Budget>,
    /// Calls whose children wait for approvals, with what they wait for.
    awaiting: Mutex<Vec<(String, Vec<PendingApproval>)>>,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("depth", &self.depth)
            .field("max_depth", &self.max_depth)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Scope {
    /// The scope of a root run.
    pub(crate) fn root(
        root_sink: Option<EventHandler>,
        on_approval: Option<OnApproval>,
        journal: Option<Arc<dyn Journal>>,
        limits: Delegation,
    ) -> Self {
        Scope {
            depth: 0,
            max_depth: limits.max_depth,
            path: Vec::new(),
            root_sink,
            on_approval,
            journal,
            running: Semaphore::new(limits.max_children.max(1)),
            budget: Arc::new(Budget::default()),
            awaiting: Mutex::new(Vec::new()),
        }
    }

    /// The scope of a child's run, from what it inherited.
    pub(crate) fn child(
        inherited: &Inherited,
        journal: Option<Arc<dyn Journal>>,
        limits: Delegation,
    ) -> Self {
        Scope {
            depth: inherited.depth,
            max_depth: inherited.max_depth,
            path: inherited.path.clone(),
            root_sink: inherited.root_sink.clone(),
            on_approval: inherited.on_approval.clone(),
            journal,
            running: Semaphore::new(limits.max_children.max(1)),
            budget: inherited.budget.clone(),
            awaiting: Mutex::new(Vec::new()),
        }
    }

    fn defer(&self, call_id: &str, waiting: Vec<PendingApproval>) {
        self.awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((call_id.to_string(), waiting));
    }

    /// Whether a child of the run waits for approvals.
    pub(crate) fn has_awaiting(&self) -> bool {
        !self
            .awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Whether the child of call `call_id` waits for approvals (its result is not the call's).
    pub(crate) fn is_awaiting(&self, call_id: &str) -> bool {
        self.awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(id, _)| id == call_id)
    }

    /// Every approval children of the run wait for, taken.
    pub(crate) fn take_awaiting(&self) -> Vec<PendingApproval> {
        std::mem::take(&mut *self.awaiting.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .flat_map(|(_, w)| w)
            .collect()
    }
}

/// What a child's run inherits from its parent's.
pub(crate) struct Inherited {
    pub(crate) depth: u32,
    pub(crate) max_depth: u32,
    pub(crate) path: Vec<String>,
    pub(crate) root_sink: Option<EventHandler>,
    pub(crate) on_approval: Option<OnApproval>,
    pub(crate) budget: Arc<Budget>,
}

/// A run's token and cost budget and what it spent; spending counts in every ancestor's too.
#[derive(Default)]
pub(crate) struct Budget {
    max_tokens: Option<u64>,
    max_cost: Option<f64>,
    spent: Mutex<(u64, f64)>,
    parent: Option<Arc<Budget>>,
    /// Cancels the run when it goes over.
    cancel: Mutex<Option<CancellationToken>>,
}

impl Budget {
    /// A child's budget: its own limits, bounded by what its ancestors have left.
    fn child(parent: &Arc<Budget>, max_tokens: Option<u64>, max_cost: Option<f64>) -> Arc<Self> {
        let (tokens_left, cost_left) = parent.left();
        let min_u = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let min_f = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Arc::new(Budget {
            max_tokens: min_u(max_tokens, tokens_left),
            max_cost: min_f(max_cost, cost_left),
            spent: Mutex::new((0, 0.0)),
            parent: Some(parent.clone()),
            cancel: Mutex::new(None),
        })
    }

    /// The tightest tokens and cost left along the chain of ancestors (`None`: no limit).
    fn left(&self) -> (Option<u64>, Option<f64>) {
        let (tokens, cost) = *self.spent.lock().unwrap_or_else(|p| p.into_inner());
        let mine = (
            self.max_tokens.map(|m| m.saturating_sub(tokens)),
            self.max_cost.map(|m| (m - cost).max(0.0)),
        );
        match &self.parent {
            None => mine,
            Some(p) => {
                let (pt, pc) = p.left();
                (
                    match (mine.0, pt) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                    match (mine.1, pc) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                )
            }
        }
    }

    fn limited(&self) -> bool {
        self.max_tokens.is_some()
            || self.max_cost.is_some()
            || self.parent.as_ref().is_some_and(|p| p.limited())
    }

    fn watch(&self, cancel: CancellationToken) {
        *self.cancel.lock().unwrap_or_else(|p| p.into_inner()) = Some(cancel);
    }

    /// Counts spending here and in every ancestor; a budget it passes cancels its run.
    fn spend(&self, tokens: u64, cost: f64) {
        {
            let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
            spent.0 += tokens;
            spent.1 += cost;
        }
        if self.over().is_some()
            && let Some(cancel) = &*self.cancel.lock().unwrap_or_else(|p| p.into_inner())
        {
            cancel.cancel();
        }
        if let Some(p) = &self.parent {
            p.spend(tokens, cost);
        }
    }

    /// What the run went over, if it did.
    fn over(&self) -> Option<String> {
        let (tokens, cost) = *self.spent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(max) = self.max_tokens
            && tokens > max
        {
            return Some(format!("it used {tokens} tokens, and its limit is {max}"));
        }
        if let Some(max) = self.max_cost
            && cost > max
        {
            return Some(format!("it cost ${cost:.6}, and its limit is ${max:.6}"));
        }
        None
    }

    /// Why nothing more may be spent, if so.
    fn exhausted(&self) -> Option<String> {
        match self.left() {
            (Some(0), _) => Some("no tokens are left in the budget".into()),
            (_, Some(c)) if c <= 0.0 => Some("no money is left in the budget".into()),
            _ => None,
        }
    }
}
