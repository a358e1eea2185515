//! toolloop runs LLM tool-calling loops: it sends the conversation and a tool catalog to a model,
//! runs the tool calls the model returns, sends the results back, and repeats until the model
//! answers or a budget ends the run.
//!
//! ```
//! use toolloop::providers::scripted::ScriptedModel;
//! use toolloop::{tool_fn, Agent, ToolContext, ToolError, ToolOutput};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Add { a: i64, b: i64 }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let add = tool_fn("add", "Adds two integers.", |x: Add, _ctx: ToolContext| async move {
//!     Ok::<_, ToolError>(ToolOutput::json(&(x.a + x.b)))
//! });
//! let model = ScriptedModel::from_json(r#"[
//!     {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
//!     {"text": "2 + 3 = 5"}
//! ]"#).unwrap();
//! let agent = Agent::builder(model).tool(add).build().unwrap();
//! let outcome = agent.prompt("What is 2 + 3?").await;
//! assert_eq!(outcome.text.as_deref(), Some("2 + 3 = 5"));
//! assert_eq!(outcome.tool_calls[0].content, r#"{"success":true,"message":"ok","data":5}"#);
//! # }
//! ```
//!
//! The pieces:
//! - [`agent`]: the [`agent::Agent`] and its async driver; [`engine`]: the loop as a state
//!   machine with no I/O; [`config`]: limits, policies and hooks; [`event`]: the event stream;
//!   [`outcome`]: how a run ended.
//! - [`message`]: the message model, and [`image`] for images in user messages; [`model`]: the
//!   [`model::Model`] trait; [`stream`]: stream events and the accumulator; [`usage`] and
//!   [`price`]: tokens and cost; [`context`]: each model's context window, the estimate of
//!   the next request's size, and the typed error of a request too large for the window.
//! - [`tool`] and [`toolbox`]: tools, typed tools, argument validation; [`tool_source`]: tools
//!   from outside the program that can change during a run (MCP servers').
//! - [`providers`]: the adapters: offline `test` and `scripted` models; OpenAI Chat Completions
//!   (and every compatible server) and Responses, Anthropic and Gemini, each in a folder of its
//!   own (configuration, request, response, stream, errors), over the shared [`transport`]
//!   (HTTP with retries and limits, Server-Sent Events); [`ptk`]: prompt-based tool calling for
//!   models without native support.
//! - [`journal`]: the run log that makes runs resumable after a crash; [`transcript`]:
//!   checking and repairing stored transcripts.
//! - [`schema`]: sample arguments from a JSON Schema; [`result`]: how tool results are
//!   serialized and capped; [`redact`]: keeping API keys out of error messages.
//!
//! Beside this crate, each in its own so that a program compiles only what it uses:
//! - `toolloop-store`: sessions and run logs in SQLite or PostgreSQL (implements [`journal`]);
//! - `toolloop-tools`: built-in tools (file tools confined to a root directory, `run_command`
//!   and its sandbox);
//! - `toolloop-mcp`: MCP servers' tools as toolloop tools;
//! - `toolloop-workflow`: step workflows, each step a run, chained by their outputs;
//! - `toolloop-restate`: the agent as a durable service on Restate;
//! - `toolloop-mock`: a mock provider server with fault injection, for tests, demos and
//!   benchmarks;
//! - `toolloop-cli`: the `toolloop` command.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod approval;
pub mod config;
pub mod context;
pub mod engine;
pub mod event;
pub mod image;
pub mod journal;
pub mod message;
pub mod model;
mod model_names;
pub mod outcome;
pub mod output;
pub mod price;
pub mod providers;
pub mod ptk;
pub mod redact;
pub mod result;
pub mod schema;
mod schema_check;
pub mod stream;
pub mod subagent;
pub mod telemetry;
pub mod tool;
pub mod tool_source;
pub mod toolbox;
pub mod transcript;
pub mod transport;
pub mod usage;
pub mod user_file;

pub use agent::{Agent, AgentBuilder};
pub use config::LoopConfig;
pub use event::Event;
pub use message::{Message, ToolCall, ToolResult};
pub use model::{Model, ModelError, ModelResponse};
pub use outcome::{Outcome, StopReason};
pub use output::OutputSchema;
#[cfg(all(feature = "testing", not(target_arch = "wasm32")))]
pub use schema_check::webassembly_checker_agrees;
pub use subagent::SubAgent;
pub use tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, tool_fn};
pub use usage::Usage;

// The transport's modules, at the paths they had before they were grouped under [`transport`].
#[cfg(feature = "http")]
#[doc(no_inline)]
pub use transport::http;
#[doc(no_inline)]
pub use transport::sse;

/// The README's examples, compiled and run as doc-tests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
