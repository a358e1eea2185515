//! Record and replay over real HTTP: a run against the mock, in each of the four wire APIs,
//! streamed and not, is recorded in a cassette; played back, it gives the same outcome without a
//! request to any server. A changed prompt is refused with a readable diff; the normalised hash
//! ignores the volatile fields and the order of keys.
#![cfg(feature = "http")]

use proptest::prelude::*;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use toolloop::agent::Agent;
use toolloop::model::Model;
use toolloop::outcome::{Outcome, StopReason};
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
use toolloop::transport::cassette::{Cassette, VOLATILE_FIELDS, request_hash};
use toolloop::transport::http::{HttpTransport, RetryPolicy};
use toolloop_mock::{MockOptions, start};

const PROTOCOLS: [&str; 4] = ["openai", "anthropic", "gemini", "openai-responses"];
const SCENARIO: &str = "mock:rounds=2,parallel=2,chunk=5,distinct=true";
const KEY: &str = "sk-cassette-test-key-0123456789";

#[derive(Deserialize, JsonSchema)]
struct Query {
    /// What to look up.
    q: String,
}

fn transport(cassette: &Arc<Cassette>) -> HttpTransport {
    let mut t = HttpTransport::new();
    t.retry = RetryPolicy::none();
    t.connect_retry = std::time::Duration::ZERO;
    t.cassette = Some(cassette.clone());
    t
}

fn model(protocol: &str, base: &str, cassette: &Arc<Cassette>) -> Arc<dyn Model> {
    match protocol {
        "openai" => {
            let mut c = OpenAiConfig::new(SCENARIO).with_base_url(format!("{base}/v1"));
            c.api_key = Some(KEY.into());
            c.transport = transport(cassette);
            Arc::new(OpenAiModel::new(c))
        }
        "anthropic" => {
            let mut c = AnthropicConfig::new(SCENARIO);
            c.base_url = base.to_string();
            c.api_key = Some(KEY.into());
            c.transport = transport(cassette);
            Arc::new(AnthropicModel::new(c))
        }
        "gemini" => {
            let mut c = GeminiConfig::new(SCENARIO);
            c.base_url = base.to_string();
            c.api_key = Some(KEY.into());
            c.transport = transport(cassette);
            Arc::new(GeminiModel::new(c))
        }
        _ => {
            let mut c = ResponsesConfig::new(SCENARIO).with_base_url(format!("{base}/v1"));
            c.api_key = Some(KEY.into());
            c.transport = transport(cassette);
            Arc::new(ResponsesModel::new(c))
        }
    }
}

fn agent(model: Arc<dyn Model>, stream: bool) -> Agent {
    toolloop::agent::AgentBuilder::new(model)
        .tool(tool_fn(
            "lookup",
            "Looks something up.",
            |query: Query, _ctx: ToolContext| async move {
                Ok::<_, ToolError>(ToolOutput::text(format!("{} found", query.q)))
            },
        ))
        .stream(stream)
        .build()
        .expect("agent builds")
}

/// What a replay must give again: the answer, the rounds, and every message of the run (call
/// ids aside: for Gemini, which has none, the loop makes them up on each run).
fn essence(o: &Outcome) -> Value {
    fn without_ids(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "id" | "call_id"))
                    .map(|(k, v)| (k.clone(), without_ids(v)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(without_ids).collect()),
            other => other.clone(),
        }
    }
    json!({
        "stop": o.stop_reason,
        "text": o.text,
        "rounds": o.rounds,
        "calls": o.tool_calls.len(),
        "messages": without_ids(&serde_json::to_value(&o.messages).unwrap()),
    })
}

/// A port nothing listens on.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_replay_offline_in_all_four_apis_streamed_and_not() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let dir = tempfile::tempdir().unwrap();
    for protocol in PROTOCOLS {
        for stream in [false, true] {
            let label = format!("{protocol} stream={stream}");
            let path = dir.path().join(format!("{protocol}-{stream}.jsonl"));
            let settings = json!({"model": format!("{protocol}:{SCENARIO}"), "stream": stream});
            let recorder = Arc::new(Cassette::record(&path, settings.clone()).unwrap());
            let before = server.stats().requests;
            let recorded = agent(model(protocol, &base, &recorder), stream)
                .run(vec![toolloop::message::Message::user(
                    "Look up the weather in Paris and Rome.",
                )])
                .await;
            assert_eq!(
                recorded.stop_reason,
                StopReason::Answered,
                "{label}: {recorded:?}"
            );
            let sent = server.stats().requests - before;
            assert_eq!(sent, 3, "{label}: two rounds of calls, then the answer");
            assert!(recorder.write_error().is_none(), "{label}");

            // The file: owner-only, no key, every request in it, the settings kept.
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains(KEY), "{label}: the key is in the cassette");
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{label}");
            }
            let player = Arc::new(Cassette::load(&path).unwrap());
            assert_eq!(player.settings(), settings, "{label}");
            let exchanges = player.exchanges();
            assert_eq!(exchanges.len(), 3, "{label}");
            assert_eq!(
                exchanges.iter().all(|e| e.events.is_some()),
                stream,
                "{label}: streamed responses keep their events"
            );

            // Played back against a port nothing listens on: the same run, no request anywhere.
            let replayed = agent(model(protocol, &closed_port(), &player), stream)
                .run(vec![toolloop::message::Message::user(
                    "Look up the weather in Paris and Rome.",
                )])
                .await;
            assert_eq!(essence(&replayed), essence(&recorded), "{label}");
            assert_eq!(player.replayed(), 3, "{label}");
            // Against the live mock too: nothing reaches it.
            let player = Arc::new(Cassette::load(&path).unwrap());
            let before = server.stats().requests;
            let again = agent(model(protocol, &base, &player), stream)
                .run(vec![toolloop::message::Message::user(
                    "Look up the weather in Paris and Rome.",
                )])
                .await;
            assert_eq!(essence(&again), essence(&recorded), "{label}");
            assert_eq!(
                server.stats().requests,
                before,
                "{label}: a request reached the mock"
            );

            // A changed prompt: refused, with the difference shown.
            let player = Arc::new(Cassette::load(&path).unwrap());
            let changed = agent(model(protocol, &closed_port(), &player), stream)
                .run(vec![toolloop::message::Message::user(
                    "Look up the weather in Oslo.",
                )])
                .await;
            assert_eq!(changed.stop_reason, StopReason::ModelError, "{label}");
            let why = changed.error.expect("an error").message;
            assert!(why.contains("differs from the recording"), "{label}: {why}");
            assert!(
                why.contains("Paris and Rome") && why.contains("Oslo"),
                "{label}: the diff shows both texts: {why}"
            );
            assert!(
                why.len() < 4000,
                "{label}: the diff is bounded: {}",
                why.len()
            );
        }
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_asks_the_server_and_appends_to_the_cassette() {
    let server = start(MockOptions::default()).await.unwrap();
    let base = server.base_url();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    let recorder = Arc::new(Cassette::record(&path, json!({})).unwrap());
    agent(model("openai", &base, &recorder), false)
        .run(vec![toolloop::message::Message::user("first task")])
        .await;
    let player = Arc::new(Cassette::load(&path).unwrap().with_fallback(true));
    let before = server.stats().requests;
    let other = agent(model("openai", &base, &player), false)
        .run(vec![toolloop::message::Message::user("second task")])
        .await;
    assert_eq!(other.stop_reason, StopReason::Answered, "{other:?}");
    assert_eq!(server.stats().requests - before, 3);
    let grown = Cassette::load(&path).unwrap();
    assert_eq!(grown.exchanges().len(), 6, "the new requests are appended");
    // Both tasks now replay offline.
    for task in ["first task", "second task"] {
        let player = Arc::new(Cassette::load(&path).unwrap());
        let o = agent(model("openai", &closed_port(), &player), false)
            .run(vec![toolloop::message::Message::user(task)])
            .await;
        assert_eq!(o.stop_reason, StopReason::Answered, "{task}: {o:?}");
    }
    server.shutdown().await;
}

#[test]
fn a_corrupt_cassette_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, b"{\"type\":\"cassette\"\n\xff\xfe").unwrap();
    let e = Cassette::load(&path).unwrap_err().to_string();
    assert!(e.contains("bad.jsonl"), "{e}");
    let e = Cassette::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("directory"), "{e}");
    std::fs::write(
        &path,
        "{\"type\":\"cassette\",\"format\":\"toolloop-cassette\",\"version\":1}\n[1,2]\n",
    )
    .unwrap();
    let e = Cassette::load(&path).unwrap_err().to_string();
    assert!(e.contains("line 2"), "{e}");
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z ]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `value` with its objects' keys in reverse order and volatile fields set to `noise` in every
/// object (outside tool arguments and schemas).
fn disturb(value: &Value, noise: &str) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            let mut keys: Vec<&String> = map.keys().collect();
            keys.reverse();
            for k in keys {
                out.insert(k.clone(), disturb(&map[k], noise));
            }
            for field in VOLATILE_FIELDS {
                out.insert((*field).to_string(), Value::from(noise));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| disturb(v, noise)).collect()),
        other => other.clone(),
    }
}

/// Whether `value` holds a key where the normaliser keeps volatile fields (tool data).
fn has_data_field(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(k, v)| {
            [
                "input",
                "args",
                "arguments",
                "parameters",
                "properties",
                "schema",
                "json_schema",
                "input_schema",
            ]
            .contains(&k.as_str())
                || has_data_field(v)
        }),
        Value::Array(items) => items.iter().any(has_data_field),
        _ => false,
    }
}

fn strip_volatile(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !VOLATILE_FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), strip_volatile(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_volatile).collect()),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Same request, same hash; volatile fields and the order of keys do not matter; the host
    /// and the query do not either, the endpoint does.
    #[test]
    fn the_normalised_hash_is_stable(body in json_value(), noise in "[a-z0-9]{1,12}") {
        prop_assume!(!has_data_field(&body));
        let body = strip_volatile(&body);
        let url = "http://a.example/v1/chat/completions";
        let bytes = serde_json::to_vec(&body).unwrap();
        let hash = request_hash(url, &bytes);
        prop_assert_eq!(&hash, &request_hash(url, &bytes));
        let disturbed = serde_json::to_vec(&disturb(&body, &noise)).unwrap();
        prop_assert_eq!(&hash, &request_hash("http://127.0.0.1:9/x/completions?k=1", &disturbed));
        prop_assert_ne!(&hash, &request_hash("http://a.example/v1/messages", &bytes));
        // A real change changes it.
        let changed = json!({"wrapped": body});
        prop_assert_ne!(&hash, &request_hash(url, &serde_json::to_vec(&changed).unwrap()));
    }
}

#[test]
fn volatile_fields_inside_tool_arguments_still_count() {
    let url = "http://a/v1/messages";
    let a =
        json!({"messages": [{"content": [{"type": "tool_use", "id": "x1", "input": {"id": 1}}]}]});
    let b =
        json!({"messages": [{"content": [{"type": "tool_use", "id": "x2", "input": {"id": 2}}]}]});
    let c =
        json!({"messages": [{"content": [{"type": "tool_use", "id": "x3", "input": {"id": 1}}]}]});
    let h = |v: &Value| request_hash(url, &serde_json::to_vec(v).unwrap());
    assert_ne!(h(&a), h(&b), "an argument named `id` is data");
    assert_eq!(h(&a), h(&c), "the call's own id is volatile");
}
