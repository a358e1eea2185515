//! The text formats a model may write tool calls in.

use std::fmt;
use std::str::FromStr;

/// A text format for tool calls. The parser reads every dialect; the dialect chosen for a model
/// is the one its prompt teaches and the one its past calls are written back in.
///
/// Its serde form is its name (`"ptk"`, `"hermes"`, `"mistral"`, `"llama3"`, `"qwen3-coder"`,
/// `"json"`, `"deepseek"`, `"deepseek-v3.1"`, `"kimi-k2"`, `"glm"`, `"pythonic"`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum Dialect {
    /// The PTK Manager's format (the default):
    /// `<PTK_CALL>{"tool": "NAME", "args": {…}, "reasoning": "…"}</PTK_CALL>`.
    #[default]
    #[serde(rename = "ptk")]
    Ptk,
    /// Hermes / Qwen 2.5: `<tool_call>{"name": "NAME", "arguments": {…}}</tool_call>`.
    #[serde(rename = "hermes")]
    Hermes,
    /// Mistral: `[TOOL_CALLS]NAME[ARGS]{…}` (v11+ tokenizers), and the older
    /// `[TOOL_CALLS][{"name": "NAME", "arguments": {…}}]` JSON array.
    #[serde(rename = "mistral")]
    Mistral,
    /// Llama 3.x JSON: `{"name": "NAME", "parameters": {…}}`, optionally after `<|python_tag|>`.
    #[serde(rename = "llama3")]
    Llama3,
    /// Qwen3-Coder XML:
    /// `<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`, with
    /// values converted through the tool's JSON Schema.
    #[serde(rename = "qwen3-coder")]
    Qwen3Coder,
    /// A fenced JSON block: ```` ```json {"name": "NAME", "arguments": {…}} ``` ````.
    #[serde(rename = "json")]
    FencedJson,
    /// DeepSeek V3 and R1 tool tokens:
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` then the arguments
    /// in a ```` ```json ```` fence, then `<｜tool▁call▁end｜><｜tool▁calls▁end｜>`. R1's
    /// `<think>…</think>` reasoning is kept out of the answer.
    #[serde(rename = "deepseek")]
    DeepSeek,
    /// DeepSeek V3.1 and later:
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
    #[serde(rename = "deepseek-v3.1")]
    DeepSeekV31,
    /// Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…}<|tool_call_end|><|tool_calls_section_end|>`.
    #[serde(rename = "kimi-k2")]
    KimiK2,
    /// GLM 4.5 / 4.6:
    /// `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>`, with
    /// values converted through the tool's JSON Schema (text for strings, JSON otherwise).
    #[serde(rename = "glm")]
    Glm,
    /// Python call syntax (Llama 3.2, Llama 4): `[get_weather(city="Paris"), other(x=1)]` on a
    /// line of its own, or after Llama 4's `<|python_start|>`. Read as Python literals, never
    /// evaluated.
    #[serde(rename = "pythonic")]
    Pythonic,
}

impl Dialect {
    /// Every dialect, the default first.
    pub const ALL: [Dialect; 11] = [
        Dialect::Ptk,
        Dialect::Hermes,
        Dialect::Mistral,
        Dialect::Llama3,
        Dialect::Qwen3Coder,
        Dialect::FencedJson,
        Dialect::DeepSeek,
        Dialect::DeepSeekV31,
        Dialect::KimiK2,
        Dialect::Glm,
        Dialect::Pythonic,
    ];

    /// The dialect's name, as accepted by [`FromStr`] (`ptk`, `hermes`, `mistral`, `llama3`,
    /// `qwen3-coder`, `json`, `deepseek`, `deepseek-v3.1`, `kimi-k2`, `glm`, `pythonic`).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Ptk => "ptk",
            Dialect::Hermes => "hermes",
            Dialect::Mistral => "mistral",
            Dialect::Llama3 => "llama3",
            Dialect::Qwen3Coder => "qwen3-coder",
            Dialect::FencedJson => "json",
            Dialect::DeepSeek => "deepseek",
            Dialect::DeepSeekV31 => "deepseek-v3.1",
            Dialect::KimiK2 => "kimi-k2",
            Dialect::Glm => "glm",
            Dialect::Pythonic => "pythonic",
        }
    }

    /// The exact format of one call, with placeholders, as taught in prompts and error messages.
    pub fn format(self) -> &'static str {
        match self {
            Dialect::Ptk => {
                "<PTK_CALL>\n{\"tool\": \"TOOL_NAME\", \"args\": {ARGUMENTS AS A JSON OBJECT}, \"reasoning\": \"why (optional)\"}\n</PTK_CALL>"
            }
            Dialect::Hermes => {
                "<tool_call>\n{\"name\": \"TOOL_NAME\", \"arguments\": {ARGUMENTS AS A JSON OBJECT}}\n</tool_call>"
            }
            Dialect::Mistral => "[TOOL_CALLS]TOOL_NAME[ARGS]{ARGUMENTS AS A JSON OBJECT}",
            Dialect::Llama3 => {
                "{\"name\": \"TOOL_NAME\", \"parameters\": {ARGUMENTS AS A JSON OBJECT}}  (on a line of its own)"
            }
            Dialect::Qwen3Coder => {
                "<tool_call>\n<function=TOOL_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>"
            }
            Dialect::FencedJson => {
                "```json\n{\"name\": \"TOOL_NAME\", \"arguments\": {ARGUMENTS AS A JSON OBJECT}}\n```"
            }
            Dialect::DeepSeek => {
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>TOOL_NAME\n```json\n{ARGUMENTS AS A JSON OBJECT}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            }
            Dialect::DeepSeekV31 => {
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>TOOL_NAME<｜tool▁sep｜>{ARGUMENTS AS A JSON OBJECT}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            }
            Dialect::KimiK2 => {
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.TOOL_NAME:0<|tool_call_argument_begin|>{ARGUMENTS AS A JSON OBJECT}<|tool_call_end|><|tool_calls_section_end|>"
            }
            Dialect::Glm => {
                "<tool_call>TOOL_NAME\n<arg_key>ARGUMENT_NAME</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>"
            }
            Dialect::Pythonic => {
                "[TOOL_NAME(ARGUMENT_NAME=VALUE, ...)]  (on a line of its own; values as Python literals)"
            }
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown dialect name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown tool-call dialect `{0}`; expected one of: ptk, hermes, mistral, llama3, qwen3-coder, json, deepseek, deepseek-v3.1, kimi-k2, glm, pythonic"
)]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key = s.trim().to_ascii_lowercase().replace('_', "-");
        Ok(match key.as_str() {
            "ptk" => Dialect::Ptk,
            "hermes" | "qwen" | "qwen2.5" => Dialect::Hermes,
            "mistral" => Dialect::Mistral,
            "llama3" | "llama" | "llama3-json" => Dialect::Llama3,
            "qwen3-coder" | "qwen3coder" | "qwen3-xml" => Dialect::Qwen3Coder,
            "json" | "fenced-json" => Dialect::FencedJson,
            "deepseek" | "deepseek-v3" | "deepseek-r1" | "deepseekv3" => Dialect::DeepSeek,
            "deepseek-v3.1" | "deepseek-v31" | "deepseekv31" | "deepseek-v3.2" => {
                Dialect::DeepSeekV31
            }
            "kimi-k2" | "kimi" | "kimik2" => Dialect::KimiK2,
            "glm" | "glm-4.5" | "glm45" | "glm4.5" | "glm-4.6" => Dialect::Glm,
            "pythonic" | "llama4" | "llama-4" | "llama4-pythonic" => Dialect::Pythonic,
            _ => return Err(UnknownDialect(s.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Dialect::ALL {
            assert_eq!(d.to_string().parse::<Dialect>(), Ok(d));
            // the serde form is the same name
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{d}\""));
            assert_eq!(serde_json::from_str::<Dialect>(&json).unwrap(), d);
        }
        assert_eq!("Qwen3_Coder".parse::<Dialect>(), Ok(Dialect::Qwen3Coder));
        assert_eq!("Kimi_K2".parse::<Dialect>(), Ok(Dialect::KimiK2));
        assert_eq!("deepseek-r1".parse::<Dialect>(), Ok(Dialect::DeepSeek));
        let e = "xml".parse::<Dialect>().unwrap_err();
        assert!(e.to_string().contains("qwen3-coder"), "{e}");
    }
}
