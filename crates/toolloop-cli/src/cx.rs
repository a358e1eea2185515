//! What one invocation of the command shares, made once in `main` and passed down to the
//! subcommands: the configuration it runs with, the request log of `--debug-requests`, the
//! stores it opened and the MCP servers it started (both closed in `main` when the command
//! ends), the project files trusted, what the sandbox keeps, and the secrets the log hides. Nothing of it is global: a function sees what its caller gives it.

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
}
