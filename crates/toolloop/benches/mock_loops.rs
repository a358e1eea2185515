//! N concurrent loops of R rounds against the mock server on loopback, over the OpenAI adapter
//! and real HTTP.
//!
//! Reports, for each N:
//! - the raw ceiling: the mock's request rate with a bare HTTP client sending N concurrent
//!   streams of the very request bodies a loop sends (recorded from one run; each stream holds
//!   its own copy, as a client of distinct conversations would), with no loop and no adapter,
//!   measured in the same run;
//! - loops/s and rounds/s of the real loop, and rounds/s as a ratio to the ceiling. Each side
//!   runs N workers that repeat whole runs for a fixed time (so both sides are measured in a
//!   steady state, with no barrier between runs), after a warm-up at the same N. A ceiling
//!   trial and a loop trial run one after the other, five times; the ratio reported is the
//!   median pair's (its ceiling and rates are shown), with the range over the pairs;
//! - at N=1, on one thread, the loop's own cost per round: client time per round minus the
//!   server's processing time per request, beside a bare HTTP request of the same bodies;
//! - memory per in-flight loop: the peak of live heap bytes (counted by the allocator) with N
//!   loops in flight, over the baseline before they start, divided by N, beside the size of a
//!   loop's final transcript; the mock runs in a child process, with latency so that every loop
//!   is in flight at once, so only the client's memory counts.
//!
//! With `journal` after N and R (`cargo bench -p toolloop --bench mock_loops -- 1000 5 journal`)
//! it compares instead N loops that log every run to the store (`toolloop-store`: a SQLite file in
//! `TOOLLOOP_BENCH_DIR` or a temporary directory, in both durability modes, and PostgreSQL when
//! `TOOLLOOP_BENCH_POSTGRES` holds a URL) with the same loops without a journal: rounds/s as a
//! ratio over pairs of trials, and every journaled run checked to have finished with a whole log;
//! once with a side-effecting tool (every intent durable before its call runs) and once with a
//! read-only one (a round is one commit). Each store's line also says how many steps shared a
//! commit. `TOOLLOOP_BENCH_COMMIT_DELAY_US` sets the stores' commit delay (µs) and
//! `TOOLLOOP_BENCH_WRITERS` PostgreSQL's writers, to compare settings.
//!
//! With `latency=MS` after N and R (`cargo bench -p toolloop --bench mock_loops -- 10000 3
//! latency=1000`) it runs N loops of R rounds all at once, once, against the mock in a child
//! process answering every request after MS milliseconds: how many finished, throughput as a
//! share of the ideal (N × (R + 1) requests in (R + 1) × MS, the latency-bound time), the
//! peak of live heap per in-flight loop (transcripts and connections included), and the errors
//! the operating system gave (file descriptors, ephemeral ports). The process's open-files soft
//! limit is raised to its hard limit first (`raise_open_files_limit`), in the child too; both
//! are printed (`TOOLLOOP_BENCH_NOFILE_AS_IS` leaves them as they are). Then the bare client alone at the same concurrency and latency (the ceiling of
//! this machine and mock), and the loops' share of it. Add `journal` to log every run to a
//! SQLite store in `process` mode (in `TOOLLOOP_BENCH_DIR` or a temporary directory), each
//! run then checked to be finished with a whole log.
//!
//! With `stream` after N and R (`cargo bench -p toolloop --bench mock_loops -- 1000 5 stream`)
//! it compares the same loops asking for streamed replies (`stream: true`, Server-Sent Events
//! from the mock, through the same adapter) with the loops taking complete replies, at N=1 and N:
//! the cost of a streamed round as a ratio over pairs of trials (see `stream_cost`). `loop stream`
//! runs only the streamed loops, for a profiler.
//!
//! With `memory` after N and R (`cargo bench -p toolloop --bench mock_loops -- 1000 5 memory`)
//! it measures only the memory per in-flight loop (a few seconds; the figure is a count of live
//! heap bytes, the same on a loaded machine). With `loop` or `raw` after N and R it runs only
//! that side for about 20 s, for a profiler, and prints its rounds/s and the heap allocations
//! per round of the whole process (the mock's, which runs in the process, included), counted in
//! 2 s of their own before the 20 s so that counting does not slow what a profiler sees.
//!
//! With `floor` after N and R (`cargo bench -p toolloop --bench mock_loops -- 1000 5 floor`) it
//! runs, in turns, the ceiling, the real loop and four hand-written minimal loops (`minimal`: no
//! engine, serde_json in and out, on the bare client; one keeps the conversation as JSON values,
//! one as toolloop's `Message`s, one as `Message`s and a record of every call as a run's outcome
//! has it, one only as the next body's bytes), and gives each loop's rounds/s as a share of the
//! ceiling: what the least a loop has to do (decode each reply, run the calls, write the next
//! body) costs on this machine and mock. `minimal` after N and R runs only the minimal loop that
//! keeps bytes (`minimal values`, `minimal messages`, `minimal record`: the others), for a
//! profiler.
//!
//! Run: `cargo bench -p toolloop --bench mock_loops` (add `-- 1000 5` for N and R).

use async_trait::async_trait;
use mimalloc::MiMalloc;
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::time::Instant;
use toolloop::agent::Agent;
use toolloop::model::ModelRequest;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use toolloop_mock::{MockOptions, start};

#[path = "mock_loops/minimal.rs"]
mod minimal;

const PARALLEL: usize = 2;
/// How long each throughput trial runs, and how many pairs of trials there are.
const TRIAL_SECS: f64 = 1.5;
const TRIALS: usize = 5;

/// Counts live heap bytes, and their peak, so memory per loop is measured exactly rather than
/// through the allocator's reuse of freed pages. Allocation itself is mimalloc's, as in the
/// `toolloop` command.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
/// Counting is on only in the memory phase, so the throughput phases run at full speed.
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations made while `COUNTING_ALLOCS` is on (a profile of one side: see `profile_side`).
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static COUNTING_ALLOCS: AtomicBool = AtomicBool::new(false);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { MiMalloc.alloc(layout) };
        if COUNTING_ALLOCS.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            let size = layout.size() as isize;
            let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { MiMalloc.dealloc(ptr, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

struct Echo {
    schema: Value,
    side_effect: SideEffect,
}

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Echoes its input."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn parallel_safe(&self) -> bool {
        true
    }
    fn side_effect(&self) -> SideEffect {
        self.side_effect
    }
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::data(args))
    }
}

/// The echo tool, side-effecting (the default of a tool, and the dearer to journal: every
/// intent is durable before its call runs).
fn echo() -> Echo {
    echo_with(SideEffect::SideEffecting)
}

fn echo_with(side_effect: SideEffect) -> Echo {
    Echo {
        schema: json!({"type": "object", "properties": {"text": {"type": "string", "examples": ["hello"]}}, "required": ["text"]}),
        side_effect,
    }
}

fn agent(base_url: &str, scenario: &str, rounds: usize) -> Agent {
    journaled_agent(base_url, scenario, rounds, None)
}

fn journaled_agent(
    base_url: &str,
    scenario: &str,
    rounds: usize,
    journal: Option<Arc<dyn toolloop::journal::Journal>>,
) -> Agent {
    journaled_agent_with(
        base_url,
        scenario,
        rounds,
        journal,
        SideEffect::SideEffecting,
    )
}

fn journaled_agent_with(
    base_url: &str,
    scenario: &str,
    rounds: usize,
    journal: Option<Arc<dyn toolloop::journal::Journal>>,
    side_effect: SideEffect,
) -> Agent {
    agent_of(base_url, scenario, rounds, journal, side_effect, false)
}

/// The same loops as [`agent`], asking the model for streamed replies (`stream: true`: the
/// mock answers with Server-Sent Events) when `stream` is set.
fn streaming_agent(base_url: &str, scenario: &str, rounds: usize, stream: bool) -> Agent {
    agent_of(
        base_url,
        scenario,
        rounds,
        None,
        SideEffect::SideEffecting,
        stream,
    )
}

fn agent_of(
    base_url: &str,
    scenario: &str,
    rounds: usize,
    journal: Option<Arc<dyn toolloop::journal::Journal>>,
    side_effect: SideEffect,
    stream: bool,
) -> Agent {
    let mut config = OpenAiConfig::new(scenario).with_base_url(base_url);
    config.transport.retry.max_retries = 0;
    let mut builder = Agent::builder(OpenAiModel::new(config))
        .tool(echo_with(side_effect))
        .max_rounds(rounds as u32 + 1)
        .max_tool_calls(((rounds + 1) * PARALLEL) as u32)
        .stream(stream);
    if let Some(journal) = journal {
        builder = builder.journal(journal);
    }
    builder.build().expect("one tool")
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Records the request bodies a loop sends, so the raw ceiling replays exactly the same requests.
struct Recorder {
    inner: OpenAiModel,
    bodies: std::sync::Mutex<Vec<bytes::Bytes>>,
}

#[async_trait]
impl toolloop::model::Model for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn complete(
        &self,
        r: &ModelRequest<'_>,
    ) -> Result<toolloop::model::ModelResponse, toolloop::model::ModelError> {
        let body = self.inner.request_body(r, false).expect("body");
        if let Ok(mut b) = self.bodies.lock() {
            b.push(body);
        }
        self.inner.complete(r).await
    }
}

/// The request bodies of one whole run, in order.
async fn one_run_bodies(url: &str, scenario: &str, rounds: usize) -> Vec<bytes::Bytes> {
    let config = OpenAiConfig::new(scenario).with_base_url(url);
    let recorder = Recorder {
        inner: OpenAiModel::new(config),
        bodies: std::sync::Mutex::new(Vec::new()),
    };
    let recorder = Arc::new(recorder);
    let agent = toolloop::agent::AgentBuilder::new(recorder.clone())
        .tool(echo())
        .max_rounds(rounds as u32 + 1)
        .max_tool_calls(((rounds + 1) * PARALLEL) as u32)
        .build()
        .expect("one tool");
    let out = agent.prompt("go").await;
    assert_eq!(out.rounds as usize, rounds + 1, "{:?}", out.error);
    recorder
        .bodies
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default()
}

/// A bare HTTP client that keeps up to `n` idle connections, like the loop's transport.
fn bare_client(n: usize) -> reqwest::Client {
    http_client_builder()
        .pool_max_idle_per_host(n)
        .build()
        .expect("client")
}

/// The raw ceiling: `n` concurrent tasks on one bare HTTP client (no loop, no adapter), each
/// replaying the request bodies of a whole run `per` times.
async fn raw_rate(
    client: &reqwest::Client,
    url: &str,
    bodies: &[bytes::Bytes],
    n: usize,
    per: usize,
) -> f64 {
    let start = Instant::now();
    let done = raw_workers(client, url, bodies, n, Work::Runs(per)).await;
    done as f64 / start.elapsed().as_secs_f64()
}

/// How much each worker does: a number of whole runs, or whole runs until a moment.
#[derive(Clone, Copy)]
enum Work {
    Runs(usize),
    Until(Instant),
}

impl Work {
    fn more(self, done_runs: usize) -> bool {
        match self {
            Work::Runs(n) => done_runs < n,
            Work::Until(end) => Instant::now() < end,
        }
    }
}

/// `n` bare-client workers replaying a run's bodies; gives the requests made.
async fn raw_workers(
    client: &reqwest::Client,
    url: &str,
    bodies: &[bytes::Bytes],
    n: usize,
    work: Work,
) -> usize {
    // Parsed once, as the loop's transport does.
    let endpoint = reqwest::Url::parse(&format!("{url}/chat/completions")).expect("a URL");
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let client = client.clone();
            // Its own copy, as a client of distinct conversations has: bodies shared by every
            // worker would stay in the cache, which no real client's bodies do.
            let bodies: Vec<bytes::Bytes> = bodies
                .iter()
                .map(|b| bytes::Bytes::copy_from_slice(b))
                .collect();
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                let mut runs = 0;
                while work.more(runs) {
                    for body in &bodies {
                        let r = client
                            .post(endpoint.clone())
                            .header("content-type", "application/json")
                            .body(body.clone())
                            .send()
                            .await
                            .expect("mock answers");
                        assert!(r.status().is_success());
                        r.bytes().await.expect("body");
                    }
                    runs += 1;
                }
                runs * bodies.len()
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        done += t.await.expect("task");
    }
    done
}

/// `n` workers each running whole hand-written minimal loops (see `minimal`) on the bare client;
/// gives the rounds made.
async fn minimal_workers(
    client: &reqwest::Client,
    url: &str,
    template: &Arc<minimal::Template>,
    keep: minimal::Keep,
    (n, rounds): (usize, usize),
    work: Work,
) -> usize {
    let endpoint = reqwest::Url::parse(&format!("{url}/chat/completions")).expect("a URL");
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, endpoint, template) = (client.clone(), endpoint.clone(), template.clone());
            tokio::spawn(async move {
                let (mut runs, mut done) = (0, 0);
                while work.more(runs) {
                    let (r, _) = minimal::run(&client, &endpoint, &template, keep).await;
                    assert_eq!(r, rounds + 1, "the minimal loop's rounds");
                    done += r;
                    runs += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        done += t.await.expect("minimal loop task");
    }
    done
}

/// `floor` after N and R: the ceiling, the real loop and the four hand-written minimal loops (see
/// `minimal`) in turns, at N=1, 100 and N; each loop's rounds/s as a share of the ceiling (the
/// median over the trials, with its range).
async fn floor(big_n: usize, rounds: usize) {
    use minimal::Keep;
    let server = start(MockOptions::default()).await.expect("mock starts");
    let url = format!("{}/v1", server.base_url());
    let scenario = format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true");
    let bodies = one_run_bodies(&url, &scenario, rounds).await;
    let template = Arc::new(minimal::Template::from_first_body(&bodies[0]));
    let client = bare_client(big_n);
    let a = agent(&url, &scenario, rounds);
    let endpoint = reqwest::Url::parse(&format!("{url}/chat/completions")).expect("a URL");
    let recorded: usize = bodies.iter().map(|b| b.len()).sum();
    for keep in [Keep::Bytes, Keep::Values, Keep::Messages, Keep::Record] {
        let (r, sent) = minimal::run(&client, &endpoint, &template, keep).await;
        assert_eq!(
            r,
            bodies.len(),
            "the minimal loop makes the real loop's requests"
        );
        // The same conversation, so the same bytes but for the call ids' digits and `null`
        // where the real loop sends `""` for an assistant's empty text.
        assert!(
            sent.abs_diff(recorded) * 20 < recorded,
            "{sent} bytes against {recorded}"
        );
    }
    println!(
        "floor: R={rounds} rounds of {PARALLEL} parallel calls (+1 answer round), {TRIALS} turns \
         of {TRIAL_SECS} s trials; rounds/s as a share of the ceiling (median, range)"
    );
    println!(
        "{:>6} {:>12} {:>17} {:>17} {:>17} {:>17} {:>17}",
        "N",
        "ceiling r/s",
        "toolloop",
        "minimal: values",
        "minimal: Message",
        "minimal: +record",
        "minimal: bytes"
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let cell = |v: Vec<f64>| {
        let (m, low, high) = median(v);
        format!(
            "{:.0}% ({:.0}–{:.0}%)",
            100.0 * m,
            100.0 * low,
            100.0 * high
        )
    };
    for n in [1usize, 100, big_n] {
        let nr = (n, rounds);
        raw_workers(&client, &url, &bodies, n, Work::Runs(1)).await;
        loop_workers(&a, n, rounds, Work::Runs(1)).await;
        for keep in [Keep::Bytes, Keep::Values, Keep::Messages, Keep::Record] {
            minimal_workers(&client, &url, &template, keep, nr, Work::Runs(1)).await;
        }
        let (mut ceilings, mut shares) = (Vec::new(), [(); 5].map(|_| Vec::new()));
        for _ in 0..TRIALS {
            let ceiling =
                sustained(TRIAL_SECS, |w| raw_workers(&client, &url, &bodies, n, w)).await;
            let l = sustained(TRIAL_SECS, |w| loop_workers(&a, n, rounds, w)).await;
            let v = sustained(TRIAL_SECS, |w| {
                minimal_workers(&client, &url, &template, Keep::Values, nr, w)
            })
            .await;
            let m = sustained(TRIAL_SECS, |w| {
                minimal_workers(&client, &url, &template, Keep::Messages, nr, w)
            })
            .await;
            let r = sustained(TRIAL_SECS, |w| {
                minimal_workers(&client, &url, &template, Keep::Record, nr, w)
            })
            .await;
            let b = sustained(TRIAL_SECS, |w| {
                minimal_workers(&client, &url, &template, Keep::Bytes, nr, w)
            })
            .await;
            ceilings.push(ceiling);
            for (share, rate) in shares.iter_mut().zip([l, v, m, r, b]) {
                share.push(rate / ceiling);
            }
        }
        let [l, v, m, r, b] = shares;
        println!(
            "{n:>6} {:>12.0} {:>17} {:>17} {:>17} {:>17} {:>17}",
            median(ceilings).0,
            cell(l),
            cell(v),
            cell(m),
            cell(r),
            cell(b),
        );
    }
    server.shutdown().await;
}

/// `n` workers each running whole loops, one after another; gives the rounds made.
async fn loop_workers(a: &Agent, n: usize, rounds: usize, work: Work) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut runs = 0;
                while work.more(runs) {
                    let o = a.prompt("go").await;
                    assert_eq!(o.rounds as usize, rounds + 1, "{:?}", o.error);
                    runs += 1;
                }
                runs * (rounds + 1)
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        done += t.await.expect("loop task");
    }
    done
}

/// `n` workers each running whole loops, one after another; gives the rounds made and the ids
/// of the runs (each checked to have answered).
async fn logged_workers(a: &Agent, n: usize, rounds: usize, work: Work) -> (usize, Vec<String>) {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while work.more(ids.len()) {
                    let o = a.prompt("go").await;
                    assert_eq!(o.rounds as usize, rounds + 1, "{:?}", o.error);
                    ids.push(o.run_id.expect("a logged run has an id"));
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.expect("loop task"));
    }
    (ids.len() * (rounds + 1), ids)
}

/// N journaled loops against the same loops without a journal, on each store (a SQLite file in
/// `TOOLLOOP_BENCH_DIR` or a temporary directory, both durability modes; PostgreSQL when
/// `TOOLLOOP_BENCH_POSTGRES` holds a URL): rounds/s as a ratio, in pairs of trials run one
/// after the other (the median pair's ratio, and the range), then every journaled run checked:
/// finished, with every record of a whole run.
async fn journal_cost(n: usize, rounds: usize) {
    use toolloop::journal::Journal;
    use toolloop_store::{Durability, RunStatus, Store};
    let server = start(MockOptions::default()).await.expect("mock starts");
    let url = format!("{}/v1", server.base_url());
    let scenario = format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true");
    let plain = agent(&url, &scenario, rounds);
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = std::env::var_os("TOOLLOOP_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let mut stores = Vec::new();
    for d in [Durability::Process, Durability::PowerCut] {
        let path = dir.join(format!("mock-loops-{}-{d:?}.db", std::process::id()));
        let store = Store::open_with(path.to_str().expect("a UTF-8 path"), d)
            .await
            .expect("the SQLite store opens");
        stores.push((format!("SQLite, {d:?}"), commit_delay(store), Some(path)));
    }
    if let Ok(pg) = std::env::var("TOOLLOOP_BENCH_POSTGRES") {
        let store = Store::open(&pg)
            .await
            .expect("TOOLLOOP_BENCH_POSTGRES opens");
        stores.push(("PostgreSQL".to_string(), commit_delay(store), None));
    }
    println!(
        "journal: N={n} loops of R={rounds} rounds of {PARALLEL} parallel calls (+1 answer round); \
         journaled vs no journal, {TRIALS} pairs of {TRIAL_SECS} s"
    );
    // Side-effecting tools (each round waits for its intents to be durable before its calls
    // run, and makes two commits), then read-only ones (one commit per round, no wait).
    for side_effect in [SideEffect::SideEffecting, SideEffect::ReadOnly] {
        // How many records a whole run writes.
        let memory = Arc::new(toolloop::journal::MemoryJournal::new());
        let one = journaled_agent_with(&url, &scenario, rounds, Some(memory.clone()), side_effect)
            .prompt("go")
            .await;
        let per_run = memory
            .load(one.run_id.as_deref().expect("an id"))
            .await
            .expect("a log")
            .len();
        println!("journal: {side_effect:?} tools: each run {per_run} records");
        // First a journal in memory: the driver's own share of the cost, with no store.
        let memory: Arc<dyn Journal> = Arc::new(toolloop::journal::MemoryJournal::new());
        let journals = std::iter::once(("in memory (no store)".to_string(), memory, None)).chain(
            stores.iter().map(|(name, store, _)| {
                let journal: Arc<dyn Journal> = Arc::new(store.clone());
                (name.clone(), journal, Some(store))
            }),
        );
        for (name, journal, store) in journals {
            let logged =
                journaled_agent_with(&url, &scenario, rounds, Some(journal.clone()), side_effect);
            loop_workers(&plain, n, rounds, Work::Runs(1)).await;
            let (_, warm) = logged_workers(&logged, n, rounds, Work::Runs(1)).await;
            let mut ids = warm;
            let before = store.map(|s| s.writer_stats()).unwrap_or_default();
            let mut pairs = Vec::new();
            for _ in 0..TRIALS {
                let base = sustained(TRIAL_SECS, |w| loop_workers(&plain, n, rounds, w)).await;
                let start = Instant::now();
                let end = start + std::time::Duration::from_secs_f64(TRIAL_SECS);
                let (done, trial_ids) = logged_workers(&logged, n, rounds, Work::Until(end)).await;
                let rps = done as f64 / start.elapsed().as_secs_f64();
                ids.extend(trial_ids);
                pairs.push((rps / base, base, rps));
            }
            pairs.sort_by(|x, y| x.0.total_cmp(&y.0));
            let (ratio, base, rps) = pairs[pairs.len() / 2];
            let shared = store.map(|s| {
                let after = s.writer_stats();
                let (commits, appends) = (
                    after.commits - before.commits,
                    after.appends - before.appends,
                );
                format!(
                    "; {:.1} steps per commit",
                    appends as f64 / commits.max(1) as f64
                )
            });
            // Every run finished, and its log is whole.
            let mut lost = 0;
            for id in &ids {
                let log = journal.load(id).await.unwrap_or_default();
                let finished = match store {
                    Some(store) => store
                        .run(id)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|r| r.status == RunStatus::Finished),
                    None => matches!(log.last(), Some(toolloop::journal::Record::Finished)),
                };
                if log.len() != per_run || !finished {
                    lost += 1;
                }
            }
            println!(
                "journal: {name}, {side_effect:?} tools: {rps:.0} rounds/s journaled vs {base:.0} \
                 without: {:.0}% (pairs: {:.0}–{:.0}%); {} runs checked, {lost} incomplete{}",
                100.0 * ratio,
                100.0 * pairs[0].0,
                100.0 * pairs[pairs.len() - 1].0,
                ids.len(),
                shared.unwrap_or_default(),
            );
        }
    }
    for (_, _, path) in &stores {
        if let Some(path) = path {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
    server.shutdown().await;
}

/// Streamed loops against the same loops with complete replies, at N=1 and N=`n`: the same
/// agent, adapter and mock, with `stream: true` (the mock answers with Server-Sent Events, text
/// and arguments in 16-character deltas, a usage chunk and `[DONE]`). Each plain trial is
/// followed by a streamed one, five times; the cost of a streamed round is the plain side's
/// rounds/s over the streamed side's, the median pair's (with the range). Every streamed run is
/// checked to have made its rounds, and one run of each kind to give the same transcript.
async fn stream_cost(n: usize, rounds: usize) {
    let server = start(MockOptions::default()).await.expect("mock starts");
    let url = format!("{}/v1", server.base_url());
    let scenario = format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true");
    let plain = streaming_agent(&url, &scenario, rounds, false);
    let streamed = streaming_agent(&url, &scenario, rounds, true);
    let (p, s) = (plain.prompt("go").await, streamed.prompt("go").await);
    assert!(
        p.error.is_none() && s.error.is_none(),
        "{:?} {:?}",
        p.error,
        s.error
    );
    assert_eq!(
        without_call_ids(&p.messages),
        without_call_ids(&s.messages),
        "a streamed run gives the transcript of a plain one"
    );
    println!(
        "stream: N loops of R={rounds} rounds of {PARALLEL} parallel calls (+1 answer round); \
         streamed vs complete replies, {TRIALS} pairs of {TRIAL_SECS} s"
    );
    println!(
        "{:>6} {:>14} {:>15} {:>16}",
        "N", "plain r/s", "streamed r/s", "streamed cost"
    );
    for n in [1, n] {
        loop_workers(&plain, n, rounds, Work::Runs(1)).await;
        loop_workers(&streamed, n, rounds, Work::Runs(1)).await;
        let mut pairs = Vec::new();
        for _ in 0..TRIALS {
            let base = sustained(TRIAL_SECS, |w| loop_workers(&plain, n, rounds, w)).await;
            let rps = sustained(TRIAL_SECS, |w| loop_workers(&streamed, n, rounds, w)).await;
            pairs.push((base / rps, base, rps));
        }
        pairs.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (ratio, base, rps) = pairs[pairs.len() / 2];
        println!(
            "{n:>6} {base:>14.0} {rps:>15.0} {ratio:>15.2}x   (pairs: {:.2}–{:.2}x)",
            pairs[0].0,
            pairs[pairs.len() - 1].0,
        );
    }
    server.shutdown().await;
}

/// A transcript as JSON with its call ids left out (the mock numbers them across runs).
fn without_call_ids(messages: &[toolloop::message::Message]) -> Value {
    let mut v = serde_json::to_value(messages).expect("a transcript serializes");
    for m in v.as_array_mut().into_iter().flatten() {
        if let Some(o) = m.as_object_mut() {
            o.remove("call_id");
        }
        for call in m
            .get_mut("tool_calls")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(o) = call.as_object_mut() {
                o.remove("id");
            }
        }
    }
    v
}

/// The store with the commit delay `TOOLLOOP_BENCH_COMMIT_DELAY_US` says (µs), and the writers
/// `TOOLLOOP_BENCH_WRITERS` says (PostgreSQL), where they say one.
fn commit_delay(store: toolloop_store::Store) -> toolloop_store::Store {
    let number = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok());
    let store = match number("TOOLLOOP_BENCH_WRITERS") {
        Some(n) => store.with_writers(n as usize),
        None => store,
    };
    match number("TOOLLOOP_BENCH_COMMIT_DELAY_US") {
        Some(us) => store.with_commit_delay(std::time::Duration::from_micros(us)),
        None => store,
    }
}

/// Rounds (or requests) per second of `side` run by `n` workers for about `secs` seconds.
async fn sustained<F: Future<Output = usize>>(secs: f64, side: impl FnOnce(Work) -> F) -> f64 {
    let start = Instant::now();
    let end = start + std::time::Duration::from_secs_f64(secs);
    let done = side(Work::Until(end)).await;
    done as f64 / start.elapsed().as_secs_f64()
}

/// The loop's own cost per round at N=1, on one thread (client, server and the kernel's loopback
/// share it, so thread wake-ups, which a virtual machine makes slow and noisy, do not count):
/// client time per round minus the server's processing time per request, beside a bare HTTP
/// request for the same bodies.
fn own_cost(rounds: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let server = start(MockOptions::default()).await.expect("mock starts");
        let url = format!("{}/v1", server.base_url());
        let scenario = format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true");
        let bodies = one_run_bodies(&url, &scenario, rounds).await;
        let a = agent(&url, &scenario, rounds);
        let runs = 400;
        // warm up
        let client = bare_client(1);
        raw_rate(&client, &url, &bodies, 1, 50).await;
        for _ in 0..50 {
            a.prompt("go").await;
        }
        let raw = raw_rate(&client, &url, &bodies, 1, runs).await;
        let before = server.stats();
        let start = Instant::now();
        for _ in 0..runs {
            let o = a.prompt("go").await;
            assert_eq!(o.rounds as usize, rounds + 1, "{:?}", o.error);
        }
        let elapsed = start.elapsed();
        let after = server.stats();
        let total_rounds = runs * (rounds + 1);
        let requests = (after.requests - before.requests).max(1);
        let server_us =
            (after.processing - before.processing).as_secs_f64() * 1e6 / requests as f64;
        let client_us = elapsed.as_secs_f64() * 1e6 / total_rounds as f64;
        let raw_us = 1e6 / raw;
        println!(
            "N=1 on one thread, per round: {client_us:.1} µs in all, of which the server {server_us:.1} µs; \
             own cost (client - server) {:.1} µs. A bare HTTP request of the same bodies takes {raw_us:.1} µs \
             in all, so the loop and the adapter add {:.1} µs per round ({:.2}x a bare request).",
            client_us - server_us,
            client_us - raw_us,
            client_us / raw_us,
        );
        server.shutdown().await;
    });
}

/// Serves the mock in this process (child mode) and prints its base URL.
fn serve_child() {
    // The child holds the server's side of every connection.
    if std::env::var_os("TOOLLOOP_BENCH_NOFILE_AS_IS").is_none() {
        let _ = toolloop::transport::raise_open_files_limit();
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let server = start(MockOptions::default()).await.expect("mock starts");
        println!("{}", server.base_url());
        std::future::pending::<()>().await;
    });
}

fn main() {
    if std::env::var_os("TOOLLOOP_BENCH_CHILD").is_some() {
        return serve_child();
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let big_n = args.first().copied().unwrap_or(1000);
    let rounds = args.get(1).copied().unwrap_or(5);
    // `latency=MS`: N loops at once against a slow mock, once (see the module's documentation).
    if let Some(ms) = std::env::args().skip(1).find_map(|a| {
        a.strip_prefix("latency=")
            .and_then(|v| v.parse::<u64>().ok())
    }) {
        let journal = std::env::args().skip(1).any(|a| a == "journal");
        return at_scale(big_n, rounds, ms, journal);
    }
    // `memory` after N and R measures only the heap per in-flight loop.
    if std::env::args().skip(1).any(|a| a == "memory") {
        return memory(big_n, rounds);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // `loop` or `raw` after N and R runs only that side at N for about 20 s, for a profiler
    // (`loop` journaled with `TOOLLOOP_BENCH_JOURNAL`: see `profile_side`).
    if let Some(side) = std::env::args()
        .skip(1)
        .find(|a| a == "loop" || a == "raw" || a == "minimal")
    {
        return rt.block_on(profile_side(&side, big_n, rounds));
    }
    // `stream` after N and R compares streamed loops with the same loops with complete replies.
    if std::env::args().skip(1).any(|a| a == "stream") {
        return rt.block_on(stream_cost(big_n, rounds));
    }
    // `floor` after N and R compares the loop with three hand-written minimal loops.
    if std::env::args().skip(1).any(|a| a == "floor") {
        return rt.block_on(floor(big_n, rounds));
    }
    // `journal` after N and R compares journaled loops with the same loops without a journal.
    if std::env::args().skip(1).any(|a| a == "journal") {
        return rt.block_on(journal_cost(big_n, rounds));
    }
    own_cost(rounds);
    rt.block_on(async move {
        let server = start(MockOptions::default()).await.expect("mock starts");
        let url = format!("{}/v1", server.base_url());
        let scenario = format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true");
        let bodies = one_run_bodies(&url, &scenario, rounds).await;
        let client = bare_client(big_n);
        let a = agent(&url, &scenario, rounds);

        println!("mock_loops: R={rounds} rounds of {PARALLEL} parallel calls (+1 answer round), OpenAI adapter over loopback HTTP");
        println!(
            "{:>6} {:>12} {:>10} {:>12} {:>10}",
            "N", "ceiling r/s", "loops/s", "rounds/s", "of ceiling"
        );
        for n in [1usize, 100, big_n] {
            // Warm up both sides at this concurrency (connections, allocator pages), then run
            // each side's workers steadily for a while, a ceiling trial and a loop trial one
            // after the other, several times. The ratio is the median of each pair's ratio, so
            // that the machine's load, which drifts, weighs on both sides of a ratio alike.
            raw_workers(&client, &url, &bodies, n, Work::Runs(1)).await;
            loop_workers(&a, n, rounds, Work::Runs(1)).await;
            let mut pairs = Vec::new();
            for _ in 0..TRIALS {
                let raw = sustained(TRIAL_SECS, |w| raw_workers(&client, &url, &bodies, n, w));
                let ceiling = raw.await;
                let rps = sustained(TRIAL_SECS, |w| loop_workers(&a, n, rounds, w)).await;
                pairs.push((rps / ceiling, ceiling, rps));
            }
            pairs.sort_by(|x, y| x.0.total_cmp(&y.0));
            let (ratio, ceiling, rps) = pairs[pairs.len() / 2];
            let (low, high) = (pairs[0].0, pairs[pairs.len() - 1].0);
            let loops = rps / (rounds + 1) as f64;
            println!(
                "{n:>6} {ceiling:>12.0} {loops:>10.1} {rps:>12.0} {:>9.0}%   (pairs: {:.0}–{:.0}%)",
                100.0 * ratio,
                100.0 * low,
                100.0 * high,
            );
        }
        server.shutdown().await;
    });
    memory(big_n, rounds);
}

/// Runs only the loops (or only the bare client) at `n` for about 20 s, so a profiler sees one
/// side; prints its rounds/s.
async fn profile_side(which: &str, n: usize, rounds: usize) {
    let looping = which == "loop";
    let server = start(MockOptions::default()).await.expect("mock starts");
    let url = format!("{}/v1", server.base_url());
    let scenario = format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true");
    let bodies = one_run_bodies(&url, &scenario, rounds).await;
    // `TOOLLOOP_BENCH_JOURNAL` (a store location, or `memory`) journals the loops, with a
    // read-only tool when `TOOLLOOP_BENCH_READ_ONLY` is set: a profile of the journaled side.
    let mut store = None;
    let journal: Option<Arc<dyn toolloop::journal::Journal>> =
        match std::env::var("TOOLLOOP_BENCH_JOURNAL") {
            Ok(m) if m == "memory" => Some(Arc::new(toolloop::journal::MemoryJournal::new())),
            Ok(location) => {
                let s = commit_delay(
                    toolloop_store::Store::open(&location)
                        .await
                        .expect("TOOLLOOP_BENCH_JOURNAL opens"),
                );
                store = Some(s.clone());
                Some(Arc::new(s))
            }
            Err(_) => None,
        };
    let side_effect = if std::env::var_os("TOOLLOOP_BENCH_READ_ONLY").is_some() {
        SideEffect::ReadOnly
    } else {
        SideEffect::SideEffecting
    };
    // `stream` after `loop`: the loops ask for streamed replies.
    let stream = std::env::args().skip(1).any(|a| a == "stream");
    let a = agent_of(&url, &scenario, rounds, journal, side_effect, stream);
    let client = bare_client(n);
    let template = Arc::new(minimal::Template::from_first_body(&bodies[0]));
    let (a, client, url, bodies, template) = (&a, &client, &url, &bodies, &template);
    let side = |secs: f64| async move {
        if looping {
            sustained(secs, |w| loop_workers(a, n, rounds, w)).await
        } else if which == "minimal" {
            let arg = |name: &str| std::env::args().skip(1).any(|a| a == name);
            let keep = if arg("values") {
                minimal::Keep::Values
            } else if arg("messages") {
                minimal::Keep::Messages
            } else if arg("record") {
                minimal::Keep::Record
            } else {
                minimal::Keep::Bytes
            };
            sustained(secs, |w| {
                minimal_workers(client, url, template, keep, (n, rounds), w)
            })
            .await
        } else {
            sustained(secs, |w| raw_workers(client, url, bodies, n, w)).await
        }
    };
    // Every allocation of the process (the mock's, in this process, included) is counted for
    // 2 s first: counting is one atomic that both threads write, which would slow the
    // allocations a profile sees, so the profiled 20 s run without it.
    ALLOCS.store(0, Ordering::Relaxed);
    COUNTING_ALLOCS.store(true, Ordering::Relaxed);
    let counted = Instant::now();
    let counted_rate = side(2.0).await;
    COUNTING_ALLOCS.store(false, Ordering::Relaxed);
    let counted_rounds = counted_rate * counted.elapsed().as_secs_f64();
    let allocs = ALLOCS.load(Ordering::Relaxed) as f64 / counted_rounds.max(1.0);
    let rate = side(20.0).await;
    let side = match (which, stream) {
        ("loop", true) => "streamed loop",
        ("loop", false) => "loop",
        ("minimal", _) => "minimal loop",
        _ => "bare client",
    };
    println!(
        "{side}: {rate:.0} rounds/s at N={n}; {allocs:.1} heap allocations per round (the whole process, the mock's included)"
    );
    if let Some(store) = store {
        let s = store.writer_stats();
        println!(
            "store: {} commits of {} steps ({:.1} per commit), {} records",
            s.commits,
            s.appends,
            s.appends as f64 / s.commits.max(1) as f64,
            s.records
        );
    }
    server.shutdown().await;
}

/// Memory per in-flight loop, with the mock in a child process so only the loops count.
fn memory(n: usize, rounds: usize) {
    let (url, mut child) = child_mock();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (peak, base, transcript) = rt.block_on(async move {
        let scenario =
            format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true,latency=300ms");
        let a = agent(&url, &scenario, rounds);
        // warm up with the same concurrency, so connection pools exist
        futures::future::join_all((0..n).map(|_| a.prompt("go"))).await;
        // Count from zero: frees of memory allocated before counting began may take LIVE below
        // zero, which only makes the figure conservative (the peak is over the same baseline).
        LIVE.store(0, Ordering::Relaxed);
        PEAK.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        let base = 0isize;
        // Each outcome is measured and dropped as it arrives, so the peak is the loops in flight.
        let mut running: futures::stream::FuturesUnordered<_> =
            (0..n).map(|_| a.prompt("go")).collect();
        let mut transcript_sum = 0usize;
        let mut finished = 0usize;
        while let Some(o) = futures::StreamExt::next(&mut running).await {
            transcript_sum += serde_json::to_string(&o.messages).map_or(0, |s| s.len());
            finished += 1;
        }
        COUNTING.store(false, Ordering::Relaxed);
        let peak = PEAK.load(Ordering::Relaxed);
        let transcript = transcript_sum / finished.max(1);
        (peak, base, transcript)
    });
    let _ = child.kill();
    let _ = child.wait();
    let per_loop = (peak - base).max(0) as f64 / n as f64;
    println!(
        "memory: {n} loops in flight: live heap grew by at most {:.1} MiB; {:.1} KiB per in-flight loop (its final transcript is {:.1} KiB as JSON), so {:.1} KiB besides the transcript; process peak RSS {} KiB",
        (peak - base) as f64 / 1048576.0,
        per_loop / 1024.0,
        transcript as f64 / 1024.0,
        (per_loop - transcript as f64).max(0.0) / 1024.0,
        rss_kib("VmHWM:"),
    );
}

/// A reqwest client builder, with the process's TLS crypto provider installed first (reqwest
/// builds its TLS configuration from it, even for plain HTTP).
#[allow(dead_code)]
fn http_client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// A reqwest client with the defaults.
#[allow(dead_code)]
fn http_client() -> reqwest::Client {
    http_client_builder()
        .build()
        .expect("the HTTP client builds")
}

/// Starts the mock in a child process (its base URL, with `/v1`, and the child).
fn child_mock() -> (String, std::process::Child) {
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .env("TOOLLOOP_BENCH_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("child starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("child prints its URL");
    (format!("{}/v1", line.trim()), child)
}

/// What went wrong in failed runs, by message, with the ones from the operating system
/// (`os error N`: descriptors, ports) counted apart.
#[derive(Default)]
struct Failures {
    by_message: std::collections::BTreeMap<String, usize>,
    os: usize,
}

impl Failures {
    fn add(&mut self, message: String) {
        // As the loop's errors say it (`os error 24`), or as reqwest's debug form does.
        if message.contains("os error") || message.contains("Os {") {
            self.os += 1;
        }
        *self.by_message.entry(message).or_default() += 1;
    }

    fn print(&self) {
        for (message, count) in self.by_message.iter().take(5) {
            println!("  {count} × {message}");
        }
    }
}

/// N loops of R rounds at once, once, against the mock answering after `ms` milliseconds;
/// journaled to SQLite in `process` mode with `journal`.
fn at_scale(n: usize, rounds: usize, ms: u64, journal: bool) {
    // `TOOLLOOP_BENCH_NOFILE_AS_IS` leaves the limit as it is, to see what it costs.
    let raised = match std::env::var_os("TOOLLOOP_BENCH_NOFILE_AS_IS") {
        Some(_) => Err(std::io::Error::other("TOOLLOOP_BENCH_NOFILE_AS_IS is set")),
        None => toolloop::transport::raise_open_files_limit(),
    };
    match raised {
        Ok(l) => println!(
            "open files: soft limit {:?} -> {:?} (hard {:?})",
            l.before, l.now, l.hard
        ),
        Err(e) => println!("open files: the soft limit could not be raised: {e}"),
    }
    let (url, mut child) = child_mock();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        use toolloop::journal::Journal;
        use toolloop_store::{Durability, RunStatus, Store};
        let scenario =
            format!("mock:rounds={rounds},parallel={PARALLEL},distinct=true,latency={ms}ms");
        let ideal = (rounds + 1) as f64 * ms as f64 / 1000.0;
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let store = if journal {
            let dir = std::env::var_os("TOOLLOOP_BENCH_DIR")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| tmp.path().to_path_buf());
            let path = dir.join(format!("mock-loops-scale-{}.db", std::process::id()));
            let store = Store::open_with(path.to_str().expect("a UTF-8 path"), Durability::Process)
                .await
                .expect("the SQLite store opens");
            Some((commit_delay(store), path))
        } else {
            None
        };
        println!(
            "at scale: N={n} loops of R={rounds} rounds of {PARALLEL} parallel calls (+1 answer round), \
             all at once, the mock (a child process) answering after {ms} ms{}; ideal {ideal:.2} s",
            if journal { ", journaled to SQLite (process)" } else { "" }
        );

        // The bare client alone: N tasks each sending a run's bodies, one after another.
        let bodies = one_run_bodies(&url, &scenario, rounds).await;
        let client = bare_client(n);
        let start = Instant::now();
        let endpoint = format!("{url}/chat/completions");
        let mut failures = Failures::default();
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let client = client.clone();
                let bodies = bodies.clone();
                let endpoint = endpoint.clone();
                tokio::spawn(async move {
                    for body in bodies {
                        let sent = client
                            .post(&endpoint)
                            .header("content-type", "application/json")
                            .body(body)
                            .send()
                            .await;
                        match sent {
                            Ok(r) if r.status().is_success() => {
                                if let Err(e) = r.bytes().await {
                                    return Err(format!("{e:?}"));
                                }
                            }
                            Ok(r) => return Err(format!("HTTP {}", r.status())),
                            Err(e) => return Err(format!("{e:?}")),
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut raw_done = 0;
        for t in tasks {
            match t.await.expect("task") {
                Ok(()) => raw_done += 1,
                Err(e) => failures.add(e),
            }
        }
        let raw_secs = start.elapsed().as_secs_f64();
        println!(
            "bare client: {raw_done}/{n} finished in {raw_secs:.2} s: {:.0} requests/s, {:.0}% of the ideal; {} OS errors",
            (raw_done * bodies.len()) as f64 / raw_secs,
            100.0 * ideal / raw_secs,
            failures.os,
        );
        failures.print();
        // Its connections go before the loops open theirs.
        drop(client);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;

        let logged: Option<Arc<dyn Journal>> = store.as_ref().map(|(s, _)| Arc::new(s.clone()) as _);
        let per_run = match &logged {
            Some(_) => {
                let memory = Arc::new(toolloop::journal::MemoryJournal::new());
                let one = journaled_agent(&url, &scenario, rounds, Some(memory.clone()))
                    .prompt("go")
                    .await;
                memory
                    .load(one.run_id.as_deref().expect("an id"))
                    .await
                    .expect("a log")
                    .len()
            }
            None => 0,
        };
        let a = journaled_agent(&url, &scenario, rounds, logged.clone());
        LIVE.store(0, Ordering::Relaxed);
        PEAK.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        let start = Instant::now();
        let mut running: futures::stream::FuturesUnordered<_> = (0..n)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.prompt("go").await })
            })
            .collect();
        let mut failures = Failures::default();
        let mut finished = 0usize;
        let mut ids = Vec::new();
        while let Some(o) = futures::StreamExt::next(&mut running).await {
            let o = o.expect("loop task");
            if o.rounds as usize == rounds + 1 && o.error.is_none() {
                finished += 1;
            } else {
                failures.add(match &o.error {
                    Some(e) => e.message.clone(),
                    None => format!("{} rounds", o.rounds),
                });
            }
            ids.extend(o.run_id);
        }
        let secs = start.elapsed().as_secs_f64();
        COUNTING.store(false, Ordering::Relaxed);
        let peak = PEAK.load(Ordering::Relaxed).max(0) as f64;
        println!(
            "loops: {finished}/{n} finished in {secs:.2} s: {:.0} requests/s, {:.0}% of the ideal, \
             {:.0}% of the bare client's time; {:.1} KiB of heap per in-flight loop at the peak \
             (transcripts and connections included); {} OS errors; process peak RSS {} KiB",
            (finished * (rounds + 1)) as f64 / secs,
            100.0 * ideal / secs,
            100.0 * raw_secs / secs,
            peak / n as f64 / 1024.0,
            failures.os,
            rss_kib("VmHWM:"),
        );
        failures.print();
        if let Some((store, path)) = store {
            let mut whole = 0;
            for id in &ids {
                let log = store.load(id).await.unwrap_or_default();
                let done = store
                    .run(id)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.status == RunStatus::Finished);
                if done && log.len() == per_run {
                    whole += 1;
                }
            }
            println!(
                "journal: {whole}/{n} runs finished with a whole log ({per_run} records each); {} ids",
                ids.len()
            );
            drop(store);
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    });
    let _ = child.kill();
    let _ = child.wait();
}
