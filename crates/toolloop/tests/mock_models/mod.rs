//! Models of each wire API against the mock server, shared by the tests that run every API.

use std::sync::Arc;

/// A model speaking `protocol` (`openai`, `openai-responses`, `anthropic` or `gemini`) to the
/// mock server at `base` (its base URL), asking for `scenario`.
pub(crate) fn mock_model(protocol: &str, base: &str, scenario: &str) -> Arc<dyn toolloop::Model> {
    use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
    use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
    use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
    use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
    let key = Some("test".to_string());
    match protocol {
        "openai" => {
            let mut c = OpenAiConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.api_key = key;
            Arc::new(OpenAiModel::new(c))
        }
        "openai-responses" => {
            let mut c = ResponsesConfig::new(scenario).with_base_url(format!("{base}/v1"));
            c.api_key = key;
            Arc::new(ResponsesModel::new(c))
        }
        "anthropic" => {
            let mut c = AnthropicConfig::new(scenario);
            c.base_url = base.to_string();
            c.api_key = key;
            Arc::new(AnthropicModel::new(c))
        }
        _ => {
            let mut c = GeminiConfig::new(scenario);
            c.base_url = base.to_string();
            c.api_key = key;
            Arc::new(GeminiModel::new(c))
        }
    }
}
