//! The command against local servers as a person meets them, played by the mock: the chat on a
//! terminal (streaming, Ctrl-C, `/tools`), readable errors and logs, empty answers, event
//! lines when a limit stops a run, and resuming a run that had already ended.

use crate::common;
use common::{command, json_of, repo, stderr, toolloop};
use std::io::{Read, Write};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use toolloop_mock::{MockOptions, MockServer};

fn mock(rt: &tokio::runtime::Runtime, options: MockOptions) -> MockServer {
    rt.block_on(toolloop_mock::start(options)).unwrap()
}

/// `run --json` with an OpenAI model of the mock's.
fn run_openai(server: &MockServer, scenario: &str, extra: &[&str]) -> Output {
    let dir = repo();
    let model = format!("openai:{scenario}");
    let url = format!("{}/v1", server.base_url());
    let mut args = vec!["run", "-m", &model, "--base-url", &url];
    args.extend_from_slice(extra);
    args.push("Look around.");
    toolloop(&args, dir.path())
}

#[test]
fn an_empty_answer_says_so_and_fails() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        MockOptions {
            answers: vec![String::new()],
            ..MockOptions::default()
        },
    );
    let out = run_openai(&server, "mock:rounds=0", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stopped: empty_answer: the model answered with nothing"),
        "{}",
        stderr(&out)
    );
    let out = run_openai(&server, "mock:rounds=0", &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "empty_answer");
    assert_eq!(v["error"]["code"], "EMPTY_ANSWER");
}

/// A traceback in an error body reads over several lines, escaped and cut short.
#[test]
fn a_server_traceback_is_printed_over_several_lines() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    let out = run_openai(
        &server,
        "mock:faults=1,fault_kinds=500,traceback=true",
        &["--no-stream"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(!err.contains("\\n"), "no literal \\n: {err}");
    let lines: Vec<&str> = err.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("Traceback (most recent call last):"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(lines[at + 1].starts_with("      File \""), "{err}");
    assert!(
        lines[at + 1..]
            .iter()
            .any(|l| l.starts_with("    ValueError: internal server error")),
        "{err}"
    );
}

/// `-v` gives a short line per step, the tool's name and duration in it, without the spans'
/// telemetry fields; `-vv` adds the arguments and sizes.
#[test]
fn verbose_lines_are_short_and_name_the_tool() {
    let dir = repo();
    let out = toolloop(
        &["run", "-v", "-m", "test", "What is the version?"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("tool call finished") && l.contains("tool=read_file"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(" ms="), "{line}");
    assert!(line.starts_with("toolloop: "), "{line}");
    assert!(!err.contains("gen_ai.") && !err.contains("otel."), "{err}");
    assert!(err.lines().all(|l| l.len() < 300), "{err}");
    assert!(
        !err.contains("arguments="),
        "arguments only from -vv: {err}"
    );
    let out = toolloop(
        &["run", "-vv", "-m", "test", "What is the version?"],
        dir.path(),
    );
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains("tool=read_file") && l.contains("arguments=")),
        "{err}"
    );
    assert!(err.contains("result_chars="), "{err}");
    let out = toolloop(
        &["run", "-vvv", "-m", "test", "What is the version?"],
        dir.path(),
    );
    assert!(stderr(&out).contains("gen_ai.tool.name"), "-vvv shows all");
}

/// A stream restart is in the `-v` log, with its reason.
#[test]
fn a_stream_restart_is_logged() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    let out = run_openai(
        &server,
        "mock:rounds=0,faults=1,fault_kinds=cut_call",
        &["-v", "--stream"],
    );
    let err = stderr(&out);
    assert!(
        err.lines().any(|l| l.contains("stream broke; asking again")
            && l.contains("ended before the response was complete")),
        "{err}"
    );
}

/// `--jsonl` reports the last round's end when a limit stops the run.
#[test]
fn jsonl_has_the_last_round_finished_when_a_limit_stops_the_run() {
    let dir = repo();
    let out = toolloop(
        &["run", "--jsonl", "-m", "test", "--max-rounds", "1", "go"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    let n = types.len();
    assert_eq!(
        &types[n - 2..],
        ["round_finished", "run_finished"],
        "{types:?}"
    );
}

/// `--output-schema` on a server without `json_schema` (llama-cpp-python's 500): the run goes
/// through `json_object`, says so, and prints the validated JSON.
#[test]
fn an_output_schema_falls_back_to_json_object_and_says_so() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(
        &rt,
        MockOptions {
            answers: vec![r#"{"version": "1.2.3"}"#.into()],
            ..MockOptions::default()
        },
    );
    let dir = repo();
    let schema = dir.path().join("answer.schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"version": {"type": "string"}}, "required": ["version"]}"#,
    )
    .unwrap();
    let model = "openai:mock:refuse_json_schema=true,rounds=0";
    let url = format!("{}/v1", server.base_url());
    let out = toolloop(
        &[
            "run",
            "-m",
            model,
            "--base-url",
            &url,
            "--output-schema",
            schema.to_str().unwrap(),
            "What is the version?",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"version":"1.2.3"}"#
    );
    assert!(
        stderr(&out).contains("asking for `json_object` with the schema in the prompt"),
        "{}",
        stderr(&out)
    );
    // The server's error reads as one line of words, not escaped newlines.
    let warning = stderr(&out);
    let warning = warning.lines().find(|l| l.contains("json_schema")).unwrap();
    assert!(
        warning.contains("1 validation error: {'type': 'literal_error'")
            && !warning.contains("\\n"),
        "{warning}"
    );
    assert_eq!(server.stats().requests, 2);
}

/// Resuming a run that had ended without its goal says so and how, instead of replaying its
/// error as new; a failed run is listed as failed.
#[test]
fn resuming_a_run_that_had_ended_says_so() {
    let dir = repo();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    let url = format!("{}/v1", server.base_url());
    let out = toolloop(
        &[
            "run",
            "--json",
            "-m",
            "openai:mock:rounds=5",
            "--base-url",
            &url,
            "--max-rounds",
            "1",
            "--session",
            "limited",
            "hello",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "max_rounds");
    let id = v["run_id"].as_str().unwrap().to_string();
    let out = toolloop(&["resume", &id], dir.path());
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("run {id} had already ended (max_rounds")),
        "{err}"
    );
    assert!(err.contains("nothing to resume"), "{err}");
    let out = toolloop(&["resume", &id, "--json"], dir.path());
    let v = json_of(&out);
    assert_eq!(
        (&v["already_ended"], &v["stop_reason"], &v["error"]["code"]),
        (&true.into(), &"max_rounds".into(), &"ALREADY_ENDED".into())
    );
    let out = toolloop(&["runs", "--session", "limited"], dir.path());
    let listed = String::from_utf8_lossy(&out.stdout);
    let row = listed.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(row.contains(" failed "), "{row}");
}

/// A server that answers once with a tool call and then fails every request (HTTP 400): the
/// number of requests it saw.
fn failing_after_one_call() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (status, body) = if n == 0 {
                let call = serde_json::json!({"id": "c1", "object": "chat.completion",
                    "created": 0, "model": "m", "choices": [{"index": 0, "finish_reason":
                    "tool_calls", "message": {"role": "assistant", "content": null,
                    "tool_calls": [{"id": "call_1", "type": "function", "function":
                    {"name": "list_dir", "arguments": "{\"path\": \".\"}"}}]}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
                ("200 OK", call.to_string())
            } else {
                let error = serde_json::json!({"error": {"message": "the server went wrong",
                    "type": "invalid_request_error"}});
                ("400 Bad Request", error.to_string())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, seen)
}

/// A run that failed on a model error, after a round of tool calls, is continued by `resume`
/// in a new run from its log: the failed model call is made again (to the server now given)
/// and nothing the run did is made or run again; the session goes on from it.
#[test]
fn resuming_a_run_that_failed_on_a_model_error_continues_it() {
    let dir = repo();
    let (failing, seen) = failing_after_one_call();
    let out = toolloop(
        &[
            "run",
            "--json",
            "--no-stream",
            "-m",
            "openai:mock",
            "--base-url",
            &failing,
            "--connect-retry",
            "0",
            "--session",
            "down",
            "hello",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "model_error", "{v}");
    assert_eq!(v["tool_calls"][0]["name"], "list_dir", "{v}");
    assert_eq!(v["tool_calls"][0]["success"], true, "{v}");
    let failed = v["run_id"].as_str().unwrap().to_string();
    let made = seen.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(made, 2, "one answer, then the failed call");

    // The server is back (the mock): the run goes on where it failed.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    let url = format!("{}/v1", server.base_url());
    let out = toolloop(
        &["resume", &failed, "--json", "--base-url", &url],
        dir.path(),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("run {failed} had failed on a model error"))
            && err.contains("continuing it in a new run from its log"),
        "{err}"
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    let continued = v["run_id"].as_str().unwrap().to_string();
    assert_ne!(continued, failed);
    assert!(
        err.contains(&format!("run {failed} was continued as run {continued}")),
        "{err}"
    );
    // Nothing was run again: the new run made one model call (the failed one) and no tool call.
    assert_eq!(v["tool_calls"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(server.stats().requests, 1);
    assert_eq!(
        server.stats().rejected,
        0,
        "the mock saw an invalid transcript"
    );
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), made);
    // The session holds the whole turn: the listing's result and the answer.
    let out = toolloop(&["runs", "--session", "down"], dir.path());
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&failed) && l.contains(" failed "))
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&continued) && l.contains(" finished "))
    );
    // The failed run is continued once: its session has moved on since.
    let out = toolloop(&["resume", &failed, "--base-url", &url], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("session down has had other turns saved"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.stats().requests, 1);
    rt.block_on(server.shutdown());
}

/// Chat on stdin: `/tools` lists one line per tool, `/tools NAME` the whole description.
#[test]
fn chat_tools_are_one_line_each_and_whole_by_name() {
    let dir = repo();
    let mut child = command(&["chat", "-m", "test"], dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"/tools\n/tools read_file\n/tools nope\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    let listed: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("read_file ") || l.starts_with("list_dir "))
        .collect();
    assert_eq!(listed.len(), 2, "{err}");
    assert!(listed.iter().all(|l| l.len() < 140), "{listed:?}");
    assert!(err.contains("\nread_file\n\n"), "the whole entry: {err}");
    assert!(err.contains("parameters: {"), "{err}");
    assert!(err.contains("no tool named nope"), "{err}");
}

/// Runs `toolloop chat …` on a pseudo-terminal (through `script`), typing into it.
struct Pty {
    child: std::process::Child,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Pty {
    /// `None` when `script` (util-linux) is not there.
    fn chat(args: &[&str], dir: &std::path::Path, env: &[(&str, &str)]) -> Option<Pty> {
        let exe = env!("CARGO_BIN_EXE_toolloop");
        let quoted: Vec<String> = std::iter::once(exe)
            .chain(args.iter().copied())
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect();
        let mut child = std::process::Command::new("script")
            // `exec`: no shell stays in between (one would take the terminal's Ctrl-C too, and
            // exit 130 after the chat).
            .args([
                "-q",
                "-f",
                "-e",
                "-c",
                &format!("exec {}", quoted.join(" ")),
                "/dev/null",
            ])
            .env_clear()
            .envs(
                [
                    ("PATH", std::env::var("PATH").unwrap_or_default()),
                    ("TERM", "xterm".into()),
                    ("TOOLLOOP_STORE", common::test_store()),
                    ("TOOLLOOP_CONFIG", String::new()),
                    ("HOME", dir.display().to_string()),
                ]
                .into_iter()
                .chain(env.iter().map(|(k, v)| (*k, v.to_string()))),
            )
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut out = child.stdout.take().unwrap();
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Some(Pty { child, output })
    }

    /// Types `bytes` as a person does, one key at a time (a line editor fed a whole line in one
    /// read right after its prompt may stall on a pseudo-terminal).
    fn type_in(&mut self, bytes: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        for b in bytes {
            stdin.write_all(&[*b]).unwrap();
            stdin.flush().unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    fn shown(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the screen shows `what` (after `from` bytes), for at most `limit`.
    fn wait_for(&self, what: &str, from: usize, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.shown().get(from..).is_some_and(|s| s.contains(what)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// On a terminal the chat streams its replies, and Ctrl-C (the terminal's, typed into the
/// pseudo-terminal) cancels a reply at once, takes its text back, and the prompt returns.
#[test]
fn on_a_terminal_the_chat_streams_and_ctrl_c_cancels_the_reply() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    let dir = repo();
    let url = format!("{}/v1", server.base_url());
    // A slow reply: one character every 150 ms.
    let Some(mut pty) = Pty::chat(
        &[
            "chat",
            "-m",
            "openai:mock:rounds=0,chunk=1,chunk_delay=150ms",
            "--base-url",
            &url,
        ],
        dir.path(),
        &[],
    ) else {
        eprintln!("no `script` command: the pseudo-terminal test cannot run here");
        return;
    };
    assert!(
        pty.wait_for("> ", 0, Duration::from_secs(10)),
        "{}",
        pty.shown()
    );
    std::thread::sleep(Duration::from_millis(300));
    let before = pty.shown().len();
    pty.type_in(b"hello\r");
    // Streamed: the reply's first words come long before its end.
    assert!(
        pty.wait_for("Done. I", before, Duration::from_secs(10)),
        "the reply streams: {}",
        pty.shown()
    );
    assert!(
        !pty.shown()[before..].contains("rounds."),
        "streamed: its beginning is shown before its end: {}",
        pty.shown()
    );
    let cancel_at = pty.shown().len();
    let pressed = Instant::now();
    pty.type_in(b"\x03");
    assert!(
        pty.wait_for("cancelling", cancel_at, Duration::from_secs(3)),
        "Ctrl-C is heard: {}",
        pty.shown()
    );
    assert!(
        pty.wait_for("stopped: cancelled", cancel_at, Duration::from_secs(3)),
        "{}",
        pty.shown()
    );
    assert!(pressed.elapsed() < Duration::from_secs(4));
    let after = pty.shown();
    assert!(
        !after[cancel_at..].contains("rounds."),
        "the reply did not run on: {after}"
    );
    // The unfinished reply was taken back: an erase back to where it began.
    assert!(after[cancel_at..].contains("\x1b[J"), "{after:?}");
    assert!(
        pty.wait_for("> ", cancel_at, Duration::from_secs(3)),
        "the prompt is back: {after}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let end = pty.shown().len();
    pty.type_in(b"/exit\r");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(status)) = pty.child.try_wait() {
            assert!(status.success(), "{status:?}: {}", &pty.shown()[end..]);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the chat did not quit: {}", pty.shown());
}

/// `--tool-protocol native` (the default) against a server that drops the catalog without a
/// word: the reply's prompt tokens tell it, and a warning says the model did not see the tools
/// and which protocol would let it, streamed or not; a server that keeps them gets no warning.
#[test]
fn native_calling_warns_when_the_server_drops_the_tools() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    for stream in [&["--no-stream"][..], &["--stream"][..]] {
        let mut extra = vec!["--json", "--tool-protocol", "native"];
        extra.extend_from_slice(stream);
        let out = run_openai(&server, "mock:drop_tools=true", &extra);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert_eq!(
            err.matches("the server ignored the tools").count(),
            1,
            "{stream:?}: {err}"
        );
        assert!(
            err.contains("prompt tokens, fewer than the tool catalog alone takes")
                && err.contains("--tool-protocol auto or prompt"),
            "{stream:?}: {err}"
        );
        let v = json_of(&out);
        assert_eq!(v["tool_calls"].as_array().map(Vec::len), Some(0), "{v}");
        let out = run_openai(&server, "mock", &extra);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            !stderr(&out).contains("ignored the tools"),
            "{}",
            stderr(&out)
        );
        assert_eq!(
            json_of(&out)["tool_calls"].as_array().map(Vec::len),
            Some(1)
        );
        // llama-cpp-python's chatml-function-calling: calls work, text answers are empty.
        let out = run_openai(&server, "mock:empty_auto_answer=true", &extra);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("answered a request with tools with nothing")
                && err.contains("--tool-protocol auto or prompt"),
            "{stream:?}: {err}"
        );
        assert_eq!(json_of(&out)["stop_reason"], "empty_answer");
    }
    assert_eq!(server.stats().rejected, 0);
}

/// The test certificates (see `tests/data/tls/README.md`).
fn tls_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

/// A TLS server's configuration with the test authority's certificate for `127.0.0.1`.
fn tls_config() -> std::sync::Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_file(tls_file("server.pem")).unwrap()];
    let key = PrivateKeyDer::from_pem_file(tls_file("server.key")).unwrap();
    std::sync::Arc::new(
        rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    )
}

/// A model server on `https://127.0.0.1:PORT` (the test authority's certificate) that answers
/// every request with `text`; its port.
fn tls_server(text: &'static str) -> u16 {
    serve_each(move |tcp, config| {
        let conn = rustls::ServerConnection::new(config).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        // The request: its head, then as many bytes as it says (a client that refused
        // the certificate ends here).
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let body_at = loop {
            match tls.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&got[..body_at]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while got.len() < body_at + length {
            match tls.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let body = serde_json::json!({
            "id": "tls-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        })
        .to_string();
        let _ = write!(
            tls,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tls.flush();
        tls.conn.send_close_notify();
        let _ = tls.flush();
    })
}

/// A server on `127.0.0.1:PORT` that hands each connection, on a thread of its own, to
/// `handle` with the test authority's TLS configuration; its port.
fn serve_each(
    handle: impl Fn(std::net::TcpStream, std::sync::Arc<rustls::ServerConfig>) + Send + Sync + 'static,
) -> u16 {
    let config = tls_config();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::sync::Arc::new(handle);
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, handle) = (config.clone(), handle.clone());
            std::thread::spawn(move || handle(tcp, config));
        }
    });
    port
}

/// The system's root certificates are read at the first `https://` connection only: a system
/// without any (a slim container) still reaches a model server on `http://`, and an `https://`
/// server's certificate is checked against the roots the system gives (`SSL_CERT_FILE` here),
/// refused when they do not vouch for it, with a message naming the roots when there are none.
#[test]
fn root_certificates_are_read_for_https_only_and_still_checked() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, MockOptions::default());
    let no_dir = tempfile::tempdir().unwrap();
    let run = |base_url: &str, roots: &std::path::Path| {
        let dir = repo();
        command(
            &[
                "run",
                "--json",
                "--no-store",
                "--connect-retry",
                "0",
                "-m",
                "openai:mock:rounds=0",
                "--base-url",
                base_url,
                "Hello.",
            ],
            dir.path(),
        )
        .env("SSL_CERT_FILE", roots)
        .env("SSL_CERT_DIR", no_dir.path())
        .output()
        .unwrap()
    };
    let none = std::path::Path::new("/dev/null");
    let out = run(&format!("{}/v1", server.base_url()), none);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_of(&out)["stop_reason"], "answered");

    let https = format!("https://127.0.0.1:{}/v1", tls_server("over TLS"));
    let out = run(&https, &tls_file("ca.pem"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json_of(&out)["text"], "over TLS");
    // A root that did not sign the server's certificate.
    let out = run(&https, &tls_file("server.pem"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json_of(&out);
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("certificate") && message.contains("UnknownIssuer"),
        "{v}\n{}",
        stderr(&out)
    );
    let out = run(&https, none);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json_of(&out);
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("root certificates could not be read")
            && message.contains("SSL_CERT_FILE"),
        "{v}\n{}",
        stderr(&out)
    );
}

/// A PostgreSQL server on `127.0.0.1:PORT` as far as its TLS: it accepts the client's
/// `SSLRequest`, completes the handshake with the test authority's certificate, reads the
/// startup message and refuses it with an `ErrorResponse` (SQLSTATE 28000) whose message is
/// `refusal`; its port.
fn postgres_tls_server(refusal: &'static str) -> u16 {
    serve_each(move |mut tcp, config| {
        // SSLRequest: length 8, then the code 80877103.
        let mut request = [0u8; 8];
        if tcp.read_exact(&mut request).is_err() || request != [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]
        {
            return;
        }
        if tcp.write_all(b"S").is_err() {
            return;
        }
        let conn = rustls::ServerConnection::new(config).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        // The startup message: its length (itself included), then the rest (a client
        // that refused the certificate ends here).
        let mut length = [0u8; 4];
        if tls.read_exact(&mut length).is_err() {
            return;
        }
        let rest = (u32::from_be_bytes(length) as usize).saturating_sub(4);
        let mut startup = vec![0u8; rest];
        if tls.read_exact(&mut startup).is_err() {
            return;
        }
        let mut fields = Vec::new();
        for (code, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', "28000")]
            .into_iter()
            .chain([(b'M', refusal)])
        {
            fields.push(code);
            fields.extend_from_slice(value.as_bytes());
            fields.push(0);
        }
        fields.push(0);
        let mut reply = vec![b'E'];
        reply.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
        reply.extend_from_slice(&fields);
        let _ = tls.write_all(&reply);
        let _ = tls.flush();
        tls.conn.send_close_notify();
        let _ = tls.flush();
    })
}

/// A PostgreSQL store's server certificate is checked against the system's roots
/// (`SSL_CERT_FILE` here), as the command's HTTPS is: a server the roots vouch for is reached
/// (its refusal of the login is what the command reports), one they do not is refused as a
/// certificate error before the login is sent.
#[test]
fn a_postgres_store_checks_the_server_against_the_system_roots() {
    let port = postgres_tls_server("toolloop test server: no such role");
    let no_dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://someone@127.0.0.1:{port}/db?sslmode=verify-full");
    let list = |roots: &std::path::Path| {
        let dir = repo();
        command(&["sessions", "list", "--store", &url], dir.path())
            .env("SSL_CERT_FILE", roots)
            .env("SSL_CERT_DIR", no_dir.path())
            .output()
            .unwrap()
    };
    let out = list(&tls_file("ca.pem"));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("toolloop test server: no such role"),
        "{}",
        stderr(&out)
    );
    // A root that did not sign the server's certificate.
    let out = list(&tls_file("server.pem"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("UnknownIssuer") && !err.contains("no such role"),
        "{err}"
    );
}
