//! Images in user messages and in tool results, end to end over real HTTP against the mock:
//! each wire API (Chat Completions, Responses, Anthropic Messages, Gemini), streamed and not,
//! and prompt-based tool calling over Chat Completions. The mock checks every image as the APIs do (the bytes are an
//! image of the declared type, URLs are http or https) and says how many it saw, so a test
//! passes only when the images reached the server in that API's form, through rounds of tool
//! calls.
#![cfg(feature = "http")]

use crate::mock_models;

use serde::Deserialize;
use std::sync::Arc;
use toolloop::agent::AgentBuilder;
use toolloop::image::Image;
use toolloop::message::Message;
use toolloop::model::Model;
use toolloop::outcome::StopReason;
use toolloop::ptk::{Dialect, Prompted};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop_mock::{MockOptions, MockServer, start};

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae,
    0x42, 0x60, 0x82,
];

const PROTOCOLS: [&str; 4] = ["openai", "openai-responses", "anthropic", "gemini"];

fn model(protocol: &str, server: &MockServer, scenario: &str) -> Arc<dyn Model> {
    mock_models::mock_model(protocol, &server.base_url(), scenario)
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Query {
    /// What to look up.
    query: String,
}

fn builder(model: Arc<dyn Model>, stream: bool) -> AgentBuilder {
    AgentBuilder::new(model)
        .tool(tool_fn(
            "lookup",
            "Looks a thing up.",
            |q: Query, _ctx: ToolContext| async move {
                Ok::<_, ToolError>(ToolOutput::text(format!("found {}", q.query)))
            },
        ))
        .stream(stream)
}

fn two_images() -> Vec<Image> {
    vec![
        Image::from_bytes(PNG).unwrap(),
        Image::from_url("https://example.com/chart.png").unwrap(),
    ]
}

#[tokio::test]
async fn images_reach_every_api_through_rounds_of_calls() {
    let server = start(MockOptions::default()).await.unwrap();
    for protocol in PROTOCOLS {
        for stream in [false, true] {
            let agent = builder(model(protocol, &server, "mock:rounds=2"), stream)
                .build()
                .unwrap();
            let outcome = agent
                .run(vec![Message::user_with_images(
                    "What is in these pictures?",
                    two_images(),
                )])
                .await;
            assert_eq!(
                outcome.stop_reason,
                StopReason::Answered,
                "{protocol} stream={stream}: {:?}",
                outcome.error
            );
            assert_eq!(
                outcome.text.as_deref(),
                Some("Done. I saw 2 tool results in 2 rounds. I see 2 images."),
                "{protocol} stream={stream}"
            );
            // The transcript keeps the images where they were given.
            assert_eq!(outcome.messages[0].images().len(), 2);
        }
    }
    // The mock refused no image: each went out in its API's form.
    assert_eq!(server.stats().rejected, 0);
    server.shutdown().await;
}

/// A tool that returns a screenshot with its text.
fn screenshot_builder(model: Arc<dyn Model>, stream: bool) -> AgentBuilder {
    AgentBuilder::new(model)
        .tool(tool_fn(
            "screenshot",
            "Takes a screenshot of a page.",
            |q: Query, _ctx: ToolContext| async move {
                Ok::<_, ToolError>(
                    ToolOutput::text(format!("the page {}", q.query))
                        .with_image(Image::from_bytes(PNG).unwrap()),
                )
            },
        ))
        .stream(stream)
}

#[tokio::test]
async fn images_a_tool_returns_reach_every_api_and_stay_with_the_result() {
    let server = start(MockOptions::default()).await.unwrap();
    for protocol in PROTOCOLS {
        for stream in [false, true] {
            // Two rounds of two parallel calls: four results, each with its image.
            let agent = screenshot_builder(
                model(protocol, &server, "mock:rounds=2,parallel=2,distinct=true"),
                stream,
            )
            .build()
            .unwrap();
            let outcome = agent.prompt("Look at the pages").await;
            // The transcript keeps each image with its result.
            let results: Vec<&toolloop::message::ToolResult> = outcome
                .messages
                .iter()
                .filter_map(|m| match m {
                    Message::Tool(r) => Some(r),
                    _ => None,
                })
                .collect();
            assert_eq!(results.len(), 4);
            let images: Vec<usize> = results.iter().map(|r| r.images.len()).collect();
            assert_eq!(images, [1, 1, 1, 1], "{protocol} stream={stream}");
            assert_eq!(
                outcome.text.as_deref(),
                Some("Done. I saw 4 tool results in 2 rounds. I see 4 images."),
                "{protocol} stream={stream}: {:?}",
                outcome.error
            );
        }
    }
    // Prompt-based calling sends them with the results' message.
    let inner = model("openai", &server, "mock:text_calls=hermes,rounds=1");
    let agent = screenshot_builder(Arc::new(Prompted::new(inner, Dialect::Hermes)), false)
        .build()
        .unwrap();
    let outcome = agent.prompt("Look at the page").await;
    assert_eq!(
        outcome.text.as_deref(),
        Some("Done. I saw 1 tool results in 1 rounds. I see 1 image."),
        "{:?}",
        outcome.error
    );
    assert_eq!(server.stats().rejected, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn a_turn_without_images_is_answered_without_seeing_any() {
    let server = start(MockOptions::default()).await.unwrap();
    for protocol in PROTOCOLS {
        let agent = builder(model(protocol, &server, "mock:rounds=0"), false)
            .build()
            .unwrap();
        let outcome = agent.prompt("hello").await;
        assert_eq!(
            outcome.text.as_deref(),
            Some("Done. I saw 0 tool results in 0 rounds."),
            "{protocol}"
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn prompt_based_calling_passes_images_to_the_model_beneath() {
    let server = start(MockOptions::default()).await.unwrap();
    let inner = model("openai", &server, "mock:text_calls=hermes,rounds=1");
    let agent = builder(Arc::new(Prompted::new(inner, Dialect::Hermes)), false)
        .build()
        .unwrap();
    let outcome = agent
        .run(vec![Message::user_with_images(
            "Look at this.",
            [Image::from_bytes(PNG).unwrap()],
        )])
        .await;
    assert_eq!(
        outcome.text.as_deref(),
        Some("Done. I saw 1 tool results in 1 rounds. I see 1 image."),
        "{:?}",
        outcome.error
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_image_the_server_refuses_fails_the_run_with_its_reason() {
    let server = start(MockOptions::default()).await.unwrap();
    // Declared a JPEG, but the bytes are a PNG: the APIs refuse it, and so does the mock.
    let liar = Image::from_bytes_with_type(PNG, "image/jpeg").unwrap();
    for protocol in PROTOCOLS {
        let agent = builder(model(protocol, &server, "mock"), false)
            .build()
            .unwrap();
        let outcome = agent
            .run(vec![Message::user_with_images(
                "What is it?",
                [liar.clone()],
            )])
            .await;
        assert_eq!(outcome.stop_reason, StopReason::ModelError, "{protocol}");
        let error = outcome.error.expect("an error");
        assert!(
            error.message.contains("image/png"),
            "{protocol}: {}",
            error.message
        );
        // The failed run still returns its transcript, images included.
        assert_eq!(outcome.messages[0].images().len(), 1, "{protocol}");
    }
    server.shutdown().await;
}
