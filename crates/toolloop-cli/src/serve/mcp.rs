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
use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, Implementation, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{ElicitationMode, Peer, RequestContext, RoleServer, ServiceExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;
use toolloop::Event;
use toolloop::approval::{Answer, PendingApproval};
use toolloop::outcome::StopReason;

/// The MCP server: the agents, one tool each.
#[derive(Clone)]
pub(crate) struct AgentServer {
    agents: Arc<Agents>,
}

fn object(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(serde_json::Map::new()),
    }
}

impl AgentServer {
    pub(crate) fn new(agents: Arc<Agents>) -> AgentServer {
        AgentServer { agents }
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
        let mut inputs = std::collections::BTreeMap::new();
        for (k, v) in args {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            inputs.insert(k, text);
        }
        let mut settings = spec.args.clone();
        let mut runner = crate::workflow::runner(&mut settings).await.map_err(|_| {
            ErrorData::internal_error("the workflow's tools or models did not start", None)
        })?;
        if let Some(token) = context.meta.get_progress_token() {
            let peer = context.peer.clone();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
            tokio::spawn(async move {
                let mut n = 0.0;
                while let Some(message) = rx.recv().await {
                    n += 1.0;
                    let mut p = ProgressNotificationParam::new(token.clone(), n);
                    p.message = Some(message);
                    if peer.notify_progress(p).await.is_err() {
                        break;
                    }
                }
            });
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
                let _ = tx.send(message);
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
                "workflow run {} {}{}",
                outcome.workflow_id,
                outcome.status.as_str(),
                outcome
                    .failed_step
                    .as_ref()
                    .map(|s| format!(" at step {s}"))
                    .unwrap_or_default()
            ))]),
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Sends `notifications/progress` for a run's rounds and tool calls, in order, from the
/// engine's (synchronous) event handler.
fn progress_handler(
    peer: Peer<RoleServer>,
    token: rmcp::model::ProgressToken,
) -> toolloop::agent::EventHandler {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut n = 0.0;
        while let Some(message) = rx.recv().await {
            n += 1.0;
            let mut p = ProgressNotificationParam::new(token.clone(), n);
            p.message = Some(message);
            if peer.notify_progress(p).await.is_err() {
                break;
            }
        }
    });
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
        let _ = tx.send(message);
    })
}

/// Asks the client about a call with an elicitation; `None` when it cannot be asked.
async fn elicit(peer: &Peer<RoleServer>, p: &PendingApproval) -> Option<Answer> {
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        return None;
    }
    let schema: ElicitationSchema = ElicitationSchema::builder()
        .required_bool("approve")
        .build()
        .ok()?;
    let message = format!(
        "The agent wants to call {} on: {}\nApprove this call?",
        p.call.name,
        toolloop::result::shorten(&p.subject, 500)
    );
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    let answer = peer.create_elicitation(params).await.ok()?;
    let approved = answer.action == ElicitationAction::Accept
        && answer
            .content
            .as_ref()
            .and_then(|c| c.get("approve"))
            .and_then(Value::as_bool)
            == Some(true);
    Some(if approved {
        Answer::Approve
    } else {
        Answer::Deny {
            reason: Some("the user said no".into()),
        }
    })
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
        let Some(spec) = self.agents.all().iter().find(|a| a.name == name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "no tool `{}`: tools/list lists the agents",
                    toolloop::result::shorten(&name, 80)
                ),
                None,
            ));
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
        let on_event = context
            .meta
            .get_progress_token()
            .map(|token| progress_handler(peer.clone(), token));
        let defer = spec.defers_approvals();
        let on_approval: toolloop::agent::OnApproval = Arc::new(move |p: &PendingApproval| {
            let peer = peer.clone();
            let p = p.clone();
            Box::pin(async move {
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
            on_approval: (!defer).then_some(on_approval),
        };
        let agent = spec
            .build(hooks)
            .map_err(|e| ErrorData::internal_error(e, None))?;
        // `notifications/cancelled` cancels the request's token: the run stops, its transcript
        // kept in the store.
        let cancel: CancellationToken = context.ct.child_token();
        let outcome = spec
            .run(
                &agent,
                self.agents.store(),
                vec![toolloop::Message::user(task)],
                None,
                cancel,
            )
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let run_id = outcome.run_id.clone().unwrap_or_default();
        let result = match outcome.stop_reason {
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
            StopReason::AwaitingApproval => {
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "the run {run_id} waits for approval of calls: decide with `toolloop \
                     approve|deny {run_id}`, then `toolloop resume {run_id}`"
                ))])
            }
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
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Counts the sessions of the HTTP server, for the log.
static SESSIONS: AtomicU64 = AtomicU64::new(0);

/// Serves the agents on stdin and stdout until the client goes away (or SIGTERM).
pub(crate) async fn serve_stdio(agents: Arc<Agents>) -> ExitCode {
    eprintln!("toolloop: serving the agents over MCP on stdin and stdout");
    let service = match AgentServer::new(agents)
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("toolloop: --mcp: the client did not start a session: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = service.waiting() => {}
        _ = super::shutdown_signal() => {}
    }
    ExitCode::SUCCESS
}

/// Serves the agents over streamable HTTP at `http://ADDR/mcp` until SIGTERM or Ctrl-C.
pub(crate) async fn serve_http(
    addr: SocketAddr,
    agents: Arc<Agents>,
    http: HttpArgs,
    token: Option<String>,
) -> ExitCode {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let stop = CancellationToken::new();
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("toolloop: --mcp {addr}: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = listener.local_addr().unwrap_or(addr);
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop.child_token())
        .with_max_request_body_bytes(usize::try_from(http.max_body).unwrap_or(usize::MAX));
    if !addr.ip().is_loopback() {
        // Beyond loopback the token guards the endpoint; the Host check (against DNS
        // rebinding of a local server) would refuse the names clients reach it by.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || {
            SESSIONS.fetch_add(1, Ordering::Relaxed);
            Ok(AgentServer::new(agents.clone()))
        },
        LocalSessionManager::default().into(),
        config,
    );
    let app = super::openai::with_token(
        axum::Router::new().nest_service("/mcp", service),
        token.as_deref(),
    );
    eprintln!("toolloop: serving the agents over MCP on http://{local}/mcp");
    let server = {
        let stop = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        })
    };
    super::shutdown_signal().await;
    stop.cancel();
    let _ = tokio::time::timeout(http.grace, server).await;
    ExitCode::SUCCESS
}
