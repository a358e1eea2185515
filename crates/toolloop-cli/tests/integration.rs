//! The command's integration tests, built as one test binary: each file of `tests/` is a module
//! of it. One binary is linked once, instantiates the dependencies' generic code once, and runs
//! the tests of every file side by side.

// Fixtures shared by several files.
mod common;
#[path = "../../../tools/npm/testing.rs"]
mod npm;
#[path = "../../../tools/python/testing.rs"]
mod python;
#[cfg(feature = "restate")]
#[path = "../../toolloop-restate/tests/common/mod.rs"]
mod restate_server;

mod approvals;
mod attach;
mod cli;
mod context;
mod delegation;
mod durable;
mod eval;
mod everyday;
mod guards;
mod local_servers;
mod mcp;
mod output_schema;
mod ptk_cli;
mod record_replay;
mod sandbox;
mod secrets;
mod serve_mcp;
mod serve_openai;
mod serve_restate;
mod traces;
mod workflow;

// Every file of `tests/` is built: a module here, or a test binary of its own.
#[path = "../../../tools/rust/test_files.rs"]
mod test_files;
