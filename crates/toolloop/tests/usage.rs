//! Token counts a server did not report are unknown, not zero: a small OpenAI-compatible server
//! on 127.0.0.1 answers without counts, and the run's usage and cost say so. Both OpenAI APIs
//! (Chat Completions and Responses) are run.

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use toolloop::model::Model;
use toolloop::outcome::StopReason;
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};

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
        .route(
            "/v1/responses",
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

/// A text reply, of the Responses API or of Chat Completions, with this usage object.
fn answer(responses: bool, text: &str, usage: Option<Value>) -> Value {
    let mut v = if responses {
        json!({
            "id": "resp_1", "object": "response", "model": "gpt-4o", "status": "completed",
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}]
        })
    } else {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}]
        })
    };
    if let Some(u) = usage {
        v["usage"] = u;
    }
    v
}

async fn run(responses: bool, reply: Value) -> toolloop::outcome::Outcome {
    let url = serve(vec![reply]).await;
    let model: Arc<dyn Model> = if responses {
        let mut config = ResponsesConfig::new("gpt-4o").with_base_url(url);
        config.api_key = Some("sk-test".into());
        Arc::new(ResponsesModel::new(config))
    } else {
        let mut config = OpenAiConfig::new("gpt-4o").with_base_url(url);
        config.api_key = Some("sk-test".into());
        Arc::new(OpenAiModel::new(config))
    };
    toolloop::agent::AgentBuilder::new(model)
        .build()
        .unwrap()
        .prompt("hi")
        .await
}

#[tokio::test]
async fn a_reply_without_token_counts_has_unknown_usage_and_cost() {
    for responses in [false, true] {
        // No usage object, and usage objects without an input or output count.
        for usage in [None, Some(json!({})), Some(json!({"total_tokens": 12}))] {
            let out = run(responses, answer(responses, "hello", usage.clone())).await;
            let what = format!("responses={responses} {usage:?}");
            assert_eq!(out.stop_reason, StopReason::Answered, "{what}");
            assert_eq!(out.usage, None, "{what}");
            assert_eq!(out.calls_without_usage, 1, "{what}");
            assert_eq!(out.cost, None, "{what}: a priced model, but no counts");
        }
        // Counts reported: summed and priced.
        let counts = if responses {
            json!({"input_tokens": 1000, "output_tokens": 100,
                   "input_tokens_details": {"cached_tokens": 600},
                   "output_tokens_details": {"reasoning_tokens": 40}})
        } else {
            json!({"prompt_tokens": 1000, "completion_tokens": 100})
        };
        let out = run(responses, answer(responses, "hello", Some(counts))).await;
        let usage = out.usage.unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (1000, 100));
        if responses {
            assert_eq!((usage.cache_read_tokens, usage.reasoning_tokens), (600, 40));
        }
        assert_eq!(out.calls_without_usage, 0);
        assert!(out.cost.unwrap() > 0.0, "responses={responses}");
    }
}
