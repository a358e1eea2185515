//! `run_command` with real processes: exit codes, capped output, no shell by default, and a
//! whole process group killed at the timeout or on cancellation.
#![cfg(unix)]

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use toolloop::tool::{Tool, ToolContext};
use toolloop_tools::command::{CommandConfig, RunCommand};

fn tool(root: &Path, f: impl FnOnce(&mut CommandConfig)) -> RunCommand {
    let mut c = CommandConfig::new(root);
    f(&mut c);
    RunCommand::new(c).unwrap()
}

fn ctx() -> ToolContext {
    ToolContext::detached("c1", "run_command")
}

/// Whether process `pid` is gone (or a zombie nobody waits for yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_gone(pid: i32) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn exit_code_and_output_come_back() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), "hello").unwrap();
    let t = tool(dir.path(), |_| {});
    let out = t
        .call(json!({"command": ["cat", "f.txt"]}), ctx())
        .await
        .unwrap();
    let data = out.data.unwrap();
    assert_eq!(data["exit_code"], 0);
    assert_eq!(data["stdout"], "hello");
    let out = t
        .call(json!({"command": ["ls", "no-such-file"]}), ctx())
        .await
        .unwrap();
    let data = out.data.unwrap();
    assert_ne!(data["exit_code"], 0);
    assert!(data["stderr"].as_str().unwrap().contains("no-such-file"));
    assert_eq!(out.message, format!("exit code {}", data["exit_code"]));
}

#[tokio::test]
async fn shells_are_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |_| {});
    let e = t
        .call(json!({"command": ["sh", "-c", "echo hi"]}), ctx())
        .await
        .unwrap_err();
    assert!(e.message.contains("shell"), "{}", e.message);
    let e = t
        .call(json!({"command": ["/usr/bin/env", "sh"]}), ctx())
        .await
        .unwrap_err();
    assert!(e.message.contains("shell"), "{}", e.message);
    let t = tool(dir.path(), |c| c.allow_shell = true);
    let out = t
        .call(json!({"command": ["sh", "-c", "echo hi"]}), ctx())
        .await
        .unwrap();
    assert_eq!(out.data.unwrap()["stdout"], "hi\n");
    assert_eq!(
        t.approval_subject(&json!({"command": ["sh", "-c", "echo hi; rm x"]}))
            .text,
        "sh -c 'echo hi; rm x'"
    );
}

#[tokio::test]
async fn long_output_keeps_head_and_tail() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| c.max_output_bytes = 1000);
    let out = t
        .call(json!({"command": ["seq", "1", "100000"]}), ctx())
        .await
        .unwrap();
    let stdout = out.data.unwrap()["stdout"].as_str().unwrap().to_string();
    assert!(stdout.starts_with("1\n2\n3\n"), "{stdout}");
    assert!(stdout.ends_with("99999\n100000\n"), "{stdout}");
    assert!(stdout.contains("bytes left out"), "{stdout}");
    assert!(stdout.len() < 1200, "{}", stdout.len());
}

/// A command that ignores SIGTERM, with a child that ignores it too: at the timeout the whole
/// group is killed (SIGKILL after the grace period), and the call returns.
#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_with_its_children_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| {
        c.allow_shell = true;
        c.timeout = Duration::from_millis(500);
        c.kill_grace = Duration::from_millis(300);
    });
    let script = "trap '' TERM; sh -c \"trap '' TERM; sleep 1000\" & echo $! > child.pid; \
                  echo $$ > parent.pid; while :; do sleep 1; done";
    let start = Instant::now();
    let e = t
        .call(json!({"command": ["sh", "-c", script]}), ctx())
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(e.message.contains("did not finish"), "{}", e.message);
    assert!(took < Duration::from_secs(4), "{took:?}");
    for f in ["parent.pid", "child.pid"] {
        let pid: i32 = std::fs::read_to_string(dir.path().join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(wait_gone(pid), "{f} ({pid}) still runs");
    }
}

#[tokio::test]
async fn cancelling_the_run_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| c.kill_grace = Duration::from_millis(200));
    let c = ctx();
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let start = Instant::now();
    let e = t
        .call(json!({"command": ["sleep", "1000"]}), c)
        .await
        .unwrap_err();
    assert!(e.message.contains("cancelled"), "{}", e.message);
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_dropped_call_leaves_nothing_running() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| c.allow_shell = true);
    let call = t.call(
        json!({"command": ["sh", "-c", "echo $$ > p.pid; exec sleep 1000"]}),
        ctx(),
    );
    let _ = tokio::time::timeout(Duration::from_millis(500), call).await;
    let pid: i32 = std::fs::read_to_string(dir.path().join("p.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(wait_gone(pid), "{pid} still runs");
}

/// The pid written to `file` in `dir`, once it is there.
fn pid_in(dir: &Path, file: &str) -> i32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join(file))
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{file} never written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A grandchild that leaves the command's process group and session (`setsid`) is killed
/// at the timeout with the rest.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_grandchild_that_calls_setsid_is_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| {
        c.allow_shell = true;
        c.timeout = Duration::from_millis(800);
        c.kill_grace = Duration::from_millis(200);
    });
    let script = "setsid sh -c 'echo $$ > gc.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 & \
                  while [ ! -s gc.pid ]; do sleep 0.05; done; sleep 1000";
    let start = Instant::now();
    let e = t
        .call(json!({"command": ["sh", "-c", script]}), ctx())
        .await
        .unwrap_err();
    assert!(e.message.contains("did not finish"), "{}", e.message);
    assert!(start.elapsed() < Duration::from_secs(5));
    let pid = pid_in(dir.path(), "gc.pid");
    assert!(wait_gone(pid), "the setsid grandchild {pid} still runs");
}

/// A command that exits at once, leaving a grandchild in a session of its own (a daemon),
/// does not leave it running.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_daemon_left_behind_by_a_command_that_exited_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| c.allow_shell = true);
    let script = "setsid sh -c 'echo $$ > gc.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 & \
                  while [ ! -s gc.pid ]; do sleep 0.05; done; exit 0";
    let out = t
        .call(json!({"command": ["sh", "-c", script]}), ctx())
        .await
        .unwrap();
    assert_eq!(out.data.unwrap()["exit_code"], 0);
    let pid = pid_in(dir.path(), "gc.pid");
    assert!(wait_gone(pid), "the daemon {pid} still runs");
}

/// A grandchild orphaned inside the command (its parent exited) that also cleared its
/// environment is still in the command's tree while the command runs (the command is a
/// child subreaper), and is killed at the timeout.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_orphan_that_cleared_its_environment_is_killed_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |c| {
        c.allow_shell = true;
        c.timeout = Duration::from_millis(800);
        c.kill_grace = Duration::from_millis(200);
    });
    let script = "(setsid /usr/bin/env -i /bin/sh -c 'echo $$ > gc.pid; exec sleep 1000' \
                   </dev/null >/dev/null 2>&1 &); \
                  while [ ! -s gc.pid ]; do sleep 0.05; done; sleep 1000";
    let e = t
        .call(json!({"command": ["sh", "-c", script]}), ctx())
        .await
        .unwrap_err();
    assert!(e.message.contains("did not finish"), "{}", e.message);
    let pid = pid_in(dir.path(), "gc.pid");
    assert!(wait_gone(pid), "the orphan {pid} still runs");
}

#[test]
fn the_schema_asks_for_an_argument_vector() {
    let dir = tempfile::tempdir().unwrap();
    let t = tool(dir.path(), |_| {});
    let schema: &Value = t.parameters();
    assert_eq!(schema["properties"]["command"]["type"], "array");
    assert_eq!(t.default_approval(), toolloop::approval::Action::Ask);
}
