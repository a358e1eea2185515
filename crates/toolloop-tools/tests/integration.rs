//! The built-in tools' integration tests, built as one test binary: each file of `tests/` is a
//! module of it, linked once, its tests run side by side (`command_env`, which sets the
//! process's environment variables, is a binary of its own: see `Cargo.toml`).

mod approval_subjects;
mod catalog;
mod command;
mod fs_tools;
mod sandbox;

// Every file of `tests/` is built: a module here, or a test binary of its own.
#[path = "../../../tools/rust/test_files.rs"]
mod test_files;
