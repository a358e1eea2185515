//! A streamable HTTP server that misbehaves, on 127.0.0.1: every answer that cannot be read
//! (garbled, oversized, as a JSON body or as an SSE event) fails its call at once with an error
//! naming the server, and a call the server never answers ends at the call timeout.
#![cfg(feature = "http")]

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolloop::tool::ToolContext;
use toolloop_mcp::{McpServer, ServerConfig};

/// More than the most a message may be (16 MiB).
const HUGE: usize = 17 * 1024 * 1024;

/// One request: its method line and its body.
async fn read_request(sock: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let first = head.lines().next().unwrap_or("").to_string();
    Some((first, body))
}

async fn respond(sock: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\nmcp-session-id: s1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = sock.write_all(head.as_bytes()).await;
    let _ = sock.write_all(body).await;
    let _ = sock.shutdown().await;
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": name, "inputSchema": {"type": "object"}})
}

/// Serves one connection.
async fn serve(mut sock: TcpStream) {
    let Some((first, body)) = read_request(&mut sock).await else {
        return;
    };
    if !first.starts_with("POST") {
        respond(&mut sock, "405 Method Not Allowed", "text/plain", b"").await;
        return;
    }
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        respond(&mut sock, "400 Bad Request", "text/plain", b"").await;
        return;
    };
    let Some(id) = msg.get("id").cloned() else {
        respond(&mut sock, "202 Accepted", "text/plain", b"").await;
        return;
    };
    let answer = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
    match msg["method"].as_str().unwrap_or("") {
        "initialize" => {
            let result = json!({
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "faulty", "version": "1"},
            });
            respond(
                &mut sock,
                "200 OK",
                "application/json",
                answer(result).as_bytes(),
            )
            .await;
        }
        "tools/list" => {
            let names = [
                "fine",
                "never",
                "garbled",
                "huge",
                "garbled_sse",
                "huge_sse",
            ];
            let result = json!({"tools": names.iter().map(|n| tool(n)).collect::<Vec<_>>()});
            respond(
                &mut sock,
                "200 OK",
                "application/json",
                answer(result).as_bytes(),
            )
            .await;
        }
        "tools/call" => {
            let fine = json!({"content": [{"type": "text", "text": "fine"}]});
            match msg["params"]["name"].as_str().unwrap_or("") {
                "fine" => {
                    respond(
                        &mut sock,
                        "200 OK",
                        "application/json",
                        answer(fine).as_bytes(),
                    )
                    .await
                }
                "never" => {
                    // Headers and all, never: the connection stays open.
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                "garbled" => {
                    respond(
                        &mut sock,
                        "200 OK",
                        "application/json",
                        b"{\"jsonrpc\": \"2.0\", garbage",
                    )
                    .await
                }
                "huge" => {
                    let text = "x".repeat(HUGE);
                    let result = json!({"content": [{"type": "text", "text": text}]});
                    respond(
                        &mut sock,
                        "200 OK",
                        "application/json",
                        answer(result).as_bytes(),
                    )
                    .await
                }
                sse @ ("garbled_sse" | "huge_sse") => {
                    // An SSE stream whose only event cannot be read, then left open.
                    let event = if sse == "huge_sse" {
                        let text = "x".repeat(HUGE);
                        answer(json!({"content": [{"type": "text", "text": text}]}))
                    } else {
                        "{\"jsonrpc\": \"2.0\", garbage".to_string()
                    };
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                mcp-session-id: s1\r\ncache-control: no-cache\r\n\r\n";
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock
                        .write_all(format!("id: 1\nevent: message\ndata: {event}\n\n").as_bytes())
                        .await;
                    let _ = sock.flush().await;
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                _ => respond(&mut sock, "404 Not Found", "text/plain", b"").await,
            }
        }
        _ => {
            let error = json!({"jsonrpc": "2.0", "id": id,
                               "error": {"code": -32601, "message": "no such method"}});
            respond(
                &mut sock,
                "200 OK",
                "application/json",
                error.to_string().as_bytes(),
            )
            .await;
        }
    }
}

/// The server's URL; it runs until the test's runtime ends.
async fn faulty_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(serve(sock));
        }
    });
    format!("http://127.0.0.1:{port}/mcp")
}

/// Calls `tool` on a fresh connection; the error (or result text) and how long it took.
async fn call(server: &McpServer, tool: &str) -> (Result<String, String>, Duration) {
    let started = Instant::now();
    let out = server
        .call_tool(tool, json!({}), &ToolContext::detached("c1", tool))
        .await;
    let out = out
        .map(|r| format!("{:?}", r.content))
        .map_err(|e| e.message);
    (out, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_or_oversized_answers_fail_the_call_at_once_naming_the_server() {
    let url = faulty_server().await;
    // A call timeout far above what each answer may take: only an error ends them in time.
    let server =
        McpServer::new(ServerConfig::http("faulty", &url).call_timeout(Duration::from_secs(60)));
    let tools = server.list_tools().await.unwrap();
    assert_eq!(tools.len(), 6);
    for tool in ["garbled", "huge", "garbled_sse", "huge_sse"] {
        let (out, took) = call(&server, tool).await;
        let message = out.expect_err(tool);
        assert!(message.contains("MCP server `faulty`"), "{tool}: {message}");
        assert!(
            message.contains("cannot read") || message.contains("larger than"),
            "{tool}: {message}"
        );
        assert!(took < Duration::from_secs(15), "{tool} took {took:?}");
        // The server is still usable after a bad answer.
        let (fine, _) = call(&server, "fine").await;
        assert!(fine.unwrap().contains("fine"), "after {tool}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_never_answered_ends_at_the_call_timeout() {
    let url = faulty_server().await;
    let server =
        McpServer::new(ServerConfig::http("faulty", &url).call_timeout(Duration::from_secs(2)));
    let (out, took) = call(&server, "never").await;
    let message = out.unwrap_err();
    assert!(message.contains("did not finish within 2.0s"), "{message}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    server.shutdown().await;
}

#[test]
fn calls_have_a_default_timeout_unless_configured() {
    let config = ServerConfig::http("web", "http://127.0.0.1:1/mcp");
    assert_eq!(
        config.call_timeout,
        Some(toolloop_mcp::config::DEFAULT_CALL_TIMEOUT)
    );
    let parsed = toolloop_mcp::parse_mcp_servers_verbatim(
        &json!({"mcpServers": {"a": {"url": "http://127.0.0.1:1/mcp"},
                               "b": {"url": "http://127.0.0.1:1/mcp", "timeout": 5}}}),
    )
    .unwrap();
    let by_name = |n: &str| parsed.iter().find(|s| s.name == n).unwrap().call_timeout;
    assert_eq!(
        by_name("a"),
        Some(toolloop_mcp::config::DEFAULT_CALL_TIMEOUT)
    );
    assert_eq!(by_name("b"), Some(Duration::from_secs(5)));
}
