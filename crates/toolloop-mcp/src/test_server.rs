//! An MCP server (stdio) with tools that misbehave on purpose, for tests of the client's fault
//! handling. Not for use outside tests.
//!
//! It writes what it sees to the file `TOOLLOOP_MCP_TEST_LOG` names (one line per event:
//! `start <pid>`, `call <tool> <idempotency key>`, `cancelled <tool> <idempotency key>`,
//! `effect <idempotency key>`). Tools:
//!
//! - `echo` (read-only): gives back `text`, with the idempotency key as structured content;
//! - `slow` (read-only): waits a minute, or until cancelled;
//! - `crash`: the process exits in the middle of the call;
//! - `fail`: a result with `isError`;
//! - `add_tool`: adds the tool `extra` and sends `notifications/tools/list_changed`;
//! - `destroy` (destructive): logs `effect <key>`, then waits `TOOLLOOP_MCP_TEST_DESTROY_MS`
//!   milliseconds (default 0);
//! - `huge`: a result of 17 MiB of text (more than a message may be);
//! - `write`: writes `text` to the file at `path` (a failed write is a result with `isError`
//!   and the system's error).
//!
//! `TOOLLOOP_MCP_TEST_MODE` makes it misbehave as a whole:
//!
//! - `silent-list`: never answers `tools/list` (and exits as soon as its stdin closes, as a
//!   server whose client went away does: rmcp would otherwise give the unanswered request five
//!   seconds, and the client's shutdown would wait out its grace period);
//! - `deep-schema`: lists a tool `deep` whose input schema nests 200 levels deep;
//! - `huge-list`: lists a tool `big` whose description is 17 MiB long;
//! - `http-401`: not an MCP server at all but an HTTP endpoint on 127.0.0.1 (its port printed
//!   on stdout, one line) that answers every request with `401 Unauthorized` and a body that
//!   repeats the request's headers, as a careless server does.

use rmcp::ErrorData;
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer, ServiceExt};
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The test server's state.
#[derive(Clone, Default)]
pub struct TestServer {
    extra: Arc<AtomicBool>,
}

fn log(line: &str) {
    if let Some(path) = std::env::var_os("TOOLLOOP_MCP_TEST_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(serde_json::Map::new()),
    }
}

impl TestServer {
    fn tools(&self) -> Vec<Tool> {
        let text = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        let none = json!({"type": "object", "properties": {}});
        let read_only = ToolAnnotations::new().read_only(true);
        let mut tools = vec![
            Tool::new("echo", "Gives back the text.", schema(text.clone()))
                .with_annotations(read_only.clone()),
            Tool::new("slow", "Waits, or until cancelled.", schema(none.clone()))
                .with_annotations(read_only),
            Tool::new(
                "crash",
                "Kills the server in the middle of the call.",
                schema(none.clone()),
            ),
            Tool::new("fail", "Fails.", schema(none.clone())),
            Tool::new("add_tool", "Adds the tool `extra`.", schema(none.clone())),
            Tool::new(
                "destroy",
                "Changes the world once per call, then waits.",
                schema(none.clone()),
            )
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(true)),
            Tool::new(
                "write",
                "Writes text to a file.",
                schema(json!({"type": "object", "properties": {
                    "path": {"type": "string"}, "text": {"type": "string"}}})),
            ),
        ];
        tools.push(Tool::new(
            "huge",
            "Answers with 17 MiB of text.",
            schema(none.clone()),
        ));
        match mode().as_str() {
            "deep-schema" => {
                let mut deep = json!({"type": "string"});
                for _ in 0..200 {
                    deep = json!({"type": "object", "properties": {"a": deep}});
                }
                tools.push(Tool::new("deep", "A deep schema.", schema(deep)));
            }
            "huge-list" => {
                let description = "x".repeat(HUGE);
                tools.push(Tool::new("big", description, schema(none.clone())));
            }
            _ => {}
        }
        if self.extra.load(Ordering::SeqCst) {
            tools.push(Tool::new("extra", "Added at run time.", schema(none)));
        }
        tools
    }
}

/// More than a message may be (16 MiB).
const HUGE: usize = 17 * 1024 * 1024;

fn mode() -> String {
    std::env::var("TOOLLOOP_MCP_TEST_MODE").unwrap_or_default()
}

fn key(ctx: &RequestContext<RoleServer>) -> String {
    ctx.meta
        .0
        .0
        .get(crate::server::IDEMPOTENCY_KEY_META)
        .and_then(Value::as_str)
        .unwrap_or("-")
        .to_string()
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("toolloop-mcp-test-server", "0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        if mode() == "silent-list" {
            log("list (not answered)");
            std::future::pending::<()>().await;
        }
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let key = key(&context);
        let name = request.name.to_string();
        log(&format!("call {name} {key}"));
        let args = request.arguments.unwrap_or_default();
        let result = match name.as_str() {
            "echo" => {
                let text = args.get("text").and_then(Value::as_str).unwrap_or("");
                let mut r =
                    CallToolResult::success(vec![ContentBlock::text(format!("echo: {text}"))]);
                r.structured_content = Some(json!({"text": text, "idempotency_key": key}));
                r
            }
            "slow" => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                    _ = context.ct.cancelled() => {
                        log(&format!("cancelled {name} {key}"));
                        return Err(ErrorData::internal_error("cancelled", None));
                    }
                }
                CallToolResult::success(vec![ContentBlock::text("slept")])
            }
            "crash" => {
                eprintln!("toolloop-mcp-test-server: crashing on purpose");
                std::process::exit(3);
            }
            "huge" => CallToolResult::success(vec![ContentBlock::text("y".repeat(HUGE))]),
            "fail" => CallToolResult::error(vec![ContentBlock::text("it failed on purpose")]),
            "add_tool" => {
                self.extra.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                CallToolResult::success(vec![ContentBlock::text("added `extra`")])
            }
            "destroy" => {
                log(&format!("effect {key}"));
                let wait = std::env::var("TOOLLOOP_MCP_TEST_DESTROY_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                    _ = context.ct.cancelled() => {
                        log(&format!("cancelled {name} {key}"));
                    }
                }
                CallToolResult::success(vec![ContentBlock::text("destroyed")])
            }
            "write" => {
                let path = args.get("path").and_then(Value::as_str).unwrap_or("");
                let text = args.get("text").and_then(Value::as_str).unwrap_or("");
                match std::fs::write(path, text) {
                    Ok(()) => CallToolResult::success(vec![ContentBlock::text("written")]),
                    Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
                        "cannot write {path}: {e}"
                    ))]),
                }
            }
            "extra" if self.extra.load(Ordering::SeqCst) => {
                CallToolResult::success(vec![ContentBlock::text("extra ran")])
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool `{other}`"),
                    None,
                ));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Serves the test server on stdin and stdout until the client goes away.
pub fn main() {
    log(&format!("start {}", std::process::id()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if mode() == "http-401" {
        runtime.block_on(http_401());
        return;
    }
    runtime.block_on(async {
        // Stdin through a pipe of its own, to see when it closes.
        let (input, mut pipe) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut pipe).await;
            if mode() == "silent-list" {
                log("stdin closed");
                std::process::exit(0);
            }
        });
        let Ok(service) = TestServer::default()
            .serve((input, tokio::io::stdout()))
            .await
        else {
            return;
        };
        let _ = service.waiting().await;
    });
}

/// `http-401`: answers every HTTP request with a 401 whose body repeats the request's headers.
async fn http_401() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(listener) = tokio::net::TcpListener::bind("127.0.0.1:0").await else {
        return;
    };
    let Ok(address) = listener.local_addr() else {
        return;
    };
    println!("{}", address.port());
    let _ = std::io::stdout().flush();
    while let Ok((mut stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 65536 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&request);
            let headers: String = head
                .lines()
                .skip(1)
                .take_while(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            log(&format!("http {}", head.lines().next().unwrap_or("")));
            let body = format!("unauthorized: you sent {headers}");
            let response = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
