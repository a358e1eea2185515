//! `toolloop eval SUITE.toml`: cases run against models and system prompts, each checked by
//! assertions on its trajectory, its answer, the files it left and its budget; a table of pass
//! rates, `--json`, and exit code 1 when a case failed.
//!
//! Each run is a `toolloop run --json` of this same binary, in a fresh copy of the case's root
//! (`<out>/roots/<case>.<n>.<repetition>`, kept), recording a cassette
//! (`<out>/<case>.<n>.<repetition>.jsonl`) so that a failure can be replayed with
//! `--model replay:FILE`.

use crate::CliError;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// `toolloop eval` flags.
#[derive(clap::Args, Debug)]
pub(crate) struct EvalArgs {
    /// The suite: a TOML file of cases (see the README, "Testing your agent").
    pub suite: PathBuf,
    /// Runs at once.
    #[arg(short = 'j', long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where each run's cassette goes (default: `<suite>.eval` beside the suite).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The largest suite file.
const MAX_SUITE_BYTES: u64 = 1024 * 1024;
/// The most runs a suite may ask for (cases × variants × repetitions).
const MAX_RUNS: usize = 10_000;
/// Flags a suite may not pass to its runs: the eval sets them.
const OWNED_FLAGS: &[&str] = &["--root", "--record", "--json", "--jsonl", "--model", "-m"];

/// A suite file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Suite {
    /// Its name, for the report.
    #[serde(default)]
    name: Option<String>,
    /// The models to run every case with (a matrix); none: the default model.
    #[serde(default)]
    models: Vec<String>,
    /// The system prompts to run every case with (a matrix); none: no system prompt.
    #[serde(default)]
    systems: Vec<String>,
    /// Runs of each case and variant, for a pass rate (default 1).
    #[serde(default = "one")]
    repeat: u32,
    /// Flags for every run (`--allow-write`, `--max-rounds 5`, …).
    #[serde(default)]
    args: Vec<String>,
    cases: Vec<Case>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    id: String,
    prompt: String,
    /// A directory (relative to the suite) copied fresh for each run; none: an empty one.
    #[serde(default)]
    root: Option<PathBuf>,
    /// Flags for this case's runs, after the suite's.
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    expect: Expect,
}

/// A case's assertions; all must hold.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// How the run must stop (default `answered`).
    #[serde(default)]
    stop_reason: Option<String>,
    /// Tools called at least once.
    #[serde(default)]
    called: Vec<String>,
    /// Calls that must have been made: a tool, and a JSON pattern its arguments match.
    #[serde(default)]
    called_with: Vec<CalledWith>,
    /// Tools never called.
    #[serde(default)]
    not_called: Vec<String>,
    /// Tools called in this order (others may come between).
    #[serde(default)]
    order: Vec<String>,
    /// At most this many rounds.
    #[serde(default)]
    max_rounds: Option<u64>,
    /// Texts the answer contains.
    #[serde(default)]
    answer_contains: Vec<String>,
    /// A regular expression the answer matches.
    #[serde(default)]
    answer_regex: Option<String>,
    /// A JSON Schema file (relative to the suite) the answer, as JSON, is valid against.
    #[serde(default)]
    answer_schema: Option<PathBuf>,
    /// A file (relative to the suite) the answer equals, surrounding whitespace aside.
    #[serde(default)]
    answer_equals_file: Option<PathBuf>,
    /// Files in the root after the run.
    #[serde(default)]
    files: Vec<FileExpect>,
    /// Budgets.
    #[serde(default)]
    max_cost: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CalledWith {
    tool: String,
    args: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileExpect {
    path: String,
    /// Whether it exists (default: it must).
    #[serde(default)]
    exists: Option<bool>,
    #[serde(default)]
    contains: Option<String>,
    #[serde(default)]
    regex: Option<String>,
}

/// Whether `value` matches `pattern`: an object matches when each of the pattern's keys is
/// present and matches (other keys may be there); an array when it has as many items, each
/// matching; anything else when equal.
pub(crate) fn matches_pattern(pattern: &Value, value: &Value) -> bool {
    match (pattern, value) {
        (Value::Object(p), Value::Object(v)) => p
            .iter()
            .all(|(k, pv)| v.get(k).is_some_and(|vv| matches_pattern(pv, vv))),
        (Value::Array(p), Value::Array(v)) => {
            p.len() == v.len() && p.iter().zip(v).all(|(a, b)| matches_pattern(a, b))
        }
        (p, v) => p == v,
    }
}

/// The assertions that fail for `outcome` (a `run --json` outcome) in `root`; empty: passed.
fn check(expect: &Expect, outcome: &Value, root: &Path, suite_dir: &Path) -> Vec<String> {
    let mut failed = Vec::new();
    let names: Vec<&str> = outcome["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let want_stop = expect.stop_reason.as_deref().unwrap_or("answered");
    let stop = outcome["stop_reason"].as_str().unwrap_or("");
    if stop != want_stop {
        let why = outcome["error"]["message"].as_str().unwrap_or("");
        failed.push(format!("stopped `{stop}`, expected `{want_stop}` {why}"));
    }
    for tool in &expect.called {
        if !names.contains(&tool.as_str()) {
            failed.push(format!("`{tool}` was not called"));
        }
    }
    for tool in &expect.not_called {
        if names.contains(&tool.as_str()) {
            failed.push(format!("`{tool}` was called"));
        }
    }
    for want in &expect.called_with {
        let found = outcome["tool_calls"].as_array().is_some_and(|calls| {
            calls.iter().any(|c| {
                c["name"] == want.tool.as_str() && matches_pattern(&want.args, &c["arguments"])
            })
        });
        if !found {
            failed.push(format!("no call of `{}` with {}", want.tool, want.args));
        }
    }
    if !expect.order.is_empty() {
        let mut it = names.iter();
        if !expect
            .order
            .iter()
            .all(|want| it.any(|n| *n == want.as_str()))
        {
            failed.push(format!(
                "the calls {names:?} are not in the order {:?}",
                expect.order
            ));
        }
    }
    if let Some(max) = expect.max_rounds
        && outcome["rounds"].as_u64().unwrap_or(0) > max
    {
        failed.push(format!("{} rounds, more than {max}", outcome["rounds"]));
    }
    let answer = outcome["text"].as_str().unwrap_or("");
    for text in &expect.answer_contains {
        if !answer.contains(text.as_str()) {
            failed.push(format!("the answer does not contain {text:?}"));
        }
    }
    if let Some(re) = &expect.answer_regex {
        match regex::Regex::new(re) {
            Ok(re) if re.is_match(answer) => {}
            Ok(_) => failed.push(format!("the answer does not match /{re}/")),
            Err(e) => failed.push(format!("answer_regex: {e}")),
        }
    }
    if let Some(path) = &expect.answer_schema {
        let path = suite_dir.join(path);
        match crate::setup::read_output_schema(&path) {
            Ok(schema) => match schema.compile() {
                Ok(check) => {
                    if let Err(e) = check.check(answer) {
                        failed.push(format!("the answer does not fit {}: {e}", path.display()));
                    }
                }
                Err(e) => failed.push(format!("{}: {}", path.display(), e.message)),
            },
            Err(e) => failed.push(crate::error::chain(&e)),
        }
    }
    if let Some(path) = &expect.answer_equals_file {
        let path = suite_dir.join(path);
        match toolloop::user_file::read_to_string(&path, MAX_SUITE_BYTES) {
            Ok(want) if want.trim() == answer.trim() => {}
            Ok(_) => failed.push(format!("the answer differs from {}", path.display())),
            Err(e) => failed.push(format!("{}: {e}", path.display())),
        }
    }
    for f in &expect.files {
        failed.extend(check_file(f, root));
    }
    if let Some(max) = expect.max_cost
        && outcome["cost"].as_f64().is_some_and(|c| c > max)
    {
        failed.push(format!("cost {} above {max}", outcome["cost"]));
    }
    if let Some(max) = expect.max_tokens {
        let tokens = outcome["usage"]["total_tokens"].as_u64().unwrap_or(0);
        if tokens > max {
            failed.push(format!("{tokens} tokens, more than {max}"));
        }
    }
    if let Some(max) = expect.max_ms {
        let ms = outcome["duration_ms"].as_u64().unwrap_or(0);
        if ms > max {
            failed.push(format!("{ms} ms, more than {max}"));
        }
    }
    failed
}

fn check_file(f: &FileExpect, root: &Path) -> Vec<String> {
    let rel = Path::new(&f.path);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return vec![format!("files: `{}` is not a path in the root", f.path)];
    }
    let path = root.join(rel);
    let want_exists = f.exists.unwrap_or(true);
    let text = toolloop::user_file::read_to_string(&path, 16 * MAX_SUITE_BYTES);
    match (&text, want_exists) {
        (Err(_), false) if !path.exists() => return Vec::new(),
        (_, false) => return vec![format!("`{}` exists", f.path)],
        (Err(e), true) => return vec![format!("`{}`: {e}", f.path)],
        (Ok(_), true) => {}
    }
    let text = text.unwrap_or_default();
    let mut failed = Vec::new();
    if let Some(c) = &f.contains
        && !text.contains(c.as_str())
    {
        failed.push(format!("`{}` does not contain {c:?}", f.path));
    }
    if let Some(re) = &f.regex {
        match regex::Regex::new(re) {
            Ok(r) if r.is_match(&text) => {}
            Ok(_) => failed.push(format!("`{}` does not match /{re}/", f.path)),
            Err(e) => failed.push(format!("files regex: {e}")),
        }
    }
    failed
}

/// Copies the directory `from` into `to`: directories and regular files (links and special
/// files are left out).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// One run of the suite.
struct Job {
    case: usize,
    model: Option<String>,
    system: Option<String>,
    variant: String,
    rep: u32,
}

fn load(path: &Path) -> Result<Suite, CliError> {
    let text = toolloop::user_file::read_to_string(path, MAX_SUITE_BYTES)
        .map_err(|e| CliError::invalid(path.display().to_string(), e))?;
    let suite: Suite = toml::from_str(&text)
        .map_err(|e| CliError::invalid(format!("{}: not a suite", path.display()), e))?;
    let at = |m: String| CliError::usage(format!("{}: {m}", path.display()));
    if suite.cases.is_empty() {
        return Err(at("no cases ([[cases]])".into()));
    }
    if suite.repeat == 0 {
        return Err(at("repeat = 0: expected at least 1".into()));
    }
    let mut ids = std::collections::HashSet::new();
    for c in &suite.cases {
        let safe = !c.id.is_empty()
            && c.id
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_".contains(ch));
        if !safe {
            return Err(at(format!(
                "case id {:?}: expected letters, digits, `-` and `_`",
                c.id
            )));
        }
        if !ids.insert(c.id.as_str()) {
            return Err(at(format!("case id `{}` is given twice", c.id)));
        }
        for a in suite.args.iter().chain(&c.args) {
            let flag = a.split('=').next().unwrap_or("");
            if OWNED_FLAGS.contains(&flag) {
                return Err(at(format!(
                    "case `{}`: the eval sets `{flag}` itself (use `models` for the model)",
                    c.id
                )));
            }
        }
    }
    let runs = suite.cases.len()
        * suite.models.len().max(1)
        * suite.systems.len().max(1)
        * suite.repeat as usize;
    if runs > MAX_RUNS {
        return Err(at(format!("{runs} runs, more than {MAX_RUNS}")));
    }
    Ok(suite)
}

/// Runs `toolloop eval`.
pub(crate) async fn eval(args: EvalArgs) -> Result<ExitCode, CliError> {
    tokio::task::spawn_blocking(move || eval_blocking(args))
        .await
        .map_err(|e| CliError::failure("eval", e))?
}

fn eval_blocking(args: EvalArgs) -> Result<ExitCode, CliError> {
    let suite = load(&args.suite)?;
    let suite_dir = args
        .suite
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let out = args.out.clone().unwrap_or_else(|| {
        let mut name = args.suite.file_name().unwrap_or_default().to_os_string();
        name.push(".eval");
        suite_dir.join(name)
    });
    std::fs::create_dir_all(&out)
        .map_err(|e| CliError::invalid(format!("--out {}", out.display()), e))?;
    let models: Vec<Option<String>> = if suite.models.is_empty() {
        vec![None]
    } else {
        suite.models.iter().cloned().map(Some).collect()
    };
    let systems: Vec<Option<String>> = if suite.systems.is_empty() {
        vec![None]
    } else {
        suite.systems.iter().cloned().map(Some).collect()
    };
    let mut jobs = Vec::new();
    for (ci, _) in suite.cases.iter().enumerate() {
        for model in &models {
            for (si, system) in systems.iter().enumerate() {
                let variant = match (model, system.is_some() && systems.len() > 1) {
                    (Some(m), true) => format!("{m} / system {}", si + 1),
                    (Some(m), false) => m.clone(),
                    (None, true) => format!("system {}", si + 1),
                    (None, false) => "default".into(),
                };
                for rep in 1..=suite.repeat {
                    jobs.push(Job {
                        case: ci,
                        model: model.clone(),
                        system: system.clone(),
                        variant: variant.clone(),
                        rep,
                    });
                }
            }
        }
    }
    // Exit code 2, as before: the command cannot run its cases.
    let exe = std::env::current_exe()
        .map_err(|e| CliError::invalid("eval: cannot find this program", e))?;
    let queue = Arc::new(Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>()));
    let results: Arc<Mutex<Vec<(usize, Value)>>> = Arc::default();
    let suite = Arc::new(suite);
    std::thread::scope(|scope| {
        for _ in 0..args.jobs {
            let (queue, results, suite) = (queue.clone(), results.clone(), suite.clone());
            let (exe, out, suite_dir) = (&exe, &out, &suite_dir);
            scope.spawn(move || {
                loop {
                    let Some((n, job)) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop()
                    else {
                        return;
                    };
                    let result = run_job(exe, &suite, &job, out, suite_dir, n);
                    results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((n, result));
                }
            });
        }
    });
    let mut results = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
    results.sort_by_key(|(n, _)| *n);
    let results: Vec<Value> = results.into_iter().map(|(_, r)| r).collect();
    let failed = results.iter().filter(|r| r["passed"] != true).count();
    let summary = summarise(&results);
    if args.json {
        outln!(
            "{}",
            json!({
                "suite": suite.name,
                "runs": results.len(),
                "failed": failed,
                "summary": summary,
                "results": results,
            })
        );
    } else {
        print_table(&summary, &results);
    }
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn run_job(exe: &Path, suite: &Suite, job: &Job, out: &Path, suite_dir: &Path, n: usize) -> Value {
    let case = &suite.cases[job.case];
    let base = json!({
        "case": case.id,
        "variant": job.variant,
        "repetition": job.rep,
    });
    let fail = |why: String| {
        let mut v = base.clone();
        v["passed"] = json!(false);
        v["failures"] = json!([why]);
        v
    };
    // Kept after the run, for a look at what it left.
    let root = out
        .join("roots")
        .join(format!("{}.{}.{}", case.id, n, job.rep));
    if root.exists()
        && let Err(e) = std::fs::remove_dir_all(&root)
    {
        return fail(format!("{}: {e}", root.display()));
    }
    let copied = match &case.root {
        Some(r) => copy_dir(&suite_dir.join(r), &root),
        None => std::fs::create_dir_all(&root),
    };
    if let Err(e) = copied {
        return fail(format!("root: {e}"));
    }
    let cassette = out.join(format!("{}.{}.{}.jsonl", case.id, n, job.rep));
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("run").arg("--json").arg("--root").arg(&root);
    cmd.arg("--record").arg(&cassette);
    if let Some(m) = &job.model {
        cmd.arg("--model").arg(m);
    }
    if let Some(s) = &job.system {
        cmd.arg("--system").arg(s);
    }
    cmd.args(&suite.args).args(&case.args);
    cmd.arg("--").arg(&case.prompt);
    // The keys the command was given, kept out of its environment: this same program seals
    // them again at its start.
    cmd.envs(crate::secrets::kept());
    cmd.stdin(std::process::Stdio::null());
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => return fail(format!("the run did not start: {e}")),
    };
    let outcome: Value = match serde_json::from_slice(&output.stdout) {
        Ok(v) => v,
        Err(_) => {
            let err = String::from_utf8_lossy(&output.stderr);
            let err: String = err.trim().chars().take(500).collect();
            return fail(format!("the run gave no outcome: {err}"));
        }
    };
    let failures = check(&case.expect, &outcome, &root, suite_dir);
    let mut v = base;
    v["passed"] = json!(failures.is_empty());
    v["failures"] = json!(failures);
    v["cassette"] = json!(cassette);
    v["cost"] = outcome["cost"].clone();
    v["duration_ms"] = outcome["duration_ms"].clone();
    v["tokens"] = outcome["usage"]["total_tokens"].clone();
    v["outcome"] = outcome;
    v
}

/// Pass rate, cost and time per case and variant.
fn summarise(results: &[Value]) -> Vec<Value> {
    let mut rows: Vec<Value> = Vec::new();
    for r in results {
        let row = rows
            .iter_mut()
            .find(|row| row["case"] == r["case"] && row["variant"] == r["variant"]);
        let row = match row {
            Some(row) => row,
            None => {
                rows.push(
                    json!({"case": r["case"], "variant": r["variant"], "runs": 0,
                    "passed": 0, "cost": null, "duration_ms": 0}),
                );
                rows.last_mut().expect("pushed")
            }
        };
        row["runs"] = json!(row["runs"].as_u64().unwrap_or(0) + 1);
        if r["passed"] == true {
            row["passed"] = json!(row["passed"].as_u64().unwrap_or(0) + 1);
        }
        if let Some(c) = r["cost"].as_f64() {
            row["cost"] = json!(row["cost"].as_f64().unwrap_or(0.0) + c);
        }
        row["duration_ms"] = json!(
            row["duration_ms"].as_u64().unwrap_or(0) + r["duration_ms"].as_u64().unwrap_or(0)
        );
    }
    rows
}

fn print_table(summary: &[Value], results: &[Value]) {
    let esc = |s: &str| crate::terminal::escape(s, false).into_owned();
    let mut lines = vec![format!(
        "{:<24} {:<32} {:>9} {:>10} {:>9}",
        "case", "variant", "pass", "cost", "time"
    )];
    for row in summary {
        let cost = row["cost"]
            .as_f64()
            .map_or("-".to_string(), |c| format!("${c:.4}"));
        lines.push(format!(
            "{:<24} {:<32} {:>9} {:>10} {:>8.1}s",
            esc(row["case"].as_str().unwrap_or("")),
            esc(row["variant"].as_str().unwrap_or("")),
            format!("{}/{}", row["passed"], row["runs"]),
            cost,
            row["duration_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
        ));
    }
    for r in results.iter().filter(|r| r["passed"] != true) {
        lines.push(format!(
            "FAILED {} ({}, run {}): {}",
            esc(r["case"].as_str().unwrap_or("")),
            esc(r["variant"].as_str().unwrap_or("")),
            r["repetition"],
            esc(&r["failures"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_default())
        ));
        if let Some(c) = r["cassette"].as_str() {
            lines.push(format!("  replay: toolloop run --model replay:{}", esc(c)));
        }
    }
    for l in lines {
        outln!("{l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_subsets_of_objects() {
        let v = json!({"path": "a.txt", "content": "x", "opts": {"n": 1, "m": [1, 2]}});
        assert!(matches_pattern(&json!({"path": "a.txt"}), &v));
        assert!(matches_pattern(&json!({"opts": {"m": [1, 2]}}), &v));
        assert!(!matches_pattern(&json!({"opts": {"m": [1]}}), &v));
        assert!(!matches_pattern(&json!({"path": "b.txt"}), &v));
        assert!(!matches_pattern(&json!({"missing": null}), &v));
    }

    #[test]
    fn trajectory_and_answer_assertions() {
        let outcome = json!({
            "stop_reason": "answered", "rounds": 2, "text": "Done: 42",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a"}},
                {"name": "write_file", "arguments": {"path": "b", "content": "c"}}
            ],
        });
        let dir = tempfile::tempdir().unwrap();
        let expect: Expect = toml::from_str(
            r#"
            called = ["read_file"]
            not_called = ["run_command"]
            order = ["read_file", "write_file"]
            max_rounds = 2
            answer_contains = ["Done"]
            answer_regex = "\\d+$"
            [[called_with]]
            tool = "write_file"
            args = { path = "b" }
            "#,
        )
        .unwrap();
        assert_eq!(
            check(&expect, &outcome, dir.path(), dir.path()),
            Vec::<String>::new()
        );
        let expect: Expect = toml::from_str(
            r#"
            called = ["run_command"]
            not_called = ["read_file"]
            order = ["write_file", "read_file"]
            max_rounds = 1
            answer_contains = ["nope"]
            answer_regex = "^x"
            [[called_with]]
            tool = "write_file"
            args = { path = "z" }
            [[files]]
            path = "out.txt"
            "#,
        )
        .unwrap();
        let failed = check(&expect, &outcome, dir.path(), dir.path());
        assert_eq!(failed.len(), 8, "{failed:#?}");
    }
}
