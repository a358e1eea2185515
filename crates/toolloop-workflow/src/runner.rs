//! The runner (the design's Execution Manager): runs a workflow's steps in order or as a graph,
//! each a tool-calling run of its own, logged and resumable.

use crate::WorkflowError;
use crate::check::{self, Plan};
use crate::definition::{Step, Workflow};
use crate::event::WorkflowEvent;
use crate::output;
use crate::record::{WorkflowLog, WorkflowRecord};
use crate::result::{StepResult, StepStatus, WorkflowOutcome, WorkflowStatus};
use crate::template;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolloop::agent::AgentBuilder;
use toolloop::journal::{Journal, JournalError};
use toolloop::message::Message;
use toolloop::model::Model;
use toolloop::outcome::StopReason;
use toolloop::tool::Tool;

/// Builds the model a step names (`provider:model`).
pub type ModelResolver = Arc<dyn Fn(&str) -> Result<Arc<dyn Model>, String> + Send + Sync>;
/// Sets what every step's agent has besides its own settings (approval rules, a temperature,
/// …); the step's model, tools, limits, system prompt, journal and events are set after it.
pub type Configure = Arc<dyn Fn(AgentBuilder) -> AgentBuilder + Send + Sync>;
/// Receives every event of a workflow run.
pub type WorkflowEventHandler = Arc<dyn Fn(&WorkflowEvent) + Send + Sync>;

/// Runs workflows: the models and tools their steps may use, where runs are logged, who hears
/// the events. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::collections::BTreeMap;
/// use std::sync::Arc;
/// use toolloop::providers::test_model::{TestAnswer, TestModel};
/// use toolloop_workflow::{Runner, Workflow};
///
/// let workflow = Workflow::from_toml(r#"
///     name = "demo"
///     [inputs.topic]
///     [[steps]]
///     id = "draft"
///     prompt = "Write about {{ inputs.topic }}."
///     [[steps]]
///     id = "review"
///     prompt = "Review this: {{ steps.draft.output }}"
/// "#, None)?;
/// let runner = Runner::new(Arc::new(TestModel::new().answer(TestAnswer::Summary)));
/// runner.check(&workflow)?;
/// let inputs = BTreeMap::from([("topic".to_string(), "rivers".to_string())]);
/// let outcome = runner.run(&workflow, &inputs, Default::default()).await?;
/// assert!(outcome.success);
/// assert_eq!(outcome.steps.len(), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Runner {
    default_model: Arc<dyn Model>,
    models: Option<ModelResolver>,
    tools: Vec<Arc<dyn Tool>>,
    configure: Option<Configure>,
    journal: Option<Arc<dyn Journal>>,
    log: Option<Arc<dyn WorkflowLog>>,
    on_event: Option<WorkflowEventHandler>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("default_model", &self.default_model.name())
            .field(
                "tools",
                &self.tools.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A fresh workflow run id: `wf_` and a time-ordered UUID (v7) in 32 hex digits.
pub fn new_workflow_id() -> String {
    format!("wf_{}", uuid::Uuid::now_v7().simple())
}

/// The run id of a step of a workflow run: `WORKFLOW_ID.STEP_ID`.
pub fn step_run_id(workflow_id: &str, step_id: &str) -> String {
    format!("{workflow_id}.{step_id}")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Runner {
    /// A runner whose steps use `default_model` unless they name one, with no tools, no log.
    pub fn new(default_model: Arc<dyn Model>) -> Self {
        Runner {
            default_model,
            models: None,
            tools: Vec::new(),
            configure: None,
            journal: None,
            log: None,
            on_event: None,
        }
    }

    /// How the models steps name (`model = "openai:gpt-4.1-mini"`) are built. Without it, a
    /// step that names a model is an error at check time.
    pub fn models(
        mut self,
        f: impl Fn(&str) -> Result<Arc<dyn Model>, String> + Send + Sync + 'static,
    ) -> Self {
        self.models = Some(Arc::new(f));
        self
    }

    /// The tools steps may choose from, by name.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// What every step's agent gets first (see [`Configure`]).
    pub fn configure(
        mut self,
        f: impl Fn(AgentBuilder) -> AgentBuilder + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(f));
        self
    }

    /// Logs each step's run (its id is [`step_run_id`]), so that a step killed in the middle
    /// resumes from its last durable step.
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Keeps a record of each workflow run (see [`crate::record`]), so that it can be resumed.
    pub fn log(mut self, log: Arc<dyn WorkflowLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// Receives every event.
    pub fn on_event(mut self, f: impl Fn(&WorkflowEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(f));
        self
    }

    fn emit(&self, event: WorkflowEvent) {
        if let Some(f) = &self.on_event {
            f(&event);
        }
    }

    /// Checks a workflow before anything runs: ids, `depends_on` (unknown steps, cycles), every
    /// template and `when` against the inputs and the steps it may see, limits, output
    /// schemas, and that the tools and models the steps name exist. Every problem is named.
    pub fn check(&self, workflow: &Workflow) -> Result<(), WorkflowError> {
        self.plan(workflow).map(|_| ())
    }

    fn plan(&self, workflow: &Workflow) -> Result<Plan, WorkflowError> {
        let (plan, mut problems) = match check::check_definition(workflow) {
            Ok(plan) => (Some(plan), Vec::new()),
            Err(problems) => (None, problems),
        };
        let names: BTreeSet<&str> = self.tools.iter().map(|t| t.name()).collect();
        let mut models = BTreeSet::new();
        for step in &workflow.steps {
            for tool in &step.tools {
                if !names.contains(tool.as_str()) {
                    problems.push(format!(
                        "step `{}`: no tool `{tool}` (the tools: {})",
                        step.id,
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.iter().copied().collect::<Vec<_>>().join(", ")
                        }
                    ));
                }
            }
            if let Some(model) = step.model(workflow)
                && models.insert(model)
                && let Err(e) = self.model(Some(model))
            {
                problems.push(format!("step `{}`: model `{model}`: {e}", step.id));
            }
        }
        match plan {
            Some(plan) if problems.is_empty() => Ok(plan),
            _ => Err(WorkflowError::Invalid(problems)),
        }
    }

    fn model(&self, name: Option<&str>) -> Result<Arc<dyn Model>, String> {
        match (name, &self.models) {
            (None, _) => Ok(self.default_model.clone()),
            (Some(name), Some(f)) => f(name),
            (Some(_), None) => Err("this runner builds no named models (Runner::models)".into()),
        }
    }

    /// Runs a workflow with its inputs (given values over the defaults) to its end or
    /// `cancel`. Fails before anything runs when the workflow does not check or an input is
    /// missing; once it runs, the outcome holds every step's result, whatever happened.
    pub async fn run(
        &self,
        workflow: &Workflow,
        inputs: &BTreeMap<String, String>,
        cancel: CancellationToken,
    ) -> Result<WorkflowOutcome, WorkflowError> {
        self.run_tagged(workflow, inputs, Value::Null, cancel).await
    }

    /// Like [`Runner::run`], keeping `meta` in the workflow's record (what the application
    /// needs to rebuild this runner on resume: its settings, say; never a secret).
    pub async fn run_tagged(
        &self,
        workflow: &Workflow,
        inputs: &BTreeMap<String, String>,
        meta: Value,
        cancel: CancellationToken,
    ) -> Result<WorkflowOutcome, WorkflowError> {
        let inputs = workflow.resolve_inputs(inputs)?;
        let plan = self.plan(workflow)?;
        let record = WorkflowRecord {
            workflow_id: new_workflow_id(),
            workflow: workflow.clone(),
            inputs,
            meta,
            status: WorkflowStatus::Running,
            results: BTreeMap::new(),
            created_ms: now_ms(),
        };
        self.save(&record).await?;
        Ok(self.execute(record, plan, false, cancel).await)
    }

    /// The record of a workflow run in the log (to read its `meta` before resuming it).
    pub async fn record(&self, workflow_id: &str) -> Result<WorkflowRecord, WorkflowError> {
        let log = self
            .log
            .as_ref()
            .ok_or_else(|| WorkflowError::Log("no workflow log is configured".into()))?;
        log.load(workflow_id)
            .await?
            .ok_or_else(|| WorkflowError::NotFound(workflow_id.to_string()))
    }

    /// Continues a workflow run from its record: finished steps are not run again, a step that
    /// was running continues its run from its log (no model call or tool call that finished is
    /// made again), and the rest run as usual. A run that had ended gives its outcome again.
    pub async fn resume(
        &self,
        workflow_id: &str,
        cancel: CancellationToken,
    ) -> Result<WorkflowOutcome, WorkflowError> {
        let record = self.record(workflow_id).await?;
        let plan = self.plan(&record.workflow)?;
        Ok(self.execute(record, plan, true, cancel).await)
    }

    async fn save(&self, record: &WorkflowRecord) -> Result<(), WorkflowError> {
        match &self.log {
            Some(log) => log.save(record).await,
            None => Ok(()),
        }
    }

    /// Runs the steps that have no result yet.
    async fn execute(
        &self,
        mut record: WorkflowRecord,
        plan: Plan,
        resumed: bool,
        cancel: CancellationToken,
    ) -> WorkflowOutcome {
        let started = Instant::now();
        let workflow = Arc::new(record.workflow.clone());
        let steps = &workflow.steps;
        self.emit(WorkflowEvent::WorkflowStarted {
            workflow_id: record.workflow_id.clone(),
            name: workflow.name.clone(),
            resumed,
        });
        let mut results: Vec<Option<StepResult>> = steps
            .iter()
            .map(|s| record.results.get(&s.id).cloned())
            .collect();
        let stops =
            |step: &Step, r: &StepResult| r.status == StepStatus::Failed && !step.continue_on_error;
        let mut failed_step = steps
            .iter()
            .zip(&results)
            .find(|(s, r)| r.as_ref().is_some_and(|r| stops(s, r)))
            .map(|(s, _)| s.id.clone());
        let mut begun: Vec<bool> = results.iter().map(Option::is_some).collect();
        let mut log_error: Option<String> = None;
        let mut running: FuturesUnordered<BoxFuture<'_, (usize, StepResult)>> =
            FuturesUnordered::new();
        let limit = workflow.max_parallel();
        loop {
            if failed_step.is_none() && log_error.is_none() && !cancel.is_cancelled() {
                for (i, started) in begun.iter_mut().enumerate() {
                    if running.len() >= limit {
                        break;
                    }
                    if *started || !plan.deps[i].iter().all(|&d| results[d].is_some()) {
                        continue;
                    }
                    *started = true;
                    let context = context(&record.inputs, &plan.visible[i], steps, &results);
                    let workflow = workflow.clone();
                    let id = record.workflow_id.clone();
                    let cancel = cancel.clone();
                    running.push(Box::pin(async move {
                        let r = self.run_step(&workflow, i, context, &id, cancel).await;
                        (i, r)
                    }));
                }
            }
            let Some((i, result)) = running.next().await else {
                break;
            };
            let step = &steps[i];
            // A step stopped by cancellation is not finished: resuming continues it.
            let interrupted =
                result.stop_reason == Some(StopReason::Cancelled) && cancel.is_cancelled();
            if !interrupted {
                if stops(step, &result) && failed_step.is_none() {
                    failed_step = Some(step.id.clone());
                }
                record.results.insert(step.id.clone(), result.clone());
                if let Err(e) = self.save(&record).await {
                    // Without its record the run could not be resumed: start nothing more.
                    tracing::warn!("workflow {}: {e}", record.workflow_id);
                    log_error.get_or_insert(e.to_string());
                }
                results[i] = Some(result.clone());
            }
            self.emit(WorkflowEvent::StepFinished {
                result: Box::new(result),
            });
        }
        let cancelled = cancel.is_cancelled() && results.iter().any(Option::is_none);
        let status = if failed_step.is_some() || log_error.is_some() {
            WorkflowStatus::Failed
        } else if cancelled {
            WorkflowStatus::Cancelled
        } else {
            WorkflowStatus::Succeeded
        };
        record.status = status;
        if let Err(e) = self.save(&record).await {
            tracing::warn!("workflow {}: {e}", record.workflow_id);
        }
        let all: Vec<StepResult> = steps
            .iter()
            .zip(results)
            .map(|(s, r)| {
                r.unwrap_or_else(|| {
                    let why = if cancelled {
                        "the workflow run was cancelled before this step ended".to_string()
                    } else if let Some(e) = &log_error {
                        format!("the workflow's record could not be saved: {e}")
                    } else {
                        format!(
                            "step `{}` failed and stopped the workflow",
                            failed_step.as_deref().unwrap_or("?")
                        )
                    };
                    StepResult::without_run(&s.id, StepStatus::NotRun, Some(why))
                })
            })
            .collect();
        let ran: Vec<&StepResult> = all.iter().filter(|r| r.stop_reason.is_some()).collect();
        let total_tokens = ran
            .iter()
            .filter_map(|r| r.metadata.total_tokens)
            .reduce(|a, b| a + b);
        let cost = if ran.iter().all(|r| r.metadata.cost.is_some()) && !ran.is_empty() {
            Some(ran.iter().filter_map(|r| r.metadata.cost).sum())
        } else {
            None
        };
        let outcome = WorkflowOutcome {
            workflow_id: record.workflow_id.clone(),
            name: workflow.name.clone(),
            success: status == WorkflowStatus::Succeeded,
            status,
            failed_step,
            steps: all,
            total_tokens,
            cost,
            duration_ms: started.elapsed().as_millis() as u64,
        };
        self.emit(WorkflowEvent::WorkflowFinished {
            outcome: Box::new(outcome.clone()),
        });
        outcome
    }

    /// Runs (or continues) one step, whatever happens giving its result.
    async fn run_step(
        &self,
        workflow: &Workflow,
        i: usize,
        context: Value,
        workflow_id: &str,
        cancel: CancellationToken,
    ) -> StepResult {
        let step = &workflow.steps[i];
        let started_ms = now_ms();
        let run_id = self
            .journal
            .as_ref()
            .map(|_| step_run_id(workflow_id, &step.id));
        let existing = match (&self.journal, &run_id) {
            (Some(journal), Some(id)) => match journal.load(id).await {
                Ok(records) => !records.is_empty(),
                Err(JournalError::NotFound(_)) => false,
                Err(e) => {
                    return self.finish_early(step, started_ms, format!("the run log: {e}"));
                }
            },
            _ => false,
        };
        self.emit(WorkflowEvent::StepStarted {
            step: step.id.clone(),
            run_id: run_id.clone(),
            resumed: existing,
            at_ms: started_ms,
        });
        let mut result = self
            .step_result(workflow, step, &context, run_id, existing, cancel)
            .await;
        result.metadata.started_ms = started_ms;
        result.metadata.finished_ms = now_ms();
        result
    }

    fn finish_early(&self, step: &Step, started_ms: i64, error: String) -> StepResult {
        let mut r = StepResult::without_run(&step.id, StepStatus::Failed, Some(error));
        r.metadata.started_ms = started_ms;
        r.metadata.finished_ms = now_ms();
        r
    }

    async fn step_result(
        &self,
        workflow: &Workflow,
        step: &Step,
        context: &Value,
        run_id: Option<String>,
        existing: bool,
        cancel: CancellationToken,
    ) -> StepResult {
        let env = template::environment();
        let fail = |e: String| StepResult::without_run(&step.id, StepStatus::Failed, Some(e));
        // A step whose run began had its condition true and its templates rendered.
        if !existing && let Some(when) = &step.when {
            match template::truth(&env, when, context) {
                Ok(true) => {}
                Ok(false) => return StepResult::without_run(&step.id, StepStatus::Skipped, None),
                Err(e) => return fail(format!("when: {e}")),
            }
        }
        let prompt = match template::render(&env, &step.prompt, context) {
            Ok(p) => p,
            Err(e) => return fail(format!("prompt: {e}")),
        };
        let system = match step.system(workflow) {
            Some(s) => match template::render(&env, s, context) {
                Ok(s) => Some(s),
                Err(e) => return fail(format!("system: {e}")),
            },
            None => None,
        };
        let model = match self.model(step.model(workflow)) {
            Ok(m) => m,
            Err(e) => return fail(format!("model: {e}")),
        };
        let timeout = match step.timeout(workflow) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let mut builder = AgentBuilder::new(model);
        if let Some(f) = &self.configure {
            builder = f(builder);
        }
        let tools = self
            .tools
            .iter()
            .filter(|t| step.tools.iter().any(|n| n == t.name()))
            .cloned();
        builder = builder
            .tools(tools)
            .max_rounds(step.max_rounds(workflow))
            .max_tool_calls(step.max_tool_calls(workflow));
        if let Some(system) = system {
            builder = builder.system(system);
        }
        if let Some(t) = timeout {
            builder = builder.timeout(t);
        }
        builder = output::configure(builder, step);
        if let Some(f) = self.on_event.clone() {
            let id = step.id.clone();
            builder = builder.on_event(move |e| {
                f(&WorkflowEvent::StepEvent {
                    step: id.clone(),
                    event: e.clone(),
                })
            });
        }
        if let Some(journal) = &self.journal {
            builder = builder.journal(journal.clone());
        }
        let agent = match builder.build() {
            Ok(a) => a,
            Err(e) => return fail(format!("tools: {e}")),
        };
        let outcome = match (&run_id, existing) {
            (Some(id), true) => match agent.resume(id, cancel).await {
                Ok(o) => o,
                Err(e) => return fail(format!("cannot resume its run: {e}")),
            },
            (Some(id), false) => {
                agent
                    .run_with_id(id, vec![Message::user(prompt)], cancel)
                    .await
            }
            (None, _) => {
                agent
                    .run_cancellable(vec![Message::user(prompt)], cancel)
                    .await
            }
        };
        if let (Some(log), Some(id)) = (&self.log, &outcome.run_id)
            && outcome.stop_reason != StopReason::AwaitingApproval
            && let Err(e) = log.step_finished(id, &outcome).await
        {
            tracing::warn!("step {}: saving its run's outcome: {e}", step.id);
        }
        let output = output::read(step, &outcome);
        StepResult::from_outcome(&step.id, &outcome, output)
    }
}

/// What step templates see: `inputs`, and `steps` with the results of the steps in `visible`.
fn context(
    inputs: &BTreeMap<String, String>,
    visible: &BTreeSet<usize>,
    steps: &[Step],
    results: &[Option<StepResult>],
) -> Value {
    let mut seen = Map::new();
    for &j in visible {
        if let Some(r) = &results[j] {
            seen.insert(steps[j].id.clone(), r.template_value());
        }
    }
    serde_json::json!({
        "inputs": inputs,
        "steps": seen,
    })
}
