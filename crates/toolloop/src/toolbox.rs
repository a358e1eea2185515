//! The toolbox: tools by name, their specs, and argument validation.

use crate::model::ToolSpec;
use crate::tool::Tool;
use serde_json::Value;
use std::sync::Arc;

/// Why a tool (or an agent's output schema) could not be added.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolboxError {
    /// Two tools share a name.
    #[error("a tool named `{0}` is already in the toolbox; tool names must be unique")]
    Duplicate(String),
    /// The name is empty or has characters providers refuse.
    #[error(
        "tool name `{0}` is invalid: expected 1 to 64 characters from a-z, A-Z, 0-9, `_`, `-` and `.`"
    )]
    InvalidName(String),
    /// The parameter schema is not a valid JSON Schema.
    #[error("the parameter schema of tool `{name}` is not a valid JSON Schema: {message}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// What the validator said.
        message: String,
    },
    /// The agent's output schema (see [`crate::output`]) is not a valid JSON Schema.
    #[error(transparent)]
    OutputSchema(#[from] crate::output::OutputSchemaError),
}

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

/// Tools by name, in the order they were added.
#[derive(Default)]
pub struct Toolbox {
    entries: Vec<Entry>,
    /// Looked up several times per call: a fast hash, not a DoS-resistant one (the names are
    /// the program's own).
    by_name: foldhash::HashMap<String, usize>,
    specs: Vec<ToolSpec>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Toolbox {
    /// An empty toolbox.
    pub fn new() -> Self {
        Toolbox::default()
    }

    /// Adds a tool; refuses a second tool with the same name.
    pub fn add(&mut self, tool: impl Tool + 'static) -> Result<(), ToolboxError> {
        self.add_arc(Arc::new(tool))
    }

    /// Adds a shared tool; refuses a second tool with the same name.
    pub fn add_arc(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolboxError> {
        let name = tool.name().to_string();
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid_name {
            return Err(ToolboxError::InvalidName(name));
        }
        if self.by_name.contains_key(&name) {
            return Err(ToolboxError::Duplicate(name));
        }
        let validator = jsonschema::validator_for(tool.parameters()).map_err(|e| {
            ToolboxError::InvalidSchema {
                name: name.clone(),
                message: e.to_string(),
            }
        })?;
        self.specs.push(ToolSpec {
            name: name.clone(),
            description: tool.description().to_string(),
            parameters: tool.parameters().clone(),
        });
        self.by_name.insert(name, self.entries.len());
        self.entries.push(Entry { tool, validator });
        Ok(())
    }

    /// Adds a tool, builder style.
    pub fn with(mut self, tool: impl Tool + 'static) -> Result<Self, ToolboxError> {
        self.add(tool)?;
        Ok(self)
    }

    /// The tool with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|&i| &self.entries[i].tool)
    }

    /// The specs of every tool, in the order they were added.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The tools' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.specs.iter().map(|s| s.name.as_str())
    }

    /// How many tools there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks arguments against a tool's schema. The error names each failing JSON path and what
    /// was expected there.
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ArgumentsError> {
        let Some(&i) = self.by_name.get(name) else {
            return Err(ArgumentsError::UnknownTool(name.to_string()));
        };
        let validator = &self.entries[i].validator;
        if validator.is_valid(args) {
            return Ok(());
        }
        let problems: Vec<String> = validator
            .iter_errors(args)
            .take(5)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_string()
                } else {
                    path
                };
                format!("at `{path}`: {e}")
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ArgumentsError::Schema(problems))
        }
    }
}

/// Why [`Toolbox::validate`] refused a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    /// No tool has this name.
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
    /// The arguments fail the tool's schema: each failing JSON path and what was expected
    /// there (at most five).
    #[error("{}", .0.join("; "))]
    Schema(Vec<String>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{ToolContext, ToolError, ToolOutput, tool_fn};
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Args {
        path: String,
        depth: Option<u32>,
    }

    fn t(name: &str) -> impl Tool + 'static {
        tool_fn(name, "d", |_a: Args, _c: ToolContext| async {
            Ok::<_, ToolError>(ToolOutput::text("ok"))
        })
    }

    #[test]
    fn refuses_duplicates_and_bad_names() {
        let mut b = Toolbox::new();
        b.add(t("read")).unwrap();
        assert_eq!(
            b.add(t("read")),
            Err(ToolboxError::Duplicate("read".into()))
        );
        assert!(matches!(b.add(t("a b")), Err(ToolboxError::InvalidName(_))));
        assert_eq!(b.names().collect::<Vec<_>>(), ["read"]);
        assert_eq!(b.specs()[0].name, "read");
    }

    #[test]
    fn validation_names_path_and_expectation() {
        let b = Toolbox::new().with(t("read")).unwrap();
        assert!(b.validate("read", &json!({"path": "a"})).is_ok());
        let e = b
            .validate("read", &json!({"path": 1}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/path"), "{e}");
        assert!(e.contains("string"), "{e}");
        let e = b.validate("read", &json!({})).unwrap_err().to_string();
        assert!(e.contains("path"), "{e}");
        assert!(b.validate("nope", &json!({})).is_err());
    }
}
