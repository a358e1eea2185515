//! `toolloop eval`: the shipped example suite passes offline against the mock; a case whose
//! assertion fails is reported, with exit code 1 and its cassette kept; a bad suite is a usage
//! error naming the file.

use crate::common;
use common::{command, json_of, mock};

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
    // So many runs that counting them overflows a u64: refused all the same.
    let many = vec!["\"m\""; 100_000].join(",");
    std::fs::write(
        &suite,
        format!(
            "models = [{many}]\nsystems = [{many}]\nrepeat = 4294967295\n\
             [[cases]]\nid = \"a\"\nprompt = \"x\"\n"
        ),
    )
    .unwrap();
    let o = command(&["eval", suite.to_str().unwrap()], dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("more than 10000"), "{err}");
}

fn mock_with(
    rt: &tokio::runtime::Runtime,
    options: toolloop_mock::MockOptions,
) -> toolloop_mock::MockServer {
    rt.block_on(toolloop_mock::start(options)).unwrap()
}

/// `toolloop eval SUITE --json --out OUT`: how it ended, and its report.
fn eval_suite(dir: &Path, base: &str, suite: &Path, out: &Path) -> (Output, Value) {
    let o = eval(
        dir,
        base,
        &[
            suite.to_str().unwrap(),
            "--json",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let v = json_of(&o);
    (o, v)
}

#[test]
fn conversations_and_workflows_are_cases() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("repo")).unwrap();
    std::fs::write(dir.path().join("repo/README.md"), "version 1.2.3\n").unwrap();
    std::fs::write(
        dir.path().join("flow.toml"),
        r#"
name = "flow"
[inputs.file]
description = "the file to read"
[[steps]]
id = "read"
prompt = "Read {{ inputs.file }}."
tools = ["read_file"]
[[steps]]
id = "summarise"
prompt = "Summarise: {{ steps.read.output }}"
"#,
    )
    .unwrap();
    let suite = dir.path().join("s.toml");
    std::fs::write(
        &suite,
        r#"
models = ["openai:mock:rounds=1"]
[[cases]]
id = "talk"
turns = ["Read the README.", "And now say what you saw."]
root = "repo"
args = ["--tools", "read_file"]
[cases.expect]
called = ["read_file"]
answer_contains = ["Done."]
max_rounds = 4
[[cases]]
id = "flow"
workflow = "flow.toml"
inputs = { file = "README.md" }
root = "repo"
[cases.expect]
called = ["read_file"]
answer_regex = "^Done\\."
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let base = format!("{}/v1", server.base_url());
    let before = server.stats().requests;
    let (o, v) = eval_suite(dir.path(), &base, &suite, &out);
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    let talk = &v["results"][0];
    assert_eq!(talk["case"], "talk");
    // Two turns, each a round of calls and an answer; the calls of both, each with its turn.
    let turns = talk["outcome"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{talk:#}");
    assert_eq!(talk["outcome"]["rounds"], 4, "{talk:#}");
    let calls = talk["outcome"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{talk:#}");
    assert_eq!(
        (calls[0]["turn"].clone(), calls[1]["turn"].clone()),
        (1.into(), 2.into())
    );
    let flow = &v["results"][1];
    let steps = flow["outcome"]["workflow"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{flow:#}");
    assert_eq!(flow["outcome"]["tool_calls"][0]["step"], "read", "{flow:#}");
    assert_eq!(flow["inputs"]["file"], "README.md");
    // 4 model calls for the conversation, 2 + 1 for the workflow's steps.
    assert_eq!(server.stats().requests - before, 7);

    // The conversation's cassette, played back turn by turn in a session: no server at all.
    let cassette = talk["cassette"].as_str().unwrap();
    assert!(
        talk["replay"].as_str().unwrap().contains("--session"),
        "{talk:#}"
    );
    let store = dir.path().join("replay.db");
    for turn in ["Read the README.", "And now say what you saw."] {
        let o = command(
            &[
                "run",
                "--json",
                &format!("--model=replay:{cassette}"),
                "--replay-tools",
                "--tools",
                "read_file",
                "--session",
                "again",
                "--store",
                store.to_str().unwrap(),
                "--",
                turn,
            ],
            dir.path(),
        )
        .output()
        .unwrap();
        let r = json_of(&o);
        assert_eq!(r["stop_reason"], "answered", "{r:#}");
    }
    assert_eq!(
        server.stats().requests - before,
        7,
        "the replay called no server"
    );
    rt.block_on(server.shutdown());
}

#[test]
fn a_judge_gives_a_verdict_and_an_unreadable_one_fails_the_case() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = |when: &str, text: &str| toolloop_mock::MockAnswer {
        when: when.into(),
        text: text.into(),
    };
    let server = mock_with(
        &rt,
        toolloop_mock::MockOptions {
            answers_by_prompt: vec![
                answer(
                    "judge-pass",
                    "```json\n{\"verdict\": \"pass\", \"reason\": \"It greets.\"}\n```",
                ),
                answer(
                    "judge-fail",
                    "{\"verdict\": \"fail\", \"reason\": \"No greeting at all.\"}",
                ),
                answer("judge-garbled", "I think it is <b>fine</b>."),
            ],
            ..Default::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.toml");
    std::fs::write(
        &suite,
        r#"
models = ["openai:mock:rounds=0"]
[[cases]]
id = "good"
prompt = "Say hello."
expect.judge = { model = "openai:mock:rounds=0", rubric = "Greets the user (judge-pass)." }
[[cases]]
id = "bad"
prompt = "Say hello."
expect.judge = { model = "openai:mock:rounds=0", rubric = "Greets the user (judge-fail)." }
[[cases]]
id = "garbled"
prompt = "Say hello."
expect.judge = { model = "openai:mock:rounds=0", rubric = "Greets the user (judge-garbled)." }
"#,
    )
    .unwrap();
    let base = format!("{}/v1", server.base_url());
    let out = dir.path().join("out");
    let (o, v) = eval_suite(dir.path(), &base, &suite, &out);
    assert_eq!(o.status.code(), Some(1), "{v:#}");
    let r = v["results"].as_array().unwrap();
    assert_eq!(r[0]["passed"], true, "{:#}", r[0]);
    assert_eq!(r[0]["judge"]["verdict"], "pass");
    assert_eq!(r[0]["judge"]["reason"], "It greets.");
    assert_eq!(r[0]["judge"]["model"], "openai:mock:rounds=0");
    assert_eq!(r[1]["passed"], false);
    assert_eq!(r[1]["judge"]["verdict"], "fail");
    assert!(
        r[1]["failures"][0]
            .as_str()
            .unwrap()
            .contains("No greeting at all."),
        "{:#}",
        r[1]
    );
    assert_eq!(r[2]["passed"], false);
    assert!(r[2]["judge"]["verdict"].is_null(), "{:#}", r[2]);
    let why = r[2]["failures"][0].as_str().unwrap();
    assert!(
        why.contains("could not be read") && why.contains("fine"),
        "{why}"
    );
    // The judge's exchange is kept: it saw the rubric, the task and the agent's answer.
    let judged = std::fs::read_to_string(r[0]["judge"]["cassette"].as_str().unwrap()).unwrap();
    assert!(judged.contains("judge-pass") && judged.contains("Say hello."));
    assert!(judged.contains("You grade the work of an AI agent"));
    rt.block_on(server.shutdown());
}

#[test]
fn a_prompt_longer_than_an_argument_may_be_reaches_the_run_and_the_judge() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock_with(
        &rt,
        toolloop_mock::MockOptions {
            answers_by_prompt: vec![toolloop_mock::MockAnswer {
                when: "judge-pass".into(),
                text: "{\"verdict\": \"pass\", \"reason\": \"It greets.\"}".into(),
            }],
            ..Default::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.toml");
    // Linux caps one argument at 128 KiB; the task is quoted whole to the judge.
    let long = "x".repeat(200_000);
    std::fs::write(
        &suite,
        format!(
            "models = [\"openai:mock:rounds=0\"]\n[[cases]]\nid = \"long\"\n\
             prompt = \"Say hello. {long} (the end)\"\n\
             expect.judge = {{ model = \"openai:mock:rounds=0\", rubric = \"Greets (judge-pass).\" }}\n"
        ),
    )
    .unwrap();
    let base = format!("{}/v1", server.base_url());
    let out = dir.path().join("out");
    let (o, v) = eval_suite(dir.path(), &base, &suite, &out);
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    let r = &v["results"][0];
    assert_eq!(r["judge"]["verdict"], "pass", "{r:#}");
    let run = std::fs::read_to_string(r["cassette"].as_str().unwrap()).unwrap();
    assert!(run.contains(&format!("Say hello. {long} (the end)")));
    let judged = std::fs::read_to_string(r["judge"]["cassette"].as_str().unwrap()).unwrap();
    assert!(judged.contains(&format!("Say hello. {long} (the end)")));
    rt.block_on(server.shutdown());
}

#[test]
fn a_results_file_holding_huge_numbers_is_summed_without_overflow() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.toml");
    std::fs::write(
        &suite,
        "models = [\"openai:mock:rounds=0\"]\nrepeat = 2\n[[cases]]\nid = \"a\"\nprompt = \"Hi.\"\n",
    )
    .unwrap();
    let base = format!("{}/v1", server.base_url());
    let out = dir.path().join("out");
    let args = [
        suite.to_str().unwrap(),
        "--json",
        "--out",
        out.to_str().unwrap(),
    ];
    assert_eq!(eval(dir.path(), &base, &args).status.code(), Some(0));
    // Each kept result says it took u64::MAX milliseconds.
    let state = out.join("results.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&state)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v["duration_ms"] = u64::MAX.into();
            v.to_string()
        })
        .collect();
    assert_eq!(kept.len(), 2);
    std::fs::write(&state, kept.join("\n") + "\n").unwrap();
    let (junit, html) = (dir.path().join("j.xml"), dir.path().join("r.html"));
    let mut with_reports = args.to_vec();
    with_reports.extend(["--junit", junit.to_str().unwrap()]);
    with_reports.extend(["--html", html.to_str().unwrap()]);
    let o = eval(dir.path(), &base, &with_reports);
    let v = json_of(&o);
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    assert_eq!(v["summary"][0]["duration_ms"], u64::MAX, "{v:#}");
    assert!(
        std::fs::read_to_string(&junit)
            .unwrap()
            .contains("<testcase ")
    );
    assert!(std::fs::read_to_string(&html).unwrap().contains("</html>"));
    rt.block_on(server.shutdown());
}

/// Lines of the durable results file.
fn finished_runs(out: &Path) -> usize {
    std::fs::read_to_string(out.join("results.jsonl"))
        .map(|t| t.lines().filter(|l| l.ends_with('}')).count())
        .unwrap_or(0)
}

#[test]
fn a_killed_suite_resumes_without_running_finished_cases_again() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.toml");
    let mut text = String::from("models = [\"openai:mock:rounds=1,latency=150ms\"]\n");
    for i in 0..6 {
        text.push_str(&format!(
            "[[cases]]\nid = \"c{i}\"\nprompt = \"task {i}\"\nargs = [\"--tools\", \"read_file\"]\n"
        ));
    }
    std::fs::write(&suite, text).unwrap();
    let out = dir.path().join("out");
    let base = format!("{}/v1", server.base_url());
    let mut child = command(
        &[
            "eval",
            suite.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        dir.path(),
    )
    .env("OPENAI_BASE_URL", &base)
    .env("OPENAI_API_KEY", "test-key-for-the-mock")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while finished_runs(&out) < 2 {
        assert!(std::time::Instant::now() < deadline, "no run finished");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The run in flight dies with the eval: the mock hears nothing more.
    let mut requests = server.stats().requests;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let now = server.stats().requests;
        if now == requests {
            break;
        }
        requests = now;
    }
    let finished = finished_runs(&out);
    assert!((2..6).contains(&finished), "{finished} runs had finished");
    // A result cut short by the kill (as a kill in the middle of a write leaves it).
    let mut state = std::fs::OpenOptions::new()
        .append(true)
        .open(out.join("results.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut state, b"{\"case\": \"c5\", \"key\": \"c").unwrap();
    drop(state);
    let (o, v) = eval_suite(dir.path(), &base, &suite, &out);
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    assert_eq!(v["runs"], 6);
    assert_eq!(v["failed"], 0);
    // Two model calls per run, for the runs without a result only.
    assert_eq!(
        server.stats().requests - requests,
        2 * (6 - finished as u64),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{finished} of 6 runs already have a result")),
        "{err}"
    );
    // Started again once more: every run has its result, none is made again.
    let before = server.stats().requests;
    let o = eval(
        dir.path(),
        &base,
        &[suite.to_str().unwrap(), "--out", out.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(server.stats().requests, before);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("6 of 6 runs already have a result"), "{err}");
    // --fresh runs them all.
    let before = server.stats().requests;
    let o = eval(
        dir.path(),
        &base,
        &[
            suite.to_str().unwrap(),
            "--json",
            "--fresh",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(server.stats().requests - before, 12);
    rt.block_on(server.shutdown());
}

use crate::npm;

/// A suite of a passing case and a failing one whose prompt and answer are hostile HTML;
/// `--junit` and `--html` written into `dir`.
fn reports(dir: &Path) -> (Value, PathBuf, PathBuf) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock_with(
        &rt,
        toolloop_mock::MockOptions {
            answers_by_prompt: vec![toolloop_mock::MockAnswer {
                when: "hostile".into(),
                text: "<script>window.__pwned = true</script><img src=x onerror=alert(1)> \u{1b}[31m\u{0}"
                    .into(),
            }],
            ..Default::default()
        },
    );
    let suite = dir.join("s.toml");
    std::fs::write(
        &suite,
        r#"
name = "reports"
models = ["openai:mock:rounds=1"]
repeat = 2
[[cases]]
id = "fine"
prompt = "Look around."
args = ["--tools", "read_file"]
expect = { answer_contains = ["Done."] }
[[cases]]
id = "hostile"
prompt = "hostile <script>window.__pwned = true</script>"
expect = { answer_contains = ["Done."] }
"#,
    )
    .unwrap();
    let (junit, html) = (dir.join("junit.xml"), dir.join("report.html"));
    let base = format!("{}/v1", server.base_url());
    let o = eval(
        dir,
        &base,
        &[
            suite.to_str().unwrap(),
            "--json",
            "--out",
            dir.join("out").to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
        ],
    );
    let v = json_of(&o);
    assert_eq!(o.status.code(), Some(1), "{v:#}");
    rt.block_on(server.shutdown());
    (v, junit, html)
}

#[test]
fn junit_and_html_reports_escape_what_the_model_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (v, junit, html) = reports(dir.path());
    assert_eq!(v["failed"], 2);
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(
        x.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"),
        "{x}"
    );
    assert!(
        x.contains("<testsuite name=\"reports\" tests=\"4\" failures=\"2\""),
        "{x}"
    );
    assert_eq!(x.matches("<testcase ").count(), 4, "{x}");
    assert_eq!(x.matches("<failure ").count(), 2, "{x}");
    assert!(x.contains("classname=\"reports.hostile\""), "{x}");
    assert!(x.contains("replay: toolloop run"), "{x}");
    // Nothing the model wrote is markup, and no character XML cannot hold is left.
    assert!(
        !x.contains("<script>") && x.contains("&lt;script&gt;"),
        "{x}"
    );
    assert!(!x.contains('\u{0}') && !x.contains('\u{1b}'), "{x}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        !page.contains("<script") && !page.contains("<img"),
        "{page}"
    );
    assert!(page.contains("&lt;script&gt;window.__pwned"), "{page}");
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no network: {page}"
    );
    assert!(page.contains("default-src 'none'"));
    assert_eq!(page.matches("<details class=\"transcript\">").count(), 2);
}

#[test]
#[cfg_attr(
    not(all(toolloop_npm, toolloop_chromium)),
    ignore = "needs node and npm (puppeteer-core) and a Chromium on PATH (.ci/chromium installs Debian's)"
)]
fn the_html_report_opens_in_chromium() {
    let browser = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/chromium"))
        .output()
        .unwrap();
    let browser = String::from_utf8_lossy(&browser.stdout).trim().to_string();
    assert!(
        !browser.is_empty(),
        "the build found a Chromium, .ci/chromium does not: rebuild to skip this test"
    );
    let modules = npm::installed();
    let dir = tempfile::tempdir().unwrap();
    let (_, _, html) = reports(dir.path());
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("eval-report");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("report.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/eval_report.mjs");
    let o = std::process::Command::new("node")
        .arg(&script)
        .arg(&modules)
        .arg(&browser)
        .arg(&html)
        .arg(&shot)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let seen: Value = serde_json::from_slice(&o.stdout).unwrap();
    eprintln!("the report's screenshot: {}", shot.display());
    assert_eq!(seen["title"], "toolloop eval: reports", "{seen:#}");
    let rows = seen["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{seen:#}");
    assert_eq!(rows[0]["case"], "fine");
    assert_eq!(rows[0]["rate"], "2/2 (100%)");
    assert_eq!(rows[1]["case"], "hostile");
    assert_eq!(rows[1]["rate"], "0/2 (0%)");
    assert_eq!(rows[1]["class"], "fail");
    // The transcript is one click away: hidden, then open and readable.
    assert_eq!(seen["visible_before"], false, "{seen:#}");
    assert_eq!(
        seen["text_before"].as_str().map(str::trim),
        Some("transcript")
    );
    assert_eq!(seen["open_after"], true, "{seen:#}");
    assert_eq!(seen["visible_after"], true, "{seen:#}");
    let transcript = seen["transcript"].as_str().unwrap();
    assert!(
        transcript.contains("<script>window.__pwned = true</script>"),
        "the hostile answer shows as text: {transcript}"
    );
    assert!(
        transcript.contains("the answer does not contain"),
        "{transcript}"
    );
    assert!(transcript.contains("--model replay:"), "{transcript}");
    assert_eq!(seen["scripts"], 0);
    assert_eq!(seen["pwned"], false);
    assert!(seen["dialog"].is_null(), "{seen:#}");
    assert_eq!(seen["requests"], serde_json::json!([]), "no network");
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
}

#[test]
fn compare_shows_what_got_better_or_worse() {
    let dir = tempfile::tempdir().unwrap();
    let report = |rows: Value| serde_json::json!({"suite": "s", "summary": rows});
    let a = report(serde_json::json!([
        {"case": "x", "variant": "m1", "runs": 2, "passed": 2, "cost": 0.02, "duration_ms": 2000},
        {"case": "y", "variant": "m1", "runs": 2, "passed": 1, "cost": null, "duration_ms": 1000},
        {"case": "gone", "variant": "m1", "runs": 1, "passed": 1, "cost": null, "duration_ms": 10}
    ]));
    let b = report(serde_json::json!([
        {"case": "x", "variant": "m1", "runs": 2, "passed": 1, "cost": 0.03, "duration_ms": 1000},
        {"case": "y", "variant": "m1", "runs": 2, "passed": 2, "cost": null, "duration_ms": 1000},
        {"case": "new", "variant": "m1", "runs": 1, "passed": 1, "cost": null, "duration_ms": 10}
    ]));
    let (pa, pb) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&pa, a.to_string()).unwrap();
    std::fs::write(&pb, b.to_string()).unwrap();
    let run = |args: &[&str]| command(args, dir.path()).output().unwrap();
    let o = run(&[
        "eval",
        "compare",
        pa.to_str().unwrap(),
        pb.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "a pass rate fell");
    let v = json_of(&o);
    let rows = v["rows"].as_array().unwrap();
    let row = |case: &str| rows.iter().find(|r| r["case"] == case).unwrap().clone();
    assert_eq!(row("x")["status"], "worse");
    assert_eq!(row("x")["pass_rate"], serde_json::json!([1.0, 0.5]));
    let cost = row("x")["cost_per_run"]["change"].as_f64().unwrap();
    assert!((cost - 0.5).abs() < 1e-9, "{cost}");
    assert_eq!(row("x")["ms_per_run"]["change"], -0.5);
    assert_eq!(row("y")["status"], "better");
    assert_eq!(row("gone")["status"], "removed");
    assert_eq!(row("new")["status"], "added");
    assert_eq!(
        (v["better"].clone(), v["worse"].clone()),
        (1.into(), 1.into())
    );
    // The table, and 0 when nothing fell.
    let o = run(&[
        "eval",
        "compare",
        pb.to_str().unwrap(),
        pb.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("0 better, 0 worse"), "{text}");
    let o = run(&[
        "eval",
        "compare",
        pa.to_str().unwrap(),
        pb.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("worse") && text.contains("100% → 50%"),
        "{text}"
    );
    // A file that is not a result is a usage error naming it.
    std::fs::write(dir.path().join("bad.json"), "{}").unwrap();
    let o = run(&["eval", "compare", "bad.json", pb.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.json"));
}
