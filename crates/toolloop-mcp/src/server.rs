//! One server: started on first use, restarted (a bounded number of times) after it died, shut
//! down cleanly; its tool list, refreshed after `notifications/tools/list_changed`; its calls,
//! cancelled on the server when the caller stops waiting.

use crate::config::{ServerConfig, Transport, child_env};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientRequest, Implementation, MetaObject, RequestMetaObject,
    ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::task::TaskTracker;
use toolloop::tool::{ToolContext, ToolError};

/// The `_meta` key that carries a call's idempotency key
/// ([`ToolContext::idempotency_key`]): the same for a call across retries and resumes, so a
/// server can drop repeats.
pub const IDEMPOTENCY_KEY_META: &str = "idempotencyKey";

/// The most stderr lines kept per server, for error messages.
const STDERR_LINES: usize = 20;
/// The longest stderr line kept, in characters.
const STDERR_LINE_CHARS: usize = 400;

/// Why a server could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("MCP server `{server}`: {message}")]
pub struct McpError {
    /// The server's name.
    pub server: String,
    /// What went wrong (with the end of its stderr when it did not start).
    pub message: String,
}

/// Where a server stands (for `toolloop mcp list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Not started yet.
    NotStarted,
    /// Connected.
    Running,
    /// It died (or failed to start) and is started again on the next use.
    Exited(String),
    /// It failed to start, or died more often than allowed; its calls fail.
    Failed(String),
    /// Shut down.
    Stopped,
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerState::NotStarted => f.write_str("not started"),
            ServerState::Running => f.write_str("running"),
            ServerState::Exited(why) => write!(f, "exited ({why})"),
            ServerState::Failed(why) => write!(f, "failed: {why}"),
            ServerState::Stopped => f.write_str("stopped"),
        }
    }
}

/// Whether a server's tool list must be listed again, and how often it changed.
#[derive(Debug)]
struct Staleness {
    /// Set when the list must be listed again (and before the first listing).
    stale: AtomicBool,
    /// Moves each time the list may have changed (see [`McpServer::tools_version`]).
    version: AtomicU64,
}

impl Staleness {
    /// The list may have changed: listed again on next use, and the version moves.
    fn mark(&self) {
        self.version.fetch_add(1, Ordering::SeqCst);
        self.stale.store(true, Ordering::SeqCst);
    }
}

/// The client's side of the connection (what it tells the server of itself).
struct Handler;

/// A connection's messages from the server, watched for a changed tool list as they are read.
///
/// rmcp hands a notification to the client's handler in a task of its own, but gives the answer
/// to a request straight to its caller, so a server that says its tool list changed and then
/// answers a call could have the answer seen first: the run's next round would offer the old
/// tools. Read here, in the order the server sent them, the notification marks the catalog stale
/// before the answer that follows it reaches anyone.
struct Watched<T> {
    inner: T,
    changed: Arc<Staleness>,
}

impl<T: rmcp::transport::Transport<RoleClient>> rmcp::transport::Transport<RoleClient>
    for Watched<T>
{
    type Error = T::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        let Watched { inner, changed } = self;
        async move {
            let message = inner.receive().await;
            if let Some(rmcp::model::JsonRpcMessage::Notification(n)) = &message
                && matches!(
                    n.notification,
                    rmcp::model::ServerNotification::ToolListChangedNotification(_)
                )
            {
                changed.mark();
            }
            message
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolloop", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// The last lines a child wrote on stderr.
#[derive(Default)]
struct StderrTail {
    lines: Mutex<VecDeque<String>>,
}

impl StderrTail {
    fn push(&self, line: &str) {
        let line: String = line.chars().take(STDERR_LINE_CHARS).collect();
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == STDERR_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn text(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

struct Conn {
    client: RunningService<RoleClient, Handler>,
    peer: Peer<RoleClient>,
    generation: u32,
    stderr: Option<(Arc<StderrTail>, tokio::task::JoinHandle<()>)>,
    /// The sandbox of a child process server (its private temporary directory lives as long
    /// as the connection).
    _sandbox: Option<toolloop_tools::sandbox::Confinement>,
}

/// One MCP server. Cheap to share (`Arc`); calls may run at the same time.
pub struct McpServer {
    config: ServerConfig,
    /// Takes the configured secrets (header values, secret variables) out of what is said.
    redactor: toolloop::redact::Redactor,
    conn: tokio::sync::Mutex<Option<Conn>>,
    starts: AtomicU32,
    state: Mutex<ServerState>,
    /// Whether the tool list must be listed again (the server said it changed, or started).
    changed: Arc<Staleness>,
    tools: Mutex<Option<Arc<Vec<rmcp::model::Tool>>>>,
    /// Cancellation notices still being sent for calls whose callers went away.
    cancelling: TaskTracker,
    /// The last stderr seen, for calls that find the server dead.
    last_stderr: Mutex<Option<Arc<StderrTail>>>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.config.name)
            .field("state", &self.state())
            .finish()
    }
}

impl McpServer {
    /// A server that starts on first use.
    pub fn new(config: ServerConfig) -> Arc<Self> {
        let mut redactor = toolloop::redact::Redactor::new();
        for secret in config.secrets() {
            redactor.add_secret(&secret);
        }
        Arc::new(McpServer {
            redactor,
            config,
            conn: tokio::sync::Mutex::new(None),
            starts: AtomicU32::new(0),
            state: Mutex::new(ServerState::NotStarted),
            changed: Arc::new(Staleness {
                stale: AtomicBool::new(true),
                version: AtomicU64::new(0),
            }),
            tools: Mutex::new(None),
            cancelling: TaskTracker::new(),
            last_stderr: Mutex::new(None),
        })
    }

    /// The server's configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Where the server stands.
    pub fn state(&self) -> ServerState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_state(&self, state: ServerState) {
        let state = match state {
            ServerState::Exited(why) => ServerState::Exited(self.redactor.redact(&why)),
            ServerState::Failed(why) => ServerState::Failed(self.redactor.redact(&why)),
            other => other,
        };
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    fn error(&self, message: impl Into<String>) -> McpError {
        McpError {
            server: self.config.name.clone(),
            message: self.redactor.redact(&message.into()),
        }
    }

    /// A failed call, its message without the server's configured secrets.
    fn tool_error(&self, message: impl Into<String>) -> ToolError {
        ToolError::new(self.redactor.redact(&message.into()))
    }

    /// Text from or about the server without its configured secrets (see
    /// [`ServerConfig::secrets`]).
    pub fn redact(&self, text: &str) -> String {
        self.redactor.redact(text)
    }

    /// Starts the server unless it runs. A server that fails to start is an error naming it,
    /// with the end of its stderr.
    pub async fn start(&self) -> Result<(), McpError> {
        self.peer().await.map(drop)
    }

    /// How many times the server was started (restarts are this minus one).
    pub fn starts(&self) -> u32 {
        self.starts.load(Ordering::SeqCst)
    }

    /// A live connection: the current one, or a new one when the server is not running (up to
    /// [`ServerConfig::max_restarts`] restarts).
    async fn peer(&self) -> Result<(Peer<RoleClient>, u32), McpError> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            if !c.peer.is_transport_closed() {
                return Ok((c.peer.clone(), c.generation));
            }
            let why = self.exit_note(c);
            if let Some(old) = conn.take() {
                close(old).await;
            }
            self.set_state(ServerState::Exited(why));
        }
        if let ServerState::Failed(why) = self.state() {
            return Err(self.error(why));
        }
        if matches!(self.state(), ServerState::Stopped) {
            return Err(self.error("the server was shut down"));
        }
        let starts = self.starts.load(Ordering::SeqCst);
        if starts > self.config.max_restarts {
            let why = format!(
                "the server exited and was restarted {} times; it is not started again",
                starts - 1
            );
            self.set_state(ServerState::Failed(why.clone()));
            return Err(self.error(why));
        }
        self.starts.fetch_add(1, Ordering::SeqCst);
        match self.connect(starts + 1).await {
            Ok(c) => {
                let out = (c.peer.clone(), c.generation);
                *conn = Some(c);
                self.changed.mark();
                self.set_state(ServerState::Running);
                Ok(out)
            }
            Err(e) => {
                // A server that never started is not tried again; one that ran before may be.
                if starts == 0 {
                    self.set_state(ServerState::Failed(e.message.clone()));
                } else {
                    self.set_state(ServerState::Exited(e.message.clone()));
                }
                Err(e)
            }
        }
    }

    fn exit_note(&self, c: &Conn) -> String {
        match &c.stderr {
            Some((tail, _)) => {
                let text = tail.text();
                if text.is_empty() {
                    "the connection closed".into()
                } else {
                    format!("the connection closed; stderr ends: {}", last_line(&text))
                }
            }
            None => "the connection closed".into(),
        }
    }

    async fn connect(&self, generation: u32) -> Result<Conn, McpError> {
        let handler = Handler;
        let startup = self.config.startup_timeout;
        match &self.config.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                let inherited = std::env::vars_os()
                    .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
                cmd.args(args)
                    .env_clear()
                    .envs(child_env(inherited, env))
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                if let Some(dir) = cwd {
                    cmd.current_dir(dir);
                }
                let sandbox = match &self.config.sandbox {
                    Some(policy) if policy.is_on() => {
                        let root = match cwd {
                            Some(dir) => dir.clone(),
                            None => std::env::current_dir().map_err(|e| {
                                self.error(format!("no working directory for the sandbox: {e}"))
                            })?,
                        };
                        let policy = policy.clone();
                        let mut c = tokio::task::spawn_blocking(move || policy.prepare(&root))
                            .await
                            .map_err(|e| self.error(e.to_string()))?
                            .map_err(|e| self.error(format!("cannot start `{command}`: {e}")))?;
                        c.apply(cmd.as_std_mut());
                        Some(c)
                    }
                    _ => None,
                };
                let (process, stderr) = ChildTransport::spawn(cmd)
                    .map_err(|e| self.error(format!("cannot run `{command}`: {e}")))?;
                let tail = Arc::new(StderrTail::default());
                *self.last_stderr.lock().unwrap_or_else(|p| p.into_inner()) = Some(tail.clone());
                let reader = tokio::spawn(read_stderr(
                    stderr,
                    tail.clone(),
                    self.name().into(),
                    self.redactor.clone(),
                ));
                let served = tokio::time::timeout(
                    startup,
                    handler.serve(Watched {
                        inner: process,
                        changed: self.changed.clone(),
                    }),
                )
                .await;
                let client = match served {
                    Ok(Ok(client)) => client,
                    failed => {
                        let why = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!(
                                "no answer to `initialize` within {}s",
                                startup.as_secs_f64()
                            ),
                        };
                        // The child's last words arrive as it exits.
                        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
                        let text = tail.text();
                        let stderr = if text.is_empty() {
                            "(nothing on stderr)".to_string()
                        } else {
                            format!("its stderr ends:\n{text}")
                        };
                        return Err(
                            self.error(format!("did not start (`{command}`): {why}; {stderr}"))
                        );
                    }
                };
                let peer = client.peer().clone();
                Ok(Conn {
                    client,
                    peer,
                    generation,
                    stderr: Some((tail, reader)),
                    _sandbox: sandbox,
                })
            }
            Transport::Http { url, headers } => {
                #[cfg(feature = "http")]
                {
                    let transport =
                        crate::http::transport(url, headers).map_err(|e| self.error(e))?;
                    let client = match tokio::time::timeout(
                        startup,
                        handler.serve(Watched {
                            inner: transport,
                            changed: self.changed.clone(),
                        }),
                    )
                    .await
                    {
                        Ok(Ok(client)) => client,
                        Ok(Err(e)) => {
                            return Err(self.error(format!("did not start ({url}): {e}")));
                        }
                        Err(_) => {
                            return Err(self.error(format!(
                                "did not start ({url}): no answer to `initialize` within {}s",
                                startup.as_secs_f64()
                            )));
                        }
                    };
                    let peer = client.peer().clone();
                    Ok(Conn {
                        client,
                        peer,
                        generation,
                        stderr: None,
                        _sandbox: None,
                    })
                }
                #[cfg(not(feature = "http"))]
                {
                    let _ = (url, headers, handler);
                    Err(self
                        .error("streamable HTTP servers need the `http` feature of toolloop-mcp"))
                }
            }
        }
    }

    /// The server's tools: listed on first use and again after the server said its list
    /// changed (or after a restart); otherwise the list from before. Starting and listing are
    /// each bounded by [`ServerConfig::startup_timeout`].
    pub async fn list_tools(&self) -> Result<Arc<Vec<rmcp::model::Tool>>, McpError> {
        self.list_tools_by(None).await
    }

    /// [`McpServer::list_tools`], given up at `deadline` too (the run's): an error naming the
    /// server.
    pub async fn list_tools_by(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Arc<Vec<rmcp::model::Tool>>, McpError> {
        let Some(deadline) = deadline else {
            return self.list_tools_now().await;
        };
        match tokio::time::timeout_at(deadline, self.list_tools_now()).await {
            Ok(listed) => listed,
            Err(_) => {
                self.changed.stale.store(true, Ordering::SeqCst);
                Err(self.error("no tool list before the run's timeout"))
            }
        }
    }

    async fn list_tools_now(&self) -> Result<Arc<Vec<rmcp::model::Tool>>, McpError> {
        let (peer, generation) = self.peer().await?;
        if !self.changed.stale.swap(false, Ordering::SeqCst)
            && let Some(tools) = self.tools.lock().unwrap_or_else(|p| p.into_inner()).clone()
        {
            return Ok(tools);
        }
        let limit = self.config.startup_timeout;
        let listed = tokio::time::timeout(limit, peer.list_all_tools()).await;
        match listed {
            Ok(Ok(tools)) => {
                let tools = Arc::new(tools);
                *self.tools.lock().unwrap_or_else(|p| p.into_inner()) = Some(tools.clone());
                Ok(tools)
            }
            Ok(Err(e)) => {
                self.changed.stale.store(true, Ordering::SeqCst);
                if matches!(e, ServiceError::TransportClosed) {
                    self.forget(generation).await;
                }
                Err(self.error(format!("cannot list its tools: {}", service_error_text(&e))))
            }
            Err(_) => {
                self.changed.stale.store(true, Ordering::SeqCst);
                Err(self.error(format!(
                    "no answer to `tools/list` within {}s",
                    limit.as_secs_f64()
                )))
            }
        }
    }

    /// Whether the server said its tool list changed since it was last listed.
    pub fn tools_changed(&self) -> bool {
        self.changed.stale.load(Ordering::SeqCst)
    }

    /// A number that moves each time the server's tool list may have changed: it said so
    /// (`notifications/tools/list_changed`), or it was started (again).
    pub fn tools_version(&self) -> u64 {
        self.changed.version.load(Ordering::SeqCst)
    }

    /// Drops a connection found dead, so the next use starts the server again.
    async fn forget(&self, generation: u32) {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|c| c.generation == generation) {
            let old = conn.take();
            if let Some(old) = old {
                let why = self.exit_note(&old);
                close(old).await;
                self.set_state(ServerState::Exited(why));
            }
        }
    }

    /// Calls a tool of the server by its own name. The idempotency key goes in the request's
    /// `_meta` ([`IDEMPOTENCY_KEY_META`]); `ctx.cancel`, the per-call timeout, or dropping the
    /// future tells the server with `notifications/cancelled`. A server that dies during the
    /// call gives an error (and is started again for the next call).
    pub async fn call_tool(
        &self,
        tool: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<CallToolResult, ToolError> {
        let (peer, generation) = self
            .peer()
            .await
            .map_err(|e| ToolError::new(e.to_string()))?; // already redacted
        let arguments = match args {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => {
                return Err(ToolError::new(format!(
                    "the arguments must be a JSON object, not {other}"
                )));
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let mut meta = serde_json::Map::new();
        meta.insert(
            IDEMPOTENCY_KEY_META.into(),
            Value::String(ctx.idempotency_key.clone()),
        );
        let mut options =
            PeerRequestOptions::no_options().with_meta(RequestMetaObject(MetaObject(meta)));
        options.timeout = self.config.call_timeout;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = match peer.send_request_with_option(request, options).await {
            Ok(h) => h,
            Err(e) => return Err(self.call_failed(e, generation).await),
        };
        let mut guard = CancelOnDrop {
            peer: peer.clone(),
            id: Some(handle.id.clone()),
            tracker: self.cancelling.clone(),
        };
        let response = tokio::select! {
            r = handle.await_response() => r,
            _ = ctx.cancel.cancelled() => {
                if let Some(id) = guard.id.take() {
                    let notice = CancelledNotificationParam::new(
                        Some(id),
                        Some("the run was cancelled".into()),
                    );
                    let _ = peer.notify_cancelled(notice).await;
                }
                return Err(ToolError::new("cancelled: the run was cancelled or timed out"));
            }
        };
        guard.id = None;
        // The server's notifications are handled on tasks of their own; one it sent before
        // this result (the tool list changed, say) gets its turn before the caller goes on.
        tokio::task::yield_now().await;
        match response {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(ServerResult::EmptyResult(_)) => Ok(CallToolResult::default()),
            Ok(_) => Err(self.tool_error(format!(
                "MCP server `{}` answered the call with something other than a tool result",
                self.name()
            ))),
            Err(ServiceError::Timeout { timeout }) => Err(self.tool_error(format!(
                "the MCP tool did not finish within {:.1}s (the server was told to cancel it)",
                timeout.as_secs_f64()
            ))),
            Err(e) => Err(self.call_failed(e, generation).await),
        }
    }

    async fn call_failed(&self, e: ServiceError, generation: u32) -> ToolError {
        match e {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                self.forget(generation).await;
                let stderr = self
                    .last_stderr
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|t| t.text())
                    .filter(|t| !t.is_empty())
                    .map(|t| format!("; its stderr ends: {}", last_line(&t)))
                    .unwrap_or_default();
                self.tool_error(format!(
                    "MCP server `{}` went away during the call (it crashed or closed the \
                     connection){stderr}; the outcome is unknown",
                    self.name()
                ))
            }
            ServiceError::McpError(e) if e.code.0 == crate::guard::UNREADABLE => {
                self.tool_error(format!(
                    "MCP server `{}` answered the call with a message toolloop cannot read: {}; \
                     the outcome is unknown",
                    self.name(),
                    e.message
                ))
            }
            ServiceError::McpError(e) => self.tool_error(format!(
                "MCP server `{}` refused the call: {} (code {})",
                self.name(),
                e.message,
                e.code.0
            )),
            other => self.tool_error(format!("MCP server `{}`: {other}", self.name())),
        }
    }

    /// Shuts the server down: sends the cancellation notices still pending, closes the
    /// connection, and (stdio) waits for the child to exit (killing it after a grace period).
    pub async fn shutdown(&self) {
        self.cancelling.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.cancelling.wait()).await;
        let old = self.conn.lock().await.take();
        if let Some(old) = old {
            close(old).await;
        }
        self.set_state(ServerState::Stopped);
    }
}

/// What a failed request says: an answer toolloop could not read says why.
fn service_error_text(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(e) if e.code.0 == crate::guard::UNREADABLE => {
            format!("its answer cannot be read: {}", e.message)
        }
        other => other.to_string(),
    }
}

/// Closes a connection (and waits for a child process to exit, up to a few seconds).
async fn close(mut conn: Conn) {
    let _ = conn.client.close_with_timeout(Duration::from_secs(8)).await;
    if let Some((_, reader)) = conn.stderr.take() {
        reader.abort();
    }
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

async fn read_stderr(
    stderr: Option<tokio::process::ChildStderr>,
    tail: Arc<StderrTail>,
    server: String,
    redactor: toolloop::redact::Redactor,
) {
    use tokio::io::AsyncBufReadExt;
    let Some(stderr) = stderr else { return };
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = redactor.redact(&line);
        tracing::debug!(server = %server, "stderr: {line}");
        tail.push(&line);
    }
}

/// Tells the server about a call whose caller stopped waiting (the future was dropped: the
/// run's deadline, say).
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: Option<rmcp::model::RequestId>,
    tracker: TaskTracker,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        let notice = CancelledNotificationParam::new(
            Some(id),
            Some("the caller stopped waiting (the run ended or timed out)".into()),
        );
        self.tracker.spawn_on(
            async move {
                let _ = peer.notify_cancelled(notice).await;
            },
            &runtime,
        );
    }
}

/// A child process server's connection: its stdin, and its stdout read through
/// [`crate::guard::forward`] (so that an answer rmcp cannot read fails its request instead of
/// leaving it waiting). Closing it closes the child's stdin and waits for the child to exit,
/// then sends SIGTERM, then kills it (as the MCP specification's stdio shutdown says); dropping
/// it kills the child.
struct ChildTransport {
    inner: rmcp::transport::async_rw::AsyncRwTransport<
        RoleClient,
        tokio::io::DuplexStream,
        tokio::process::ChildStdin,
    >,
    child: Option<tokio::process::Child>,
    forward: tokio::task::JoinHandle<()>,
}

/// How long a child is given to exit after its stdin closed, and again after SIGTERM.
const EXIT_GRACE: Duration = Duration::from_secs(3);

impl ChildTransport {
    fn spawn(
        mut cmd: tokio::process::Command,
    ) -> std::io::Result<(Self, Option<tokio::process::ChildStderr>)> {
        let mut child = cmd.spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other(
                "the child's stdin or stdout is missing",
            ));
        };
        let stderr = child.stderr.take();
        let (read, write) = tokio::io::duplex(64 * 1024);
        let forward = tokio::spawn(crate::guard::forward(stdout, write));
        let inner = rmcp::transport::async_rw::AsyncRwTransport::new_client(read, stdin)
            .with_max_line_length(crate::guard::MAX_MESSAGE_BYTES + 1024);
        Ok((
            ChildTransport {
                inner,
                child: Some(child),
                forward,
            },
            stderr,
        ))
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        self.forward.abort();
        // `kill_on_drop` kills a child still running; tokio reaps it.
    }
}

impl rmcp::transport::Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await?;
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if tokio::time::timeout(EXIT_GRACE, child.wait()).await.is_ok() {
            return Ok(());
        }
        #[cfg(unix)]
        if let Some(pid) = child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32))
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            if tokio::time::timeout(EXIT_GRACE, child.wait()).await.is_ok() {
                return Ok(());
            }
        }
        child.kill().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        JsonRpcMessage, ServerNotification, ServerResult, ToolListChangedNotification,
    };
    use rmcp::service::RxJsonRpcMessage;
    use rmcp::transport::Transport;

    /// A connection that hands out the messages it was given, in order.
    struct Given(VecDeque<RxJsonRpcMessage<RoleClient>>);

    impl Transport<RoleClient> for Given {
        type Error = std::io::Error;

        fn send(
            &mut self,
            _item: rmcp::service::TxJsonRpcMessage<RoleClient>,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            std::future::ready(Ok(()))
        }

        fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
            std::future::ready(self.0.pop_front())
        }

        fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_changed_tool_list_is_known_as_it_is_read_before_the_answer_after_it() {
        let changed = Arc::new(Staleness {
            stale: AtomicBool::new(false),
            version: AtomicU64::new(0),
        });
        let answer = || {
            JsonRpcMessage::response(
                ServerResult::empty(()),
                rmcp::model::NumberOrString::Number(1),
            )
        };
        let mut watched = Watched {
            inner: Given(VecDeque::from([
                answer(),
                JsonRpcMessage::notification(ServerNotification::ToolListChangedNotification(
                    ToolListChangedNotification::default(),
                )),
                answer(),
            ])),
            changed: changed.clone(),
        };
        // An answer changes nothing.
        assert!(watched.receive().await.is_some());
        assert!(!changed.stale.load(Ordering::SeqCst));
        // The notification marks the list stale as it is read, before anything after it.
        assert!(watched.receive().await.is_some());
        assert!(changed.stale.load(Ordering::SeqCst));
        assert_eq!(changed.version.load(Ordering::SeqCst), 1);
        assert!(watched.receive().await.is_some());
        assert_eq!(changed.version.load(Ordering::SeqCst), 1);
        assert!(watched.receive().await.is_none());
    }
}
