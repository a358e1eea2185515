//! The mock server's integration tests, built as one test binary: each file of `tests/` is a
//! module of it, linked once, its tests run side by side.

mod context_native;
mod context_policy;
mod context_refused;
mod mock_faults;
mod mock_server;
mod mock_window;
