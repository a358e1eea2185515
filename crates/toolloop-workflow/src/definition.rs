//! The workflow definition: inputs, defaults and named steps, read from a TOML file.

use crate::WorkflowError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The rounds (model calls) a step may make when neither it nor the workflow's `defaults` sets
/// `max_rounds` (the design's `maxIterations || 5`).
pub const DEFAULT_MAX_ROUNDS: u32 = 5;
/// The tool calls a step may make when neither it nor the workflow's `defaults` sets
/// `max_tool_calls`.
pub const DEFAULT_MAX_TOOL_CALLS: u32 = 20;
/// How many steps run at once when the workflow does not set `max_parallel`.
pub const DEFAULT_MAX_PARALLEL: u32 = 4;
/// The largest workflow file read.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// A workflow: named steps, each a tool-calling run with its own prompt template, tools and
/// limits, chained by their outputs.
///
/// ```toml
/// name = "fix-tests"
///
/// [inputs.dir]
/// description = "Where the project is"
/// default = "."
///
/// [[steps]]
/// id = "test"
/// prompt = "Run the tests in {{ inputs.dir }} and report the failures."
/// tools = ["run_command"]
///
/// [[steps]]
/// id = "fix"
/// prompt = "Fix these failures:\n{{ steps.test.output }}"
/// tools = ["read_file", "write_file", "run_command"]
/// when = "not steps.test.output.startswith('All tests passed')"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// The workflow's name, shown in listings and events.
    pub name: String,
    /// What the workflow does (for people; not sent to a model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The inputs the templates may read as `{{ inputs.NAME }}`, by name. An input without a
    /// `default` must be given (`--input NAME=VALUE`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, Input>,
    /// What every step takes unless it sets its own.
    #[serde(default)]
    pub defaults: Defaults,
    /// How many independent steps may run at once (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_parallel: Option<u32>,
    /// The steps. Without `depends_on` a step runs after the one before it (file order); with
    /// `depends_on` it runs once those steps are done, beside any other step that is ready.
    pub steps: Vec<Step>,
}

/// An input of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// What it is (shown by `toolloop workflow check`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its value when none is given; without one the input is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// Settings of every step that does not set its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// The model, as `provider:model` (`openai:gpt-4.1-mini`); without one, the runner's
    /// default model (the command's `--model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A system prompt template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Model calls per step (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_rounds: Option<u32>,
    /// Tool executions per step (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Wall-clock limit per step: `90s`, `2m`, `1h 30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// One step: a tool-calling run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The step's id: letters, digits and `_`, not starting with a digit (templates read its
    /// result as `steps.ID`). Unique in the workflow.
    pub id: String,
    /// The user prompt, a template over `inputs` and the results of the steps this one comes
    /// after (`{{ steps.extract.output.title }}`).
    pub prompt: String,
    /// The system prompt, a template like `prompt` (default: `defaults.system`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The model, as `provider:model` (default: `defaults.model`, else the runner's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The tools the step may call, by name, from those the runner has (the file tools,
    /// `run_command`, MCP tools, Rust tools). None by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Model calls (the design's iterations) the step may make (default: `defaults.max_rounds`,
    /// else 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_rounds: Option<u32>,
    /// Tool executions the step may make (default: `defaults.max_tool_calls`, else 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Wall-clock limit of the step: `90s`, `2m`, `1h 30m` (default: `defaults.timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// The steps this one runs after (and whose results its templates may read). Absent: the
    /// step before it in the file. `[]`: none; it may start at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depends_on: Option<Vec<String>>,
    /// A condition (a template expression, `steps.test.success and inputs.fix == 'yes'`): when
    /// it is false the step is skipped (its result says so, its output is null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Go on with the workflow when this step fails (later steps read
    /// `steps.ID.success`). By default a failed step stops the workflow.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continue_on_error: bool,
    /// A JSON Schema the step's final answer must match: the answer is then JSON, and templates
    /// read its fields (`steps.ID.output.FIELD`). An answer that does not match goes back to the
    /// model with the errors, within the run's budget of invalid answers; then the step fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// `output_schema` read from a JSON file (relative to the workflow file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema_file: Option<PathBuf>,
}

/// The largest `output_schema_file` read.
pub const MAX_SCHEMA_FILE_BYTES: u64 = 1024 * 1024;

/// Where the files a workflow names (`output_schema_file`) may be. A workflow is a project
/// file like any other: what it names is read and sent to the model, so by default it may name
/// only files in its own directory and below.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FileAccess {
    /// Only in the workflow's directory (the current directory for text read without one) and
    /// below, symbolic links resolved: an absolute path or a `..` that leads out of it is
    /// refused. The default.
    #[default]
    Confined,
    /// Anywhere the process may read (the command's `--workflow-files-anywhere`).
    Anywhere,
}

impl Workflow {
    /// Reads a workflow from TOML text. `output_schema_file` paths are read relative to `dir`
    /// (none: the current directory), confined to it ([`FileAccess::Confined`]), and inlined
    /// as `output_schema`.
    pub fn from_toml(text: &str, dir: Option<&Path>) -> Result<Workflow, WorkflowError> {
        Workflow::from_toml_with(text, dir, FileAccess::Confined)
    }

    /// [`Workflow::from_toml`], with the files it names read as `access` allows.
    pub fn from_toml_with(
        text: &str,
        dir: Option<&Path>,
        access: FileAccess,
    ) -> Result<Workflow, WorkflowError> {
        let mut workflow: Workflow = toml::from_str(text).map_err(|e| WorkflowError::Parse {
            path: None,
            message: e.to_string(),
        })?;
        for step in &mut workflow.steps {
            let Some(file) = step.output_schema_file.take() else {
                continue;
            };
            let invalid = |message: String| WorkflowError::Invalid(vec![message]);
            if step.output_schema.is_some() {
                return Err(invalid(format!(
                    "step `{}`: set `output_schema` or `output_schema_file`, not both",
                    step.id
                )));
            }
            let at = || format!("step `{}`: output_schema_file {}", step.id, file.display());
            let path =
                named_file(dir, &file, access).map_err(|e| invalid(format!("{}: {e}", at())))?;
            let text = toolloop::user_file::read_to_string(&path, MAX_SCHEMA_FILE_BYTES)
                .map_err(|e| invalid(format!("{}: {e}", at())))?;
            let schema: Value = serde_json::from_str(&text)
                .map_err(|e| invalid(format!("{} is not JSON: {e}", at())))?;
            step.output_schema = Some(schema);
        }
        Ok(workflow)
    }

    /// Reads a workflow file (TOML; see the crate docs for every field); the files it names
    /// must be beside it or below ([`FileAccess::Confined`]).
    pub fn from_file(path: &Path) -> Result<Workflow, WorkflowError> {
        Workflow::from_file_with(path, FileAccess::Confined)
    }

    /// [`Workflow::from_file`], with the files it names read as `access` allows.
    pub fn from_file_with(path: &Path, access: FileAccess) -> Result<Workflow, WorkflowError> {
        let parse_err = |message: String| WorkflowError::Parse {
            path: Some(path.to_path_buf()),
            message,
        };
        let text = toolloop::user_file::read_to_string(path, MAX_FILE_BYTES)
            .map_err(|e| parse_err(e.to_string()))?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        Workflow::from_toml_with(&text, dir, access).map_err(|e| match e {
            WorkflowError::Parse { message, .. } => parse_err(message),
            other => other,
        })
    }

    /// The JSON Schema of the workflow file format (for editors: `docs/workflow.schema.json`).
    pub fn json_schema() -> Value {
        serde_json::to_value(schemars::schema_for!(Workflow)).unwrap_or(Value::Null)
    }

    /// The step with this id.
    pub fn step(&self, id: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.id == id)
    }

    /// How many steps may run at once.
    pub fn max_parallel(&self) -> usize {
        self.max_parallel
            .unwrap_or(DEFAULT_MAX_PARALLEL)
            .clamp(1, 64) as usize
    }

    /// The inputs the templates see: the given values over the defaults. Fails naming the
    /// inputs that are required and missing, or given but not declared.
    pub fn resolve_inputs(
        &self,
        given: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, WorkflowError> {
        let mut problems = Vec::new();
        for name in given.keys() {
            if !self.inputs.contains_key(name) {
                problems.push(format!(
                    "input `{name}` is not an input of workflow `{}` ({})",
                    self.name,
                    known(self.inputs.keys())
                ));
            }
        }
        let mut out = BTreeMap::new();
        for (name, input) in &self.inputs {
            match given.get(name).or(input.default.as_ref()) {
                Some(v) => {
                    out.insert(name.clone(), v.clone());
                }
                None => problems.push(format!(
                    "input `{name}` is required: give it with --input {name}=VALUE{}",
                    input
                        .description
                        .as_ref()
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default()
                )),
            }
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(WorkflowError::Inputs(problems))
        }
    }
}

impl Step {
    /// The model the step names, else the workflow's default one (`None`: the runner's).
    pub fn model<'a>(&'a self, workflow: &'a Workflow) -> Option<&'a str> {
        self.model.as_deref().or(workflow.defaults.model.as_deref())
    }

    /// The step's system prompt template, else the workflow's default one.
    pub fn system<'a>(&'a self, workflow: &'a Workflow) -> Option<&'a str> {
        self.system
            .as_deref()
            .or(workflow.defaults.system.as_deref())
    }

    /// Its round limit (the design's `maxIterations`, 5 unless set).
    pub fn max_rounds(&self, workflow: &Workflow) -> u32 {
        self.max_rounds
            .or(workflow.defaults.max_rounds)
            .unwrap_or(DEFAULT_MAX_ROUNDS)
    }

    /// Its tool-call limit.
    pub fn max_tool_calls(&self, workflow: &Workflow) -> u32 {
        self.max_tool_calls
            .or(workflow.defaults.max_tool_calls)
            .unwrap_or(DEFAULT_MAX_TOOL_CALLS)
    }

    /// Its timeout, parsed (an error names the field).
    pub fn timeout(&self, workflow: &Workflow) -> Result<Option<Duration>, String> {
        let (field, text) = match (&self.timeout, &workflow.defaults.timeout) {
            (Some(t), _) => (format!("step `{}`: timeout", self.id), t),
            (None, Some(t)) => ("defaults.timeout".to_string(), t),
            (None, None) => return Ok(None),
        };
        match humantime::parse_duration(text.trim()) {
            Ok(d) if !d.is_zero() => Ok(Some(d)),
            Ok(_) => Err(format!("{field}: `{text}` is not a positive duration")),
            Err(e) => Err(format!(
                "{field}: `{text}` is not a duration ({e}); expected `90s`, `2m`, `1h 30m`"
            )),
        }
    }
}

/// `a, b, c`, or `it has none`.
pub(crate) fn known<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() {
        "it has none".to_string()
    } else {
        format!("known: {}", names.join(", "))
    }
}

/// The path of a file a workflow names (`file`, relative to `dir`), checked against `access`:
/// when confined, the file, its links resolved, must be inside `dir` (its links resolved too).
fn named_file(dir: Option<&Path>, file: &Path, access: FileAccess) -> Result<PathBuf, String> {
    let base = dir.unwrap_or(Path::new("."));
    let path = base.join(file);
    if access == FileAccess::Anywhere {
        return Ok(path);
    }
    let root = std::fs::canonicalize(base)
        .map_err(|e| format!("the workflow's directory {}: {e}", base.display()))?;
    let real = std::fs::canonicalize(&path).map_err(|e| e.to_string())?;
    if !real.starts_with(&root) {
        return Err(format!(
            "it is outside the workflow's directory {} (it leads to {}): a workflow reads only \
             files in its own directory and below, unless this is lifted (`toolloop workflow \
             --workflow-files-anywhere`, or FileAccess::Anywhere)",
            root.display(),
            real.display()
        ));
    }
    Ok(real)
}
