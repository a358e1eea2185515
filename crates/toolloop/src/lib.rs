//! toolloop: LLM tool-calling loops.
#![warn(missing_docs)]

pub mod agent;
pub mod config;
pub mod engine;
pub mod event;
#[cfg(feature = "http")]
pub mod http;
pub mod message;
#[cfg(feature = "mock")]
pub mod mock;
pub mod model;
pub mod outcome;
pub mod price;
pub mod providers;
pub mod ptk;
pub mod result;
pub mod schema;
pub mod sse;
pub mod stream;
pub mod tool;
pub mod toolbox;
pub mod tools;
pub mod usage;
