//! `toolloop serve --mcp [ADDR]`: the agents as MCP tools.

use super::{Agents, HttpArgs};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

pub(crate) async fn serve_stdio(_agents: Arc<Agents>) -> ExitCode {
    eprintln!("toolloop: --mcp is not built yet");
    ExitCode::FAILURE
}

pub(crate) async fn serve_http(
    _addr: SocketAddr,
    _agents: Arc<Agents>,
    _http: HttpArgs,
    _token: Option<String>,
) -> ExitCode {
    eprintln!("toolloop: --mcp is not built yet");
    ExitCode::FAILURE
}
