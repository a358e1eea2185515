//! `scripted`: replays a list of responses, then fails with a clear error.
//!
//! From JSON (`--model scripted:<file>` on the command line), the script is an array; each
//! element is an object with an optional `"text"`, an optional `"tool_calls"` array of
//! `{"name": …, "arguments": {…}, "id": …}` (ids are generated when absent; `arguments` may
//! also be a string, replayed as the model's raw argument text), and optionally `"usage"`
//! (`{"input_tokens": …, "output_tokens": …}`), `"finish_reason"`, `"delay_ms"` (wait before
//! answering) and `"error"` (fail this call with that message).
//!
//! ```
//! use toolloop::providers::scripted::ScriptedModel;
//! let model = ScriptedModel::from_json(r#"[
//!   {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
//!   {"text": "It is a README."}
//! ]"#).unwrap();
//! assert_eq!(model.len(), 2);
//! ```

use crate::message::{ToolCall, new_call_id};
use crate::model::{EventStream, FinishReason, Model, ModelError, ModelRequest, ModelResponse};
use crate::stream::StreamEvent;
use crate::usage::Usage;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One scripted step.
#[derive(Debug, Clone)]
pub enum ScriptStep {
    /// Answer with this response (tool calls without ids get fresh ones on every replay).
    Respond(ModelResponse),
    /// Fail with this error.
    Fail(ModelError),
    /// Wait, then take the next step.
    Delay(Duration, Box<ScriptStep>),
}

/// A model that replays a script.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    steps: Arc<Vec<ScriptStep>>,
    next: Arc<AtomicUsize>,
    name: String,
}

/// Why a script could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read the script {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The JSON does not have the expected shape.
    #[error(
        "invalid script: {0}. Expected a JSON array of objects with optional \"text\" and \"tool_calls\": [{{\"name\": …, \"arguments\": {{…}}}}]"
    )]
    Invalid(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCall {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonStep {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Vec<JsonCall>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    finish_reason: Option<FinishReason>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

impl ScriptedModel {
    /// A model replaying these responses in order.
    pub fn new(responses: Vec<ModelResponse>) -> Self {
        Self::from_steps(responses.into_iter().map(ScriptStep::Respond).collect())
    }

    /// A model replaying these steps in order.
    pub fn from_steps(steps: Vec<ScriptStep>) -> Self {
        ScriptedModel {
            steps: Arc::new(steps),
            next: Arc::new(AtomicUsize::new(0)),
            name: "scripted".into(),
        }
    }

    /// Reads a script from JSON; see the module docs for the format.
    pub fn from_json(json: &str) -> Result<Self, ScriptError> {
        let steps: Vec<JsonStep> =
            serde_json::from_str(json).map_err(|e| ScriptError::Invalid(e.to_string()))?;
        let steps = steps
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let step = match s.error {
                    Some(message) => ScriptStep::Fail(ModelError::Other(message)),
                    None => {
                        let tool_calls: Vec<ToolCall> = s
                            .tool_calls
                            .into_iter()
                            .map(|c| {
                                let id = c.id.unwrap_or_default();
                                match c.arguments {
                                    Some(Value::String(raw)) => {
                                        ToolCall::from_raw_arguments(id, c.name, &raw)
                                    }
                                    args => ToolCall {
                                        id,
                                        name: c.name,
                                        arguments: args
                                            .unwrap_or_else(|| Value::Object(Default::default())),
                                        invalid_arguments: None,
                                        provider_data: None,
                                    },
                                }
                            })
                            .collect();
                        if s.text.is_none() && tool_calls.is_empty() {
                            return Err(ScriptError::Invalid(format!(
                                "element {i} has neither \"text\" nor \"tool_calls\""
                            )));
                        }
                        let finish_reason = s.finish_reason.unwrap_or(if tool_calls.is_empty() {
                            FinishReason::Stop
                        } else {
                            FinishReason::ToolCalls
                        });
                        ScriptStep::Respond(ModelResponse {
                            text: s.text,
                            tool_calls,
                            finish_reason,
                            usage: s.usage,
                            ..ModelResponse::default()
                        })
                    }
                };
                Ok(match s.delay_ms {
                    Some(ms) => ScriptStep::Delay(Duration::from_millis(ms), Box::new(step)),
                    None => step,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_steps(steps))
    }

    /// Reads a script file: a regular file of at most [`SCRIPT_MAX_BYTES`]. A FIFO, socket
    /// or device is refused without waiting on it.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, ScriptError> {
        let path = path.as_ref();
        let error = |source| ScriptError::Io {
            path: path.display().to_string(),
            source,
        };
        let text = read_script(path).map_err(error)?;
        Self::from_json(&text)
    }

    /// Sets the name used for prices and logs.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Steps in the script.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the script is empty.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Steps replayed so far.
    pub fn used(&self) -> usize {
        self.next.load(Ordering::SeqCst).min(self.steps.len())
    }

    async fn take(&self) -> Result<ModelResponse, ModelError> {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        let Some(mut step) = self.steps.get(i).cloned() else {
            return Err(ModelError::Other(format!(
                "the scripted model ran out of responses: the script has {} and call {} was made; \
                 add more responses to the script",
                self.steps.len(),
                i + 1
            )));
        };
        loop {
            match step {
                ScriptStep::Delay(d, next) => {
                    tokio::time::sleep(d).await;
                    step = *next;
                }
                ScriptStep::Fail(e) => return Err(e),
                ScriptStep::Respond(mut r) => {
                    for c in &mut r.tool_calls {
                        if c.id.is_empty() {
                            c.id = new_call_id();
                        }
                    }
                    return Ok(r);
                }
            }
        }
    }
}

/// The largest script file [`ScriptedModel::from_file`] reads (64 MiB).
pub const SCRIPT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Reads a script file, refusing what is not a regular file and what is too large.
fn read_script(path: &std::path::Path) -> std::io::Result<String> {
    crate::user_file::read_to_string(path, SCRIPT_MAX_BYTES).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            std::io::Error::new(
                e.kind(),
                format!("{e}; `scripted:` takes the path of a JSON file"),
            )
        } else {
            e
        }
    })
}

/// Splits text into pieces of about `n` characters, on character boundaries.
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(&self, _request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.take().await
    }

    /// Streams the next response in small pieces (text in chunks of 8 characters, arguments
    /// in chunks of 5), as a real server would.
    async fn stream(&self, _request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        let response = self.take().await?;
        let mut events = Vec::new();
        for e in response.into_events() {
            match e {
                StreamEvent::TextDelta(t) => {
                    events.extend(pieces(&t, 8).into_iter().map(StreamEvent::TextDelta))
                }
                StreamEvent::ToolCallDelta { index, arguments } => {
                    events.extend(pieces(&arguments, 5).into_iter().map(|a| {
                        StreamEvent::ToolCallDelta {
                            index,
                            arguments: a,
                        }
                    }))
                }
                other => events.push(other),
            }
        }
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelSettings;
    use serde_json::json;

    fn req() -> (Vec<crate::message::Message>, ModelSettings) {
        (
            vec![crate::message::Message::user("hi")],
            ModelSettings::default(),
        )
    }

    #[tokio::test]
    async fn replays_then_fails_clearly() {
        let m = ScriptedModel::from_json(
            r#"[{"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}, {"text": "done"}]"#,
        )
        .unwrap();
        let (msgs, settings) = req();
        let r = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let first = m.complete(&r).await.unwrap();
        assert_eq!(first.tool_calls[0].arguments, json!({"a": 1}));
        assert!(first.tool_calls[0].id.starts_with("call_"));
        assert_eq!(first.finish_reason, FinishReason::ToolCalls);
        assert_eq!(m.complete(&r).await.unwrap().text.as_deref(), Some("done"));
        let err = m.complete(&r).await.unwrap_err().to_string();
        assert!(err.contains("ran out of responses"), "{err}");
    }

    #[tokio::test]
    async fn streamed_equals_complete() {
        let json = r#"[{"text": "héllo wörld, a longer text", "tool_calls": [{"name": "f", "id": "c1", "arguments": {"q": "ünïcode"}}]}]"#;
        let (msgs, settings) = req();
        let r = ModelRequest {
            messages: (&msgs).into(),
            reminders: &[],
            tools: &[],
            settings: &settings,
        };
        let a = ScriptedModel::from_json(json).unwrap();
        let b = ScriptedModel::from_json(json).unwrap();
        let complete = a.complete(&r).await.unwrap();
        let streamed = ModelResponse::from_stream(b.stream(&r).await.unwrap())
            .await
            .unwrap();
        assert_eq!(complete, streamed);
    }

    #[cfg(unix)]
    #[test]
    fn script_files_must_be_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("script.fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        // Run on another thread: before the fix, opening the FIFO waited for a writer forever.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(ScriptedModel::from_file(&path).map(|m| m.len()));
        });
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("reading a FIFO as a script returns at once");
        let e = result.unwrap_err().to_string();
        assert!(e.contains("script.fifo"), "{e}");
        assert!(e.contains("not a regular file"), "{e}");
        assert!(e.contains("JSON file"), "{e}");

        let e = ScriptedModel::from_file(dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory"), "{e}");

        let file = dir.path().join("script.json");
        std::fs::write(&file, r#"[{"text": "hi"}]"#).unwrap();
        assert_eq!(ScriptedModel::from_file(&file).unwrap().len(), 1);
        // Larger than the cap (sparse, so nothing is stored): refused without being read.
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(SCRIPT_MAX_BYTES + 1)
            .unwrap();
        let e = ScriptedModel::from_file(&file).unwrap_err().to_string();
        assert!(e.contains("larger than 64 MiB"), "{e}");
    }

    #[test]
    fn bad_scripts_say_what_is_expected() {
        let e = ScriptedModel::from_json("{}").unwrap_err().to_string();
        assert!(e.contains("Expected a JSON array"), "{e}");
        let e = ScriptedModel::from_json("[{}]").unwrap_err().to_string();
        assert!(e.contains("element 0"), "{e}");
        let e = ScriptedModel::from_json(r#"[{"txt": "x"}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("txt"), "{e}");
    }
}
