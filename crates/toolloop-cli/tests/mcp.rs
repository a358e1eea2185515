//! MCP servers through `toolloop run` and `toolloop mcp list`, with the mock model (OpenAI API)
//! calling their tools: the real `server-everything` (stdio and streamable HTTP) and
//! `server-filesystem` (stdio), installed by `scripts/npm-install` (skipped with a note when
//! node or the packages are missing); and, with the `test-hooks` feature, the repository's
//! own test server (`toolloop-mcp-test-server`) for faults: a slow call cancelled by the run's
//! timeout, a crash in the middle of a call, a changed tool list, a destructive call in flight
//! when the command is killed.

mod common;
use common::{command, json_of};

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

fn package(name: &str) -> Option<PathBuf> {
    let entry = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/npm/node_modules/@modelcontextprotocol")
        .join(name)
        .join("dist/index.js");
    let node = std::process::Command::new("node").arg("--version").output();
    if !matches!(node, Ok(ref o) if o.status.success()) {
        eprintln!("note: node is not installed; MCP server tests skipped");
        return None;
    }
    if !entry.is_file() {
        eprintln!(
            "note: {} is missing (run scripts/npm-install); MCP server tests skipped",
            entry.display()
        );
        return None;
    }
    Some(entry.canonicalize().unwrap())
}

fn write_config(dir: &Path, name: &str, servers: Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, json!({ "mcpServers": servers }).to_string()).unwrap();
    path
}

struct Mock {
    rt: tokio::runtime::Runtime,
    server: toolloop_mock::MockServer,
}

impl Mock {
    fn start() -> Mock {
        Mock::start_with(toolloop_mock::MockOptions::default())
    }
    fn start_with(options: toolloop_mock::MockOptions) -> Mock {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt.block_on(toolloop_mock::start(options)).unwrap();
        Mock { rt, server }
    }
    fn url(&self) -> String {
        format!("{}/v1", self.server.base_url())
    }
    fn finish(self) {
        assert_eq!(
            self.server.stats().rejected,
            0,
            "the mock saw an invalid transcript"
        );
        self.rt.block_on(self.server.shutdown());
    }
}

/// `toolloop run --json` with the mock model and `extra` flags.
fn run(mock: &Mock, dir: &Path, scenario: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let url = mock.url();
    let model = format!("openai:mock:{scenario}");
    let mut args = vec![
        "run",
        "--json",
        "--model",
        &model,
        "--base-url",
        &url,
        "--no-store",
    ];
    args.extend_from_slice(extra);
    args.push("go");
    let mut c = command(&args, dir);
    c.env("OPENAI_API_KEY", "sk-test-key-not-for-servers");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn result_of(call: &Value) -> &Value {
    &call["result"]
}

#[test]
fn server_everything_over_stdio_through_a_run() {
    let Some(entry) = package("server-everything") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "mcp.json",
        json!({"everything": {"command": "node", "args": [entry, "stdio"]}}),
    );
    let config = config.to_string_lossy().into_owned();
    let mock = Mock::start();
    let out = run(
        &mock,
        dir.path(),
        "rounds=1",
        &["--mcp-config", &config, "--tools", "echo"],
        &[],
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    let call = &v["tool_calls"][0];
    assert_eq!(call["name"], "echo");
    assert_eq!(call["success"], true, "{call}");
    assert_eq!(result_of(call)["message"], "Echo: a");

    // The child's environment holds no API key unless listed: get-env prints it.
    let config = write_config(
        dir.path(),
        "env.json",
        json!({"everything": {"command": "node", "args": [entry, "stdio"],
                              "env": {"GIVEN_TOKEN": "${MY_GIVEN_TOKEN}"}}}),
    );
    let config = config.to_string_lossy().into_owned();
    let out = run(
        &mock,
        dir.path(),
        "rounds=1",
        &["--mcp-config", &config, "--tools", "get-env"],
        &[
            ("MY_GIVEN_TOKEN", "listed-token"),
            ("GITHUB_TOKEN", "ghp_hidden"),
            ("PLAIN_VAR", "visible"),
        ],
    );
    let v = json_of(&out);
    let message = result_of(&v["tool_calls"][0])["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(message.contains("\"PLAIN_VAR\": \"visible\""), "{message}");
    assert!(
        message.contains("\"GIVEN_TOKEN\": \"listed-token\""),
        "{message}"
    );
    assert!(
        !message.contains("sk-test-key-not-for-servers"),
        "{message}"
    );
    assert!(!message.contains("ghp_hidden"), "{message}");

    // An image the server returns reaches the model with the result (the mock checks it and
    // says how many it saw).
    let out = run(
        &mock,
        dir.path(),
        "rounds=1",
        &["--mcp-config", &config, "--tools", "get-tiny-image"],
        &[("MY_GIVEN_TOKEN", "listed-token")],
    );
    let v = json_of(&out);
    let call = &v["tool_calls"][0];
    assert_eq!(call["success"], true, "{v}");
    let message = result_of(call)["message"].as_str().unwrap_or("");
    assert!(message.contains("[image 1: image/png"), "{message}");
    assert_eq!(
        v["text"], "Done. I saw 1 tool results in 1 rounds. I see 1 image.",
        "{v}"
    );
    mock.finish();
}

#[test]
fn server_everything_over_streamable_http_through_a_run() {
    let Some(entry) = package("server-everything") else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = std::process::Command::new("node")
        .arg(&entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the HTTP server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "mcp.json",
        json!({"web": {"type": "http", "url": format!("http://127.0.0.1:{port}/mcp"),
                       "headers": {"Authorization": "Bearer ${WEB_TOKEN}"}}}),
    );
    let config = config.to_string_lossy().into_owned();
    let mock = Mock::start();
    let out = run(
        &mock,
        dir.path(),
        "rounds=1",
        &["--mcp-config", &config, "--tools", "echo"],
        &[("WEB_TOKEN", "t0ken")],
    );
    let v = json_of(&out);
    assert_eq!(v["tool_calls"][0]["success"], true, "{v}");
    assert_eq!(result_of(&v["tool_calls"][0])["message"], "Echo: a");
    // An unset variable in the config is an error naming it.
    let out = run(
        &mock,
        dir.path(),
        "rounds=1",
        &["--mcp-config", &config],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mcpServers.web.headers.Authorization: the variable WEB_TOKEN is not set"),
        "{err}"
    );
    let _ = server.kill();
    let _ = server.wait();
    mock.finish();
}

#[test]
fn server_filesystem_from_the_roots_mcp_json_through_a_run() {
    let Some(entry) = package("server-filesystem") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    write_config(
        &root,
        ".mcp.json",
        json!({"fs": {"command": "node", "args": [entry, "."], "cwd": "."}}),
    );
    let mock = Mock::start();
    let out = run(
        &mock,
        &root,
        "rounds=1",
        &["--tools", "list_allowed_directories"],
        &[],
    );
    let v = json_of(&out);
    let call = &v["tool_calls"][0];
    assert_eq!(call["success"], true, "{v}");
    assert!(
        result_of(call)["message"]
            .as_str()
            .unwrap()
            .contains(root.to_str().unwrap()),
        "{call}"
    );
    // --no-mcp-json leaves the file alone: no such tool.
    let out = run(
        &mock,
        &root,
        "rounds=0",
        &["--no-mcp-json", "--tools", "list_allowed_directories"],
        &[],
    );
    assert_eq!(json_of(&out)["stop_reason"], "answered");

    // `toolloop mcp list`: the server, its state, its tools with annotations; the server's
    // read_file is prefixed (the built-in tool has that name).
    let out = command(&["mcp", "list", "--json"], &root).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v[0]["name"], "fs");
    assert_eq!(v[0]["state"], "running");
    let tools = v[0]["tools"].as_array().unwrap();
    let read = tools
        .iter()
        .find(|t| t["server_name"] == "read_file")
        .unwrap();
    assert_eq!(read["name"], "fs__read_file");
    let text = tools
        .iter()
        .find(|t| t["name"] == "read_text_file")
        .unwrap();
    assert_eq!(text["side_effect"], "read-only");
    assert_eq!(text["annotations"]["readOnlyHint"], true);
    let out = command(&["mcp", "list"], &root).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("fs (stdio: node "), "{text}");
    assert!(
        text.contains("  read_text_file [read-only] openWorldHint=false readOnlyHint=true"),
        "{text}"
    );
    assert!(!text.contains("not offered"), "{text}");
    // With --no-tools, the listing marks what a run would leave out.
    let out = command(&["mcp", "list", "--json", "--no-tools", "read_*"], &root)
        .output()
        .unwrap();
    let v = json_of(&out);
    for t in v[0]["tools"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        assert_eq!(t["offered"], !name.starts_with("read_"), "{t}");
    }
    let out = command(&["mcp", "list", "--tools", "list_*"], &root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("read_text_file [read-only] openWorldHint=false readOnlyHint=true (not offered: --tools/--no-tools)"),
        "{text}"
    );
    assert!(
        !text.contains(
            "list_allowed_directories [read-only] openWorldHint=false readOnlyHint=true (not"
        ),
        "{text}"
    );
    mock.finish();
}

#[test]
fn bad_mcp_configuration_is_a_usage_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "bad.json", json!({"x": {"command": 3}}));
    let config = config.to_string_lossy().into_owned();
    let out = command(
        &["run", "--mcp-config", &config, "--no-store", "hi"],
        dir.path(),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mcpServers.x.command is not a string"));
    let out = command(
        &["run", "--mcp-config", "/no/such.json", "--no-store", "hi"],
        dir.path(),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mcp-config /no/such.json"));
    // A server that does not start: named, with its stderr.
    std::fs::write(
        dir.path().join("dead.json"),
        json!({"mcpServers": {"dead": {"command": "sh", "args": ["-c", "echo no license >&2; exit 1"]}}}).to_string(),
    )
    .unwrap();
    let out = command(
        &["run", "--mcp-config", "dead.json", "--no-store", "hi"],
        dir.path(),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MCP server `dead`") && err.contains("no license"),
        "{err}"
    );
}

/// The test server's configuration, logging to `log`.
#[cfg(feature = "test-hooks")]
fn test_server_config(dir: &Path, log: &Path, extra_env: Value) -> String {
    let mut env = json!({"TOOLLOOP_MCP_TEST_LOG": log});
    if let (Some(env), Some(extra)) = (env.as_object_mut(), extra_env.as_object()) {
        env.extend(extra.clone());
    }
    write_config(
        dir,
        "faults.json",
        json!({"t": {"command": env!("CARGO_BIN_EXE_toolloop-mcp-test-server"), "env": env}}),
    )
    .to_string_lossy()
    .into_owned()
}

#[cfg(feature = "test-hooks")]
fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_slow_call_is_cancelled_on_the_server_by_the_runs_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let config = test_server_config(dir.path(), &log, json!({}));
    let mock = Mock::start();
    let started = Instant::now();
    let out = run(
        &mock,
        dir.path(),
        "rounds=1",
        &[
            "--mcp-config",
            &config,
            "--tools",
            "slow",
            "--timeout",
            "1.5",
        ],
        &[],
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "timeout", "{v}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let lines = log_lines(&log);
    assert!(
        lines.iter().any(|l| l.starts_with("call slow ")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("cancelled slow ")),
        "the server saw no cancellation: {lines:?}"
    );
    mock.finish();
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_crash_in_the_middle_of_a_call_fails_it_and_the_next_call_restarts_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let config = test_server_config(dir.path(), &log, json!({}));
    let mock = Mock::start();
    // The mock goes round the offered tools in the server's order: `echo`, `crash`, `fail`.
    let out = run(
        &mock,
        dir.path(),
        "rounds=3",
        &["--mcp-config", &config, "--tools", "crash,echo,fail"],
        &[],
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    let calls = v["tool_calls"].as_array().unwrap();
    let names: Vec<&str> = calls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "crash", "fail"]);
    assert_eq!(calls[0]["success"], true, "{v}");
    assert_eq!(result_of(&calls[0])["message"], "echo: a");
    // The idempotency key reached the server in `_meta`.
    let key = result_of(&calls[0])["data"]["idempotency_key"]
        .as_str()
        .unwrap();
    assert_eq!(key, calls[0]["id"].as_str().unwrap(), "{v}");
    assert_eq!(calls[1]["success"], false);
    let message = result_of(&calls[1])["message"].as_str().unwrap();
    assert!(
        message.contains("went away during the call") && message.contains("crashing on purpose"),
        "{message}"
    );
    // The next call restarted the server; its `isError` is a failed call the model reads.
    assert_eq!(calls[2]["success"], false);
    assert_eq!(result_of(&calls[2])["message"], "it failed on purpose");
    let starts = log_lines(&log)
        .iter()
        .filter(|l| l.starts_with("start "))
        .count();
    assert_eq!(starts, 2, "started once, restarted once");
    mock.finish();
}

#[cfg(feature = "test-hooks")]
#[tokio::test]
async fn a_changed_tool_list_is_listed_again() {
    use toolloop::tool::ToolContext;
    let mcp = toolloop_mcp::McpTools::new(vec![toolloop_mcp::ServerConfig::stdio(
        "t",
        env!("CARGO_BIN_EXE_toolloop-mcp-test-server"),
        Vec::<String>::new(),
    )])
    .unwrap();
    let tools = mcp.tools(&[]).await.unwrap();
    assert!(!tools.iter().any(|t| t.name() == "extra"));
    let add = tools.iter().find(|t| t.name() == "add_tool").unwrap();
    add.call(json!({}), ToolContext::detached("c1", "add_tool"))
        .await
        .unwrap();
    let started = Instant::now();
    while !mcp.tools_changed() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no list_changed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tools = mcp.tools(&[]).await.unwrap();
    let extra = tools
        .iter()
        .find(|t| t.name() == "extra")
        .expect("the new tool");
    let out = extra
        .call(json!({}), ToolContext::detached("c2", "extra"))
        .await
        .unwrap();
    assert_eq!(out.message, "extra ran");
    assert!(!mcp.tools_changed());
    mcp.shutdown().await;
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_tool_the_server_adds_during_a_run_is_offered_and_called_in_the_next_round() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let config = test_server_config(dir.path(), &log, json!({}));
    // The mock calls a scripted tool only when the request offers it: `extra` in round 2 is
    // called only if the run offers the tool the server added in round 1.
    let call = |name: &str| toolloop_mock::ScriptCall {
        name: name.into(),
        arguments: json!({}),
    };
    let mock = Mock::start_with(toolloop_mock::MockOptions {
        script: vec![vec![call("add_tool")], vec![call("extra")]],
        ..toolloop_mock::MockOptions::default()
    });
    let out = run(
        &mock,
        dir.path(),
        "rounds=2",
        &["--mcp-config", &config, "--tools", "add_tool,extra"],
        &[],
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    let calls = v["tool_calls"].as_array().unwrap();
    let names: Vec<&str> = calls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["add_tool", "extra"], "{v}");
    assert_eq!(calls[1]["success"], true, "{v}");
    assert_eq!(result_of(&calls[1])["message"], "extra ran");
    mock.finish();
}

#[cfg(feature = "test-hooks")]
#[test]
fn chats_tools_command_lists_the_mcp_servers_tools_too() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let config = test_server_config(dir.path(), &log, json!({}));
    let mut child = command(
        &[
            "chat",
            "--model",
            "openai:mock",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--mcp-config",
            &config,
            "--no-tools",
            "crash",
        ],
        dir.path(),
    )
    .env("OPENAI_API_KEY", "test")
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"/tools\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let listed = String::from_utf8_lossy(&out.stderr);
    let names: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for name in ["read_file", "echo", "add_tool", "destroy"] {
        assert!(names.contains(&name), "{name} missing: {listed}");
    }
    assert!(!names.contains(&"crash"), "--no-tools crash: {listed}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_destructive_call_in_flight_at_sigkill_is_reported_unknown_on_resume_never_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let config = test_server_config(
        dir.path(),
        &log,
        json!({"TOOLLOOP_MCP_TEST_DESTROY_MS": "30000"}),
    );
    let store = dir.path().join("store.db").to_string_lossy().into_owned();
    let mock = Mock::start();
    let url = mock.url();
    let args = [
        "run",
        "--json",
        "--model",
        "openai:mock:rounds=1",
        "--base-url",
        &url,
        "--session",
        "kill",
        "--mcp-config",
        &config,
        "--tools",
        "destroy",
        "go",
    ];
    let mut child = command(&args, dir.path())
        .env("TOOLLOOP_STORE", &store)
        .env("OPENAI_API_KEY", "test")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !log_lines(&log).iter().any(|l| l.starts_with("effect ")) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the call never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the command ended before its call"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let runs = command(&["runs", "--json", "--session", "kill"], dir.path())
        .env("TOOLLOOP_STORE", &store)
        .output()
        .unwrap();
    let runs = json_of(&runs);
    let run_id = runs[0]["run_id"]
        .as_str()
        .expect("the run was logged")
        .to_string();
    let out = command(&["resume", "--json", &run_id], dir.path())
        .env("TOOLLOOP_STORE", &store)
        .env("OPENAI_API_KEY", "test")
        .output()
        .unwrap();
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    assert_eq!(v["tool_calls"][0]["name"], "destroy");
    assert_eq!(v["tool_calls"][0]["status"], "unknown", "{v}");
    let effects = log_lines(&log)
        .iter()
        .filter(|l| l.starts_with("effect "))
        .count();
    assert_eq!(effects, 1, "the destructive call ran again");
    mock.finish();
}

/// A stdio server started in the sandbox (the `toolloop` key of its configuration) writes in
/// its working directory and nowhere else; the same server outside the sandbox writes there.
#[cfg(all(feature = "test-hooks", target_os = "linux"))]
#[tokio::test]
async fn a_sandboxed_stdio_server_cannot_write_outside_its_root() {
    use toolloop::tool::ToolContext;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let (root, outside) = (base.join("root"), base.join("outside"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let server = |sandbox: &str| {
        json!({"mcpServers": {"t": {
            "command": env!("CARGO_BIN_EXE_toolloop-mcp-test-server"),
            "cwd": root,
            "toolloop": {"sandbox": sandbox},
        }}})
    };
    let write = |mcp: toolloop_mcp::McpTools, path: PathBuf| async move {
        let tools = mcp.tools(&[]).await.unwrap();
        let write = tools.iter().find(|t| t.name() == "write").unwrap();
        let out = write
            .call(
                json!({"path": path, "text": "from the server"}),
                ToolContext::detached("c1", "write"),
            )
            .await;
        mcp.shutdown().await;
        out.map(|o| o.message).map_err(|e| e.message)
    };
    let open = |doc: Value| {
        let configs = toolloop_mcp::parse_mcp_servers(&doc, &|_| None).unwrap();
        toolloop_mcp::McpTools::new(configs).unwrap()
    };
    // Outside the sandbox, the write lands.
    let target = outside.join("escaped");
    assert_eq!(
        write(open(server("off")), target.clone()).await.as_deref(),
        Ok("written")
    );
    std::fs::remove_file(&target).unwrap();
    // In it, only the root takes writes.
    let refused = write(open(server("workspace-write")), target.clone()).await;
    let message = refused.unwrap_err();
    assert!(message.contains("Permission denied"), "{message}");
    assert!(!target.exists());
    assert_eq!(
        write(open(server("workspace-write")), root.join("inside"))
            .await
            .as_deref(),
        Ok("written")
    );
    assert_eq!(
        std::fs::read_to_string(root.join("inside")).unwrap(),
        "from the server"
    );
}
