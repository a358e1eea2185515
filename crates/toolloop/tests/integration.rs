//! The integration tests of `toolloop`, built as one test binary: each file of `tests/` is a
//! module of it (a file that changes what the whole process shares, its allocator or its
//! limits, is a binary of its own: see `Cargo.toml`). One binary is linked once, instantiates
//! the dependencies' generic code once, and runs the tests of every file side by side.

// Fixtures shared by several files.
mod common;
#[cfg(feature = "http")]
mod mock_models;
mod recording;
mod wire;

mod anthropic_wire;
mod approval_required;
mod approvals;
mod call_ids;
mod conformance;
mod context_policy;
mod delegation;
mod fault_suite;
mod gemini_wire;
mod http_hardening;
mod images;
mod local_servers;
mod loop_controls;
mod loop_footprint;
mod old_logs;
mod openai_wire;
mod provider_config;
mod ptk;
mod ptk_mock;
mod record_replay;
mod resume;
mod tool_source;
mod typed_output;
mod usage;

// Every file of `tests/` is built: a module here, or a test binary of its own.
#[path = "../../../tools/rust/test_files.rs"]
mod test_files;
