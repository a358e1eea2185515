//! `toolloop serve --openai ADDR` over real HTTP: the agent as a model (whole and streamed, Chat
//! Completions and Responses), the gateway in front of the mock's text-only mode (native
//! `tool_calls` over several rounds; the mock checks that every call is answered once), and the
//! server's limits (401, 413, 429), the idempotency key across a kill -9 and a restart.

use crate::common;
use crate::npm;
use crate::python;
use common::{Served, mock, rt};

use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Starts `toolloop serve ARGS` in `dir` with `env`, and waits for its address.
fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Served {
    Served::start(dir, args, env, "serving the OpenAI API on ")
}

async fn post(url: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut req = client.post(url).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Posts a streamed request; the `data:` events, parsed (`[DONE]` as the string).
async fn post_stream(url: &str, body: &Value) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.to_string())))
        .collect()
}

#[test]
fn the_agent_answers_as_a_model_whole_and_streamed_in_both_apis() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let agents = dir.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.lister]\ndescription = \"Lists directories.\"\ntools = [\"list_dir\"]\n",
    )
    .unwrap();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:mock:rounds=1",
            "--base-url",
            &url,
            "--agents",
            agents.to_str().unwrap(),
        ],
        &[],
    );
    rt.block_on(async {
        // A declared agent is a model of its own, run as `--agent lister` runs it: its tools.
        let (status, v) = post(
            &served.url("/v1/chat/completions"),
            None,
            &json!({"model": "agent:lister", "messages": [{"role": "user", "content": "Look around."}]}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["toolloop"]["tool_calls"][0]["name"], "list_dir", "{v}");
        let models: Value = reqwest::get(served.url("/v1/models"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<&str> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert!(ids.contains(&"agent:default"), "{models}");
        assert!(ids.contains(&"agent:lister"), "{models}");

        let ask = json!({"model": "agent:default", "messages": [{"role": "user", "content": "Look around."}]});
        let (status, v) = post(&served.url("/v1/chat/completions"), None, &ask).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "Done. I saw 1 tool results in 1 rounds."
        );
        // What the run did is beside the answer, never in it.
        assert_eq!(v["toolloop"]["tool_calls"].as_array().unwrap().len(), 1);
        let run_id = v["toolloop"]["run_id"].as_str().unwrap().to_string();
        let run: Value = reqwest::get(served.url(&format!("/v1/runs/{run_id}")))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(run["status"], "finished", "{run}");

        let mut streamed = ask.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let events = post_stream(&served.url("/v1/chat/completions"), &streamed).await;
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Done. I saw 1 tool results in 1 rounds.");
        assert!(
            events
                .iter()
                .any(|e| e["toolloop"]["tool_call"]["name"].is_string()),
            "the call is reported beside the content: {events:?}"
        );
        let finishes: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"][0].get("finish_reason"))
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finishes, [&json!("stop")]);
        assert!(events.iter().any(|e| e["usage"]["total_tokens"].as_u64() > Some(0)));
        assert_eq!(events.last().unwrap(), "[DONE]");

        let (status, v) = post(
            &served.url("/v1/responses"),
            None,
            &json!({"model": "agent:default", "input": "Look around."}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "response");
        assert_eq!(
            v["output"][0]["content"][0]["text"],
            "Done. I saw 1 tool results in 1 rounds."
        );

        let (status, v) = post(
            &served.url("/v1/chat/completions"),
            None,
            &json!({"model": "agent:nobody", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
        assert_eq!(status, 404, "{v}");
        assert_eq!(v["error"]["code"], "model_not_found");
    });
    drop(served);
    rt.block_on(mock.shutdown());
}

fn client_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.",
          "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
    ])
}

/// Gathers the `tool_calls` of a streamed answer as OpenAI clients do (by index).
fn gather_calls(events: &[Value]) -> (String, Vec<Value>, String) {
    let mut text = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = String::new();
    for e in events {
        let choice = &e["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                assert!(
                    d["id"].is_string() && d["function"]["name"].is_string(),
                    "{d}"
                );
                calls.push(json!({"id": d["id"], "type": "function",
                    "function": {"name": d["function"]["name"], "arguments": ""}}));
            }
            let args = calls[i]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_string()
                + d["function"]["arguments"].as_str().unwrap_or("");
            calls[i]["function"]["arguments"] = json!(args);
        }
    }
    (text, calls, finish)
}

#[test]
fn the_gateway_gives_native_tool_calls_for_a_text_only_model_over_several_rounds() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--base-url",
            &url,
            "--dialect",
            "hermes",
        ],
        &[],
    );
    for stream in [false, true] {
        rt.block_on(async {
            let model = "gateway:openai:mock:text_calls=hermes,rounds=2,parallel=2,chunk=3";
            let mut messages = vec![json!({"role": "user", "content": "Weather and time, please."})];
            let mut rounds = 0;
            loop {
                let body = json!({"model": model, "messages": messages, "tools": client_tools(), "stream": stream});
                let (text, calls, finish) = if stream {
                    gather_calls(&post_stream(&served.url("/v1/chat/completions"), &body).await)
                } else {
                    let (status, v) = post(&served.url("/v1/chat/completions"), None, &body).await;
                    assert_eq!(status, 200, "{v}");
                    let m = &v["choices"][0]["message"];
                    (
                        m["content"].as_str().unwrap_or("").to_string(),
                        m["tool_calls"].as_array().cloned().unwrap_or_default(),
                        v["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
                    )
                };
                // No fragment of the dialect's tags reaches the client.
                assert!(!text.contains("<tool_call>") && !text.contains("</tool_call>"), "{text}");
                if calls.is_empty() {
                    assert_eq!(finish, "stop");
                    assert_eq!(text, "Done. I saw 4 tool results in 2 rounds.", "stream {stream}");
                    break;
                }
                assert_eq!(finish, "tool_calls");
                assert_eq!(calls.len(), 2, "{calls:?}");
                rounds += 1;
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
                for c in &calls {
                    let args: Value =
                        serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                    assert!(args.is_object(), "{c}");
                    messages.push(json!({"role": "tool", "tool_call_id": c["id"], "content": format!("result of {}", c["function"]["name"])}));
                }
                assert!(rounds <= 2, "more rounds than the mock makes");
            }
            assert_eq!(rounds, 2);
        });
    }
    // The backend never saw a `tools` parameter (it would have refused it).
    assert_eq!(mock.stats().rejected, 0, "{:?}", mock.stats());
    drop(served);
    rt.block_on(mock.shutdown());
}

#[test]
fn a_wrong_or_missing_token_gets_401_and_nothing_runs_and_limits_give_413_and_429() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:mock:rounds=0,latency=1500ms",
            "--base-url",
            &url,
            "--auth-token-file",
            token_file.to_str().unwrap(),
            "--max-body",
            "2048",
            "--max-runs",
            "1",
        ],
        &[],
    );
    rt.block_on(async {
        let ask = json!({"model": "agent:default", "messages": [{"role": "user", "content": "hi"}]});
        let chat = served.url("/v1/chat/completions");
        for token in [None, Some("wrong"), Some("s3cret-token-and-more")] {
            let (status, v) = post(&chat, token, &ask).await;
            assert_eq!(status, 401, "{token:?}: {v}");
            assert_eq!(v["error"]["code"], "invalid_api_key");
        }
        let r = reqwest::get(served.url("/v1/models")).await.unwrap();
        assert_eq!(r.status().as_u16(), 401);
        assert_eq!(mock.stats().requests, 0, "nothing ran");

        let big = json!({"model": "agent:default", "messages": [{"role": "user", "content": "x".repeat(4096)}]});
        let (status, _) = post(&chat, Some("s3cret-token"), &big).await;
        assert_eq!(status, 413);
        // The token is checked before the body is read: a stranger's large body gets 401.
        let (status, v) = post(&chat, Some("wrong"), &big).await;
        assert_eq!(status, 401, "{v}");

        // One run at a time: a second request while the first waits on the model gets 429.
        let first = tokio::spawn({
            let chat = chat.clone();
            let ask = ask.clone();
            async move { post(&chat, Some("s3cret-token"), &ask).await }
        });
        // The model takes 1.5 s to answer the first.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (status, v) = post(&chat, Some("s3cret-token"), &ask).await;
        assert!(!first.is_finished(), "the first run is still going");
        assert_eq!(status, 429, "{v}");
        let (status, v) = first.await.unwrap();
        assert_eq!(status, 200, "{v}");
        let (status, v) = post(&chat, Some("s3cret-token"), &ask).await;
        assert_eq!(status, 200, "a slot is free again: {v}");
    });
    assert!(!served.stderr().contains("s3cret"), "{}", served.stderr());
    drop(served);
    rt.block_on(mock.shutdown());
}

#[test]
fn listening_beyond_loopback_without_a_token_is_refused() {
    let dir = common::repo();
    let out = common::toolloop(&["serve", "--openai", "0.0.0.0:0"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--auth-token"), "{err}");
    // The modes' flags: one mode, and each flag with its mode.
    for (args, says) in [
        (&["serve"][..], "--openai"),
        (
            &["serve", "--openai", "127.0.0.1:0", "--mcp"][..],
            "cannot be used with",
        ),
        (
            &[
                "serve",
                "--openai",
                "127.0.0.1:0",
                "--admin-url",
                "http://x",
            ][..],
            "--restate",
        ),
        (
            &["serve", "--openai", "127.0.0.1:0", "--workflow", "w.toml"][..],
            "--mcp",
        ),
        (&["serve", "--mcp", "nowhere"][..], "127.0.0.1:8090"),
    ] {
        let out = common::toolloop(args, dir.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
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

#[test]
fn a_run_killed_with_the_server_finishes_on_retry_with_its_idempotency_key_without_repeating_an_effect()
 {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let effects = dir.path().join("effects");
    let store = dir.path().join("store.db");
    let effects_s = effects.to_str().unwrap().to_string();
    let args = [
        "--openai",
        "127.0.0.1:0",
        "--model",
        "openai:mock:rounds=3,parallel=2",
        "--base-url",
        &url,
        "--store",
        store.to_str().unwrap(),
    ];
    let env = [
        ("TOOLLOOP_TEST_EFFECTS", effects_s.as_str()),
        ("TOOLLOOP_TEST_EFFECT_MS", "400"),
    ];
    let ask = json!({"model": "agent:default", "messages": [{"role": "user", "content": "Change things."}]});
    let served = serve(dir.path(), &args, &env);
    let chat = served.url("/v1/chat/completions");
    // The first attempt: the server dies with the run's second round in flight.
    rt.block_on(async {
        let client = reqwest::Client::new();
        let first = tokio::spawn(
            client
                .post(&chat)
                .header("Idempotency-Key", "order-42")
                .json(&ask)
                .send(),
        );
        let start = Instant::now();
        while effect_counts(&effects).len() < 3 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no effects: {}",
                served.stderr()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        served.kill9();
        assert!(first.await.unwrap().is_err(), "the client lost its answer");
    });
    let before = effect_counts(&effects);
    // The retry, on a new server over the same store, finishes that run.
    let served = serve(dir.path(), &args, &env);
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(served.url("/v1/chat/completions"))
            .header("Idempotency-Key", "order-42")
            .json(&ask)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, 200, "{v}\n{}", served.stderr());
        assert_eq!(v["toolloop"]["stop_reason"], "answered");
        assert_eq!(
            v["toolloop"]["rounds"], 4,
            "one run: three rounds of calls, then the answer"
        );
        // Again: the finished run's answer, nothing run again.
        let after = effect_counts(&effects);
        let again: Value = reqwest::Client::new()
            .post(served.url("/v1/chat/completions"))
            .header("Idempotency-Key", "order-42")
            .json(&ask)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(again["toolloop"]["run_id"], v["toolloop"]["run_id"]);
        assert_eq!(effect_counts(&effects), after);
    });
    let counts = effect_counts(&effects);
    assert!(
        counts.values().all(|&n| n == 1),
        "an effect repeated: {counts:?}"
    );
    assert!(counts.len() >= before.len());
    assert!(counts.len() <= 6, "{counts:?}");
    drop(served);
    rt.block_on(mock.shutdown());
}

/// The official `openai` Python SDK, unmodified, against both modes, whole and streamed: the
/// agent answers as a model; the gateway in front of the mock's text-only mode gives it valid
/// `tool_calls` over two rounds, which it answers (the mock checks every call answered once).
#[test]
#[cfg_attr(
    not(toolloop_python),
    ignore = "python3 is not on PATH: the test runs the official openai Python SDK (tools/python/requirements.txt)"
)]
fn the_official_openai_python_sdk_uses_the_agent_and_gets_native_tool_calls_from_the_gateway() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    let mut client = std::process::Command::new(python::python());
    client.arg(&script);
    let seen = sdk_client_run(
        client,
        "qwen3-coder",
        "py-token-123",
        "gateway:openai:mock:text_calls=qwen3-coder,rounds=2,parallel=2,chunk=4",
    );
    let answer = "Done. I saw 1 tool results in 1 rounds.";
    assert!(
        seen["models"]
            .as_array()
            .unwrap()
            .contains(&json!("agent:default")),
        "{seen}"
    );
    assert_eq!(seen["agent_whole"], answer);
    assert_eq!(seen["agent_whole_finish"], "stop");
    assert_eq!(seen["agent_streamed"], answer);
    assert_eq!(seen["agent_streamed_finish"], json!(["stop"]));
    assert_eq!(seen["agent_responses"], answer);
    assert_eq!(seen["agent_responses_streamed"], json!([answer, answer]));
    for mode in [
        "gateway_whole",
        "gateway_streamed",
        "gateway_responses_whole",
        "gateway_responses_streamed",
    ] {
        assert_eq!(
            seen[mode]["rounds"].as_array().unwrap().len(),
            2,
            "{mode}: {seen}"
        );
        assert_eq!(
            seen[mode]["answer"], "Done. I saw 4 tool results in 2 rounds.",
            "{mode}"
        );
    }
    assert_eq!(seen["wrong_token"], 401);
}

/// Serves the agent, and the gateway in front of the mock (whose backend writes calls in
/// `dialect`), behind `token`; runs `client`, an official SDK's script, with the server's URL,
/// the token, the agent's model and `gateway`, the gateway's model; and returns what the script
/// saw (its stdout, as JSON). The mock checks every call of the gateway's rounds answered once.
fn sdk_client_run(
    mut client: std::process::Command,
    dialect: &str,
    token: &str,
    gateway: &str,
) -> Value {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:mock:rounds=1",
            "--base-url",
            &url,
            "--dialect",
            dialect,
        ],
        &[("TOOLLOOP_AUTH_TOKEN", token)],
    );
    let out = client
        .arg(served.url("/v1"))
        .arg(token)
        .arg("agent:default")
        .arg(gateway)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}\nserver: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        served.stderr()
    );
    assert_eq!(mock.stats().rejected, 0);
    drop(served);
    rt.block_on(mock.shutdown());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The runs of a store: (run id, status, stop reason).
fn runs_in(
    rt: &tokio::runtime::Runtime,
    store: &Path,
) -> Vec<(String, String, Option<toolloop::StopReason>)> {
    rt.block_on(async {
        let store = toolloop_store::Store::open(store.to_str().unwrap())
            .await
            .unwrap();
        let runs = store.runs(None).await.unwrap();
        store.close().await;
        runs.into_iter()
            .map(|r| (r.run_id, r.status.as_str().to_string(), r.stop_reason))
            .collect()
    })
}

#[test]
fn a_client_that_disconnects_cancels_its_run_unless_the_server_keeps_it() {
    let rt = rt();
    let mock = mock(&rt);
    let url = format!("{}/v1", mock.base_url());
    for keep in [false, true] {
        let dir = common::repo();
        let store = dir.path().join("store.db");
        let mut args = vec![
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:mock:rounds=1,latency=600ms",
            "--base-url",
            &url,
            "--store",
            store.to_str().unwrap(),
        ];
        if keep {
            args.push("--keep-on-disconnect");
        }
        let served = serve(dir.path(), &args, &[]);
        rt.block_on(async {
            let ask = json!({"model": "agent:default", "stream": true,
                "messages": [{"role": "user", "content": "Look around."}]});
            let mut r = reqwest::Client::new()
                .post(served.url("/v1/chat/completions"))
                .json(&ask)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200);
            // The first chunk, then the client goes away in the middle of the run.
            let first = r.chunk().await.unwrap().unwrap();
            assert!(String::from_utf8_lossy(&first).contains("chat.completion.chunk"));
            drop(r);
        });
        let start = Instant::now();
        let want = if keep {
            toolloop::StopReason::Answered
        } else {
            toolloop::StopReason::Cancelled
        };
        loop {
            let runs = runs_in(&rt, &store);
            if runs.len() == 1 && runs[0].2 == Some(want) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "keep {keep}: {runs:?}\n{}",
                served.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    rt.block_on(mock.shutdown());
}

#[test]
fn approvals_that_need_a_person_are_denied_or_deferred_and_listed() {
    let rt = rt();
    let mock = mock(&rt);
    let url = format!("{}/v1", mock.base_url());
    let dir = common::repo();
    let ask = json!({"model": "agent:default", "messages": [{"role": "user", "content": "Look around."}]});
    let base = [
        "--openai",
        "127.0.0.1:0",
        "--model",
        "openai:mock:rounds=1",
        "--base-url",
        &url,
        "--ask",
        "*",
    ];
    // No one to ask: the call is denied, and the model reads why.
    let served = serve(dir.path(), &base, &[]);
    rt.block_on(async {
        let (status, v) = post(&served.url("/v1/chat/completions"), None, &ask).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["toolloop"]["tool_calls"][0]["success"], false, "{v}");
    });
    drop(served);
    // Deferred: the run stops and waits; the call is listed with the run.
    let mut args = base.to_vec();
    args.push("--defer-approvals");
    let served = serve(dir.path(), &args, &[]);
    rt.block_on(async {
        let (status, v) = post(&served.url("/v1/chat/completions"), None, &ask).await;
        assert_eq!(status, 202, "{v}");
        assert_eq!(v["error"]["code"], "awaiting_approval");
        let run_id = v["toolloop"]["run_id"].as_str().unwrap().to_string();
        let run: Value = reqwest::get(served.url(&format!("/v1/runs/{run_id}")))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(run["status"], "awaiting_approval", "{run}");
        assert_eq!(
            run["pending_approvals"].as_array().unwrap().len(),
            1,
            "{run}"
        );
        assert!(
            run["pending_approvals"][0]["call"]["name"].is_string(),
            "{run}"
        );
        let r = reqwest::get(served.url("/v1/runs/run_nothing"))
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404);
    });
    drop(served);
    rt.block_on(mock.shutdown());
}

#[test]
fn sigterm_lets_runs_finish_within_the_grace_period_and_leaves_the_rest_resumable() {
    let rt = rt();
    let mock = mock(&rt);
    let url = format!("{}/v1", mock.base_url());
    let dir = common::repo();
    let store = dir.path().join("store.db");
    let args = |grace: &'static str| {
        vec![
            "--openai".to_string(),
            "127.0.0.1:0".into(),
            "--model".into(),
            "openai:mock:rounds=1,latency=1s".into(),
            "--base-url".into(),
            url.clone(),
            "--store".into(),
            store.to_str().unwrap().into(),
            "--grace".into(),
            grace.into(),
        ]
    };
    let ask = json!({"model": "agent:default", "messages": [{"role": "user", "content": "Look around."}]});
    // A long grace: the run in progress finishes and is answered; then the server exits.
    let a = args("30s");
    let mut served = serve(
        dir.path(),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    rt.block_on(async {
        let chat = served.url("/v1/chat/completions");
        let keyed = |key: &'static str| {
            let (chat, ask) = (chat.clone(), ask.clone());
            async move {
                let r = reqwest::Client::new()
                    .post(&chat)
                    .header("Idempotency-Key", key)
                    .json(&ask)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap())
            }
        };
        let run = tokio::spawn(keyed("k-0"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The same key while its run goes on: 409, nothing started twice.
        let (status, v) = keyed("k-0").await;
        assert_eq!(status, 409, "{v}");
        assert_eq!(v["error"]["code"], "run_in_progress");
        served.terminate();
        let (status, v) = run.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["toolloop"]["stop_reason"], "answered");
    });
    assert_eq!(
        served.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        served.stderr()
    );
    drop(served);
    // A short grace: the server exits with the run unfinished, which a retry with its key
    // finishes on the next server.
    let b = args("200ms");
    let mut served = serve(
        dir.path(),
        &b.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    rt.block_on(async {
        let chat = served.url("/v1/chat/completions");
        let run = tokio::spawn({
            let ask = ask.clone();
            async move {
                reqwest::Client::new()
                    .post(&chat)
                    .header("Idempotency-Key", "k-1")
                    .json(&ask)
                    .send()
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        served.terminate();
        assert!(run.await.unwrap().is_err(), "the client lost its answer");
    });
    assert_eq!(
        served.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        served.stderr()
    );
    assert!(
        served.stderr().contains("left in the store"),
        "{}",
        served.stderr()
    );
    let left: Vec<_> = runs_in(&rt, &store)
        .into_iter()
        .filter(|r| r.1 == "interrupted")
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    drop(served);
    let served = serve(
        dir.path(),
        &b.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    rt.block_on(async {
        let v: Value = reqwest::Client::new()
            .post(served.url("/v1/chat/completions"))
            .header("Idempotency-Key", "k-1")
            .json(&ask)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["toolloop"]["stop_reason"], "answered", "{v}");
        assert_eq!(v["toolloop"]["run_id"], json!(left[0].0));
    });
    drop(served);
    rt.block_on(mock.shutdown());
}

/// The official `openai` Node SDK (another language's client, from the npm lock file) against
/// both modes, whole and streamed.
#[test]
#[cfg_attr(
    not(toolloop_npm),
    ignore = "node and npm are not on PATH: the test runs the official openai Node SDK (tools/npm/package-lock.json)"
)]
fn the_official_openai_node_sdk_uses_the_agent_and_the_gateway() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/openai_client.mjs");
    let mut client = std::process::Command::new("node");
    client.arg(&script).arg(npm::installed());
    let seen = sdk_client_run(
        client,
        "llama3",
        "node-token-123",
        "gateway:openai:mock:text_calls=llama3,rounds=2,chunk=5",
    );
    let answer = "Done. I saw 1 tool results in 1 rounds.";
    assert_eq!(seen["agent_whole"], answer);
    assert_eq!(seen["agent_streamed"], answer);
    for mode in ["gateway_whole", "gateway_streamed"] {
        assert_eq!(
            seen[mode]["rounds"],
            json!([["get_weather"], ["get_weather"]]),
            "{mode}: {seen}"
        );
        assert_eq!(
            seen[mode]["answer"], "Done. I saw 2 tool results in 2 rounds.",
            "{mode}"
        );
    }
}

/// An OpenAI-compatible backend with no tool calling that answers with the texts given, in
/// order (the last again once they run out), whole or streamed in small pieces, and keeps every
/// request body it gets.
struct Scripted {
    base: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Scripted {
    async fn start(replies: &[&str]) -> Scripted {
        use axum::response::IntoResponse;
        type Shared = Arc<(Vec<String>, Arc<Mutex<Vec<Value>>>)>;
        async fn reply(
            axum::extract::State(st): axum::extract::State<Shared>,
            axum::Json(body): axum::Json<Value>,
        ) -> axum::response::Response {
            assert!(
                body.get("tools").is_none(),
                "the backend has no tool calling"
            );
            let n = {
                let mut b = st.1.lock().unwrap();
                b.push(body.clone());
                b.len() - 1
            };
            let text = st.0[n.min(st.0.len() - 1)].clone();
            let usage = json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15});
            if body["stream"] != true {
                return axum::Json(json!({
                    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": usage,
                }))
                .into_response();
            }
            let chunk = |delta: Value, finish: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                )
            };
            let chars: Vec<char> = text.chars().collect();
            let mut out = String::new();
            for piece in chars.chunks(4) {
                out.push_str(&chunk(
                    json!({"content": piece.iter().collect::<String>()}),
                    Value::Null,
                ));
            }
            out.push_str(&chunk(json!({}), json!("stop")));
            out.push_str("data: [DONE]\n\n");
            ([("content-type", "text/event-stream")], out).into_response()
        }
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let shared: Shared = Arc::new((
            replies.iter().map(|r| r.to_string()).collect(),
            bodies.clone(),
        ));
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(reply))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Scripted { base, bodies, task }
    }

    fn requests(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }

    /// The messages of request `n`, as text.
    fn messages(&self, n: usize) -> String {
        self.bodies.lock().unwrap()[n]["messages"].to_string()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A call written wrong in the hermes dialect: plain words in the tag.
const BROKEN_CALL: &str = "<tool_call>get the weather please</tool_call>";
const GOOD_CALL: &str = "Checking.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>";

async fn post_keyed(url: &str, token: Option<&str>, key: &str, body: &Value) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("Idempotency-Key", key)
        .json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[test]
fn a_gateway_request_is_a_run_with_its_idempotency_key_and_a_malformed_call_is_asked_again() {
    let rt = rt();
    let backend = rt.block_on(Scripted::start(&[
        BROKEN_CALL,
        GOOD_CALL,
        BROKEN_CALL,
        GOOD_CALL,
    ]));
    let dir = common::repo();
    let store = dir.path().join("store.db");
    let args = [
        "--openai",
        "127.0.0.1:0",
        "--base-url",
        &backend.base,
        "--dialect",
        "hermes",
        "--store",
        store.to_str().unwrap(),
    ];
    let body = json!({"model": "gateway:openai:qwen", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": client_tools()});
    let served = serve(dir.path(), &args, &[]);
    let chat = served.url("/v1/chat/completions");
    let first = rt.block_on(async {
        let (status, v) = post_keyed(&chat, None, "weather-1", &body).await;
        assert_eq!(status, 200, "{v}\n{}", served.stderr());
        let m = &v["choices"][0]["message"];
        // The broken call went back to the backend, which wrote it right: the client gets the
        // call, never the broken one.
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        assert_eq!(m["tool_calls"].as_array().unwrap().len(), 1, "{v}");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
        let args: Value = serde_json::from_str(
            m["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(m["content"].as_str().unwrap().trim(), "Checking.", "{v}");
        assert!(!v.to_string().contains("get the weather please"), "{v}");
        assert_eq!(backend.requests(), 2, "asked once more");
        assert!(
            backend.messages(1).contains("get the weather please")
                && backend.messages(1).contains("could not be read"),
            "the second request shows the backend its broken call and why: {}",
            backend.messages(1)
        );
        // The request is a run in the store, shown at /v1/runs/{id}.
        let run_id = v["toolloop"]["run_id"].as_str().unwrap().to_string();
        let run: Value = reqwest::get(served.url(&format!("/v1/runs/{run_id}")))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(run["status"], "finished", "{run}");
        // A retry with the same key gets the same answer, and the backend is not asked again.
        let (status, again) = post_keyed(&chat, None, "weather-1", &body).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["choices"], v["choices"]);
        assert_eq!(backend.requests(), 2);
        v
    });
    // So does a retry on a server started again over the same store.
    served.kill9();
    let served = serve(dir.path(), &args, &[]);
    rt.block_on(async {
        let (status, again) = post_keyed(
            &served.url("/v1/chat/completions"),
            None,
            "weather-1",
            &body,
        )
        .await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["choices"], first["choices"]);
        assert_eq!(again["toolloop"]["run_id"], first["toolloop"]["run_id"]);
        assert_eq!(
            backend.requests(),
            2,
            "no second backend call after the restart"
        );
    });
    // `toolloop runs` lists it.
    let out = common::toolloop(&["runs", "--store", store.to_str().unwrap()], dir.path());
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains(first["toolloop"]["run_id"].as_str().unwrap()),
        "{listed}"
    );

    // Streamed: the same, the broken call never sent.
    let streamed = rt.block_on(async {
        let mut b = body.clone();
        b["stream"] = json!(true);
        post_stream(&served.url("/v1/chat/completions"), &b).await
    });
    let (text, calls, finish) = gather_calls(&streamed);
    assert_eq!(finish, "tool_calls", "{streamed:?}");
    assert_eq!(calls.len(), 1, "{streamed:?}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(text.trim(), "Checking.", "{streamed:?}");
    assert!(
        !format!("{streamed:?}").contains("get the weather please"),
        "{streamed:?}"
    );
    assert_eq!(backend.requests(), 4, "{streamed:?}");
    drop(served);
}

#[test]
fn a_gateway_request_whose_backend_keeps_writing_broken_calls_gets_a_clear_error() {
    let rt = rt();
    let backend = rt.block_on(Scripted::start(&[BROKEN_CALL]));
    let dir = common::repo();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--base-url",
            &backend.base,
            "--dialect",
            "hermes",
        ],
        &[],
    );
    rt.block_on(async {
        let body = json!({"model": "gateway:openai:qwen", "messages": [{"role": "user", "content": "Weather?"}], "tools": client_tools()});
        let (status, v) = post(&served.url("/v1/chat/completions"), None, &body).await;
        assert_eq!(status, 502, "{v}");
        assert_eq!(v["error"]["code"], "malformed_tool_call", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("3 times in a row"),
            "{v}"
        );
        assert_eq!(backend.requests(), 3, "asked again twice, then given up");
    });
}

#[test]
fn a_gateway_spec_that_names_a_file_on_the_server_is_refused() {
    let rt = rt();
    let dir = common::repo();
    // A script the model would answer from, and a file that is no cassette.
    let script = dir.path().join("script.json");
    std::fs::write(&script, r#"[{"text": "read from the server's disk"}]"#).unwrap();
    let served = serve(dir.path(), &["--openai", "127.0.0.1:0"], &[]);
    rt.block_on(async {
        for spec in [
            format!("scripted:{}", script.display()),
            format!(" scripted:{}", script.display()),
            format!("replay:{}", script.display()),
            format!(" replay:{}", dir.path().join("README.md").display()),
            "test".to_string(),
        ] {
            let body = json!({"model": format!("gateway:{spec}"), "messages": [{"role": "user", "content": "hi"}], "tools": client_tools()});
            let (status, v) = post(&served.url("/v1/chat/completions"), None, &body).await;
            assert_eq!(status, 400, "{spec}: {v}");
            assert_eq!(v["error"]["code"], "model_not_found", "{spec}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("expected a provider's model"),
                "{spec}: {v}"
            );
        }
    });
    assert!(!served.stderr().contains("read from the server's disk"));
}

#[test]
fn a_streamed_agent_answer_holds_only_the_final_answer_as_content() {
    let rt = rt();
    // The model writes words before its call, then the answer: twice, for the two APIs.
    let before = "I will look around first.\n<tool_call>{\"name\": \"list_dir\", \"arguments\": {\"path\": \".\"}}</tool_call>";
    let answer = "Here is the answer: one file.";
    let backend = rt.block_on(Scripted::start(&[before, answer, before, answer]));
    let dir = common::repo();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:qwen",
            "--base-url",
            &backend.base,
            "--tool-protocol",
            "prompt",
            "--dialect",
            "hermes",
        ],
        &[],
    );
    rt.block_on(async {
        let events = post_stream(
            &served.url("/v1/chat/completions"),
            &json!({"model": "agent:default", "stream": true,
                    "messages": [{"role": "user", "content": "What is here?"}]}),
        )
        .await;
        let content: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, answer, "{events:?}");
        // The words before the call are progress, beside the content, before the call.
        let text_at = events
            .iter()
            .position(|e| {
                e["toolloop"]["text"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("I will look around first."))
            })
            .unwrap_or_else(|| panic!("{events:?}"));
        let call_at = events
            .iter()
            .position(|e| e["toolloop"]["tool_call"]["name"] == "list_dir")
            .unwrap_or_else(|| panic!("{events:?}"));
        assert!(text_at < call_at);
        assert_eq!(events.last().unwrap(), "[DONE]");

        let events = post_stream(
            &served.url("/v1/responses"),
            &json!({"model": "agent:default", "stream": true, "input": "What is here?"}),
        )
        .await;
        let content: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!(content, answer, "{events:?}");
        assert!(
            events.iter().any(|e| e["type"] == "toolloop.text"
                && e["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("I will look around first."))),
            "{events:?}"
        );
        let done = events
            .iter()
            .find(|e| e["type"] == "response.completed")
            .unwrap();
        assert_eq!(done["response"]["output"][0]["content"][0]["text"], answer);
    });
    assert_eq!(backend.requests(), 4);
}

async fn get_as(url: &str, token: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[test]
fn with_several_tokens_each_client_sees_only_its_runs_and_keys() {
    let rt = rt();
    let mock = mock(&rt);
    let dir = common::repo();
    let url = format!("{}/v1", mock.base_url());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# the clients\ntoken-of-ann\n\ntoken-of-bob\n").unwrap();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:mock:rounds=0",
            "--base-url",
            &url,
            "--auth-token-file",
            tokens.to_str().unwrap(),
        ],
        &[],
    );
    rt.block_on(async {
        let chat = served.url("/v1/chat/completions");
        let ask =
            json!({"model": "agent:default", "messages": [{"role": "user", "content": "hi"}]});
        // The same key from two clients names two runs: each is run.
        let (status, ann) = post_keyed(&chat, Some("token-of-ann"), "job-1", &ask).await;
        assert_eq!(status, 200, "{ann}");
        let (status, bob) = post_keyed(&chat, Some("token-of-bob"), "job-1", &ask).await;
        assert_eq!(status, 200, "{bob}");
        let ann_run = ann["toolloop"]["run_id"].as_str().unwrap().to_string();
        let bob_run = bob["toolloop"]["run_id"].as_str().unwrap().to_string();
        assert_ne!(ann_run, bob_run);
        assert_eq!(mock.stats().requests, 2, "two runs, two model calls");
        // Ann's retry is Ann's run again.
        let (_, again) = post_keyed(&chat, Some("token-of-ann"), "job-1", &ask).await;
        assert_eq!(again["toolloop"]["run_id"], ann["toolloop"]["run_id"]);
        assert_eq!(mock.stats().requests, 2);
        // Each sees its own runs only; another's is as unknown as no run at all.
        let runs = |id: &str| served.url(&format!("/v1/runs/{id}"));
        assert_eq!(get_as(&runs(&ann_run), "token-of-ann").await.0, 200);
        assert_eq!(get_as(&runs(&bob_run), "token-of-bob").await.0, 200);
        let (status, v) = get_as(&runs(&ann_run), "token-of-bob").await;
        assert_eq!(status, 404, "{v}");
        assert_eq!(v["error"]["code"], "run_not_found");
        assert_eq!(get_as(&runs(&bob_run), "token-of-ann").await.0, 404);
        // A run without a key is its client's too.
        let (status, v) = post(&chat, Some("token-of-bob"), &ask).await;
        assert_eq!(status, 200, "{v}");
        let fresh = v["toolloop"]["run_id"].as_str().unwrap();
        assert_eq!(get_as(&runs(fresh), "token-of-bob").await.0, 200);
        assert_eq!(get_as(&runs(fresh), "token-of-ann").await.0, 404);
        // A token not in the file gets nothing.
        assert_eq!(get_as(&runs(fresh), "token-of-eve").await.0, 401);

        // A response continues only its own client's conversations.
        let (status, v) = post(
            &served.url("/v1/responses"),
            Some("token-of-ann"),
            &json!({"model": "agent:default", "input": "hi"}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let follow =
            json!({"model": "agent:default", "input": "and?", "previous_response_id": v["id"]});
        let (status, w) = post(&served.url("/v1/responses"), Some("token-of-bob"), &follow).await;
        assert_eq!(status, 400, "{w}");
        assert_eq!(w["error"]["param"], "previous_response_id");
        let (status, w) = post(&served.url("/v1/responses"), Some("token-of-ann"), &follow).await;
        assert_eq!(status, 200, "{w}");

        // The Responses API refuses what it does not serve, naming the field; an unknown
        // previous response likewise.
        let responses = served.url("/v1/responses");
        for (field, value) in [
            ("tools", client_tools()),
            ("previous_response_id", json!("resp_123")),
        ] {
            let mut body = json!({"model": "agent:default", "input": "hi"});
            body[field] = value;
            let (status, v) = post(&responses, Some("token-of-ann"), &body).await;
            assert_eq!(status, 400, "{v}");
            assert_eq!(v["error"]["param"], field, "{v}");
        }
    });
    assert!(!served.stderr().contains("token-of"), "{}", served.stderr());
    drop(served);
    rt.block_on(mock.shutdown());
}

#[test]
fn a_response_continues_the_conversation_of_the_previous_one() {
    let rt = rt();
    let backend = rt.block_on(Scripted::start(&[
        "Answer one.",
        "Answer two.",
        "Answer three.",
    ]));
    let dir = common::repo();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--model",
            "openai:qwen",
            "--base-url",
            &backend.base,
            "--tool-protocol",
            "prompt",
        ],
        &[],
    );
    rt.block_on(async {
        let url = served.url("/v1/responses");
        let (status, first) = post(
            &url,
            None,
            &json!({"model": "agent:default", "input": "First question?", "instructions": "Be brief."}),
        )
        .await;
        assert_eq!(status, 200, "{first}");
        assert_eq!(first["output"][0]["content"][0]["text"], "Answer one.");
        let (status, second) = post(
            &url,
            None,
            &json!({"model": "agent:default", "input": "Second question?", "previous_response_id": first["id"]}),
        )
        .await;
        assert_eq!(status, 200, "{second}");
        assert_eq!(second["output"][0]["content"][0]["text"], "Answer two.");
        let seen = backend.messages(1);
        for part in ["Be brief.", "First question?", "Answer one.", "Second question?"] {
            assert!(seen.contains(part), "{part} missing from {seen}");
        }
        // Streamed, the answer's id is the same from its first event to its last, and it
        // continues too.
        let events = post_stream(
            &url,
            &json!({"model": "agent:default", "stream": true, "input": "Third?", "previous_response_id": second["id"]}),
        )
        .await;
        let created = events.iter().find(|e| e["type"] == "response.created").unwrap();
        let done = events.iter().find(|e| e["type"] == "response.completed").unwrap();
        assert_eq!(created["response"]["id"], done["response"]["id"], "{events:?}");
        assert_eq!(done["response"]["output"][0]["content"][0]["text"], "Answer three.");
        let seen = backend.messages(2);
        for part in ["First question?", "Answer two.", "Third?"] {
            assert!(seen.contains(part), "{part} missing from {seen}");
        }
        // The answer's id names its run.
        let run = done["response"]["id"].as_str().unwrap().replacen("resp_", "run_", 1);
        let status: Value = reqwest::get(served.url(&format!("/v1/runs/{run}")))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(status["status"], "finished", "{status}");
    });
    assert_eq!(backend.requests(), 3);
}

#[test]
fn the_gateway_answers_the_responses_api_with_function_calls() {
    let rt = rt();
    let answer = "It is sunny in Paris.";
    let backend = rt.block_on(Scripted::start(&[GOOD_CALL, answer, GOOD_CALL]));
    let dir = common::repo();
    let served = serve(
        dir.path(),
        &[
            "--openai",
            "127.0.0.1:0",
            "--base-url",
            &backend.base,
            "--dialect",
            "hermes",
        ],
        &[],
    );
    let tools = json!([{"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    rt.block_on(async {
        let url = served.url("/v1/responses");
        let ask = json!({"model": "gateway:openai:qwen", "input": "Weather in Paris?", "tools": tools});
        let (status, v) = post(&url, None, &ask).await;
        assert_eq!(status, 200, "{v}");
        assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
        let call = v["output"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["type"] == "function_call")
            .unwrap_or_else(|| panic!("{v}"))
            .clone();
        assert_eq!(call["name"], "get_weather");
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        // The client runs the call and sends its output back with the conversation.
        let (status, v) = post(
            &url,
            None,
            &json!({"model": "gateway:openai:qwen", "tools": tools, "input": [
                {"role": "user", "content": "Weather in Paris?"},
                call,
                {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 24 C"},
            ]}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["output"][0]["type"], "message", "{v}");
        assert_eq!(v["output"][0]["content"][0]["text"], answer);
        assert!(backend.messages(1).contains("sunny, 24 C"), "{}", backend.messages(1));

        // Streamed: the call as the Responses API streams one, under one id throughout.
        let mut streamed = ask.clone();
        streamed["stream"] = json!(true);
        let events = post_stream(&url, &streamed).await;
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
        assert_eq!(kinds.last(), Some(&"response.completed"), "{kinds:?}");
        for kind in [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ] {
            assert!(kinds.contains(&kind), "{kind} missing: {kinds:?}");
        }
        let done = events.last().unwrap();
        assert_eq!(events[0]["response"]["id"], done["response"]["id"]);
        let sequence: Vec<u64> = events
            .iter()
            .filter_map(|e| e["sequence_number"].as_u64())
            .collect();
        assert_eq!(sequence, (0..sequence.len() as u64).collect::<Vec<_>>());
        assert!(
            done["response"]["output"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["type"] == "function_call" && i["name"] == "get_weather"),
            "{done}"
        );

        // The gateway keeps no conversation.
        let mut follow = ask.clone();
        follow["previous_response_id"] = done["response"]["id"].clone();
        let (status, v) = post(&url, None, &follow).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "previous_response_id");
    });
    assert_eq!(backend.requests(), 3);
}
