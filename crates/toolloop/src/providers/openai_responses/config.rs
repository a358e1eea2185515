//! How to reach a server that speaks the OpenAI Responses API, and the checks made before
//! anything is sent.

use crate::model::ModelError;
use crate::providers::adapter;
use crate::providers::openai::OpenAiConfig;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use http::header::{AUTHORIZATION, HeaderMap};
use serde_json::Value;

/// OpenAI's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The `provider` of the [`ProviderPart`](crate::message::ProviderPart)s this adapter makes
/// (reasoning items); only this adapter sends them back.
pub const PROVIDER: &str = "openai-responses";

/// The top-level request fields this adapter writes itself: the model, the system prompt, the
/// conversation, the tool catalog and choice, and the streaming mode. An `extra` (the adapter's or
/// the settings') that sets one is refused with [`ModelError::Config`], by
/// [`ResponsesConfig::validate`] and by every call.
pub const OWNED_FIELDS: &[&str] = &[
    "model",
    "instructions",
    "input",
    "tools",
    "tool_choice",
    "stream",
    "previous_response_id",
];

/// How to reach a Responses API server. Its `Debug` form hides the key.
#[derive(Clone)]
pub struct ResponsesConfig {
    /// The model name sent in the request (`gpt-5`, `o4-mini`, …).
    pub model: String,
    /// The API's base URL, up to and without `/responses` (default
    /// `https://api.openai.com/v1`).
    pub base_url: String,
    /// The API key, sent as `Authorization: Bearer <key>`; `None` sends no such header.
    pub api_key: Option<String>,
    /// Whether the server may keep the responses (`store`, default `false`: every request carries
    /// the whole conversation, and reasoning travels encrypted in it).
    pub store: bool,
    /// The `reasoning` object (`{"effort": "low"}`, `{"effort": "high", "summary": "auto"}`);
    /// `None` leaves it to the model. When reasoning is requested, here or by an `extra` that
    /// sets `reasoning`, the request asks for `include: ["reasoning.encrypted_content"]`, so that
    /// the reasoning items can be sent back on the next round.
    pub reasoning: Option<Value>,
    /// `parallel_tool_calls`; `None` leaves it to the server (which allows parallel calls).
    pub parallel_tool_calls: Option<bool>,
    /// Whether function tools are declared with `strict: true` (default `false`: strict mode
    /// requires every property to be required and `additionalProperties: false`, which not every
    /// tool's schema says).
    pub strict: bool,
    /// Extra top-level request fields (a JSON object), merged into every request body last.
    pub extra: Option<Value>,
    /// The HTTP client, with its retry policy and body-size limit.
    #[cfg(feature = "http")]
    pub transport: HttpTransport,
}

impl std::fmt::Debug for ResponsesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ResponsesConfig");
        d.field("model", &self.model);
        d.field("base_url", &self.base_url);
        d.field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"));
        d.field("store", &self.store);
        d.field("reasoning", &self.reasoning);
        d.field("parallel_tool_calls", &self.parallel_tool_calls);
        d.field("strict", &self.strict);
        d.field("extra", &self.extra);
        #[cfg(feature = "http")]
        d.field("transport", &self.transport);
        d.finish()
    }
}

impl ResponsesConfig {
    /// A configuration for `model` on OpenAI's own API, with no key.
    pub fn new(model: impl Into<String>) -> Self {
        ResponsesConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            store: false,
            reasoning: None,
            parallel_tool_calls: None,
            strict: false,
            extra: None,
            #[cfg(feature = "http")]
            transport: HttpTransport::new(),
        }
    }

    /// Sets the base URL.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Reads the key and the base URL from the environment as
    /// [`OpenAiConfig::from_env`] does (the same variables and checks); a blank model is refused.
    pub fn from_env(model: &str, api_key_env: Option<&str>) -> Result<Self, ModelError> {
        Self::from_vars(model, api_key_env, |name| std::env::var(name).ok())
    }

    /// Like [`ResponsesConfig::from_env`], reading variables through `lookup`.
    pub fn from_vars(
        model: &str,
        api_key_env: Option<&str>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        adapter::require_model(model, "OpenAI Responses", "openai-responses", "gpt-5-mini")?;
        // The variables and the checks of the Chat Completions adapter: the same servers.
        let openai = OpenAiConfig::from_vars(model.trim(), api_key_env, lookup)?;
        let mut config = ResponsesConfig::new(model.trim()).with_base_url(openai.base_url);
        config.api_key = openai.api_key;
        Ok(config)
    }

    /// Whether the base URL is OpenAI's own API (`api.openai.com`).
    pub fn is_openai(&self) -> bool {
        crate::providers::openai::is_openai_url(&self.base_url)
    }

    /// The full URL requests are sent to: `{base_url}/responses` (a base URL already ending in
    /// `/responses` is used as it is).
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim().trim_end_matches('/');
        if base.ends_with("/responses") {
            base.to_string()
        } else {
            format!("{base}/responses")
        }
    }

    /// The request headers: `Authorization: Bearer <key>` when there is a key (marked
    /// sensitive, so it is never logged).
    pub fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        adapter::insert_key(
            &mut headers,
            AUTHORIZATION,
            "Bearer ",
            self.api_key.as_deref(),
        )?;
        Ok(headers)
    }

    /// Whether reasoning is requested: [`ResponsesConfig::reasoning`] is set, or an `extra` sets
    /// `reasoning`.
    pub(super) fn wants_reasoning(&self, settings_extra: Option<&Value>) -> bool {
        self.reasoning.as_ref().is_some_and(|r| !r.is_null())
            || [self.extra.as_ref(), settings_extra]
                .into_iter()
                .flatten()
                .any(|e| e.get("reasoning").is_some_and(|r| !r.is_null()))
    }

    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (a JSON object that sets none of the
    /// [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        check_extra("the adapter's `extra`", self.extra.as_ref())?;
        adapter::validate_config(
            "OpenAI Responses",
            &self.base_url,
            self.extra.as_ref(),
            OWNED_FIELDS,
        )
    }
}

/// Refuses an `extra` that is not a JSON object or that sets one of the [`OWNED_FIELDS`].
pub(super) fn check_extra(what: &str, extra: Option<&Value>) -> Result<(), ModelError> {
    let example = r#"{"reasoning": {"effort": "low"}}"#;
    adapter::check_object_extra("OpenAI Responses", what, extra, OWNED_FIELDS, example)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c =
            ResponsesConfig::from_vars("gpt", None, env(&[("OPENAI_API_KEY", "sk-1")])).unwrap();
        assert_eq!(c.api_key.as_deref(), Some("sk-1"));
        assert_eq!(c.endpoint(), "https://api.openai.com/v1/responses");
        assert!(!c.store);
        let e = ResponsesConfig::from_vars("gpt", None, env(&[])).unwrap_err();
        assert!(e.to_string().contains("OPENAI_API_KEY"), "{e}");
        let c = ResponsesConfig::from_vars(
            "m",
            None,
            env(&[("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1/")]),
        )
        .unwrap();
        assert_eq!(c.api_key, None);
        assert_eq!(c.endpoint(), "http://127.0.0.1:8080/v1/responses");
        let c = c.with_base_url("http://x/v1/responses");
        assert_eq!(c.endpoint(), "http://x/v1/responses");
        let e = ResponsesConfig::from_vars(" ", None, env(&[])).unwrap_err();
        assert!(e.to_string().contains("openai-responses:<model>"), "{e}");
    }

    #[test]
    fn debug_hides_the_key_and_extra_may_not_own_fields() {
        let mut c = ResponsesConfig::new("m");
        c.api_key = Some("sk-secret".into());
        let shown = format!("{c:?} {:?}", c.headers().unwrap());
        assert!(!shown.contains("sk-secret"), "{shown}");
        c.extra = Some(serde_json::json!({"input": []}));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("`input`"), "{e}");
        c.extra = Some(serde_json::json!([1]));
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        c.extra = Some(serde_json::json!({"reasoning": {"effort": "low"}}));
        assert!(c.validate().is_ok());
        assert!(c.wants_reasoning(None));
    }
}
