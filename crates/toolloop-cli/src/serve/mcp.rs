//! `toolloop serve --mcp [ADDR]`: the agents as MCP tools, on stdin and stdout or over
//! streamable HTTP (`http://ADDR/mcp`).
//!
//! Each workflow of `--workflow FILE` is a tool too: its inputs are the tool's arguments, its
//! result the last step's output (structured content when it is JSON).
//!
//! Each agent is a tool whose input is `{"task": "…"}` and whose result is the agent's answer:
//! its text, or, with an output schema, the validated JSON as structured content (the schema
//! is the tool's output schema). While it runs, a client that sent a progress token gets
//! `notifications/progress` for each round and each tool call; `notifications/cancelled` stops
//! the run (its transcript is kept in the store, as for any run). A call that needs a person's
//! approval is asked of the client with an elicitation when the client supports them (an
//! answer `{"approve": true}` runs it); otherwise the configured rules decide (denied, or with
//! --defer-approvals the run stops and waits).

use super::{Agents, HttpArgs, RunHooks};
use crate::CliError;
use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, Implementation, InputRequest, InputRequiredResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{ElicitationMode, Peer, RequestContext, RoleServer, ServiceExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use toolloop::Event;
use toolloop::approval::{Answer, PendingApproval};
use toolloop::outcome::StopReason;

/// The MCP server: the agents, one tool each.
#[derive(Clone)]
pub(crate) struct AgentServer {
    agents: Arc<Agents>,
    waiting: Waiting,
}

fn object(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(serde_json::Map::new()),
    }
}

impl AgentServer {
    pub(crate) fn new(agents: Arc<Agents>, waiting: Waiting) -> AgentServer {
        AgentServer { agents, waiting }
    }

    fn tools(&self) -> Vec<Tool> {
        let workflows = self.agents.workflows().iter().map(|w| {
            let mut properties = serde_json::Map::new();
            let mut required = Vec::new();
            for (name, input) in &w.workflow.inputs {
                let mut p = json!({"type": "string"});
                if let Some(d) = &input.description {
                    p["description"] = json!(d);
                }
                match &input.default {
                    Some(d) => p["default"] = json!(d),
                    None => required.push(json!(name)),
                }
                properties.insert(name.clone(), p);
            }
            let input = json!({"type": "object", "properties": properties, "required": required});
            let description = w
                .workflow
                .description
                .clone()
                .unwrap_or_else(|| format!("Runs the workflow {}.", w.workflow.name));
            Tool::new(w.workflow.name.clone(), description, object(input))
        });
        let agents = self.agents.all().iter().map(|a| {
            let input = json!({
                "type": "object",
                "properties": {"task": {
                    "type": "string",
                    "description": "What the agent should do, in plain words.",
                }},
                "required": ["task"],
            });
            let mut tool = Tool::new(a.name.clone(), a.description.clone(), object(input));
            if let Some(schema) = a.output_schema() {
                tool.output_schema = Some(object(schema.clone()));
            }
            tool
        });
        agents.chain(workflows).collect()
    }

    /// Runs the workflow `index` on the call's arguments (its inputs, as text).
    async fn call_workflow(
        &self,
        index: usize,
        args: serde_json::Map<String, Value>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let spec = &self.agents.workflows()[index];
        let _permit = match self.waiting.permit() {
            Ok(p) => p,
            Err(busy) => return Ok(*busy),
        };
        let mut inputs = std::collections::BTreeMap::new();
        for (k, v) in args {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            inputs.insert(k, text);
        }
        let mut settings = spec.args.clone();
        let mut runner = crate::workflow::runner(self.agents.cx(), &mut settings)
            .await
            .map_err(|_| {
                ErrorData::internal_error("the workflow's tools or models did not start", None)
            })?;
        let progress = context
            .meta
            .get_progress_token()
            .map(|token| Progress::start(context.peer.clone(), token));
        if let Some(progress) = progress.clone() {
            runner = runner.on_event(move |e| {
                let message = match e {
                    toolloop_workflow::WorkflowEvent::StepStarted { step, .. } => {
                        format!("step {step}")
                    }
                    toolloop_workflow::WorkflowEvent::StepEvent {
                        event: Event::ToolCallRequested { call, .. },
                        step,
                    } => format!("step {step}: calling {}", call.name),
                    _ => return,
                };
                progress.note(message);
            });
        }
        if let Some(store) = self.agents.store() {
            runner = runner
                .journal(store.run_journal(toolloop_store::RunTags::default()))
                .log(Arc::new(toolloop_workflow::StoreLog::new(store.clone())));
        }
        let meta = crate::durable::run_meta(&spec.args);
        let outcome = runner
            .run_tagged(&spec.workflow, &inputs, meta, context.ct.child_token())
            .await;
        if let Some(progress) = &progress {
            progress.flush().await;
        }
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                return Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                    ContentBlock::text(format!("the workflow did not run: {e}")),
                ])));
            }
        };
        let last = outcome
            .steps
            .iter()
            .rev()
            .find(|s| s.status == toolloop_workflow::StepStatus::Succeeded);
        let result = match last {
            Some(step) if outcome.success => match &step.output {
                Value::String(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
                other => {
                    let mut r =
                        CallToolResult::success(vec![ContentBlock::text(other.to_string())]);
                    r.structured_content = Some(other.clone());
                    r
                }
            },
            _ => CallToolResult::error(vec![ContentBlock::text(format!(
                "workflow run {}",
                crate::workflow::how_it_ended(&outcome)
            ))]),
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// `notifications/progress` for one call, sent in order by a task of their own, so that the
/// engine's (synchronous) event handler never waits on the client.
#[derive(Clone)]
struct Progress(tokio::sync::mpsc::UnboundedSender<ProgressMessage>);

/// What the progress task is given: a message to send, or a request to say when every message
/// before it has been handed to the transport.
enum ProgressMessage {
    Note(String),
    Flush(oneshot::Sender<()>),
}

impl Progress {
    /// Starts the task that sends the notifications for `token` to `peer`.
    fn start(peer: Peer<RoleServer>, token: rmcp::model::ProgressToken) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ProgressMessage>();
        tokio::spawn(async move {
            let mut n = 0.0;
            let mut gone = false;
            while let Some(message) = rx.recv().await {
                match message {
                    ProgressMessage::Note(message) if !gone => {
                        n += 1.0;
                        let mut p = ProgressNotificationParam::new(token.clone(), n);
                        p.message = Some(message);
                        gone = peer.notify_progress(p).await.is_err();
                    }
                    ProgressMessage::Note(_) => {}
                    ProgressMessage::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        Progress(tx)
    }

    /// Queues one notification.
    fn note(&self, message: String) {
        let _ = self.0.send(ProgressMessage::Note(message));
    }

    /// Waits (a few seconds at most) until every notification queued so far has been sent, so
    /// that none arrives after the call's result, when the client no longer listens for it.
    async fn flush(&self) {
        let (done, sent) = oneshot::channel();
        if self.0.send(ProgressMessage::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), sent).await;
        }
    }

    /// The engine's event handler for an agent's run: one note per round and per tool call.
    fn handler(&self) -> toolloop::agent::EventHandler {
        let progress = self.clone();
        Arc::new(move |e: &Event| {
            let message = match e {
                Event::RoundStarted { round, .. } => format!("round {round}"),
                Event::ToolCallRequested { round, call } => {
                    format!("round {round}: calling {}", call.name)
                }
                Event::ToolFinished { name, success, .. } => {
                    format!("{name} {}", if *success { "succeeded" } else { "failed" })
                }
                _ => return,
            };
            progress.note(message);
        })
    }
}

/// Asks the client about a call with an elicitation request (sessions before protocol
/// 2026-07-28); `None` when it cannot be asked.
async fn elicit(peer: &Peer<RoleServer>, p: &PendingApproval) -> Option<Answer> {
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        return None;
    }
    let answer = peer.create_elicitation(approval_question(p)?).await.ok()?;
    Some(decision(approved(&answer)))
}

impl ServerHandler for AgentServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("toolloop", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if let Some(index) = self
            .agents
            .workflows()
            .iter()
            .position(|w| w.workflow.name == name)
        {
            return self
                .call_workflow(index, request.arguments.unwrap_or_default(), context)
                .await;
        }
        // A retry carrying the answer to a question the run asked (protocol 2026-07-28 on).
        if let Some(state) = &request.request_state {
            let Some(mut waiting) = self.waiting.take(state) else {
                return Err(ErrorData::invalid_params(
                    "`requestState` names no run waiting for an answer (it ended, or waited \
                     too long)",
                    None,
                ));
            };
            let approved = request
                .input_responses
                .as_ref()
                .and_then(|r| r.get(APPROVAL_KEY))
                .and_then(|v| serde_json::from_value::<rmcp::model::ElicitResult>(v.clone()).ok())
                .map(|r| approved(&r))
                .unwrap_or(false);
            if let Some(answer) = waiting.answer.take() {
                let _ = answer.send(decision(approved));
            }
            return self.drive(waiting, &context).await;
        }
        let Some(index) = self.agents.all().iter().position(|a| a.name == name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "no tool `{}`: tools/list lists the agents",
                    toolloop::result::shorten(&name, 80)
                ),
                None,
            ));
        };
        let spec = &self.agents.all()[index];
        let permit = match self.waiting.permit() {
            Ok(p) => p,
            Err(busy) => return Ok(*busy),
        };
        let args = request.arguments.unwrap_or_default();
        let task = match args.get("task") {
            Some(Value::String(t)) if !t.trim().is_empty() => t.clone(),
            _ => {
                return Err(ErrorData::invalid_params(
                    "`task` is required: what the agent should do, as text",
                    None,
                ));
            }
        };
        let peer = context.peer.clone();
        let progress = context
            .meta
            .get_progress_token()
            .map(|token| Progress::start(peer.clone(), token));
        let on_event = progress.as_ref().map(Progress::handler);
        // Protocol 2026-07-28 on, the server asks nothing of the client itself: a question is
        // the call's result (`input_required`), and the client calls again with the answer.
        let modern = context
            .meta
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let modern_elicits = modern
            && context
                .meta
                .client_capabilities()
                .is_some_and(|c| c.elicitation.is_some());
        let (asks_tx, asks) = mpsc::unbounded_channel::<Ask>();
        let on_approval: toolloop::agent::OnApproval = Arc::new(move |p: &PendingApproval| {
            let peer = peer.clone();
            let p = p.clone();
            let asks_tx = asks_tx.clone();
            Box::pin(async move {
                if modern_elicits {
                    let (tx, rx) = oneshot::channel();
                    if asks_tx.send((p, tx)).is_ok()
                        && let Ok(answer) = rx.await
                    {
                        return answer;
                    }
                    return decision(false);
                }
                match elicit(&peer, &p).await {
                    Some(answer) => answer,
                    None => Answer::Deny {
                        reason: Some(
                            "this call needs a person's approval, and the MCP client cannot \
                             be asked"
                                .into(),
                        ),
                    },
                }
            })
        });
        let hooks = RunHooks {
            stream: false,
            on_event,
            on_approval: (!spec.defers_approvals()).then_some(on_approval),
        };
        let agent = spec
            .build(hooks)
            .map_err(|e| ErrorData::internal_error(e, None))?;
        let cancel = self.waiting.2.child_token();
        let run = {
            let agents = self.agents.clone();
            let cancel = cancel.clone();
            self.waiting.1.spawn(async move {
                let _permit = permit;
                let spec = &agents.all()[index];
                let run_id = spec.run_id(&super::Client::default(), None);
                super::run_keyed(
                    &agent,
                    agents.store(),
                    vec![toolloop::Message::user(task)],
                    run_id,
                    cancel,
                )
                .await
            })
        };
        let waiting = WaitingRun {
            run,
            asks,
            answer: None,
            cancel,
            progress,
        };
        self.drive(waiting, &context).await
    }
}

/// The key of the approval question in an `input_required` result.
const APPROVAL_KEY: &str = "approval";

/// How long a run waits for the answer to its question before it is cancelled.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// A question of a run (a call to approve) and where its answer goes.
type Ask = (PendingApproval, oneshot::Sender<Answer>);

/// A run in progress for a `tools/call`, possibly waiting for an answer from the client.
struct WaitingRun {
    run: tokio::task::JoinHandle<Result<toolloop::Outcome, super::RunError>>,
    asks: mpsc::UnboundedReceiver<Ask>,
    /// The call's progress notifications, sent before its result.
    progress: Option<Progress>,
    answer: Option<oneshot::Sender<Answer>>,
    cancel: CancellationToken,
}

/// The server's runs: those in progress (so that the server waits for them to save their
/// outcome before it exits), and those that asked the client something and wait for it to
/// call again, by request state (an opaque random handle: the client echoes it, nothing is
/// read from it).
#[derive(Clone)]
pub(crate) struct Waiting(
    Arc<std::sync::Mutex<std::collections::HashMap<String, WaitingRun>>>,
    tokio_util::task::TaskTracker,
    /// The parent of every run's cancellation token.
    CancellationToken,
    /// The runs at once (`--max-runs`), for every session: a run holds a permit to its end,
    /// through any wait for the client's answer.
    Arc<tokio::sync::Semaphore>,
    /// That limit.
    u32,
);

impl Waiting {
    /// No runs yet; at most `max_runs` at once.
    pub(crate) fn new(max_runs: u32) -> Waiting {
        Waiting(
            Arc::default(),
            tokio_util::task::TaskTracker::new(),
            CancellationToken::new(),
            Arc::new(tokio::sync::Semaphore::new(max_runs as usize)),
            max_runs,
        )
    }

    /// A permit for one more run, or the tool error that says the server is full (at once:
    /// a call over the limit never waits).
    fn permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Box<CallToolResponse>> {
        self.3.clone().try_acquire_owned().map_err(|_| {
            let mut r = CallToolResult::error(vec![ContentBlock::text(format!(
                "the server is busy: it runs at most {} agents or workflows at once \
                 (--max-runs), and that many are running; try again shortly",
                self.4
            ))]);
            r.structured_content = Some(json!({"error": "server_busy"}));
            Box::new(CallToolResponse::Complete(r))
        })
    }

    fn take(&self, state: &str) -> Option<WaitingRun> {
        self.0.lock().ok()?.remove(state)
    }

    /// Cancels every run (their clients are gone), then waits (at most `grace`) for them to
    /// end and save their outcome.
    async fn close(&self, grace: std::time::Duration) {
        self.2.cancel();
        if let Ok(mut m) = self.0.lock() {
            m.clear();
        }
        self.1.close();
        let _ = tokio::time::timeout(grace, self.1.wait()).await;
    }

    /// Keeps `run` under a fresh handle, for at most [`ANSWER_WAIT`] (then it is cancelled).
    fn keep(&self, run: WaitingRun) -> String {
        let state = toolloop::journal::new_run_id().replacen("run_", "ask_", 1);
        if let Ok(mut map) = self.0.lock() {
            map.insert(state.clone(), run);
        }
        let this = self.clone();
        let key = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ANSWER_WAIT).await;
            if let Some(run) = this.take(&key) {
                run.cancel.cancel();
            }
        });
        state
    }
}

fn approved(r: &rmcp::model::ElicitResult) -> bool {
    r.action == ElicitationAction::Accept
        && r.content
            .as_ref()
            .and_then(|c| c.get("approve"))
            .and_then(Value::as_bool)
            == Some(true)
}

fn decision(approved: bool) -> Answer {
    if approved {
        Answer::Approve
    } else {
        Answer::Deny {
            reason: Some("the user said no".into()),
        }
    }
}

/// The elicitation that asks about `p`.
fn approval_question(p: &PendingApproval) -> Option<ElicitRequestParams> {
    let schema: ElicitationSchema = ElicitationSchema::builder()
        .required_bool("approve")
        .build()
        .ok()?;
    Some(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!(
            "The agent wants to call {} on: {}\nApprove this call?",
            p.call.name,
            toolloop::result::shorten(&p.subject, 500)
        ),
        requested_schema: schema,
    })
}

impl AgentServer {
    /// Waits for the run's end, or its next question (returned as `input_required`, the run
    /// kept until the client calls again with the answer). `notifications/cancelled` for the
    /// request stops the run, its transcript kept in the store.
    async fn drive(
        &self,
        mut waiting: WaitingRun,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // A request given up (the client gone, the session closed) stops its run.
        let guard = waiting.cancel.clone().drop_guard();
        let mut cancelled = false;
        loop {
            tokio::select! {
                outcome = &mut waiting.run => {
                    guard.disarm();
                    let outcome = outcome
                        .map_err(|e| ErrorData::internal_error(format!("the run failed: {e}"), None))?
                        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                    if let Some(progress) = &waiting.progress {
                        progress.flush().await;
                    }
                    return Ok(CallToolResponse::Complete(call_result(&outcome)));
                }
                Some((p, answer)) = waiting.asks.recv() => {
                    let Some(question) = approval_question(&p) else {
                        let _ = answer.send(decision(false));
                        continue;
                    };
                    waiting.answer = Some(answer);
                    guard.disarm();
                    let state = self.waiting.keep(waiting);
                    let mut requests = rmcp::model::InputRequests::new();
                    requests.insert(
                        APPROVAL_KEY.to_string(),
                        InputRequest::Elicitation(rmcp::model::ElicitRequest::new(question)),
                    );
                    return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
                        Some(requests),
                        Some(state),
                    )));
                }
                _ = context.ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    waiting.cancel.cancel();
                }
            }
        }
    }
}

/// A run's outcome as the call's result.
fn call_result(outcome: &toolloop::Outcome) -> CallToolResult {
    let run_id = outcome.run_id.clone().unwrap_or_default();
    match outcome.stop_reason {
        StopReason::Answered => {
            let text = match &outcome.output {
                Some(v) => v.to_string(),
                None => outcome.text.clone().unwrap_or_default(),
            };
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            if let Some(output) = &outcome.output {
                r.structured_content = Some(output.clone());
            }
            r
        }
        StopReason::AwaitingApproval => CallToolResult::error(vec![ContentBlock::text(format!(
            "the run {run_id} waits for approval of calls: decide with `toolloop \
             approve|deny {run_id}`, then `toolloop resume {run_id}`"
        ))]),
        other => {
            let reason = serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let why = outcome
                .error
                .as_ref()
                .map(|e| format!(": {}", e.message))
                .unwrap_or_default();
            let mut text = format!("the run {run_id} stopped ({reason}){why}");
            if let Some(partial) = &outcome.text {
                text.push_str("\n\n");
                text.push_str(partial);
            }
            CallToolResult::error(vec![ContentBlock::text(text)])
        }
    }
}

/// Counts the sessions of the HTTP server, for the log.
static SESSIONS: AtomicU64 = AtomicU64::new(0);

/// Serves the agents on stdin and stdout until the client goes away (or SIGTERM); then the
/// runs in progress are cancelled and get `grace` to save their outcome.
pub(crate) async fn serve_stdio(
    agents: Arc<Agents>,
    http: &HttpArgs,
) -> Result<ExitCode, CliError> {
    eprintln!("toolloop: serving the agents over MCP on stdin and stdout");
    let runs = Waiting::new(http.max_runs);
    let service = AgentServer::new(agents, runs.clone())
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
        .map_err(|e| CliError::failure("--mcp: the client did not start a session", e))?;
    let stop = service.cancellation_token();
    tokio::select! {
        _ = service.waiting() => {}
        _ = super::shutdown_signal() => stop.cancel(),
    }
    runs.close(http.grace).await;
    Ok(ExitCode::SUCCESS)
}

/// Serves the agents over streamable HTTP at `http://ADDR/mcp` until SIGTERM or Ctrl-C.
pub(crate) async fn serve_http(
    addr: SocketAddr,
    agents: Arc<Agents>,
    http: HttpArgs,
    tokens: Vec<String>,
) -> Result<ExitCode, CliError> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let stop = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::io(format!("--mcp {addr}: cannot listen"), e))?;
    let local = listener.local_addr().unwrap_or(addr);
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop.child_token())
        .with_max_request_body_bytes(usize::try_from(http.max_body).unwrap_or(usize::MAX));
    if !addr.ip().is_loopback() {
        // Beyond loopback the token guards the endpoint; the Host check (against DNS
        // rebinding of a local server) would refuse the names clients reach it by.
        config = config.disable_allowed_hosts();
    }
    // One set of waiting runs for every session (a stateless request has a server of its own).
    let waiting = Waiting::new(http.max_runs);
    let runs = waiting.clone();
    let service = StreamableHttpService::new(
        move || {
            SESSIONS.fetch_add(1, Ordering::Relaxed);
            Ok(AgentServer::new(agents.clone(), runs.clone()))
        },
        LocalSessionManager::default().into(),
        config,
    );
    let app = super::openai::with_token(axum::Router::new().nest_service("/mcp", service), &tokens);
    eprintln!("toolloop: serving the agents over MCP on http://{local}/mcp");
    let server = super::serve_until_signal(listener, app, &stop).await;
    let _ = tokio::time::timeout(http.grace, server).await;
    waiting.close(http.grace).await;
    Ok(ExitCode::SUCCESS)
}
