//! `toolloop serve --restate`: the command's agent (flags, tools, limits) served to a real
//! Restate server (the npm package's binary, from `scripts/npm-install`; skipped with a note
//! when missing), a run invoked on the ingress as the README's `curl` example does.

#![cfg(feature = "restate")]

use crate::restate_server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_toolloop");

#[test]
fn serve_runs_the_commands_agent_for_restate() {
    let Some(binary) = restate_server::server_binary() else {
        eprintln!("skipped: the Restate server is not installed (run scripts/npm-install)");
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let server = restate_server::RestateServer::start(&binary);
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("notes.txt"), "hello").unwrap();
    let port = restate_server::free_port();
    let mut worker = Command::new(BIN)
        .args(["serve", "--restate", &format!("127.0.0.1:{port}")])
        .args(["--admin-url", &server.admin])
        .args(["--model", "openai:mock:rounds=1,parallel=2"])
        .args(["--base-url", &format!("{}/v1", mock.base_url())])
        .args(["--max-rounds", "3"])
        .arg("--root")
        .arg(root.path())
        .env("OPENAI_API_KEY", "test")
        .env_remove("TOOLLOOP_MODEL")
        .env_remove("TOOLLOOP_TEST_EFFECTS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(worker.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("registered") {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let _ = worker.kill();
            panic!("the worker stopped: {said}");
        }
        said.push_str(&line);
    }
    assert!(said.contains(&format!("127.0.0.1:{port}")), "{said}");
    // The README's curl: a prompt, the run id as idempotency key.
    let body: serde_json::Value = rt.block_on(async {
        http_client()
            .post(format!("{}/toolloop/cli-1/run", server.ingress))
            .header("idempotency-key", "cli-1")
            .json(&serde_json::json!({"prompt": "look around"}))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(body["stop_reason"], "answered", "{body}");
    assert_eq!(
        body["text"], "Done. I saw 2 tool results in 1 rounds.",
        "{body}"
    );
    assert_eq!(body["run_id"], "cli-1");
    // The command's file tools ran in --root.
    let calls = body["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{body}");
    assert_eq!(mock.stats().requests, 2);
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
