//! The command sandbox through `toolloop run --allow-commands`, with the mock model making exact
//! calls: unattended commands that cannot write outside the root or read a planted key, the
//! request to leave the sandbox asked about even with a rule that allows commands, and the
//! forced "no sandbox" mode that warns and asks.
#![cfg(target_os = "linux")]

use crate::common;
use common::{command, json_of, stderr};

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use toolloop_mock::{MockOptions, MockServer, ScriptCall};

fn mock(rt: &tokio::runtime::Runtime, calls: Vec<Value>) -> MockServer {
    let script = calls
        .into_iter()
        .map(|arguments| {
            vec![ScriptCall {
                name: "run_command".into(),
                arguments,
            }]
        })
        .collect();
    rt.block_on(toolloop_mock::start(MockOptions {
        script,
        ..MockOptions::default()
    }))
    .unwrap()
}

/// A project (`root`), a directory beside it, and a home with a planted key and a toolloop
/// configuration directory.
struct Place {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    home: PathBuf,
}

fn place() -> Place {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let (root, outside, home) = (base.join("root"), base.join("outside"), base.join("home"));
    for d in [
        &root,
        &outside,
        &home.join(".ssh"),
        &home.join(".config/toolloop"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    std::fs::write(home.join(".config/toolloop/models.toml"), "KEPT").unwrap();
    Place {
        _dir: dir,
        root,
        outside,
        home,
    }
}

fn run(p: &Place, server: &MockServer, flags: &[&str], env: &[(&str, &str)]) -> Output {
    let base = format!("{}/v1", server.base_url());
    let mut args = vec![
        "run",
        "--json",
        "--model",
        "openai:mock",
        "--base-url",
        &base,
        "--allow-commands",
        "--allow-shell",
    ];
    args.extend_from_slice(flags);
    args.push("go");
    let mut c = command(&args, &p.root);
    c.env("HOME", &p.home).env_remove("XDG_CONFIG_HOME");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn sh(script: String) -> Value {
    json!({"command": ["sh", "-c", script]})
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display())
}

#[test]
fn unattended_commands_write_in_the_root_only_and_cannot_read_secrets() {
    let p = place();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let key = p.home.join(".ssh/id_ed25519");
    let server = mock(
        &rt,
        vec![
            sh("echo made > inside.txt".into()),
            sh(format!("echo pwned > {}", q(&p.outside.join("escaped")))),
            sh(format!("cat {}", q(&key))),
            sh(format!(
                "cat {}",
                q(&p.home.join(".config/toolloop/models.toml"))
            )),
        ],
    );
    // No rule, no terminal: the sandbox lets the commands run, and stops them at its walls.
    let out = run(&p, &server, &[], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 4, "{v}");
    for c in calls {
        assert_eq!(c["status"], "ok", "ran without asking: {c}");
    }
    assert_eq!(
        std::fs::read_to_string(p.root.join("inside.txt")).unwrap(),
        "made\n"
    );
    assert!(!p.outside.join("escaped").exists());
    for c in &calls[1..] {
        let data = &c["result"]["data"];
        assert_ne!(data["exit_code"], 0, "{c}");
        assert!(!data["stdout"].as_str().unwrap().contains("PRIVATE"), "{c}");
        assert!(!data["stdout"].as_str().unwrap().contains("KEPT"), "{c}");
        assert!(
            data["sandbox"]
                .as_str()
                .unwrap()
                .contains("\"sandbox\": false"),
            "{c}"
        );
    }
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));

    // The same calls with `--sandbox off` are asked about, and without a terminal denied.
    let server2 = mock(&rt, vec![sh("echo made > off.txt".into())]);
    let out = run(&p, &server2, &["--sandbox", "off"], &[]);
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["status"], "denied", "{v}");
    assert!(!p.root.join("off.txt").exists());
    rt.block_on(server.shutdown());
    rt.block_on(server2.shutdown());
}

#[test]
fn leaving_the_sandbox_is_asked_about_even_when_a_rule_allows_commands() {
    let p = place();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let target = p.outside.join("escaped");
    let mut args = sh(format!("echo pwned > {}", q(&target)));
    args["sandbox"] = json!(false);
    let server = mock(&rt, vec![args.clone()]);
    let out = run(&p, &server, &["--allow", "run_command"], &[]);
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["status"], "denied", "{v}");
    // The denial names what can let it out (a person, or no sandbox), never a rule (none can).
    let err = stderr(&out);
    assert!(
        err.contains("no terminal")
            && err.contains("only a person can approve")
            && err.contains("--defer-approvals")
            && err.contains("--sandbox off"),
        "{err}"
    );
    assert!(!err.contains("allow it with --allow"), "{err}");
    assert!(!target.exists());
    // A person's approval lets it out: deferred, approved, resumed.
    let server2 = mock(&rt, vec![args]);
    let out = run(
        &p,
        &server2,
        &["--allow", "run_command", "--defer-approvals"],
        &[],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = json_of(&out);
    let run_id = v["run_id"].as_str().unwrap().to_string();
    let approve = command(&["approve", &run_id, "--all"], &p.root)
        .env("HOME", &p.home)
        .output()
        .unwrap();
    assert!(approve.status.success(), "{}", stderr(&approve));
    let resumed = command(&["resume", &run_id, "--json"], &p.root)
        .env("HOME", &p.home)
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "pwned\n");
    rt.block_on(server.shutdown());
    rt.block_on(server2.shutdown());
}

#[test]
fn without_a_sandbox_a_warning_says_so_and_commands_are_asked_about() {
    let p = place();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, vec![sh("echo made > inside.txt".into())]);
    let out = run(&p, &server, &[], &[("TOOLLOOP_SANDBOX_UNAVAILABLE", "1")]);
    let err = stderr(&out);
    assert!(
        err.contains("warning: commands cannot run in a sandbox here")
            && err.contains("TOOLLOOP_SANDBOX_UNAVAILABLE"),
        "{err}"
    );
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["status"], "denied", "{v}");
    assert!(err.contains("no terminal"), "{err}");
    assert!(!p.root.join("inside.txt").exists());
    // A rule still allows what it names, outside the sandbox.
    let server2 = mock(
        &rt,
        vec![sh(format!("echo out > {}", q(&p.outside.join("f"))))],
    );
    let out = run(
        &p,
        &server2,
        &["--allow", "run_command"],
        &[("TOOLLOOP_SANDBOX_UNAVAILABLE", "1")],
    );
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["status"], "ok", "{v}");
    assert!(p.outside.join("f").exists());
    rt.block_on(server.shutdown());
    rt.block_on(server2.shutdown());
}

#[test]
fn the_configuration_file_sets_the_sandbox() {
    let p = place();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = p.home.join("config.toml");
    std::fs::write(&config, "sandbox = \"read-only\"\n").unwrap();
    let server = mock(&rt, vec![sh("echo made > inside.txt".into())]);
    let out = run(
        &p,
        &server,
        &[],
        &[("TOOLLOOP_CONFIG", config.to_str().unwrap())],
    );
    let v = json_of(&out);
    let call = &v["tool_calls"][0];
    assert_eq!(call["status"], "ok", "{v}");
    assert_ne!(call["result"]["data"]["exit_code"], 0, "{v}");
    assert!(!p.root.join("inside.txt").exists());
    rt.block_on(server.shutdown());
}

#[test]
fn a_root_that_holds_a_secret_path_is_warned_about() {
    let p = place();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, vec![sh("true".into())]);
    let home = p.home.to_str().unwrap().to_string();
    let out = run(&p, &server, &["--root", &home], &[]);
    let err = stderr(&out);
    assert!(
        err.contains("warning:") && err.contains(".ssh") && err.contains("inside --root"),
        "{err}"
    );
    // Not with a root beside the secrets.
    let server2 = mock(&rt, vec![sh("true".into())]);
    let out = run(&p, &server2, &[], &[]);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    rt.block_on(server.shutdown());
    rt.block_on(server2.shutdown());
}

#[test]
fn sandbox_network_lets_commands_connect() {
    let p = place();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = || {
        json!({"command": ["bash", "-c",
            format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected")]})
    };
    let server = mock(&rt, vec![connect()]);
    let out = run(&p, &server, &[], &[]);
    let v = json_of(&out);
    let data = &v["tool_calls"][0]["result"]["data"];
    assert_ne!(data["exit_code"], 0, "{v}");
    assert!(listener.accept().is_err(), "a sandboxed command connected");
    let server2 = mock(&rt, vec![connect()]);
    let out = run(&p, &server2, &["--sandbox-network"], &[]);
    let v = json_of(&out);
    let data = &v["tool_calls"][0]["result"]["data"];
    assert_eq!(data["stdout"], "connected\n", "{v}");
    assert!(listener.accept().is_ok());
    rt.block_on(server.shutdown());
    rt.block_on(server2.shutdown());
}
