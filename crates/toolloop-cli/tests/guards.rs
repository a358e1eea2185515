//! What the command refuses at the start (flags out of range, a malformed base URL, an `--extra`
//! that would replace what the run owns), and how it writes the model's text (exact bytes to a
//! pipe; one final answer even when a stream broke and was asked for again).

use crate::common;

use common::{command, json_of, repo, stderr, toolloop};
use std::path::Path;
use std::process::Output;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exit 2, no panic, and stderr names `flag` and holds `expected`.
fn refused(out: &Output, flag: &str, expected: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
    assert!(!err.contains("panicked"), "{flag}: {err}");
    assert!(err.contains(flag), "the message names {flag}: {err}");
    assert!(err.contains(expected), "{flag}: `{expected}` in {err}");
}

fn run(args: &[&str], dir: &Path) -> Output {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.push("hi");
    toolloop(&all, dir)
}

#[test]
fn absurd_timeouts_are_refused_naming_the_flag() {
    let dir = repo();
    for bad in [
        "1e19",
        "1e30",
        "inf",
        "NaN",
        "0",
        "0s",
        "-5",
        "5 parsecs",
        "31days",
    ] {
        let out = run(&[&format!("--timeout={bad}")], dir.path());
        refused(&out, "--timeout", "");
        assert!(
            stderr(&out).contains("duration") || stderr(&out).contains("timeout"),
            "{bad}: {}",
            stderr(&out)
        );
    }
    let out = run(&["--timeout", "1e19"], dir.path());
    refused(&out, "--timeout", "30 days");
}

#[test]
fn humane_timeouts_are_accepted() {
    let dir = repo();
    for good in ["90", "1.5", "90s", "2m", "1h", "1h 30m", "30days"] {
        let out = run(&["--json", "--timeout", good], dir.path());
        assert_eq!(out.status.code(), Some(0), "{good}: {}", stderr(&out));
        assert_eq!(json_of(&out)["stop_reason"], "answered", "{good}");
    }
}

#[test]
fn numeric_flags_out_of_range_are_refused() {
    let dir = repo();
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--temperature", "NaN"], "--temperature", "0 to 2"),
        (&["--temperature", "inf"], "--temperature", "0 to 2"),
        (&["--temperature=-0.5"], "--temperature", "0 to 2"),
        (&["--temperature", "2.5"], "--temperature", "0 to 2"),
        (&["--max-rounds", "0"], "--max-rounds", "0"),
        (&["--max-rounds", "99999999999"], "--max-rounds", ""),
        (&["--max-output-tokens", "0"], "--max-output-tokens", "0"),
        (
            &["--max-output-tokens", "4000000000"],
            "--max-output-tokens",
            "",
        ),
        (&["--max-tool-calls=-1"], "--max-tool-calls", ""),
    ];
    for (args, flag, expected) in cases {
        let out = run(args, dir.path());
        refused(&out, flag, expected);
    }
    // Anthropic's range is narrower; refused before any request.
    let out = run(
        &[
            "--model",
            "anthropic:m",
            "--base-url",
            "http://127.0.0.1:9",
            "--temperature",
            "1.5",
        ],
        dir.path(),
    );
    refused(&out, "--temperature", "0 to 1");
    let out = toolloop(&["mock", "--latency", "99999999999999"], dir.path());
    refused(&out, "--latency", "");
}

#[test]
fn numeric_flags_in_range_are_accepted() {
    let dir = repo();
    let out = run(
        &[
            "--json",
            "--temperature",
            "0",
            "--max-rounds",
            "4000000000",
            "--max-output-tokens",
            "1000000",
            "--max-tool-calls",
            "0",
        ],
        dir.path(),
    );
    assert!(matches!(out.status.code(), Some(0 | 3)), "{}", stderr(&out));
    json_of(&out);
}

/// A run whose saved configuration holds a timeout no longer accepted (as an older version
/// saved it) resumes, with the timeout brought down to the longest.
#[test]
fn a_saved_absurd_timeout_does_not_stop_a_resume() {
    let dir = repo();
    let store = dir.path().join("store.db");
    let store = store.to_str().unwrap();
    let out = command(&["run", "--json", "--store", store, "hi"], dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run_id = json_of(&out)["run_id"].as_str().unwrap().to_string();
    // Rewrite the saved configuration as an older version would have kept `--timeout 1e19`.
    let sql = format!(
        "UPDATE toolloop_runs SET meta = replace(meta, '\"timeout\":null', \
         '\"timeout\":{{\"secs\":10000000000000000000,\"nanos\":0}}') WHERE run_id = '{run_id}'"
    );
    let sqlite = std::process::Command::new("sqlite3")
        .args([store, &sql])
        .output();
    let Ok(sqlite) = sqlite else {
        eprintln!("sqlite3 is not installed: skipped");
        return;
    };
    assert!(sqlite.status.success(), "{}", stderr(&sqlite));
    let meta = std::process::Command::new("sqlite3")
        .args([
            store,
            &format!("SELECT meta FROM toolloop_runs WHERE run_id = '{run_id}'"),
        ])
        .output()
        .unwrap();
    assert!(
        stdout(&meta).contains("10000000000000000000"),
        "the saved configuration holds the timeout: {}",
        stdout(&meta)
    );
    let out = command(&["resume", "--json", "--store", store, &run_id], dir.path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "{err}");
    assert!(
        err.contains("30 days") || out.status.code() == Some(0),
        "{err}"
    );
}

#[test]
fn a_malformed_base_url_is_refused_naming_the_flag_and_why() {
    let dir = repo();
    let cases = [
        ("http//localhost:8089", "not a URL"),
        ("ftp://localhost:8089", "scheme `ftp`"),
        ("localhost:8089", "http://localhost:8089"),
        ("http://localhost:8089/v1?key=sekrit1", "query"),
        ("http://me:hunter2@localhost:8089/v1#x", "fragment"),
        ("http://localhost:8089/v1#x", "fragment"),
        ("http://", "not a URL"),
    ];
    for provider in ["openai:m", "anthropic:m", "gemini:m"] {
        for (url, why) in cases {
            let out = run(&["--model", provider, "--base-url", url], dir.path());
            refused(&out, "--base-url", why);
            assert!(stderr(&out).contains("http://"), "{}", stderr(&out));
            // The refusal never repeats a key or a password the URL carries.
            for secret in ["sekrit1", "hunter2"] {
                assert!(!stderr(&out).contains(secret), "{}", stderr(&out));
            }
        }
    }
}

#[test]
fn a_malformed_base_url_variable_is_refused_naming_the_variable() {
    let dir = repo();
    for (provider, var) in [
        ("openai:m", "OPENAI_BASE_URL"),
        ("anthropic:m", "ANTHROPIC_BASE_URL"),
        ("gemini:m", "GEMINI_BASE_URL"),
        ("gemini:m", "GOOGLE_GEMINI_BASE_URL"),
    ] {
        let out = command(&["run", "--model", provider, "hi"], dir.path())
            .env_remove("GEMINI_BASE_URL")
            .env(var, "ftp://example.com/v1")
            .output()
            .unwrap();
        refused(&out, var, "scheme `ftp`");
    }
}

#[test]
fn extra_may_not_replace_what_the_run_owns() {
    let dir = repo();
    let cases: &[(&str, &[&str])] = &[
        (
            "openai:m",
            &[
                "messages",
                "tools",
                "tool_choice",
                "stream",
                "stream_options",
                "model",
            ],
        ),
        (
            "anthropic:m",
            &[
                "messages",
                "system",
                "tools",
                "tool_choice",
                "stream",
                "model",
            ],
        ),
        (
            "gemini:m",
            &[
                "contents",
                "systemInstruction",
                "system_instruction",
                "tools",
                "toolConfig",
                "tool_config",
            ],
        ),
    ];
    for (provider, fields) in cases {
        for field in *fields {
            let extra = format!("{{\"top_k\": 5, \"{field}\": []}}");
            let out = run(
                &[
                    "--model",
                    provider,
                    "--base-url",
                    "http://127.0.0.1:9",
                    "--extra",
                    &extra,
                ],
                dir.path(),
            );
            refused(&out, "--extra", &format!("`{field}`"));
        }
        // Other fields are the point of --extra.
        let extra = r#"{"top_k": 5, "metadata": {"a": 1}}"#;
        let out = run(
            &[
                "--model",
                provider,
                "--base-url",
                "http://127.0.0.1:9",
                "--extra",
                extra,
                "--timeout",
                "2s",
            ],
            dir.path(),
        );
        assert_ne!(out.status.code(), Some(2), "{provider}: {}", stderr(&out));
    }
}

fn script(dir: &Path, json: &str) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, json).unwrap();
    format!("scripted:{}", path.display())
}

/// Piped, the answer's bytes are exact, escape sequences and all (the caller decides what to do
/// with data); the diagnostics on stderr, which may quote a server, are escaped.
#[test]
fn piped_answers_are_exact_and_diagnostics_are_escaped() {
    let dir = repo();
    let answer = "Title\x1b]0;owned\x07 \x1b[2J\x1b[31mred\x1b[0m\r\nline \u{202e}two\u{9b}";
    let spec = script(
        dir.path(),
        &serde_json::json!([
            {"tool_calls": [{"name": "evil\u{1b}[2J\u{1b}]0;x\u{7}", "arguments": {}}]},
            {"text": answer},
        ])
        .to_string(),
    );
    for stream in [false, true] {
        let mut args = vec!["run", "--model", &spec];
        if stream {
            args.push("--stream");
        }
        args.push("hi");
        let out = toolloop(&args, dir.path());
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            out.stdout,
            format!("{answer}\n").as_bytes(),
            "stream={stream}"
        );
    }

    let spec = script(
        dir.path(),
        r#"[{"error": "server said \u001b[2J\u001b]0;owned\u0007 gone"}]"#,
    );
    let out = toolloop(&["run", "--model", &spec, "hi"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(!err.contains('\x1b') && !err.contains('\x07'), "{err:?}");
    assert!(
        err.contains("server said \\x1b[2J\\x1b]0;owned\\x07 gone"),
        "{err}"
    );
}

/// A stream cut in the middle of the answer and asked for again: stdout (piped) holds the final
/// answer once, as the transcript does, and not the broken attempt's text before it.
#[test]
fn a_restarted_stream_prints_only_the_final_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let base = server.base_url();
    let dir = repo();
    let answer = "Done. I saw 0 tool results in 0 rounds.";
    let mut cut = 0;
    for seed in 0..40 {
        let before = server.stats().faults.total();
        let model =
            format!("openai:mock:rounds=0,chunk=4,faults=0.5,fault_kinds=cut_call,seed={seed}");
        let url = format!("{base}/v1");
        let out = toolloop(
            &[
                "run",
                "--stream",
                "--model",
                &model,
                "--base-url",
                &url,
                "go",
            ],
            dir.path(),
        );
        if server.stats().faults.total() == before || out.status.code() != Some(0) {
            continue;
        }
        cut += 1;
        assert_eq!(
            stdout(&out),
            format!("{answer}\n"),
            "seed {seed}: {}",
            stderr(&out)
        );
        if cut == 3 {
            break;
        }
    }
    assert!(cut > 0, "no seed gave a cut stream that was then answered");
    rt.block_on(server.shutdown());
}

/// `--system-file`, `--prices` and `--output-schema` read small regular files only: `/dev/zero`
/// and a FIFO are refused at once (they were read forever, or blocked), and so is a file over
/// the limit.
#[cfg(unix)]
#[test]
fn flag_files_are_small_regular_files() {
    let dir = repo();
    let fifo = dir.path().join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let big = dir.path().join("big.txt");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 * 1024 * 1024)
        .unwrap();
    let fifo = fifo.to_str().unwrap();
    let big = big.to_str().unwrap();
    for flag in ["--system-file", "--prices", "--output-schema"] {
        for (path, why) in [
            ("/dev/zero", "not a regular file"),
            (fifo, "not a regular file"),
            (big, "larger than 1 MiB"),
        ] {
            let started = std::time::Instant::now();
            let out = run(&[flag, path], dir.path());
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "{flag} {path}"
            );
            refused(&out, flag, why);
        }
    }
}

#[test]
fn a_glob_of_100000_stars_is_refused_naming_the_flag() {
    let dir = repo();
    let stars = format!("write_file:{}", "*".repeat(100_000));
    for flag in ["--allow", "--deny", "--ask"] {
        let out = run(&[flag, &stars], dir.path());
        refused(&out, flag, "at most 4096");
    }
}

/// The command raises its soft limit on open files to the hard one at start-up (every model call
/// in flight holds a connection): started with a soft limit of 256, it runs with the hard one.
#[cfg(target_os = "linux")]
#[test]
fn the_command_raises_its_open_files_limit() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_toolloop");
    let mut child = std::process::Command::new("sh")
        .args(["-c", "ulimit -Sn 256 && exec \"$0\" mock --port 0", bin])
        .current_dir(dir.path())
        .env("TOOLLOOP_CONFIG", "")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let limits = format!("/proc/{}/limits", child.id());
    // "Max open files            SOFT                 HARD                 files"
    let open_files = || -> Option<(String, String)> {
        let text = std::fs::read_to_string(&limits).ok()?;
        let line = text.lines().find(|l| l.starts_with("Max open files"))?;
        let mut words = line["Max open files".len()..].split_whitespace();
        Some((words.next()?.to_string(), words.next()?.to_string()))
    };
    let started = std::time::Instant::now();
    let mut seen = None;
    while started.elapsed() < std::time::Duration::from_secs(20) {
        let running = std::fs::read_to_string(format!("/proc/{}/comm", child.id()))
            .is_ok_and(|c| c.trim() == "toolloop");
        seen = open_files();
        if running && seen.as_ref().is_some_and(|(soft, hard)| soft == hard) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let (soft, hard) = seen.expect("the command's limits");
    assert_ne!(hard, "256", "the hard limit is 256 here: nothing to raise");
    assert_eq!(soft, hard, "the soft limit stayed below the hard one");
}
