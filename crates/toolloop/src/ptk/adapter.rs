//! The prompted adapter: tool calling for any model, through its text.

use super::dialect::Dialect;
use super::render::render_messages;
use super::stream::StreamParser;
use crate::message::Message;
use crate::model::{
    EventStream, FinishReason, Model, ModelError, ModelRequest, ModelResponse, ModelSettings,
    ToolChoice, ToolSpec,
};
use crate::stream::{Accumulator, StreamEvent};
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::VecDeque;
use std::sync::Arc;

/// Inner tool-call indices (from a model that called a tool natively after all) are moved out of
/// the way of the parsed calls' indices.
const INNER_INDEX_OFFSET: usize = 1 << 20;

/// Wraps a model that has no native tool calling (or whose server rejects `tools`).
///
/// Each request is rewritten: the tool catalog and the call format of the chosen [`Dialect`]
/// join the system prompt, past calls become the assistant's own text, tool results become
/// `PTK_RESULT:` user messages, and the inner model is called with no tools (a tool choice
/// becomes a transient reminder; an output schema becomes instructions at the end of the system
/// prompt, see [`crate::output`]). The reply is parsed in every dialect, complete or streamed:
/// calls get fresh ids, a repaired call carries `{"repaired": true}` in its `provider_data`, and
/// an attempted call that does not parse makes the response a
/// [`FinishReason::MalformedToolCall`] with [`ModelResponse::malformed_call`] set (the text is
/// kept), so the loop sends the explanation back instead of taking the reply as the answer.
pub struct Prompted {
    inner: Arc<dyn Model>,
    dialect: Dialect,
    implicit_think: bool,
}

impl Prompted {
    /// Wraps `inner`, teaching it `dialect`.
    pub fn new(inner: Arc<dyn Model>, dialect: Dialect) -> Self {
        Prompted {
            inner,
            dialect,
            implicit_think: false,
        }
    }

    /// Whether the model's replies begin inside a reasoning block whose `<think>` its chat
    /// template already wrote, so that a reply holds only the closing `</think>` (DeepSeek R1
    /// and Qwen3 thinking models behind many servers). On, the text before a first `</think>`
    /// with no `<think>` before it is reasoning, kept out of the answer like `<think>…</think>`;
    /// streamed text is held back until that tag arrives (a reply without one is read as usual
    /// when it ends). Off by default.
    pub fn implicit_think(mut self, on: bool) -> Self {
        self.implicit_think = on;
        self
    }

    /// The dialect taught to the model.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The wrapped model.
    pub fn inner(&self) -> &Arc<dyn Model> {
        &self.inner
    }

    /// The request the inner model gets: messages, reminders and settings.
    pub fn rewrite(
        &self,
        request: &ModelRequest<'_>,
    ) -> (Vec<Message>, Vec<String>, ModelSettings) {
        rewrite(request, self.dialect)
    }
}

/// The request a model without native tools gets for `request`, taught `dialect`: messages,
/// reminders and settings (what [`Prompted`] sends its inner model; for a driver that calls
/// the model itself, with [`PromptedReply`] to read the reply).
pub fn rewrite(
    request: &ModelRequest<'_>,
    dialect: Dialect,
) -> (Vec<Message>, Vec<String>, ModelSettings) {
    let mut messages = render_messages(request.messages, request.tools, dialect);
    let mut reminders = request.reminders.to_vec();
    let mut settings = request.settings.clone();
    // An output schema becomes instructions in the system prompt: the inner model must stay
    // free to write calls as text, so it is not asked for JSON natively.
    if let Some(output) = settings.output.take() {
        let instructions = output.instructions();
        match messages.first_mut() {
            Some(Message::System { content }) => {
                content.push_str("\n\n");
                content.push_str(&instructions);
            }
            _ => messages.insert(0, Message::system(instructions)),
        }
    }
    if !request.tools.is_empty() {
        match &settings.tool_choice {
            ToolChoice::Auto => {}
            ToolChoice::None => reminders.push("Do not call any tool in this reply; answer in plain text.".into()),
            ToolChoice::Required => reminders.push(format!(
                "Call at least one tool in this reply, in the format given in the system prompt:\n{}",
                dialect.format()
            )),
            ToolChoice::Tool(name) => reminders.push(format!(
                "Call the tool `{name}` in this reply, in the format given in the system prompt:\n{}",
                dialect.format()
            )),
        }
    }
    settings.tool_choice = ToolChoice::Auto;
    (messages, reminders, settings)
}

/// The request of a [`rewrite`] for the inner model, which is offered no tools.
fn without_tools<'a>(
    messages: &'a [Message],
    reminders: &'a [String],
    settings: &'a ModelSettings,
) -> ModelRequest<'a> {
    ModelRequest {
        messages: messages.into(),
        reminders,
        tools: &[],
        settings,
    }
}

impl std::fmt::Debug for Prompted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompted")
            .field("inner", &self.inner.name())
            .field("dialect", &self.dialect)
            .field("implicit_think", &self.implicit_think)
            .finish()
    }
}

#[async_trait]
impl Model for Prompted {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let (messages, reminders, settings) = self.rewrite(request);
        let response = self
            .inner
            .complete(&without_tools(&messages, &reminders, &settings))
            .await?;
        // The same transformation as streaming, so both give the same transcript.
        let mut transform = Transform::new(request.tools, self.implicit_think, self.dialect);
        let mut acc = Accumulator::new();
        for event in response.into_events() {
            transform
                .on_event(event)
                .into_iter()
                .for_each(|e| acc.push(e));
        }
        transform.finish().into_iter().for_each(|e| acc.push(e));
        Ok(acc.finish())
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        let (messages, reminders, settings) = self.rewrite(request);
        let inner = self
            .inner
            .stream(&without_tools(&messages, &reminders, &settings))
            .await?;
        let state = State {
            inner,
            transform: Transform::new(request.tools, self.implicit_think, self.dialect),
            queue: VecDeque::new(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut st| async move {
                loop {
                    if let Some(e) = st.queue.pop_front() {
                        return Some((e, st));
                    }
                    if st.done {
                        return None;
                    }
                    match st.inner.next().await {
                        Some(Ok(event)) => st
                            .queue
                            .extend(st.transform.on_event(event).into_iter().map(Ok)),
                        Some(Err(e)) => {
                            st.done = true;
                            st.queue.push_back(Err(e));
                        }
                        None => {
                            st.done = true;
                            st.queue.extend(st.transform.finish().into_iter().map(Ok));
                        }
                    }
                }
            },
        )))
    }
}

struct State {
    inner: EventStream,
    transform: Transform,
    queue: VecDeque<Result<StreamEvent, ModelError>>,
    done: bool,
}

/// The prompted adapter's reading of a reply, for a driver that calls the model itself: the
/// inner model's events in (a streamed reply's as they come, or a complete one's
/// [`ModelResponse::into_events`]), the events of the reply with its calls parsed out.
pub struct PromptedReply(Transform);

impl PromptedReply {
    /// A reader of a reply to a request offering `tools`, taught `dialect`.
    pub fn new(tools: &[ToolSpec], dialect: Dialect, implicit_think: bool) -> Self {
        PromptedReply(Transform::new(tools, implicit_think, dialect))
    }

    /// One event of the inner model's reply; the events it completes.
    pub fn push(&mut self, event: StreamEvent) -> Vec<StreamEvent> {
        self.0.on_event(event)
    }

    /// The reply ended: its last events.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        self.0.finish()
    }
}

impl std::fmt::Debug for PromptedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptedReply").finish_non_exhaustive()
    }
}

/// Turns the inner model's events into the prompted adapter's.
struct Transform {
    parser: Option<StreamParser>,
    inner_finish: Option<FinishReason>,
    calls: usize,
    malformed: Vec<String>,
}

impl Transform {
    fn new(tools: &[ToolSpec], implicit_think: bool, dialect: Dialect) -> Self {
        let parser = if implicit_think {
            StreamParser::with_implicit_think(tools)
        } else {
            StreamParser::new(tools)
        }
        .teaching(dialect);
        Transform {
            parser: Some(parser),
            inner_finish: None,
            calls: 0,
            malformed: Vec::new(),
        }
    }

    fn on_event(&mut self, event: StreamEvent) -> Vec<StreamEvent> {
        match event {
            StreamEvent::TextDelta(t) => match self.parser.as_mut() {
                Some(p) => {
                    let events = p.push(&t);
                    self.collect(events)
                }
                None => Vec::new(),
            },
            StreamEvent::ToolCallStart { index, id, name } => {
                self.calls += 1;
                vec![StreamEvent::ToolCallStart {
                    index: index + INNER_INDEX_OFFSET,
                    id,
                    name,
                }]
            }
            StreamEvent::ToolCallDelta { index, arguments } => vec![StreamEvent::ToolCallDelta {
                index: index + INNER_INDEX_OFFSET,
                arguments,
            }],
            StreamEvent::ToolCallData { index, data } => vec![StreamEvent::ToolCallData {
                index: index + INNER_INDEX_OFFSET,
                data,
            }],
            StreamEvent::ToolCallEnd { index } => vec![StreamEvent::ToolCallEnd {
                index: index + INNER_INDEX_OFFSET,
            }],
            StreamEvent::MalformedCall(why) => {
                self.malformed.push(why);
                Vec::new()
            }
            StreamEvent::Finish(reason) => {
                self.inner_finish = Some(reason);
                Vec::new()
            }
            other @ (StreamEvent::Part(_)
            | StreamEvent::Usage(_)
            | StreamEvent::ContextEdited(_)) => vec![other],
        }
    }

    /// Keeps near-miss explanations for the end, counts calls.
    fn collect(&mut self, events: Vec<StreamEvent>) -> Vec<StreamEvent> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            match e {
                StreamEvent::MalformedCall(why) => self.malformed.push(why),
                StreamEvent::ToolCallStart { .. } => {
                    self.calls += 1;
                    out.push(e);
                }
                other => out.push(other),
            }
        }
        out
    }

    fn finish(&mut self) -> Vec<StreamEvent> {
        let mut out = match self.parser.take() {
            Some(p) => {
                let events = p.finish();
                self.collect(events)
            }
            None => Vec::new(),
        };
        let inner = self.inner_finish.unwrap_or_default();
        let reason = match inner {
            FinishReason::ContentFilter | FinishReason::Error => inner,
            _ if self.calls > 0 => FinishReason::ToolCalls,
            _ if !self.malformed.is_empty() => FinishReason::MalformedToolCall,
            FinishReason::ToolCalls => FinishReason::Stop,
            other => other,
        };
        if !self.malformed.is_empty() {
            let mut why = self.malformed.join("\n\n");
            if inner == FinishReason::Length {
                why = format!("Your reply was cut off by the output-token limit. {why}");
            }
            out.push(StreamEvent::MalformedCall(why));
        }
        out.push(StreamEvent::Finish(reason));
        out
    }
}
