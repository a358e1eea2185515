//! The context policy through the command: a run killed with SIGKILL while its conversation is
//! being summarised, and again just after the summary was logged, resumes without asking for a
//! logged summary again (the mock counts the summarising requests), and finishes.
//!
//! The agent's tools are the hidden test tools (`TOOLLOOP_TEST_EFFECTS`), in a binary built
//! with the `test-hooks` feature.
#![cfg(feature = "test-hooks")]

use crate::common;
use common::json_of;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use toolloop::engine::Input;
use toolloop::journal::Journal;
use toolloop_store::Store;

const BIN: &str = env!("CARGO_BIN_EXE_toolloop");

fn command(store: &str, effects: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("TOOLLOOP_STORE", store)
        .env("TOOLLOOP_TEST_EFFECTS", effects)
        .env("OPENAI_API_KEY", "test")
        .env_remove("TOOLLOOP_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The run's logged compactions.
fn compactions(store: &Store, rt: &tokio::runtime::Runtime, run_id: &str) -> usize {
    rt.block_on(store.load(run_id))
        .map(|records| {
            records
                .iter()
                .filter(|r| matches!(r, Input::Compacted { .. }))
                .count()
        })
        .unwrap_or(0)
}

/// Waits until `done` holds (polling), failing if the child ends first.
fn wait_until(child: &mut Child, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.stderr.take().map(|mut e| {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut e, &mut s);
                s
            });
            panic!("the command ended ({status}) before {what}: {out:?}");
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_run_killed_during_and_after_a_compaction_asks_for_each_summary_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("store.db").to_string_lossy().into_owned();
    let effects = dir.path().join("effects.txt");
    let store = rt.block_on(Store::open(&location)).unwrap();
    // Each response waits 150 ms: a kill lands inside the request it aims at.
    let model = "openai:mock:rounds=40,latency=150ms,distinct=true";
    let args = [
        "run",
        "--json",
        "--model",
        model,
        "--base-url",
        &base_url,
        "--max-rounds",
        "60",
        "--max-tool-calls",
        "100",
        "--context-window",
        "2500",
        "--compact-at",
        "0.5",
        "--keep-rounds",
        "3",
        "--session",
        "ctx",
        "go",
    ];

    // 1. Killed while the first summary is being written.
    let mut child = command(&location, &effects, &args).spawn().unwrap();
    wait_until(&mut child, "the first summary was asked", || {
        server.stats().summaries >= 1
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let runs = rt.block_on(store.runs(Some("ctx"))).unwrap();
    assert_eq!(runs.len(), 1);
    let run_id = runs[0].run_id.clone();
    assert_eq!(
        compactions(&store, &rt, &run_id),
        0,
        "killed before the summary came back"
    );
    let asked_before_resume = server.stats().summaries;
    assert_eq!(asked_before_resume, 1);

    // 2. Resumed: the summary is asked again, once; killed once it is logged (the next model
    //    call is in flight).
    let mut child = command(&location, &effects, &["resume", "--json", &run_id])
        .spawn()
        .unwrap();
    wait_until(&mut child, "the summary was logged", || {
        compactions(&store, &rt, &run_id) >= 1
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let logged = compactions(&store, &rt, &run_id);
    assert_eq!(server.stats().summaries, 1 + logged as u64);

    // 3. Resumed to the end: no logged summary is asked for again.
    let out = command(&location, &effects, &["resume", "--json", &run_id])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome = json_of(&out);
    assert_eq!(outcome["stop_reason"], "answered", "{outcome}");
    let logged = compactions(&store, &rt, &run_id);
    assert!(logged >= 2, "{logged} compactions");
    // One summary per logged compaction, plus the one lost to the first kill.
    assert_eq!(server.stats().summaries, logged as u64 + 1);
    assert_eq!(server.stats().context_refusals, 0);
    // The session goes on from the compacted conversation.
    let session = rt.block_on(store.session_messages("ctx")).unwrap();
    assert!(
        session.iter().any(|m| m
            .text()
            .starts_with(toolloop::context::policy::SUMMARY_HEADER)),
        "{session:?}"
    );
    rt.block_on(server.shutdown());
}

/// `toolloop chat` (its window set in the configuration file): `/context` shows the session's token use by part as a bar over the window,
/// `/compact FOCUS` summarises the session once, and the next message goes on from the
/// summary.
#[test]
fn chat_shows_and_compacts_its_context() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("store.db").to_string_lossy().into_owned();
    let effects = dir.path().join("effects.txt");
    // The window comes from the configuration file's key.
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "context_window = 50000\nkeep_rounds = 2\n").unwrap();
    let mut chat = command(
        &location,
        &effects,
        &[
            "chat",
            "--session",
            "talk",
            "--model",
            "openai:mock:rounds=3,distinct=true",
            "--base-url",
            &base_url,
            "--system",
            "Be brief.",
        ],
    )
    .env("TOOLLOOP_CONFIG", &config)
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    {
        use std::io::Write;
        let mut stdin = chat.stdin.take().unwrap();
        for line in [
            "first task",
            "/context",
            "/compact the effects",
            "/context",
            "second task",
        ] {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let out = chat.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let bars: Vec<&str> = err.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(bars.len(), 2, "{err}");
    for bar in &bars {
        assert!(bar.contains("of 50000 tokens"), "{bar}");
        assert!(bar.contains('S') && bar.contains('T'), "{bar}");
    }
    assert!(bars[0].contains('R') && !bars[1].contains('R'), "{bars:?}");
    assert!(err.contains("compacted: 8 messages summarised"), "{err}");
    assert_eq!(server.stats().summaries, 1);
    let store = rt.block_on(Store::open(&location)).unwrap();
    let session = rt.block_on(store.session_messages("talk")).unwrap();
    let texts: Vec<&str> = session.iter().map(|m| m.text()).collect();
    // The system prompt, the summary in place of the first task, then the second task.
    assert_eq!(texts[0], "Be brief.");
    assert!(
        texts[1].starts_with(toolloop::context::policy::SUMMARY_HEADER),
        "{texts:?}"
    );
    assert_eq!(texts[2], "second task", "{texts:?}");
    rt.block_on(server.shutdown());
}

/// A model key the summariser repeats in `/compact`'s summary is not stored with the session.
#[test]
fn a_key_in_a_compact_summary_is_not_stored() {
    const KEY: &str = "sk-compact-key-0123456789abcdefghij";
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let base_url = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("store.db").to_string_lossy().into_owned();
    let effects = dir.path().join("effects.txt");
    let script = dir.path().join("summariser.json");
    std::fs::write(
        &script,
        serde_json::json!([{ "text": format!("The task; the key is {KEY}.") }]).to_string(),
    )
    .unwrap();
    let compact_model = format!("scripted:{}", script.display());
    let mut chat = command(
        &location,
        &effects,
        &[
            "chat",
            "--session",
            "talk",
            "--model",
            "openai:mock",
            "--base-url",
            &base_url,
            "--compact-model",
            &compact_model,
        ],
    )
    .env("OPENAI_API_KEY", KEY)
    .stdin(Stdio::piped())
    .spawn()
    .unwrap();
    {
        use std::io::Write;
        let mut stdin = chat.stdin.take().unwrap();
        for line in ["first task", "/compact", "second task"] {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let out = chat.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("compacted:"), "{err}");
    let store = rt.block_on(Store::open(&location)).unwrap();
    let session = rt.block_on(store.session_messages("talk")).unwrap();
    let texts: Vec<&str> = session.iter().map(|m| m.text()).collect();
    assert!(
        texts.iter().any(|t| t.contains("the key is [redacted]")),
        "{texts:?}"
    );
    assert!(texts.iter().all(|t| !t.contains(KEY)), "{texts:?}");
    rt.block_on(server.shutdown());
}

/// A result spilled in one `toolloop chat` turn is read whole with `read_result` in a later
/// turn (another process): the session keeps it whole, the next turn spills it anew under the
/// same handle and offers `read_result`, which reads it from there.
#[test]
fn a_result_spilled_in_one_chat_turn_is_read_whole_in_the_next() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let location = dir.path().join("store.db").to_string_lossy().into_owned();
    let effects = dir.path().join("effects.txt");
    // Results over 30 bytes are spilled (the test tool's are about 60).
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "spill_over = 30\n").unwrap();
    let turn = |options: toolloop_mock::MockOptions, line: &str| {
        let server = rt.block_on(toolloop_mock::start(options)).unwrap();
        let base_url = format!("{}/v1", server.base_url());
        let mut chat = command(
            &location,
            &effects,
            &[
                "chat",
                "--session",
                "talk",
                "--model",
                "openai:mock:rounds=1",
                "--base-url",
                &base_url,
            ],
        )
        .env("TOOLLOOP_CONFIG", &config)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
        {
            use std::io::Write;
            let mut stdin = chat.stdin.take().unwrap();
            writeln!(stdin, "{line}").unwrap();
        }
        let out = chat.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        rt.block_on(server.shutdown());
    };
    turn(toolloop_mock::MockOptions::default(), "first task");
    let store = rt.block_on(Store::open(&location)).unwrap();
    // The first turn's run spilled its result (it logged the edit).
    let spilled_in = |store: &Store| -> Vec<String> {
        let runs = rt.block_on(store.runs(Some("talk"))).unwrap();
        runs.iter()
            .flat_map(|r| rt.block_on(store.load(&r.run_id)).unwrap())
            .filter_map(|r| match r {
                Input::ContextEdited { edits, .. } => Some(edits.spilled),
                _ => None,
            })
            .flatten()
            .collect()
    };
    assert_eq!(spilled_in(&store).len(), 1);
    let session = rt.block_on(store.session_messages("talk")).unwrap();
    let spilled = session
        .iter()
        .find_map(|m| match m {
            toolloop::Message::Tool(r) if r.name.starts_with("effect_") => Some(r.clone()),
            _ => None,
        })
        .expect("the first turn's result");
    assert_eq!(spilled_in(&store), std::slice::from_ref(&spilled.call_id));
    // The session keeps it whole.
    assert!(spilled.content.contains("\"done\":"), "{}", spilled.content);
    assert!(
        !spilled.content.contains("read_result"),
        "{}",
        spilled.content
    );
    assert!(spilled.content.len() > 30);
    // The next turn's model reads it back by its handle, from its middle on.
    let read = toolloop_mock::MockOptions {
        script: vec![vec![toolloop_mock::ScriptCall {
            name: "read_result".into(),
            arguments: serde_json::json!({"handle": spilled.call_id, "offset": 5}),
        }]],
        ..toolloop_mock::MockOptions::default()
    };
    turn(read, "second task");
    let session = rt.block_on(store.session_messages("talk")).unwrap();
    let page = session
        .iter()
        .find_map(|m| match m {
            toolloop::Message::Tool(r) if r.name == "read_result" => Some(r.clone()),
            _ => None,
        })
        .expect("the second turn called read_result");
    assert!(!page.is_error, "{}", page.content);
    // A page holds at most half of `spill_over` bytes (15), read from the whole result.
    let whole = &spilled.content;
    assert_eq!(
        page.content,
        format!(
            "[bytes 5..20 of {}; read on from offset 20]\n{}",
            whole.len(),
            &whole[5..20]
        )
    );
}
