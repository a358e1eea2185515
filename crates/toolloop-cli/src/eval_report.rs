//! `toolloop eval`'s reports: the table on the terminal, JUnit XML (`--junit`), the HTML report
//! (`--html`), and `toolloop eval compare A.json B.json`.
//!
//! Everything a model, a tool or a suite wrote is hostile here: escaped for the terminal, for
//! XML (characters XML 1.0 cannot hold replaced) and for HTML (the report loads nothing and
//! runs no script; its Content-Security-Policy forbids both).

use crate::CliError;
use crate::eval::cut;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::ExitCode;

/// Pass rate, cost and time per case and variant, in the order they first appear.
pub(crate) fn summarise(results: &[Value]) -> Vec<Value> {
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
        // Saturating: a results file may hold any number.
        row["duration_ms"] = json!(
            row["duration_ms"]
                .as_u64()
                .unwrap_or(0)
                .saturating_add(r["duration_ms"].as_u64().unwrap_or(0))
        );
    }
    for row in &mut rows {
        let (p, n) = (
            row["passed"].as_u64().unwrap_or(0),
            row["runs"].as_u64().unwrap_or(0),
        );
        row["pass_rate"] = json!(if n == 0 { 0.0 } else { p as f64 / n as f64 });
    }
    rows
}

/// The runs' time, in milliseconds (saturating: a results file may hold any number).
fn total_ms(results: &[Value]) -> u64 {
    results
        .iter()
        .map(|r| r["duration_ms"].as_u64().unwrap_or(0))
        .fold(0, u64::saturating_add)
}

fn failures_of(r: &Value) -> Vec<&str> {
    r["failures"]
        .as_array()
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn money(v: &Value) -> String {
    v.as_f64().map_or("-".to_string(), |c| format!("${c:.4}"))
}

fn seconds(v: &Value) -> String {
    format!("{:.1}s", v.as_u64().unwrap_or(0) as f64 / 1000.0)
}

/// The table on the terminal, then each failed run with its failures and how to replay it.
pub(crate) fn print_table(summary: &[Value], results: &[Value]) {
    let esc = |s: &str| crate::terminal::escape(s, false).into_owned();
    let mut lines = vec![format!(
        "{:<24} {:<32} {:>9} {:>10} {:>9}",
        "case", "variant", "pass", "cost", "time"
    )];
    for row in summary {
        lines.push(format!(
            "{:<24} {:<32} {:>9} {:>10} {:>9}",
            esc(row["case"].as_str().unwrap_or("")),
            esc(row["variant"].as_str().unwrap_or("")),
            format!("{}/{}", row["passed"], row["runs"]),
            money(&row["cost"]),
            seconds(&row["duration_ms"]),
        ));
    }
    for r in results.iter().filter(|r| r["passed"] != true) {
        lines.push(format!(
            "FAILED {} ({}, run {}): {}",
            esc(r["case"].as_str().unwrap_or("")),
            esc(r["variant"].as_str().unwrap_or("")),
            r["repetition"],
            esc(&failures_of(r).join("; "))
        ));
        if let Some(c) = r["replay"].as_str() {
            lines.push(format!("  replay: {}", esc(c)));
        }
    }
    for l in lines {
        outln!("{l}");
    }
}

/// `s` for XML text and attributes: the five special characters escaped, and the characters
/// XML 1.0 cannot hold (most control characters) replaced by U+FFFD.
fn xml(s: &str) -> String {
    escape(s, "&apos;", |c| {
        ((c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
            || c == '\u{FFFE}'
            || c == '\u{FFFF}'
    })
}

/// `s` with `&`, `<`, `>`, `"` escaped, `'` written as `apos`, and the characters `unfit` for
/// the markup replaced by U+FFFD.
fn escape(s: &str, apos: &str, unfit: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str(apos),
            c if unfit(c) => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// The report as JUnit XML: a `<testsuite>` for the suite, a `<testcase>` per run
/// (`classname` the case, `name` the variant and repetition), a `<failure>` per failed one
/// with every failed assertion and the replay command, the answer in `<system-out>`.
pub(crate) fn junit(report: &Value) -> String {
    let results = report["results"].as_array().cloned().unwrap_or_default();
    let name = report["suite"].as_str().unwrap_or("toolloop eval");
    let total_ms = total_ms(&results);
    let secs = |ms: u64| format!("{:.3}", ms as f64 / 1000.0);
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" time=\"{}\">\n",
        xml(name),
        results.len(),
        report["failed"],
        secs(total_ms)
    ));
    x.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"{}\">\n",
        xml(name),
        results.len(),
        report["failed"],
        secs(total_ms)
    ));
    for r in &results {
        let case = r["case"].as_str().unwrap_or("");
        let test = format!(
            "{} #{}",
            r["variant"].as_str().unwrap_or(""),
            r["repetition"]
        );
        x.push_str(&format!(
            "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{}\">\n",
            xml(name),
            xml(case),
            xml(&test),
            secs(r["duration_ms"].as_u64().unwrap_or(0))
        ));
        if r["passed"] != true {
            let failures = failures_of(r);
            let mut body = failures.join("\n");
            if let Some(replay) = r["replay"].as_str() {
                body.push_str(&format!("\nreplay: {replay}"));
            }
            x.push_str(&format!(
                "      <failure message=\"{}\" type=\"assertion\">{}</failure>\n",
                xml(&cut(failures.first().copied().unwrap_or("failed"), 500)),
                xml(&body)
            ));
        }
        if let Some(text) = r["outcome"]["text"].as_str() {
            x.push_str(&format!(
                "      <system-out>{}</system-out>\n",
                xml(&cut(text, 20_000))
            ));
        }
        x.push_str("    </testcase>\n");
    }
    x.push_str("  </testsuite>\n</testsuites>\n");
    x
}

/// `s` for HTML text and attribute values.
fn h(s: &str) -> String {
    escape(s, "&#39;", |c| c == '\0')
}

/// The longest text of one message in a transcript.
const TRANSCRIPT_CHARS: usize = 20_000;

/// A run's transcript as HTML: the task, each call and its result, the answers, the
/// failures, the judge's verdict and how to replay it.
fn transcript(r: &Value) -> String {
    let mut t = String::new();
    let msg = |t: &mut String, who: &str, class: &str, text: &str| {
        t.push_str(&format!(
            "<div class=\"msg {class}\"><b>{}</b><pre>{}</pre></div>",
            h(who),
            h(&cut(text, TRANSCRIPT_CHARS))
        ));
    };
    let calls: Vec<Value> = r["outcome"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let show_calls = |t: &mut String, pick: &dyn Fn(&Value) -> bool| {
        for c in calls.iter().filter(|c| pick(c)) {
            let mut text = format!("{}({})", c["name"].as_str().unwrap_or(""), c["arguments"]);
            if !c["result"].is_null() {
                let result = match &c["result"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                text.push_str(&format!("\n→ {result}"));
            }
            t.push_str(&format!(
                "<div class=\"msg tool\"><b>tool call</b><pre>{}</pre></div>",
                h(&cut(&text, TRANSCRIPT_CHARS))
            ));
        }
    };
    if let Some(s) = r["system"].as_str() {
        msg(&mut t, "system", "system", s);
    }
    if let Some(p) = r["prompt"].as_str() {
        msg(&mut t, "user", "user", p);
        show_calls(&mut t, &|_: &Value| true);
        if let Some(a) = r["outcome"]["text"].as_str() {
            msg(&mut t, "assistant", "assistant", a);
        }
    } else if let Some(turns) = r["turns"].as_array() {
        let said = r["outcome"]["turns"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (i, turn) in turns.iter().enumerate() {
            msg(
                &mut t,
                &format!("user (turn {})", i + 1),
                "user",
                turn.as_str().unwrap_or(""),
            );
            show_calls(&mut t, &|c: &Value| c["turn"] == i + 1);
            if let Some(a) = said.get(i).and_then(|s| s["text"].as_str()) {
                msg(&mut t, "assistant", "assistant", a);
            }
        }
    } else if let Some(w) = r["workflow"].as_str() {
        msg(
            &mut t,
            "workflow",
            "user",
            &format!("{w} with the inputs {}", r["inputs"]),
        );
        let steps = r["outcome"]["workflow"]["steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for s in &steps {
            let id = s["step_id"].as_str().unwrap_or("");
            show_calls(&mut t, &|c: &Value| c["step"] == id);
            let output = match &s["output"] {
                Value::String(o) => o.clone(),
                Value::Null => s["error"].as_str().unwrap_or("").to_string(),
                other => other.to_string(),
            };
            msg(
                &mut t,
                &format!("step {id} ({})", s["status"].as_str().unwrap_or("")),
                "assistant",
                &output,
            );
        }
    }
    if let Some(e) = r["outcome"]["error"]["message"].as_str() {
        msg(&mut t, "error", "error", e);
    }
    let failures = failures_of(r);
    if !failures.is_empty() {
        msg(&mut t, "failed", "error", &failures.join("\n"));
    }
    if r["judge"].is_object() {
        let j = &r["judge"];
        let text = match j["verdict"].as_str() {
            Some(v) => format!("{v}: {}", j["reason"].as_str().unwrap_or("")),
            None => j["error"].as_str().unwrap_or("").to_string(),
        };
        msg(
            &mut t,
            &format!("judge {}", j["model"].as_str().unwrap_or("")),
            "judge",
            &text,
        );
    }
    if let Some(replay) = r["replay"].as_str() {
        msg(&mut t, "replay", "replay", replay);
    }
    t
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #ddd;padding:.4em;\
text-align:left;vertical-align:top}td.n,th.n{text-align:right}tr.fail td.rate{color:#b00020;\
font-weight:bold}tr.pass td.rate{color:#1b5e20}summary{cursor:pointer;color:#0645ad}\
.run{margin:.5em 0;padding:.5em;border-left:3px solid #ccc}.run.fail{border-color:#b00020}\
.msg{margin:.3em 0}.msg pre{white-space:pre-wrap;word-break:break-word;margin:.2em 0;\
padding:.4em;background:#f6f6f6}.msg.error pre{background:#fdecea}.msg.judge pre{background:#eef}";

/// The report as one HTML page: a row per case and variant (pass rate, cost, time), and in
/// each row a `<details>` holding its runs' transcripts.
pub(crate) fn html(report: &Value) -> String {
    let name = report["suite"].as_str().unwrap_or("toolloop eval");
    let results = report["results"].as_array().cloned().unwrap_or_default();
    let summary = report["summary"].as_array().cloned().unwrap_or_default();
    let runs = results.len();
    let failed = report["failed"].as_u64().unwrap_or(0);
    let mut p = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    p.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'\">",
    );
    p.push_str(&format!(
        "<title>toolloop eval: {}</title><style>{STYLE}</style></head><body>",
        h(name)
    ));
    let passed = runs as u64 - failed.min(runs as u64);
    let cost: Option<f64> = results
        .iter()
        .filter_map(|r| r["cost"].as_f64())
        .fold(None, |sum, c| Some(sum.unwrap_or(0.0) + c));
    let ms = total_ms(&results);
    p.push_str(&format!(
        "<h1>toolloop eval: {}</h1><p id=\"totals\">{runs} runs: {passed} passed, {failed} \
         failed ({}% passed) · cost {} · time {}</p>",
        h(name),
        (passed * 100).checked_div(runs as u64).unwrap_or(0),
        h(&money(&json!(cost))),
        h(&seconds(&json!(ms))),
    ));
    p.push_str(
        "<table id=\"summary\"><thead><tr><th>case</th><th>variant</th><th class=\"n\">pass \
         rate</th><th class=\"n\">cost</th><th class=\"n\">time</th><th>runs</th></tr></thead><tbody>",
    );
    for row in &summary {
        let (passed, n) = (
            row["passed"].as_u64().unwrap_or(0),
            row["runs"].as_u64().unwrap_or(0),
        );
        let class = if passed == n { "pass" } else { "fail" };
        let rate = (passed * 100).checked_div(n).unwrap_or(0);
        p.push_str(&format!(
            "<tr class=\"{class}\"><td class=\"case\">{}</td><td class=\"variant\">{}</td>\
             <td class=\"n rate\">{passed}/{n} ({rate}%)</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td><details class=\"transcript\"><summary>transcript</summary>",
            h(row["case"].as_str().unwrap_or("")),
            h(row["variant"].as_str().unwrap_or("")),
            h(&money(&row["cost"])),
            h(&seconds(&row["duration_ms"])),
        ));
        for r in results
            .iter()
            .filter(|r| r["case"] == row["case"] && r["variant"] == row["variant"])
        {
            let ok = r["passed"] == true;
            p.push_str(&format!(
                "<div class=\"run {}\"><b>run {} · {}</b>{}</div>",
                if ok { "pass" } else { "fail" },
                r["repetition"],
                if ok { "passed" } else { "failed" },
                transcript(r)
            ));
        }
        p.push_str("</details></td></tr>");
    }
    p.push_str("</tbody></table></body></html>\n");
    p
}

/// `toolloop eval compare` flags.
#[derive(clap::Args, Debug)]
pub(crate) struct CompareArgs {
    /// The results before (`toolloop eval --json`'s output, or `<out>/report.json`).
    pub before: PathBuf,
    /// The results after.
    pub after: PathBuf,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The largest results file `compare` reads.
const MAX_REPORT_BYTES: u64 = 256 * 1024 * 1024;

fn read_report(path: &std::path::Path) -> Result<Vec<Value>, CliError> {
    let what = || format!("eval compare: {}", path.display());
    let text = toolloop::user_file::read_to_string(path, MAX_REPORT_BYTES)
        .map_err(|e| CliError::invalid(what(), e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| {
        CliError::invalid(
            format!("{}: not the JSON of `toolloop eval --json`", what()),
            e,
        )
    })?;
    match v["summary"].as_array() {
        Some(rows) => Ok(rows.clone()),
        None => match v["results"].as_array() {
            Some(results) => Ok(summarise(results)),
            None => Err(CliError::usage(format!(
                "{}: no `summary`: not the JSON of `toolloop eval --json`",
                what()
            ))),
        },
    }
}

/// How a row changed between two results: `better` or `worse` by its pass rate (`same`
/// otherwise), `added` or `removed`; with each run's cost and time before and after.
fn change(before: Option<&Value>, after: Option<&Value>) -> Value {
    let rate = |r: &Value| {
        r["pass_rate"].as_f64().unwrap_or_else(|| {
            let n = r["runs"].as_f64().unwrap_or(0.0);
            if n == 0.0 {
                0.0
            } else {
                r["passed"].as_f64().unwrap_or(0.0) / n
            }
        })
    };
    let (Some(b), Some(a)) = (before, after) else {
        let row = before.or(after).unwrap_or(&Value::Null);
        return json!({
            "case": row["case"], "variant": row["variant"],
            "status": if before.is_some() { "removed" } else { "added" },
            "pass_rate": [before.map(rate), after.map(rate)],
        });
    };
    let (rb, ra) = (rate(b), rate(a));
    // Each run's own cost and time: a row of more repetitions is not more expensive.
    let per_run = |k: &str| {
        let one = |r: &Value| {
            let n = r["runs"].as_f64().unwrap_or(0.0).max(1.0);
            r[k].as_f64().map(|v| v / n)
        };
        let (x, y) = (one(b), one(a));
        let change = match (x, y) {
            (Some(x), Some(y)) if x > 0.0 => Some((y - x) / x),
            _ => None,
        };
        json!({"before": x, "after": y, "change": change})
    };
    let status = if ra < rb {
        "worse"
    } else if ra > rb {
        "better"
    } else {
        "same"
    };
    json!({
        "case": b["case"], "variant": b["variant"], "status": status,
        "pass_rate": [rb, ra], "runs": [b["runs"], a["runs"]],
        "cost_per_run": per_run("cost"), "ms_per_run": per_run("duration_ms"),
    })
}

fn pct(v: &Value) -> String {
    match v.as_f64() {
        Some(c) => format!("{:+.0}%", c * 100.0),
        None => String::new(),
    }
}

/// `toolloop eval compare A.json B.json`: exit 0 when no pass rate fell, 1 when one did, 2
/// when a file cannot be read.
pub(crate) fn compare(args: &CompareArgs) -> Result<ExitCode, CliError> {
    let before = read_report(&args.before)?;
    let after = read_report(&args.after)?;
    let same = |x: &Value, y: &Value| x["case"] == y["case"] && x["variant"] == y["variant"];
    let mut rows: Vec<Value> = before
        .iter()
        .map(|b| change(Some(b), after.iter().find(|a| same(a, b))))
        .collect();
    rows.extend(
        after
            .iter()
            .filter(|a| !before.iter().any(|b| same(a, b)))
            .map(|a| change(None, Some(a))),
    );
    let worse = rows.iter().filter(|r| r["status"] == "worse").count();
    let better = rows.iter().filter(|r| r["status"] == "better").count();
    if args.json {
        outln!(
            "{}",
            json!({"better": better, "worse": worse, "rows": rows})
        );
    } else {
        let esc = |s: &str| crate::terminal::escape(s, false).into_owned();
        let rate = |v: &Value| {
            v.as_f64()
                .map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0))
        };
        outln!(
            "{:<24} {:<32} {:>8} {:>15} {:>22} {:>18}",
            "case",
            "variant",
            "",
            "pass rate",
            "cost per run",
            "time per run"
        );
        for r in &rows {
            let cost = if r["cost_per_run"].is_object() {
                format!(
                    "{} → {} {}",
                    money(&r["cost_per_run"]["before"]),
                    money(&r["cost_per_run"]["after"]),
                    pct(&r["cost_per_run"]["change"])
                )
            } else {
                String::new()
            };
            let time = if r["ms_per_run"].is_object() {
                format!(
                    "{:.1}s → {:.1}s {}",
                    r["ms_per_run"]["before"].as_f64().unwrap_or(0.0) / 1000.0,
                    r["ms_per_run"]["after"].as_f64().unwrap_or(0.0) / 1000.0,
                    pct(&r["ms_per_run"]["change"])
                )
            } else {
                String::new()
            };
            outln!(
                "{:<24} {:<32} {:>8} {:>15} {:>22} {:>18}",
                esc(r["case"].as_str().unwrap_or("")),
                esc(r["variant"].as_str().unwrap_or("")),
                r["status"].as_str().unwrap_or(""),
                format!(
                    "{} → {}",
                    rate(&r["pass_rate"][0]),
                    rate(&r["pass_rate"][1])
                ),
                cost,
                time
            );
        }
        outln!("{better} better, {worse} worse");
    }
    Ok(if worse > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::{h, xml};

    #[test]
    fn xml_and_html_escape_what_each_cannot_hold() {
        let s = "a&b<c>d\"e'f\tg\nh\ri\u{0}j\u{1b}k\u{FFFE}l\u{FFFF}m";
        assert_eq!(
            xml(s),
            "a&amp;b&lt;c&gt;d&quot;e&apos;f\tg\nh\ri\u{FFFD}j\u{FFFD}k\u{FFFD}l\u{FFFD}m"
        );
        assert_eq!(
            h(s),
            "a&amp;b&lt;c&gt;d&quot;e&#39;f\tg\nh\ri\u{FFFD}j\u{1b}k\u{FFFE}l\u{FFFF}m"
        );
    }
}
