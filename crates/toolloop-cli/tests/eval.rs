//! `toolloop eval`: the shipped example suite passes offline against the mock; a case whose
//! assertion fails is reported, with exit code 1 and its cassette kept; a bad suite is a usage
//! error naming the file.

mod common;
use common::command;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/evals/suite.toml")
}

fn eval(dir: &Path, base: &str, args: &[&str]) -> Output {
    let mut all = vec!["eval"];
    all.extend_from_slice(args);
    command(&all, dir)
        .env("OPENAI_BASE_URL", base)
        .env("OPENAI_API_KEY", "test-key-for-the-mock")
        .output()
        .unwrap()
}

fn mock(rt: &tokio::runtime::Runtime) -> toolloop_mock::MockServer {
    rt.block_on(toolloop_mock::start(toolloop_mock::MockOptions::default()))
        .unwrap()
}

#[test]
fn the_example_suite_passes_against_the_mock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let base = format!("{}/v1", server.base_url());
    let example = example();
    let o = eval(
        dir.path(),
        &base,
        &[
            example.to_str().unwrap(),
            "--json",
            "-j",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&o.stderr));
    });
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    assert_eq!(v["runs"], 8, "2 cases × 2 models × 2 repetitions");
    assert_eq!(v["failed"], 0);
    assert_eq!(v["summary"].as_array().map(Vec::len), Some(4));
    for r in v["results"].as_array().unwrap() {
        let cassette = std::fs::read_to_string(r["cassette"].as_str().unwrap()).unwrap();
        // The key is handed to each run; no cassette holds it.
        assert!(!cassette.contains("test-key-for-the-mock"), "{r}");
    }
    assert!(!String::from_utf8_lossy(&o.stdout).contains("test-key-for-the-mock"));
    // The example's own files are untouched: each run wrote in a fresh copy.
    let example_dir = example.parent().unwrap();
    assert!(!example_dir.join("repo/notes").exists());
    rt.block_on(server.shutdown());
}

#[test]
fn a_failed_assertion_is_reported_with_exit_code_1() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.toml");
    std::fs::write(
        &suite,
        r#"
models = ["openai:mock:rounds=0"]
[[cases]]
id = "passes"
prompt = "hi"
expect = { answer_contains = ["Done."] }
[[cases]]
id = "fails"
prompt = "hi"
expect = { called = ["read_file"], answer_regex = "^Nope" }
"#,
    )
    .unwrap();
    let base = format!("{}/v1", server.base_url());
    let o = eval(dir.path(), &base, &[suite.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("passes") && text.contains("1/1"), "{text}");
    assert!(text.contains("FAILED fails"), "{text}");
    assert!(text.contains("`read_file` was not called"), "{text}");
    assert!(text.contains("does not match /^Nope/"), "{text}");
    assert!(
        text.contains("replay: toolloop run --model replay:"),
        "{text}"
    );
    rt.block_on(server.shutdown());
}

#[test]
fn a_bad_suite_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("bad.toml");
    for (text, want) in [
        (
            "[[cases]]\nid = \"a\"\nprompt = \"x\"\nunknown = 1\n",
            "unknown",
        ),
        ("cases = []\n", "no cases"),
        ("[[cases]]\nid = \"../a\"\nprompt = \"x\"\n", "case id"),
        (
            "args = [\"--root\", \"/\"]\n[[cases]]\nid = \"a\"\nprompt = \"x\"\n",
            "--root",
        ),
    ] {
        std::fs::write(&suite, text).unwrap();
        let o = command(&["eval", suite.to_str().unwrap()], dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{text}: {err}");
        assert!(
            err.contains("bad.toml") && err.contains(want),
            "{text}: {err}"
        );
    }
}
