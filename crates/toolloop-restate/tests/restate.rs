//! The agent as a Restate service, against a real Restate server (the npm package's binary,
//! installed by `scripts/npm-install`; skipped, saying so, when node or npm is not on `PATH`) and two worker
//! processes sharing one address (this test binary, started again as a worker). The model is
//! the mock server on 127.0.0.1; the tools are the side-effecting test tools of the command's
//! `test-hooks` (each call appends its idempotency key to a file).
//!
//! Two lanes of tests at once, each with a server of its own, and the tests of a lane one after
//! another (`harness = false`): `cargo test -p toolloop-restate --test restate [NAME…]`.

#[path = "common/mod.rs"]
mod common;
#[path = "../../../tools/npm/testing.rs"]
mod npm;
#[path = "../../toolloop-cli/src/testtool.rs"]
mod testtool;

use common::{RestateServer, free_port};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use toolloop::approval::{Answer, Approvals};
use toolloop::outcome::CallStatus;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::{Agent, Message, Outcome, StopReason};
use toolloop_restate::client;

const WORKER: &str = "TOOLLOOP_RESTATE_TEST_WORKER";

fn main() {
    if let Ok(addr) = std::env::var(WORKER) {
        worker(&addr);
        return;
    }
    ports_are_given_once();
    if cfg!(not(toolloop_npm)) {
        // Reported as skipped, never as passed: this harness has no libtest, so it prints the
        // plain closing line itself.
        eprintln!("restate tests skipped: {}", npm::NO_NPM);
        println!("restate: 0 passed, 0 failed, {} skipped", TESTS.len());
        return;
    }
    npm::installed();
    let binary = common::server_binary()
        .expect("the Restate server is installed by scripts/npm-install on this platform");
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // Two lanes, each with a Restate server, a mock model and a directory of its own, run at
    // once: the three long tests (workers killed mid-run, 5 to 7 s each) split over them, and
    // the tests of a lane one after another (the workers of every test register the same
    // service, which a server routes to the deployment registered last).
    let selected: Vec<&(&str, Test)> = TESTS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    let lanes: Vec<Vec<&(&str, Test)>> = (0..LANES)
        .map(|lane| {
            selected
                .iter()
                .copied()
                .filter(|(name, _)| lane_of(name) == lane)
                .collect()
        })
        .collect();
    let results: Vec<(usize, Vec<&str>)> = std::thread::scope(|scope| {
        let running: Vec<_> = lanes
            .iter()
            .filter(|tests| !tests.is_empty())
            .map(|tests| scope.spawn(|| run_lane(&binary, tests)))
            .collect();
        running
            .into_iter()
            .map(|lane| {
                lane.join()
                    .expect("a lane of tests panicked outside a test")
            })
            .collect()
    });
    let passed: usize = results.iter().map(|(p, _)| p).sum();
    let failed: Vec<&str> = results.into_iter().flat_map(|(_, f)| f).collect();
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        println!("restate: {passed} passed, {} failed", failed.len());
        std::process::exit(1);
    }
    println!("restate: {passed} passed, 0 failed");
}

/// The harness's own check: the ports it gives the servers and workers of both lanes are never
/// the same twice (the system would give some of these again within a few hundred).
fn ports_are_given_once() {
    let ports: Vec<u16> = (0..2000).map(|_| free_port()).collect();
    let distinct: std::collections::BTreeSet<&u16> = ports.iter().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was given twice");
}

/// How many lanes of tests run at once, each against a server of its own.
const LANES: usize = 2;

/// The lane a test runs in: the long tests spread over the lanes.
fn lane_of(name: &str) -> usize {
    match name {
        "a_killed_worker_is_replaced_without_repeating_calls"
        | "a_compacted_run_replays_without_summarising_again" => 0,
        _ => 1,
    }
}

/// Runs `tests` one after another against a Restate server and a mock model of their own:
/// how many passed, and the names of those that failed (the server's log printed then).
fn run_lane<'a>(binary: &Path, tests: &[&(&'a str, Test)]) -> (usize, Vec<&'a str>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let started = Instant::now();
    let server = RestateServer::start(binary);
    eprintln!(
        "Restate server up in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let ctx = Ctx {
        rt,
        mock_url: format!("{}/v1", mock.base_url()),
        mock,
        server,
        dir: tempfile::tempdir().unwrap(),
    };
    let mut failed = Vec::new();
    let mut passed = 0;
    for (name, test) in tests {
        let t = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&ctx)));
        let secs = t.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                eprintln!("test {name} ... ok ({secs:.1}s)");
                passed += 1;
            }
            Err(_) => {
                eprintln!("test {name} ... FAILED ({secs:.1}s)");
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        eprintln!(
            "Restate server log (the lane of {failed:?}):\n{}",
            ctx.server.log()
        );
    }
    (passed, failed)
}

/// One test: a name and its body.
type Test = fn(&Ctx);

/// The tests, run one after another against one server.
const TESTS: [(&str, Test); 10] = [
    (
        "runs_finish_through_the_ingress",
        runs_finish_through_the_ingress,
    ),
    (
        "concurrent_runs_spread_over_two_workers",
        concurrent_runs_spread_over_two_workers,
    ),
    (
        "a_killed_worker_is_replaced_without_repeating_calls",
        a_killed_worker_is_replaced_without_repeating_calls,
    ),
    ("approvals_wait_as_awakeables", approvals_wait_as_awakeables),
    (
        "cancel_stops_a_run_with_its_transcript",
        cancel_stops_a_run_with_its_transcript,
    ),
    (
        "a_tool_sources_changing_tools_are_journaled_and_offered",
        a_tool_sources_changing_tools_are_journaled_and_offered,
    ),
    (
        "a_worker_killed_inside_a_sub_agent_is_replaced_without_repeating_calls",
        a_worker_killed_inside_a_sub_agent_is_replaced_without_repeating_calls,
    ),
    (
        "a_sub_agents_approvals_are_listed_and_decided_through_its_root",
        a_sub_agents_approvals_are_listed_and_decided_through_its_root,
    ),
    (
        "a_sub_agent_over_its_budget_gives_an_error_and_the_parent_answers",
        a_sub_agent_over_its_budget_gives_an_error_and_the_parent_answers,
    ),
    (
        "a_compacted_run_replays_without_summarising_again",
        a_compacted_run_replays_without_summarising_again,
    ),
];

struct Ctx {
    rt: tokio::runtime::Runtime,
    mock: toolloop_mock::MockServer,
    mock_url: String,
    server: RestateServer,
    dir: tempfile::TempDir,
}

/// What the worker processes serve.
struct Config<'a> {
    name: &'a str,
    model: &'a str,
    effect_ms: u64,
    ask: bool,
    /// The test tools come from a tool source, whose version moves after each call.
    source: bool,
    /// The agent's one tool is the sub-agent `helper` on this model, with the test tools.
    child_model: Option<&'a str>,
    /// The sub-agent's token budget.
    child_max_tokens: Option<u64>,
    /// A context policy with this window (tokens), and room for 40 rounds.
    window: Option<u64>,
}

/// Two worker processes on one address, registered with the server; killed on drop.
struct Workers {
    children: Vec<Option<Child>>,
    logs: Vec<PathBuf>,
    effects: PathBuf,
}

impl Workers {
    fn start(ctx: &Ctx, config: Config<'_>) -> Workers {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let effects = ctx.dir.path().join(format!("effects-{}.txt", config.name));
        let mut children = Vec::new();
        let mut logs = Vec::new();
        for i in 0..2 {
            let log = ctx
                .dir
                .path()
                .join(format!("worker-{}-{i}.log", config.name));
            let mut child = Command::new(std::env::current_exe().unwrap())
                .env(WORKER, &addr)
                .env("TOOLLOOP_TEST_MODEL_URL", &ctx.mock_url)
                .env("TOOLLOOP_TEST_MODEL", config.model)
                .env("TOOLLOOP_TEST_EFFECTS", &effects)
                .env("TOOLLOOP_TEST_EFFECT_MS", config.effect_ms.to_string())
                .env("TOOLLOOP_TEST_ASK", if config.ask { "1" } else { "" })
                .env("TOOLLOOP_TEST_SOURCE", if config.source { "1" } else { "" })
                .env(
                    "TOOLLOOP_TEST_CHILD_MODEL",
                    config.child_model.unwrap_or(""),
                )
                .env(
                    "TOOLLOOP_TEST_CHILD_MAX_TOKENS",
                    config
                        .child_max_tokens
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                )
                .env(
                    "TOOLLOOP_TEST_WINDOW",
                    config.window.map(|w| w.to_string()).unwrap_or_default(),
                )
                .env("RUST_LOG", "toolloop_restate=info")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert!(line.starts_with("listening"), "worker {i}: {line:?}");
            children.push(Some(child));
            logs.push(log);
        }
        ctx.rt
            .block_on(toolloop_restate::register(
                &ctx.server.admin,
                &format!("http://{addr}"),
                Duration::from_secs(30),
            ))
            .unwrap();
        Workers {
            children,
            logs,
            effects,
        }
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.logs[i]).unwrap_or_default()
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// A worker process: the agent (the mock model, the test tools) served on the shared address.
fn worker(addr: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let model_for_root = || {
            OpenAiModel::new(
                OpenAiConfig::new(var("TOOLLOOP_TEST_MODEL"))
                    .with_base_url(var("TOOLLOOP_TEST_MODEL_URL")),
            )
        };
        let model = model_for_root();
        let tools = testtool::tools(Vec::new());
        let child_model = var("TOOLLOOP_TEST_CHILD_MODEL");
        let mut builder = if !child_model.is_empty() {
            let model = OpenAiModel::new(
                OpenAiConfig::new(child_model).with_base_url(var("TOOLLOOP_TEST_MODEL_URL")),
            );
            let mut helper = Agent::builder(model).tools(tools);
            if var("TOOLLOOP_TEST_ASK") == "1" {
                helper = helper.approvals(Approvals::ask_all());
            }
            let helper = helper.build().unwrap();
            let mut helper = helper
                .as_tool("helper", "Does the work with the test tools.")
                .unwrap();
            if let Ok(n) = var("TOOLLOOP_TEST_CHILD_MAX_TOKENS").parse() {
                helper = helper.max_tokens(n);
            }
            Agent::builder(model_for_root()).tool(helper)
        } else if var("TOOLLOOP_TEST_SOURCE") == "1" {
            Agent::builder(model).tool_source(Source::new(tools))
        } else {
            Agent::builder(model).tools(tools)
        };
        if var("TOOLLOOP_TEST_ASK") == "1" {
            builder = builder.approvals(Approvals::ask_all());
        }
        if let Ok(window) = var("TOOLLOOP_TEST_WINDOW").parse::<u64>() {
            builder = builder.max_rounds(40).max_tool_calls(40).context(
                toolloop::context::ContextPolicy {
                    window: Some(window),
                    keep_rounds: 2,
                    ..Default::default()
                },
            );
        }
        let agent = builder.build().unwrap();
        let w = toolloop_restate::Worker::bind(addr.parse().unwrap()).unwrap();
        println!("listening {}", w.local_addr().unwrap());
        w.serve(agent, std::future::pending::<()>()).await;
    });
}

/// The test tools as a tool source that offers one more of them after each call: the first
/// round offers one tool, the next two, and so on.
struct Source {
    tools: Vec<std::sync::Arc<dyn toolloop::Tool>>,
    offered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Source {
    fn new(tools: Vec<std::sync::Arc<dyn toolloop::Tool>>) -> Source {
        Source {
            tools,
            offered: std::sync::Arc::new(1.into()),
        }
    }
}

/// A tool that offers one more of the source's tools once it has run.
struct Growing {
    inner: std::sync::Arc<dyn toolloop::Tool>,
    offered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait::async_trait]
impl toolloop::Tool for Growing {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn parameters(&self) -> &serde_json::Value {
        self.inner.parameters()
    }
    fn side_effect(&self) -> toolloop::SideEffect {
        self.inner.side_effect()
    }
    async fn call(
        &self,
        args: serde_json::Value,
        ctx: toolloop::ToolContext,
    ) -> Result<toolloop::ToolOutput, toolloop::ToolError> {
        let out = self.inner.call(args, ctx).await;
        self.offered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        out
    }
}

#[async_trait::async_trait]
impl toolloop::tool_source::ToolSource for Source {
    fn name(&self) -> &str {
        "test tools"
    }
    fn version(&self) -> u64 {
        self.offered.load(std::sync::atomic::Ordering::SeqCst) as u64
    }
    async fn tools(
        &self,
        _reserved: &[&str],
    ) -> Result<Vec<std::sync::Arc<dyn toolloop::Tool>>, toolloop::tool_source::ToolSourceError>
    {
        let n = self.offered.load(std::sync::atomic::Ordering::SeqCst);
        Ok(self
            .tools
            .iter()
            .take(n)
            .map(|t| {
                std::sync::Arc::new(Growing {
                    inner: t.clone(),
                    offered: self.offered.clone(),
                }) as std::sync::Arc<dyn toolloop::Tool>
            })
            .collect())
    }
}

fn effect_counts(path: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *counts.entry(line.to_string()).or_insert(0) += 1;
    }
    counts
}

fn prompt(text: &str) -> Vec<Message> {
    vec![Message::user(text)]
}

fn assert_answered(o: &Outcome, text: &str) {
    assert_eq!(o.stop_reason, StopReason::Answered, "{o:?}");
    assert_eq!(o.text.as_deref(), Some(text), "{o:?}");
}

fn runs_finish_through_the_ingress(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "basic",
            model: "mock:rounds=2,parallel=2",
            effect_ms: 0,
            ask: false,
            source: false,
            child_model: None,
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let outcomes: Vec<Outcome> = ctx.rt.block_on(async {
        let runs = (0..5).map(|i| {
            let ingress = ingress.clone();
            async move {
                client::invoke(
                    &ingress,
                    &format!("basic-{i}"),
                    prompt(&format!("task {i}")),
                )
                .await
                .unwrap()
            }
        });
        futures::future::join_all(runs).await
    });
    let counts = effect_counts(&workers.effects);
    for (i, o) in outcomes.iter().enumerate() {
        assert_answered(o, "Done. I saw 4 tool results in 2 rounds.");
        let run_id = format!("basic-{i}");
        assert_eq!(o.run_id.as_deref(), Some(run_id.as_str()));
        assert_eq!(o.tool_calls.len(), 4);
        for c in &o.tool_calls {
            assert_eq!(c.status, CallStatus::Ok, "{c:?}");
            // The tool got the run's idempotency key, and ran once.
            let key = format!("{run_id}/{}", c.call.id);
            assert_eq!(counts.get(&key), Some(&1), "{key}: {counts:?}");
        }
    }
    assert_eq!(counts.len(), 20);
    // Asking again for a run id gives the same outcome, from Restate, with no model call.
    let before = ctx.mock.stats().requests;
    let again = ctx
        .rt
        .block_on(client::invoke(&ingress, "basic-0", prompt("task 0")))
        .unwrap();
    assert_eq!(again.messages, outcomes[0].messages);
    assert_eq!(ctx.mock.stats().requests, before);
    assert_eq!(effect_counts(&workers.effects).len(), 20);
    // A run id that cannot be a key is refused before any call.
    let e = ctx
        .rt
        .block_on(client::invoke(&ingress, "a/b", prompt("x")))
        .unwrap_err();
    assert!(e.to_string().contains("run id"), "{e}");
}

fn concurrent_runs_spread_over_two_workers(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "many",
            model: "mock:rounds=1,parallel=2",
            effect_ms: 0,
            ask: false,
            source: false,
            child_model: None,
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let n = 200;
    let before = ctx.mock.stats().requests;
    let outcomes: Vec<Outcome> = ctx.rt.block_on(async {
        let runs = (0..n).map(|i| {
            let ingress = ingress.clone();
            async move {
                client::invoke(&ingress, &format!("many-{i}"), prompt(&format!("job {i}")))
                    .await
                    .unwrap()
            }
        });
        futures::future::join_all(runs).await
    });
    for o in &outcomes {
        assert_answered(o, "Done. I saw 2 tool results in 1 rounds.");
    }
    assert_eq!(ctx.mock.stats().requests - before, 2 * n as u64);
    assert_eq!(effect_counts(&workers.effects).len(), 2 * n);
    let finished: Vec<usize> = (0..2)
        .map(|i| workers.log(i).matches("run finished").count())
        .collect();
    eprintln!("runs finished by each worker: {finished:?}");
    assert!(
        finished.iter().all(|&n| n > 0),
        "both workers ran some: {finished:?}"
    );
}

fn a_killed_worker_is_replaced_without_repeating_calls(ctx: &Ctx) {
    let mut workers = Workers::start(
        ctx,
        Config {
            name: "kill",
            model: "mock:rounds=2,parallel=2",
            effect_ms: 1500,
            ask: false,
            source: false,
            child_model: None,
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let n = 4;
    let before = ctx.mock.stats().requests;
    let ids: Vec<String> = ctx.rt.block_on(async {
        let mut ids = Vec::new();
        for i in 0..n {
            let id = client::start(&ingress, &format!("kill-{i}"), prompt(&format!("kill {i}")))
                .await
                .unwrap();
            ids.push(id);
        }
        ids
    });
    // Every run is inside its first tool call (each takes 1.5s).
    let until = Instant::now() + Duration::from_secs(30);
    while effect_counts(&workers.effects).len() < n {
        assert!(Instant::now() < until, "the runs did not reach their tools");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Kill a worker that is running some of them.
    let busy = (0..2)
        .find(|&i| workers.log(i).contains("model answered"))
        .expect("a worker ran the runs");
    workers.kill(busy);
    let outcomes: Vec<Outcome> = ctx.rt.block_on(async {
        let mut outcomes = Vec::new();
        for id in &ids {
            outcomes.push(client::attach(&ingress, id).await.unwrap());
        }
        outcomes
    });
    let other = 1 - busy;
    assert!(
        workers.log(other).contains("model answered"),
        "the other worker took over"
    );
    let counts = effect_counts(&workers.effects);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "side effects repeated: {twice:?}");
    let mut unknown = 0;
    for o in &outcomes {
        assert_answered(o, "Done. I saw 4 tool results in 2 rounds.");
        let run_id = o.run_id.clone().unwrap();
        for c in &o.tool_calls {
            let key = format!("{run_id}/{}", c.call.id);
            match c.status {
                CallStatus::Ok => assert_eq!(counts.get(&key), Some(&1), "{key}"),
                // Running at the kill: it took effect once, and was not run again.
                CallStatus::Unknown => {
                    unknown += 1;
                    assert_eq!(counts.get(&key), Some(&1), "{key}");
                }
                other => panic!("{key}: {other:?}"),
            }
        }
    }
    assert!(unknown > 0, "the kill landed in tool calls");
    // Three model calls per run, none made twice.
    assert_eq!(ctx.mock.stats().requests - before, 3 * n as u64);
    eprintln!("killed worker {busy}: {unknown} calls outcome unknown, none repeated");
}

/// A run whose one call is the sub-agent `helper` (a child invocation): a worker running the
/// child is killed while the child's tools run; the child goes on in the other worker from its
/// own journal, and the parent takes its result, with no model call and no tool call made
/// twice.
fn a_worker_killed_inside_a_sub_agent_is_replaced_without_repeating_calls(ctx: &Ctx) {
    let mut workers = Workers::start(
        ctx,
        Config {
            name: "child-kill",
            model: "mock:rounds=1",
            effect_ms: 1500,
            ask: false,
            source: false,
            child_model: Some("mock:rounds=2,parallel=2"),
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let n = 2;
    let before = ctx.mock.stats().requests;
    let ids: Vec<String> = ctx.rt.block_on(async {
        let mut ids = Vec::new();
        for i in 0..n {
            let id = client::start(
                &ingress,
                &format!("child-{i}"),
                prompt(&format!("child {i}")),
            )
            .await
            .unwrap();
            ids.push(id);
        }
        ids
    });
    // Every child is inside its first tool calls (each takes 1.5s).
    let until = Instant::now() + Duration::from_secs(30);
    while effect_counts(&workers.effects).len() < 2 * n {
        assert!(
            Instant::now() < until,
            "the children did not reach their tools"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Kill a worker that runs a child (its model answered a run keyed `{parent}/{call}`).
    let busy = (0..2)
        .find(|&i| {
            workers
                .log(i)
                .lines()
                .any(|l| l.contains("model answered") && is_child(l))
        })
        .expect("a worker ran a child");
    workers.kill(busy);
    let outcomes: Vec<Outcome> = ctx.rt.block_on(async {
        let mut outcomes = Vec::new();
        for id in &ids {
            outcomes.push(client::attach(&ingress, id).await.unwrap());
        }
        outcomes
    });
    let counts = effect_counts(&workers.effects);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "side effects repeated: {twice:?}");
    assert_eq!(counts.len(), 4 * n, "four calls per child: {counts:?}");
    for o in &outcomes {
        assert_answered(o, "Done. I saw 1 tool results in 1 rounds.");
        let call = &o.tool_calls[0];
        assert_eq!(call.call.name, "helper");
        assert_eq!(call.status, CallStatus::Ok, "{o:?}");
        // The child's answer, with what it spent counted in the parent's.
        assert!(
            call.content.contains("I saw 4 tool results in 2 rounds"),
            "{}",
            call.content
        );
        let spent = call.spent.as_ref().expect("the child's spending");
        assert_eq!(spent.path, ["helper"]);
        assert_eq!(spent.rounds, 3);
        let child = format!("{}/{}", o.run_id.as_deref().unwrap(), call.call.id);
        assert_eq!(spent.run_id.as_deref(), Some(child.as_str()));
        assert!(
            counts
                .keys()
                .filter(|k| k.starts_with(&format!("{child}/")))
                .count()
                == 4,
            "the child's calls are keyed under its run: {counts:?}"
        );
        assert!(o.usage.unwrap().total_tokens() > spent.usage.unwrap().total_tokens());
    }
    // Two model calls per parent, three per child: none made twice.
    assert_eq!(ctx.mock.stats().requests - before, 5 * n as u64);
    eprintln!("killed worker {busy} inside a child: nothing repeated");
}

/// A sub-agent's calls that wait for a person are listed by its root run's `pending`, with
/// the path to the sub-agent and the child's run, and decided through the root.
fn a_sub_agents_approvals_are_listed_and_decided_through_its_root(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "child-ask",
            model: "mock:rounds=1",
            effect_ms: 0,
            ask: true,
            source: false,
            child_model: Some("mock:rounds=1,parallel=2"),
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let id = ctx
        .rt
        .block_on(client::start(&ingress, "child-ask", prompt("delegate")))
        .unwrap();
    // The root's own call of the sub-agent asks first.
    let waiting = wait_pending(ctx, "child-ask", 1);
    assert_eq!(waiting[0].pending.call.name, "helper");
    assert!(waiting[0].pending.path.is_empty());
    ctx.rt
        .block_on(client::decide(&ingress, "child-ask", None, Answer::Approve))
        .unwrap();
    // Then the child's two calls, through the root.
    let waiting = wait_pending(ctx, "child-ask", 2);
    for w in &waiting {
        assert_eq!(w.pending.path, ["helper"], "{w:?}");
        let run = w.pending.run_id.as_deref().unwrap_or_default();
        assert!(run.starts_with("child-ask/"), "{w:?}");
    }
    assert!(effect_counts(&workers.effects).is_empty(), "nothing ran");
    let first = waiting[0].pending.call.id.clone();
    ctx.rt
        .block_on(client::decide(
            &ingress,
            "child-ask",
            Some(std::slice::from_ref(&first)),
            Answer::Approve,
        ))
        .unwrap();
    ctx.rt
        .block_on(client::decide(
            &ingress,
            "child-ask",
            Some(std::slice::from_ref(&waiting[1].pending.call.id)),
            Answer::Deny {
                reason: Some("not this one".into()),
            },
        ))
        .unwrap();
    let o = ctx.rt.block_on(client::attach(&ingress, &id)).unwrap();
    assert_answered(&o, "Done. I saw 1 tool results in 1 rounds.");
    assert_eq!(o.tool_calls[0].status, CallStatus::Ok, "{o:?}");
    assert!(
        o.tool_calls[0]
            .content
            .contains("I saw 2 tool results in 1 rounds"),
        "{o:?}"
    );
    assert_eq!(
        effect_counts(&workers.effects).len(),
        1,
        "the approved one ran"
    );
    assert!(
        ctx.rt
            .block_on(client::pending(&ingress, "child-ask"))
            .unwrap()
            .is_empty()
    );
}

/// A sub-agent that passes its token budget stops after that model call (its calls not run),
/// and the parent reads why and answers anyway.
fn a_sub_agent_over_its_budget_gives_an_error_and_the_parent_answers(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "child-budget",
            model: "mock:rounds=1",
            effect_ms: 0,
            ask: false,
            source: false,
            child_model: Some("mock:rounds=2,parallel=2"),
            child_max_tokens: Some(10),
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let before = ctx.mock.stats().requests;
    let o = ctx
        .rt
        .block_on(client::invoke(&ingress, "child-budget", prompt("delegate")))
        .unwrap();
    assert_answered(&o, "Done. I saw 1 tool results in 1 rounds.");
    let call = &o.tool_calls[0];
    assert_eq!(call.status, CallStatus::Failed, "{o:?}");
    assert!(
        call.content.contains("went over its budget") && call.content.contains("limit is 10"),
        "{}",
        call.content
    );
    assert_eq!(call.spent.as_ref().map(|s| s.rounds), Some(1));
    assert!(
        effect_counts(&workers.effects).is_empty(),
        "no call of the child ran"
    );
    // The parent's two model calls and the child's one.
    assert_eq!(ctx.mock.stats().requests - before, 3);
}

/// Whether a worker's log line is about a sub-agent's run (its run id `child-N/{call id}`).
fn is_child(line: &str) -> bool {
    line.split("child-")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .is_some_and(|id| id.contains('/'))
}

fn wait_pending(ctx: &Ctx, run_id: &str, n: usize) -> Vec<toolloop_restate::WaitingApproval> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = ctx
            .rt
            .block_on(client::pending(&ctx.server.ingress, run_id))
            .unwrap();
        if waiting.len() == n {
            return waiting;
        }
        assert!(
            Instant::now() < until,
            "{run_id}: {} calls wait, not {n}",
            waiting.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn approvals_wait_as_awakeables(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "approve",
            model: "mock:rounds=2,parallel=2",
            effect_ms: 0,
            ask: true,
            source: false,
            child_model: None,
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let id = ctx
        .rt
        .block_on(client::start(&ingress, "approve-1", prompt("ask me")))
        .unwrap();
    let waiting = wait_pending(ctx, "approve-1", 2);
    assert!(effect_counts(&workers.effects).is_empty(), "nothing ran");
    let first = waiting[0].pending.call.id.clone();
    let second = waiting[1].pending.call.id.clone();
    // A call that does not wait is refused, and nothing is decided.
    let e = ctx
        .rt
        .block_on(client::decide(
            &ingress,
            "approve-1",
            Some(&["nope".to_string()]),
            Answer::Approve,
        ))
        .unwrap_err();
    assert!(e.to_string().contains("no call nope waits"), "{e}");
    let done = ctx
        .rt
        .block_on(client::decide(
            &ingress,
            "approve-1",
            Some(std::slice::from_ref(&first)),
            Answer::Approve,
        ))
        .unwrap();
    assert_eq!(done.len(), 1);
    ctx.rt
        .block_on(client::decide(
            &ingress,
            "approve-1",
            Some(std::slice::from_ref(&second)),
            Answer::Deny {
                reason: Some("not today".into()),
            },
        ))
        .unwrap();
    // The second round asks again, about its own calls.
    let until = Instant::now() + Duration::from_secs(30);
    while wait_pending(ctx, "approve-1", 2)
        .iter()
        .any(|w| w.pending.call.id == first || w.pending.call.id == second)
    {
        assert!(Instant::now() < until, "the second round did not ask");
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = ctx
        .rt
        .block_on(client::decide(&ingress, "approve-1", None, Answer::Approve))
        .unwrap();
    assert_eq!(done.len(), 2);
    let o = ctx.rt.block_on(client::attach(&ingress, &id)).unwrap();
    assert_answered(&o, "Done. I saw 4 tool results in 2 rounds.");
    let statuses: Vec<CallStatus> = o.tool_calls.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            CallStatus::Ok,
            CallStatus::Denied,
            CallStatus::Ok,
            CallStatus::Ok
        ]
    );
    assert!(o.tool_calls[1].content.contains("not today"), "{o:?}");
    assert_eq!(effect_counts(&workers.effects).len(), 3);
    assert!(
        ctx.rt
            .block_on(client::pending(&ingress, "approve-1"))
            .unwrap()
            .is_empty()
    );
}

fn cancel_stops_a_run_with_its_transcript(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "cancel",
            model: "mock:rounds=2,parallel=2",
            effect_ms: 0,
            ask: true,
            source: false,
            child_model: None,
            child_max_tokens: None,
            window: None,
        },
    );
    let ingress = ctx.server.ingress.clone();
    let id = ctx
        .rt
        .block_on(client::start(&ingress, "cancel-1", prompt("cancel me")))
        .unwrap();
    wait_pending(ctx, "cancel-1", 2);
    ctx.rt
        .block_on(client::cancel(&ctx.server.admin, &id))
        .unwrap();
    let o = ctx.rt.block_on(client::attach(&ingress, &id)).unwrap();
    assert_eq!(o.stop_reason, StopReason::Cancelled, "{o:?}");
    // The transcript holds the prompt and the model's calls.
    assert!(o.messages.len() >= 2, "{o:?}");
    assert!(
        matches!(
            o.messages.last(),
            Some(Message::Assistant(_)) | Some(Message::Tool(_))
        ),
        "{:?}",
        o.messages.last()
    );
    assert!(effect_counts(&workers.effects).is_empty());
    assert!(
        ctx.rt
            .block_on(client::pending(&ingress, "cancel-1"))
            .unwrap()
            .is_empty()
    );
}

/// A tool source's tools are offered through Restate, and a catalog that grows during a run is
/// offered from the next round: the mock calls the offered tools in turn, so round 2 calls a
/// tool that round 1 did not offer.
fn a_tool_sources_changing_tools_are_journaled_and_offered(ctx: &Ctx) {
    let workers = Workers::start(
        ctx,
        Config {
            name: "source",
            model: "mock:rounds=2",
            effect_ms: 0,
            ask: false,
            source: true,
            child_model: None,
            child_max_tokens: None,
            window: None,
        },
    );
    let o = ctx
        .rt
        .block_on(client::invoke(
            &ctx.server.ingress,
            "source-0",
            prompt("grow"),
        ))
        .unwrap();
    assert_answered(&o, "Done. I saw 2 tool results in 2 rounds.");
    let names: Vec<&str> = o.tool_calls.iter().map(|c| c.call.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{o:?}");
    assert_ne!(names[0], names[1], "round 2 offered a second tool: {o:?}");
    for c in &o.tool_calls {
        assert_eq!(c.status, CallStatus::Ok, "{c:?}");
    }
    assert_eq!(effect_counts(&workers.effects).len(), 2);
}

/// A run whose conversation is compacted under Restate (the summary is a journaled step), its
/// worker killed with SIGKILL after the summary was journaled, in the tool call that follows:
/// the other worker replays the run without asking the model for the summary again (the mock
/// counts one summarising request per compaction), and the run finishes.
fn a_compacted_run_replays_without_summarising_again(ctx: &Ctx) {
    const ROUNDS: u32 = 16;
    let mut workers = Workers::start(
        ctx,
        Config {
            name: "compact",
            model: "mock:rounds=16,window=1600",
            effect_ms: 400,
            ask: false,
            source: false,
            child_model: None,
            child_max_tokens: None,
            window: Some(1600),
        },
    );
    let ingress = ctx.server.ingress.clone();
    let before = ctx.mock.stats();
    let id = ctx
        .rt
        .block_on(client::start(&ingress, "compact-0", prompt("compact 0")))
        .unwrap();
    // The summary has been asked for and answered; the run goes on into its next tool call.
    let until = Instant::now() + Duration::from_secs(60);
    while ctx.mock.stats().summaries == before.summaries {
        assert!(Instant::now() < until, "the run was never compacted");
        std::thread::sleep(Duration::from_millis(10));
    }
    let calls = effect_counts(&workers.effects).len();
    while effect_counts(&workers.effects).len() == calls {
        assert!(
            Instant::now() < until,
            "the run did not go on after its compaction"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let busy = (0..2)
        .find(|&i| workers.log(i).contains("model answered"))
        .expect("a worker ran the run");
    workers.kill(busy);
    let summaries_at_kill = ctx.mock.stats().summaries - before.summaries;
    let outcome = ctx.rt.block_on(client::attach(&ingress, &id)).unwrap();
    assert!(
        workers.log(1 - busy).contains("model answered"),
        "the other worker took over"
    );
    assert_answered(
        &outcome,
        &format!("Done. I saw {ROUNDS} tool results in {ROUNDS} rounds."),
    );
    let context = outcome.context.as_ref().expect("the policy's report");
    let after = ctx.mock.stats();
    let summaries = after.summaries - before.summaries;
    assert!(context.compactions >= 1);
    // One summarising request per compaction: none was asked again on replay.
    assert_eq!(summaries, u64::from(context.compactions));
    assert!(summaries >= summaries_at_kill);
    assert_eq!(after.context_refusals, before.context_refusals);
    let twice: Vec<_> = effect_counts(&workers.effects)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(twice.is_empty(), "side effects repeated: {twice:?}");
    eprintln!(
        "killed worker {busy} after {summaries_at_kill} summaries; {summaries} in all, {} \
         compactions",
        context.compactions
    );
}
