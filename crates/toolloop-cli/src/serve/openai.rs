//! `toolloop serve --openai ADDR`: an OpenAI-compatible API.
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/models` | the agents (`agent:NAME`) and the gateway (`gateway:SPEC`) |
//! | `POST /v1/chat/completions` | `agent:NAME`: a run of the agent on the conversation; `gateway:SPEC`: one reply of SPEC with the request's tools offered through prompt-based calling |
//! | `POST /v1/responses` | `agent:NAME` with `input` (text or items), continuing a stored answer with `previous_response_id`; `gateway:SPEC` with the request's `tools`, answered with `function_call` items |
//! | `GET /v1/runs/{id}` | where a run stands, and the calls waiting for approval |
//!
//! Every route checks the token first (when there is one): a request without the right one
//! gets 401 and nothing runs. A body larger than `--max-body` gets 413; a request beyond
//! `--max-runs` at once gets 429. Each request (an agent's, the gateway's) is a run logged in
//! the store; an `Idempotency-Key` header ties a retried request to the run the first one
//! started. With several tokens, each client sees only its own runs and keys ([`Client`]).

use super::gateway::{self, Gateway};
use super::wire::{self, BadRequest, ChatRequest};
use super::{Agents, Client, HttpArgs, RunError, RunHooks};
use crate::CliError;
use crate::args::ProviderArgs;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};
use sha2::Digest;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolloop::Event;
use toolloop::model::ToolChoice;
use toolloop::outcome::{Outcome, StopReason};

/// The server's state, shared by every request.
pub(crate) struct App {
    agents: Arc<Agents>,
    gateway: Gateway,
    runs: Arc<Semaphore>,
    max_runs: u32,
    keep_on_disconnect: bool,
    tracker: TaskTracker,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(bytes).into()
}

/// An OpenAI-style error body.
fn error(
    status: StatusCode,
    kind: &str,
    code: Option<&str>,
    message: impl Into<String>,
) -> Response {
    let body = json!({"error": {
        "message": message.into(),
        "type": kind,
        "param": null,
        "code": code,
    }});
    (status, axum::Json(body)).into_response()
}

fn bad_request(e: BadRequest) -> Response {
    let body = json!({"error": {
        "message": e.message,
        "type": "invalid_request_error",
        "param": e.param,
        "code": null,
    }});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// The tokens a server accepts: their SHA-256 digests (compared in constant time, whatever
/// their length). With several, each request is told which client it comes from
/// ([`Client`], a request extension).
struct Guard(Vec<[u8; 32]>);

/// `router` behind the token check (none without tokens): a request without
/// `Authorization: Bearer TOKEN` (one of `tokens`) gets 401 before anything else is done.
pub(crate) fn with_token(router: Router, tokens: &[String]) -> Router {
    let guard = Arc::new(Guard(tokens.iter().map(|t| digest(t.as_bytes())).collect()));
    router.layer(middleware::from_fn_with_state(guard, authorize))
}

/// The router of the API around `app`, with its limits, behind `tokens`.
pub(crate) fn router(app: Arc<App>, max_body: usize, tokens: &[String]) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route("/v1/runs/{id}", get(run_status))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("not_found"),
                "no such route: this server answers /v1/models, /v1/chat/completions, \
                 /v1/responses and /v1/runs/{id}",
            )
        })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app);
    with_token(api, tokens)
}

/// Runs the API on `addr` until SIGTERM or Ctrl-C; then stops accepting, lets the runs in
/// progress finish within the grace period, and leaves the rest in the store, resumable.
pub(crate) async fn serve(
    addr: SocketAddr,
    agents: Arc<Agents>,
    provider: ProviderArgs,
    http: HttpArgs,
    tokens: Vec<String>,
) -> Result<ExitCode, CliError> {
    let app = Arc::new(App {
        gateway: Gateway::new(agents.cx().clone(), provider),
        agents,
        runs: Arc::new(Semaphore::new(http.max_runs as usize)),
        max_runs: http.max_runs,
        keep_on_disconnect: http.keep_on_disconnect,
        tracker: TaskTracker::new(),
    });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::io(format!("--openai {addr}: cannot listen"), e))?;
    let local = listener.local_addr().unwrap_or(addr);
    eprintln!("toolloop: serving the OpenAI API on http://{local}/v1");
    let max_body = usize::try_from(http.max_body).unwrap_or(usize::MAX);
    let stop = CancellationToken::new();
    let router = router(app.clone(), max_body, &tokens);
    let server = super::serve_until_signal(listener, router, &stop).await;
    app.tracker.close();
    let running = app.tracker.len();
    if running > 0 {
        eprintln!(
            "toolloop: stopping: no new requests; {running} run(s) in progress get {} to finish",
            humantime::format_duration(http.grace)
        );
    }
    tokio::select! {
        _ = app.tracker.wait() => {}
        _ = tokio::time::sleep(http.grace) => {
            eprintln!(
                "toolloop: {} run(s) still going are left in the store: resume them with \
                 `toolloop resume RUN_ID`, or retry with the same Idempotency-Key",
                app.tracker.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    // The connections close once their answers are written.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
    Ok(ExitCode::SUCCESS)
}

/// The token check, before anything else: 401 without the right `Authorization: Bearer …`.
/// The request then carries its [`Client`].
async fn authorize(State(guard): State<Arc<Guard>>, mut request: Request, next: Next) -> Response {
    let mut client = Client::default();
    if !guard.0.is_empty() {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let given = digest(given.trim().as_bytes());
        // Every token is compared (no early exit): the time does not tell which one matched.
        let mut matched: Option<&[u8; 32]> = None;
        for expected in &guard.0 {
            if bool::from(given.ct_eq(expected)) {
                matched = Some(expected);
            }
        }
        let Some(expected) = matched else {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_api_key"),
                "missing or wrong token: send the server's --auth-token as the API key \
                 (Authorization: Bearer TOKEN)",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        };
        if guard.0.len() > 1 {
            client = Client::from_token_digest(expected);
        }
    }
    request.extensions_mut().insert(client);
    next.run(request).await
}

async fn models(State(app): State<Arc<App>>) -> Response {
    let created = wire::now_secs();
    let mut data: Vec<Value> = app
        .agents
        .all()
        .iter()
        .map(|a| json!({"id": format!("agent:{}", a.name), "object": "model", "created": created, "owned_by": "toolloop"}))
        .collect();
    data.push(json!({"id": "gateway:SPEC", "object": "model", "created": created, "owned_by": "toolloop"}));
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// What the `model` field names.
enum Target<'a> {
    Agent(&'a str),
    Gateway(&'a str),
}

fn target(model: &str) -> Option<Target<'_>> {
    if let Some(name) = model.strip_prefix("agent:") {
        return Some(Target::Agent(name));
    }
    if model == "agent" {
        return Some(Target::Agent("default"));
    }
    model.strip_prefix("gateway:").map(Target::Gateway)
}

fn unknown_model(model: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("model_not_found"),
        format!(
            "model `{}`: expected agent:NAME (GET /v1/models lists them) or gateway:SPEC",
            toolloop::result::shorten(model, 80)
        ),
    )
}

/// A permit for one more run, or 429.
fn permit(app: &App) -> Result<OwnedSemaphorePermit, Box<Response>> {
    app.runs.clone().try_acquire_owned().map_err(|_| {
        let mut r = error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some("server_busy"),
            format!(
                "the server runs {} requests at once (--max-runs); try again shortly",
                app.max_runs
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        Box::new(r)
    })
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Box<Response>> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(k) if !k.trim().is_empty() && k.len() <= 256 => Ok(Some(k.trim().to_string())),
            _ => Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                "Idempotency-Key: expected 1 to 256 visible ASCII characters",
            ))),
        },
    }
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match ChatRequest::parse(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    match target(&request.model) {
        Some(Target::Agent(name)) => {
            let name = name.to_string();
            agent_chat(app, &name, request, &headers, &client, Format::Chat).await
        }
        Some(Target::Gateway(spec)) => {
            let spec = spec.to_string();
            gateway_chat(app, &spec, request, &headers, &client, Format::Chat).await
        }
        None => unknown_model(&request.model),
    }
}

/// A gateway request: a run of the engine with the client's tools (see [`gateway`]), logged in
/// the store like an agent's, its `Idempotency-Key` honoured the same way.
async fn gateway_chat(
    app: Arc<App>,
    spec: &str,
    request: ChatRequest,
    headers: &HeaderMap,
    client: &Client,
    format: Format,
) -> Response {
    let backend = match app.gateway.backend(spec) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("model_not_found"),
                format!("model `gateway:{spec}`: {e}"),
            );
        }
    };
    let key = match idempotency_key(headers) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let journal = app
        .agents
        .store()
        .map(|s| s.run_journal(toolloop_store::RunTags::default()));
    let agent = match gateway::agent(backend, &request, journal) {
        Ok(a) => a,
        Err(e) => {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", None, e);
        }
    };
    let permit = match permit(&app) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let cancel = CancellationToken::new();
    let run_id = client.run_id(&format!("gateway:{spec}"), key.as_deref());
    let run = {
        let agents = app.agents.clone();
        let cancel = cancel.clone();
        let run_id = run_id.clone();
        let messages = request.messages.clone();
        app.tracker.spawn(async move {
            let _permit = permit;
            super::run_keyed(&agent, agents.store(), messages, run_id, cancel).await
        })
    };
    let guard = (!app.keep_on_disconnect).then(|| cancel.drop_guard());
    let id = match format {
        Format::Chat => format!("chatcmpl-{}", &toolloop::journal::new_run_id()[4..]),
        Format::Responses => response_id(run_id.as_str()),
    };
    let model = request.model;
    let reply = |outcome: Result<Result<Outcome, RunError>, tokio::task::JoinError>| match outcome {
        Ok(Ok(o)) => match gateway::answer(&o) {
            Ok(a) => Ok((a, run_info(&o))),
            Err(f) => Err((f, Some(run_info(&o)))),
        },
        Ok(Err(RunError::Busy(m))) => Err((
            gateway::Failure {
                status: 409,
                code: "run_in_progress",
                message: m,
            },
            None,
        )),
        Ok(Err(RunError::Failed(m))) => Err((
            gateway::Failure {
                status: 500,
                code: "run_failed",
                message: m,
            },
            None,
        )),
        Err(e) => Err((
            gateway::Failure {
                status: 500,
                code: "run_failed",
                message: format!("the run failed: {e}"),
            },
            None,
        )),
    };
    if !request.stream {
        let outcome = run.await;
        drop(guard);
        return match reply(outcome) {
            Ok((a, info)) => {
                let mut v = match format {
                    Format::Chat => gateway::completion(&id, &model, &a),
                    Format::Responses => gateway_response(&id, &model, &a),
                };
                v["toolloop"] = info;
                axum::Json(v).into_response()
            }
            Err((f, info)) => {
                let status = StatusCode::from_u16(f.status).unwrap_or(StatusCode::BAD_GATEWAY);
                let mut body = json!({"error": {
                    "message": f.message,
                    "type": if status == StatusCode::CONFLICT { "invalid_request_error" } else { "server_error" },
                    "param": null,
                    "code": f.code,
                }});
                if let Some(info) = info {
                    body["toolloop"] = info;
                }
                (status, axum::Json(body)).into_response()
            }
        };
    }
    // Streamed: the first chunk at once, the rest when the backend's reply is whole and known
    // good (a broken call sent back to the backend must never reach the client).
    let include_usage = request.include_usage;
    let first = match format {
        Format::Chat => wire::sse(&wire::chunk(
            &id,
            &model,
            json!({"role": "assistant", "content": ""}),
            None,
        )),
        Format::Responses => responses_event(
            &mut 0,
            "response.created",
            json!({"response": {"id": id, "object": "response", "status": "in_progress", "model": model, "output": []}}),
        ),
    };
    let rest = async move {
        let outcome = run.await;
        drop(guard);
        match (reply(outcome), format) {
            (Ok((a, _)), Format::Chat) => gateway::chunks(&id, &model, &a, include_usage),
            (Ok((a, info)), Format::Responses) => gateway_response_events(&id, &model, &a, info),
            (Err((f, _)), Format::Chat) => wire::sse(&json!({"error": {
                "message": f.message,
                "type": "server_error",
                "code": f.code,
            }})),
            (Err((f, _)), Format::Responses) => responses_event(
                &mut 1,
                "error",
                json!({"code": f.code, "message": f.message, "param": null}),
            ),
        }
    };
    let body = futures::stream::once(async move { first })
        .chain(futures::stream::once(rest))
        .map(Ok::<_, std::convert::Infallible>);
    sse_response(Body::from_stream(body))
}

/// A gateway answer as a Responses API `response`: the text as a message item, each call as a
/// `function_call` item.
fn gateway_response(id: &str, model: &str, a: &gateway::Answer) -> Value {
    let usage = a.usage.unwrap_or_default();
    let mut output = Vec::new();
    if let Some(text) = a.text.as_deref().filter(|t| !t.trim().is_empty()) {
        output.push(json!({
            "type": "message",
            "id": format!("msg_{id}"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }));
    }
    for call in &a.calls {
        output.push(json!({
            "type": "function_call",
            "id": format!("fc_{}", call.id),
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments.to_string(),
            "status": "completed",
        }));
    }
    json!({
        "id": id,
        "object": "response",
        "created_at": wire::now_secs(),
        "status": if a.finish == "length" { "incomplete" } else { "completed" },
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    })
}

/// A streamed gateway answer's events after `response.created`: each output item added, its
/// text or arguments, done; then `response.completed` with the whole response.
fn gateway_response_events(id: &str, model: &str, a: &gateway::Answer, info: Value) -> Bytes {
    let mut response = gateway_response(id, model, a);
    response["toolloop"] = info;
    let mut seq = 1;
    let mut out = Vec::new();
    let items = response["output"].as_array().cloned().unwrap_or_default();
    for (index, item) in items.iter().enumerate() {
        let mut added = item.clone();
        let item_id = item["id"].clone();
        match item["type"].as_str() {
            Some("message") => {
                added["content"] = json!([]);
                added["status"] = json!("in_progress");
                out.extend_from_slice(&responses_event(
                    &mut seq,
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
                let text = item["content"][0]["text"].clone();
                out.extend_from_slice(&responses_event(
                    &mut seq,
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": text}),
                ));
                out.extend_from_slice(&responses_event(
                    &mut seq,
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                ));
            }
            _ => {
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                out.extend_from_slice(&responses_event(
                    &mut seq,
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
                out.extend_from_slice(&responses_event(
                    &mut seq,
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": index, "delta": item["arguments"]}),
                ));
                out.extend_from_slice(&responses_event(
                    &mut seq,
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "arguments": item["arguments"]}),
                ));
            }
        }
        out.extend_from_slice(&responses_event(
            &mut seq,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }
    out.extend_from_slice(&responses_event(
        &mut seq,
        "response.completed",
        json!({"response": response}),
    ));
    Bytes::from(out)
}

fn sse_response(body: Body) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Which API a run answers in.
#[derive(Clone, Copy, PartialEq)]
enum Format {
    Chat,
    Responses,
}

/// Starts a run of agent `name` on `request`'s conversation, and answers in `format`, whole or
/// streamed.
async fn agent_chat(
    app: Arc<App>,
    name: &str,
    request: ChatRequest,
    headers: &HeaderMap,
    client: &Client,
    format: Format,
) -> Response {
    let Some(index) = app.agents.all().iter().position(|a| a.name == name) else {
        return unknown_model(&request.model);
    };
    if !request.tools.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            format!("`tools`: agent:{name} runs its own tools; offer yours through gateway:SPEC"),
        );
    }
    if !request
        .messages
        .iter()
        .any(|m| matches!(m, toolloop::Message::User { .. }))
    {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            "`messages` holds no user message: nothing to do",
        );
    }
    let key = match idempotency_key(headers) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let permit = match permit(&app) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let hooks = RunHooks {
        stream: request.stream,
        on_event: request.stream.then(|| {
            let tx = tx.clone();
            Arc::new(move |e: &Event| {
                if matches!(
                    e,
                    Event::TextDelta { .. }
                        | Event::ToolCallRequested { .. }
                        | Event::RoundStarted { .. }
                        | Event::ModelRetry { .. }
                ) {
                    let _ = tx.send(e.clone());
                }
            }) as toolloop::agent::EventHandler
        }),
        on_approval: None,
    };
    drop(tx);
    let agent = match app.agents.all()[index].build(hooks) {
        Ok(a) => a,
        Err(e) => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, e);
        }
    };
    let cancel = CancellationToken::new();
    let run_id = app.agents.all()[index].run_id(client, key.as_deref());
    // A Responses API answer's id is its run's (`previous_response_id` names the run).
    let id = match format {
        Format::Chat => format!("chatcmpl-{}", &toolloop::journal::new_run_id()[4..]),
        Format::Responses => response_id(run_id.as_str()),
    };
    let run = {
        let agents = app.agents.clone();
        let cancel = cancel.clone();
        let messages = request.messages;
        app.tracker.spawn(async move {
            let _permit = permit;
            let out = super::run_keyed(&agent, agents.store(), messages, run_id, cancel).await;
            drop(agent);
            out
        })
    };
    // The run stops when its client goes away (the answer's future, or the stream, dropped),
    // unless --keep-on-disconnect.
    let guard = (!app.keep_on_disconnect).then(|| cancel.drop_guard());
    let model = request.model;
    if !request.stream {
        let outcome = run.await;
        drop(guard);
        return match outcome {
            Ok(Ok(o)) => whole_answer(&id, &model, &o, format),
            Ok(Err(e)) => run_error(e),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                format!("the run failed: {e}"),
            ),
        };
    }
    let include_usage = request.include_usage;
    let stream = streamed_answer(id, model, rx, run, guard, include_usage, format);
    sse_response(Body::from_stream(
        stream.map(Ok::<_, std::convert::Infallible>),
    ))
}

fn run_error(e: RunError) -> Response {
    match e {
        RunError::Busy(m) => error(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("run_in_progress"),
            m,
        ),
        RunError::Failed(m) => error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, m),
    }
}

/// The answer's text: the validated JSON with an output schema, else the text.
fn answer_text(o: &Outcome) -> Option<String> {
    match &o.output {
        Some(v) => Some(v.to_string()),
        None => o.text.clone(),
    }
}

/// What the run did, in a field of its own (OpenAI clients ignore it; the content stays the
/// answer).
fn run_info(o: &Outcome) -> Value {
    let calls: Vec<Value> = o
        .tool_calls
        .iter()
        .map(|c| json!({"round": c.round, "name": c.call.name, "arguments": c.call.arguments, "success": c.success()}))
        .collect();
    let mut v = json!({
        "run_id": o.run_id,
        "stop_reason": o.stop_reason,
        "rounds": o.rounds,
        "tool_calls": calls,
    });
    if !o.pending_approvals.is_empty() {
        v["pending_approvals"] = json!(o.pending_approvals);
    }
    v
}

/// Whether the outcome is an answer (complete, or cut short by a budget: `length`).
fn finish_of(o: &Outcome) -> Option<&'static str> {
    match o.stop_reason {
        StopReason::Answered => Some("stop"),
        StopReason::MaxRounds
        | StopReason::MaxToolCalls
        | StopReason::Timeout
        | StopReason::OutputTruncated
        | StopReason::ContextExhausted => Some("length"),
        _ => None,
    }
}

/// A run that did not answer: 202 while it waits for approvals, else an error naming why.
fn not_answered(o: &Outcome) -> Response {
    let reason = serde_json::to_value(o.stop_reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    if o.stop_reason == StopReason::AwaitingApproval {
        let run_id = o.run_id.clone().unwrap_or_default();
        let body = json!({
            "error": {
                "message": format!("the run waits for approval of calls: see GET /v1/runs/{run_id}, decide with `toolloop approve|deny {run_id}`, then resume it"),
                "type": "awaiting_approval",
                "code": "awaiting_approval",
                "param": null,
            },
            "toolloop": run_info(o),
        });
        return (StatusCode::ACCEPTED, axum::Json(body)).into_response();
    }
    let why = o
        .error
        .as_ref()
        .map(|e| format!(": {}", e.message))
        .unwrap_or_default();
    let body = json!({
        "error": {
            "message": format!("the run stopped ({reason}){why}"),
            "type": "server_error",
            "code": reason,
            "param": null,
        },
        "toolloop": run_info(o),
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

fn whole_answer(id: &str, model: &str, o: &Outcome, format: Format) -> Response {
    let Some(finish) = finish_of(o) else {
        return not_answered(o);
    };
    let text = answer_text(o);
    let mut v = match format {
        Format::Chat => wire::completion(id, model, text.as_deref(), &[], finish, o.usage.as_ref()),
        Format::Responses => response_object(model, o, text.as_deref().unwrap_or("")),
    };
    v["toolloop"] = run_info(o);
    axum::Json(v).into_response()
}

/// A streamed agent answer. Only the answer is content: the model's text is held for each
/// round until the round shows what it is (the round's text cannot be taken back once sent,
/// and only its end tells whether tool calls follow it), so the answer comes as one delta when
/// the run ends. What the run does is progress, beside the content: each round's text before
/// its tool calls, and each tool call, as a chunk with no choices and a `toolloop` field
/// (`{"text": {"round", "text"}}`, `{"tool_call": {"round", "name", "arguments"}}`), or the
/// Responses API's `toolloop.text` and `toolloop.tool_call` events. Then the finish.
fn streamed_answer(
    id: String,
    model: String,
    rx: mpsc::UnboundedReceiver<Event>,
    run: tokio::task::JoinHandle<Result<Outcome, RunError>>,
    guard: Option<tokio_util::sync::DropGuard>,
    include_usage: bool,
    format: Format,
) -> futures::stream::BoxStream<'static, Bytes> {
    struct St {
        rx: mpsc::UnboundedReceiver<Event>,
        run: Option<tokio::task::JoinHandle<Result<Outcome, RunError>>>,
        _guard: Option<tokio_util::sync::DropGuard>,
        id: String,
        model: String,
        include_usage: bool,
        format: Format,
        sequence: u64,
        started: bool,
        /// The text of the round going on, held until the round shows what it is.
        round_text: String,
    }
    /// A progress event (never content): a chunk with no choices and a `toolloop` field, or
    /// a `toolloop.*` event of the Responses API.
    fn progress(st: &mut St, what: Value) -> Bytes {
        match st.format {
            Format::Chat => wire::sse(&json!({
                "id": st.id,
                "object": "chat.completion.chunk",
                "created": wire::now_secs(),
                "model": st.model,
                "choices": [],
                "toolloop": what,
            })),
            Format::Responses => {
                let (kind, data) = match what {
                    Value::Object(m) => m.into_iter().next().unwrap_or_default(),
                    other => (String::new(), other),
                };
                responses_event(&mut st.sequence, &format!("toolloop.{kind}"), data)
            }
        }
    }
    let st = St {
        rx,
        run: Some(run),
        _guard: guard,
        id,
        model,
        include_usage,
        format,
        sequence: 0,
        started: false,
        round_text: String::new(),
    };
    futures::stream::unfold(st, |mut st| async move {
        if !st.started {
            st.started = true;
            let first = match st.format {
                Format::Chat => wire::sse(&wire::chunk(
                    &st.id,
                    &st.model,
                    json!({"role": "assistant", "content": ""}),
                    None,
                )),
                Format::Responses => responses_event(
                    &mut st.sequence,
                    "response.created",
                    json!({"response": {"id": st.id, "object": "response", "status": "in_progress", "model": st.model, "output": []}}),
                ),
            };
            return Some((first, st));
        }
        if let Some(event) = st.rx.recv().await {
            let bytes = match event {
                // A round's text is held until the round shows what it is: the text before
                // its tool calls (progress, beside the content), or the answer, sent as the
                // content when the run ends.
                Event::TextDelta { text, .. } => {
                    st.round_text.push_str(&text);
                    Bytes::new()
                }
                // A new round, or a model call made again: the text held was not the answer
                // (a reply sent back to be corrected) or is void.
                Event::RoundStarted { .. } | Event::ModelRetry { .. } => {
                    st.round_text.clear();
                    Bytes::new()
                }
                Event::ToolCallRequested { round, call } => {
                    let mut out = Vec::new();
                    let text = std::mem::take(&mut st.round_text);
                    if !text.is_empty() {
                        out.extend_from_slice(&progress(
                            &mut st,
                            json!({"text": {"round": round, "text": text}}),
                        ));
                    }
                    out.extend_from_slice(&progress(
                        &mut st,
                        json!({"tool_call": {"round": round, "name": call.name, "arguments": call.arguments}}),
                    ));
                    Bytes::from(out)
                }
                _ => Bytes::new(),
            };
            return Some((bytes, st));
        }
        // The run is over (its agent, holding the sender, is gone).
        let run = st.run.take()?;
        let outcome = run.await;
        let bytes = match outcome {
            Ok(Ok(o)) => match (finish_of(&o), st.format) {
                (Some(finish), Format::Chat) => {
                    let mut out = Vec::new();
                    if let Some(text) = answer_text(&o).filter(|t| !t.is_empty()) {
                        out.extend_from_slice(&wire::sse(&wire::chunk(
                            &st.id,
                            &st.model,
                            json!({"content": text}),
                            None,
                        )));
                    }
                    let mut last = wire::chunk(&st.id, &st.model, json!({}), Some(finish));
                    last["toolloop"] = run_info(&o);
                    out.extend_from_slice(&wire::sse(&last));
                    if st.include_usage {
                        out.extend_from_slice(&wire::sse(&wire::usage_chunk(
                            &st.id,
                            &st.model,
                            o.usage.as_ref(),
                        )));
                    }
                    out.extend_from_slice(&wire::sse_done());
                    Bytes::from(out)
                }
                (Some(_), Format::Responses) => {
                    let text = answer_text(&o).unwrap_or_default();
                    let mut out = Vec::new();
                    if !text.is_empty() {
                        out.extend_from_slice(&responses_event(
                            &mut st.sequence,
                            "response.output_text.delta",
                            json!({"item_id": format!("msg_{}", st.id), "output_index": 0, "content_index": 0, "delta": text}),
                        ));
                    }
                    let mut response = response_object(&st.model, &o, &text);
                    response["id"] = json!(st.id);
                    response["toolloop"] = run_info(&o);
                    out.extend_from_slice(&responses_event(
                        &mut st.sequence,
                        "response.completed",
                        json!({"response": response}),
                    ));
                    Bytes::from(out)
                }
                (None, _) => stream_error(&format!(
                    "the run stopped ({}){}",
                    serde_json::to_value(o.stop_reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    o.error
                        .as_ref()
                        .map(|e| format!(": {}", e.message))
                        .unwrap_or_default()
                )),
            },
            Ok(Err(e)) => stream_error(&e.to_string()),
            Err(e) => stream_error(&format!("the run failed: {e}")),
        };
        Some((bytes, st))
    })
    .filter(|b| futures::future::ready(!b.is_empty()))
    .boxed()
}

fn stream_error(message: &str) -> Bytes {
    wire::sse(&json!({"error": {"message": message, "type": "server_error"}}))
}

/// One event of a streamed Responses answer.
fn responses_event(sequence: &mut u64, kind: &str, mut data: Value) -> Bytes {
    data["type"] = json!(kind);
    data["sequence_number"] = json!(*sequence);
    *sequence += 1;
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The id of the Responses API answer of run `run_id`.
fn response_id(run_id: &str) -> String {
    format!("resp_{}", run_id.strip_prefix("run_").unwrap_or(run_id))
}

/// The run a Responses API answer's id names.
fn run_of_response(id: &str) -> Option<String> {
    id.strip_prefix("resp_")
        .filter(|r| !r.is_empty())
        .map(|r| format!("run_{r}"))
}

/// A whole Responses API `response` object holding the answer as one message.
fn response_object(model: &str, o: &Outcome, text: &str) -> Value {
    let usage = o.usage.unwrap_or_default();
    let id = response_id(o.run_id.as_deref().unwrap_or("none"));
    json!({
        "id": id,
        "object": "response",
        "created_at": wire::now_secs(),
        "status": "completed",
        "model": model,
        "output": [{
            "type": "message",
            "id": format!("msg_{}", id),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }],
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    })
}

/// `POST /v1/responses`: `input` as text or messages, `instructions` as a system prompt.
async fn responses(
    State(app): State<Arc<App>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return bad_request(BadRequest {
                message: format!("the body is not JSON: {e}"),
                param: None,
            });
        }
    };
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // What `model` names, owned (the request takes `model`).
    enum Named {
        Agent(String),
        Gateway(String),
    }
    let target = match target(&model) {
        Some(Target::Agent(n)) => Named::Agent(n.to_string()),
        Some(Target::Gateway(s)) => Named::Gateway(s.to_string()),
        None => return unknown_model(&model),
    };
    let is_set = |field: &str| {
        v.get(field)
            .is_some_and(|f| !f.is_null() && f.as_array().is_none_or(|a| !a.is_empty()))
    };
    // Fields a target does not serve are refused by name, never ignored: a client that counts
    // on them would get an answer to another question.
    let refused = match target {
        Named::Agent(_) if is_set("tools") => Some((
            "tools",
            "agent:NAME runs its own tools; offer yours through gateway:SPEC",
        )),
        Named::Gateway(_) if is_set("previous_response_id") => Some((
            "previous_response_id",
            "the gateway keeps no conversation; send the whole conversation as `input`",
        )),
        _ => None,
    };
    if let Some((field, why)) = refused {
        return bad_request(BadRequest {
            message: format!("`{field}` is not supported here: {why}"),
            param: Some(field.into()),
        });
    }
    let mut items = Vec::new();
    match v.get("input") {
        Some(Value::String(s)) => items.push(json!({"role": "user", "content": s})),
        Some(Value::Array(given)) => match wire::responses_input(given) {
            Ok(m) => items = m,
            Err(e) => return bad_request(e),
        },
        _ => {
            return bad_request(BadRequest {
                message: "`input` is required: text, or an array of messages".into(),
                param: Some("input".into()),
            });
        }
    }
    let input = match wire::read_messages(&items) {
        Ok(m) => m,
        Err(e) => return bad_request(e),
    };
    // The conversation so far: the previous response's, when it continues one.
    let mut messages = match (v.get("previous_response_id"), &target) {
        (None | Some(Value::Null), _) | (_, Named::Gateway(_)) => Vec::new(),
        (Some(Value::String(previous)), Named::Agent(name)) => {
            match previous_conversation(&app, name, &client, previous).await {
                Ok(m) => m,
                Err(r) => return *r,
            }
        }
        (Some(_), _) => {
            return bad_request(BadRequest {
                message: "`previous_response_id`: expected a response's id (a string)".into(),
                param: Some("previous_response_id".into()),
            });
        }
    };
    // The instructions are the system prompt: this request's replace those before.
    if let Some(i) = v.get("instructions").and_then(Value::as_str) {
        match messages.first_mut() {
            Some(first @ toolloop::Message::System { .. }) => *first = toolloop::Message::system(i),
            _ => messages.insert(0, toolloop::Message::system(i)),
        }
    }
    messages.extend(input);
    let tools = match v.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(t)) => match wire::read_tools(t) {
            Ok(t) => t,
            Err(e) => return bad_request(e),
        },
        Some(_) => {
            return bad_request(BadRequest {
                message: "`tools` must be an array".into(),
                param: Some("tools".into()),
            });
        }
    };
    let tool_choice = match v.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(c)) if c == "auto" => ToolChoice::Auto,
        Some(Value::String(c)) if c == "none" => ToolChoice::None,
        Some(Value::String(c)) if c == "required" => ToolChoice::Required,
        Some(c) => match c.get("name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Tool(name.to_string()),
            None => {
                return bad_request(BadRequest {
                    message: "`tool_choice`: expected auto, none, required or {\"type\": \
                              \"function\", \"name\": …}"
                        .into(),
                    param: Some("tool_choice".into()),
                });
            }
        },
    };
    let temperature = match v.get("temperature") {
        None | Some(Value::Null) => None,
        Some(t) => match t.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => Some(t as f32),
            _ => {
                return bad_request(BadRequest {
                    message: "`temperature`: expected a number from 0 to 2".into(),
                    param: Some("temperature".into()),
                });
            }
        },
    };
    let request = ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: false,
        temperature,
        max_tokens: v
            .get("max_output_tokens")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok()),
    };
    match target {
        Named::Agent(name) => {
            agent_chat(app, &name, request, &headers, &client, Format::Responses).await
        }
        Named::Gateway(spec) => {
            gateway_chat(app, &spec, request, &headers, &client, Format::Responses).await
        }
    }
}

/// The conversation of the answer `previous` (a Responses API id: its run's, in the store): the
/// messages of that finished run of agent `name`, its answer last. Another client's answer is
/// as unknown as none.
async fn previous_conversation(
    app: &App,
    name: &str,
    client: &Client,
    previous: &str,
) -> Result<Vec<toolloop::Message>, Box<Response>> {
    let refuse = |message: String| {
        Box::new(bad_request(BadRequest {
            message: format!("`previous_response_id`: {message}"),
            param: Some("previous_response_id".into()),
        }))
    };
    let shown = toolloop::result::shorten(previous, 80);
    let unknown = || refuse(format!("no response {shown} on this server"));
    let run_id = run_of_response(previous).ok_or_else(unknown)?;
    let store = app.agents.store().ok_or_else(unknown)?;
    if !client.owns(&run_id) {
        return Err(unknown());
    }
    match store.run(&run_id).await {
        Ok(Some(s)) if s.status.as_str() == "finished" => {}
        Ok(Some(s)) => {
            return Err(refuse(format!(
                "the response {shown} is not finished (its run is {}): continue it once it is",
                s.status.as_str()
            )));
        }
        Ok(None) => return Err(unknown()),
        Err(e) => {
            return Err(Box::new(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                e.to_string(),
            )));
        }
    }
    let spec = app
        .agents
        .all()
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(unknown)?;
    let agent = spec.build(RunHooks::default()).map_err(|e| {
        Box::new(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            None,
            e,
        ))
    })?;
    // A finished run's outcome comes from its log: nothing is run again.
    let outcome = agent
        .resume(&run_id, CancellationToken::new())
        .await
        .map_err(|e| refuse(format!("the conversation of {shown} cannot be read: {e}")))?;
    Ok(outcome.messages)
}

/// `GET /v1/runs/{id}`: the run's summary from the store, and the calls that wait for a
/// person's approval.
async fn run_status(
    State(app): State<Arc<App>>,
    Extension(client): Extension<Client>,
    Path(id): Path<String>,
) -> Response {
    let Some(store) = app.agents.store() else {
        return error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            None,
            "no store",
        );
    };
    // Another client's run is as unknown as a run that does not exist.
    let known = if client.owns(&id) {
        store.run(&id).await
    } else {
        Ok(None)
    };
    let summary = match known {
        Ok(Some(s)) => s,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("run_not_found"),
                format!("no run {}", toolloop::result::shorten(&id, 80)),
            );
        }
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                e.to_string(),
            );
        }
    };
    let mut pending = Vec::new();
    if let Some(spec) = app.agents.all().first()
        && let Ok(agent) = spec.build(RunHooks::default())
        && let Ok(p) = agent.pending_approvals(&id).await
    {
        pending = p;
    }
    axum::Json(json!({
        "run_id": summary.run_id,
        "status": summary.status.as_str(),
        "stop_reason": summary.stop_reason,
        "records": summary.records,
        "created_ms": summary.created_ms,
        "updated_ms": summary.updated_ms,
        "pending_approvals": pending,
    }))
    .into_response()
}
