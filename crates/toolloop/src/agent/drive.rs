//! The drive loop: [`Machine::next_step`], each step done in a function of its own, its answer
//! logged and handed to the machine, until the run is over.
//!
//! [`Agent::drive`] opens the run's span and makes a [`Drive`], what one run's steps share; its
//! loop asks the machine for the next step and calls the step's function: `give_reminders`,
//! `check_stop`, `call_model` (after `refresh_tools`), `approve`, `edit_context`, `compact`,
//! `decide_round_limit`, `run_tools`; at [`Step::Finished`], `finish` writes the run's end and
//! makes the outcome. Every answer goes through `take`: queued in the run log, then handed to
//! the machine.

use super::{Agent, EventHandler, RunLog};
use crate::approval::{Decision, Verdict};
use crate::engine::{
    ApprovalRequest, Batch, CompactRequest, Input, Interrupt, Machine, Phase, PhaseError, Step,
};
use crate::event::Event;
use crate::journal::JournalError;
use crate::model::{Model, ModelRequest, ModelSettings};
use crate::outcome::{ErrorCode, Outcome, StopReason};
use crate::subagent::Scope;
use crate::toolbox::Toolbox;
use futures::FutureExt;
use std::borrow::Cow;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

impl Agent {
    /// Drives the machine to its end, inside the run's `invoke_agent` span. Not an `async fn`:
    /// what it is given goes into the [`Drive`] before the future starts, so the future holds
    /// it once. `cancel` is the caller's token; without one, nothing but the deadline stops the
    /// run from outside, and its steps wait on no token.
    pub(super) fn drive(
        &self,
        machine: Machine,
        toolbox: Arc<Toolbox>,
        cancel: Option<CancellationToken>,
        sink: Option<EventHandler>,
        log: Option<RunLog>,
    ) -> impl Future<Output = Outcome> + Send + '_ {
        let agent = self
            .parts
            .inherited
            .as_ref()
            .and_then(|i| i.path.last())
            .map_or("toolloop", String::as_str);
        let span = crate::telemetry::run_span(self.parts.model.name(), agent);
        let mut drive = Drive::new(self, machine, toolbox, cancel.as_ref(), sink, log);
        let deadline = drive.deadline;
        // The block owns the drive and lends it to the loop: an `async fn` taking it by `mut`
        // value would hold a second copy of it, all run long. The run's waits on its token and
        // its deadline are made here, once, pinned in the run's own future (no allocation).
        let run = async move {
            let cancelled = pin!(cancel.map(CancellationToken::cancelled_owned));
            let deadline = pin!(deadline.map(tokio::time::sleep_until));
            drive.steps(&mut Stop::new(cancelled, deadline)).await;
            // Boxed where it is made (the box first, then the future written into it), not made
            // beside the box and copied in whole, as `Box::pin` would.
            Box::into_pin(Box::write(Box::new_uninit(), drive.finish())).await
        };
        crate::telemetry::in_span(run, span.clone()).map(move |outcome| {
            crate::telemetry::run_finished(&span, &outcome);
            outcome
        })
    }
}

/// One run being driven: the machine, and what its steps share.
struct Drive<'a> {
    agent: &'a Agent,
    machine: Machine,
    /// The run's tools (with tool sources, they can change between rounds).
    toolbox: Arc<Toolbox>,
    /// Cancelled, with the tools' work, when the run is interrupted; the caller's token is left
    /// alone.
    tool_cancel: CancellationToken,
    deadline: Option<Instant>,
    sink: Option<EventHandler>,
    log: Option<RunLog>,
    /// The run log's failure that stopped the run, if one did.
    store_error: Option<JournalError>,
    /// The model settings of the run's requests, when they are not the agent's (a resumed run
    /// keeps its output schema): the agent's are borrowed, not counted in the `Arc` every run
    /// of the agent shares (see [`settings_of`]).
    own_settings: Option<Box<ModelSettings>>,
    /// The model's session for this run.
    model: Box<dyn Model + 'a>,
    /// What the run's tools learn of where they are (sub-agents).
    scope: Arc<Scope>,
    started: Instant,
}

impl<'a> Drive<'a> {
    fn new(
        agent: &'a Agent,
        mut machine: Machine,
        toolbox: Arc<Toolbox>,
        cancel: Option<&CancellationToken>,
        sink: Option<EventHandler>,
        log: Option<RunLog>,
    ) -> Self {
        let started = Instant::now();
        // A timeout too large to add to the clock (`Duration::MAX`, say) is no deadline at all.
        let deadline = agent
            .parts
            .config
            .timeout
            .and_then(|t| tokio::time::Instant::now().checked_add(t));
        machine.set_events(sink.is_some());
        // A resumed run keeps the output schema it started with, whatever the agent's now.
        let own_settings = if machine.output_schema() == agent.parts.settings.output.as_ref() {
            None
        } else {
            let mut s = (*agent.parts.settings).clone();
            s.output = machine.output_schema().cloned();
            Some(Box::new(s))
        };
        // The transcript only grows during a run, so adapters may reuse their encoding of it.
        let model = agent.parts.model.session();
        let tool_cancel =
            cancel.map_or_else(CancellationToken::new, CancellationToken::child_token);
        let scope = agent.scope_for(&sink);
        Drive {
            agent,
            machine,
            toolbox,
            tool_cancel,
            deadline,
            sink,
            log,
            store_error: None,
            own_settings,
            model,
            scope,
            started,
        }
    }

    /// The loop: each step the machine asks for, done, until it is finished (then
    /// [`Drive::finish`]).
    async fn steps(&mut self, stop: &mut Stop<'_>) {
        loop {
            self.emit();
            match self.machine.next_step() {
                Step::Finished => {
                    // What the last step settled (a round's end, when a limit stops the run).
                    self.emit();
                    break;
                }
                Step::GetReminders => self.give_reminders(),
                Step::CheckStop => self.check_stop(),
                Step::CallModel { round, reminders } => {
                    // Listing the sources' tools is boxed, and only with sources: the loop's
                    // own future holds only what every round needs.
                    if !self.agent.has_tool_sources()
                        || Box::pin(self.refresh_tools(round, stop)).await
                    {
                        self.call_model(round, reminders, stop).await;
                    }
                }
                // The rare steps are boxed (and the run's end, in `drive`): every in-flight
                // run holds its largest step's state, most of the time waiting on the model.
                Step::Approve(requests) => Box::pin(self.approve(requests, stop)).await,
                step @ Step::EditContext { .. } => self.edit_context(step),
                Step::Compact(request) => Box::pin(self.compact(request, stop)).await,
                Step::DecideRoundLimit => Box::pin(self.decide_round_limit(stop)).await,
                Step::RunTools(batches) => self.run_tools(batches, stop).await,
            }
        }
    }

    /// Hands the machine's events to the sink (drops them without one).
    fn emit(&mut self) {
        if let Some(sink) = &self.sink {
            for e in self.machine.take_events() {
                sink(&e);
            }
        } else {
            self.machine.take_events().for_each(drop);
        }
    }

    /// Logs an input and hands it to the machine.
    fn take(&mut self, input: Input) {
        take(&mut self.machine, &self.log, input);
    }

    /// Stops the run on a run-log failure.
    fn store_failed(&mut self, e: JournalError) {
        self.store_error = Some(e);
        interrupt(&mut self.machine, Interrupt::StoreFailed);
    }

    /// [`Step::GetReminders`]: the `reminders` hook's answer.
    fn give_reminders(&mut self) {
        // Durable with the round's response: asked again on resume if lost.
        let input = Input::RemindersGiven {
            round: self.machine.round() + 1,
            reminders: self.agent.reminders_for(&self.machine),
        };
        self.take(input);
    }

    /// [`Step::CheckStop`]: the `stop_when` hook's answer.
    fn check_stop(&mut self) {
        // Durable with the next step's records: asked again on resume if lost.
        let input = Input::StopChecked {
            round: self.machine.round(),
            signal: self.agent.stop_signal_for(&self.machine),
        };
        self.take(input);
    }

    /// Before a model call: the tool sources' tools now, the machine told when they changed.
    /// `false` when the run was interrupted while they were listed.
    async fn refresh_tools(&mut self, round: u32, stop: &mut Stop<'_>) -> bool {
        if !self.agent.has_tool_sources() {
            return true;
        }
        let now = match guard(pin!(self.agent.tools_now()), stop).await {
            Ok(now) => now,
            Err(why) => {
                self.take(Input::Interrupted { why });
                return false;
            }
        };
        if !Arc::ptr_eq(&now, &self.toolbox) {
            // Durable with the round's response: listed again on resume if
            // lost. The machine knows the same catalog already.
            if !now.same_catalog(&self.toolbox) {
                let tools = Input::ToolsChanged {
                    round,
                    tools: now.catalog().clone(),
                };
                self.take(tools);
            }
            self.toolbox = now;
        }
        true
    }

    /// [`Step::CallModel`]: the model call, its response (or failure) handed to the machine.
    async fn call_model(&mut self, round: u32, reminders: Vec<String>, stop: &mut Stop<'_>) {
        let agent = self.agent;
        self.emit();
        // Not waited for: a call lost to a crash is made again on resume.
        self.take(Input::ModelRequested { round });
        // The request, and what it borrows, are scoped to this block: what it holds is not
        // kept beside what the next await (the run log's settling) holds.
        let called = {
            let machine = &self.machine;
            let tools = crate::context::driver::request_tools(machine, self.toolbox.specs());
            // With what the machine asks of the provider itself this round (a function
            // of its view: a resumed run asks the same).
            // Settings of the agent's own are borrowed; others are boxed, so that the call's
            // future, which every run waiting on its model holds, does not hold them inline.
            let owned: Box<ModelSettings>;
            let settings = match crate::context::driver::request_settings(
                machine,
                settings_of(agent, &self.own_settings),
            ) {
                Cow::Borrowed(settings) => settings,
                Cow::Owned(settings) => {
                    owned = Box::new(settings);
                    &*owned
                }
            };
            let request = ModelRequest {
                messages: machine.sent_messages(),
                reminders: &reminders,
                tools: &tools,
                settings,
            };
            let span = crate::telemetry::chat_span(agent.parts.model.name(), round);
            let call = crate::telemetry::in_span(
                agent.call_model(&*self.model, request, round, self.sink.as_ref()),
                span.clone(),
            );
            let called = {
                let call = pin!(call);
                match &tools {
                    // The run's own catalog: its fingerprint, made once for every run of the
                    // agent, is known to the adapter instead of made again for each request.
                    Cow::Borrowed(specs) => {
                        let fingerprint = self.toolbox.catalog().fingerprint();
                        let call = crate::model::with_known_catalog(call, specs, fingerprint);
                        guard(pin!(call), stop).await
                    }
                    Cow::Owned(_) => guard(call, stop).await,
                }
            };
            if let Ok(r) = &called {
                crate::telemetry::chat_finished(&span, r);
                trace_response(round, r);
            }
            called
        };
        // The previous round's results were written during the call: a response is taken only
        // on a log that holds them. Waiting for the log is boxed, and holds the response: a run
        // without a log holds it across no await, so it stays on the stack, not in the run's
        // future, where it would be written to lines that went cold while the run waited.
        let input = if matches!(called, Ok(Ok(_))) && self.log.is_some() {
            match Box::pin(self.settled_input(round, called)).await {
                Some(input) => input,
                None => return,
            }
        } else {
            self.input_of(round, called)
        };
        self.take(input);
    }

    /// The input a model call's end gives, once the run log holds what was written during the
    /// call; `None` when the log failed (the run stops).
    async fn settled_input(&mut self, round: u32, called: Called) -> Option<Input> {
        if let Some(log) = &self.log
            && let Err(e) = log.settle().await
        {
            self.store_failed(e);
            return None;
        }
        Some(self.input_of(round, called))
    }

    /// The input a model call's end gives the machine.
    fn input_of(&self, round: u32, called: Called) -> Input {
        match called {
            // Durable with the intents of the calls it asks for (or with the run's end).
            Ok(Ok(response)) => self.agent.response_input(&self.toolbox, round, response),
            // The failure ends the run (a refusal for size starts a compaction); it is durable
            // with the run's end (or the compaction's summary).
            Ok(Err(e)) => crate::context::driver::failed_call_input(&self.machine, round, e),
            Err(why) => Input::Interrupted { why },
        }
    }

    /// [`Step::Approve`]: each call's decision, by rule or by a person (the `on_approval`
    /// handler); without a handler, the calls that ask wait and the run stops for them.
    async fn approve(&mut self, requests: Vec<ApprovalRequest>, stop: &mut Stop<'_>) {
        // Before a person is asked, what the round holds is durable: a crash while
        // asking asks again on resume, about the same calls.
        if requests.iter().any(|r| r.verdict == Verdict::Ask)
            && self.agent.parts.on_approval.is_some()
            && let Some(log) = &self.log
            && let Err(e) = log.flush().await
        {
            self.store_failed(e);
            return;
        }
        let mut deferred = Vec::new();
        let mut interrupted = None;
        for r in requests {
            let call = &r.pending.call;
            let decision = match Decision::by_rule(call, &r.verdict) {
                Some(decision) => decision,
                None => {
                    if let Some(sink) = &self.sink {
                        sink(&r.pending.requested());
                    }
                    let Some(ask) = &self.agent.parts.on_approval else {
                        deferred.push(r.pending);
                        continue;
                    };
                    match guard(ask(&r.pending).as_mut(), stop).await {
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
            self.take(input);
        }
        if let Some(why) = interrupted {
            self.take(Input::Interrupted { why });
        } else if !deferred.is_empty() {
            fed(self.machine.await_approval());
        }
    }

    /// [`Step::EditContext`]: the context policy's edits of the conversation.
    fn edit_context(&mut self, step: Step) {
        // Durable with the round's response: made again on resume if lost.
        if let Some(input) = crate::context::driver::edits_input(step) {
            self.take(input);
        }
    }

    /// [`Step::Compact`]: the conversation summarised, the summary durable before the run goes
    /// on.
    async fn compact(&mut self, request: Box<CompactRequest>, stop: &mut Stop<'_>) {
        let summarised = self
            .agent
            .summarise(settings_of(self.agent, &self.own_settings), &request);
        let input = match guard(pin!(summarised), stop).await {
            Ok(input) => input,
            Err(why) => Input::Interrupted { why },
        };
        self.take(input);
        // The summary is durable before the run goes on: a resumed run does not
        // ask for it again.
        if let Some(log) = &self.log
            && let Err(e) = log.flush().await
        {
            self.store_failed(e);
        }
    }

    /// [`Step::DecideRoundLimit`]: the `on_round_limit` hook's answer.
    async fn decide_round_limit(&mut self, stop: &mut Stop<'_>) {
        let decision = self.agent.round_limit_for(&self.machine);
        // Asked again on resume if lost to a crash.
        let input = match guard(pin!(decision), stop).await {
            Ok(decision) => Input::RoundLimitDecided { decision },
            Err(why) => Input::Interrupted { why },
        };
        self.take(input);
    }

    /// [`Step::RunTools`]: the round's batches in order, each call's result handed to the
    /// machine as it finishes; then the round's results written behind the next model call.
    async fn run_tools(&mut self, batches: Vec<Batch>, stop: &mut Stop<'_>) {
        let mut stopped = false;
        for batch in batches {
            let run = self.agent.run_batch(
                &mut self.machine,
                &self.toolbox,
                batch,
                &self.tool_cancel,
                self.deadline,
                &self.sink,
                &self.log,
                &self.scope,
            );
            let ran = {
                let run = pin!(run);
                guard(run, stop).await
            };
            let interrupted = match ran {
                Ok(Ok(())) => None,
                Ok(Err(e)) => {
                    self.store_error = Some(e);
                    Some((Interrupt::StoreFailed, false))
                }
                Err(why) => Some((why, true)),
            };
            if let Some((why, logged)) = interrupted {
                self.tool_cancel.cancel();
                let input = Input::Interrupted { why };
                if logged {
                    self.take(input);
                } else {
                    fed(self.machine.handle(input));
                }
                stopped = true;
                break;
            }
            self.emit();
            if self.scope.has_awaiting() {
                // A child waits for approvals: the round's later calls wait too.
                break;
            }
        }
        let waiting = self.scope.take_awaiting();
        // The round's results are written while the next model call goes on (the
        // call needs nothing durable: one lost to a crash is made again); the next
        // flush, before any tool runs, waits for them. A crash before they are
        // written leaves the calls in flight, as a crash just before would.
        if !stopped
            && let Some(log) = &self.log
            && let Err(e) = log.flush_behind().await
        {
            self.store_failed(e);
            stopped = true;
        }
        if !stopped && !waiting.is_empty() {
            // Not logged: the children's calls stay in flight, and run again (each
            // child resuming from its log) when the run is resumed.
            fed(self.machine.await_child_approvals(waiting));
        }
    }

    /// The run's end: logged (unless it waits for approvals), the lease given back, the
    /// outcome made and sent to the sink.
    async fn finish(self) -> Outcome {
        let Drive {
            machine,
            sink,
            log,
            store_error,
            started,
            ..
        } = self;
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
}

/// How a model call ended: its response or failure, or the run's interruption first.
type Called = Result<Result<crate::model::ModelResponse, crate::model::ModelError>, Interrupt>;

/// The model settings of a run's requests: its own (`own`), or else its agent's.
fn settings_of<'a>(agent: &'a Agent, own: &'a Option<Box<ModelSettings>>) -> &'a ModelSettings {
    own.as_deref().unwrap_or(&agent.parts.settings)
}

/// Traces what a model call came to.
fn trace_response(round: u32, r: &Result<crate::model::ModelResponse, crate::model::ModelError>) {
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

/// Logs an input (durable with the run's next write, when the run is logged) and hands it to
/// the machine.
pub(super) fn take(machine: &mut Machine, log: &Option<RunLog>, input: Input) {
    if let Some(log) = log {
        log.soon(input.clone());
    }
    fed(machine.handle(input));
}

/// Stops the run without logging why (the run log is what failed, or there is none).
pub(super) fn interrupt(machine: &mut Machine, why: Interrupt) {
    fed(machine.handle(Input::Interrupted { why }));
}

/// Checks an input the driver fed the machine. The driver only feeds what the machine asked
/// for, so a refusal is a bug in the driver: it fails tests (debug builds) and is logged.
pub(super) fn fed(result: Result<(), PhaseError>) {
    if let Err(e) = result {
        debug_assert!(
            false,
            "the driver fed the loop an input it did not ask for: {e}"
        );
        tracing::error!(error = %e, "the driver fed the loop an input it did not ask for");
    }
}

/// What stops a run's steps: its caller's token cancelled, or its deadline passed. Made once per
/// run (pinned in the run's future), so that the run's waits on each (a waiter on the token, an
/// entry in the runtime's timer wheel, shared by every run) are registered once, not again for
/// every model call and every batch of tools. Between two steps the waits stay registered: a
/// cancellation or a deadline that comes then only wakes the run, and the next step's [`guard`]
/// reports it before the step starts.
pub(super) struct Stop<'s> {
    /// `None` without a caller's token: nothing to wait on, nor to check at each wake-up.
    cancelled: Option<Pin<&'s mut WaitForCancellationFutureOwned>>,
    /// `None` without a deadline.
    deadline: Option<Pin<&'s mut Sleep>>,
}

impl<'s> Stop<'s> {
    pub(super) fn new(
        cancelled: Pin<&'s mut Option<WaitForCancellationFutureOwned>>,
        deadline: Pin<&'s mut Option<Sleep>>,
    ) -> Self {
        Stop {
            cancelled: cancelled.as_pin_mut(),
            deadline: deadline.as_pin_mut(),
        }
    }

    /// Why the run stops, if it does: cancellation first (as it always was), then the
    /// deadline.
    fn poll_stop(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Interrupt> {
        use std::task::Poll;
        if let Some(cancelled) = &mut self.cancelled
            && cancelled.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Interrupt::Cancelled);
        }
        match &mut self.deadline {
            Some(sleep) => sleep.as_mut().poll(cx).map(|()| Interrupt::Timeout),
            None => Poll::Pending,
        }
    }
}

/// `fut`, unless the run is cancelled or its deadline passes first (checked first at every
/// wake-up, so a step never starts or ends after either). `fut` is pinned by the caller, so
/// that a step's future holds it once (a future moved into an `async fn` is held twice: as its
/// argument and as what it awaits). Not an `async fn`: the future is the poll function itself,
/// with no layer around it.
pub(super) fn guard<'g, F: Future + ?Sized>(
    mut fut: Pin<&'g mut F>,
    stop: &'g mut Stop<'_>,
) -> impl Future<Output = Result<F::Output, Interrupt>> + 'g {
    std::future::poll_fn(move |cx| {
        if let std::task::Poll::Ready(why) = stop.poll_stop(cx) {
            return std::task::Poll::Ready(Err(why));
        }
        fut.as_mut().poll(cx).map(Ok)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A step that is done at once.
    fn ready() -> Pin<Box<std::future::Ready<u32>>> {
        Box::pin(std::future::ready(7))
    }

    #[tokio::test]
    async fn a_stop_made_once_is_seen_by_every_later_step() {
        let cancel = CancellationToken::new();
        let cancelled = pin!(Some(cancel.clone().cancelled_owned()));
        let no_deadline = pin!(None);
        let mut stop = Stop::new(cancelled, no_deadline);
        assert_eq!(guard(ready().as_mut(), &mut stop).await, Ok(7));
        // Cancelled between two steps: the next one does not run, however ready it is.
        cancel.cancel();
        assert_eq!(
            guard(ready().as_mut(), &mut stop).await,
            Err(Interrupt::Cancelled)
        );
        assert_eq!(
            guard(ready().as_mut(), &mut stop).await,
            Err(Interrupt::Cancelled)
        );
    }

    #[tokio::test]
    async fn a_deadline_stops_a_step_in_flight_and_every_later_one() {
        let cancel = CancellationToken::new();
        let deadline = Instant::now() + Duration::from_millis(50);
        let cancelled = pin!(Some(cancel.clone().cancelled_owned()));
        let sleep = pin!(Some(tokio::time::sleep_until(deadline)));
        let mut stop = Stop::new(cancelled, sleep);
        assert_eq!(guard(ready().as_mut(), &mut stop).await, Ok(7));
        let never = pin!(std::future::pending::<u32>());
        assert_eq!(guard(never, &mut stop).await, Err(Interrupt::Timeout));
        assert!(Instant::now() >= deadline);
        assert_eq!(
            guard(ready().as_mut(), &mut stop).await,
            Err(Interrupt::Timeout)
        );
        // Cancellation is checked first, as it always was.
        cancel.cancel();
        assert_eq!(
            guard(ready().as_mut(), &mut stop).await,
            Err(Interrupt::Cancelled)
        );
    }

    /// Answers after one round of calls of `t`, noting the catalog fingerprint each request
    /// was sent with a known one.
    struct NotesFingerprints(Arc<std::sync::Mutex<Vec<Option<u64>>>>);

    #[async_trait::async_trait]
    impl Model for NotesFingerprints {
        fn name(&self) -> &str {
            "notes"
        }
        async fn complete(
            &self,
            request: &ModelRequest<'_>,
        ) -> Result<crate::model::ModelResponse, crate::model::ModelError> {
            let mut seen = self.0.lock().unwrap();
            seen.push(crate::model::known_fingerprint(request.tools));
            let calls = if seen.len() == 1 {
                vec![crate::message::ToolCall::new("t", serde_json::json!({}))]
            } else {
                Vec::new()
            };
            Ok(crate::model::ModelResponse {
                text: Some("done".into()),
                finish_reason: if calls.is_empty() {
                    crate::model::FinishReason::Stop
                } else {
                    crate::model::FinishReason::ToolCalls
                },
                tool_calls: calls,
                ..Default::default()
            })
        }
    }

    #[tokio::test]
    async fn each_model_call_knows_its_catalogs_fingerprint() {
        let tool = crate::tool::tool_fn("t", "T.", |_: serde_json::Value, _| async {
            Ok::<_, crate::tool::ToolError>(crate::tool::ToolOutput::text("t"))
        });
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let agent = Agent::builder(NotesFingerprints(seen.clone()))
            .tool(tool)
            .build()
            .unwrap();
        let out = agent.prompt("go").await;
        assert_eq!(out.rounds, 2, "{out:?}");
        let expected = crate::model::catalog_fingerprint(agent.parts.toolbox.specs());
        assert_eq!(*seen.lock().unwrap(), vec![Some(expected); 2]);
    }

    #[tokio::test]
    async fn a_cancellation_stops_a_step_in_flight() {
        let cancel = CancellationToken::new();
        let cancelled = pin!(Some(cancel.clone().cancelled_owned()));
        let no_deadline = pin!(None);
        let mut stop = Stop::new(cancelled, no_deadline);
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c2.cancel();
        });
        let never = pin!(std::future::pending::<u32>());
        assert_eq!(guard(never, &mut stop).await, Err(Interrupt::Cancelled));
    }
}
