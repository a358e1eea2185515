//! Delegation in the command: agents declared in `--agents FILE`, run directly with `--agent`,
//! offered to the main agent as tools; a child's approval deferred to the root run and decided
//! with `toolloop approve`; a SIGKILL inside a child, then `resume`, with nothing repeated.
//! The mock server makes exact calls (`MockOptions::script`): each agent is offered only its
//! own tools, so one script drives parent and child.

use crate::common;
use common::{call, command, json_of, scripted_mock, stderr, toolloop};

use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `toolloop run OUTPUT` of the agent `boss` of `agents` on the mock at `base`, with `flags`,
/// asked to "go".
fn boss<'a>(base: &'a str, agents: &'a str, output: &'a str, flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        output,
        "--model",
        "openai:mock",
        "--base-url",
        base,
        "--agents",
        agents,
        "--agent",
        "boss",
    ];
    args.extend_from_slice(flags);
    args.push("go");
    args
}

/// `boss` delegates to `payer`, which has the tool `tool`.
fn agents_file(dir: &Path, tool: &str) -> String {
    let path = dir.join("agents.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[agents.boss]
description = "Plans and delegates."
system = "You delegate."
tools = ["payer"]

[agents.payer]
description = "Pays bills; give it the bill."
system = "You pay."
tools = ["{tool}"]
max_rounds = 4
"#
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn a_childs_call_that_needs_approval_is_deferred_approved_and_the_run_finishes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
        &rt,
        vec![vec![
            call("payer", json!({"task": "pay the bill"})),
            call("run_command", json!({"command": ["touch", "paid.txt"]})),
        ]],
    );
    let dir = tempfile::tempdir().unwrap();
    let agents = agents_file(dir.path(), "run_command");
    let base = format!("{}/v1", server.base_url());
    let out = toolloop(
        &boss(
            &base,
            &agents,
            "--json",
            &[
                "--allow-commands",
                // Sandboxed commands run unasked: this rule asks about touch.
                "--ask",
                "run_command:touch *",
                "--defer-approvals",
            ],
        ),
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "awaiting_approval");
    let pending = &v["pending_approvals"][0];
    assert_eq!(pending["path"], json!(["payer"]));
    assert_eq!(pending["subject"], "touch paid.txt");
    let run_id = v["run_id"].as_str().unwrap().to_string();
    assert!(
        pending["run_id"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{run_id}/")),
        "{pending}"
    );
    let call_id = pending["call"]["id"].as_str().unwrap().to_string();
    assert!(
        !dir.path().join("paid.txt").exists(),
        "nothing ran unapproved"
    );

    // Listed through the root run, with the child's path; approved by id.
    let listed = toolloop(&["approve", &run_id], dir.path());
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains(&call_id) && text.contains("payer"), "{text}");
    let approved = toolloop(&["approve", &run_id, &call_id], dir.path());
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert!(!dir.path().join("paid.txt").exists());

    let out = toolloop(&["resume", &run_id, "--json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered");
    assert_eq!(v["tool_calls"][0]["name"], "payer");
    assert_eq!(v["tool_calls"][0]["status"], "ok");
    assert!(dir.path().join("paid.txt").exists());
    // boss: 2 requests; payer: 2 (its call, its answer); nothing asked twice.
    assert_eq!(server.stats().requests, 4);
    rt.block_on(server.shutdown());
}

fn effect_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter(|l| !l.is_empty()).count())
        .unwrap_or(0)
}

#[test]
fn a_kill_inside_a_child_then_resume_repeats_no_model_call_and_no_side_effect() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
        &rt,
        vec![vec![
            call("payer", json!({"task": "pay the bill"})),
            call("effect_a", json!({"note": "pay"})),
        ]],
    );
    let dir = tempfile::tempdir().unwrap();
    let agents = agents_file(dir.path(), "effect_a");
    let effects = dir.path().join("effects.txt");
    let base = format!("{}/v1", server.base_url());
    let mut child = command(
        &boss(&base, &agents, "--json", &["--session", "kill-in-child"]),
        dir.path(),
    )
    .env("OPENAI_API_KEY", "test")
    .env("TOOLLOOP_TEST_EFFECTS", &effects)
    .env("TOOLLOOP_TEST_EFFECT_MS", "30000")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The child's side effect happened, its call is in flight: kill the whole process.
    let start = Instant::now();
    while effect_lines(&effects) < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the child's call never started"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the command ended ({status}) before the child's call");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(server.stats().requests, 2, "boss's first call and payer's");

    let runs = toolloop(
        &["runs", "--json", "--session", "kill-in-child"],
        dir.path(),
    );
    assert!(runs.status.success(), "{}", stderr(&runs));
    let listed = json_of(&runs);
    let run_id = listed
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|r| !r["run_id"].as_str().unwrap().contains('/'))
        })
        .and_then(|r| r["run_id"].as_str())
        .expect("the root run is listed")
        .to_string();

    let out = command(&["resume", &run_id, "--json"], dir.path())
        .env("OPENAI_API_KEY", "test")
        .env("TOOLLOOP_TEST_EFFECTS", &effects)
        .env("TOOLLOOP_TEST_EFFECT_MS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered");
    assert_eq!(v["tool_calls"][0]["name"], "payer");
    // The child's in-flight side effect was not run again: it reads "outcome unknown", and
    // the child answered in its next round.
    assert_eq!(effect_lines(&effects), 1, "the side effect happened once");
    // Two requests before the kill, two after (payer's answer, boss's answer): none repeated.
    assert_eq!(server.stats().requests, 4);
    rt.block_on(server.shutdown());
}

#[test]
fn agents_are_offered_as_tools_and_a_recursive_definition_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
        &rt,
        vec![vec![call("helper", json!({"task": "read the README"}))]],
    );
    let dir = common::repo();
    let path = dir.path().join("agents.toml");
    std::fs::write(
        &path,
        r#"
[agents.helper]
description = "Reads files."
tools = ["read_file"]
"#,
    )
    .unwrap();
    let agents = path.to_string_lossy().into_owned();
    let base = format!("{}/v1", server.base_url());
    let out = toolloop(
        &[
            "run",
            "--json",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--agents",
            &agents,
            "go",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["name"], "helper");
    assert_eq!(v["tool_calls"][0]["status"], "ok");
    // The child's usage is counted in the run's and reported with its call.
    assert!(
        v["tool_calls"][0]["spent"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    std::fs::write(
        &path,
        r#"
[agents.a]
description = "A."
tools = ["b"]

[agents.b]
description = "B."
tools = ["a"]
"#,
    )
    .unwrap();
    let out = toolloop(
        &[
            "run",
            "--json",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--agents",
            &agents,
            "go",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the agent `a` lists itself as a sub-agent (a → b → a)"),
        "{}",
        stderr(&out)
    );
    let out = toolloop(
        &[
            "run",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--agent",
            "nobody",
            "go",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--agent nobody: no such agent"),
        "{}",
        stderr(&out)
    );
    rt.block_on(server.shutdown());
}

/// `--jsonl` nests a sub-agent's events in the stream; `toolloop runs` lists its run under
/// its parent's, by the call that ran it, and `toolloop sessions show` folds the sub-agent's work into one line under the call's result.
#[test]
fn delegated_work_is_a_tree_in_runs_and_folded_in_sessions_show() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
        &rt,
        vec![vec![
            call("payer", json!({"task": "pay the bill"})),
            call("effect_a", json!({"note": "pay"})),
        ]],
    );
    let dir = tempfile::tempdir().unwrap();
    let agents = agents_file(dir.path(), "effect_a");
    let effects = dir.path().join("effects.txt");
    let base = format!("{}/v1", server.base_url());
    let out = command(
        &boss(&base, &agents, "--jsonl", &["--session", "folded"]),
        dir.path(),
    )
    .env("OPENAI_API_KEY", "test")
    .env("TOOLLOOP_TEST_EFFECTS", &effects)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The child's events, nested in the stream with its path and the parent's call.
    let nested = lines
        .iter()
        .find(|e| e["type"] == "child" && e["event"]["type"] == "tool_call_requested")
        .expect("the child's call is in the stream");
    assert_eq!(nested["path"], json!(["payer"]));
    assert_eq!(nested["event"]["call"]["name"], "effect_a");
    let v = lines.last().unwrap();
    assert_eq!(nested["call_id"], v["tool_calls"][0]["id"]);
    let run_id = v["run_id"].as_str().unwrap().to_string();
    let call_id = v["tool_calls"][0]["id"].as_str().unwrap().to_string();
    let child = format!("{run_id}/{call_id}");

    // The tree: the root, then its child by the call's id, indented.
    let runs = toolloop(&["runs", "--session", "folded"], dir.path());
    assert!(runs.status.success(), "{}", stderr(&runs));
    let text = String::from_utf8_lossy(&runs.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let root_at = lines
        .iter()
        .position(|l| l.starts_with(&run_id))
        .unwrap_or_else(|| panic!("the root is listed: {text}"));
    assert!(
        lines[root_at + 1].starts_with(&format!("└ {call_id}")),
        "the child under its root: {text}"
    );

    // The session's transcript shows the child's work folded under the call's result.
    let show = toolloop(&["sessions", "show", "folded"], dir.path());
    assert!(show.status.success(), "{}", stderr(&show));
    let text = String::from_utf8_lossy(&show.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let result_at = lines
        .iter()
        .position(|l| l.starts_with(&format!("tool ✓ payer [{call_id}]")))
        .unwrap_or_else(|| panic!("the call's result is shown: {text}"));
    assert_eq!(
        lines[result_at + 1],
        format!("  ▸ delegated: 2 model calls, 1 tool call (effect_a) · run {child}"),
        "{text}"
    );
    let show = toolloop(&["sessions", "show", "--json", "folded"], dir.path());
    let v = json_of(&show);
    assert_eq!(v["delegated"][0]["run_id"], child.as_str());
    assert_eq!(v["delegated"][0]["tool_calls"], json!(["effect_a"]));
    assert_eq!(v["delegated"][0]["status"], "finished");
    rt.block_on(server.shutdown());
}

/// A sub-agent's commands run in the run's sandbox: one that writes outside the root is
/// stopped at its walls, and one that asks to leave the sandbox is asked about (and, with no
/// terminal, denied), as the main agent's would be.
#[cfg(target_os = "linux")]
#[test]
fn a_childs_commands_run_in_the_runs_sandbox() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base_dir = dir.path().canonicalize().unwrap();
    let (root, outside) = (base_dir.join("root"), base_dir.join("outside"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let write = |name: &str| json!({"command": ["sh", "-c", format!("echo pwned > '{}'", outside.join(name).display())]});
    let mut leave = write("left");
    leave["sandbox"] = json!(false);
    let server = scripted_mock(
        &rt,
        vec![
            vec![
                call("payer", json!({"task": "write outside"})),
                call(
                    "run_command",
                    json!({"command": ["sh", "-c", format!(
                        "echo made > inside.txt; echo pwned > '{}'",
                        outside.join("escaped").display()
                    )]}),
                ),
            ],
            vec![call("run_command", leave)],
        ],
    );
    let agents = agents_file(&root, "run_command");
    let base = format!("{}/v1", server.base_url());
    let out = toolloop(
        &boss(
            &base,
            &agents,
            "--json",
            &["--allow-commands", "--allow-shell"],
        ),
        &root,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["name"], "payer");
    assert_eq!(v["tool_calls"][0]["status"], "ok", "{v}");
    // payer: its two calls and its answer.
    assert_eq!(server.stats().requests, 2 + 3);
    assert!(root.join("inside.txt").exists(), "the child's command ran");
    assert!(!outside.join("escaped").exists(), "the sandbox held");
    assert!(!outside.join("left").exists(), "leaving it was denied");
    assert!(stderr(&out).contains("no terminal"), "{}", stderr(&out));
    rt.block_on(server.shutdown());
}

/// A declared agent may list its run's MCP tools: the child is offered the one it lists (and
/// nothing else of the servers'), calls it on the server, and the parent gets the answer.
#[cfg(feature = "test-hooks")]
#[test]
fn a_declared_agent_uses_the_mcp_tool_it_lists() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
        &rt,
        vec![vec![
            call("payer", json!({"task": "say hi"})),
            call("echo", json!({"text": "hi from the child"})),
        ]],
    );
    let dir = tempfile::tempdir().unwrap();
    let agents = agents_file(dir.path(), "echo");
    let log = dir.path().join("mcp.log");
    let config = dir.path().join("servers.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"t": {
            "command": env!("CARGO_BIN_EXE_toolloop-mcp-test-server"),
            "env": {"TOOLLOOP_MCP_TEST_LOG": log},
        }}})
        .to_string(),
    )
    .unwrap();
    let base = format!("{}/v1", server.base_url());
    let out = toolloop(
        &boss(
            &base,
            &agents,
            "--json",
            &["--mcp-config", config.to_str().unwrap()],
        ),
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    assert_eq!(v["tool_calls"][0]["name"], "payer", "{v}");
    assert_eq!(v["tool_calls"][0]["status"], "ok", "{v}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        calls
            .lines()
            .filter(|l| l.starts_with("call echo "))
            .count(),
        1,
        "the child called the server's tool once: {calls}"
    );
    // boss: its call and its answer; payer: its call of `echo` and its answer. A scripted
    // call the request did not offer is refused by the mock: none was.
    let stats = server.stats();
    assert_eq!((stats.requests, stats.rejected), (4, 0), "{stats:?}");
    rt.block_on(server.shutdown());
}
