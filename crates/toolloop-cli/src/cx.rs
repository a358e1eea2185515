//! What one invocation of the command shares, made once in `main` and passed down to the
//! subcommands: the configuration it runs with, the request log of `--debug-requests`, the
//! stores it opened and the MCP servers it started (both closed in `main` when the command
//! ends), the project files trusted, what the sandbox keeps, the secrets the log hides, the cassette
//! of `--record` or `replay:FILE`, and the keys of the models built. Nothing of it is global: a
//! function sees what its caller gives it. (The keys taken out of the environment at start
//! are the exception, process-wide as the environment is: see `secrets`.)

use std::sync::Arc;
use toolloop::transport::request_log::RequestLog;

/// The command's shared state (see the module's documentation).
#[derive(Default)]
pub(crate) struct Cx {
    /// The configuration file read at start, and the flags given explicitly.
    pub config: crate::config::Loaded,
    /// Where the model requests and responses are logged (`--debug-requests`, `DEBUG_LLM=1`).
    pub debug_log: Option<Arc<RequestLog>>,
    /// The stores opened, one per location and durability.
    pub stores: crate::durable::Stores,
    /// The MCP servers started (a chat's runs share them).
    pub servers: crate::mcp::Servers,
    /// The trust decisions about project files made in this command.
    pub trust: crate::mcp::trust::Seen,
    /// The secrets kept out of the log's lines (the MCP servers' header values).
    pub log_secrets: crate::logging::LogSecrets,
    /// The store files kept from sandboxed programs, and whether the sandbox warning was said.
    pub sandbox: crate::sandbox::SandboxState,
    /// The cassette the command records in or plays back from (`--record`, `replay:FILE`).
    pub record: crate::record::Recording,
    /// The keys of the models the command built, which answers and cassettes are redacted of.
    pub model_keys: crate::secrets::ModelKeys,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one command notes (a model's key, its cassette) is its own: another command in the
    /// same process (a test, a future server of several commands) sees none of it.
    #[test]
    fn one_command_keeps_its_keys_and_cassette_from_another() {
        let dir = tempfile::tempdir().unwrap();
        let (one, other) = (Cx::default(), Cx::default());
        let record = crate::record::RecordArgs {
            record: Some(dir.path().join("run.jsonl")),
            ..Default::default()
        };
        crate::record::setup(&one, &record, "test", serde_json::json!({})).unwrap();
        assert!(one.record.cassette().is_some());
        assert!(other.record.cassette().is_none());
        crate::secrets::note_key(&one, "sk-0123456789abcdef");
        let said = "the key is sk-0123456789abcdef";
        assert!(
            !crate::secrets::redactor(&one)
                .redact(said)
                .contains("0123456789")
        );
        assert_eq!(crate::secrets::redactor(&other).redact(said), said);
    }
}
