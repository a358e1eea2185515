//! Against real MCP servers: `@modelcontextprotocol/server-everything` over stdio and over
//! streamable HTTP, `@modelcontextprotocol/server-filesystem` over stdio, installed by
//! `scripts/npm-install` from `tools/npm/package-lock.json`. Ignored, with the reason, when node or npm
//! is not on `PATH`.

use crate::npm;

use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolloop::tool::{SideEffect, Tool, ToolContext};
use toolloop_mcp::{McpTools, ServerConfig, ServerState};

fn by_name(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.name() == name)
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no tool {name} in {:?}",
                tools.iter().map(|t| t.name()).collect::<Vec<_>>()
            )
        })
}

/// The children of this process whose command line mentions `needle`.
fn children_running(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid …
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        if fields.get(1) != Some(&me.as_str()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(format!(
                "{} ({})",
                entry.file_name().to_string_lossy(),
                fields[0]
            ));
        }
    }
    out
}

#[cfg_attr(not(toolloop_npm), ignore = "node and npm are not on PATH (tools/npm)")]
#[tokio::test]
async fn everything_over_stdio() {
    let entry = npm::mcp_server("server-everything");
    let mcp = McpTools::new(vec![ServerConfig::stdio(
        "everything",
        "node",
        [entry.to_string_lossy().into_owned(), "stdio".into()],
    )])
    .unwrap();
    let tools = mcp.tools(&[]).await.unwrap();
    let echo = by_name(&tools, "echo");
    assert_eq!(echo.description(), "Echoes back the input string");
    assert_eq!(echo.parameters()["properties"]["message"]["type"], "string");
    assert_eq!(echo.side_effect(), SideEffect::ReadOnly);
    assert!(echo.parallel_safe());
    let out = echo
        .call(
            json!({"message": "hi"}),
            ToolContext::detached("c1", "echo"),
        )
        .await
        .unwrap();
    assert_eq!(out.message, "Echo: hi");

    // An image goes to the model with the result, announced in its text; structured content
    // is the data.
    let image = by_name(&tools, "get-tiny-image");
    let out = image
        .call(json!({}), ToolContext::detached("c2", "get-tiny-image"))
        .await
        .unwrap();
    assert!(
        out.message.contains("[image 1: image/png"),
        "{}",
        out.message
    );
    assert_eq!(out.images.len(), 1);
    assert_eq!(out.images[0].media_type(), Some("image/png"));
    let structured = by_name(&tools, "get-structured-content");
    let args = toolloop::schema::sample(structured.parameters());
    let out = structured
        .call(args, ToolContext::detached("c3", "s"))
        .await
        .unwrap();
    assert!(out.data.as_ref().is_some_and(Value::is_object), "{out:?}");
    // An embedded resource reads as its URI and text.
    let reference = by_name(&tools, "get-resource-reference");
    let args = toolloop::schema::sample(reference.parameters());
    let out = reference
        .call(args, ToolContext::detached("c4", "r"))
        .await
        .unwrap();
    assert!(out.message.contains("[resource "), "{}", out.message);

    // A bad argument is the server's error, for the model.
    let err = echo
        .call(json!({"message": 3}), ToolContext::detached("c5", "echo"))
        .await
        .unwrap_err();
    assert!(!err.message.is_empty());

    assert_eq!(mcp.servers()[0].state(), ServerState::Running);
    // This test's child (others run the same server over HTTP at the same time).
    let needle = format!("{}\0stdio", entry.to_string_lossy());
    assert_eq!(children_running(&needle).len(), 1);
    mcp.shutdown().await;
    assert_eq!(mcp.servers()[0].state(), ServerState::Stopped);
    // The child was waited for: neither running nor a zombie.
    assert_eq!(children_running(&needle), Vec::<String>::new());
}

/// A free port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg_attr(not(toolloop_npm), ignore = "node and npm are not on PATH (tools/npm)")]
#[tokio::test]
async fn everything_over_streamable_http() {
    let entry = npm::mcp_server("server-everything");
    let port = free_port();
    let mut server = tokio::process::Command::new("node")
        .arg(&entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the HTTP server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mcp = McpTools::new(vec![
        ServerConfig::http("web", format!("http://127.0.0.1:{port}/mcp"))
            .header("Authorization", "Bearer not-checked")
            .prefix("web"),
    ])
    .unwrap();
    let tools = mcp.tools(&[]).await.unwrap();
    let echo = by_name(&tools, "web__echo");
    assert_eq!(echo.side_effect(), SideEffect::ReadOnly);
    let out = echo
        .call(
            json!({"message": "over http"}),
            ToolContext::detached("c1", "web__echo"),
        )
        .await
        .unwrap();
    assert_eq!(out.message, "Echo: over http");
    mcp.shutdown().await;
    let _ = server.kill().await;
}

#[cfg_attr(not(toolloop_npm), ignore = "node and npm are not on PATH (tools/npm)")]
#[tokio::test]
async fn filesystem_over_stdio() {
    let entry = npm::mcp_server("server-filesystem");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("notes.txt"), "line one\n").unwrap();
    let mcp = McpTools::new(vec![ServerConfig::stdio(
        "fs",
        "node",
        [
            entry.to_string_lossy().into_owned(),
            root.to_string_lossy().into_owned(),
        ],
    )])
    .unwrap();
    // `read_file` is also a built-in's name: the server's is prefixed.
    let tools = mcp.tools(&["read_file"]).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert!(
        names.contains(&"fs__read_file") && names.contains(&"read_text_file"),
        "{names:?}"
    );
    let read = by_name(&tools, "read_text_file");
    assert_eq!(read.side_effect(), SideEffect::ReadOnly);
    let write = by_name(&tools, "write_file");
    assert_ne!(write.side_effect(), SideEffect::ReadOnly);
    let path = root.join("notes.txt").to_string_lossy().into_owned();
    let out = read
        .call(json!({"path": path}), ToolContext::detached("c1", "r"))
        .await
        .unwrap();
    assert!(out.message.contains("line one"), "{}", out.message);
    // Outside the allowed directory: the server's `isError`, as a failed call.
    let err = read
        .call(
            json!({"path": "/etc/hostname"}),
            ToolContext::detached("c2", "r"),
        )
        .await
        .unwrap_err();
    assert!(
        err.message.to_lowercase().contains("denied") || err.message.contains("outside"),
        "{}",
        err.message
    );
    mcp.shutdown().await;
}

#[tokio::test]
async fn a_server_that_does_not_start_is_named_with_its_stderr() {
    let mcp = McpTools::new(vec![ServerConfig::stdio(
        "broken",
        "sh",
        ["-c", "echo 'cannot open the database' >&2; exit 7"],
    )])
    .unwrap();
    let Err(e) = mcp.tools(&[]).await else {
        panic!("it started")
    };
    assert_eq!(e.server, "broken");
    let text = e.to_string();
    assert!(
        text.contains("MCP server `broken`") && text.contains("did not start"),
        "{text}"
    );
    assert!(text.contains("cannot open the database"), "{text}");
    assert!(matches!(mcp.servers()[0].state(), ServerState::Failed(_)));
    let missing = McpTools::new(vec![ServerConfig::stdio(
        "gone",
        "/nonexistent/server",
        Vec::<String>::new(),
    )])
    .unwrap();
    let Err(e) = missing.tools(&[]).await else {
        panic!("it started")
    };
    let e = e.to_string();
    assert!(e.contains("cannot run `/nonexistent/server`"), "{e}");
}
