//! Approvals in the command, against the mock server making exact calls (`MockOptions::script`):
//! rules, the denial without a terminal, deferred decisions across processes, the terminal
//! question killed mid-way, the child's scrubbed environment, and "run the tests and fix the
//! failure" end to end.

use crate::common;
use common::{Transcript, call, command, json_of, scripted_mock, stderr, toolloop};

use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

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
    let server = scripted_mock(
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
    let server = scripted_mock(
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
    // `toolloop runs` shows it waiting, not interrupted.
    let status = |run_id: &str| {
        let out = toolloop(&["runs", "--json"], dir.path());
        json_of(&out)
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == run_id)
            .map(|r| r["status"].clone())
            .unwrap()
    };
    assert_eq!(status(&run_id), "awaiting_approval");
    let listed = toolloop(&["runs"], dir.path());
    let line = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .find(|l| l.starts_with(&run_id))
        .map(str::to_string)
        .unwrap();
    assert!(line.contains("awaiting_approval"), "{line}");

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
    assert_eq!(status(&run_id), "finished");
    assert_eq!(server.stats().rejected, 0, "every call was answered once");
    rt.block_on(server.shutdown());
}

#[test]
fn keys_are_absent_from_a_commands_environment() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
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
    let server = scripted_mock(
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
        panic!(
            "`script` (util-linux; Debian: bsdutils) is needed to run the command on a terminal"
        );
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
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
    let mut screen = Transcript::of(child.stdout.take().unwrap());
    screen.wait_for("allow? [y]es", 1, Duration::from_secs(30));
    assert!(screen.seen.contains("touch asked.txt"), "{}", screen.seen);
    let pid = toolloop_pid(child.id()).expect("toolloop runs under script");
    // SAFETY: a plain kill(2) of a process this test started.
    unsafe {
        libc_kill(pid, 9);
    }
    screen.wait_for("EXIT=", 1, Duration::from_secs(30));
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

/// The path of `program` on PATH.
fn which(program: &str) -> String {
    let path = std::env::var_os("PATH").unwrap();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is on PATH"))
        .to_string_lossy()
        .into_owned()
}

/// `--ask` and `--deny` rules hold whatever the spelling: `./`, a trailing `/`, a link inside
/// the root, a program by its full path. Every other call of these tools is allowed, so only
/// the rules stop them.
#[test]
fn ask_and_deny_rules_win_over_every_spelling() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rm = which("rm");
    let server = scripted_mock(
        &rt,
        vec![vec![
            call(
                "write_file",
                json!({"path": "./src/main.rs", "content": "changed"}),
            ),
            call(
                "write_file",
                json!({"path": "Cargo.lock/", "content": "changed"}),
            ),
            call("write_file", json!({"path": "lk", "content": "changed"})),
            call("read_file", json!({"path": "sl"})),
            call("run_command", json!({"command": [rm, "b"]})),
            call("run_command", json!({"command": ["env", "rm", "b"]})),
            call(
                "write_file",
                json!({"path": "notes.txt", "content": "fine"}),
            ),
        ]],
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(root.join("Cargo.lock"), "# lock\n").unwrap();
    std::fs::write(root.join("secret.env"), "KEY=abc\n").unwrap();
    std::fs::write(root.join("b"), "keep\n").unwrap();
    std::os::unix::fs::symlink("Cargo.lock", root.join("lk")).unwrap();
    std::os::unix::fs::symlink("secret.env", root.join("sl")).unwrap();
    let out = run(
        root,
        &server.base_url(),
        &[
            "--allow-commands",
            "--allow-shell",
            "--allow-write",
            "--allow",
            "run_command",
            "--allow",
            "write_file",
            "--ask",
            "write_file:src/*",
            "--deny",
            "write_file:*.lock",
            "--deny",
            "read_file:*.env",
            "--deny",
            "run_command:rm *",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    let statuses: Vec<&str> = calls
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "denied", "denied", "denied", "denied", "denied", "denied", "ok"
        ],
        "{v}"
    );
    let message = |i: usize| calls[i]["result"]["message"].as_str().unwrap().to_string();
    assert!(message(0).contains("no one to approve"), "{}", message(0));
    assert!(
        message(1).contains("`deny write_file:*.lock`"),
        "{}",
        message(1)
    );
    assert!(
        message(2).contains("`deny write_file:*.lock`"),
        "{}",
        message(2)
    );
    assert!(
        message(3).contains("`deny read_file:*.env`"),
        "{}",
        message(3)
    );
    assert!(
        message(4).contains("`deny run_command:rm *`"),
        "{}",
        message(4)
    );
    assert!(
        message(5).contains("`deny run_command:rm *`"),
        "{}",
        message(5)
    );
    // The asked call is shown by the path it touches.
    assert!(
        stderr(&out).contains("--allow 'write_file:src/main.rs'"),
        "{}",
        stderr(&out)
    );
    assert!(
        !v.to_string().contains("KEY=abc"),
        "the secret was not read"
    );
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(read("src/main.rs"), "fn main() {}\n");
    assert_eq!(read("Cargo.lock"), "# lock\n");
    assert_eq!(read("b"), "keep\n");
    assert_eq!(read("notes.txt"), "fine");
    rt.block_on(server.shutdown());
}

/// A rule that names a tool the run does not offer does nothing: the command says so.
#[test]
fn a_rule_for_a_tool_not_offered_is_warned_about() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(&rt, Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &server.base_url(),
        &[
            "--allow",
            "run_command:cargo test*",
            "--deny",
            "write_file:*.lock",
            "--ask",
            "read_*",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "warning: --allow 'run_command:cargo test*' does nothing: it names no tool this run \
             offers; run_command is offered with --allow-commands"
        ),
        "{err}"
    );
    assert!(
        err.contains("--deny 'write_file:*.lock' does nothing")
            && err.contains("offered with --allow-write"),
        "{err}"
    );
    assert!(
        !err.contains("--ask 'read_*'"),
        "read_file is offered: {err}"
    );
    // Offered: no warning.
    let out = run(
        dir.path(),
        &server.base_url(),
        &["--allow-commands", "--allow", "run_command:cargo test*"],
    );
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    rt.block_on(server.shutdown());
}

/// "always" on a terminal: yes to this call, and to every later call of the same tool on the
/// same subject (the same file, whatever the content, however the path is spelled) in this
/// run; another file is asked about again. The question says exactly that.
#[test]
fn always_covers_later_calls_on_the_same_subject_as_the_question_says() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!(
            "`script` (util-linux; Debian: bsdutils) is needed to run the command on a terminal"
        );
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = scripted_mock(
        &rt,
        vec![
            vec![call(
                "write_file",
                json!({"path": "notes/a.txt", "content": "one"}),
            )],
            vec![call(
                "write_file",
                json!({"path": "./notes//a.txt", "content": "two"}),
            )],
            vec![call(
                "write_file",
                json!({"path": "notes/b.txt", "content": "three"}),
            )],
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_toolloop");
    let base = format!("{}/v1", server.base_url());
    let line = format!(
        "{bin} run --model openai:mock --base-url {base} --allow-write --ask 'write_file:*' go; \
         echo EXIT=$?"
    );
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
        .env("TERM", "dumb")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut screen = Transcript::of(child.stdout.take().unwrap());
    let question = "allow? [y]es / [n]o / [a]lways";
    screen.wait_for(question, 1, Duration::from_secs(30));
    // The question may arrive in pieces: wait for its end before reading it whole.
    screen.wait_for("(whatever the content)", 1, Duration::from_secs(30));
    assert!(
        screen.seen.contains(
            "[a]lways: yes, and to every later `write_file` call on `notes/a.txt` in this run \
             (whatever the content)"
        ),
        "{}",
        screen.seen
    );
    stdin.write_all(b"a\n").unwrap();
    stdin.flush().unwrap();
    // The second write (same file, another spelling, other content) is not asked about; the
    // third (another file) is.
    screen.wait_for(question, 2, Duration::from_secs(30));
    assert!(screen.seen.contains("notes/b.txt"), "{}", screen.seen);
    stdin.write_all(b"n\n").unwrap();
    stdin.flush().unwrap();
    screen.wait_for("EXIT=", 1, Duration::from_secs(30));
    drop(stdin);
    let _ = child.wait();
    assert!(screen.seen.contains("EXIT=0"), "{}", screen.seen);
    assert_eq!(screen.seen.matches(question).count(), 2, "{}", screen.seen);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/a.txt")).unwrap(),
        "two"
    );
    assert!(!dir.path().join("notes/b.txt").exists());
    rt.block_on(server.shutdown());
}

/// Rules weigh a round's calls before any of them runs; a call that then makes a link (or a
/// program) does not lead a later call of the same round past a rule: that call is weighed
/// again before it runs, and not run when what it touches changed.
#[test]
fn a_link_made_in_the_same_round_does_not_slip_past_a_rule() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rm = which("rm");
    let server = scripted_mock(
        &rt,
        vec![vec![
            call("run_command", json!({"command": ["ln", "-s", rm, "del"]})),
            call("run_command", json!({"command": ["./del", "b"]})),
            call(
                "run_command",
                json!({"command": ["ln", "-s", "Cargo.lock", "lk"]}),
            ),
            call("write_file", json!({"path": "lk", "content": "changed"})),
            call(
                "write_file",
                json!({"path": "other.txt", "content": "fine"}),
            ),
        ]],
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("Cargo.lock"), "# lock\n").unwrap();
    std::fs::write(root.join("b"), "keep\n").unwrap();
    let out = run(
        root,
        &server.base_url(),
        &[
            "--allow-commands",
            "--allow-write",
            "--allow",
            "run_command",
            "--deny",
            "run_command:rm *",
            "--deny",
            "write_file:*.lock",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    let message = |i: usize| calls[i]["result"]["message"].as_str().unwrap().to_string();
    assert_eq!(calls[0]["status"], "ok", "{v}");
    assert!(
        message(1).contains("not run: what this call touches changed")
            && message(1).contains("`./del b` now resolves to something else"),
        "{}",
        message(1)
    );
    assert_eq!(calls[2]["status"], "ok", "{v}");
    assert!(
        message(3).contains("`lk` is now `Cargo.lock`"),
        "{}",
        message(3)
    );
    assert_eq!(calls[4]["status"], "ok", "{v}");
    assert_eq!(std::fs::read_to_string(root.join("b")).unwrap(), "keep\n");
    assert_eq!(
        std::fs::read_to_string(root.join("Cargo.lock")).unwrap(),
        "# lock\n"
    );
    rt.block_on(server.shutdown());
}
