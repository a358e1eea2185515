//! Tools: what the model can call.
//!
//! Implement [`Tool`] by hand, or build a typed tool from an async function whose argument type
//! derives `Deserialize` and `JsonSchema`: the schema comes from the type.
//!
//! ```
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//! use toolloop::tool::{tool_fn, Tool, ToolContext, ToolError, ToolOutput};
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Add {
//!     /// First term.
//!     a: i64,
//!     /// Second term.
//!     b: i64,
//! }
//!
//! let add = tool_fn("add", "Adds two integers.", |args: Add, _ctx: ToolContext| async move {
//!     Ok::<_, ToolError>(ToolOutput::json(&(args.a + args.b)))
//! })
//! .allow_parallel();
//! assert!(add.parallel_safe());
//! assert_eq!(add.name(), "add");
//! assert_eq!(add.parameters()["required"], serde_json::json!(["a", "b"]));
//! ```

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::marker::PhantomData;
use tokio_util::sync::CancellationToken;

/// What a tool's call may change in the world. Used on resume: a read-only or idempotent call
/// that was in flight is run again; a side-effecting one is never silently repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffect {
    /// Reads only.
    ReadOnly,
    /// Changes the world, but doing it twice equals doing it once.
    Idempotent,
    /// Changes the world; doing it twice may differ from once.
    #[default]
    SideEffecting,
}

/// What a tool call gets besides its arguments.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The id of the call.
    pub call_id: String,
    /// The tool's name.
    pub tool_name: String,
    /// Cancelled when the run is cancelled or times out; long-running tools should watch it.
    pub cancel: CancellationToken,
    /// When the run (or this call) must be over, if there is a limit.
    pub deadline: Option<tokio::time::Instant>,
    /// 1 for the first attempt, 2 for the first retry, …
    pub attempt: u32,
    /// A key that stays the same for this call across retries and resumes; pass it on to the
    /// systems the tool changes so they can drop repeats.
    pub idempotency_key: String,
    /// The id of the run that makes the call, when the run is logged (a sub-agent logs its
    /// run under `{run_id}/{call_id}`: see [`crate::subagent`]).
    pub run_id: Option<String>,
    /// What a sub-agent called by this run inherits from it: the event stream, the approval
    /// handler, the run log, the depth and the budget left (see [`crate::subagent`]). `None`
    /// outside an agent's run.
    pub scope: Option<std::sync::Arc<crate::subagent::Scope>>,
}

impl ToolContext {
    /// A context for calling a tool directly (tests, scripts).
    pub fn detached(call_id: impl Into<String>, tool_name: impl Into<String>) -> Self {
        let call_id = call_id.into();
        ToolContext {
            idempotency_key: call_id.clone(),
            call_id,
            tool_name: tool_name.into(),
            cancel: CancellationToken::new(),
            deadline: None,
            attempt: 1,
            run_id: None,
            scope: None,
        }
    }
}

/// A successful tool result. The model reads it as `{"success": true, "message": …, "data": …}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ToolOutput {
    /// A short human-readable message.
    pub message: String,
    /// Structured data.
    pub data: Option<Value>,
    /// A terminal signal: the run ends after this round with this signal.
    pub signal: Option<String>,
    /// Images the tool gives the model (a screenshot, a chart), sent with the result in the
    /// form each API takes (see [`crate::message::ToolResult::images`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::image::Image>,
    /// What the call spent on model calls of its own (a sub-agent's run): the run that made the
    /// call adds it to its usage and cost. The model does not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Box<crate::usage::Spent>>,
}

impl ToolOutput {
    /// A message-only result.
    pub fn text(message: impl Into<String>) -> Self {
        ToolOutput {
            message: message.into(),
            ..ToolOutput::default()
        }
    }

    /// A result carrying data, with the message `"ok"`.
    pub fn data(data: Value) -> Self {
        ToolOutput {
            message: "ok".into(),
            data: Some(data),
            ..ToolOutput::default()
        }
    }

    /// A result carrying any serializable value as data.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Self {
        match serde_json::to_value(value) {
            Ok(v) => ToolOutput::data(v),
            Err(e) => ToolOutput::text(format!("result could not be serialized: {e}")),
        }
    }

    /// Adds a message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// Adds an image for the model to see (see [`ToolOutput::images`]).
    pub fn with_image(mut self, image: crate::image::Image) -> Self {
        self.images.push(image);
        self
    }

    /// Ends the run after this round with `signal`.
    pub fn with_signal(mut self, signal: impl Into<String>) -> Self {
        self.signal = Some(signal.into());
        self
    }
}

impl From<String> for ToolOutput {
    fn from(s: String) -> Self {
        ToolOutput::text(s)
    }
}

impl From<&str> for ToolOutput {
    fn from(s: &str) -> Self {
        ToolOutput::text(s)
    }
}

impl From<Value> for ToolOutput {
    fn from(v: Value) -> Self {
        ToolOutput::data(v)
    }
}

/// A failed tool call. The model reads it as `{"success": false, "message": …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// What went wrong, for the model.
    pub message: String,
    /// Whether the loop may retry the call (with backoff) before reporting the failure.
    pub retryable: bool,
    /// Structured detail.
    pub data: Option<Value>,
    /// What the call spent on model calls of its own before it failed (a sub-agent's run);
    /// see [`ToolOutput::spent`]. Boxed: most errors carry none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Box<crate::usage::Spent>>,
}

impl ToolError {
    /// A failure that retrying will not fix.
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
            retryable: false,
            data: None,
            spent: None,
        }
    }

    /// A failure that may pass on a retry (a timeout, a busy service).
    pub fn retryable(message: impl Into<String>) -> Self {
        ToolError {
            retryable: true,
            ..ToolError::new(message)
        }
    }
}

impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> Self {
        ToolError::new(e.to_string())
    }
}

impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError::new(s)
    }
}

impl From<&str> for ToolError {
    fn from(s: &str) -> Self {
        ToolError::new(s)
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model uses.
    fn name(&self) -> &str;
    /// What the tool does, for the model.
    fn description(&self) -> &str;
    /// The JSON Schema of the arguments.
    fn parameters(&self) -> &Value;
    /// Whether the call may run at the same time as other parallel-safe calls. Default: no.
    fn parallel_safe(&self) -> bool {
        false
    }
    /// Whether calling the tool ends the run (after the round's other calls). Default: no.
    fn terminal(&self) -> bool {
        false
    }
    /// What the tool changes. Default: side-effecting.
    fn side_effect(&self) -> SideEffect {
        SideEffect::SideEffecting
    }
    /// What approval rules match against for a call with these arguments (see
    /// [`crate::approval`]): a command line, a path, in the normal form of what the call will
    /// touch, with the other spellings of the same call that `deny` and `ask` rules must also
    /// catch. A tool that resolves what it touches (a path through links, a program through
    /// `PATH`) resolves it here the same way; it is asked before the call runs, so it should
    /// be quick and must not change anything. Default: the canonical JSON arguments (keys
    /// sorted, no spaces).
    fn approval_subject(&self, args: &Value) -> crate::approval::Subject {
        crate::message::canonical_json(args).into()
    }
    /// The approval a call gets when no rule of the run's [`crate::approval::Approvals`]
    /// matches and the policy sets no default. Default: allow.
    fn default_approval(&self) -> crate::approval::Action {
        crate::approval::Action::Allow
    }
    /// Whether only a person may approve this call: a rule or a default that would allow it
    /// is taken as `ask` (a rule that denies it still wins). For calls that step outside a
    /// guard, such as `run_command` asked to run outside its sandbox. Default: no.
    fn approval_required(&self, args: &Value) -> bool {
        let _ = args;
        false
    }
    /// The sub-agent this tool runs, when it is one ([`crate::subagent::SubAgent`]): how a run
    /// finds its children (their approvals, their logs). Default: none.
    fn sub_agent(&self) -> Option<&crate::subagent::SubAgent> {
        None
    }
    /// Runs the call. `args` has passed the schema.
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

/// The JSON Schema of a type, cleaned for tool catalogs (no `$schema` or `title` at the top).
pub fn schema_of<T: JsonSchema>() -> Value {
    let mut v = schemars::schema_for!(T).to_value();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
    }
    v
}

/// A typed tool made from an async function; see [`tool_fn`].
pub struct FnTool<A, F> {
    name: String,
    description: String,
    parameters: Value,
    parallel_safe: bool,
    terminal: bool,
    side_effect: SideEffect,
    f: F,
    _args: PhantomData<fn(A)>,
}

/// Makes a tool from an async function of a typed argument struct.
pub fn tool_fn<A, F, Fut, O>(
    name: impl Into<String>,
    description: impl Into<String>,
    f: F,
) -> FnTool<A, F>
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
    O: Into<ToolOutput>,
{
    FnTool {
        name: name.into(),
        description: description.into(),
        parameters: schema_of::<A>(),
        parallel_safe: false,
        terminal: false,
        side_effect: SideEffect::SideEffecting,
        f,
        _args: PhantomData,
    }
}

impl<A, F> FnTool<A, F> {
    /// Lets the tool run at the same time as other parallel-safe calls.
    pub fn allow_parallel(mut self) -> Self {
        self.parallel_safe = true;
        self
    }

    /// Makes calling the tool end the run.
    pub fn make_terminal(mut self) -> Self {
        self.terminal = true;
        self
    }

    /// Declares what the tool changes.
    pub fn with_side_effect(mut self, side_effect: SideEffect) -> Self {
        self.side_effect = side_effect;
        self
    }

    /// Offers `parameters` as the JSON Schema of the arguments, in place of the one made from
    /// `A`: for a tool whose arguments are known only at run time (with `A` =
    /// [`serde_json::Value`], the function gets them as they came, once they pass the schema).
    pub fn with_parameters(mut self, parameters: Value) -> Self {
        self.parameters = parameters;
        self
    }
}

#[async_trait]
impl<A, F, Fut, O> Tool for FnTool<A, F>
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
    O: Into<ToolOutput>,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn parallel_safe(&self) -> bool {
        self.parallel_safe
    }
    fn terminal(&self) -> bool {
        self.terminal
    }
    fn side_effect(&self) -> SideEffect {
        self.side_effect
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: A = serde_json::from_value(args)
            .map_err(|e| ToolError::new(format!("arguments do not fit the tool: {e}")))?;
        (self.f)(args, ctx).await.map(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Deserialize, JsonSchema)]
    struct Echo {
        word: String,
    }

    #[tokio::test]
    async fn typed_tool_gets_typed_arguments() {
        let t = tool_fn("echo", "Echoes.", |a: Echo, ctx: ToolContext| async move {
            Ok::<_, ToolError>(format!("{} from {}", a.word, ctx.call_id))
        })
        .make_terminal();
        assert!(t.terminal());
        assert!(!t.parallel_safe());
        assert_eq!(
            t.parameters()["properties"]["word"]["type"],
            json!("string")
        );
        assert!(t.parameters().get("$schema").is_none());
        let out = t
            .call(json!({"word": "hi"}), ToolContext::detached("c1", "echo"))
            .await
            .unwrap();
        assert_eq!(out.message, "hi from c1");
        let err = t
            .call(json!({"word": 3}), ToolContext::detached("c1", "echo"))
            .await
            .unwrap_err();
        assert!(err.message.contains("arguments do not fit"), "{err}");
    }

    #[tokio::test]
    async fn a_typed_tool_may_offer_a_schema_known_at_run_time() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
        let t = tool_fn(
            "weather",
            "Weather.",
            |a: Value, _ctx: ToolContext| async move { Ok::<_, ToolError>(ToolOutput::data(a)) },
        )
        .with_parameters(schema.clone());
        assert_eq!(t.parameters(), &schema);
        let out = t
            .call(
                json!({"city": "Oslo"}),
                ToolContext::detached("c1", "weather"),
            )
            .await
            .unwrap();
        assert_eq!(out.data, Some(json!({"city": "Oslo"})));
    }
}
