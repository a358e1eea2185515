//! Token counts a server did not report are unknown, not zero: a small OpenAI-compatible server
//! on 127.0.0.1 answers without counts, and the run's usage and cost say so.

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use toolloop::agent::Agent;
use toolloop::outcome::StopReason;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};

/// Serves `replies` in turn (the last one again when they run out).
async fn serve(replies: Vec<Value>) -> String {
    let replies = Arc::new(replies);
    let n = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(
                |State((replies, n)): State<(Arc<Vec<Value>>, Arc<AtomicU32>)>| async move {
                    let i = n.fetch_add(1, Ordering::SeqCst) as usize;
                    axum::Json(replies[i.min(replies.len() - 1)].clone())
                },
            ),
        )
        .with_state((replies, n));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

fn answer(text: &str, usage: Option<Value>) -> Value {
    let mut v = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}]
    });
    if let Some(u) = usage {
        v["usage"] = u;
    }
    v
}

async fn run(reply: Value) -> toolloop::outcome::Outcome {
    let url = serve(vec![reply]).await;
    let mut config = OpenAiConfig::new("gpt-4o").with_base_url(url);
    config.api_key = Some("sk-test".into());
    Agent::builder(OpenAiModel::new(config))
        .build()
        .unwrap()
        .prompt("hi")
        .await
}

#[tokio::test]
async fn a_reply_without_token_counts_has_unknown_usage_and_cost() {
    // No usage object, and usage objects without a prompt or completion count.
    for usage in [None, Some(json!({})), Some(json!({"total_tokens": 12}))] {
        let out = run(answer("hello", usage.clone())).await;
        assert_eq!(out.stop_reason, StopReason::Answered, "{usage:?}");
        assert_eq!(out.usage, None, "{usage:?}");
        assert_eq!(out.calls_without_usage, 1, "{usage:?}");
        assert_eq!(out.cost, None, "{usage:?}: a priced model, but no counts");
    }
    // Counts reported: summed and priced.
    let out = run(answer(
        "hello",
        Some(json!({"prompt_tokens": 1000, "completion_tokens": 100})),
    ))
    .await;
    let usage = out.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (1000, 100));
    assert_eq!(out.calls_without_usage, 0);
    assert!(out.cost.unwrap() > 0.0);
}
