//! `toolloop workflow`: the examples against the mock, `check` before any model call, and a
//! workflow killed (SIGKILL) in the middle of its second step, resumed.

use crate::common;
use common::{command, json_of};

use std::path::{Path, PathBuf};
use toolloop_mock::{MockAnswer, MockOptions, MockServer};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows")
}

fn mock(rt: &tokio::runtime::Runtime, answers: Vec<MockAnswer>) -> MockServer {
    rt.block_on(toolloop_mock::start(MockOptions {
        answers_by_prompt: answers,
        ..Default::default()
    }))
    .unwrap()
}

fn answers_of(path: &Path) -> Vec<MockAnswer> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_article_example_runs_against_the_mock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, answers_of(&examples().join("article.mock.json")));
    let base = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let file = examples().join("article.toml");
    let out = command(
        &[
            "workflow",
            "run",
            file.to_str().unwrap(),
            "--model",
            "openai:mock:rounds=0",
            "--base-url",
            &base,
            "--input",
            "text=Rivers flow downhill to the sea.",
            "--json",
        ],
        dir.path(),
    )
    .env("OPENAI_API_KEY", "test")
    .output()
    .unwrap();
    let v = json_of(&out);
    assert!(out.status.success(), "{v:#}");
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[1]["step_id"], "extract");
    assert_eq!(
        steps[1]["output"],
        serde_json::json!({"title": "Rivers", "keywords": ["water", "sea"]})
    );
    // The canned answer matches only the prompt with the extracted fields interpolated.
    assert_eq!(steps[2]["output"], "Fleuves : eau, mer");
    for s in steps {
        assert_eq!(s["success"], true);
        assert_eq!(s["metadata"]["rounds"], 1);
        assert!(
            s["run_id"]
                .as_str()
                .unwrap()
                .ends_with(s["step_id"].as_str().unwrap())
        );
    }
    assert_eq!(server.stats().requests, 3);
    rt.block_on(server.shutdown());
}

#[test]
fn the_fix_tests_example_fixes_only_when_tests_fail() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = examples().join("fix-tests.toml");
    for (answers, fixed) in [
        (vec![], true),
        (
            vec![MockAnswer {
                when: "Run the tests with run_command".into(),
                text: "PASS".into(),
            }],
            false,
        ),
    ] {
        let server = mock(&rt, answers);
        let base = format!("{}/v1", server.base_url());
        let out = command(
            &[
                "workflow",
                "run",
                file.to_str().unwrap(),
                "--model",
                "openai:mock:rounds=0",
                "--base-url",
                &base,
                "--allow-commands",
                "--allow-write",
                "--json",
            ],
            dir.path(),
        )
        .env("OPENAI_API_KEY", "test")
        .output()
        .unwrap();
        let v = json_of(&out);
        assert!(out.status.success(), "{v:#}");
        assert_eq!(v["steps"][1]["skipped"], !fixed, "{v:#}");
        assert_eq!(server.stats().requests, if fixed { 2 } else { 1 });
        rt.block_on(server.shutdown());
    }
}

#[test]
fn check_reports_problems_with_exit_code_2_and_run_calls_no_model() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, vec![]);
    let base = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        r#"
name = "bad"
[[steps]]
id = "one"
prompt = "hello"
[[steps]]
id = "two"
prompt = "{{ steps.one.output }} {{ inputs.missing }}"
tools = ["no_such_tool"]
model = "nosuch:model"
"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = command(&["workflow", "check", path], dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("undefined variable `inputs.missing`"), "{err}");
    assert!(err.contains("no tool `no_such_tool`"), "{err}");
    assert!(err.contains("model `nosuch:model`: unknown model"), "{err}");
    let out = command(
        &[
            "workflow",
            "run",
            path,
            "--model",
            "openai:mock",
            "--base-url",
            &base,
        ],
        dir.path(),
    )
    .env("OPENAI_API_KEY", "test")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(server.stats().requests, 0, "nothing ran");
    // A good file checks.
    let good = examples().join("article.toml");
    let out = command(&["workflow", "check", good.to_str().unwrap()], dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rt.block_on(server.shutdown());
}

/// SIGKILL in the middle of step 2 (its side-effecting tool call in flight), then `toolloop
/// workflow resume`: step 1 is not run again, no model call is made twice and no effect
/// happens twice. The mock counts the model calls; the test tool writes each effect to a file.
#[cfg(feature = "test-hooks")]
#[test]
fn a_workflow_killed_in_step_two_resumes_without_repeating_anything() {
    use serde_json::Value;
    use std::io::Read;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, vec![]);
    let base = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.txt");
    let store = dir.path().join("store.db");
    let file = dir.path().join("crash.toml");
    std::fs::write(
        &file,
        r#"
name = "crash"
[[steps]]
id = "first"
prompt = "first"
model = "openai:mock:rounds=1"
tools = ["effect_a"]
[[steps]]
id = "second"
prompt = "second, after: {{ steps.first.output }}"
model = "openai:mock:rounds=1"
tools = ["effect_b"]
"#,
    )
    .unwrap();
    let with_env = |args: &[&str]| {
        let mut c = command(args, dir.path());
        c.env("TOOLLOOP_STORE", &store)
            .env("TOOLLOOP_TEST_EFFECTS", &effects)
            .env("TOOLLOOP_TEST_EFFECT_MS", "1500")
            .env("OPENAI_API_KEY", "test")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&effects)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let mut child = with_env(&[
        "workflow",
        "run",
        file.to_str().unwrap(),
        "--model",
        "openai:mock:rounds=0",
        "--base-url",
        &base,
        "--json",
    ])
    .spawn()
    .unwrap();
    // Step 2's call has begun once its effect is written (then it waits 1.5 s).
    let start = Instant::now();
    while lines().len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "step 2's call never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the command ended early"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let id = stderr
        .split_whitespace()
        .find(|w| w.starts_with("wf_"))
        .unwrap_or_else(|| panic!("no workflow id in: {stderr}"))
        .to_string();
    let before = server.stats().requests;
    assert_eq!(before, 3, "step 1: call and answer; step 2: its call");

    let out = with_env(&["workflow", "resume", &id, "--json"])
        .output()
        .unwrap();
    let v = json_of(&out);
    assert!(
        out.status.success(),
        "{v:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["workflow_id"], id.as_str());
    assert_eq!(v["steps"][0]["success"], true);
    assert_eq!(v["steps"][1]["success"], true);
    // One more model call (step 2's answer): nothing before the kill was asked again.
    assert_eq!(server.stats().requests, before + 1);
    let effects = lines();
    assert_eq!(effects.len(), 2, "each effect once: {effects:?}");
    assert_ne!(effects[0], effects[1]);
    // The interrupted call was side-effecting: the model was told its outcome is unknown.
    let calls = v["steps"][1]["metadata"]["tool_calls"].as_u64().unwrap();
    assert_eq!(calls, 1);
    // Resuming a finished workflow changes nothing and calls no model.
    let again = with_env(&["workflow", "resume", &id, "--json"])
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(json_of(&again)["steps"], v["steps"]);
    assert_eq!(server.stats().requests, before + 1);
    // It is listed.
    let list = with_env(&["workflow", "list", "--json"]).output().unwrap();
    let runs: Value = json_of(&list);
    assert_eq!(runs[0]["workflow_id"], id.as_str());
    assert_eq!(runs[0]["status"], "succeeded");
    rt.block_on(server.shutdown());
}

/// The files a workflow names (`output_schema_file`) must be in its directory or below, links
/// resolved, unless `--workflow-files-anywhere`; and they are read only when they are small
/// regular files (`/dev/zero` and a FIFO are refused at once).
#[cfg(unix)]
#[test]
fn a_workflow_reads_only_small_regular_files_beside_it() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.json");
    std::fs::write(&secret, r#"{"type": "object", "title": "SECRET-OUTSIDE"}"#).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("schema.json"), r#"{"type": "object"}"#).unwrap();
    std::os::unix::fs::symlink(&secret, project.join("link.json")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(project.join("fifo.json"))
            .status()
            .unwrap()
            .success()
    );
    let up = format!(
        "../../{}/secret.json",
        outside.path().file_name().unwrap().to_str().unwrap()
    );
    let check = |schema_file: &str, anywhere: bool| {
        let file = project.join("w.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"w\"\n[[steps]]\nid = \"one\"\nprompt = \"hello\"\n\
                 output_schema_file = \"{schema_file}\"\n"
            ),
        )
        .unwrap();
        let mut args = vec!["workflow", "check", file.to_str().unwrap()];
        if anywhere {
            args.push("--workflow-files-anywhere");
        }
        let started = std::time::Instant::now();
        let out = command(&args, dir.path()).output().unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = check("schema.json", false);
    assert_eq!(code, Some(0), "{err}");
    for name in [up.as_str(), secret.to_str().unwrap(), "link.json"] {
        let (code, err) = check(name, false);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(
            err.contains("outside the workflow's directory"),
            "{name}: {err}"
        );
        assert!(err.contains("--workflow-files-anywhere"), "{err}");
        let (code, err) = check(name, true);
        assert_eq!(
            code,
            Some(0),
            "{name} with --workflow-files-anywhere: {err}"
        );
    }
    for name in ["/dev/zero", "fifo.json"] {
        let (code, err) = check(name, true);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains("not a regular file"), "{name}: {err}");
    }
}

/// A step names a declared agent (`--agents`) among its tools and delegates to it.
#[test]
fn a_step_delegates_to_a_declared_agent() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt, Vec::new());
    let base = format!("{}/v1", server.base_url());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.md"), "notes\n").unwrap();
    let agents = dir.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.helper]\ndescription = \"Reads files.\"\ntools = [\"read_file\"]\n",
    )
    .unwrap();
    let file = dir.path().join("wf.toml");
    std::fs::write(
        &file,
        "name = \"delegating\"\n\n[[steps]]\nid = \"ask\"\nprompt = \"Ask the helper.\"\n\
         tools = [\"helper\"]\n",
    )
    .unwrap();
    let out = command(
        &[
            "workflow",
            "run",
            file.to_str().unwrap(),
            "--model",
            "openai:mock",
            "--base-url",
            &base,
            "--agents",
            agents.to_str().unwrap(),
            "--json",
        ],
        dir.path(),
    )
    .env("OPENAI_API_KEY", "test")
    .output()
    .unwrap();
    let v = json_of(&out);
    assert!(out.status.success(), "{v:#}");
    let step = &v["steps"][0];
    assert_eq!(step["success"], true, "{step:#}");
    assert_eq!(step["metadata"]["tool_calls"], 1);
    // The step's two model calls and the helper's two (its read_file call, its answer).
    assert_eq!(server.stats().requests, 4);
    rt.block_on(server.shutdown());
}
