//! `toolloop run --tool-protocol prompt|auto` and the OpenAI rescue, against the mock's
//! text-only mode over real HTTP.

use crate::common;
use common::{json_of, repo, toolloop};

use serde_json::Value;
use std::path::Path;
use toolloop_mock::{MockOptions, MockServer};

const DIALECTS: [&str; 6] = ["ptk", "hermes", "mistral", "llama3", "qwen3-coder", "json"];

struct Mock {
    rt: tokio::runtime::Runtime,
    server: MockServer,
}

impl Mock {
    fn start() -> Mock {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt
            .block_on(toolloop_mock::start(MockOptions::default()))
            .unwrap();
        Mock { rt, server }
    }

    fn url(&self) -> String {
        format!("{}/v1", self.server.base_url())
    }

    fn stop(self) {
        self.rt.block_on(self.server.shutdown());
    }
}

/// Runs `toolloop run --json` with these flags; checks the run answered with `calls` tool calls
/// in `rounds` model calls.
fn run_json(mock: &Mock, dir: &Path, flags: &[&str], rounds: u64, calls: usize) -> Value {
    let url = mock.url();
    let mut args = vec!["run", "--json", "--base-url", &url];
    args.extend_from_slice(flags);
    args.push("Look around.");
    let out = toolloop(&args, dir);
    let what = flags.join(" ");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let v = json_of(&out);
    assert_eq!(v["stop_reason"], "answered", "{what}");
    assert_eq!(v["rounds"], rounds, "{what}");
    assert_eq!(v["tool_calls"].as_array().unwrap().len(), calls, "{what}");
    assert_eq!(v["tool_calls"][0]["name"], "read_file", "{what}");
    assert_eq!(v["tool_calls"][0]["success"], true, "{what}");
    assert!(
        v["tool_calls"][0]["result"]
            .to_string()
            .contains("version 1.2.3"),
        "{what}"
    );
    v
}

#[test]
fn every_dialect_passes_through_tool_protocol_prompt_streamed_and_not() {
    let mock = Mock::start();
    let dir = repo();
    for dialect in DIALECTS {
        let model = format!("openai:mock:text_calls={dialect},rounds=2,parallel=3,chunk=3");
        for stream in [false, true] {
            let mut flags = vec![
                "--model",
                &model,
                "--tool-protocol",
                "prompt",
                "--dialect",
                dialect,
            ];
            if stream {
                flags.push("--stream");
            }
            let v = run_json(&mock, dir.path(), &flags, 3, 6);
            assert_eq!(v["text"], "Done. I saw 6 tool results in 2 rounds.");
        }
    }
    assert_eq!(mock.server.stats().rejected, 0);
    mock.stop();
}

#[test]
fn auto_falls_back_to_prompt_when_the_server_refuses_tools() {
    let mock = Mock::start();
    let dir = repo();
    for stream in [false, true] {
        let mut flags = vec![
            "--model",
            "openai:mock:text_calls=mistral,rounds=2,parallel=2",
            "--tool-protocol",
            "auto",
            "--dialect",
            "mistral",
        ];
        if stream {
            flags.push("--stream");
        }
        let v = run_json(&mock, dir.path(), &flags, 3, 4);
        assert_eq!(v["text"], "Done. I saw 4 tool results in 2 rounds.");
    }
    // One refused request per run: the first, which carried `tools`.
    assert_eq!(mock.server.stats().rejected, 2);
    // Native only, the same server refuses: a model error, exit 1.
    let url = mock.url();
    let out = toolloop(
        &[
            "run",
            "--json",
            "--base-url",
            &url,
            "--model",
            "openai:mock:text_calls=ptk",
            "go",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not support tools"),
        "{v}"
    );
    mock.stop();
}

#[test]
fn the_openai_rescue_completes_against_a_server_writing_calls_as_text() {
    let mock = Mock::start();
    let dir = repo();
    for dialect in DIALECTS {
        let model = format!(
            "openai:mock:text_calls={dialect},accept_tools=true,rounds=2,parallel=2,chunk=2"
        );
        let v = run_json(&mock, dir.path(), &["--model", &model], 3, 4);
        assert_eq!(v["text"], "Done. I saw 4 tool results in 2 rounds.");
        // Streamed to stdout: the text, and not a fragment of any call.
        let url = mock.url();
        let out = toolloop(
            &[
                "run",
                "--stream",
                "--base-url",
                &url,
                "--model",
                &model,
                "go",
            ],
            dir.path(),
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{dialect}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "I'll call read_file, list_dir.I'll call search_files, read_file.\
             Done. I saw 4 tool results in 2 rounds.\n",
            "{dialect}"
        );
    }
    assert_eq!(mock.server.stats().rejected, 0);
    mock.stop();
}

/// The PTK Manager's flow from the command line: the `ptk` dialect, one `read_file` call, its result
/// sent back as `PTK_RESULT:`, and the final answer.
#[test]
fn seed_000_flow_from_the_command_line() {
    let mock = Mock::start();
    let dir = repo();
    let v = run_json(
        &mock,
        dir.path(),
        &[
            "--model",
            "openai:mock:text_calls=ptk",
            "--tool-protocol",
            "prompt",
        ],
        2,
        1,
    );
    assert_eq!(v["tool_calls"][0]["arguments"]["path"], "README.md");
    assert_eq!(v["text"], "Done. I saw 1 tool results in 1 rounds.");
    mock.stop();
}

#[test]
fn bad_protocol_or_dialect_is_a_usage_error() {
    let dir = repo();
    let out = toolloop(&["run", "--dialect", "xml", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("qwen3-coder"), "{err}");
    let out = toolloop(&["run", "--tool-protocol", "smoke", "hi"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("native") && err.contains("auto"), "{err}");
    // The offline test model works through the prompted adapter too.
    let out = toolloop(
        &["run", "--json", "--tool-protocol", "prompt", "hi"],
        dir.path(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--implicit-think`: a reply that holds only the closing `</think>` (its chat template wrote
/// the opener) keeps the reasoning out of the answer; without the flag it would be answer text.
#[test]
fn implicit_think_keeps_template_opened_reasoning_out_of_the_answer() {
    let dir = repo();
    let script = dir.path().join("r1.json");
    std::fs::write(
        &script,
        r#"[{"text": "I should read the README first.\n</think>\n\n<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": \"README.md\"}}</tool_call>"},
            {"text": "It says version 1.2.3.\n</think>\nVersion 1.2.3."}]"#,
    )
    .unwrap();
    let spec = format!("scripted:{}", script.display());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--json",
            "--model",
            &spec,
            "--tool-protocol",
            "prompt",
        ];
        args.extend(extra);
        args.push("Which version?");
        json_of(&toolloop(&args, dir.path()))
    };
    let v = run(&["--implicit-think"]);
    assert_eq!(v["stop_reason"], "answered", "{v}");
    assert_eq!(v["text"], "Version 1.2.3.");
    assert_eq!(v["tool_calls"][0]["name"], "read_file");
    let v = run(&[]);
    assert!(
        v["text"].as_str().unwrap().starts_with("It says version"),
        "{v}"
    );
}
