//! A server that repeats the API key in its error: the key reaches neither the terminal, nor
//! `--json` output, nor the store.

use crate::common;

use common::{command, repo};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

const KEY: &str = "sk-CLI-SECRET/0123456789+abcdefghij";

/// Reads one request's head and body; returns the head.
fn read_request(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return String::new(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf.len() - head_end;
    while body < length {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => body += n,
        }
    }
    head
}

/// A server on 127.0.0.1 that answers every request with a 401 quoting the key it was sent,
/// in the error shape of every provider at once. Returns its port.
fn echoing_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let head = read_request(&mut stream);
            let key = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    ["authorization", "x-api-key", "x-goog-api-key"]
                        .contains(&n.trim().to_ascii_lowercase().as_str())
                        .then(|| v.trim().trim_start_matches("Bearer ").to_string())
                })
                .unwrap_or_default();
            let encoded = key.replace('/', "%2F").replace('+', "%2B");
            let message = format!(
                "Incorrect API key provided: {key}. See https://auth.example/?key={encoded}"
            );
            let body = serde_json::json!({
                "type": "error",
                "error": {"type": "authentication_error", "code": 401, "message": message,
                          "status": "UNAUTHENTICATED"}
            })
            .to_string();
            let response = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

/// Whether `bytes` hold a recognisable piece of the key.
fn leaks(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    ["CLI-SECRET", "0123456789", "abcdefghij"]
        .iter()
        .any(|piece| text.contains(piece))
}

#[test]
fn a_key_echoed_by_the_server_is_never_printed_or_stored() {
    let port = echoing_server();
    let dir = repo();
    let store_dir = tempfile::tempdir().unwrap();
    let store = store_dir.path().join("store.db");
    let store = store.to_str().unwrap();
    for (provider, base) in [
        ("openai", format!("http://127.0.0.1:{port}/v1")),
        ("anthropic", format!("http://127.0.0.1:{port}")),
        ("gemini", format!("http://127.0.0.1:{port}")),
    ] {
        for json in [true, false] {
            let model = format!("{provider}:m");
            let mut args = vec![
                "run",
                "--model",
                &model,
                "--base-url",
                &base,
                "--api-key-env",
                "TOOLLOOP_TEST_SECRET_KEY",
                "--store",
                store,
            ];
            if json {
                args.push("--json");
            }
            args.push("hello");
            let out = command(&args, dir.path())
                .env("TOOLLOOP_TEST_SECRET_KEY", KEY)
                .output()
                .expect("the binary runs");
            let what = format!("{provider} json={json}");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_ne!(out.status.code(), Some(0), "{what}: {stdout} {stderr}");
            assert!(
                format!("{stdout}{stderr}").contains("401"),
                "{what}: the error is reported: {stdout} {stderr}"
            );
            assert!(!leaks(&out.stdout), "{what}: the key on stdout: {stdout}");
            assert!(!leaks(&out.stderr), "{what}: the key on stderr: {stderr}");
        }
    }
    // Nothing in the store, its journal files included, holds the key.
    let mut files = 0;
    for entry in std::fs::read_dir(store_dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(!leaks(&bytes), "the key in {}", path.display());
        files += 1;
    }
    assert!(files > 0, "the runs were stored");
}

/// Whether a JSON-lines file holds a piece of the key once each line is decoded (a key written
/// with `\u` escapes is a key all the same).
fn leaks_decoded(text: &str) -> bool {
    text.lines().any(|line| {
        let decoded = serde_json::from_str::<serde_json::Value>(line)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| line.to_string());
        leaks(decoded.as_bytes())
    })
}

/// A server that answers every request with a 401 quoting the key it was sent with every
/// character written as a JSON `\u` escape. Returns its port.
fn escaping_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let head = read_request(&mut stream);
            let key = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.trim()
                        .eq_ignore_ascii_case("authorization")
                        .then(|| v.trim().trim_start_matches("Bearer ").to_string())
                })
                .unwrap_or_default();
            let escaped: String = key
                .chars()
                .map(|c| format!("\\u{:04x}", c as u32))
                .collect();
            let body = format!(
                r#"{{"error": {{"type": "invalid_request_error", "message": "Incorrect API key provided: {escaped}"}}}}"#
            );
            let response = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

/// The debug log redacts the decoded body: a key the server wrote with `\u` escapes is not
/// stored (the server did get the key: its echo is what is redacted).
#[test]
fn the_debug_log_redacts_a_key_echoed_with_json_escapes() {
    let port = escaping_server();
    let dir = repo();
    let log = dir.path().join("requests.jsonl");
    let base = format!("http://127.0.0.1:{port}/v1");
    let out = command(
        &[
            "run",
            "--model",
            "openai:m",
            "--base-url",
            &base,
            "--debug-requests",
            log.to_str().unwrap(),
            "--no-store",
            "hello",
        ],
        dir.path(),
    )
    .env("OPENAI_API_KEY", KEY)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("401"), "{stderr}");
    assert!(!leaks(&out.stderr), "{stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(r#""status":401"#),
        "the exchange is logged: {text}"
    );
    assert!(text.contains("[redacted]"), "the echo is redacted: {text}");
    assert!(!leaks_decoded(&text), "the key in the debug log: {text}");
}

/// A key the model repeats in its answer (plain, streamed or not) is neither printed nor
/// stored.
#[test]
fn a_key_in_the_models_answer_is_redacted() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions {
            answers_by_prompt: vec![toolloop_mock::MockAnswer {
                when: "hello".into(),
                text: format!("Your key is {KEY}, keep it safe."),
            }],
            ..Default::default()
        }))
        .unwrap();
    let base = format!("{}/v1", server.base_url());
    let dir = repo();
    let store_dir = tempfile::tempdir().unwrap();
    let store = store_dir.path().join("store.db");
    for flags in [&["--json"][..], &["--stream"], &[]] {
        let mut args = vec![
            "run",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--store",
            store.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        args.push("hello");
        let out = command(&args, dir.path())
            .env("OPENAI_API_KEY", KEY)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {stdout} {stderr}");
        assert!(
            stdout.contains("keep it safe"),
            "{flags:?}: the answer: {stdout}"
        );
        assert!(stdout.contains("[redacted]"), "{flags:?}: {stdout}");
        assert!(
            !leaks(&out.stdout),
            "{flags:?}: the key on stdout: {stdout}"
        );
        assert!(
            !leaks(&out.stderr),
            "{flags:?}: the key on stderr: {stderr}"
        );
    }
    for entry in std::fs::read_dir(store_dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(!leaks(&bytes), "the key in {}", path.display());
    }
    rt.block_on(server.shutdown());
}

/// Passwords in a store URL or a base URL are not printed: not in the error of a store that
/// cannot be opened, not by `config show`.
#[test]
fn store_and_base_url_passwords_are_not_printed() {
    let dir = repo();
    // A server that is not PostgreSQL: it answers the client's first message with bytes of
    // another protocol, so opening the store fails at once. (A refused connection gives the
    // same error, but only when the pool gives up retrying, 15 seconds later.)
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut first = [0u8; 8];
            let _ = stream.read_exact(&mut first);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let url = format!("postgres://me:pw-CLI-SECRET-1@127.0.0.1:{port}/db?password=abcdefghij-2");
    let out = command(&["runs", "--store", &url], dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("cannot open the store"), "{stderr}");
    assert!(!leaks(&out.stderr), "{stderr}");
    assert!(!leaks(&out.stdout));

    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "store = \"{url}\"\n\n[models.local]\nmodel = \"openai:m\"\n\
             base_url = \"http://me:bu-CLI-SECRET-3@127.0.0.1:8/v1\"\n"
        ),
    )
    .unwrap();
    let out = command(&["config", "show"], dir.path())
        .env("TOOLLOOP_CONFIG", &config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!("127.0.0.1:{port}/db")),
        "the store is shown: {stdout}"
    );
    assert!(stdout.contains("[redacted]"), "{stdout}");
    assert!(!leaks(&out.stdout), "{stdout}");
}

/// `--debug-requests FILE`: a symbolic link is not followed, a FIFO does not block, and the
/// file is made readable by its owner only.
#[cfg(unix)]
#[test]
fn the_debug_log_file_is_a_private_regular_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = repo();
    let target = dir.path().join("elsewhere.txt");
    std::fs::write(&target, "untouched").unwrap();
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fifo = dir.path().join("fifo.jsonl");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for (path, why) in [(&link, "symbolic link"), (&fifo, "not a regular file")] {
        let started = std::time::Instant::now();
        let out = command(
            &[
                "run",
                "--no-store",
                "--debug-requests",
                path.to_str().unwrap(),
                "hi",
            ],
            dir.path(),
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(
            stderr.contains("--debug-requests") && stderr.contains(why),
            "{stderr}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");

    let log = dir.path().join("open.jsonl");
    std::fs::write(&log, "").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = command(
        &[
            "run",
            "--no-store",
            "--debug-requests",
            log.to_str().unwrap(),
            "hi",
        ],
        dir.path(),
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
}

/// Keys leave the process's environment at start: `/proc/<pid>/environ` of the running
/// command holds none, and neither does a command's (`run_command`) environment. The rule:
/// names containing KEY, TOKEN, SECRET, PASSWORD…, the `--api-key-env` variable, and URLs with
/// credentials. The key still reaches the provider.
#[cfg(target_os = "linux")]
#[test]
fn keys_leave_the_process_environment_and_never_reach_commands() {
    use serde_json::json;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let call = |command: serde_json::Value| toolloop_mock::ScriptCall {
        name: "run_command".into(),
        arguments: json!({ "command": command }),
    };
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions {
            script: vec![
                vec![call(json!(["cp", "/proc/self/environ", "child-env.txt"]))],
                vec![call(json!(["sleep", "3"]))],
            ],
            ..Default::default()
        }))
        .unwrap();
    let base = format!("{}/v1", server.base_url());
    let dir = repo();
    let secrets = [
        ("TOOLLOOP_TEST_LLM_CRED", "cred-SECRET-0001".to_string()),
        ("OPENAI_API_KEY", "sk-SECRET-0002".to_string()),
        ("APIKEY", "apikey-SECRET-0003".to_string()),
        (
            "https_proxy",
            "http://user:proxy-SECRET-0004@127.0.0.1:9".to_string(),
        ),
        (
            "MIRROR_URL",
            "https://mirror.example/x?token=url-SECRET-0005".to_string(),
        ),
    ];
    let mut cmd = command(
        &[
            "run",
            "--json",
            "--no-store",
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--api-key-env",
            "TOOLLOOP_TEST_LLM_CRED",
            "--allow-commands",
            "--allow",
            "run_command:cp *",
            "--allow",
            "run_command:sleep *",
            "go",
        ],
        dir.path(),
    );
    for (k, v) in &secrets {
        cmd.env(k, v);
    }
    let child = cmd
        .env("no_proxy", "127.0.0.1,localhost")
        .env("TOOLLOOP_TEST_HARMLESS", "visible")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let copied = dir.path().join("child-env.txt");
    let started = std::time::Instant::now();
    while std::fs::metadata(&copied).map_or(true, |m| m.len() == 0) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the command did not run"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The second command (sleep 3) runs: the process is there to be read.
    let own = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = std::fs::read(&copied).unwrap();
    for (what, env) in [
        ("toolloop's /proc environ", &own),
        ("the command's", &theirs),
    ] {
        let text = String::from_utf8_lossy(env).replace('\0', "\n");
        assert!(
            text.contains("TOOLLOOP_TEST_HARMLESS=visible"),
            "{what}: {text}"
        );
        assert!(!text.contains("SECRET-000"), "{what} holds a key: {text}");
    }
    rt.block_on(server.shutdown());
}

/// The key named by `--api-key-env` (a name no pattern matches) still reaches the provider
/// after the process restarted without it: the server's echo of it is what is redacted.
#[test]
fn the_key_still_reaches_the_provider() {
    let port = echoing_server();
    let dir = repo();
    let base = format!("http://127.0.0.1:{port}/v1");
    let out = command(
        &[
            "run",
            "--no-store",
            "--model",
            "openai:m",
            "--base-url",
            &base,
            "--api-key-env",
            "TOOLLOOP_TEST_LLM_CRED",
            "hello",
        ],
        dir.path(),
    )
    .env("TOOLLOOP_TEST_LLM_CRED", KEY)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Incorrect API key provided: [redacted]"),
        "the server got the key: {stderr}"
    );
    assert!(!leaks(&out.stderr), "{stderr}");
}

/// The command is not dumpable: its `/proc/<pid>` files belong to root, so that no other
/// process of its user reads its memory (where the keys are). Run as another user when the
/// tests run as root, to see the difference.
#[cfg(target_os = "linux")]
#[test]
fn the_process_is_not_dumpable() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let bin = env!("CARGO_BIN_EXE_toolloop");
    let mut cmd = if root {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin]);
        c
    } else {
        std::process::Command::new(bin)
    };
    let mut child = cmd
        .args(["mock", "--port", "0"])
        .current_dir(dir.path())
        .env("TOOLLOOP_CONFIG", "")
        // A key in the environment: the command starts itself again without it, and keeps
        // its name (`toolloop`, not `exe`) in the process table.
        .env("OPENAI_API_KEY", "sk-dumpable-test-key")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let status = format!("/proc/{pid}/status");
    let started = std::time::Instant::now();
    let mut owner = None;
    while started.elapsed() < std::time::Duration::from_secs(10) {
        // Once the program runs (the user switched), its files' owner says whether it is
        // dumpable.
        let running = std::fs::read_to_string(&status).is_ok_and(|s| s.contains("toolloop"));
        if running {
            let uid = std::fs::metadata(format!("/proc/{pid}/environ")).map(|m| m.uid());
            owner = uid.ok();
            if owner == Some(0) {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(owner, Some(0), "the process stayed dumpable");
}
