//! Helpers shared by the command's integration tests.
#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// Every run is logged to the store: keep the tests' runs out of the user's data directory.
pub(crate) fn test_store() -> String {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    dir.path().join("store.db").to_string_lossy().into_owned()
}

/// The binary, in `dir`, with a throwaway store and none of the user's model settings.
pub(crate) fn command(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolloop"));
    c.args(args)
        .current_dir(dir)
        .env("TOOLLOOP_STORE", test_store())
        .env("TOOLLOOP_CONFIG", "")
        .env_remove("TOOLLOOP_MODEL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("GEMINI_API_KEY")
        .env_remove("GOOGLE_API_KEY");
    c
}

/// Runs the binary to the end.
pub(crate) fn toolloop(args: &[&str], dir: &Path) -> Output {
    command(args, dir).output().expect("the binary runs")
}

/// Stdout as JSON, or a panic that shows both streams.
pub(crate) fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A small repository with a README.
pub(crate) fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# Demo\n\nversion 1.2.3\n").unwrap();
    dir
}
