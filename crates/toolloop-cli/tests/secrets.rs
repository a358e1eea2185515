//! A server that repeats the API key in its error: the key reaches neither the terminal, nor
//! `--json` output, nor the store.

mod common;

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
