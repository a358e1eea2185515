//! Call ids a server repeats: every call of a run gets its own id on arrival, and the requests
//! that follow carry each call with its result under that id. A small OpenAI-compatible server
//! on 127.0.0.1 plays a provider that repeats ids.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use toolloop::agent::Agent;
use toolloop::outcome::StopReason;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::transcript::check_transcript;

type Seen = Arc<Mutex<Vec<Value>>>;

async fn handle(State(seen): State<Seen>, body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let n = {
        let mut seen = seen.lock().unwrap();
        seen.push(body);
        seen.len()
    };
    let call = |id: &str, city: &str| {
        json!({"id": id, "type": "function",
               "function": {"name": "weather", "arguments": json!({"city": city}).to_string()}})
    };
    let reply = match n {
        // Two calls with one id.
        1 => json!({"role": "assistant", "content": null,
                    "tool_calls": [call("call_0", "Paris"), call("call_0", "Oslo")]}),
        // The same id once more, in the next turn.
        2 => json!({"role": "assistant", "content": null,
                    "tool_calls": [call("call_0", "Rome")]}),
        _ => json!({"role": "assistant", "content": "Sunny everywhere."}),
    };
    let finish = if n < 3 { "tool_calls" } else { "stop" };
    axum::Json(json!({
        "id": format!("chatcmpl-{n}"), "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": finish, "message": reply}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}
    }))
}

#[tokio::test]
async fn repeated_ids_from_a_server_become_unique_ids_on_the_wire() {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/v1/chat/completions", post(handle))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut config = OpenAiConfig::new("m").with_base_url(format!("http://{addr}/v1"));
    config.api_key = Some("sk-test".into());
    let agent = Agent::builder(OpenAiModel::new(config))
        .tool(tool_fn(
            "weather",
            "Weather for a city.",
            |a: Value, _: ToolContext| async move {
                Ok::<_, ToolError>(ToolOutput::text(format!("sunny in {}", a["city"])))
            },
        ))
        .build()
        .unwrap();
    let out = agent.prompt("weather?").await;
    assert_eq!(out.stop_reason, StopReason::Answered, "{:?}", out.error);
    assert!(check_transcript(&out.messages).is_empty());

    // The last request holds the whole conversation as the server reads it.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let messages = seen[2]["messages"].as_array().unwrap();
    let mut call_ids = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(calls) = m["tool_calls"].as_array() {
            for (k, c) in calls.iter().enumerate() {
                let id = c["id"].as_str().unwrap().to_string();
                // Each call's result follows its turn, in order, under the call's id.
                assert_eq!(messages[i + 1 + k]["role"], "tool");
                assert_eq!(messages[i + 1 + k]["tool_call_id"], id.as_str());
                let city =
                    serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap())
                        .unwrap()["city"]
                        .clone();
                assert!(
                    messages[i + 1 + k]["content"]
                        .as_str()
                        .unwrap()
                        .contains(city.as_str().unwrap()),
                    "{m}"
                );
                call_ids.push(id);
            }
        }
    }
    assert_eq!(call_ids.len(), 3, "{call_ids:?}");
    assert_eq!(call_ids[0], "call_0");
    let mut unique = call_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3, "{call_ids:?}");
}
