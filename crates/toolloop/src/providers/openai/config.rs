//! How to reach an OpenAI-compatible server, and the checks made before anything is sent.

use crate::model::ModelError;
use crate::providers::adapter::Vars;
#[cfg(feature = "http")]
use crate::transport::http::HttpTransport;
use serde_json::Value;

/// OpenAI's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The `provider` of the [`ProviderPart`](crate::message::ProviderPart)s this adapter makes; only
/// this adapter sends them back.
pub const PROVIDER: &str = "openai";

/// Where transient reminders go in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReminderRole {
    /// One trailing `system` message per reminder (the default for OpenAI's own API).
    #[default]
    System,
    /// One trailing `user` message holding every reminder, or the reminders appended to the last
    /// user turn when the conversation ends with one (the default for other servers, whose chat
    /// templates often reject a system message that is not first).
    User,
}

/// How to reach an OpenAI-compatible server. Its `Debug` form hides the key.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The model name sent in the request (`gpt-4.1`, `qwen3:8b`, …).
    pub model: String,
    /// The API's base URL, up to and without `/chat/completions`
    /// (default `https://api.openai.com/v1`).
    pub base_url: String,
    /// The API key, sent as `Authorization: Bearer <key>`; `None` sends no such header.
    pub api_key: Option<String>,
    /// Extra top-level request fields (a JSON object), merged into every request body last.
    pub extra: Option<Value>,
    /// The HTTP client, with its retry policy and body-size limit.
    #[cfg(feature = "http")]
    pub transport: HttpTransport,
    /// Where transient reminders go (default: `System` for OpenAI's own API, `User` elsewhere).
    pub reminder_role: ReminderRole,
    /// Whether to recover tool calls that a model wrote in its text instead of the API's
    /// `tool_calls` (default: on for servers other than OpenAI's own API). When on and the
    /// request offers tools, the text of each response, complete or streamed, goes through
    /// [`Rescue`](crate::ptk::Rescue): calls written in any prompt dialect (`<tool_call>…`,
    /// `[TOOL_CALLS]…`, `<PTK_CALL>…`, a fenced JSON call, …) become tool calls with fresh ids and
    /// `provider_data` `{"rescued": true}`, when the response carried no native call; the text
    /// around them stays text, no fragment of a call tag reaches the stream's text deltas, and
    /// an attempted call that does not parse stays text (never an error).
    pub rescue_text_tool_calls: bool,
    /// Whether a request that offers tools says `"tool_choice": "auto"` when the choice is
    /// [`ToolChoice::Auto`](crate::model::ToolChoice::Auto), rather than leaving it out (default:
    /// on for servers other than OpenAI's own API). Leaving it out means `auto` on OpenAI and vLLM,
    /// but llama-cpp-python's server ignores the tools unless it is said; every compatible server
    /// accepts it (vLLM without `--enable-auto-tool-choice` refuses it as it refuses tools at all,
    /// which `--tool-protocol auto` takes as the signal to fall back to prompt-based calling),
    /// except llama-cpp-python while streaming, which answers it with an empty stream: the model
    /// then sends its streamed requests without it (see the [module docs](super)).
    pub explicit_tool_choice: bool,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("OpenAiConfig");
        d.field("model", &self.model);
        d.field("base_url", &self.base_url);
        d.field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"));
        d.field("extra", &self.extra);
        #[cfg(feature = "http")]
        d.field("transport", &self.transport);
        d.field("reminder_role", &self.reminder_role);
        d.field("rescue_text_tool_calls", &self.rescue_text_tool_calls);
        d.field("explicit_tool_choice", &self.explicit_tool_choice);
        d.finish()
    }
}

impl OpenAiConfig {
    /// A configuration for `model` on OpenAI's own API, with no key.
    pub fn new(model: impl Into<String>) -> Self {
        OpenAiConfig {
            model: model.into(),
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            extra: None,
            #[cfg(feature = "http")]
            transport: HttpTransport::new(),
            reminder_role: ReminderRole::System,
            rescue_text_tool_calls: false,
            explicit_tool_choice: false,
        }
    }

    /// Sets the base URL and the defaults that depend on it ([`OpenAiConfig::reminder_role`],
    /// [`OpenAiConfig::rescue_text_tool_calls`], [`OpenAiConfig::explicit_tool_choice`]).
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        let openai = self.is_openai();
        self.reminder_role = if openai {
            ReminderRole::System
        } else {
            ReminderRole::User
        };
        self.rescue_text_tool_calls = !openai;
        self.explicit_tool_choice = !openai;
        self
    }

    /// Reads the key and the base URL from the environment: the key from the variable named
    /// `api_key_env`, else `OPENAI_API_KEY`; the base URL from `OPENAI_BASE_URL`, else OpenAI's.
    ///
    /// A missing key is an error for OpenAI's own API, and when `api_key_env` names a variable
    /// that is not set; other servers (local ones especially) may need no key.
    pub fn from_env(model: &str, api_key_env: Option<&str>) -> Result<Self, ModelError> {
        Self::from_vars(model, api_key_env, |name| std::env::var(name).ok())
    }

    /// Like [`OpenAiConfig::from_env`], reading variables through `lookup`.
    pub fn from_vars(
        model: &str,
        api_key_env: Option<&str>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ModelError> {
        let key_var = api_key_env.unwrap_or("OPENAI_API_KEY");
        let vars = Vars::read(lookup, &["OPENAI_BASE_URL"], &[key_var]);
        let base_url = vars
            .base_url
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let mut config = OpenAiConfig::new(model).with_base_url(base_url);
        config.api_key = vars.api_key;
        if config.api_key.is_none() {
            if api_key_env.is_some() {
                return Err(ModelError::Config(format!(
                    "the API key variable {key_var} is not set (or is empty); set it, or leave \
                     out the key variable for servers that need no key"
                )));
            }
            if config.is_openai() {
                return Err(ModelError::Config(format!(
                    "OPENAI_API_KEY is not set: OpenAI's API ({}) needs a key. Set it, name \
                     another variable with --api-key-env, or point OPENAI_BASE_URL at a \
                     compatible server",
                    config.base_url
                )));
            }
        }
        Ok(config)
    }

    /// Whether the base URL is OpenAI's own API (`api.openai.com`).
    pub fn is_openai(&self) -> bool {
        is_openai_url(&self.base_url)
    }

    /// The full URL requests are sent to.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim().trim_end_matches('/');
        if base.ends_with("/chat/completions") {
            base.to_string()
        } else {
            format!("{base}/chat/completions")
        }
    }
}

/// Whether `url` is OpenAI's own API (`api.openai.com`).
pub(crate) fn is_openai_url(url: &str) -> bool {
    let rest = url.trim();
    let rest = rest.split_once("://").map_or(rest, |(_, r)| r);
    let host_port = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = host_port.rsplit('@').next().unwrap_or(host_port);
    let host = host_port.split(':').next().unwrap_or("");
    host.eq_ignore_ascii_case("api.openai.com")
}

/// Refuses an `extra` that is not a JSON object or that sets one of the [`OWNED_FIELDS`].
pub(super) fn check_extra(what: &str, extra: Option<&Value>) -> Result<(), ModelError> {
    let example = r#"{"top_k": 20}"#;
    crate::providers::adapter::check_object_extra("OpenAI", what, extra, OWNED_FIELDS, example)
}

/// The top-level request fields this adapter writes itself: the model, the conversation, the
/// tool catalog and choice, and the streaming mode. An `extra` (the adapter's or the settings')
/// that sets one is refused with [`ModelError::Config`], by [`OpenAiConfig::validate`] and by
/// every call.
pub const OWNED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
];

impl OpenAiConfig {
    /// Checks the configuration without sending anything: the base URL (see
    /// [`crate::providers::check_base_url`]) and `extra` (a JSON object that sets none of the
    /// [`OWNED_FIELDS`]).
    pub fn validate(&self) -> Result<(), ModelError> {
        crate::providers::check_base_url(&self.base_url)
            .map_err(|e| ModelError::Config(format!("the base URL {e}")))?;
        check_extra("the adapter's `extra`", self.extra.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::super::OpenAiModel;
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
        let c = OpenAiConfig::from_vars("gpt", None, env(&[("OPENAI_API_KEY", "sk-1")])).unwrap();
        assert_eq!(c.api_key.as_deref(), Some("sk-1"));
        assert_eq!(c.endpoint(), "https://api.openai.com/v1/chat/completions");
        assert!(!c.rescue_text_tool_calls);
        let e = OpenAiConfig::from_vars("gpt", None, env(&[])).unwrap_err();
        assert!(e.to_string().contains("OPENAI_API_KEY"), "{e}");
        let c = OpenAiConfig::from_vars(
            "llama",
            None,
            env(&[("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1/")]),
        )
        .unwrap();
        assert_eq!(c.api_key, None);
        assert_eq!(c.endpoint(), "http://127.0.0.1:8080/v1/chat/completions");
        assert_eq!(c.reminder_role, ReminderRole::User);
        let c = OpenAiConfig::from_vars(
            "x",
            Some("GROQ_API_KEY"),
            env(&[
                ("GROQ_API_KEY", "gsk"),
                ("OPENAI_API_KEY", "sk"),
                ("OPENAI_BASE_URL", "https://api.groq.com/openai/v1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.api_key.as_deref(), Some("gsk"));
        let e = OpenAiConfig::from_vars(
            "x",
            Some("GROQ_API_KEY"),
            env(&[("OPENAI_BASE_URL", "https://api.groq.com/openai/v1")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("GROQ_API_KEY"), "{e}");
    }

    #[test]
    fn debug_hides_the_key() {
        let mut c = OpenAiConfig::new("m");
        c.api_key = Some("sk-secret".into());
        let shown = format!("{:?} {:?}", c, OpenAiModel::new(c.clone()));
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    /// An `extra` is a JSON object of top-level fields: anything else is refused, by `validate`
    /// and by every call (the settings' too), with an example of one.
    #[tokio::test]
    async fn an_extra_that_is_not_an_object_is_refused() {
        let mut c = OpenAiConfig::new("m");
        c.extra = Some(serde_json::json!(["top_k", 20]));
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("JSON object") && e.contains(r#"{"top_k": 20}"#),
            "{e}"
        );
        let model = OpenAiModel::new(OpenAiConfig::new("m").with_base_url("http://127.0.0.1:9"));
        let settings = crate::model::ModelSettings {
            extra: Some(serde_json::json!("top_k")),
            ..Default::default()
        };
        let messages = [crate::message::Message::user("hi")];
        let request = crate::model::ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let e = crate::model::Model::complete(&model, &request)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the settings' `extra` must be a JSON object"),
            "{e}"
        );
    }

    #[test]
    fn openai_urls() {
        assert!(is_openai_url("https://api.openai.com/v1"));
        assert!(is_openai_url("https://API.openai.com:443/v1/"));
        assert!(!is_openai_url("https://api.openai.com.evil.example/v1"));
        assert!(!is_openai_url("http://localhost:11434/v1"));
        let c = OpenAiConfig::new("m").with_base_url("http://x/v1/chat/completions");
        assert_eq!(c.endpoint(), "http://x/v1/chat/completions");
    }
}
