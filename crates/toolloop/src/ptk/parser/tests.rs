use super::{ParsedReply, Piece, Scanner, parse_reply};
use crate::model::ToolSpec;
use crate::ptk::dialect::Dialect;
use serde_json::{Value, json};

fn tool(name: &str, props: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        parameters: json!({"type": "object", "properties": props}),
    }
}

fn tools() -> Vec<ToolSpec> {
    vec![
        tool(
            "read_file",
            json!({"path": {"type": "string"}, "limit": {"type": "integer"}}),
        ),
        tool(
            "get_weather",
            json!({"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                   "tags": {"type": "array"}, "ratio": {"type": ["number", "null"]}}),
        ),
    ]
}

fn one(text: &str) -> ParsedReply {
    parse_reply(text, &tools())
}

fn names_args(r: &ParsedReply) -> Vec<(String, Value)> {
    r.calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect()
}

#[test]
fn seed_ptk_call_with_text_before() {
    let r = one(
        "I'll read the package.json file.\n<PTK_CALL>\n{\n  \"tool\": \"read_file\",\n  \"args\": {\"path\": \"package.json\"},\n  \"reasoning\": \"Need to read package.json to get version\"\n}\n</PTK_CALL>",
    );
    assert_eq!(r.text.as_deref(), Some("I'll read the package.json file."));
    assert_eq!(
        names_args(&r),
        vec![("read_file".into(), json!({"path": "package.json"}))]
    );
    assert_eq!(r.calls[0].dialect, Dialect::Ptk);
    assert!(!r.calls[0].repaired);
    assert_eq!(r.near_miss, None);
}

#[test]
fn hermes_several_calls_and_text_after() {
    let r = one(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\nDone.",
    );
    assert_eq!(
        names_args(&r),
        vec![
            ("get_weather".into(), json!({"city": "Paris"})),
            ("read_file".into(), json!({"path": "a"}))
        ]
    );
    assert_eq!(r.text.as_deref(), Some("Done."));
    assert_eq!(r.calls[0].dialect, Dialect::Hermes);
}

#[test]
fn mistral_array_and_args_forms() {
    let r = one(
        "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}, {\"name\": \"read_file\", \"arguments\": {\"path\": \"x\"}}]",
    );
    assert_eq!(r.calls.len(), 2);
    assert_eq!(r.calls[1].arguments, json!({"path": "x"}));
    let r = one(
        "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]read_file[ARGS]{\"path\": \"y\"}",
    );
    assert_eq!(
        names_args(&r),
        vec![
            ("get_weather".into(), json!({"city": "Paris"})),
            ("read_file".into(), json!({"path": "y"}))
        ]
    );
    assert_eq!(r.text.as_deref(), Some("Checking."));
    let r = one("[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Oslo\"}");
    assert_eq!(
        names_args(&r),
        vec![("get_weather".into(), json!({"city": "Oslo"}))]
    );
    assert_eq!(r.calls[0].dialect, Dialect::Mistral);
}

#[test]
fn llama3_json_with_and_without_python_tag() {
    let r = one(
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"SF\"}}; {\"name\": \"read_file\", \"parameters\": {\"path\": \"b\"}}<|eom_id|>",
    );
    assert_eq!(r.calls.len(), 2, "{r:?}");
    assert_eq!(r.calls[0].arguments, json!({"city": "SF"}));
    assert_eq!(r.text, None);
    let r = one("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"SF\"}}");
    assert_eq!(
        names_args(&r),
        vec![("get_weather".into(), json!({"city": "SF"}))]
    );
    assert_eq!(r.calls[0].dialect, Dialect::Llama3);
    // JSON for the user (not a known tool, not call-shaped) stays text.
    let r = one("{\"name\": \"Bob\", \"age\": 3}");
    assert!(r.calls.is_empty());
    assert_eq!(r.text.as_deref(), Some("{\"name\": \"Bob\", \"age\": 3}"));
    let r = one("{\"name\": \"unknown_tool\", \"parameters\": {}}");
    assert!(r.calls.is_empty() && r.near_miss.is_none());
}

#[test]
fn qwen3_coder_xml_converts_through_the_schema() {
    let r = one(
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=ratio>\nnull\n</parameter>\n</function>\n</tool_call>",
    );
    assert_eq!(
        names_args(&r),
        vec![(
            "get_weather".into(),
            json!({"city": "San Francisco", "days": 3, "metric": true, "tags": ["a", "b"], "ratio": null})
        )]
    );
    assert_eq!(r.calls[0].dialect, Dialect::Qwen3Coder);
    assert_eq!(r.text.as_deref(), Some("Let me check."));
    // A string parameter that looks like a number stays a string.
    let r = one(
        "<tool_call><function=read_file><parameter=path>42</parameter><parameter=limit>10</parameter></function></tool_call>",
    );
    assert_eq!(r.calls[0].arguments, json!({"path": "42", "limit": 10}));
    // Without the wrapper, and without a schema.
    let r = parse_reply(
        "<function=other>\n<parameter=n>\n7\n</parameter>\n<parameter=s>\nhi\n</parameter>\n</function>",
        &[],
    );
    assert_eq!(r.calls[0].arguments, json!({"n": 7, "s": "hi"}));
}

#[test]
fn names_in_tags_are_cleaned_like_json_names() {
    // Found by fuzzing: a quoted name with a space inside the quotes.
    let r = parse_reply("<function=\" f\">{}</function>", &[]);
    assert_eq!(r.calls[0].name, "f");
    let back = parse_reply(
        &super::super::write_call(Dialect::Ptk, &r.calls[0].name, &json!({})),
        &[],
    );
    assert_eq!(back.calls[0].name, "f");
    let r = parse_reply(
        "<tool_call><function='g'><parameter= \"p\" >1</parameter></function></tool_call>",
        &[],
    );
    assert_eq!(
        (r.calls[0].name.as_str(), &r.calls[0].arguments),
        ("g", &json!({"p": 1}))
    );
}

#[test]
fn llama31_function_tag_with_json() {
    let r = one("<function=get_weather>{\"city\": \"Rome\"}</function>");
    assert_eq!(
        names_args(&r),
        vec![("get_weather".into(), json!({"city": "Rome"}))]
    );
}

#[test]
fn fenced_json_calls_and_plain_code_blocks() {
    let r =
        one("Sure.\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"c\"}}\n```\n");
    assert_eq!(
        names_args(&r),
        vec![("read_file".into(), json!({"path": "c"}))]
    );
    assert_eq!(r.calls[0].dialect, Dialect::FencedJson);
    assert_eq!(r.text.as_deref(), Some("Sure."));
    let code = "Here:\n```json\n{\"version\": \"1.2.3\"}\n```\nand\n```rust\nfn main() {}\n```";
    let r = one(code);
    assert!(r.calls.is_empty());
    assert_eq!(r.text.as_deref(), Some(code));
}

#[test]
fn repairs_are_marked() {
    let r =
        one("<PTK_CALL>{'tool': 'read_file', 'args': {path: 'a.txt', 'limit': None,},}</PTK_CALL>");
    assert_eq!(
        names_args(&r),
        vec![("read_file".into(), json!({"path": "a.txt", "limit": null}))]
    );
    assert!(r.calls[0].repaired);
    let r = one(
        "<PTK_CALL>```json\n{\"tool\": \"read_file\", \"args\": {\"path\": \"a\"}}\n```</PTK_CALL>",
    );
    assert!(r.calls[0].repaired, "{r:?}");
    // Arguments flattened next to the name.
    let r = one("<tool_call>{\"name\": \"read_file\", \"path\": \"z\"}</tool_call>");
    assert_eq!(r.calls[0].arguments, json!({"path": "z"}));
    assert!(r.calls[0].repaired);
    // Double-encoded arguments are decoded, as servers send them.
    let r = one(
        "<tool_call>{\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"q\\\"}\"}</tool_call>",
    );
    assert_eq!(r.calls[0].arguments, json!({"path": "q"}));
}

#[test]
fn missing_closing_tag_at_the_end_is_tolerated() {
    let r = one("<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}");
    assert_eq!(
        names_args(&r),
        vec![("read_file".into(), json!({"path": "a"}))]
    );
    let r = one("<PTK_CALL>{\"tool\": \"read_file\", \"args\": {}}\nthen text");
    assert_eq!(r.calls.len(), 1, "{r:?}");
}

#[test]
fn closing_tag_inside_a_json_string_does_not_end_the_call() {
    let r = one(
        "<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": \"</PTK_CALL>\"}}</PTK_CALL>",
    );
    assert_eq!(r.calls[0].arguments, json!({"path": "</PTK_CALL>"}));
    assert_eq!(r.text, None);
}

/// A near miss is explained in the dialect the run taught, whatever format the attempt
/// resembled, and never with a sentence about arguments that the format contradicts.
#[test]
fn near_misses_teach_the_dialect_the_run_taught() {
    let explain = |text: &str, taught: Dialect| -> String {
        let mut scanner = Scanner::new(&tools());
        scanner.teach = Some(taught);
        let mut pieces = Vec::new();
        scanner.push(text, &mut pieces);
        scanner.finish(&mut pieces);
        pieces
            .into_iter()
            .find_map(|p| match p {
                Piece::NearMiss { explanation, .. } => Some(explanation),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no near miss for {text}"))
    };
    // A bare fenced block, in a run taught hermes: told to write hermes, not a fence.
    let fenced =
        "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\" \"x\": ]}\n```";
    let why = explain(fenced, Dialect::Hermes);
    assert!(why.contains(Dialect::Hermes.format()), "{why}");
    assert!(!why.contains("```json"), "{why}");
    assert!(why.contains("one JSON object"), "{why}");
    // Plain text in a <tool_call>: GLM's look-alike is not taught to a hermes run.
    let why = explain(
        "<tool_call>read the file please</tool_call>",
        Dialect::Hermes,
    );
    assert!(why.contains(Dialect::Hermes.format()), "{why}");
    assert!(!why.contains("<arg_key>"), "{why}");
    // A GLM run is taught GLM, without the JSON sentence that contradicts it.
    let why = explain(fenced, Dialect::Glm);
    assert!(why.contains("<arg_key>"), "{why}");
    assert!(!why.contains("JSON object"), "{why}");
    // The model's own words stay in the explanation.
    assert!(
        why.starts_with("Your tool call could not be read: "),
        "{why}"
    );
}

#[test]
fn near_misses_explain_the_format() {
    let cases = [
        (
            "<PTK_CALL>{\"tool\": \"read_file\", \"args\": {\"path\": @}}</PTK_CALL>",
            "<PTK_CALL>",
        ),
        (
            "<PTK_CALL>{\"args\": {\"path\": \"a\"}}</PTK_CALL>",
            "\"tool\"",
        ),
        (
            "<PTK_CALL>{\"tool\": \"read_file\", \"args\": [1]}</PTK_CALL>",
            "JSON object",
        ),
        (
            "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"\n",
            "<tool_call>",
        ),
        ("[TOOL_CALLS]read_file(path=a)\n", "[ARGS]"),
        (
            "```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\" \"x\": ]}\n```",
            "```json",
        ),
        (
            "{\"name\": \"read_file\", \"arguments\": {\"path\": oops}}",
            "\"parameters\"",
        ),
        (
            "<tool_call><function=read_file><parameter=path>a</parameter>junk</function></tool_call>",
            "<parameter=",
        ),
        ("I will call it now: <PTK_CALL>", "unfinished"),
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{\"path\": oops}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁sep｜>",
        ),
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>{\"path\": [}<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_call_argument_begin|>",
        ),
        (
            "<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>a\n</tool_call>",
            "<arg_value>",
        ),
        ("[read_file(path=\"a\", 42)]", "ARGUMENT_NAME=VALUE"),
    ];
    for (text, expect) in cases {
        let r = one(text);
        assert!(r.calls.is_empty(), "{text}: {r:?}");
        let why = r
            .near_miss
            .unwrap_or_else(|| panic!("no near miss for {text}"));
        assert!(why.contains(expect), "{text}: {why}");
        assert!(why.contains("exactly like this"), "{why}");
        assert_eq!(r.malformed.len(), 1, "{text}");
    }
}

#[test]
fn deepseek_v3_v31_and_r1_reasoning() {
    let r = one(
        "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{\"path\": \"<｜tool▁call▁end｜>\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    );
    assert_eq!(
        names_args(&r),
        vec![
            ("get_weather".into(), json!({"city": "Paris", "days": 2})),
            ("read_file".into(), json!({"path": "<｜tool▁call▁end｜>"}))
        ]
    );
    assert_eq!(r.calls[0].dialect, Dialect::DeepSeek);
    assert_eq!(r.text.as_deref(), Some("Let me look."));
    let r = one(
        "<think>\nThe user wants Paris.\n</think>\n\nOK.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    );
    assert_eq!(
        names_args(&r),
        vec![("get_weather".into(), json!({"city": "Paris"}))]
    );
    assert_eq!(r.calls[0].dialect, Dialect::DeepSeekV31);
    assert_eq!(r.text.as_deref(), Some("OK."));
    assert_eq!(r.reasoning.as_deref(), Some("The user wants Paris."));
    // Reasoning cut off by the end of the reply is still reasoning, never text.
    let r = one("<think>still thinking");
    assert_eq!(
        (r.text, r.reasoning.as_deref()),
        (None, Some("still thinking"))
    );
    // A lone call without the section tokens.
    let r = one("<｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{\"path\": \"a\"}<｜tool▁call▁end｜>");
    assert_eq!(
        names_args(&r),
        vec![("read_file".into(), json!({"path": "a"}))]
    );
}

#[test]
fn kimi_k2_calls() {
    let r = one(
        "Checking. <|tool_calls_section_begin|> <|tool_call_begin|>\nfunctions.get_weather:0 <|tool_call_argument_begin|> {\"city\": \"Beijing\"} <|tool_call_end|><|tool_call_begin|>read_file:1<|tool_call_argument_begin|>{}<|tool_call_end|> <|tool_calls_section_end|> Done.",
    );
    assert_eq!(
        names_args(&r),
        vec![
            ("get_weather".into(), json!({"city": "Beijing"})),
            ("read_file".into(), json!({}))
        ]
    );
    assert_eq!(r.calls[0].dialect, Dialect::KimiK2);
    assert_eq!(r.text.as_deref(), Some("Checking.\nDone."));
}

#[test]
fn glm_values_are_converted_by_the_schema() {
    let r = one(
        "I'll check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\"]</arg_value>\n</tool_call>",
    );
    assert_eq!(
        names_args(&r),
        vec![(
            "get_weather".into(),
            json!({"city": "42", "days": 3, "metric": true, "tags": ["a"]})
        )]
    );
    assert_eq!(r.calls[0].dialect, Dialect::Glm);
    // Without a schema, JSON values are read as JSON and the rest stays text.
    let r = parse_reply(
        "<tool_call>other<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>s</arg_key><arg_value>hi there</arg_value></tool_call>",
        &[],
    );
    assert_eq!(r.calls[0].arguments, json!({"n": 7, "s": "hi there"}));
    // No arguments at all.
    let r = one("<tool_call>read_file\n</tool_call>");
    assert_eq!(names_args(&r), vec![("read_file".into(), json!({}))]);
}

#[test]
fn pythonic_calls_are_read_never_evaluated() {
    let r = one(
        "[get_weather(city=\"San Francisco\", days=3, metric=True, tags=['a', \"b\"]), read_file(path='a\\'b', limit=None)]<|eot|>",
    );
    assert_eq!(
        names_args(&r),
        vec![
            (
                "get_weather".into(),
                json!({"city": "San Francisco", "days": 3, "metric": true, "tags": ["a", "b"]})
            ),
            ("read_file".into(), json!({"path": "a'b", "limit": null}))
        ]
    );
    assert_eq!(r.calls[0].dialect, Dialect::Pythonic);
    assert_eq!(r.text, None);
    // Llama 4's tags, and after <|python_tag|>.
    for text in [
        "<|python_start|>[read_file(path=\"x\")]<|python_end|>",
        "<|python_tag|>[read_file(path=\"x\")]",
    ] {
        let r = one(text);
        assert_eq!(
            names_args(&r),
            vec![("read_file".into(), json!({"path": "x"}))],
            "{text}"
        );
        assert_eq!(r.text, None, "{text}");
    }
    // Code is not a value: an attempted call, explained, never run.
    let r = one("[read_file(path=__import__('os').system('rm -rf /'))]");
    assert!(r.calls.is_empty());
    assert!(r.near_miss.unwrap().contains("not valid Python"));
    // Prose and Markdown that start with a bracket stay text.
    for text in [
        "[1, 2, 3] are numbers",
        "[x] done\n[link](http://a.b)",
        "[Note (important)] read this",
        "[unknown_tool(a=1)]",
    ] {
        let r = one(text);
        assert!(r.calls.is_empty() && r.near_miss.is_none(), "{text}: {r:?}");
        assert_eq!(r.text.as_deref(), Some(text), "{text}");
    }
    // Not at the start of a line: text.
    let r = one("Call it like read_file(path=\"a\") or [read_file(path=\"a\")].");
    assert!(r.calls.is_empty());
}

#[test]
fn prose_is_left_alone() {
    for text in [
        "a < b and c > d, [1, 2] and `code` and {braces}",
        "Use the <b>bold</b> tag; the array [TOOL] is fine.",
        "{ this is not json }",
        "",
    ] {
        let r = one(text);
        assert!(r.calls.is_empty() && r.near_miss.is_none(), "{text}: {r:?}");
        assert_eq!(r.text.as_deref().unwrap_or(""), text.trim());
    }
    // Stray closing tags and end tokens are dropped.
    assert_eq!(
        one("done</tool_call><|eot_id|>").text.as_deref(),
        Some("done")
    );
}
