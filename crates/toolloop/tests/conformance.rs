//! The conformance corpus: every recorded provider response in `tests/conformance/` must decode
//! to the meaning its `expected.json` gives. New case folders are picked up with no code change.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use toolloop::model::ToolSpec;
use toolloop::providers::Decoded;
use toolloop::ptk::{StreamParser, parse_reply};
use toolloop::stream::StreamEvent;

/// One recorded case.
struct Case {
    name: String,
    status: u16,
    stream: bool,
    body: Vec<u8>,
    expected: Value,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

/// Every case whose `meta.json` names `api`.
fn cases(api: &str) -> Vec<Case> {
    let mut out = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(corpus_dir())
        .expect("the corpus folder exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("meta.json").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let meta: Value =
            serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
        if meta["api"] != api {
            continue;
        }
        let file = meta["response_file"].as_str().unwrap();
        out.push(Case {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            status: meta["http_status"].as_u64().unwrap() as u16,
            stream: meta["stream"].as_bool().unwrap(),
            body: std::fs::read(dir.join(file)).unwrap(),
            expected: serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap())
                .unwrap(),
        });
    }
    out
}

/// The normalized meaning of a decoded response, in `expected.json`'s schema.
fn meaning(d: &Decoded, anthropic_usage: bool) -> Value {
    let r = &d.response;
    let calls: Vec<Value> = r
        .tool_calls
        .iter()
        .map(|c| match &c.invalid_arguments {
            Some(raw) => {
                json!({"id": c.id, "name": c.name, "arguments": null, "arguments_raw": raw})
            }
            None => json!({"id": c.id, "name": c.name, "arguments": c.arguments}),
        })
        .collect();
    let usage = r.usage.map(|u| {
        // Anthropic reports input tokens without cache reads and writes; our Usage includes them.
        let input = if anthropic_usage {
            u.uncached_input_tokens()
        } else {
            u.input_tokens
        };
        json!({"input_tokens": input, "output_tokens": u.output_tokens})
    });
    let mut v = json!({
        "text": r.text,
        "tool_calls": calls,
        "finish_reason": r.finish_reason,
        "usage": usage,
    });
    if let Some(e) = &d.error {
        v["finish_reason"] = json!("error");
        v["error"] = json!({"http_status": e.status, "type": e.error_type, "code": e.code, "message": e.message});
    }
    v
}

/// Normalizes the expected value where the corpus allows freedom: ids that are null may be
/// anything, and error codes compare as text.
fn compare(case: &Case, got: &Value) -> Result<(), String> {
    let mut want = case.expected.clone();
    let mut got = got.clone();
    if let (Some(w), Some(g)) = (
        want["tool_calls"].as_array_mut(),
        got["tool_calls"].as_array_mut(),
    ) {
        for (wc, gc) in w.iter_mut().zip(g.iter_mut()) {
            if wc["id"].is_null() {
                wc["id"] = gc["id"].clone();
            }
        }
    }
    if let Some(code) = want.pointer("/error/code").cloned()
        && code.is_number()
    {
        want["error"]["code"] = json!(code.to_string());
    }
    if want == got {
        Ok(())
    } else {
        Err(format!(
            "{}:\n  expected {}\n  got      {}",
            case.name,
            serde_json::to_string(&want).unwrap(),
            serde_json::to_string(&got).unwrap()
        ))
    }
}

/// Decodes every case of `api` and reports all mismatches at once.
#[allow(dead_code)]
fn check_api(api: &str, decode: impl Fn(u16, &[u8], bool) -> Decoded, anthropic_usage: bool) {
    let cases = cases(api);
    assert!(!cases.is_empty(), "no {api} cases found");
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            compare(
                c,
                &meaning(&decode(c.status, &c.body, c.stream), anthropic_usage),
            )
            .err()
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} {api} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{api}: {} cases passed", cases.len());
}

#[test]
fn corpus_is_present() {
    assert!(cases("openai-chat").len() >= 30);
    assert!(cases("anthropic-messages").len() >= 14);
    assert!(cases("gemini").len() >= 8);
}

#[test]
fn openai_chat_corpus() {
    check_api(
        "openai-chat",
        toolloop::providers::openai::decode_recorded,
        false,
    );
}

#[test]
fn openai_responses_corpus() {
    assert!(cases("openai-responses").len() >= 8);
    check_api(
        "openai-responses",
        toolloop::providers::openai_responses::decode_recorded,
        false,
    );
}

#[test]
fn anthropic_messages_corpus() {
    check_api(
        "anthropic-messages",
        toolloop::providers::anthropic::decode_recorded,
        true,
    );
}

#[test]
fn gemini_corpus() {
    check_api(
        "gemini",
        toolloop::providers::gemini::decode_recorded,
        false,
    );
}

/// The prompt-based cases (`api` `ptk-text`): a model's raw text, read with `parse_reply`, and
/// streamed character by character through the `StreamParser`, must give the calls, text and
/// reasoning of `expected.json`.
#[test]
fn prompt_based_text_corpus() {
    let mut dirs: Vec<_> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut count = 0;
    let mut failures = Vec::new();
    for dir in dirs {
        let Ok(meta) = std::fs::read(dir.join("meta.json")) else {
            continue;
        };
        let meta: Value = serde_json::from_slice(&meta).unwrap();
        if meta["api"] != "ptk-text" {
            continue;
        }
        count += 1;
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(dir.join("response.txt")).unwrap();
        let tools: Vec<ToolSpec> = match std::fs::read(dir.join("tools.json")) {
            Ok(b) => serde_json::from_slice(&b).unwrap(),
            Err(_) => Vec::new(),
        };
        let expected: Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let want_calls: Vec<(Value, Value)> = expected["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].clone(), c["arguments"].clone()))
            .collect();
        let parsed = parse_reply(&text, &tools);
        let got_calls: Vec<(Value, Value)> = parsed
            .calls
            .iter()
            .map(|c| (json!(c.name), c.arguments.clone()))
            .collect();
        let got = json!({
            "text": parsed.text,
            "calls": got_calls,
            "reasoning": parsed.reasoning,
            "near_miss": parsed.near_miss,
        });
        let want = json!({
            "text": expected["text"],
            "calls": want_calls,
            "reasoning": expected.get("reasoning").cloned().unwrap_or(Value::Null),
            "near_miss": null,
        });
        if got != want {
            failures.push(format!("{name}:\n  expected {want}\n  got      {got}"));
            continue;
        }
        // Streamed one character at a time: the same calls, and no tag in the text.
        let mut parser = StreamParser::new(&tools);
        let mut events = Vec::new();
        for ch in text.chars() {
            events.extend(parser.push(&ch.to_string()));
        }
        events.extend(parser.finish());
        let mut streamed_text = String::new();
        let mut names = Vec::new();
        for e in &events {
            match e {
                StreamEvent::TextDelta(t) => streamed_text.push_str(t),
                StreamEvent::ToolCallStart { name, .. } => names.push(json!(name)),
                _ => {}
            }
        }
        let want_names: Vec<Value> = want_calls.iter().map(|c| c.0.clone()).collect();
        if names != want_names || parsed.text.as_deref().unwrap_or("") != streamed_text {
            failures.push(format!(
                "{name}: streamed text {streamed_text:?} and calls {names:?} differ"
            ));
        }
    }
    assert!(count >= 7, "only {count} ptk-text cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
