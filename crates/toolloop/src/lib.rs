//! toolloop: LLM tool-calling loops.
#![warn(missing_docs)]

#[cfg(feature = "http")]
pub mod http;
pub mod message;
#[cfg(feature = "mock")]
pub mod mock;
pub mod model;
pub mod price;
pub mod providers;
pub mod ptk;
pub mod schema;
pub mod sse;
pub mod stream;
pub mod tool;
pub mod toolbox;
pub mod tools;
pub mod usage;
