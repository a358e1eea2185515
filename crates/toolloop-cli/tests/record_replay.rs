//! `--record FILE` and `--model replay:FILE` through the command, against the mock over real
//! HTTP: a recorded run plays back with the same answer and no request to any server, in the
//! four wire APIs, streamed and not; a changed prompt is refused with the difference; a fallback
//! model answers what the cassette lacks and is appended; `--replay-tools` writes no file and
//! runs no command.
#![cfg(target_os = "linux")]

use crate::common;
use common::{command, json_of, stderr};

use serde_json::{Value, json};
use std::path::Path;
use std::process::Output;
use toolloop_mock::{MockOptions, MockServer, ScriptCall};

const KEY: &str = "sk-cli-cassette-key-9876543210";

fn server(rt: &tokio::runtime::Runtime, script: Vec<Vec<ScriptCall>>) -> MockServer {
    rt.block_on(toolloop_mock::start(MockOptions {
        script,
        ..MockOptions::default()
    }))
    .unwrap()
}

/// The model and base URL flags for a provider against the mock.
fn provider(name: &str, server: &MockServer) -> Vec<String> {
    let base = server.base_url();
    match name {
        "openai" | "openai-responses" => vec![
            "--model".into(),
            format!("{name}:mock:rounds=2,distinct=true"),
            "--base-url".into(),
            format!("{base}/v1"),
        ],
        _ => vec![
            "--model".into(),
            format!("{name}:mock:rounds=2,distinct=true"),
            "--base-url".into(),
            base,
        ],
    }
}

fn run(dir: &Path, args: &[String], prompt: &str) -> Output {
    let mut all: Vec<&str> = vec!["run", "--json"];
    all.extend(args.iter().map(String::as_str));
    all.push(prompt);
    command(&all, dir)
        .env("OPENAI_API_KEY", KEY)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("GEMINI_API_KEY", KEY)
        .output()
        .unwrap()
}

/// What a replay must give again.
fn essence(v: &Value) -> Value {
    let calls: Vec<Value> = v["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| json!([c["name"], c["arguments"], c["success"]]))
                .collect()
        })
        .unwrap_or_default();
    json!({"text": v["text"], "stop": v["stop_reason"], "rounds": v["rounds"], "calls": calls})
}

#[test]
fn recorded_runs_replay_offline_in_the_four_apis_streamed_and_not() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = server(&rt, Vec::new());
    let dir = common::repo();
    for name in ["openai", "openai-responses", "anthropic", "gemini"] {
        for stream in ["--stream", "--no-stream"] {
            let label = format!("{name} {stream}");
            let cassette = dir.path().join(format!("{name}{stream}.jsonl"));
            let cassette_s = cassette.to_string_lossy().into_owned();
            let mut args = provider(name, &server);
            args.push(stream.into());
            let mut recording = args.clone();
            recording.extend(["--record".into(), cassette_s.clone()]);
            let before = server.stats().requests;
            let out = run(dir.path(), &recording, "Read the README.");
            assert_eq!(out.status.code(), Some(0), "{label}: {}", stderr(&out));
            let recorded = json_of(&out);
            assert_eq!(server.stats().requests - before, 3, "{label}");

            let text = std::fs::read_to_string(&cassette).unwrap();
            assert!(!text.contains(KEY), "{label}: the key is in the cassette");
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(&cassette).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{label}");
            }
            let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
            assert_eq!(header["format"], "toolloop-cassette", "{label}");
            assert_eq!(
                header["settings"]["model"],
                format!("{name}:mock:rounds=2,distinct=true"),
                "{label}: the run's settings are kept"
            );

            // Played back: no provider flag, no request, the same run.
            let replay = vec![
                "--model".to_string(),
                format!("replay:{cassette_s}"),
                stream.into(),
            ];
            let before = server.stats().requests;
            let out = run(dir.path(), &replay, "Read the README.");
            assert_eq!(out.status.code(), Some(0), "{label}: {}", stderr(&out));
            assert_eq!(essence(&json_of(&out)), essence(&recorded), "{label}");
            assert_eq!(
                server.stats().requests,
                before,
                "{label}: a request was sent"
            );

            // A changed prompt: refused, with the difference.
            let out = run(dir.path(), &replay, "Read the LICENSE.");
            assert_eq!(out.status.code(), Some(1), "{label}: {}", stderr(&out));
            // With --json, the error is in the outcome.
            let outcome = json_of(&out);
            let err = outcome["error"]["message"].as_str().unwrap_or_default();
            assert!(
                err.contains("differs from the recording"),
                "{label}: {outcome}"
            );
            assert!(
                err.contains("Read the README.") && err.contains("Read the LICENSE."),
                "{label}: {err}"
            );
            assert_eq!(
                server.stats().requests,
                before,
                "{label}: a request was sent"
            );
        }
    }
    rt.block_on(server.shutdown());
}

#[test]
fn a_fallback_model_answers_what_the_cassette_lacks_and_is_appended() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = server(&rt, Vec::new());
    let dir = common::repo();
    let cassette = dir.path().join("c.jsonl");
    let cassette_s = cassette.to_string_lossy().into_owned();
    let mut args = provider("openai", &server);
    args.extend(["--record".into(), cassette_s.clone()]);
    let out = run(dir.path(), &args, "first");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let base = format!("{}/v1", server.base_url());
    let fallback = vec![
        "--model".to_string(),
        format!("replay:{cassette_s}"),
        "--replay-fallback".into(),
        "openai:mock:rounds=2,distinct=true".into(),
        "--base-url".into(),
        base,
    ];
    let before = server.stats().requests;
    let out = run(dir.path(), &fallback, "second");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(server.stats().requests - before, 3);
    // Now both play back offline.
    let replay = vec!["--model".to_string(), format!("replay:{cassette_s}")];
    for prompt in ["first", "second"] {
        let out = run(dir.path(), &replay, prompt);
        assert_eq!(out.status.code(), Some(0), "{prompt}: {}", stderr(&out));
    }
    assert_eq!(server.stats().requests - before, 3);
    assert!(!std::fs::read_to_string(&cassette).unwrap().contains(KEY));
    rt.block_on(server.shutdown());
}

#[test]
fn replayed_tools_write_no_file_and_run_no_command() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = server(
        &rt,
        vec![
            vec![ScriptCall {
                name: "write_file".into(),
                // The key, echoed: never recorded.
                arguments: json!({"path": "written.txt", "content": format!("key {KEY}\n")}),
            }],
            vec![ScriptCall {
                name: "run_command".into(),
                arguments: json!({"command": ["sh", "-c", "echo ran >> ran.txt; echo done"]}),
            }],
        ],
    );
    let dir = common::repo();
    let root = dir.path();
    let cassette = root.join("tools.jsonl");
    let cassette_s = cassette.to_string_lossy().into_owned();
    let tool_flags = ["--allow-write", "--allow-commands", "--allow-shell"].map(String::from);
    let mut args = provider("openai", &server);
    args.extend(tool_flags.clone());
    args.extend(["--record".into(), cassette_s.clone()]);
    let out = run(root, &args, "Write and run.");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recorded = json_of(&out);
    assert_eq!(
        recorded["tool_calls"].as_array().map(Vec::len),
        Some(2),
        "{recorded}"
    );
    assert!(root.join("written.txt").exists() && root.join("ran.txt").exists());
    let text = std::fs::read_to_string(&cassette).unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("\"type\":\"tool\""))
            .count(),
        2,
        "{text}"
    );
    std::fs::remove_file(root.join("written.txt")).unwrap();
    std::fs::remove_file(root.join("ran.txt")).unwrap();

    // An MCP server that would leave a mark if it were started.
    let mcp = root.join("mcp.json");
    let mark = root.join("server-started");
    std::fs::write(
        &mcp,
        json!({"mcpServers": {"marker": {"command": "sh", "args": ["-c", format!("touch '{}'", mark.display())]}}})
            .to_string(),
    )
    .unwrap();
    let mut replay = vec![
        "--model".to_string(),
        format!("replay:{cassette_s}"),
        "--replay-tools".into(),
        "--mcp-config".into(),
        mcp.to_string_lossy().into_owned(),
    ];
    replay.extend(tool_flags);
    let before = server.stats().requests;
    let out = run(root, &replay, "Write and run.");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let replayed = json_of(&out);
    // The same run, but for the key, which the cassette never held.
    let without_key: Value =
        serde_json::from_str(&essence(&recorded).to_string().replace(KEY, "[redacted]")).unwrap();
    assert_eq!(essence(&replayed), without_key);
    assert_eq!(
        replayed["tool_calls"][1]["result"], recorded["tool_calls"][1]["result"],
        "the command's recorded output"
    );
    assert!(
        replayed["tool_calls"][1]["result"]
            .to_string()
            .contains("done"),
        "{replayed}"
    );
    assert!(!root.join("written.txt").exists(), "a file was written");
    assert!(!root.join("ran.txt").exists(), "a command ran");
    assert!(!mark.exists(), "an MCP server was started");
    assert_eq!(server.stats().requests, before);
    rt.block_on(server.shutdown());
}

#[test]
fn the_flags_are_checked() {
    let dir = common::repo();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"not\": \"a cassette\"}\n").unwrap();
    let bad_s = bad.to_string_lossy().into_owned();
    let replay_bad = format!("replay:{bad_s}");
    let cases: [(Vec<&str>, &str); 5] = [
        (vec!["--replay-tools"], "--replay-tools"),
        (vec!["--replay-fallback", "openai:x"], "--replay-fallback"),
        (
            vec!["--model", "replay:missing.jsonl"],
            "--model replay:missing.jsonl",
        ),
        (vec!["--model", &replay_bad], "line 1"),
        (
            vec!["--model", &replay_bad, "--record", "x.jsonl"],
            "--record",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["run"];
        all.extend(args);
        all.push("hi");
        let out = command(&all, dir.path()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{all:?}: {}", stderr(&out));
    }
}

#[test]
fn a_recorded_workflow_replays_offline() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = server(&rt, Vec::new());
    let dir = common::repo();
    let file = dir.path().join("w.toml");
    std::fs::write(
        &file,
        "name = \"w\"\n[[steps]]\nid = \"one\"\nprompt = \"first\"\n[[steps]]\nid = \"two\"\n\
         prompt = \"second, after: {{ steps.one.output }}\"\n",
    )
    .unwrap();
    let cassette = dir.path().join("w.jsonl").to_string_lossy().into_owned();
    let file = file.to_string_lossy().into_owned();
    let base = format!("{}/v1", server.base_url());
    let steps = |out: &Output| -> Value {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        let v = json_of(out);
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| json!([s["step_id"], s["text"], s["metadata"]["rounds"]]))
            .collect()
    };
    let workflow = |args: &[&str]| {
        let mut all = vec!["workflow", "run", &file, "--json"];
        all.extend(args);
        command(&all, dir.path()).output().unwrap()
    };
    let recorded = steps(&workflow(&[
        "--model",
        "openai:mock",
        "--base-url",
        &base,
        "--record",
        &cassette,
    ]));
    assert_eq!(recorded.as_array().map(Vec::len), Some(2), "{recorded}");
    let before = server.stats().requests;
    let replay = format!("replay:{cassette}");
    let replayed = steps(&workflow(&["--model", &replay]));
    assert_eq!(replayed, recorded);
    assert_eq!(server.stats().requests, before, "a request was sent");
    rt.block_on(server.shutdown());
}

/// An MCP server's tools are recorded too: a replay with `--replay-tools` offers them and
/// answers their calls from the cassette without starting the server.
#[cfg(feature = "test-hooks")]
#[test]
fn mcp_tools_are_recorded_and_replayed_without_starting_the_server() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = server(
        &rt,
        vec![vec![ScriptCall {
            name: "echo".into(),
            arguments: json!({"text": "from the server"}),
        }]],
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let config = dir.path().join("mcp.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"t": {
            "command": env!("CARGO_BIN_EXE_toolloop-mcp-test-server"),
            "env": {"TOOLLOOP_MCP_TEST_LOG": log},
        }}})
        .to_string(),
    )
    .unwrap();
    let cassette = dir.path().join("mcp.jsonl");
    let mut args = vec![
        "--model".to_string(),
        "openai:mock:rounds=1".into(),
        "--base-url".into(),
        format!("{}/v1", server.base_url()),
        "--mcp-config".into(),
        config.to_string_lossy().into_owned(),
        "--tools".into(),
        "echo".into(),
        "--no-store".into(),
    ];
    let mut recording = args.clone();
    recording.extend(["--record".into(), cassette.to_string_lossy().into_owned()]);
    let recorded = json_of(&run(dir.path(), &recording, "Echo something."));
    assert_eq!(recorded["stop_reason"], "answered", "{recorded:#}");
    assert_eq!(recorded["tool_calls"][0]["name"], "echo", "{recorded:#}");
    assert_eq!(recorded["tool_calls"][0]["success"], true, "{recorded:#}");
    let text = std::fs::read_to_string(&cassette).unwrap();
    assert!(text.contains("\"type\":\"catalog\""), "{text}");
    assert!(
        text.contains("from the server"),
        "the result is kept: {text}"
    );
    let calls_on_server = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(calls_on_server.contains("call echo"), "{calls_on_server}");
    std::fs::remove_file(&log).unwrap();

    let requests = server.stats().requests;
    args[0..4].clone_from_slice(&[
        "--model".into(),
        format!("replay:{}", cassette.display()),
        "--replay-tools".into(),
        "--no-stream".into(),
    ]);
    let out = run(dir.path(), &args, "Echo something.");
    let replayed = json_of(&out);
    assert_eq!(essence(&replayed), essence(&recorded), "{}", stderr(&out));
    assert_eq!(
        replayed["tool_calls"][0]["result"],
        recorded["tool_calls"][0]["result"]
    );
    assert_eq!(server.stats().requests, requests, "no request to the mock");
    assert!(!log.exists(), "the MCP server was not started");
    rt.block_on(server.shutdown());
}
