//! How to reach the Anthropic Messages API, and the checks made before anything is sent.

use crate::model::ModelError;
use crate::providers::adapter;
use crate::providers::adapter::Vars;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// The provider name on [`ProviderPart`](crate::message::ProviderPart)s this adapter produces.
pub const PROVIDER: &str = "anthropic";
/// The default API address.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The default `anthropic-version` header.
pub const DEFAULT_VERSION: &str = "2023-06-01";
/// The default `max_tokens` when the settings give none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The most `cache_control` breakpoints the API accepts in one request.
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// How to reach the Anthropic Messages API. Its `Debug` form hides the key.
#[derive(Clone)]
pub struct AnthropicConfig {
    /// The model id (`claude-sonnet-4-5`, …).
    pub model: String,
    /// The API address without `/v1` (default [`DEFAULT_BASE_URL`], env `ANTHROPIC_BASE_URL`).
    pub base_url: String,
    /// The API key, sent as `x-api-key` (env `ANTHROPIC_API_KEY`). Optional only for servers
    /// that need none (a local mock).
    pub api_key: Option<String>,
    /// The `anthropic-version` header (default [`DEFAULT_VERSION`]).
    pub version: String,
    /// `max_tokens` when the settings give none (default [`DEFAULT_MAX_TOKENS`]).
    pub max_tokens: u32,
    /// Whether to place prompt-caching breakpoints (default `true`).
    pub cache: bool,
    /// Extra request fields, merged (deeply) into every request body before the settings' own
    /// `extra` (`{"thinking": {"type": "enabled", "budget_tokens": 2048}}`).
    pub extra: Option<Value>,
    /// The HTTP transport (retries, limits).
    #[cfg(feature = "http")]
    pub transport: HttpTransport,
}

impl std::fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("AnthropicConfig");
        d.field("model", &self.model);
        d.field("base_url", &self.base_url);
        d.field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"));
        d.field("version", &self.version);
        d.field("max_tokens", &self.max_tokens);
        d.field("cache", &self.cache);
        d.field("extra", &self.extra);
        #[cfg(feature = "http")]
        d.field("transport", &self.transport);
        d.finish()
    }
}

impl AnthropicConfig {
    /// A configuration with the defaults and no key.
    pub fn new(model: impl Into<String>) -> Self {
        AnthropicConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            version: DEFAULT_VERSION.to_string(),
            max_tokens: DEFAULT_MAX_TOKENS,
            cache: true,
            extra: None,
            #[cfg(feature = "http")]
            transport: HttpTransport::new(),
        }
    }

    /// A configuration from the environment: `ANTHROPIC_API_KEY`, and `ANTHROPIC_BASE_URL` when
    /// set. The key is required unless a base URL other than the official API is given.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ModelError> {
        Self::from_vars(model, |name| std::env::var(name).ok())
    }

    /// Like [`AnthropicConfig::from_env`], reading variables through `var`.
    pub fn from_vars(
        model: impl Into<String>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let mut config = AnthropicConfig::new(model);
        adapter::require_model(&config.model, "Anthropic", "anthropic", "claude-sonnet-4-5")?;
        (config.base_url, config.api_key) =
            Vars::read(var, &["ANTHROPIC_BASE_URL"], &["ANTHROPIC_API_KEY"]).base_url_and_key(
                DEFAULT_BASE_URL,
                "ANTHROPIC_API_KEY is not set: the Anthropic API needs a key (or set \
                 ANTHROPIC_BASE_URL to a server that needs none)",
            )?;
        Ok(config)
    }

    /// The Messages endpoint: `{base_url}/v1/messages`.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/messages")
    }

    /// The request headers: `x-api-key` (when there is a key) and `anthropic-version`.
    pub fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        adapter::insert_key(
            &mut headers,
            HeaderName::from_static("x-api-key"),
            "",
            self.api_key.as_deref(),
        )?;
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_str(&self.version).map_err(|_| {
                ModelError::Config(
                    "the anthropic-version value contains characters not allowed in an HTTP \
                     header"
                        .into(),
                )
            })?,
        );
        Ok(headers)
    }
}

/// The top-level request fields this adapter writes itself: the model, the system prompt, the
/// conversation, the tool catalog and choice, and the streaming mode. An `extra` (the adapter's or
/// the settings') that sets one is refused with [`ModelError::Config`], by
/// [`AnthropicConfig::validate`] and by every call.
pub const OWNED_FIELDS: &[&str] = &[
    "model",
    "system",
    "messages",
    "tools",
    "tool_choice",
    "stream",
];

impl AnthropicConfig {
    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (none of the [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        adapter::validate_config(
            "Anthropic",
            &self.base_url,
            self.extra.as_ref(),
            OWNED_FIELDS,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_key() {
        let mut c = AnthropicConfig::new("m");
        c.api_key = Some("sk-secret".into());
        let shown = format!("{:?} {:?}", c, super::super::AnthropicModel::new(c.clone()));
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn config_from_vars() {
        let vars = |k: &str| match k {
            "ANTHROPIC_API_KEY" => Some("sk-1".to_string()),
            _ => None,
        };
        let c = AnthropicConfig::from_vars("claude-x", vars).unwrap();
        assert_eq!(c.endpoint(), "https://api.anthropic.com/v1/messages");
        assert_eq!(c.headers().unwrap()["x-api-key"], "sk-1");
        assert_eq!(c.headers().unwrap()["anthropic-version"], DEFAULT_VERSION);
        let err = AnthropicConfig::from_vars("claude-x", |_| None).unwrap_err();
        assert!(err.to_string().contains("ANTHROPIC_API_KEY"));
        let local = AnthropicConfig::from_vars("m", |k| {
            (k == "ANTHROPIC_BASE_URL").then(|| "http://127.0.0.1:9/v1/".to_string())
        })
        .unwrap();
        assert_eq!(local.endpoint(), "http://127.0.0.1:9/v1/messages");
    }
}
