//! Approvals in the command, against the mock server making exact calls (`MockOptions::script`):
//! rules, the denial without a terminal, deferred decisions across processes, the terminal
//! question killed mid-way, the child's scrubbed environment, and "run the tests and fix the
//! failure" end to end.

mod common;
use common::{command, json_of, toolloop};

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use toolloop_mock::{MockOptions, MockServer, ScriptCall};

fn call(name: &str, arguments: Value) -> ScriptCall {
    ScriptCall {
        name: name.into(),
        arguments,
    }
}

fn mock(rt: &tokio::runtime::Runtime, script: Vec<Vec<ScriptCall>>) -> MockServer {
    rt.block_on(toolloop_mock::start(MockOptions {
        script,
        ..MockOptions::default()
    }))
    .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run(dir: &Path, url: &str, flags: &[&str]) -> Output {
    let base = format!("{url}/v1");
    let mut args = vec![
        "run",
        "--json",
        "--model",
        "openai:mock",
        "--base-url",
        &base,
    ];
    args.extend_from_slice(flags);
    args.push("go");
    toolloop(&args, dir)
}

#[test]
fn rules_allow_and_deny_and_without_a_terminal_an_unruled_call_is_denied() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        vec![
            vec![
                call("run_command", json!({"command": ["echo", "hi"]})),
                call("write_file", json!({"path": "Cargo.lock", "content": "x"})),
            ],
            vec![call(
                "run_command",
                json!({"command": ["touch", "made.txt"]}),
            )],
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &server.base_url(),
        &[
            "--allow-commands",
            "--sandbox",
            "off",
            "--allow-write",
            "--allow",
            "run_command:echo *",
            "--deny",
            "write_file:*.lock",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["status"], "ok");
    assert_eq!(calls[0]["result"]["data"]["stdout"], "hi\n");
    assert_eq!(calls[1]["status"], "denied");
    assert!(
        calls[1]["result"]["message"]
            .as_str()
            .unwrap()
            .contains("denied: the approval rule `deny write_file:*.lock`"),
        "{}",
        calls[1]["result"]
    );
    assert_eq!(calls[2]["status"], "denied");
    assert!(!dir.path().join("Cargo.lock").exists());
    assert!(!dir.path().join("made.txt").exists());
    let err = stderr(&out);
    assert!(
        err.contains("no terminal") && err.contains("--allow 'run_command:touch made.txt'"),
        "{err}"
    );
    // A bad pattern names its flag.
    let out = run(dir.path(), &server.base_url(), &["--deny", "a:[x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--deny a:[x"), "{}", stderr(&out));
    rt.block_on(server.shutdown());
}

#[test]
fn deferred_approvals_are_decided_and_resumed_across_processes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        vec![
            vec![call(
                "run_command",
                json!({"command": ["touch", "one.txt"]}),
            )],
            vec![call(
                "run_command",
                json!({"command": ["touch", "two.txt"]}),
            )],
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &server.base_url(),
        &["--allow-commands", "--sandbox", "off", "--defer-approvals"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "awaiting_approval");
    assert_eq!(v["error"]["code"], "AWAITING_APPROVAL");
    assert_eq!(v["pending_approvals"][0]["subject"], "touch one.txt");
    let run_id = v["run_id"].as_str().unwrap().to_string();
    let call_id = v["pending_approvals"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        !dir.path().join("one.txt").exists(),
        "nothing ran unapproved"
    );

    // Listed, then approved by id, in other processes.
    let listed = toolloop(&["approve", &run_id], dir.path());
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(String::from_utf8_lossy(&listed.stdout).contains("waiting:"));
    let wrong = toolloop(&["approve", &run_id, "nope"], dir.path());
    assert_eq!(wrong.status.code(), Some(1));
    assert!(stderr(&wrong).contains(&call_id), "{}", stderr(&wrong));
    let approved = toolloop(&["approve", &run_id, &call_id], dir.path());
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert!(!dir.path().join("one.txt").exists());

    // Resumed: the approved call runs; the next one waits.
    let out = toolloop(&["resume", &run_id, "--json"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(dir.path().join("one.txt").exists());
    assert!(!dir.path().join("two.txt").exists());
    let v = json_of(&out);
    assert_eq!(v["pending_approvals"][0]["subject"], "touch two.txt");

    let denied = toolloop(
        &["deny", &run_id, "--all", "--reason", "not two"],
        dir.path(),
    );
    assert!(denied.status.success(), "{}", stderr(&denied));
    let out = toolloop(&["resume", &run_id, "--json"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered");
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["status"], "ok");
    assert_eq!(calls[1]["status"], "denied");
    assert!(
        calls[1]["result"]["message"]
            .as_str()
            .unwrap()
            .contains("denied: not two")
    );
    assert!(!dir.path().join("two.txt").exists());
    assert_eq!(server.stats().rejected, 0, "every call was answered once");
    rt.block_on(server.shutdown());
}

#[test]
fn keys_are_absent_from_a_commands_environment() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        vec![vec![call("run_command", json!({"command": ["printenv"]}))]],
    );
    let dir = tempfile::tempdir().unwrap();
    let base = format!("{}/v1", server.base_url());
    let out = command(
        &[
            "run",
            "--json",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--allow-commands",
            "--allow",
            "run_command:printenv",
            "go",
        ],
        dir.path(),
    )
    .env("OPENAI_API_KEY", "sk-very-secret-1")
    .env("SOME_SERVICE_TOKEN", "tok-very-secret-2")
    .env("HARMLESS_SETTING", "plain-value")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    let env = v["tool_calls"][0]["result"]["data"]["stdout"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(env.contains("HARMLESS_SETTING=plain-value"), "{env}");
    for secret in ["sk-very-secret-1", "tok-very-secret-2", "OPENAI_API_KEY"] {
        assert!(!env.contains(secret), "{secret} reached the command");
    }
    rt.block_on(server.shutdown());
}

/// "Run the tests and fix the failure": a project whose check fails, a model (the mock) that
/// runs the check, fixes the file and runs the check again, both tools allowed by rules.
#[test]
fn run_the_tests_and_fix_the_failure_end_to_end() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        vec![
            vec![call("run_command", json!({"command": ["sh", "check.sh"]}))],
            vec![call(
                "write_file",
                json!({"path": "config.txt", "content": "answer = 42\n"}),
            )],
            vec![call(
                "run_command",
                json!({"command": ["sh", "./check.sh"]}),
            )],
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("check.sh"),
        "if grep -q '^answer = 42$' config.txt; then echo PASS; else \
         echo 'FAIL: answer should be 42' >&2; exit 1; fi\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("config.txt"), "answer = 41\n").unwrap();
    let out = run(
        dir.path(),
        &server.base_url(),
        &[
            "--allow-commands",
            "--allow-shell",
            "--allow-write",
            "--ask",
            "write_file:*.sh",
            "--allow",
            "run_command:sh *check.sh",
            "--allow",
            "write_file:config.txt",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3, "{v}");
    assert_eq!(calls[0]["result"]["data"]["exit_code"], 1);
    assert!(
        calls[0]["result"]["data"]["stderr"]
            .as_str()
            .unwrap()
            .contains("FAIL")
    );
    assert_eq!(calls[1]["status"], "ok");
    assert_eq!(calls[2]["result"]["data"]["exit_code"], 0);
    assert_eq!(calls[2]["result"]["data"]["stdout"], "PASS\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("config.txt")).unwrap(),
        "answer = 42\n"
    );
    let check = std::process::Command::new("sh")
        .arg("check.sh")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "the check passes afterwards");
    rt.block_on(server.shutdown());
}

/// The pid of `toolloop` under `script` (its child, or grandchild).
fn toolloop_pid(script_pid: u32) -> Option<i32> {
    let mut todo = vec![script_pid as i32];
    while let Some(pid) = todo.pop() {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for c in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            let exe = std::fs::read_link(format!("/proc/{c}/exe")).ok();
            if exe.is_some_and(|e| e.to_string_lossy().contains("toolloop")) {
                return Some(c);
            }
            todo.push(c);
        }
    }
    None
}

/// On a terminal (a pseudo-terminal from `script`) the command asks; SIGKILL while it waits,
/// and `resume` asks again, and nothing unapproved ran.
#[test]
fn killed_while_asking_on_a_terminal_resume_asks_again() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("note: `script` (util-linux) is missing; the terminal test is skipped");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        vec![vec![call(
            "run_command",
            json!({"command": ["touch", "asked.txt"]}),
        )]],
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_toolloop");
    let base = format!("{}/v1", server.base_url());
    let line = format!(
        "{bin} run --model openai:mock --base-url {base} --allow-commands --sandbox off go; echo EXIT=$?"
    );
    // A store of its own: the killed run is the only unfinished one in it.
    let store = dir.path().join("own.db").to_string_lossy().into_owned();
    let template = command(&[], dir.path());
    let mut child = std::process::Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .current_dir(dir.path())
        .env_clear()
        .envs(
            template
                .get_envs()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
        )
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("TOOLLOOP_STORE", &store)
        .env("TERM", "dumb")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let wait_for = |seen: &mut String, what: &str| {
        let start = Instant::now();
        while !seen.contains(what) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no `{what}` in: {seen}"
            );
            if let Ok(b) = rx.recv_timeout(Duration::from_millis(100)) {
                seen.push_str(&String::from_utf8_lossy(&b));
            }
        }
    };
    wait_for(&mut seen, "allow? [y]es");
    assert!(seen.contains("touch asked.txt"), "{seen}");
    let pid = toolloop_pid(child.id()).expect("toolloop runs under script");
    // SAFETY: a plain kill(2) of a process this test started.
    unsafe {
        libc_kill(pid, 9);
    }
    wait_for(&mut seen, "EXIT=");
    let _ = child.stdin.take().map(|mut s| s.write_all(b""));
    let _ = child.wait();
    assert!(!dir.path().join("asked.txt").exists());

    // The run was interrupted while asking: its call still waits, and runs once approved.
    let out = toolloop(&["runs", "--json", "--store", &store], dir.path());
    let runs: Value = json_of(&out);
    let run_id = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["status"] == "interrupted")
        .and_then(|r| r["run_id"].as_str())
        .expect("the killed run is interrupted")
        .to_string();
    let out = toolloop(&["approve", &run_id, "--store", &store], dir.path());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("touch asked.txt"),
        "the call still waits: {}",
        stderr(&out)
    );
    let out = toolloop(
        &["approve", &run_id, "--all", "--store", &store],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = toolloop(
        &["resume", &run_id, "--json", "--store", &store],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join("asked.txt").exists());
    rt.block_on(server.shutdown());
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
