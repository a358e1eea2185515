//! The toolbox: tools by name; and its [`Catalog`], what the loop knows of them (their specs,
//! compiled argument schemas and metadata: the tools as a run saw them, see [`CatalogEntry`]).

use crate::approval::{Action, Approvals};
use crate::message::ToolCall;
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
    /// The agent's context policy (see [`crate::context::policy`]) has a figure out of range.
    #[error("the context policy is wrong: {0}")]
    ContextPolicy(String),
}

/// Tools by name, in the order they were added: the tools themselves, and their
/// [`Catalog`] (what the loop knows of them).
#[derive(Default, Clone)]
pub struct Toolbox {
    /// Shared with the runs' machines; copied only when a tool is added to a shared one.
    catalog: Arc<Catalog>,
    /// In the catalog's order.
    tools: Vec<Arc<dyn Tool>>,
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

    /// Adds a tool; refuses a second tool with the same name. What the loop knows of the tool
    /// (its name, description, schema, side effect, parallel safety, whether it is terminal,
    /// its default approval) is read once, here, into the toolbox's [`Catalog`].
    pub fn add(&mut self, tool: impl Tool + 'static) -> Result<(), ToolboxError> {
        self.add_arc(Arc::new(tool))
    }

    /// Adds a shared tool; refuses a second tool with the same name.
    pub fn add_arc(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolboxError> {
        let entry = CatalogEntry {
            name: tool.name().to_string(),
            description: tool.description().to_string(),
            parameters: tool.parameters().clone(),
            side_effect: tool.side_effect(),
            parallel_safe: tool.parallel_safe(),
            terminal: tool.terminal(),
            default_approval: Some(tool.default_approval()),
        };
        Arc::make_mut(&mut self.catalog).push(entry)?;
        self.tools.push(tool);
        Ok(())
    }

    /// The tools, in the order they were added.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.iter()
    }

    /// The catalog: each tool as the loop sees it (what the model is offered, and what the
    /// loop decides by), in order. The machine holds this, never the tools.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Whether two toolboxes have the same catalog (see [`Toolbox::catalog`]).
    pub fn same_catalog(&self, other: &Toolbox) -> bool {
        Arc::ptr_eq(&self.catalog, &other.catalog) || self.catalog == other.catalog
    }

    /// A toolbox with a logged catalog's tools, exactly as they were logged (names,
    /// descriptions, schemas, side effects, parallel safety, default approvals), each running
    /// as `live`'s tool of the same name runs now; a tool `live` no longer has fails its calls
    /// with "no longer available". This is how a replayed run gets back the tools it had.
    pub fn from_catalog(catalog: Arc<Catalog>, live: &Toolbox) -> Toolbox {
        let tools = catalog
            .entries()
            .iter()
            .map(|entry| {
                Arc::new(LoggedTool {
                    live: live.get(&entry.name).cloned(),
                    entry: entry.clone(),
                }) as Arc<dyn Tool>
            })
            .collect();
        Toolbox { catalog, tools }
    }

    /// Adds a tool, builder style.
    pub fn with(mut self, tool: impl Tool + 'static) -> Result<Self, ToolboxError> {
        self.add(tool)?;
        Ok(self)
    }

    /// The tool with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.catalog.index(name).map(|i| &self.tools[i])
    }

    /// The specs of every tool, in the order they were added.
    pub fn specs(&self) -> &[ToolSpec] {
        self.catalog.specs()
    }

    /// The tools' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.catalog.names()
    }

    /// How many tools there are.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Checks arguments against a tool's schema (see [`Catalog::validate`]).
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ArgumentsError> {
        self.catalog.validate(name, args)
    }

    /// The approval subjects of a model's calls, for the input that brings the response
    /// ([`crate::engine::Input::ModelResponded`]): for each call, in order, its tool's subject
    /// ([`subject_of`]) when `approvals` can weigh it ([`Approvals::weighs_subject`]) or only a
    /// person may approve it ([`Tool::approval_required`]), `None` otherwise. Empty when no call
    /// needs one (the usual case: no approval policy, tools allowed by default). This is where
    /// the driver calls the tools' code, so that the machine never does.
    pub fn approval_subjects(
        &self,
        approvals: &Approvals,
        calls: &[ToolCall],
    ) -> Vec<Option<crate::approval::Subject>> {
        let subject = |call: &ToolCall| {
            // One lookup for the entry and the tool: they share their place.
            let index = self.catalog.index(&call.name);
            let default = index.map_or(Action::Allow, |i| {
                self.catalog.entry_at(i).approval_default()
            });
            let tool = index.map(|i| &self.tools[i]);
            let person = tool.is_some_and(|t| t.approval_required(&call.arguments));
            (person || approvals.weighs_subject(&call.name, default)).then(|| match tool {
                Some(tool) => subject_of(tool.as_ref(), &call.arguments),
                None => call.canonical_arguments().into(),
            })
        };
        // Allocated at the first subject: most calls have none, and then there is no list.
        let mut subjects: Vec<Option<crate::approval::Subject>> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            match subject(call) {
                Some(s) => {
                    if subjects.is_empty() {
                        subjects.reserve_exact(calls.len());
                        subjects.extend(std::iter::repeat_with(|| None).take(i));
                    }
                    subjects.push(Some(s));
                }
                None if !subjects.is_empty() => subjects.push(None),
                None => {}
            }
        }
        subjects
    }
}

/// The approval subject of a call of `tool` with arguments `args`, as the driver gives it to the
/// machine ([`Toolbox::approval_subjects`]) and checks it again just before the call runs: the
/// tool's [`Tool::approval_subject`], marked [`Subject::person`](crate::approval::Subject::person)
/// when [`Tool::approval_required`] says only a person may approve it.
pub fn subject_of(tool: &dyn Tool, args: &Value) -> crate::approval::Subject {
    let subject = tool.approval_subject(args);
    if tool.approval_required(args) {
        subject.needs_person()
    } else {
        subject
    }
}

/// What the loop knows of a run's tools, with no tool in it: each tool's [`CatalogEntry`] (its
/// name, description, schema, side effect, parallel safety, whether it is terminal, its default
/// approval) and its compiled argument schema. The machine ([`crate::engine::Machine`]) decides
/// by this snapshot and never calls a tool; a [`Toolbox`] holds one beside its tools. It is
/// logged as its entries (a JSON list) and compiled again when it is read.
#[derive(Default, Clone)]
pub struct Catalog {
    entries: Vec<CatalogEntry>,
    specs: Vec<ToolSpec>,
    validators: Vec<Arc<crate::schema_check::Checker>>,
    /// Looked up once or twice per call: a fast hash, not a DoS-resistant one (the names are
    /// the program's own, or a log's that the program wrote).
    by_name: foldhash::HashMap<String, usize>,
    /// Whether an entry is terminal: without one, a round's end looks no call's tool up.
    any_terminal: bool,
    /// Whether an entry's own default approval is other than allow: without one, a policy with
    /// no rule and no default of its own weighs no call.
    any_asks: bool,
    /// [`catalog_fingerprint`](crate::model::catalog_fingerprint) of `specs`, made at the first
    /// model call that offers them (a catalog is shared by every run of an agent: each of its
    /// requests reads it instead of walking every schema again).
    fingerprint: std::sync::OnceLock<u64>,
}

impl Catalog {
    /// A catalog of these entries, in order; refuses a name that is invalid or taken, and a
    /// schema that does not compile.
    pub fn new(entries: Vec<CatalogEntry>) -> Result<Catalog, ToolboxError> {
        let mut catalog = Catalog::default();
        for entry in entries {
            catalog.push(entry)?;
        }
        Ok(catalog)
    }

    fn push(&mut self, entry: CatalogEntry) -> Result<(), ToolboxError> {
        let name = &entry.name;
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid_name {
            return Err(ToolboxError::InvalidName(name.clone()));
        }
        if self.by_name.contains_key(name) {
            return Err(ToolboxError::Duplicate(name.clone()));
        }
        let validator =
            crate::schema_check::Checker::new(&entry.parameters).map_err(|message| {
                ToolboxError::InvalidSchema {
                    name: name.clone(),
                    message,
                }
            })?;
        self.specs.push(ToolSpec {
            name: name.clone(),
            description: entry.description.clone(),
            parameters: entry.parameters.clone(),
        });
        self.by_name.insert(name.clone(), self.entries.len());
        self.validators.push(Arc::new(validator));
        self.any_terminal |= entry.terminal;
        self.any_asks |= entry.approval_default() != Action::Allow;
        self.entries.push(entry);
        self.fingerprint = std::sync::OnceLock::new();
        Ok(())
    }

    /// [`catalog_fingerprint`](crate::model::catalog_fingerprint) of [`Catalog::specs`], made
    /// once.
    pub(crate) fn fingerprint(&self) -> u64 {
        *self
            .fingerprint
            .get_or_init(|| crate::model::catalog_fingerprint(&self.specs))
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[CatalogEntry] {
        &self.entries
    }

    /// The entry of the tool with this name.
    pub fn get(&self, name: &str) -> Option<&CatalogEntry> {
        self.index(name).map(|i| &self.entries[i])
    }

    /// The position in [`Catalog::entries`] of the tool with this name: looked up once, it
    /// stands for the name in [`Catalog::entry_at`] and [`Catalog::validate_at`].
    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The entry at `index` (from [`Catalog::index`]).
    pub(crate) fn entry_at(&self, index: usize) -> &CatalogEntry {
        &self.entries[index]
    }

    /// Whether some tool ends the run when called ([`CatalogEntry::terminal`]).
    pub(crate) fn any_terminal(&self) -> bool {
        self.any_terminal
    }

    /// Whether some tool's own default approval is other than allow
    /// ([`CatalogEntry::approval_default`]).
    pub(crate) fn any_asks(&self) -> bool {
        self.any_asks
    }

    /// The specs the model is offered, in order.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// The tools' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
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
        let Some(i) = self.index(name) else {
            return Err(ArgumentsError::UnknownTool(name.to_string()));
        };
        self.validate_at(i, args)
    }

    /// [`Catalog::validate`] for the tool at `index` (from [`Catalog::index`]).
    pub(crate) fn validate_at(&self, index: usize, args: &Value) -> Result<(), ArgumentsError> {
        let problems = self.validators[index].problems(args, 5);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ArgumentsError::Schema(problems))
        }
    }
}

/// Catalogs are equal when their entries are.
impl PartialEq for Catalog {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Serialize for Catalog {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.entries.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Catalog {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entries = Vec::<CatalogEntry>::deserialize(deserializer)?;
        Catalog::new(entries).map_err(serde::de::Error::custom)
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
    /// The approval its calls get when no rule matches ([`Tool::default_approval`]); `None`
    /// in a catalog logged before it was recorded (toolloop 0.1), which a replay takes from
    /// the live tool of the name ([`crate::journal::upgrade`]), and which counts as allow
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_approval: Option<Action>,
}

impl CatalogEntry {
    /// The approval its calls get when no rule matches (allow when not recorded).
    pub fn approval_default(&self) -> Action {
        self.default_approval.unwrap_or(Action::Allow)
    }
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
    fn approval_subject(&self, args: &Value) -> crate::approval::Subject {
        match &self.live {
            Some(tool) => tool.approval_subject(args),
            None => crate::message::canonical_json(args).into(),
        }
    }
    fn default_approval(&self) -> Action {
        match (self.entry.default_approval, &self.live) {
            (Some(action), _) => action,
            (None, Some(tool)) => tool.default_approval(),
            (None, None) => Action::Allow,
        }
    }
    fn approval_required(&self, args: &Value) -> bool {
        self.live
            .as_ref()
            .is_some_and(|tool| tool.approval_required(args))
    }
    fn sub_agent(&self) -> Option<&crate::subagent::SubAgent> {
        self.live.as_ref().and_then(|t| t.sub_agent())
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

    #[test]
    fn a_catalogs_fingerprint_is_made_once_and_follows_its_tools() {
        let mut toolbox = Toolbox::new();
        toolbox
            .add(tool_fn(
                "a",
                "A.",
                |_: serde_json::Value, _: ToolContext| async {
                    Ok::<_, ToolError>(ToolOutput::text("a"))
                },
            ))
            .unwrap();
        let first = toolbox.catalog().fingerprint();
        assert_eq!(first, crate::model::catalog_fingerprint(toolbox.specs()));
        // A toolbox that shares the catalog shares the fingerprint; adding a tool makes the
        // catalog another, with its own.
        let mut grown = toolbox.clone();
        assert_eq!(grown.catalog().fingerprint(), first);
        grown
            .add(tool_fn(
                "b",
                "B.",
                |_: serde_json::Value, _: ToolContext| async {
                    Ok::<_, ToolError>(ToolOutput::text("b"))
                },
            ))
            .unwrap();
        let second = grown.catalog().fingerprint();
        assert_ne!(second, first);
        assert_eq!(second, crate::model::catalog_fingerprint(grown.specs()));
        assert_eq!(toolbox.catalog().fingerprint(), first);
    }

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
        let mut entries = live.catalog().entries().to_vec();
        assert_eq!(entries[0].side_effect, SideEffect::ReadOnly);
        assert!(entries[0].parallel_safe);
        assert_eq!(entries[0].default_approval, Some(Action::Allow));
        // Round trip through JSON, as in a log.
        let text = serde_json::to_string(live.catalog()).unwrap();
        let read_back: Catalog = serde_json::from_str(&text).unwrap();
        assert_eq!(&read_back, &**live.catalog());
        let same = Toolbox::from_catalog(Arc::new(read_back), &live);
        assert!(same.same_catalog(&live));
        // A logged entry that differs from the live tool: the entry decides, the live tool runs.
        entries[0].side_effect = SideEffect::SideEffecting;
        entries[0].parameters = json!({"type": "object", "required": ["path"]});
        entries[0].default_approval = Some(Action::Ask);
        entries.push(CatalogEntry {
            name: "gone".into(),
            description: "No longer offered.".into(),
            parameters: json!({"type": "object"}),
            side_effect: SideEffect::ReadOnly,
            parallel_safe: false,
            terminal: false,
            default_approval: None,
        });
        let logged = Toolbox::from_catalog(Arc::new(Catalog::new(entries.clone()).unwrap()), &live);
        assert!(!logged.same_catalog(&live));
        assert_eq!(logged.catalog().entries(), &entries[..]);
        let read = logged.get("read").unwrap();
        assert_eq!(read.side_effect(), SideEffect::SideEffecting);
        assert_eq!(read.default_approval(), Action::Ask);
        assert!(logged.validate("read", &json!({})).is_err());
        let out = read
            .call(json!({"path": "a"}), ToolContext::detached("c", "read"))
            .await
            .unwrap();
        assert_eq!(out.message, "ok");
        let gone = logged.get("gone").unwrap();
        assert_eq!(gone.default_approval(), Action::Allow);
        let e = gone
            .call(json!({}), ToolContext::detached("c", "gone"))
            .await
            .unwrap_err();
        assert!(e.message.contains("no longer available"), "{e}");
        // A logged schema that does not compile is refused, as is a log that holds one.
        entries[1].parameters = json!({"type": 12});
        assert!(matches!(
            Catalog::new(entries.clone()),
            Err(ToolboxError::InvalidSchema { .. })
        ));
        let text = serde_json::to_string(&entries).unwrap();
        let e = serde_json::from_str::<Catalog>(&text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gone"), "{e}");
    }

    #[test]
    fn subjects_are_taken_only_where_the_policy_weighs_them() {
        let b = Toolbox::new().with(t("read")).unwrap();
        let call = ToolCall::new("read", json!({"path": "a"}));
        let other = ToolCall::new("write", json!({"path": "b"}));
        let calls = [call, other];
        // No policy, a tool allowed by default: none is taken.
        assert!(
            b.approval_subjects(&Approvals::default(), &calls)
                .is_empty()
        );
        // A rule names `read`: its subject is taken, not the unknown tool's.
        let approvals = Approvals::default()
            .rule(crate::approval::Rule::parse(Action::Deny, "read:*secret*").unwrap());
        assert_eq!(
            b.approval_subjects(&approvals, &calls),
            [Some(r#"{"path":"a"}"#.into()), None]
        );
        // A subject after a call without one stays in its call's place.
        let [first, second] = calls.clone();
        assert_eq!(
            b.approval_subjects(&approvals, &[second, first.clone(), first]),
            [
                None,
                Some(r#"{"path":"a"}"#.into()),
                Some(r#"{"path":"a"}"#.into())
            ]
        );
        // Every call asked about: every subject is taken.
        assert_eq!(
            b.approval_subjects(&Approvals::ask_all(), &calls),
            [
                Some(r#"{"path":"a"}"#.into()),
                Some(r#"{"path":"b"}"#.into())
            ]
        );
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
