//! The command as people use it every day: the prompt from stdin, short flags, the
//! configuration file, event lines, completions and the manual page.

use crate::common;
use common::{command, json_of, repo, stderr, toolloop};
use std::io::Write;
use std::process::{Output, Stdio};

/// Runs the binary with `stdin` piped in.
fn with_stdin(args: &[&str], dir: &std::path::Path, stdin: &str) -> Output {
    let mut child = command(args, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A script for the scripted model: one tool call, then an answer.
fn script(dir: &std::path::Path) -> String {
    let path = dir.join("script.json");
    std::fs::write(
        &path,
        r#"[{"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
            {"text": "scripted answer"}]"#,
    )
    .unwrap();
    format!("scripted:{}", path.display())
}

#[test]
fn the_first_command_prints_a_short_readable_answer_and_says_no_model_is_set() {
    let dir = repo();
    let out = toolloop(&["run", "What is in this directory?"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.starts_with("I am the offline test model. I called 3 tools:"),
        "{answer}"
    );
    assert!(answer.contains("- read_file returned: "), "{answer}");
    assert!(answer.len() < 1000, "a dump, not a summary: {answer}");
    assert!(
        stderr(&out).contains("no model configured"),
        "{}",
        stderr(&out)
    );
    // A chosen model is not remarked on.
    let out = toolloop(&["run", "-m", "test", "hi"], dir.path());
    assert!(!stderr(&out).contains("no model configured"));
}

#[test]
fn the_prompt_comes_from_stdin_with_a_dash_or_without_an_argument() {
    let dir = repo();
    for args in [&["run", "--json", "-"][..], &["run", "--json"][..]] {
        let out = with_stdin(args, dir.path(), "What is the version?\n");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(json_of(&out)["stop_reason"], "answered");
    }
    let out = with_stdin(&["run", "-"], dir.path(), "  \n");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the prompt on stdin is empty"),
        "{}",
        stderr(&out)
    );
    let mut child = command(&["run", "-"], dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"\xff\xfe").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not UTF-8"), "{}", stderr(&out));
}

#[test]
fn a_system_prompt_file_is_read_and_a_missing_one_is_named() {
    let dir = repo();
    let system = dir.path().join("system.txt");
    std::fs::write(&system, "You are terse.").unwrap();
    let out = toolloop(
        &[
            "run",
            "--jsonl",
            "--system-file",
            system.to_str().unwrap(),
            "hi",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    // The system prompt and the user's message.
    assert_eq!(first["message_count"], 2, "{first}");
    let out = toolloop(&["run", "--system-file", "nope.txt", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--system-file nope.txt"),
        "{}",
        stderr(&out)
    );
    let out = toolloop(
        &[
            "run",
            "-s",
            "x",
            "--system-file",
            system.to_str().unwrap(),
            "hi",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "both is a usage error");
}

#[test]
fn jsonl_prints_every_event_then_the_outcome() {
    let dir = repo();
    let out = toolloop(&["run", "--jsonl", "What is the version?"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"run_started"));
    assert_eq!(types.last(), Some(&"run_finished"));
    assert_eq!(types.iter().filter(|t| **t == "tool_finished").count(), 3);
    let end = lines.last().unwrap();
    assert_eq!(end["stop_reason"], "answered");
    assert_eq!(end["tool_calls"].as_array().unwrap().len(), 3);
    let out = toolloop(&["run", "--json", "--jsonl", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
}

/// The binary with a configuration file holding `text`.
fn configured(text: &str, args: &[&str], dir: &std::path::Path) -> Output {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    command(args, dir)
        .env("TOOLLOOP_CONFIG", &path)
        .output()
        .unwrap()
}

#[test]
fn the_configuration_file_sets_defaults_that_flags_override() {
    let dir = repo();
    let model = script(dir.path());
    let text = format!("model = {model:?}\nmax_rounds = 1\n");
    let out = configured(&text, &["run", "--json", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(json_of(&out)["stop_reason"], "max_rounds");
    let out = configured(
        &text,
        &["run", "--json", "--max-rounds", "5", "hi"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_of(&out)["text"], "scripted answer");
    // The environment beats the file.
    let out = command(&["run", "--json", "hi"], dir.path())
        .env("TOOLLOOP_CONFIG", dir.path().join("config.toml"))
        .env("TOOLLOOP_MODEL", "test")
        .output()
        .unwrap();
    assert_eq!(
        json_of(&out)["rounds"],
        1,
        "the file's max_rounds still applies"
    );
    assert_eq!(json_of(&out)["tool_calls"].as_array().unwrap().len(), 3);
}

#[test]
fn named_models_bring_their_settings() {
    let dir = repo();
    let model = script(dir.path());
    let text =
        format!("model = \"mine\"\n[models.mine]\nmodel = {model:?}\ntool_protocol = \"prompt\"\n");
    let out = configured(&text, &["run", "--json", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_of(&out)["text"], "scripted answer");
    assert!(!stderr(&out).contains("no model configured"));
    let out = configured(&text, &["run", "--json", "-m", "test", "hi"], dir.path());
    assert_eq!(json_of(&out)["tool_calls"].as_array().unwrap().len(), 3);
}

#[test]
fn a_bad_configuration_file_is_a_clear_error() {
    let dir = repo();
    let out = configured("max_roundz = 3\n", &["run", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("unknown key `max_roundz`") && err.contains("config.toml"),
        "{err}"
    );
    let out = configured("model = [\n", &["run", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("config.toml"), "{}", stderr(&out));
    let out = configured(
        "[models.x]\nmodel = \"openai:m\"\napi_key = \"sk-secret-value\"\n",
        &["run", "hi"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("api_key"), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("sk-secret-value"),
        "{}",
        stderr(&out)
    );
    let out = configured("max_rounds = \"many\"\n", &["run", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // `config path` still works with a broken file.
    let out = configured("model = [\n", &["config", "path"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("config.toml"));
}

#[test]
fn config_show_prints_what_the_file_sets() {
    let dir = repo();
    let out = configured(
        "timeout = \"2m\"\n[models.fast]\nmodel = \"openai:gpt-4.1-mini\"\n",
        &["config", "show"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("timeout = \"2m\""), "{shown}");
    assert!(
        shown.contains("[models.fast]") && shown.contains("gpt-4.1-mini"),
        "{shown}"
    );
}

#[test]
fn completions_and_the_manual_page_come_from_the_flags() {
    let dir = repo();
    let out = toolloop(&["completions", "bash"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(
        script.contains("--max-rounds") && script.contains("toolloop"),
        "{script}"
    );
    let out = toolloop(&["man"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH toolloop"), "{page}");
    let pages = dir.path().join("man");
    std::fs::create_dir(&pages).unwrap();
    let out = toolloop(&["man", "--out-dir", pages.to_str().unwrap()], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(pages.join("toolloop-run.1").exists());
}

#[test]
fn debug_requests_logs_each_request_and_response_without_the_key() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap();
    let url = format!("{}/v1", server.base_url());
    let dir = repo();
    let secret = "sk-debug-log-secret-4242";
    for stream in [false, true] {
        let log = dir.path().join(format!("requests-{stream}.jsonl"));
        let mut args = vec![
            "run",
            "--json",
            "-m",
            "openai:mock:rounds=1",
            "--base-url",
            &url,
            "--debug-requests",
            log.to_str().unwrap(),
        ];
        if stream {
            args.push("--stream");
        }
        args.push("go");
        let out = command(&args, dir.path())
            .env("OPENAI_API_KEY", secret)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains(secret), "the key is in the log: {text}");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        let requests: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["event"] == "request").collect();
        assert_eq!(requests.len(), 2, "two model calls: {text}");
        assert_eq!(requests[0]["headers"]["authorization"], "[redacted]");
        assert!(
            requests[0]["body"]["messages"].is_array(),
            "{}",
            requests[0]
        );
        assert_eq!(requests[1]["call"], 2);
        let responses = lines.iter().filter(|l| l["event"] == "response").count();
        assert_eq!(responses, 2, "{text}");
        assert!(lines.iter().all(|l| l["time_ms"].is_u64()));
        let bodies = if stream { "chunk" } else { "body" };
        assert!(
            lines.iter().any(|l| l["event"] == bodies),
            "no {bodies} lines: {text}"
        );
        if !stream {
            let body = lines.iter().find(|l| l["event"] == "body").unwrap();
            assert!(body["body"]["choices"].is_array(), "{body}");
        }
    }
    rt.block_on(server.shutdown());
}
