//! The mock server's integration tests, built as one test binary: each file of `tests/` is a
//! module of it, linked once, its tests run side by side.

mod context_native;
mod context_policy;
mod context_refused;
mod mock_faults;
mod mock_server;
mod mock_window;

// Every file of `tests/` is built: a module here, or a test binary of its own.
#[path = "../../../tools/rust/test_files.rs"]
mod test_files;
