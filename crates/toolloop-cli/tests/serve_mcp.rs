//! `toolloop serve --mcp` with the official MCP Python SDK client (installed by
//! `scripts/python-install` from the hashed lock file), over stdio and streamable HTTP: the
//! agents listed as tools, a run with progress notifications, its answer as text or structured
//! content, approvals by elicitation, and the token of the HTTP endpoint.

use crate::common;
use crate::python;
use common::{Served, mock, rt};

use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const NEEDS_PYTHON: &str = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_client.py")
}

/// The environment `toolloop serve` runs in: a throwaway store, none of the user's settings.
fn server_env() -> Value {
    json!({
        "TOOLLOOP_STORE": common::test_store(),
        "TOOLLOOP_CONFIG": "",
        "OPENAI_API_KEY": "test",
    })
}

/// Runs the client over stdio against `toolloop serve --mcp ARGS`; what it saw.
fn over_stdio(args: &[&str], mode: &str, elicit: Option<&str>) -> Value {
    over_stdio_env(args, mode, elicit, &[])
}

fn over_stdio_env(args: &[&str], mode: &str, elicit: Option<&str>, env: &[(&str, &str)]) -> Value {
    let mut full = vec!["serve", "--mcp"];
    full.extend_from_slice(args);
    let mut c = std::process::Command::new(python::python());
    c.arg(script())
        .arg("stdio")
        .arg(env!("CARGO_BIN_EXE_toolloop"))
        .arg(serde_json::to_string(&full).unwrap())
        .arg(server_env().to_string())
        .arg(mode);
    match elicit {
        Some(e) => c.env("ELICIT", e),
        None => c.env_remove("ELICIT"),
    };
    c.env_remove("CANCEL_AFTER")
        .env_remove("CALL_TOOL")
        .env_remove("CALL_ARGS")
        .env_remove("CONCURRENT");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)"
)]
fn the_mcp_python_sdk_runs_the_agent_over_stdio_with_progress() {
    let _ = NEEDS_PYTHON;
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let root = dir.path().to_str().unwrap();
    let agents = dir.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.lister]\ndescription = \"Lists directories.\"\ntools = [\"list_dir\"]\n",
    )
    .unwrap();
    let seen = over_stdio(
        &[
            "--model",
            "openai:mock:rounds=2",
            "--base-url",
            &url,
            "--root",
            root,
            "--agents",
            agents.to_str().unwrap(),
        ],
        "auto",
        None,
    );
    assert_eq!(seen["tools"][0]["name"], "default", "{seen}");
    // A declared agent is a tool of its own, described as declared.
    assert_eq!(seen["tools"][1]["name"], "lister", "{seen}");
    assert_eq!(seen["tools"][1]["description"], "Lists directories.");
    assert_eq!(seen["tools"][1]["input"]["required"], json!(["task"]));
    assert_eq!(seen["tools"][0]["input"]["required"], json!(["task"]));
    assert_eq!(seen["is_error"], false, "{seen}");
    assert_eq!(
        seen["text"],
        json!(["Done. I saw 2 tool results in 2 rounds."])
    );
    let progress: Vec<&str> = seen["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(progress.contains(&"round 1"), "{progress:?}");
    assert!(
        progress.iter().any(|p| p.starts_with("round 1: calling ")),
        "{progress:?}"
    );
    assert!(progress.contains(&"round 3"), "{progress:?}");
    rt.block_on(mock.shutdown());
}

#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)"
)]
fn approvals_inside_a_run_are_asked_of_the_mcp_client_by_elicitation() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let root = dir.path().to_str().unwrap();
    let args = [
        "--model",
        "openai:mock:rounds=1",
        "--base-url",
        &url,
        "--root",
        root,
        "--ask",
        "*",
    ];
    // Over stdio the SDK's `auto` mode settles on a protocol before 2026-07-28 too: the
    // question is an elicitation request from the server (the HTTP test covers 2026-07-28).
    for mode in ["legacy", "auto"] {
        let yes = over_stdio(&args, mode, Some("yes"));
        assert_eq!(
            yes["elicitations"].as_array().unwrap().len(),
            1,
            "{mode}: {yes}"
        );
        assert!(
            yes["elicitations"][0]
                .as_str()
                .unwrap()
                .contains("Approve this call?"),
            "{mode}: {yes}"
        );
        assert_eq!(yes["is_error"], false, "{mode}: {yes}");
        let no = over_stdio(&args, mode, Some("no"));
        assert_eq!(
            no["elicitations"].as_array().unwrap().len(),
            1,
            "{mode}: {no}"
        );
        assert_eq!(no["is_error"], false, "{mode}: {no}");
        // The model read the denial as the call's result (its call failed) and answered.
        assert_eq!(
            no["text"],
            json!(["Done. I saw 1 tool results in 1 rounds."])
        );
    }
    rt.block_on(mock.shutdown());
}

/// Starts `toolloop serve --mcp 127.0.0.1:0 ARGS` in `dir`, and waits for its address.
fn serve(dir: &Path, args: &[&str]) -> Served {
    let args = [&["--mcp", "127.0.0.1:0"], args].concat();
    Served::start(dir, &args, &[], "serving the agents over MCP on ")
}
#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)"
)]
fn the_mcp_python_sdk_runs_the_agent_over_streamable_http_behind_the_token() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let schema = dir.path().join("answer.json");
    std::fs::write(
        &schema,
        json!({"title": "answer", "type": "object", "properties": {"summary": {"type": "string"}},
               "required": ["summary"], "additionalProperties": false})
        .to_string(),
    )
    .unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "mcp-token-7\n").unwrap();
    let served = serve(
        dir.path(),
        &[
            "--model",
            "openai:mock:rounds=1",
            "--base-url",
            &url,
            "--output-schema",
            schema.to_str().unwrap(),
            "--auth-token-file",
            token.to_str().unwrap(),
            "--ask",
            "*",
        ],
    );
    // Without the token: 401, before any MCP message is read.
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(&served.address)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(status, 401);
    for mode in ["auto", "legacy"] {
        let out = std::process::Command::new(python::python())
            .arg(script())
            .arg("http")
            .arg(&served.address)
            .arg("mcp-token-7")
            .arg(mode)
            .env("ELICIT", "yes")
            .env_remove("CANCEL_AFTER")
            .env_remove("CALL_TOOL")
            .env_remove("CALL_ARGS")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{mode}: {}\n{}\nserver: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            served.stderr()
        );
        let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(seen["tools"][0]["name"], "default", "{seen}");
        assert_eq!(seen["tools"][0]["output"]["title"], "answer", "{seen}");
        assert_eq!(seen["is_error"], false, "{seen}");
        assert!(seen["structured"]["summary"].is_string(), "{seen}");
        let text: Value = serde_json::from_str(seen["text"][0].as_str().unwrap()).unwrap();
        assert_eq!(text, seen["structured"]);
        assert!(!seen["progress"].as_array().unwrap().is_empty(), "{seen}");
        // The agent's call needed approval: asked by elicitation, a request from the server
        // before protocol 2026-07-28, the call's `input_required` result from then on.
        let protocol = seen["protocol"].as_str().unwrap();
        match mode {
            "auto" => assert!(protocol >= "2026-07-28", "{seen}"),
            _ => assert!(protocol < "2026-07-28", "{seen}"),
        }
        assert_eq!(
            seen["elicitations"].as_array().unwrap().len(),
            1,
            "{mode}: {seen}"
        );
    }
    drop(served);
    rt.block_on(mock.shutdown());
}

#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)"
)]
fn a_cancelled_call_stops_its_run_and_keeps_its_transcript() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let store = dir.path().join("store.db");
    let root = dir.path().to_str().unwrap();
    // The model takes 2 s for its second answer; the client gives up after 1.5 s.
    let seen = over_stdio_env(
        &[
            "--model",
            "openai:mock:rounds=1,latency=1s",
            "--base-url",
            &url,
            "--root",
            root,
            "--store",
            store.to_str().unwrap(),
        ],
        "auto",
        None,
        &[("CANCEL_AFTER", "1.5")],
    );
    assert!(seen["cancelled"].is_string(), "{seen}");
    let runs = rt.block_on(async {
        let store = toolloop_store::Store::open(store.to_str().unwrap())
            .await
            .unwrap();
        let runs = store.runs(None).await.unwrap();
        let mut out = Vec::new();
        for r in runs {
            let log = store.run_journal(Default::default());
            let records = log.load(&r.run_id).await.unwrap();
            out.push((r.stop_reason, records.len()));
        }
        out
    });
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].0, Some(toolloop::StopReason::Cancelled), "{runs:?}");
    // The first round (the call and its result) is in the run's log.
    assert!(runs[0].1 >= 3, "{runs:?}");
    rt.block_on(mock.shutdown());
}

#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)"
)]
fn a_workflow_is_a_tool_whose_inputs_are_its_arguments() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let file = dir.path().join("greet.toml");
    std::fs::write(
        &file,
        r#"
name = "greet"
description = "Greets someone, twice."
[inputs.who]
description = "Whom to greet"
[inputs.tone]
default = "warm"
[[steps]]
id = "one"
prompt = "Say hello to {{ inputs.who }}, {{ inputs.tone }}ly."
[[steps]]
id = "two"
prompt = "Again: {{ steps.one.output }}"
"#,
    )
    .unwrap();
    let seen = over_stdio_env(
        &[
            "--model",
            "openai:mock:rounds=0",
            "--base-url",
            &url,
            "--workflow",
            file.to_str().unwrap(),
        ],
        "auto",
        None,
        &[("CALL_TOOL", "greet"), ("CALL_ARGS", r#"{"who": "Ada"}"#)],
    );
    let tools = seen["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2, "{seen}");
    assert_eq!(tools[1]["name"], "greet");
    assert_eq!(tools[1]["input"]["required"], json!(["who"]), "{seen}");
    assert_eq!(tools[1]["input"]["properties"]["tone"]["default"], "warm");
    assert_eq!(seen["is_error"], false, "{seen}");
    assert_eq!(
        seen["text"],
        json!(["Done. I saw 0 tool results in 0 rounds."])
    );
    let progress = seen["progress"].to_string();
    assert!(
        progress.contains("step one") && progress.contains("step two"),
        "{seen}"
    );
    // Both steps asked the model, the first with the input filled in.
    assert_eq!(mock.stats().requests, 2);
    rt.block_on(mock.shutdown());
}

#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official MCP Python SDK (tools/python/requirements.txt)"
)]
fn runs_at_once_are_limited_and_each_run_has_the_agents_budgets() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let root = dir.path().to_str().unwrap();
    // One run at a time: of two calls at once (the model takes 1.5 s), one is refused at once
    // with a tool error that says why; the other answers.
    let seen = over_stdio_env(
        &[
            "--model",
            "openai:mock:rounds=0,latency=1500ms",
            "--base-url",
            &url,
            "--root",
            root,
            "--max-runs",
            "1",
        ],
        "auto",
        None,
        &[("CONCURRENT", "2")],
    );
    let results = seen["concurrent"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{seen}");
    let busy: Vec<&Value> = results.iter().filter(|r| r["is_error"] == true).collect();
    assert_eq!(busy.len(), 1, "{seen}");
    let why = busy[0]["text"][0].as_str().unwrap();
    assert!(
        why.contains("--max-runs") && why.contains("at most 1"),
        "{why}"
    );
    assert!(
        results.iter().any(|r| r["is_error"] == false),
        "the other call answers: {seen}"
    );
    assert_eq!(mock.stats().requests, 1, "the refused call ran nothing");

    // The agent's budgets bound each run, as over --openai: a run that wants three rounds of
    // calls stops at --max-rounds, and the client reads why.
    let seen = over_stdio(
        &[
            "--model",
            "openai:mock:rounds=3",
            "--base-url",
            &url,
            "--root",
            root,
            "--max-rounds",
            "1",
        ],
        "auto",
        None,
    );
    assert_eq!(seen["is_error"], true, "{seen}");
    let text = seen["text"][0].as_str().unwrap();
    assert!(text.contains("max_rounds"), "{text}");
    rt.block_on(mock.shutdown());
}
