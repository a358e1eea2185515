//! How to reach the Gemini API, and the checks made before anything is sent.

use crate::model::ModelError;
use crate::providers::adapter;
use crate::providers::adapter::Vars;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use http::header::{HeaderMap, HeaderName};
use serde_json::Value;

/// The provider name on [`ProviderPart`](crate::message::ProviderPart)s and in `provider_data` this
/// adapter produces.
pub const PROVIDER: &str = "gemini";
/// The default API address.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";
/// The API version path used when the base URL names none.
pub const API_VERSION: &str = "v1beta";

/// How to reach the Gemini API. Its `Debug` form hides the key.
#[derive(Clone)]
pub struct GeminiConfig {
    /// The model id (`gemini-2.5-flash`, …), with or without a `models/` prefix.
    pub model: String,
    /// The API address (default [`DEFAULT_BASE_URL`], env `GEMINI_BASE_URL` or
    /// `GOOGLE_GEMINI_BASE_URL`). `/v1beta` is added unless the address ends with a version.
    pub base_url: String,
    /// The API key, sent as `x-goog-api-key` (env `GEMINI_API_KEY`, else `GOOGLE_API_KEY`).
    pub api_key: Option<String>,
    /// Extra request fields, merged (deeply) into every request body before the settings' own
    /// `extra` (`{"generationConfig": {"thinkingConfig": {"thinkingBudget": 1024}}}`).
    pub extra: Option<Value>,
    /// The HTTP transport (retries, limits).
    #[cfg(feature = "http")]
    pub transport: HttpTransport,
}

impl std::fmt::Debug for GeminiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("GeminiConfig");
        d.field("model", &self.model);
        d.field("base_url", &self.base_url);
        d.field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"));
        d.field("extra", &self.extra);
        #[cfg(feature = "http")]
        d.field("transport", &self.transport);
        d.finish()
    }
}

impl GeminiConfig {
    /// A configuration with the defaults and no key.
    pub fn new(model: impl Into<String>) -> Self {
        GeminiConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            extra: None,
            #[cfg(feature = "http")]
            transport: HttpTransport::new(),
        }
    }

    /// A configuration from the environment (see the fields). The key is required unless a base
    /// URL other than the official API is given.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ModelError> {
        Self::from_vars(model, |name| std::env::var(name).ok())
    }

    /// Like [`GeminiConfig::from_env`], reading variables through `var`.
    pub fn from_vars(
        model: impl Into<String>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let mut config = GeminiConfig::new(model);
        adapter::require_model(&config.model, "Gemini", "gemini", "gemini-2.5-flash")?;
        (config.base_url, config.api_key) = Vars::read(
            var,
            &["GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"],
            &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        )
        .base_url_and_key(
            DEFAULT_BASE_URL,
            "neither GEMINI_API_KEY nor GOOGLE_API_KEY is set: the Gemini API needs a key (or \
             set GEMINI_BASE_URL to a server that needs none)",
        )?;
        Ok(config)
    }

    fn model_url(&self, model: &str) -> String {
        let base = self.base_url.trim_end_matches('/');
        let versioned = base
            .rsplit('/')
            .next()
            .is_some_and(|last| last.starts_with("v1"));
        let model = model.strip_prefix("models/").unwrap_or(model);
        if versioned {
            format!("{base}/models/{model}")
        } else {
            format!("{base}/{API_VERSION}/models/{model}")
        }
    }

    /// The endpoint for `model`: `generateContent`, or streamed,
    /// `streamGenerateContent?alt=sse`.
    pub fn endpoint(&self, model: &str, stream: bool) -> String {
        if stream {
            format!("{}:streamGenerateContent?alt=sse", self.model_url(model))
        } else {
            format!("{}:generateContent", self.model_url(model))
        }
    }

    /// The request headers: `x-goog-api-key` when there is a key.
    pub fn headers(&self) -> Result<HeaderMap, ModelError> {
        let mut headers = HeaderMap::new();
        adapter::insert_key(
            &mut headers,
            HeaderName::from_static("x-goog-api-key"),
            "",
            self.api_key.as_deref(),
        )?;
        Ok(headers)
    }
}

/// The top-level request fields this adapter writes itself: the system instruction, the
/// conversation (`contents`) and the tool catalog and configuration, in either spelling the API
/// accepts (the model and the streaming mode are in the URL). An `extra` (the adapter's or the
/// settings') that sets one is refused with [`ModelError::Config`], by [`GeminiConfig::validate`]
/// and by every call.
pub const OWNED_FIELDS: &[&str] = &[
    "contents",
    "systemInstruction",
    "system_instruction",
    "tools",
    "toolConfig",
    "tool_config",
];

impl GeminiConfig {
    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (none of the [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        adapter::validate_config("Gemini", &self.base_url, self.extra.as_ref(), OWNED_FIELDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_key() {
        let mut c = GeminiConfig::new("m");
        c.api_key = Some("sk-secret".into());
        let shown = format!("{:?} {:?}", c, super::super::GeminiModel::new(c.clone()));
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn config_and_urls() {
        let c = GeminiConfig::from_vars("models/gemini-2.5-flash", |k| {
            (k == "GOOGLE_API_KEY").then(|| "g-key".to_string())
        })
        .unwrap();
        assert_eq!(
            c.endpoint(&c.model, false),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(c.headers().unwrap()["x-goog-api-key"], "g-key");
        let local = GeminiConfig::from_vars("m", |k| {
            (k == "GEMINI_BASE_URL").then(|| "http://127.0.0.1:1/v1beta/".into())
        })
        .unwrap();
        assert_eq!(
            local.endpoint("m", true),
            "http://127.0.0.1:1/v1beta/models/m:streamGenerateContent?alt=sse"
        );
        assert!(
            GeminiConfig::from_vars("m", |_| None)
                .unwrap_err()
                .to_string()
                .contains("GEMINI_API_KEY")
        );
    }
}
