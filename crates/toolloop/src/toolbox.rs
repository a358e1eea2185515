//! The toolbox: tools by name, their specs, and argument validation; and its catalog, the
//! tools as a run saw them (see [`CatalogEntry`]).

use crate::model::ToolSpec;
use crate::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
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

    /// The tools, in the order they were added.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.entries.iter().map(|e| &e.tool)
    }

    /// The catalog: each tool as the loop sees it (what the model is offered, and what the
    /// loop decides by), in order.
    pub fn catalog(&self) -> Vec<CatalogEntry> {
        self.entries
            .iter()
            .zip(&self.specs)
            .map(|(e, spec)| CatalogEntry {
                name: spec.name.clone(),
                description: spec.description.clone(),
                parameters: spec.parameters.clone(),
                side_effect: e.tool.side_effect(),
                parallel_safe: e.tool.parallel_safe(),
                terminal: e.tool.terminal(),
            })
            .collect()
    }

    /// Whether two toolboxes have the same catalog (see [`Toolbox::catalog`]), without building
    /// it.
    pub fn same_catalog(&self, other: &Toolbox) -> bool {
        self.specs == other.specs
            && self.entries.iter().zip(&other.entries).all(|(a, b)| {
                a.tool.side_effect() == b.tool.side_effect()
                    && a.tool.parallel_safe() == b.tool.parallel_safe()
                    && a.tool.terminal() == b.tool.terminal()
            })
    }

    /// A toolbox with a logged catalog's tools, exactly as they were logged (names,
    /// descriptions, schemas, side effects, parallel safety), each running as `live`'s tool of
    /// the same name runs now; a tool `live` no longer has fails its calls with "no longer
    /// available". This is how a replayed run gets back the tools it had.
    pub fn from_catalog(catalog: &[CatalogEntry], live: &Toolbox) -> Result<Toolbox, ToolboxError> {
        let mut toolbox = Toolbox::new();
        for entry in catalog {
            toolbox.add_arc(Arc::new(LoggedTool {
                live: live.get(&entry.name).cloned(),
                entry: entry.clone(),
            }))?;
        }
        Ok(toolbox)
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

/// A tool as a run saw it: what the model was offered and what the loop decides by. A run whose
/// tools can change while it goes on (see [`crate::tool_source`]) logs its catalog when it
/// starts and each time it changes, so that a replay rebuilds the run with the tools it had,
/// whatever is offered by then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The tool's name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
    /// What it changes.
    #[serde(default)]
    pub side_effect: SideEffect,
    /// Whether it may run beside other parallel-safe calls.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parallel_safe: bool,
    /// Whether calling it ends the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminal: bool,
}

/// A tool of a logged catalog: its logged description decides, the live tool of its name runs.
struct LoggedTool {
    entry: CatalogEntry,
    live: Option<Arc<dyn Tool>>,
}

#[async_trait]
impl Tool for LoggedTool {
    fn name(&self) -> &str {
        &self.entry.name
    }
    fn description(&self) -> &str {
        &self.entry.description
    }
    fn parameters(&self) -> &Value {
        &self.entry.parameters
    }
    fn parallel_safe(&self) -> bool {
        self.entry.parallel_safe
    }
    fn terminal(&self) -> bool {
        self.entry.terminal
    }
    fn side_effect(&self) -> SideEffect {
        self.entry.side_effect
    }
    fn approval_subject(&self, args: &Value) -> String {
        match &self.live {
            Some(tool) => tool.approval_subject(args),
            None => crate::message::canonical_json(args),
        }
    }
    fn default_approval(&self) -> crate::approval::Action {
        match &self.live {
            Some(tool) => tool.default_approval(),
            None => crate::approval::Action::Allow,
        }
    }
    fn approval_required(&self, args: &Value) -> bool {
        self.live
            .as_ref()
            .is_some_and(|tool| tool.approval_required(args))
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        match &self.live {
            Some(tool) => tool.call(args, ctx).await,
            None => Err(ToolError::new(format!(
                "the tool `{}` is no longer available",
                self.entry.name
            ))),
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

    #[tokio::test]
    async fn a_logged_catalog_judges_by_its_entries_and_runs_the_live_tool() {
        let read = tool_fn("read", "d", |_a: Args, _c: ToolContext| async {
            Ok::<_, ToolError>(ToolOutput::text("ok"))
        })
        .allow_parallel()
        .with_side_effect(SideEffect::ReadOnly);
        let live = Toolbox::new().with(read).unwrap();
        let mut catalog = live.catalog();
        assert_eq!(catalog[0].side_effect, SideEffect::ReadOnly);
        assert!(catalog[0].parallel_safe);
        // Round trip through JSON, as in a log.
        let text = serde_json::to_string(&catalog).unwrap();
        assert_eq!(
            serde_json::from_str::<Vec<CatalogEntry>>(&text).unwrap(),
            catalog
        );
        let same = Toolbox::from_catalog(&catalog, &live).unwrap();
        assert!(same.same_catalog(&live));
        // A logged entry that differs from the live tool: the entry decides, the live tool runs.
        catalog[0].side_effect = SideEffect::SideEffecting;
        catalog[0].parameters = json!({"type": "object", "required": ["path"]});
        catalog.push(CatalogEntry {
            name: "gone".into(),
            description: "No longer offered.".into(),
            parameters: json!({"type": "object"}),
            side_effect: SideEffect::ReadOnly,
            parallel_safe: false,
            terminal: false,
        });
        let logged = Toolbox::from_catalog(&catalog, &live).unwrap();
        assert!(!logged.same_catalog(&live));
        assert_eq!(logged.catalog(), catalog);
        let read = logged.get("read").unwrap();
        assert_eq!(read.side_effect(), SideEffect::SideEffecting);
        assert!(logged.validate("read", &json!({})).is_err());
        let out = read
            .call(json!({"path": "a"}), ToolContext::detached("c", "read"))
            .await
            .unwrap();
        assert_eq!(out.message, "ok");
        let e = logged
            .get("gone")
            .unwrap()
            .call(json!({}), ToolContext::detached("c", "gone"))
            .await
            .unwrap_err();
        assert!(e.message.contains("no longer available"), "{e}");
        // A logged schema that does not compile is refused.
        catalog[1].parameters = json!({"type": 12});
        assert!(matches!(
            Toolbox::from_catalog(&catalog, &live),
            Err(ToolboxError::InvalidSchema { .. })
        ));
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
