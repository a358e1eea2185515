//! The driver's steps as public methods, for a driver of its own (one that journals each step
//! elsewhere): the machine of a new run, the hooks' answers, a model call, a tool call, a summary.

use super::{
    Agent, EventHandler, InFlightDecision, ToolCallResult,
    tool_job::{call_tool_with, subject_changed},
};
use crate::approval::Subject;
use crate::config::{Hooks, RoundLimitDecision};
use crate::engine::{Input, Machine};
use crate::message::{Message, ToolCall};
use crate::model::{Model, ModelError, ModelRequest, ModelResponse, ModelSettings};
use crate::tool::{SideEffect, ToolError};
use crate::toolbox::Toolbox;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

impl Agent {
    /// The machine of a new run on `messages`, the agent's system prompt first (unless the
    /// messages start with one), with the agent's own tools ([`Agent::toolbox`]). For a driver
    /// of its own, one that journals each step elsewhere (a durable-execution engine, say): it
    /// asks [`Machine::next_step`], does each step with the methods below, and hands what came
    /// of it to [`Machine::handle`] as an [`Input`], as [`Agent::run`] does. With tool
    /// sources, such a driver gives the machine the run's tools ([`Input::ToolsChanged`])
    /// before each model call, from a catalog it journaled ([`Agent::tools_now`],
    /// [`Toolbox::catalog`]), and runs the calls with [`Toolbox::from_catalog`].
    pub fn start(&self, messages: Vec<Message>) -> Machine {
        self.machine_with(messages, &self.parts.toolbox)
    }

    /// The hooks (a driver journals their answers: they may not answer the same twice).
    pub fn hooks(&self) -> &Hooks {
        &self.parts.hooks
    }

    /// The answer of the `reminders` hook for [`Step::GetReminders`](crate::engine::Step::GetReminders) (none without the hook).
    pub fn reminders_for(&self, machine: &Machine) -> Vec<String> {
        match &self.parts.hooks.reminders {
            Some(f) => f(machine.view()),
            None => Vec::new(),
        }
    }

    /// The answer of the `stop_when` hook for [`Step::CheckStop`](crate::engine::Step::CheckStop) (none without the hook).
    pub fn stop_signal_for(&self, machine: &Machine) -> Option<String> {
        match &self.parts.hooks.stop_when {
            Some(f) => f(&machine.round_calls()),
            None => None,
        }
    }

    /// The answer of the `on_round_limit` hook for [`Step::DecideRoundLimit`](crate::engine::Step::DecideRoundLimit) (stop without
    /// the hook).
    pub fn round_limit_for(&self, machine: &Machine) -> BoxFuture<'static, RoundLimitDecision> {
        match &self.parts.hooks.on_round_limit {
            Some(f) => f(machine.view()),
            None => Box::pin(async { RoundLimitDecision::Stop }),
        }
    }

    /// The model call of [`Step::CallModel`](crate::engine::Step::CallModel): the machine's transcript, the round's
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
        let settings = crate::context::driver::request_settings(machine, &self.parts.settings);
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
            .and_then(|u| self.parts.price.as_ref().map(|p| p.cost(&u)))
    }

    /// The input that brings a model's response to the machine: the response, its cost, and
    /// its calls' approval subjects, taken from the run's tools `toolbox` where the agent's
    /// approval policy weighs them ([`Toolbox::approval_subjects`]).
    pub fn response_input(&self, toolbox: &Toolbox, round: u32, response: ModelResponse) -> Input {
        Input::ModelResponded {
            round,
            cost: self.cost(&response),
            subjects: toolbox.approval_subjects(&self.parts.config.approvals, &response.tool_calls),
            response,
        }
    }

    /// One tool call of [`Step::RunTools`](crate::engine::Step::RunTools) as the agent makes it: the tool's timeout, retries
    /// of retryable errors with backoff, a panic caught as an error, an unknown tool an error
    /// the model reads. The tool gets `idempotency_key` in its [`ToolContext`](crate::tool::ToolContext). `toolbox` is the
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
            &self.parts.config,
            round,
            call,
            std::borrow::Cow::Owned(idempotency_key),
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
                .parts
                .on_in_flight
                .as_ref()
                .is_some_and(|f| f(call) == InFlightDecision::Retry),
        }
    }

    pub(super) fn machine_with(&self, mut messages: Vec<Message>, toolbox: &Toolbox) -> Machine {
        if let Some(system) = &self.parts.system
            && !matches!(messages.first(), Some(Message::System { .. }))
        {
            messages.insert(0, Message::system(system.to_string()));
        }
        let mut machine = Machine::new(
            self.parts.config.clone(),
            (&self.parts.hooks).into(),
            toolbox.catalog().clone(),
            messages,
        );
        // The schema compiled when the agent was built, so this cannot fail; were it to, the
        // run would go on with no schema rather than stop.
        if let Err(e) = machine.set_output_schema(self.parts.settings.output.clone()) {
            tracing::error!("the output schema is not used: {e}");
        }
        machine
    }

    /// The summarisation call of a [`Step::Compact`](crate::engine::Step::Compact), with the agent's context model
    /// ([`AgentBuilder::context_model`](crate::agent::AgentBuilder::context_model)) or the run's own.
    pub async fn summarise(
        &self,
        settings: &ModelSettings,
        request: &crate::engine::CompactRequest,
    ) -> Input {
        use crate::context::driver::{summarise, summary_settings};
        let mut input = match &self.parts.context_model {
            Some((model, price)) => {
                let settings = summary_settings(settings, true);
                summarise(&**model, &settings, price.as_deref(), request).await
            }
            None => {
                let settings = summary_settings(settings, false);
                summarise(
                    &*self.parts.model,
                    &settings,
                    self.parts.price.as_deref(),
                    request,
                )
                .await
            }
        };
        // The summary is the model's text, sent on and stored: redacted as an answer is.
        if let Some(r) = &self.parts.redactor
            && let Input::Compacted { compaction, .. } = &mut input
        {
            compaction.summary = r.redact(&compaction.summary);
        }
        input
    }
}
