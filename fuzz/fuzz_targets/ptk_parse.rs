//! Fuzzes prompt-based tool-call parsing: `parse_reply` must never panic, the stream parser fed
//! the same reply in chunks must agree with it, tolerant JSON must give values that survive a
//! strict round trip, and every call found must read back the same when written in any dialect.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use toolloop::model::ToolSpec;
use toolloop::ptk::{Dialect, StreamParser, json_repair, parse_reply, write_call};
use toolloop::stream::StreamEvent;

fn read_file() -> ToolSpec {
    ToolSpec {
        name: "read_file".into(),
        description: "Read a file".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}),
    }
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

type Meaning = (String, Vec<(String, Value, bool)>, usize);

fn from_events(events: &[StreamEvent]) -> Meaning {
    let mut text = String::new();
    let mut calls: Vec<(String, String, bool)> = Vec::new();
    let mut malformed = 0;
    for e in events {
        match e {
            StreamEvent::TextDelta(t) => text.push_str(t),
            StreamEvent::ToolCallStart { name, .. } => {
                calls.push((name.clone(), String::new(), false))
            }
            StreamEvent::ToolCallDelta { index, arguments } => calls[*index].1.push_str(arguments),
            StreamEvent::ToolCallData { index, .. } => calls[*index].2 = true,
            StreamEvent::Part(p) if p.data.get("malformed").is_some() => malformed += 1,
            _ => {}
        }
    }
    let calls = calls
        .into_iter()
        .map(|(n, a, r)| (n, serde_json::from_str(&a).expect("arguments are JSON"), r))
        .collect();
    (text, calls, malformed)
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let tools = if ctl & 1 == 1 {
        vec![read_file()]
    } else {
        Vec::new()
    };

    // The whole reply at once.
    let whole = parse_reply(&text, &tools);
    let expected: Meaning = (
        whole.text.clone().unwrap_or_default(),
        whole
            .calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone(), c.repaired))
            .collect(),
        whole.malformed.len(),
    );
    assert_eq!(whole.near_miss.is_some(), !whole.malformed.is_empty());

    // The same reply in chunks of `step` characters.
    let step = usize::from(ctl >> 1) % 17 + 1;
    let mut parser = StreamParser::new(&tools);
    let mut events = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    for chunk in chars.chunks(step) {
        let chunk: String = chunk.iter().collect();
        events.extend(parser.push(&chunk));
    }
    events.extend(parser.finish());
    assert_eq!(
        from_events(&events),
        expected,
        "chunked stream disagrees with parse_reply"
    );

    // With the `<think>` opener implicit: the same events whole and chunked.
    let implicit = |chunks: &mut dyn Iterator<Item = String>| {
        let mut parser = StreamParser::with_implicit_think(&tools);
        let mut events = Vec::new();
        for chunk in chunks {
            events.extend(parser.push(&chunk));
        }
        events.extend(parser.finish());
        from_events(&events)
    };
    assert_eq!(
        implicit(&mut chars.chunks(step).map(|c| c.iter().collect())),
        implicit(&mut std::iter::once(text.to_string())),
        "an implicit-think stream disagrees with itself whole"
    );

    // Tolerant JSON: never panics, and what it returns is real JSON.
    if let Ok((value, _)) = json_repair::parse(&text) {
        let again: Value =
            serde_json::from_str(&value.to_string()).expect("repaired JSON re-parses");
        assert_eq!(again, value);
    }
    if let Ok(p) = json_repair::parse_prefix(&text) {
        assert!(p.end <= text.len() && text.is_char_boundary(p.end));
    }

    // Every call found reads back the same in every dialect.
    for call in &whole.calls {
        let props: Map<String, Value> = call
            .arguments
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), json!({"type": type_of(v)})))
                    .collect()
            })
            .unwrap_or_default();
        let spec = ToolSpec {
            name: call.name.clone(),
            description: String::new(),
            parameters: json!({"type": "object", "properties": props}),
        };
        for d in Dialect::ALL {
            let written = write_call(d, &call.name, &call.arguments);
            let back = parse_reply(&written, std::slice::from_ref(&spec));
            assert_eq!(back.calls.len(), 1, "{d}: {written}");
            assert_eq!(back.calls[0].name, call.name, "{d}: {written}");
            assert_eq!(back.calls[0].arguments, call.arguments, "{d}: {written}");
        }
    }
});
