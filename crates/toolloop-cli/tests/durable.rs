//! Durable runs, proved by killing the command: SIGKILL at random points and resume, two
//! resumes at once, Ctrl-C in `toolloop chat`. On SQLite, and on PostgreSQL when
//! `TOOLLOOP_TEST_POSTGRES` names a database (`.ci/run` always sets it).
//!
//! The agent's tool is the hidden test tool (`TOOLLOOP_TEST_EFFECTS`): a side-effecting call
//! that appends its idempotency key to a file, then waits. The model is the mock server (OpenAI
//! API), which also checks every request's transcript (each call answered exactly once).
//!
//! The test tool exists only in a binary built with the `test-hooks` feature:
//! `cargo test --workspace --features toolloop-cli/test-hooks` (the README's test command).
#![cfg(feature = "test-hooks")]

use crate::common;
use common::{json_of, mock};

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use toolloop::message::Message;
use toolloop::transcript::check_transcript;
use toolloop_store::{RunStatus, Store};

const BIN: &str = env!("CARGO_BIN_EXE_toolloop");

/// The stores to run against: a SQLite file, and PostgreSQL when configured.
fn locations(dir: &Path) -> Vec<(&'static str, String)> {
    let mut out = vec![(
        "sqlite",
        dir.join("store.db").to_string_lossy().into_owned(),
    )];
    match std::env::var("TOOLLOOP_TEST_POSTGRES") {
        Ok(url) if !url.trim().is_empty() => out.push(("postgres", url)),
        _ => eprintln!("note: TOOLLOOP_TEST_POSTGRES is not set; PostgreSQL runs skipped"),
    }
    out
}

/// A unique name, so runs of several tests can share one PostgreSQL database.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // A counter too: the crash test's workers ask at once.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{}-{nanos}-{n}", std::process::id())
}

/// SplitMix64: a seeded, reproducible sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Env<'a> {
    store: &'a str,
    effects: &'a Path,
    effect_ms: u64,
    base_url: &'a str,
    cwd: &'a Path,
}

fn command(env: &Env<'_>, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .current_dir(env.cwd)
        .env("TOOLLOOP_STORE", env.store)
        .env("TOOLLOOP_TEST_EFFECTS", env.effects)
        .env("TOOLLOOP_TEST_EFFECT_MS", env.effect_ms.to_string())
        .env("OPENAI_API_KEY", "test")
        .env_remove("TOOLLOOP_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run_args<'a>(model: &'a str, env: &Env<'a>, session: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--json",
        "--model",
        model,
        "--base-url",
        env.base_url,
        "--max-rounds",
        "20",
        "--max-tool-calls",
        "100",
        "--session",
        session,
        "go",
    ]
}

fn effect_counts(path: &Path) -> HashMap<String, u32> {
    let mut counts = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(path) {
        for line in text.lines().filter(|l| !l.is_empty()) {
            *counts.entry(line.to_string()).or_default() += 1;
        }
    }
    counts
}

/// What the crash test's workers share: the model, the mock's URL, the directory of the
/// stores and effects, the test's runtime, and how many workers each store gets.
#[derive(Clone, Copy)]
struct CrashTest<'a> {
    seed: u64,
    workers: u32,
    model: &'a str,
    base_url: &'a str,
    dir: &'a Path,
    rt: &'a tokio::runtime::Runtime,
}

/// One store under the crash test: its kind (for messages), the command's environment, the
/// durability asked for, and the test's own handle on the store.
struct CrashStore<'a> {
    kind: &'a str,
    env: Env<'a>,
    durability: Option<&'a str>,
    store: Store,
    test: CrashTest<'a>,
}

/// What one worker of the crash test saw: its kills, and its finished jobs.
#[derive(Default)]
struct CrashJobs {
    kills: u32,
    restarts_from_scratch: u32,
    outcomes: Vec<Value>,
    sessions: Vec<String>,
}

/// Runs crash-test jobs one after another until `kills_wanted` SIGKILLs have landed: each job
/// is started, killed after a random delay (from `rng`), resumed (or started again when it died
/// before its first record), and killed again, until it finishes.
fn crash_jobs(store: &CrashStore<'_>, mut rng: Rng, kills_wanted: u32) -> CrashJobs {
    let CrashStore {
        kind,
        env,
        durability,
        store,
        test,
    } = store;
    let (model, rt) = (test.model, test.rt);
    let mut seen = CrashJobs::default();
    while seen.kills < kills_wanted {
        let session = unique(&format!("crash-{kind}"));
        let mut run_id: Option<String> = None;
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            assert!(attempts < 200, "{kind}: a job never finished");
            let args: Vec<&str> = match &run_id {
                None => run_args(model, env, &session),
                Some(id) => vec!["resume", "--json", id.as_str()],
            };
            let mut cmd = command(env, &args);
            if let Some(durability) = durability {
                cmd.env("TOOLLOOP_DURABILITY", durability);
            }
            let mut child = cmd.spawn().unwrap();
            let delay = Duration::from_millis(rng.below(450));
            let deadline = Instant::now() + delay;
            let mut done = None;
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait().unwrap() {
                    done = Some(status);
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if done.is_none() {
                child.kill().unwrap(); // SIGKILL
            }
            let out = child.wait_with_output().unwrap();
            if done.is_some() {
                assert_eq!(
                    out.status.code(),
                    Some(0),
                    "{kind}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                break json_of(&out);
            }
            seen.kills += 1;
            if run_id.is_none() {
                let runs = rt.block_on(store.runs(Some(&session))).unwrap();
                assert!(runs.len() <= 1, "{kind}: one run per job");
                match runs.first() {
                    Some(r) => {
                        assert_ne!(
                            r.status,
                            RunStatus::Running,
                            "{kind}: the killed holder is seen dead"
                        );
                        run_id = Some(r.run_id.clone());
                    }
                    None => seen.restarts_from_scratch += 1,
                }
            }
        };
        seen.outcomes.push(outcome);
        seen.sessions.push(session);
    }
    seen
}

/// The crash test. Each job is a 4-round run of 2 parallel side-effecting calls; the process
/// is killed with SIGKILL after a random delay, then resumed (or started again when it died
/// before its first record), and killed again, until it finishes. Every call's effect must
/// have happened exactly once, or the call must be reported unknown (effect 0 or 1 times);
/// never twice.
///
/// The jobs spend their time waiting (on the model's latency, the tools' delay, and the
/// delay before each kill), so the stores are tested at once, each by `WORKERS` jobs at a
/// time that share its file or database (as processes of one user do), each worker with a
/// random sequence of its own (seeded from the test's seed) and its share of the kills.
#[test]
fn runs_killed_at_random_points_resume_with_every_effect_at_most_once() {
    const KILLS: u32 = 110;
    const WORKERS: u32 = 2;
    let seed: u64 = std::env::var("TOOLLOOP_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_122);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let model = "openai:mock:rounds=4,parallel=2,latency=25ms";
    // Both stores at the default durability (`process`), and SQLite at `power` too (fewer
    // kills: the same code, another sync mode).
    let mut cases: Vec<(&str, String, Option<&str>, u32)> = locations(dir.path())
        .into_iter()
        .map(|(kind, location)| (kind, location, None, KILLS))
        .collect();
    cases.push((
        "sqlite, power",
        dir.path().join("power.db").to_string_lossy().into_owned(),
        Some("power"),
        KILLS / 2,
    ));
    let test = CrashTest {
        seed,
        workers: WORKERS,
        model,
        base_url: &base_url,
        dir: dir.path(),
        rt: &rt,
    };
    std::thread::scope(|scope| {
        let cases: Vec<_> = cases
            .into_iter()
            .map(|(kind, location, durability, kills_wanted)| {
                scope.spawn(move || crash_case(test, kind, &location, durability, kills_wanted))
            })
            .collect();
        for case in cases {
            case.join().unwrap();
        }
    });
    assert_eq!(
        server.stats().rejected,
        0,
        "the mock saw an invalid transcript"
    );
    rt.block_on(server.shutdown());
}

/// One store's part of the crash test: `kills_wanted` kills spread over `workers` concurrent
/// workers, then the checks on every job's outcome, effects and session.
fn crash_case(
    test: CrashTest<'_>,
    kind: &str,
    location: &str,
    durability: Option<&str>,
    kills_wanted: u32,
) {
    let CrashTest {
        seed,
        workers,
        dir,
        rt,
        ..
    } = test;
    let started = Instant::now();
    let effects = dir.join(format!("effects-{}.txt", kind.replace(", ", "-")));
    let case = CrashStore {
        kind,
        env: Env {
            store: location,
            effects: &effects,
            effect_ms: 30,
            base_url: test.base_url,
            cwd: dir,
        },
        durability,
        store: rt.block_on(Store::open(location)).unwrap(),
        test,
    };
    let store = &case.store;
    // Each worker's share of the kills, and a sequence of its own (the seed, moved on by
    // the worker's number: SplitMix64 streams from different states).
    let seen: Vec<CrashJobs> = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..workers)
            .map(|w| {
                let share = kills_wanted / workers + u32::from(w < kills_wanted % workers);
                let rng = Rng(seed.wrapping_add(u64::from(w).wrapping_mul(0x5851_F42D_4C95_7F2D)));
                let case = &case;
                scope.spawn(move || crash_jobs(case, rng, share))
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let kills: u32 = seen.iter().map(|s| s.kills).sum();
    let restarts_from_scratch: u32 = seen.iter().map(|s| s.restarts_from_scratch).sum();
    let outcomes: Vec<&Value> = seen.iter().flat_map(|s| &s.outcomes).collect();
    let sessions: Vec<&String> = seen.iter().flat_map(|s| &s.sessions).collect();
    assert!(kills >= kills_wanted, "{kind}: {kills} kills");

    // Every effect at most once; every finished call exactly once; unknown calls 0 or 1.
    let counts = effect_counts(&effects);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{kind}: effects repeated: {twice:?}");
    let mut keys_in_outcomes = HashSet::new();
    let (mut ok, mut unknown, mut unknown_done) = (0, 0, 0);
    for o in &outcomes {
        assert_eq!(o["stop_reason"], "answered", "{kind}: {o}");
        assert_eq!(
            o["text"], "Done. I saw 8 tool results in 4 rounds.",
            "{kind}"
        );
        let run_id = o["run_id"].as_str().unwrap();
        for c in o["tool_calls"].as_array().unwrap() {
            let key = format!("{run_id}/{}", c["id"].as_str().unwrap());
            let n = counts.get(&key).copied().unwrap_or(0);
            match c["status"].as_str().unwrap() {
                "ok" => {
                    ok += 1;
                    assert_eq!(
                        n, 1,
                        "{kind}: {key} finished but its effect happened {n} times"
                    );
                }
                "unknown" => {
                    unknown += 1;
                    unknown_done += n;
                    assert!(n <= 1, "{kind}: {key}");
                }
                other => panic!("{kind}: call {key} ended {other}"),
            }
            keys_in_outcomes.insert(key);
        }
    }
    for key in counts.keys() {
        assert!(
            keys_in_outcomes.contains(key),
            "{kind}: effect {key} belongs to no call of a finished run"
        );
    }
    // The sessions hold valid transcripts ending with the answer.
    for s in &sessions {
        let messages = rt.block_on(store.session_messages(s)).unwrap();
        assert!(check_transcript(&messages).is_empty(), "{kind}: {s}");
        assert!(
            matches!(messages.last(), Some(Message::Assistant(_))),
            "{kind}: session {s} ends with {:?}; runs {:?}",
            messages.last(),
            rt.block_on(store.runs(Some(s)))
                .unwrap()
                .iter()
                .map(|r| (r.run_id.clone(), r.status))
                .collect::<Vec<_>>()
        );
    }
    assert!(
        unknown > 0 && ok > 0,
        "{kind}: kills landed both in and out of tool calls"
    );
    eprintln!(
        "crash test ({kind}, seed {seed}, {workers} jobs at a time): {kills} SIGKILLs over {} \
         runs ({restarts_from_scratch} killed before their first record); calls: {ok} ok, \
         {unknown} outcome unknown ({unknown_done} of which had taken effect); no effect \
         twice; {:.1}s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Starts a run whose only call is slow, and kills it while the call is in flight.
fn interrupted_run(
    env: &Env<'_>,
    model: &str,
    session: &str,
    store: &Store,
    rt: &tokio::runtime::Runtime,
) -> String {
    let mut child = command(env, &run_args(model, env, session))
        .spawn()
        .unwrap();
    wait_for_effects(
        env.effects,
        effect_counts(env.effects).len() + 1,
        &mut child,
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let runs = rt.block_on(store.runs(Some(session))).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Interrupted);
    runs[0].run_id.clone()
}

fn wait_for_effects(path: &Path, n: usize, child: &mut Child) {
    let start = Instant::now();
    while effect_counts(path).values().sum::<u32>() < n as u32 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no tool call started"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the command ended ({status}) before its tool call started");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_processes_resuming_one_run_one_wins_the_other_gets_a_clear_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    for (kind, location) in locations(dir.path()) {
        let effects = dir.path().join(format!("two-{kind}.txt"));
        let env = Env {
            store: &location,
            effects: &effects,
            effect_ms: 5_000,
            base_url: &base_url,
            cwd: dir.path(),
        };
        let store = rt.block_on(Store::open(&location)).unwrap();
        let session = unique("two");
        // A slow model keeps the winner holding the run while the loser tries.
        let run_id = interrupted_run(
            &env,
            "openai:mock:rounds=1,latency=1500ms",
            &session,
            &store,
            &rt,
        );
        let a = command(&env, &["resume", "--json", &run_id])
            .spawn()
            .unwrap();
        let b = command(&env, &["resume", "--json", &run_id])
            .spawn()
            .unwrap();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let (won, lost) = if a.status.success() { (a, b) } else { (b, a) };
        assert!(
            won.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&won.stderr)
        );
        assert_eq!(lost.status.code(), Some(1), "{kind}");
        let err = String::from_utf8_lossy(&lost.stderr);
        assert!(
            err.contains(&format!("run {run_id} is held by another process"))
                && err.contains("pid"),
            "{kind}: {err}"
        );
        let v = json_of(&won);
        assert_eq!(v["stop_reason"], "answered");
        assert_eq!(v["tool_calls"][0]["status"], "unknown", "{kind}");
        // The effect happened once (before the kill) and was not repeated.
        assert_eq!(
            effect_counts(&effects)
                .values()
                .copied()
                .collect::<Vec<_>>(),
            vec![1]
        );
        let runs = rt.block_on(store.runs(Some(&session))).unwrap();
        assert_eq!(runs[0].status, RunStatus::Finished, "{kind}");
    }
    assert_eq!(server.stats().rejected, 0);
    rt.block_on(server.shutdown());
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

#[test]
fn chat_survives_ctrl_c_in_the_middle_of_a_tool_call_with_a_valid_session() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    for (kind, location) in locations(dir.path()) {
        let effects = dir.path().join(format!("chat-{kind}.txt"));
        let env = Env {
            store: &location,
            effects: &effects,
            effect_ms: 1_500,
            base_url: &base_url,
            cwd: dir.path(),
        };
        let session = unique("chat");
        let chat_args = [
            "chat",
            "--session",
            &session,
            "--model",
            "openai:mock:rounds=1",
            "--base-url",
            &base_url,
        ];
        let mut chat = command(&env, &chat_args)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = chat.stdin.take().unwrap();
        writeln!(stdin, "first").unwrap();
        wait_for_effects(&effects, 1, &mut chat);
        signal(&chat, "-INT"); // Ctrl-C while the call runs
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            chat.try_wait().unwrap().is_none(),
            "{kind}: one Ctrl-C does not quit"
        );
        writeln!(stdin, "second").unwrap();
        drop(stdin); // then end of input
        let out = chat.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{kind}: {stderr}");
        assert!(stderr.contains("stopped: cancelled"), "{kind}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout)
                .contains("Done. I saw 1 tool results in 1 rounds."),
            "{kind}: the second message was answered"
        );

        // The session is valid and holds both turns; the cancelled call has its result.
        let show = command(&env, &["sessions", "show", "--json", &session])
            .output()
            .unwrap();
        let v = json_of(&show);
        let messages: Vec<Message> = serde_json::from_value(v["messages"].clone()).unwrap();
        assert!(
            check_transcript(&messages).is_empty(),
            "{kind}: {messages:?}"
        );
        assert!(v["repairs"].as_array().unwrap().is_empty());
        let users: Vec<&str> = messages
            .iter()
            .filter_map(|m| match m {
                Message::User { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(users, ["first", "second"], "{kind}");
        let first_result = messages
            .iter()
            .find_map(|m| match m {
                Message::Tool(r) => Some(r),
                _ => None,
            })
            .unwrap();
        assert!(first_result.is_error, "{kind}: {first_result:?}");

        // The conversation goes on from the command line.
        let out = command(&env, &run_args("openai:mock:rounds=0", &env, &session))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list = command(&env, &["sessions", "list", "--json"])
            .output()
            .unwrap();
        let list = json_of(&list);
        let entry = list
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == session.as_str())
            .unwrap();
        assert_eq!(entry["runs"], 3, "{kind}");
        assert_eq!(
            entry["message_count"],
            (messages.len() + 2) as u64,
            "{kind}"
        );

        // A second Ctrl-C while cancelling quits; Ctrl-C at the prompt quits.
        let mut chat = command(&env, &chat_args)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = chat.stdin.take().unwrap();
        let before = effect_counts(&effects).values().sum::<u32>() as usize;
        writeln!(stdin, "third").unwrap();
        wait_for_effects(&effects, before + 1, &mut chat);
        signal(&chat, "-INT");
        std::thread::sleep(Duration::from_millis(100));
        signal(&chat, "-INT");
        let status = wait_timeout(&mut chat, Duration::from_secs(10));
        assert_eq!(status, Some(130), "{kind}: a second Ctrl-C quits");
        let mut chat = command(&env, &chat_args)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let _stdin = chat.stdin.take().unwrap();
        wait_for_line(&mut chat, "toolloop chat");
        signal(&chat, "-INT");
        let status = wait_timeout(&mut chat, Duration::from_secs(10));
        assert_eq!(status, Some(0), "{kind}: Ctrl-C at the prompt quits");
        // Whatever the quit left behind, the session still loads valid.
        let show = command(&env, &["sessions", "show", "--json", &session])
            .output()
            .unwrap();
        let v = json_of(&show);
        let messages: Vec<Message> = serde_json::from_value(v["messages"].clone()).unwrap();
        assert!(check_transcript(&messages).is_empty(), "{kind}");
    }
    assert_eq!(server.stats().rejected, 0);
    rt.block_on(server.shutdown());
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("the command did not quit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the child's stderr shows `needle` (its banner: the signal handler is set).
fn wait_for_line(child: &mut Child, needle: &str) {
    let stderr = child.stderr.take().unwrap();
    let mut reader = std::io::BufReader::new(stderr);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "stderr closed before `{needle}`");
        if line.contains(needle) {
            // Keep reading, so the child never writes to a closed pipe.
            std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
            // Give the handler a moment: it is set right after the banner.
            std::thread::sleep(Duration::from_millis(200));
            return;
        }
    }
}

#[test]
fn resume_and_sessions_report_unknown_names_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let store = store.to_string_lossy();
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("TOOLLOOP_STORE", store.as_ref())
            .output()
            .unwrap()
    };
    let out = run(&["resume", "run_nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run with id run_nope"));
    let out = run(&["sessions", "show", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session named `nope`"));
    let out = run(&["sessions", "rm", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["sessions", "list", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let bad = dir.path().join("file");
    std::fs::write(&bad, "x").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--store", &format!("{}/db", bad.display()), "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open the store"));
    let _: PathBuf = dir.path().to_path_buf();
}

/// The user messages of a session, in order.
fn user_turns(store: &Store, rt: &tokio::runtime::Runtime, session: &str) -> Vec<String> {
    rt.block_on(store.session_messages(session))
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            Message::User { content, .. } => Some(content),
            _ => None,
        })
        .collect()
}

/// `run --session` with a prompt of its own.
fn turn_args<'a>(model: &'a str, env: &Env<'a>, session: &'a str, prompt: &'a str) -> Vec<&'a str> {
    let mut args = run_args(model, env, session);
    *args.last_mut().unwrap() = prompt;
    args
}

#[test]
fn resuming_an_older_run_never_drops_the_later_turns_of_its_session() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    for (kind, location) in locations(dir.path()) {
        let effects = dir.path().join(format!("older-{kind}.txt"));
        let env = Env {
            store: &location,
            effects: &effects,
            effect_ms: 5_000,
            base_url: &base_url,
            cwd: dir.path(),
        };
        let store = rt.block_on(Store::open(&location)).unwrap();
        let session = unique("older");
        // A run killed in its tool call ("go"), then a later turn that finishes.
        let interrupted = interrupted_run(&env, "openai:mock:rounds=1", &session, &store, &rt);
        let later = command(
            &env,
            &turn_args("openai:mock:rounds=0", &env, &session, "later"),
        )
        .output()
        .unwrap();
        assert!(
            later.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&later.stderr)
        );
        let finished = json_of(&later)["run_id"].as_str().unwrap().to_string();
        assert_eq!(user_turns(&store, &rt, &session), ["later"], "{kind}");

        // Continuing the interrupted run would put the session back before "later": refused.
        let out = command(&env, &["resume", "--json", &interrupted])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{kind}: {err}");
        assert!(
            err.contains(&format!(
                "session `{session}` has had turns saved since run {interrupted}"
            )),
            "{kind}: {err}"
        );
        assert_eq!(user_turns(&store, &rt, &session), ["later"], "{kind}");
        let runs = rt.block_on(store.runs(Some(&session))).unwrap();
        let run = runs.iter().find(|r| r.run_id == interrupted).unwrap();
        assert_eq!(run.status, RunStatus::Interrupted, "{kind}: left as it was");

        // Resuming an older finished run gives its outcome and leaves the session alone.
        let last = command(
            &env,
            &turn_args("openai:mock:rounds=0", &env, &session, "last"),
        )
        .output()
        .unwrap();
        assert!(last.status.success(), "{kind}");
        let before = rt.block_on(store.session_messages(&session)).unwrap();
        let out = command(&env, &["resume", "--json", &finished])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(json_of(&out)["run_id"], finished.as_str(), "{kind}");
        assert_eq!(
            rt.block_on(store.session_messages(&session)).unwrap(),
            before,
            "{kind}: the session keeps every turn"
        );
        assert_eq!(
            user_turns(&store, &rt, &session),
            ["later", "last"],
            "{kind}"
        );
    }
    assert_eq!(server.stats().rejected, 0);
    rt.block_on(server.shutdown());
}

#[test]
fn two_runs_of_one_session_at_once_never_lose_a_turn_silently() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    for (kind, location) in locations(dir.path()) {
        let effects = dir.path().join(format!("both-{kind}.txt"));
        let env = Env {
            store: &location,
            effects: &effects,
            effect_ms: 10,
            base_url: &base_url,
            cwd: dir.path(),
        };
        let store = rt.block_on(Store::open(&location)).unwrap();
        let session = unique("both");
        // A slow model keeps the first run going while the second starts.
        let model = "openai:mock:rounds=0,latency=1500ms";
        let a = command(&env, &turn_args(model, &env, &session, "alpha"))
            .spawn()
            .unwrap();
        let b = command(&env, &turn_args(model, &env, &session, "beta"))
            .spawn()
            .unwrap();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let turns = user_turns(&store, &rt, &session);
        // Whatever ran to success is in the session; whatever is not was refused loudly.
        for (prompt, out) in [("alpha", &a), ("beta", &b)] {
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                assert!(
                    turns.iter().any(|t| t == prompt),
                    "{kind}: {prompt} lost: {turns:?}"
                );
            } else {
                assert_eq!(out.status.code(), Some(1), "{kind}: {err}");
                assert!(
                    err.contains(&format!("session `{session}` is in use by pid")),
                    "{kind}: {err}"
                );
            }
        }
        assert_eq!(
            [&a, &b].iter().filter(|o| o.status.success()).count(),
            1,
            "{kind}: one at a time"
        );
        // The session is free again: the next turn follows the first.
        let next = command(
            &env,
            &turn_args("openai:mock:rounds=0", &env, &session, "next"),
        )
        .output()
        .unwrap();
        assert!(
            next.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&next.stderr)
        );
        assert_eq!(user_turns(&store, &rt, &session).len(), 2, "{kind}");
    }
    assert_eq!(server.stats().rejected, 0);
    rt.block_on(server.shutdown());
}

#[test]
fn an_in_memory_store_works_for_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "run",
            "--json",
            "--store",
            ":memory:",
            "--session",
            "s",
            "hello",
        ])
        .current_dir(dir.path())
        .env_remove("TOOLLOOP_MODEL")
        .output()
        .unwrap();
    let v = json_of(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["stop_reason"], "answered");
    assert!(v["run_id"].as_str().is_some());
    // Nothing was written next to it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Every byte the store keeps: the SQLite files, or on PostgreSQL the runs' saved
/// configurations and logs.
fn stored_text(
    kind: &str,
    location: &str,
    store: &Store,
    rt: &tokio::runtime::Runtime,
    runs: &[String],
) -> String {
    if kind == "sqlite" {
        let mut all = Vec::new();
        let path = Path::new(location);
        for entry in std::fs::read_dir(path.parent().unwrap()).unwrap() {
            let p = entry.unwrap().path();
            if p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(path.file_name().unwrap().to_str().unwrap())
            {
                all.extend(std::fs::read(p).unwrap());
            }
        }
        return String::from_utf8_lossy(&all).into_owned();
    }
    let mut text = String::new();
    for id in runs {
        let (_, meta) = rt.block_on(store.run_tags(id)).unwrap().unwrap();
        text.push_str(&meta.unwrap().to_string());
        for r in rt
            .block_on(toolloop::journal::Journal::load(store, id))
            .unwrap()
        {
            text.push_str(&serde_json::to_string(&r).unwrap());
        }
    }
    text
}

#[test]
fn credentials_in_urls_are_never_stored_and_resume_asks_for_them() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let port = server.base_url().rsplit(':').next().unwrap().to_string();
    let secret_url = format!("http://me:hunter2@127.0.0.1:{port}/v1");
    let keyed_url = format!("http://127.0.0.1:{port}/v1?key=sekrit");
    let dir = tempfile::tempdir().unwrap();
    for (kind, location) in locations(dir.path()) {
        let effects = dir.path().join(format!("secret-{kind}.txt"));
        let env = Env {
            store: &location,
            effects: &effects,
            effect_ms: 5_000,
            base_url: &secret_url,
            cwd: dir.path(),
        };
        let store = rt.block_on(Store::open(&location)).unwrap();
        let session = unique("secret");
        let interrupted = interrupted_run(&env, "openai:mock:rounds=1", &session, &store, &rt);
        // A key in the query: such a base URL is refused before anything runs or is stored.
        let keyed_env = Env {
            base_url: &keyed_url,
            ..env
        };
        let keyed_session = unique("keyed");
        let out = command(
            &keyed_env,
            &run_args("openai:mock:rounds=0", &keyed_env, &keyed_session),
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(2), "{kind}");
        let env = Env {
            base_url: &secret_url,
            ..keyed_env
        };

        let text = stored_text(
            kind,
            &location,
            &store,
            &rt,
            std::slice::from_ref(&interrupted),
        );
        assert!(!text.is_empty(), "{kind}");
        for secret in ["hunter2", "sekrit", "//me"] {
            assert!(!text.contains(secret), "{kind}: `{secret}` is in the store");
        }

        // Resume needs the URL again, and says so.
        let out = command(&env, &["resume", "--json", &interrupted])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{kind}: {err}");
        assert!(
            err.contains("--base-url") && err.contains("never stored"),
            "{kind}: {err}"
        );
        let out = command(
            &env,
            &["resume", "--json", &interrupted, "--base-url", &secret_url],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(json_of(&out)["stop_reason"], "answered", "{kind}");
        let text = stored_text(
            kind,
            &location,
            &store,
            &rt,
            std::slice::from_ref(&interrupted),
        );
        assert!(!text.contains("hunter2"), "{kind}: stored on resume");
    }
    rt.block_on(server.shutdown());
}

#[test]
fn no_store_writes_nothing_and_power_durability_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("never").join("store.db");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .env("TOOLLOOP_STORE", &store)
            .env_remove("TOOLLOOP_MODEL")
            .env_remove("TOOLLOOP_DURABILITY")
            .output()
            .unwrap()
    };
    for flags in [&["--no-store"][..], &["--durability", "none"][..]] {
        let mut args = vec!["run", "--json"];
        args.extend_from_slice(flags);
        args.push("hello");
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json_of(&out);
        assert_eq!(v["stop_reason"], "answered");
        assert!(v["run_id"].is_null(), "{v}");
        assert!(!store.parent().unwrap().exists(), "{flags:?} wrote nothing");
        // A session lives in the store: refused.
        let mut args = vec!["run", "--session", "s"];
        args.extend_from_slice(flags);
        args.push("hello");
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2));
    }
    let out = run(&[
        "run",
        "--json",
        "--durability",
        "power",
        "--session",
        "p",
        "hello",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(store.exists());
    // The command closed its store and left its short log in place (copying it in would sync
    // the disk at every command's end and start); the next command reads the session from it.
    let wal = store.with_file_name("store.db-wal");
    let kept = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(kept < 1 << 20, "{} is {kept} bytes", wal.display());
    let out = run(&[
        "run",
        "--json",
        "--durability",
        "power",
        "--session",
        "p",
        "again",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["sessions", "show", "p", "--json"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("hello") && shown.contains("again"),
        "{shown}"
    );
    let out = run(&["run", "--durability", "sometimes", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--durability"));
}
