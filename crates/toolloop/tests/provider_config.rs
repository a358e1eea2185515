//! Provider configurations checked before anything is sent: the base URL, and `extra` fields
//! that would replace what the adapter writes itself (the conversation, the tools, the model,
//! streaming).

use serde_json::{Value, json};
use toolloop::message::Message;
use toolloop::model::{Model, ModelError, ModelRequest, ModelSettings};
use toolloop::providers::anthropic::{self, AnthropicConfig, AnthropicModel};
use toolloop::providers::check_base_url;
use toolloop::providers::gemini::{self, GeminiConfig, GeminiModel};
use toolloop::providers::openai::{self, OpenAiConfig, OpenAiModel};

/// Nothing listens there: a call that got as far as sending would fail with a transport error,
/// not a configuration error.
const NOWHERE: &str = "http://127.0.0.1:9";

fn config_error(result: Result<(), ModelError>) -> String {
    match result {
        Err(ModelError::Config(m)) => m,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn base_urls_must_be_http_with_a_host_and_no_query_or_fragment() {
    for good in [
        "http://127.0.0.1:8089",
        "https://api.example.com/v1/",
        " http://localhost:11434/v1 ",
        "https://user:pw@proxy.example.com/openai",
    ] {
        if let Err(e) = check_base_url(good) {
            panic!("{good}: {e}");
        }
    }
    for (bad, why) in [
        ("http//localhost:8089", "is not a URL"),
        ("ftp://example.com", "scheme `ftp`"),
        ("localhost:8089", "http://localhost:8089?"),
        ("https://example.com/v1?key=a", "query"),
        ("https://example.com/v1#frag", "fragment"),
        ("", "is not a URL"),
        ("file:///etc/passwd", "scheme `file`"),
    ] {
        let err = check_base_url(bad).unwrap_err().to_string();
        assert!(err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn validate_checks_the_base_url() {
    let bad = "https://example.com/v1?x=1";
    let mut o = OpenAiConfig::new("m").with_base_url(NOWHERE);
    assert_eq!(o.validate().ok(), Some(()));
    o.base_url = bad.into();
    assert!(config_error(o.validate()).contains("query"));
    let mut a = AnthropicConfig::new("m");
    assert_eq!(a.validate().ok(), Some(()));
    a.base_url = bad.into();
    assert!(config_error(a.validate()).contains("query"));
    let mut g = GeminiConfig::new("m");
    assert_eq!(g.validate().ok(), Some(()));
    g.base_url = bad.into();
    assert!(config_error(g.validate()).contains("query"));
}

fn with_field(field: &str) -> Option<Value> {
    let mut extra = json!({"top_k": 3});
    extra[field] = json!([]);
    Some(extra)
}

/// Makes one call with `settings`: the configuration error it fails with before sending.
async fn call_error(model: &dyn Model, settings: &ModelSettings, stream: bool) -> String {
    let messages = [Message::user("hi")];
    let request = ModelRequest {
        messages: (&messages).into(),
        reminders: &[],
        tools: &[],
        settings,
    };
    let result = if stream {
        model.stream(&request).await.map(|_| ())
    } else {
        model.complete(&request).await.map(|_| ())
    };
    config_error(result)
}

#[tokio::test]
async fn extra_may_not_set_the_fields_an_adapter_owns() {
    let plain = ModelSettings::default();
    for field in openai::OWNED_FIELDS {
        let mut config = OpenAiConfig::new("m").with_base_url(NOWHERE);
        config.extra = with_field(field);
        assert!(config_error(config.validate()).contains(&format!("`{field}`")));
        let model = OpenAiModel::new(config);
        for stream in [false, true] {
            let err = call_error(&model, &plain, stream).await;
            assert!(err.contains(&format!("`{field}`")), "{err}");
        }
        // The settings' extra, given per request, is held to the same rule.
        let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url(NOWHERE));
        let settings = ModelSettings {
            extra: with_field(field),
            ..Default::default()
        };
        let err = call_error(&model, &settings, false).await;
        assert!(err.contains("settings") && err.contains(field), "{err}");
    }
    for field in anthropic::OWNED_FIELDS {
        let mut config = AnthropicConfig::new("m");
        config.base_url = NOWHERE.into();
        config.extra = with_field(field);
        assert!(config_error(config.validate()).contains(&format!("`{field}`")));
        let model = AnthropicModel::new(config);
        for stream in [false, true] {
            let err = call_error(&model, &plain, stream).await;
            assert!(err.contains(&format!("`{field}`")), "{err}");
        }
        let mut config = AnthropicConfig::new("m");
        config.base_url = NOWHERE.into();
        let settings = ModelSettings {
            extra: with_field(field),
            ..Default::default()
        };
        let err = call_error(&AnthropicModel::new(config), &settings, true).await;
        assert!(err.contains("settings") && err.contains(field), "{err}");
    }
    for field in gemini::OWNED_FIELDS {
        let mut config = GeminiConfig::new("m");
        config.base_url = NOWHERE.into();
        config.extra = with_field(field);
        assert!(config_error(config.validate()).contains(&format!("`{field}`")));
        let model = GeminiModel::new(config);
        for stream in [false, true] {
            let err = call_error(&model, &plain, stream).await;
            assert!(err.contains(&format!("`{field}`")), "{err}");
        }
    }
    for owned in [
        openai::OWNED_FIELDS,
        anthropic::OWNED_FIELDS,
        gemini::OWNED_FIELDS,
    ] {
        assert!(owned.contains(&"tools"));
    }
}

#[test]
fn other_extra_fields_pass() {
    let mut o = OpenAiConfig::new("m").with_base_url(NOWHERE);
    o.extra = Some(json!({"top_k": 20, "reasoning_effort": "low"}));
    assert_eq!(o.validate().ok(), Some(()));
    let mut a = AnthropicConfig::new("m");
    a.extra = Some(json!({"thinking": {"type": "enabled", "budget_tokens": 2048}}));
    assert_eq!(a.validate().ok(), Some(()));
    let mut g = GeminiConfig::new("m");
    g.extra = Some(json!({"generationConfig": {"topK": 3}}));
    assert_eq!(g.validate().ok(), Some(()));
}
