//! The `toolloop` command, run as a user would.

use crate::common;
use common::{json_of, mock, repo, toolloop};

#[test]
fn test_model_runs_offline_and_answers() {
    let dir = repo();
    let out = toolloop(&["run", "--json", "What is the version?"], dir.path());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered");
    assert_eq!(v["rounds"], 2);
    let names: Vec<&str> = v["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", "list_dir", "search_files"]);
    assert!(
        v["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["success"] == true)
    );
    assert!(
        v["text"]
            .as_str()
            .unwrap()
            .contains("I called 3 tools:\n- read_file returned: "),
        "{v}"
    );
    assert!(
        v["tool_calls"][0]["result"]
            .to_string()
            .contains("version 1.2.3")
    );
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(v["usage"]["output_tokens"].as_u64().is_some());
    assert!(v["duration_ms"].as_u64().is_some());
    assert!(v.get("error").is_none());
}

#[test]
fn plain_output_prints_the_answer() {
    let dir = repo();
    let out = toolloop(&["run", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("- list_dir returned: "), "{stdout}");
}

#[test]
fn scripted_runs_hit_budgets_with_exit_3() {
    let dir = repo();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        r#"[{"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
            {"tool_calls": [{"name": "list_dir", "arguments": {}}]},
            {"text": "never"}]"#,
    )
    .unwrap();
    let spec = format!("scripted:{}", script.display());
    let out = toolloop(
        &["run", "--json", "--model", &spec, "--max-rounds", "1", "x"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(3));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "max_rounds");
    assert_eq!(v["error"]["code"], "MAX_ITERATIONS_REACHED");
    assert_eq!(v["tool_calls"][0]["name"], "read_file");
    assert_eq!(v["tool_calls"][0]["arguments"]["path"], "README.md");
    assert_eq!(v["tool_calls"][0]["result"]["success"], true);
}

#[test]
fn a_script_that_runs_out_is_a_model_error_with_exit_1() {
    let dir = repo();
    let script = dir.path().join("s.json");
    std::fs::write(&script, r#"[{"tool_calls": [{"name": "list_dir"}]}]"#).unwrap();
    let spec = format!("scripted:{}", script.display());
    let out = toolloop(&["run", "--json", "--model", &spec, "x"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "model_error");
    assert_eq!(v["error"]["code"], "LLM_CALL_FAILED");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ran out of responses")
    );
    assert_eq!(v["rounds"], 2);
}

#[test]
fn bad_usage_and_configuration_exit_2_with_a_clear_message() {
    let dir = repo();
    let out = toolloop(&["run", "--model", "nope:x", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown model `nope:x`"));
    let out = toolloop(&["run", "--max-rounds", "lots", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let out = toolloop(&["run", "--timeout", "-1", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let out = toolloop(&["run", "--root", "/no/such/dir", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let out = toolloop(
        &["run", "--model", "scripted:/no/such.json", "hi"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the script"));
}

/// An error is said once, in `main`, as `toolloop: ` and what was being done followed by its
/// cause, with the exit code of its kind; a name the user (or a project) gave that holds
/// control characters is shown escaped, never sent to the terminal.
#[test]
fn an_error_is_said_once_with_its_cause_and_escaped() {
    let dir = repo();
    let hostile = "notes\u{1b}]0;owned\u{7}\u{1b}[2J.md";
    let out = toolloop(
        &["run", "--model", "test", "--system-file", hostile, "hi"],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
        "{stderr:?}"
    );
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("toolloop: "))
        .collect();
    assert_eq!(
        said,
        [
            r"toolloop: --system-file notes\x1b]0;owned\x07\x1b[2J.md: No such file or directory (os error 2)"
        ],
        "{stderr}"
    );
    // A store that cannot be opened: a failure (1), said with the store's own words.
    let file = dir.path().join("README.md");
    let store = format!("{}/store.db", file.display());
    let out = toolloop(&["sessions", "list", "--store", &store], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("toolloop: ").count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot open the store") && stderr.contains("choose another with --store"),
        "{stderr}"
    );
}

#[test]
fn write_file_is_offered_only_with_allow_write() {
    let dir = repo();
    let out = toolloop(&["run", "--json", "x"], dir.path());
    let v = json_of(&out);
    assert!(!v.to_string().contains("write_file"));
    let out = toolloop(&["run", "--json", "--allow-write", "x"], dir.path());
    let v = json_of(&out);
    let last = v["tool_calls"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["name"], "write_file");
    assert_eq!(last["success"], true);
}

/// `toolloop run` against the mock server, for each provider, streamed and not.
#[test]
fn every_provider_completes_a_multi_round_parallel_scenario_against_the_mock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base = server.base_url();
    let dir = repo();
    for (provider, url, extra) in [
        ("openai", format!("{base}/v1"), None),
        ("openai-responses", format!("{base}/v1"), None),
        // A reasoning model: the mock refuses a round whose reasoning items were not sent back.
        (
            "openai-responses",
            format!("{base}/v1"),
            Some(r#"{"reasoning": {"effort": "low"}}"#),
        ),
        ("anthropic", base.clone(), None),
        ("gemini", base.clone(), None),
    ] {
        for stream in [false, true] {
            let model = format!("{provider}:mock:rounds=2,parallel=3");
            let mut args = vec!["run", "--json", "--model", &model, "--base-url", &url];
            if let Some(extra) = extra {
                args.extend(["--extra", extra]);
            }
            if stream {
                args.push("--stream");
            }
            args.push("go");
            let out = toolloop(&args, dir.path());
            let what = format!("{provider} stream={stream} extra={extra:?}");
            assert_eq!(
                out.status.code(),
                Some(0),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v = json_of(&out);
            assert_eq!(v["stop_reason"], "answered", "{what}");
            assert_eq!(v["rounds"], 3, "{what}");
            assert_eq!(v["tool_calls"].as_array().unwrap().len(), 6, "{what}");
            assert_eq!(
                v["text"], "Done. I saw 6 tool results in 2 rounds.",
                "{what}"
            );
            assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0, "{what}");
        }
    }
    assert_eq!(server.stats().rejected, 0);
    rt.block_on(server.shutdown());
}

#[test]
fn an_answer_cut_by_the_output_limit_exits_3_and_keeps_its_text() {
    let dir = repo();
    let script = dir.path().join("cut.json");
    std::fs::write(
        &script,
        r#"[{"text": "The answer is long and", "finish_reason": "length"}]"#,
    )
    .unwrap();
    let spec = format!("scripted:{}", script.display());
    let out = toolloop(&["run", "--json", "--model", &spec, "x"], dir.path());
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "output_truncated");
    assert_eq!(v["text"], "The answer is long and");
    assert_eq!(v["error"]["code"], "OUTPUT_TRUNCATED");
    // Without --json: the partial text on stdout, the reason on stderr.
    let out = toolloop(&["run", "--model", &spec, "x"], dir.path());
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("The answer is long and"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("output_truncated"));
}

#[test]
fn usage_a_model_did_not_report_is_null_in_json_not_zero() {
    let dir = repo();
    let script = dir.path().join("nousage.json");
    std::fs::write(&script, r#"[{"text": "hi"}]"#).unwrap();
    let spec = format!("scripted:{}", script.display());
    let out = toolloop(&["run", "--json", "--model", &spec, "x"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let v = json_of(&out);
    assert_eq!(v["usage"], serde_json::Value::Null);
    assert_eq!(v["cost"], serde_json::Value::Null);
    assert_eq!(v["calls_without_usage"], 1);
}

#[test]
fn a_prices_file_prices_a_model_and_a_bad_one_names_the_flag() {
    let dir = repo();
    let script = dir.path().join("usage.json");
    std::fs::write(
        &script,
        r#"[{"text": "hi", "usage": {"input_tokens": 500000, "output_tokens": 250000}}]"#,
    )
    .unwrap();
    let spec = format!("scripted:{}", script.display());
    // The scripted model has no price: its cost is unknown, not 0.
    let out = toolloop(&["run", "--json", "--model", &spec, "x"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_of(&out)["cost"], serde_json::Value::Null);
    // A prices file gives it one (US dollars per million tokens).
    let prices = dir.path().join("prices.json");
    std::fs::write(&prices, r#"{"scripted": {"input": 2.0, "output": 4.0}}"#).unwrap();
    let p = prices.to_str().unwrap();
    let out = toolloop(
        &["run", "--json", "--prices", p, "--model", &spec, "x"],
        dir.path(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cost = json_of(&out)["cost"].as_f64().unwrap();
    assert!((cost - 2.0).abs() < 1e-9, "{cost}");
    // A file that is not one is a usage error that names the flag and the format.
    for bad in [
        "{",
        r#"{"scripted": {"input": 2.0}}"#,
        r#"{"scripted": {"input": -1, "output": 1}}"#,
    ] {
        std::fs::write(&prices, bad).unwrap();
        let out = toolloop(
            &["run", "--json", "--prices", p, "--model", &spec, "x"],
            dir.path(),
        );
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--prices") && err.contains("per million"),
            "{bad}: {err}"
        );
    }
    let out = toolloop(
        &["run", "--prices", "missing.json", "--model", &spec, "x"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prices missing.json"));
}

/// A reader that goes away (`toolloop run --json … | head -c 10`) is no reason to panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let dir = repo();
    for args in [
        &["run", "--json", "What is here?"][..],
        &["run", "What is here?"][..],
    ] {
        let mut child = common::command(args, dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
