//! `toolloop run --output-schema FILE`: the answer is JSON validated against the schema.

use crate::common;
use common::{command, json_of, mock, repo, toolloop};
use serde_json::json;

const SCHEMA: &str = r#"{
  "title": "Answer",
  "type": "object",
  "properties": {
    "version": {"type": "string", "examples": ["1.2.3"]},
    "files": {"type": "integer"}
  },
  "required": ["version", "files"]
}"#;

#[test]
fn every_provider_answers_with_validated_json_against_the_mock() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base = server.base_url();
    let dir = repo();
    std::fs::write(dir.path().join("answer.json"), SCHEMA).unwrap();
    for (provider, url) in [
        ("openai", format!("{base}/v1")),
        ("anthropic", base.clone()),
        ("gemini", base.clone()),
    ] {
        let model = format!("{provider}:mock:rounds=1");
        let common = ["--model", &model, "--base-url", &url];
        let mut args = vec!["run", "--json", "--output-schema", "answer.json"];
        args.extend(common);
        args.push("What is the version?");
        let out = toolloop(&args, dir.path());
        assert_eq!(
            out.status.code(),
            Some(0),
            "{provider}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json_of(&out);
        assert_eq!(v["stop_reason"], "answered", "{provider}");
        assert_eq!(
            v["output"],
            json!({"version": "1.2.3", "files": 0}),
            "{provider}"
        );

        // Without --json, stdout is the validated JSON alone.
        let mut args = vec!["run", "--output-schema", "answer.json"];
        args.extend(common);
        args.push("What is the version?");
        let out = toolloop(&args, dir.path());
        assert_eq!(out.status.code(), Some(0), "{provider}");
        let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(printed, json!({"version": "1.2.3", "files": 0}));
    }
    let stats = server.stats();
    assert_eq!(stats.rejected, 0);
    assert_eq!(stats.output_schemas, 12, "two requests per run, six runs");
    rt.block_on(server.shutdown());
}

#[test]
fn the_offline_model_and_the_configuration_file_take_a_schema() {
    let dir = repo();
    std::fs::write(dir.path().join("answer.json"), SCHEMA).unwrap();
    let out = toolloop(&["run", "--output-schema", "answer.json", "go"], dir.path());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert_eq!(json_of(&out), json!({"version": "1.2.3", "files": 0}));

    let config = dir.path().join("config.toml");
    let schema_path = dir.path().join("answer.json");
    std::fs::write(
        &config,
        format!("output_schema = {:?}\n", schema_path.to_string_lossy()),
    )
    .unwrap();
    let out = command(&["run", "--json", "go"], dir.path())
        .env("TOOLLOOP_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        json_of(&out)["output"],
        json!({"version": "1.2.3", "files": 0})
    );
}

#[test]
fn an_unusable_schema_file_is_a_usage_error_naming_the_flag() {
    let dir = repo();
    std::fs::write(dir.path().join("text.json"), "not json").unwrap();
    std::fs::write(dir.path().join("list.json"), "[1, 2]").unwrap();
    std::fs::write(dir.path().join("bad.json"), r#"{"type": "nonsense"}"#).unwrap();
    for (file, expected) in [
        ("missing.json", "missing.json"),
        ("text.json", "not JSON"),
        ("list.json", "expected a JSON Schema object"),
        ("bad.json", "not a valid JSON Schema"),
    ] {
        let out = toolloop(&["run", "--output-schema", file, "go"], dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
        assert!(
            stderr.contains("--output-schema") && stderr.contains(expected),
            "{file}: {stderr}"
        );
    }
}
