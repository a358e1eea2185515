//! The MCP source's integration tests, built as one test binary: each file of `tests/` is a
//! module of it, linked once, its tests run side by side.

// The npm packages the tests run (installed by `scripts/npm-install`).
#[path = "../../../tools/npm/testing.rs"]
mod npm;

mod http_faults;
mod npm_servers;

// Every file of `tests/` is built: a module here, or a test binary of its own.
#[path = "../../../tools/rust/test_files.rs"]
mod test_files;
