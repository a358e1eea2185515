//! OpenTelemetry traces, received by an OTLP/HTTP receiver in the test: GenAI spans for the
//! run, each model call and each tool call, with content only when asked for.
#![cfg(feature = "otel")]

use crate::common;
use axum::Router;
use axum::routing::post;
use common::{command, repo};
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// An OTLP/HTTP (JSON) receiver on 127.0.0.1; every span it gets, flattened.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<Value>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let got = spans.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |body: axum::body::Bytes| {
                let got = got.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).expect("OTLP JSON");
                    for rs in v["resourceSpans"].as_array().into_iter().flatten() {
                        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                            for span in ss["spans"].as_array().into_iter().flatten() {
                                let mut span = span.clone();
                                span["resource"] = rs["resource"].clone();
                                got.lock().unwrap().push(span);
                            }
                        }
                    }
                    "{}"
                }
            }),
        );
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(async move { axum::serve(listener, app).await });
        Receiver {
            endpoint,
            spans,
            _runtime: runtime,
        }
    }
}

/// A span's attribute, as text.
fn attr(span: &Value, key: &str) -> Option<String> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| {
            let v = &a["value"];
            v.get("stringValue")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| {
                    v.get("intValue")
                        .map(|i| i.to_string().trim_matches('"').to_string())
                })
                .unwrap_or_else(|| v.to_string())
        })
}

fn run_traced(extra: &[&str]) -> Vec<Value> {
    let receiver = Receiver::start();
    let dir = repo();
    let mut args = vec!["run", "--json", "-m", "test"];
    args.extend_from_slice(extra);
    args.push("What is the version?");
    let out = command(&args, dir.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env_remove("OTEL_SDK_DISABLED")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receiver.spans.lock().unwrap().clone()
}

#[test]
fn a_run_is_traced_with_genai_spans() {
    let spans = run_traced(&[]);
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    let agent = spans
        .iter()
        .find(|s| s["name"] == "invoke_agent toolloop")
        .unwrap_or_else(|| panic!("no invoke_agent span in {names:?}"));
    assert_eq!(
        attr(agent, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(
        attr(agent, "toolloop.stop_reason").as_deref(),
        Some("answered")
    );
    assert!(attr(agent, "gen_ai.usage.input_tokens").is_some());
    let chats: Vec<&Value> = spans.iter().filter(|s| s["name"] == "chat test").collect();
    assert_eq!(chats.len(), 2, "{names:?}");
    for chat in &chats {
        assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(attr(chat, "gen_ai.request.model").as_deref(), Some("test"));
        assert_eq!(chat["kind"], 3, "a client span: {chat}");
        assert_eq!(chat["parentSpanId"], agent["spanId"]);
        assert!(attr(chat, "gen_ai.usage.output_tokens").is_some());
    }
    let reasons: Vec<String> = chats
        .iter()
        .filter_map(|c| attr(c, "gen_ai.response.finish_reasons"))
        .collect();
    assert!(reasons.contains(&"tool_calls".to_string()), "{reasons:?}");
    let tools: Vec<&Value> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.operation.name").as_deref() == Some("execute_tool"))
        .collect();
    assert_eq!(tools.len(), 3, "{names:?}");
    let read = tools
        .iter()
        .find(|s| s["name"] == "execute_tool read_file")
        .expect("a read_file span");
    assert_eq!(attr(read, "gen_ai.tool.name").as_deref(), Some("read_file"));
    assert!(attr(read, "gen_ai.tool.call.id").is_some_and(|id| !id.is_empty()));
    assert_eq!(read["traceId"], agent["traceId"]);
    let service = agent["resource"]["attributes"].to_string();
    assert!(service.contains("toolloop"), "{service}");
    // No content unless asked for.
    let all = serde_json::to_string(&spans).unwrap();
    assert!(
        !all.contains("version 1.2.3"),
        "content leaked into the traces"
    );
}

#[test]
fn content_is_traced_only_when_asked_for() {
    let spans = run_traced(&["--otel-content"]);
    let all = serde_json::to_string(&spans).unwrap();
    assert!(all.contains("README.md"), "no tool arguments in {all}");
    assert!(
        all.contains("I am the offline test model"),
        "no answer in {all}"
    );
}

#[test]
fn a_childs_invoke_agent_span_is_under_the_parents_execute_tool_span() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions {
            script: vec![vec![
                toolloop_mock::ScriptCall {
                    name: "reader".into(),
                    arguments: serde_json::json!({"task": "read the README"}),
                },
                toolloop_mock::ScriptCall {
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": "README.md"}),
                },
            ]],
            ..toolloop_mock::MockOptions::default()
        }))
        .unwrap();
    let receiver = Receiver::start();
    let dir = repo();
    let agents = dir.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.boss]\ndescription = \"Delegates.\"\ntools = [\"reader\"]\n\n\
         [agents.reader]\ndescription = \"Reads.\"\ntools = [\"read_file\"]\n",
    )
    .unwrap();
    let base = format!("{}/v1", server.base_url());
    let out = command(
        &[
            "run",
            "--json",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--agents",
            agents.to_str().unwrap(),
            "--agent",
            "boss",
            "go",
        ],
        dir.path(),
    )
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
    .env_remove("OTEL_SDK_DISABLED")
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    let call = spans
        .iter()
        .find(|s| s["name"] == "execute_tool reader")
        .unwrap_or_else(|| panic!("no execute_tool reader span in {names:?}"));
    let child = spans
        .iter()
        .find(|s| s["name"] == "invoke_agent reader")
        .unwrap_or_else(|| panic!("no invoke_agent reader span in {names:?}"));
    assert_eq!(child["parentSpanId"], call["spanId"]);
    assert_eq!(child["traceId"], call["traceId"]);
    assert_eq!(attr(child, "gen_ai.agent.name").as_deref(), Some("reader"));
    let read = spans
        .iter()
        .find(|s| s["name"] == "execute_tool read_file")
        .expect("the child's tool call is traced");
    assert_eq!(read["traceId"], call["traceId"]);
    rt.block_on(server.shutdown());
}
