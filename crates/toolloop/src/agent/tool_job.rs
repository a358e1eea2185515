//! The tool calls of a round: a batch run in the machine's schedule, each call's intent logged
//! before it runs where it must be, then the call with its timeout, retries and panic catching.

use super::{
    Agent, EventHandler, RunLog,
    drive::{fed, take},
};
use crate::approval::Subject;
use crate::config::LoopConfig;
use crate::engine::{Batch, Input, Machine};
use crate::event::Event;
use crate::journal::JournalError;
use crate::message::ToolCall;
use crate::subagent::Scope;
use crate::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use crate::toolbox::Toolbox;
use futures::{FutureExt, StreamExt};
use std::borrow::Cow;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

impl Agent {
    /// Runs one batch, reporting each call to the machine (and the run log) as it finishes.
    /// Returns when all are done, or at the first run-log failure; the caller races it against
    /// cancellation.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_batch(
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
            self.parts.config.max_parallel.max(1)
        } else {
            1
        };
        // When every call starts at once, their intents are durable together before any runs;
        // otherwise each call makes its own durable before it starts. Calls of read-only and
        // idempotent tools run again on resume whether or not their intent was written, so
        // theirs need not be durable first: they are written with the round's results, in the
        // round's one commit (the response, the intents and the results together).
        let intents_first = batch.calls.len() <= limit;
        // Whether the intents can wait for the round's commit: asked only of a logged batch
        // that makes them durable together (each job looks its tool up again).
        let mut rerun_safe = true;
        let weigh_rerun = intents_first && log.is_some();
        for &index in &batch.calls {
            let Some(call) = machine.round_call(index) else {
                continue;
            };
            rerun_safe &= !weigh_rerun || toolbox.get(&call.name).is_none_or(|t| !intent_first(t));
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
        let jobs = batch
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
                    config: &self.parts.config,
                    sink,
                    log,
                    scope,
                };
                let span = crate::telemetry::tool_span(&job.call);
                let on_end = span.clone();
                let call = job.call.clone();
                crate::telemetry::in_span(job.run(), span).map(move |r| {
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
            });
        // Each finished job goes to the machine as it finishes. Results are durable with the
        // next batch's intents, or together when the round's calls are over (a result lost to a
        // crash makes the call "in flight" on resume, never run twice when it has side effects).
        let settle = |machine: &mut Machine, (index, done): (usize, JobResult)| {
            let (result, duration_ms, attempts) = done?;
            if machine
                .round_call(index)
                .is_some_and(|c| scope.is_awaiting(&c.id))
            {
                // Its child waits for approvals: the call has no result yet.
                return Ok(());
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
            Ok::<_, JournalError>(())
        };
        // One or two calls (most rounds) need no set of running jobs, which allocates its
        // queue and a task for every job: they are boxed together instead. Two run at once
        // unless the batch runs one at a time; the one that finishes first is settled first
        // (both at once: the first call first). Decided in a block before anything is awaited,
        // so that the run's future keeps no room for the jobs themselves (a job's future is
        // large).
        let settle = &settle;
        let few: Result<Few<'_>, _> = {
            let mut jobs = jobs.fuse();
            match (jobs.next(), jobs.next(), jobs.next()) {
                (None, ..) => return Ok(()),
                (Some(only), None, _) => {
                    let machine = &mut *machine;
                    Ok(Box::pin(async move { settle(machine, only.await) }))
                }
                (Some(first), Some(second), None) => {
                    let machine = &mut *machine;
                    Ok(Box::pin(async move {
                        if limit == 1 {
                            settle(machine, first.await)?;
                            return settle(machine, second.await);
                        }
                        let (first, second) = (std::pin::pin!(first), std::pin::pin!(second));
                        let rest = match futures::future::select(first, second).await {
                            futures::future::Either::Left((done, rest)) => {
                                settle(machine, done)?;
                                rest.await
                            }
                            futures::future::Either::Right((done, rest)) => {
                                settle(machine, done)?;
                                rest.await
                            }
                        };
                        settle(machine, rest)
                    }))
                }
                // The first `limit` jobs run at once, the others (kept in call order, allocated
                // only when there are any) each start as one finishes: what `buffer_unordered`
                // does, without a vector of every job besides its set of running ones.
                (Some(first), Some(second), Some(third)) => {
                    let running = futures::stream::FuturesUnordered::new();
                    let mut queued = std::collections::VecDeque::new();
                    for job in [first, second, third].into_iter().chain(jobs) {
                        if running.len() < limit {
                            running.push(job);
                        } else {
                            queued.push_back(job);
                        }
                    }
                    Err((running, queued))
                }
            }
        };
        // (Moved out whole, so that nothing of it, which may hold the machine, is left to drop
        // while the set runs.)
        let (mut running, mut queued) = match std::convert::identity(few) {
            Ok(few) => return few.await,
            Err(set) => set,
        };
        while let Some(finished) = running.next().await {
            if let Some(next) = queued.pop_front() {
                running.push(next);
            }
            settle(machine, finished)?;
        }
        Ok(())
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

/// A batch of one or two calls, run and settled (see [`Agent::run_batch`]).
type Few<'a> = Pin<Box<dyn Future<Output = Result<(), JournalError>> + Send + 'a>>;

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
        // Without a run log the key is the call's id, borrowed: each attempt makes its own copy.
        let idempotency_key = match self.log {
            Some(log) => Cow::Owned(format!("{}/{}", log.run_id, self.call.id)),
            None => Cow::Borrowed(self.call.id.as_str()),
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
pub(super) fn subject_changed(
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
pub(super) async fn call_tool_with(
    tool: &Arc<dyn Tool>,
    config: &LoopConfig,
    round: u32,
    call: &ToolCall,
    mut idempotency_key: Cow<'_, str>,
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
            // The last attempt the retries allow takes the key; an earlier one copies it.
            idempotency_key: if attempt > config.tool_retries {
                std::mem::take(&mut idempotency_key).into_owned()
            } else {
                idempotency_key.to_string()
            },
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

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use serde_json::Value;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// Fails with a retryable error `fails` times, then answers; panics when told to.
    struct Flaky {
        fails: u32,
        calls: AtomicU32,
        /// When each attempt started.
        started: std::sync::Mutex<Vec<Instant>>,
        /// The idempotency key each attempt was given.
        keys: std::sync::Mutex<Vec<String>>,
        panics: bool,
        params: Value,
    }

    #[async_trait]
    impl Tool for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn description(&self) -> &str {
            "fails, then answers"
        }
        fn parameters(&self) -> &Value {
            &self.params
        }
        fn approval_subject(&self, args: &Value) -> Subject {
            args["path"].as_str().unwrap_or_default().into()
        }
        async fn call(&self, _: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
            self.started.lock().unwrap().push(Instant::now());
            self.keys.lock().unwrap().push(ctx.idempotency_key.clone());
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            assert_eq!(ctx.attempt, n, "the attempt number");
            if self.panics {
                panic!("boom");
            }
            if n <= self.fails {
                return Err(ToolError::retryable(format!("try {n} failed")));
            }
            Ok(ToolOutput::text(format!("ok after {n}")))
        }
    }

    fn flaky(fails: u32, panics: bool) -> Arc<Flaky> {
        Arc::new(Flaky {
            fails,
            calls: AtomicU32::new(0),
            started: std::sync::Mutex::default(),
            keys: std::sync::Mutex::default(),
            panics,
            params: serde_json::json!({"type": "object"}),
        })
    }

    fn call() -> ToolCall {
        ToolCall::new("flaky", serde_json::json!({"path": "/a"}))
    }

    async fn run(tool: &Arc<Flaky>, config: &LoopConfig) -> ToolCallResult {
        let cancel = CancellationToken::new();
        let tool: Arc<dyn Tool> = tool.clone();
        call_tool_with(
            &tool,
            config,
            1,
            &call(),
            "key".into(),
            &cancel,
            None,
            None,
            None,
            None,
        )
        .await
    }

    #[tokio::test]
    async fn retryable_errors_are_retried_up_to_the_limit_with_backoff() {
        // Real time, short: 20 ms, then 40 ms.
        let backoff = Duration::from_millis(20);
        let config = LoopConfig {
            tool_retries: 2,
            tool_retry_backoff: backoff,
            ..LoopConfig::default()
        };
        let tool = flaky(2, false);
        let done = run(&tool, &config).await;
        assert_eq!(done.result.unwrap().message, "ok after 3");
        assert_eq!(done.attempts, 3);
        // Each wait at least the backoff, doubled each time; and the backoff set, not the
        // default's (200 ms, then 400 ms): together well under those 600 ms, with room for a
        // loaded machine's pauses.
        let started = tool.started.lock().unwrap().clone();
        let waits: Vec<Duration> = started.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(waits.len(), 2);
        assert!(waits[0] >= backoff && waits[1] >= 2 * backoff, "{waits:?}");
        let default = LoopConfig::default().tool_retry_backoff;
        assert!(waits[0] + waits[1] < 3 * default, "{waits:?}");

        let done = run(&flaky(5, false), &config).await;
        assert_eq!(done.result.unwrap_err().message, "try 3 failed");
        assert_eq!(done.attempts, 3);
    }

    #[tokio::test]
    async fn every_attempt_gets_the_same_idempotency_key() {
        let config = LoopConfig {
            tool_retries: 2,
            tool_retry_backoff: Duration::from_millis(1),
            ..LoopConfig::default()
        };
        // Borrowed (the call's id, without a run log) and owned (with one), through the last
        // attempt the retries allow, which takes the key instead of copying it.
        let id = call().id;
        for key in [Cow::Borrowed(id.as_str()), Cow::Owned(format!("run/{id}"))] {
            let tool = flaky(2, false);
            let dyn_tool: Arc<dyn Tool> = tool.clone();
            let done = call_tool_with(
                &dyn_tool,
                &config,
                1,
                &call(),
                key.clone(),
                &CancellationToken::new(),
                None,
                None,
                None,
                None,
            )
            .await;
            assert_eq!(done.attempts, 3);
            assert_eq!(*tool.keys.lock().unwrap(), vec![key.to_string(); 3]);
        }
    }

    #[tokio::test]
    async fn a_panic_is_the_tools_error() {
        let done = run(&flaky(0, true), &LoopConfig::default()).await;
        let e = done.result.unwrap_err();
        assert_eq!(e.message, "the tool crashed: boom");
        assert!(!e.retryable);
        assert_eq!(done.attempts, 1);
    }

    #[test]
    fn a_call_whose_subject_changed_since_it_was_weighed_is_not_run() {
        let tool: Arc<dyn Tool> = flaky(0, false);
        let same: Subject = "/a".into();
        assert!(subject_changed(tool.as_ref(), &call(), Some(&same)).is_none());
        assert!(subject_changed(tool.as_ref(), &call(), None).is_none());
        let other: Subject = "/b".into();
        let changed = subject_changed(tool.as_ref(), &call(), Some(&other)).unwrap();
        let e = changed.result.unwrap_err();
        assert!(e.message.contains("`/b` is now `/a`"), "{}", e.message);
        assert_eq!(changed.attempts, 0);
    }
}
