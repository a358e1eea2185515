//! Workflows against the mock server over real HTTP (OpenAI API): interpolation of text and
//! JSON outputs, checks before any model call, skipped steps, concurrent independent steps,
//! failures that stop the workflow, and the JSON Schema of the file format.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use toolloop::model::Model;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::tool::{Tool, ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop_mock::{MockAnswer, MockOptions, MockServer};
use toolloop_workflow::{
    Runner, StepStatus, Workflow, WorkflowError, WorkflowEvent, WorkflowStatus,
};

fn model(base: &str, scenario: &str) -> Arc<dyn Model> {
    let mut c = OpenAiConfig::new(scenario).with_base_url(format!("{base}/v1"));
    c.api_key = Some("sk-test".into());
    Arc::new(OpenAiModel::new(c))
}

/// A runner whose default model answers at once, and whose steps' `model` names a mock
/// scenario.
fn runner(server: &MockServer) -> Runner {
    let base = server.base_url();
    let named = base.clone();
    Runner::new(model(&base, "mock:rounds=0")).models(move |name| Ok(model(&named, name)))
}

async fn mock(answers: &[(&str, &str)]) -> MockServer {
    toolloop_mock::start(MockOptions {
        answers_by_prompt: answers
            .iter()
            .map(|(w, t)| MockAnswer {
                when: w.to_string(),
                text: t.to_string(),
            })
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap()
}

fn inputs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn recorder(runner: Runner) -> (Runner, Arc<Mutex<Vec<WorkflowEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let runner = runner.on_event(move |e| sink.lock().unwrap().push(e.clone()));
    (runner, events)
}

const CHAIN: &str = r#"
name = "article"

[inputs.text]
description = "The text"

[[steps]]
id = "summarise"
prompt = "Summarise: {{ inputs.text }}"

[[steps]]
id = "extract"
prompt = "Extract from: {{ steps.summarise.output }}"
output_schema = { type = "object", required = ["title", "keywords"], properties = { title = { type = "string" }, keywords = { type = "array", items = { type = "string" } } } }

[[steps]]
id = "translate"
prompt = "Translate the title {{ steps.extract.output.title }} ({{ steps.extract.output.keywords | join(', ') }})"
"#;

/// Each canned answer matches only a prompt that carries the interpolated values: a template
/// that did not put them in gets the mock's default answer, and the outputs differ.
#[tokio::test]
async fn text_and_json_outputs_are_interpolated_into_later_prompts() {
    let server = mock(&[
        ("Summarise: Rivers flow", "Rivers carry water to the sea."),
        (
            "Extract from: Rivers carry water to the sea.",
            r#"{"title": "Rivers", "keywords": ["water", "sea"]}"#,
        ),
        ("Translate the title Rivers (water, sea)", "Fleuves"),
    ])
    .await;
    let workflow = Workflow::from_toml(CHAIN, None).unwrap();
    let (runner, events) = recorder(runner(&server));
    let outcome = runner
        .run(
            &workflow,
            &inputs(&[("text", "Rivers flow downhill.")]),
            Default::default(),
        )
        .await
        .unwrap();
    assert!(outcome.success, "{outcome:#?}");
    assert_eq!(
        outcome.step("summarise").unwrap().output,
        json!("Rivers carry water to the sea.")
    );
    assert_eq!(
        outcome.step("extract").unwrap().output,
        json!({"title": "Rivers", "keywords": ["water", "sea"]})
    );
    assert_eq!(outcome.step("translate").unwrap().output, json!("Fleuves"));
    let meta = &outcome.step("translate").unwrap().metadata;
    assert_eq!(meta.rounds, 1);
    assert!(meta.total_tokens.unwrap() > 0);
    assert_eq!(server.stats().requests, 3);
    // Step starts and ends around each step's run events, in order.
    let kinds: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            WorkflowEvent::StepStarted { step, .. } => Some(format!("start {step}")),
            WorkflowEvent::StepFinished { result } => Some(format!("end {}", result.step_id)),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "start summarise",
            "end summarise",
            "start extract",
            "end extract",
            "start translate",
            "end translate"
        ]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn check_names_undefined_variables_before_any_model_call() {
    let server = mock(&[]).await;
    let workflow = Workflow::from_toml(
        r#"
name = "bad"
[inputs.topic]
[[steps]]
id = "summarise"
prompt = "About {{ inputs.topc }}"
[[steps]]
id = "extract"
prompt = "Title: {{ steps.summarise.output.title }} and {{ steps.later.output }}"
[[steps]]
id = "later"
prompt = "{{ step.summarise }}"
when = "steps.nothere.success"
"#,
        None,
    )
    .unwrap();
    let runner = runner(&server);
    let Err(WorkflowError::Invalid(problems)) = runner.check(&workflow) else {
        panic!("expected the check to fail");
    };
    let text = problems.join("\n");
    for needle in [
        "step `summarise`: prompt: undefined variable `inputs.topc`",
        "step `extract`: prompt: undefined variable `steps.summarise.output.title`: the output \
         of step `summarise` is text",
        "step `extract`: prompt: undefined variable `steps.later.output`: step `later` does not \
         come before this one",
        "step `later`: prompt: undefined variable `step.summarise`",
        "step `later`: when: undefined variable `steps.nothere.success`: `nothere` is not a step",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert_eq!(problems.len(), 5, "{text}");
    let run = runner
        .run(&workflow, &inputs(&[("topic", "x")]), Default::default())
        .await;
    assert!(matches!(run, Err(WorkflowError::Invalid(_))));
    assert_eq!(server.stats().requests, 0, "no model call was made");
    server.shutdown().await;
}

#[tokio::test]
async fn cycles_unknown_steps_and_missing_tools_are_errors_at_check_time() {
    let server = mock(&[]).await;
    let cycle = Workflow::from_toml(
        r#"
name = "loop"
[[steps]]
id = "a"
prompt = "a"
depends_on = ["c"]
[[steps]]
id = "b"
prompt = "b"
depends_on = ["a"]
[[steps]]
id = "c"
prompt = "c"
depends_on = ["b"]
"#,
        None,
    )
    .unwrap();
    let Err(WorkflowError::Invalid(p)) = runner(&server).check(&cycle) else {
        panic!("a cycle must not check");
    };
    assert!(p[0].contains("cycle: a → c → b → a"), "{p:?}");

    let unknown = Workflow::from_toml(
        r#"
name = "unknown"
[[steps]]
id = "a"
prompt = "a"
depends_on = ["nope"]
tools = ["grep"]
"#,
        None,
    )
    .unwrap();
    let Err(WorkflowError::Invalid(p)) = runner(&server).check(&unknown) else {
        panic!("an unknown step must not check");
    };
    let text = p.join("\n");
    assert!(
        text.contains("depends_on names `nope`, which is not a step (known: a)"),
        "{text}"
    );
    assert!(text.contains("no tool `grep`"), "{text}");
    assert_eq!(server.stats().requests, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn a_false_when_skips_the_step_and_later_steps_see_it() {
    let server = mock(&[("Check", "all good"), ("Report: skipped=true", "reported")]).await;
    let workflow = Workflow::from_toml(
        r#"
name = "skip"
[[steps]]
id = "check"
prompt = "Check"
[[steps]]
id = "fix"
prompt = "Fix {{ steps.check.output }}"
when = "steps.check.output != 'all good'"
[[steps]]
id = "report"
prompt = "Report: skipped={{ steps.fix.skipped | lower }}"
"#,
        None,
    )
    .unwrap();
    let (runner, events) = recorder(runner(&server));
    let outcome = runner
        .run(&workflow, &BTreeMap::new(), Default::default())
        .await
        .unwrap();
    assert!(outcome.success, "{outcome:#?}");
    let fix = outcome.step("fix").unwrap();
    assert_eq!(fix.status, StepStatus::Skipped);
    assert!(fix.skipped && !fix.success);
    assert_eq!(fix.output, Value::Null);
    assert_eq!(fix.metadata.rounds, 0);
    assert_eq!(outcome.step("report").unwrap().output, json!("reported"));
    assert_eq!(server.stats().requests, 2, "the skipped step made no call");
    assert!(events.lock().unwrap().iter().any(|e| matches!(
        e,
        WorkflowEvent::StepFinished { result } if result.step_id == "fix" && result.skipped
    )));
    server.shutdown().await;
}

/// Two independent steps, each a model call the mock answers after 300 ms: both start before
/// either ends. With `max_parallel = 1` the same workflow runs them one after the other, which
/// the same measure tells apart.
#[tokio::test]
async fn independent_steps_run_at_once() {
    let server = mock(&[]).await;
    let text = |max_parallel: u32| {
        format!(
            r#"
name = "fan"
max_parallel = {max_parallel}
[[steps]]
id = "left"
prompt = "left"
model = "mock:rounds=0,latency=300ms"
depends_on = []
[[steps]]
id = "right"
prompt = "right"
model = "mock:rounds=0,latency=300ms"
depends_on = []
[[steps]]
id = "join"
prompt = "{{{{ steps.left.output }}}} {{{{ steps.right.output }}}}"
depends_on = ["left", "right"]
"#
        )
    };
    for (max_parallel, overlap) in [(4, true), (1, false)] {
        let workflow = Workflow::from_toml(&text(max_parallel), None).unwrap();
        let (runner, events) = recorder(runner(&server));
        let outcome = runner
            .run(&workflow, &BTreeMap::new(), Default::default())
            .await
            .unwrap();
        assert!(outcome.success, "{outcome:#?}");
        let events = events.lock().unwrap();
        let position = |want: &str, start: bool| {
            events
                .iter()
                .position(|e| match e {
                    WorkflowEvent::StepStarted { step, .. } => start && step == want,
                    WorkflowEvent::StepFinished { result } => !start && result.step_id == want,
                    _ => false,
                })
                .unwrap()
        };
        let first_end = position("left", false).min(position("right", false));
        let both_started = position("left", true).max(position("right", true)) < first_end;
        assert_eq!(both_started, overlap, "max_parallel {max_parallel}");
        // The results' times tell the same.
        let (l, r) = (
            &outcome.step("left").unwrap().metadata,
            &outcome.step("right").unwrap().metadata,
        );
        let overlapped = l.started_ms < r.finished_ms && r.started_ms < l.finished_ms;
        assert_eq!(overlapped, overlap, "{l:?} {r:?}");
        // The join runs after both.
        assert!(position("join", true) > position("left", false).max(position("right", false)));
    }
    server.shutdown().await;
}

fn counter() -> (Arc<dyn Tool>, Arc<Mutex<u32>>) {
    let count = Arc::new(Mutex::new(0));
    let c = count.clone();
    let tool = tool_fn("tick", "Counts.", move |_args: Value, _ctx: ToolContext| {
        let c = c.clone();
        async move {
            *c.lock().unwrap() += 1;
            Ok::<_, ToolError>(ToolOutput::text("ok"))
        }
    });
    (Arc::new(tool), count)
}

#[tokio::test]
async fn a_failed_step_stops_the_workflow_unless_it_may_fail() {
    let server = mock(&[]).await;
    for continue_on_error in [false, true] {
        let workflow = Workflow::from_toml(
            &format!(
                r#"
name = "fails"
[[steps]]
id = "busy"
prompt = "work"
model = "mock:rounds=3"
tools = ["tick"]
max_rounds = 1
continue_on_error = {continue_on_error}
[[steps]]
id = "after"
prompt = "after: {{{{ steps.busy.success }}}}"
"#
            ),
            None,
        )
        .unwrap();
        let (tool, count) = counter();
        let runner = runner(&server).tools([tool]);
        let outcome = runner
            .run(&workflow, &BTreeMap::new(), Default::default())
            .await
            .unwrap();
        let busy = outcome.step("busy").unwrap();
        assert_eq!(busy.status, StepStatus::Failed);
        assert_eq!(
            busy.stop_reason,
            Some(toolloop::outcome::StopReason::MaxRounds)
        );
        assert_eq!(*count.lock().unwrap(), 1, "the step's tool ran");
        let after = outcome.step("after").unwrap();
        if continue_on_error {
            assert!(outcome.success);
            assert_eq!(after.status, StepStatus::Succeeded);
        } else {
            assert_eq!(outcome.status, WorkflowStatus::Failed);
            assert_eq!(outcome.failed_step.as_deref(), Some("busy"));
            assert_eq!(after.status, StepStatus::NotRun);
        }
    }
    server.shutdown().await;
}

#[test]
fn missing_and_unknown_inputs_are_named() {
    let workflow = Workflow::from_toml(CHAIN, None).unwrap();
    let e = workflow
        .resolve_inputs(&inputs(&[("txt", "x")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("input `txt` is not an input"), "{e}");
    assert!(e.contains("input `text` is required"), "{e}");
}

/// `docs/workflow.schema.json` is the schema of the format as the code defines it
/// (`TOOLLOOP_BLESS=1` writes it).
#[test]
fn the_committed_json_schema_is_up_to_date() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/workflow.schema.json");
    let fresh = format!(
        "{}\n",
        serde_json::to_string_pretty(&Workflow::json_schema()).unwrap()
    );
    if std::env::var_os("TOOLLOOP_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} is out of date: run `TOOLLOOP_BLESS=1 cargo test -p toolloop-workflow --test \
         workflow` and commit it",
        path.display()
    );
}

/// The examples of the repository check.
#[test]
fn the_examples_parse_and_check() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let w = Workflow::from_file(&path).unwrap();
            toolloop_workflow_check(&w);
            n += 1;
        }
    }
    assert!(n >= 2, "examples in {}", dir.display());
}

fn toolloop_workflow_check(w: &Workflow) {
    let names = [
        "read_file",
        "list_dir",
        "search_files",
        "write_file",
        "run_command",
    ];
    let tools: Vec<Arc<dyn Tool>> = names
        .iter()
        .map(|n| {
            Arc::new(tool_fn(*n, "A tool.", |_: Value, _: ToolContext| async {
                Ok::<_, ToolError>(ToolOutput::text(""))
            })) as Arc<dyn Tool>
        })
        .collect();
    let runner = Runner::new(model("http://127.0.0.1:9", "m")).tools(tools);
    runner.check(w).unwrap();
}

/// A JSON step whose answers do not match its schema: each is fed back to the model with the
/// errors (the model is asked again), and then the step fails and stops the workflow.
#[tokio::test]
async fn an_answer_that_fails_the_schema_is_fed_back_then_the_step_fails() {
    let server = mock(&[("Extract", r#"{"title": 42}"#)]).await;
    let workflow = Workflow::from_toml(
        r#"
name = "typed"
[[steps]]
id = "extract"
prompt = "Extract the title"
output_schema = { type = "object", required = ["title"], properties = { title = { type = "string" } } }
[[steps]]
id = "after"
prompt = "{{ steps.extract.output.title }}"
"#,
        None,
    )
    .unwrap();
    let (runner, events) = recorder(runner(&server));
    let outcome = runner
        .run(&workflow, &BTreeMap::new(), Default::default())
        .await
        .unwrap();
    let step = outcome.step("extract").unwrap();
    assert_eq!(step.status, StepStatus::Failed, "{outcome:#?}");
    assert_eq!(
        step.stop_reason,
        Some(toolloop::outcome::StopReason::TooManyInvalidCalls)
    );
    assert_eq!(step.output, Value::Null);
    let invalid = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            matches!(
                e,
                WorkflowEvent::StepEvent {
                    event: toolloop::Event::InvalidOutput { .. },
                    ..
                }
            )
        })
        .count();
    assert!(invalid >= 2, "fed back more than once: {invalid}");
    // Each invalid answer was followed by another model call, but the last.
    assert_eq!(server.stats().requests as usize, invalid);
    assert_eq!(outcome.step("after").unwrap().status, StepStatus::NotRun);
    assert_eq!(outcome.failed_step.as_deref(), Some("extract"));
    server.shutdown().await;
}
