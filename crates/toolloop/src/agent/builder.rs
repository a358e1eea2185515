//! [`AgentBuilder`]: what an agent is made of, checked when it is built.

use super::{Agent, EventHandler, InFlightDecision, OnApproval, OnInFlight, Parts, Sources};
use crate::approval::{Answer, Approvals, PendingApproval};
use crate::config::{Hooks, LoopConfig, LoopView, RoundCall, RoundLimitDecision};
use crate::event::Event;
use crate::journal::Journal;
use crate::message::ToolCall;
use crate::model::{Model, ModelSettings, ToolChoice};
use crate::output::OutputSchema;
use crate::price::PriceTable;
use crate::redact::Redactor;
use crate::subagent::Delegation;
use crate::tool::Tool;
use crate::tool_source::ToolSource;
use crate::toolbox::{Toolbox, ToolboxError};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

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
    source_timeout: Duration,
    redactor: Option<Arc<Redactor>>,
    context_model: Option<Arc<dyn Model>>,
    limits: crate::context::LimitTable,
    delegation: Delegation,
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
            source_timeout: super::sources::SOURCE_LISTING,
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
    /// [`StopReason::AwaitingApproval`](crate::outcome::StopReason::AwaitingApproval) (see [`Agent::decide_approvals`]).
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

    /// How long a tool source may take to list its tools (30 s by default). One that takes
    /// longer is given up on for that round: the run goes on with the tools it listed last
    /// (none, the first time), and the source is left alone for twice this time unless its
    /// version moves, so that a source that hangs does not hold up every round.
    pub fn tool_source_timeout(mut self, timeout: Duration) -> Self {
        self.source_timeout = timeout;
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
    /// ([`Outcome::context`](crate::outcome::Outcome::context)).
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
    /// [`crate::output`]). Read the value with [`Outcome::parse`](crate::outcome::Outcome::parse).
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
    /// validated value is in [`Outcome::output`](crate::outcome::Outcome::output). [`AgentBuilder::build`] fails when the schema
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
            parts: Arc::new(Parts {
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
                sources: Arc::new(Sources::new(self.sources, self.source_timeout)),
                redactor: self.redactor,
                context_model,
                delegation: self.delegation,
                inherited: None,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{ContextPolicy, LimitTable, ModelLimits};
    use crate::providers::scripted::ScriptedModel;
    use crate::tool::ToolOutput;
    use crate::tool::tool_fn;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct NoArgs {}

    fn named(name: &str) -> impl Tool + 'static {
        tool_fn(name, "a tool", |_: NoArgs, _| async {
            Ok::<_, crate::tool::ToolError>(ToolOutput::text("ok"))
        })
    }

    fn model() -> ScriptedModel {
        ScriptedModel::new(Vec::new()).named("m-1")
    }

    #[test]
    fn clones_share_one_agent_and_a_childs_own_settings_leave_the_parents_alone() {
        let agent = Agent::builder(model())
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let clone = agent.clone();
        assert!(Arc::ptr_eq(&agent.parts, &clone.parts));
        let inherited = Arc::new(crate::subagent::Inherited {
            depth: 1,
            max_depth: 2,
            path: vec!["child".into()],
            root_sink: None,
            on_approval: None,
            budget: Arc::default(),
        });
        let journal: Arc<dyn Journal> = Arc::new(crate::journal::MemoryJournal::new());
        let child = agent.for_child(
            inherited,
            Some(journal),
            None,
            None,
            Some(Duration::from_secs(5)),
        );
        assert!(!Arc::ptr_eq(&agent.parts, &child.parts));
        assert_eq!(child.config().timeout, Some(Duration::from_secs(5)));
        assert!(child.parts.journal.is_some() && child.parts.inherited.is_some());
        // The parent, and every clone of it, as they were.
        for a in [&agent, &clone] {
            assert_eq!(a.config().timeout, Some(Duration::from_secs(60)));
            assert!(a.parts.journal.is_none() && a.parts.inherited.is_none());
        }
    }

    #[test]
    fn two_tools_with_one_name_fail_the_build_with_the_first_error() {
        let built = Agent::builder(model())
            .tool(named("a"))
            .tool(named("a"))
            .tool(named("bad name!"))
            .build();
        match built {
            Err(ToolboxError::Duplicate(name)) => assert_eq!(name, "a"),
            other => panic!("expected the duplicate, got {other:?}"),
        }
    }

    #[test]
    fn an_output_schema_that_does_not_compile_fails_the_build() {
        let schema = OutputSchema::new("broken", serde_json::json!({"type": 12}));
        let built = Agent::builder(model()).output_schema(schema).build();
        assert!(
            matches!(built, Err(ToolboxError::OutputSchema(_))),
            "{built:?}"
        );
    }

    #[test]
    fn a_context_policy_is_checked_and_takes_the_models_window_from_the_limits() {
        let bad = ContextPolicy {
            compact_at: 1.5,
            ..ContextPolicy::default()
        };
        let built = Agent::builder(model()).context(bad).build();
        assert!(
            matches!(built, Err(ToolboxError::ContextPolicy(_))),
            "{built:?}"
        );

        let mut limits = LimitTable::empty();
        limits.insert(
            "m-1",
            serde_json::from_value::<ModelLimits>(serde_json::json!({"context_window": 4096}))
                .unwrap(),
        );
        let agent = Agent::builder(model())
            .limits(limits.clone())
            .context(ContextPolicy::default())
            .build()
            .unwrap();
        assert_eq!(agent.config().context.as_ref().unwrap().window, Some(4096));
        // A window the policy gives wins.
        let given = ContextPolicy {
            window: Some(1000),
            ..ContextPolicy::default()
        };
        let agent = Agent::builder(model())
            .limits(limits)
            .context(given)
            .build()
            .unwrap();
        assert_eq!(agent.config().context.as_ref().unwrap().window, Some(1000));
    }
}
