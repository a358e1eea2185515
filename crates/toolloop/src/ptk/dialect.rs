//! The text formats a model may write tool calls in.

use std::fmt;
use std::str::FromStr;

/// A text format for tool calls. The parser reads every dialect; the dialect chosen for a model
/// is the one its prompt teaches and the one its past calls are written back in.
///
/// Its serde form is its name (`"ptk"`, `"hermes"`, `"mistral"`, `"llama3"`, `"qwen3-coder"`,
/// `"json"`).
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
}

impl Dialect {
    /// Every dialect, the default first.
    pub const ALL: [Dialect; 6] = [
        Dialect::Ptk,
        Dialect::Hermes,
        Dialect::Mistral,
        Dialect::Llama3,
        Dialect::Qwen3Coder,
        Dialect::FencedJson,
    ];

    /// The dialect's name, as accepted by [`FromStr`] (`ptk`, `hermes`, `mistral`, `llama3`,
    /// `qwen3-coder`, `json`).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Ptk => "ptk",
            Dialect::Hermes => "hermes",
            Dialect::Mistral => "mistral",
            Dialect::Llama3 => "llama3",
            Dialect::Qwen3Coder => "qwen3-coder",
            Dialect::FencedJson => "json",
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
    "unknown tool-call dialect `{0}`; expected one of: ptk, hermes, mistral, llama3, qwen3-coder, json"
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
        let e = "xml".parse::<Dialect>().unwrap_err();
        assert!(e.to_string().contains("qwen3-coder"), "{e}");
    }
}
