//! Native tool calling with a fallback to prompt-based calling.

use super::adapter::Prompted;
use super::dialect::Dialect;
use crate::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse, ToolSpec};
use crate::stream::StreamEvent;
use crate::usage::Usage;
use async_trait::async_trait;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Native tool calling first, prompt-based calling once the server refuses it.
///
/// Each call goes to the wrapped model as it is, `tools` and all. When the server rejects the
/// tool catalog ([`ModelError::ToolsUnsupported`]: Ollama's "does not support tools", vLLM
/// without `--enable-auto-tool-choice`, llama.cpp without `--jinja`, …), the same call is made
/// again through a [`Prompted`] adapter over the same model, and every later call of this
/// instance goes straight to it: once a server has said it takes no tools, asking again would
/// only cost a failed request per round. The switch is logged (at `warn`) once.
///
/// A streamed call falls back too, whether the refusal comes as the stream's opening error or as
/// its first event. Other errors pass through unchanged.
///
/// Some servers take the `tools` parameter and drop it without a word (llama-cpp-python's
/// `chatml-function-calling` handler without a `tool_choice`, a proxy that strips it): the
/// model never sees the catalog. Such a reply is told by its usage: when a reply with no tool
/// call reports fewer prompt tokens than the catalog alone would take
/// ([`catalog_tokens_floor`]), the catalog was not in the prompt, and the call falls back as if
/// refused. So is a reply that says nothing at all, no text and no tool call, to a request with
/// tools ([`empty_reply`]: llama-cpp-python's `chatml-function-calling` answers every text reply
/// under `tool_choice: "auto"` with nothing). A complete call is made again prompt-based; a
/// streamed one ends with
/// [`ModelError::StreamInterrupted`] (its text was shown), which the loop answers by asking again
/// ([`LoopConfig::stream_restarts`](crate::config::LoopConfig::stream_restarts)), prompt-based.
///
/// ```
/// use std::sync::Arc;
/// use toolloop::model::Model;
/// use toolloop::providers::test_model::TestModel;
/// use toolloop::ptk::{Auto, Dialect};
///
/// let model = Auto::new(Arc::new(TestModel::new()), Dialect::Ptk);
/// assert!(!model.is_prompted());
/// assert_eq!(model.name(), "test");
/// ```
pub struct Auto {
    native: Arc<dyn Model>,
    prompted: Prompted,
    fell_back: Arc<AtomicBool>,
}

impl Auto {
    /// Wraps `inner`; `dialect` is taught if the server turns out to refuse tools.
    pub fn new(inner: Arc<dyn Model>, dialect: Dialect) -> Self {
        Auto {
            prompted: Prompted::new(inner.clone(), dialect),
            native: inner,
            fell_back: Arc::new(AtomicBool::new(false)),
        }
    }

    /// After the fallback, replies may begin inside reasoning opened by the chat template (see
    /// [`Prompted::implicit_think`]).
    pub fn implicit_think(mut self, on: bool) -> Self {
        self.prompted = self.prompted.implicit_think(on);
        self
    }

    /// Whether this instance has switched to prompt-based calling.
    pub fn is_prompted(&self) -> bool {
        self.fell_back.load(Ordering::Relaxed)
    }

    /// The dialect taught after the fallback.
    pub fn dialect(&self) -> Dialect {
        self.prompted.dialect()
    }

    /// The wrapped model.
    pub fn inner(&self) -> &Arc<dyn Model> {
        &self.native
    }

    fn fall_back(&self, why: &str) {
        announce(
            &self.fell_back,
            self.native.name(),
            self.prompted.dialect(),
            why,
        );
    }
}

/// A floor on the prompt tokens a tool catalog takes: its JSON (names, descriptions, schemas) in
/// bytes over 8. JSON takes 3 to 4 bytes a token, and a chat template that writes the catalog
/// more tightly still keeps its names, descriptions and parameter names, so a prompt that
/// holds the catalog is never below this.
pub fn catalog_tokens_floor(tools: &[ToolSpec]) -> u64 {
    let bytes: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    (bytes / 8) as u64
}

/// The smallest floor worth judging by: below it, a catalog is too small to tell from the
/// rest of a prompt.
const MIN_FLOOR: u64 = 48;

/// Why a reply to a request with `tools` shows that the server dropped them, if it does: no
/// tool call (`calls` is 0), and `usage` reports fewer prompt tokens than the catalog alone takes
/// ([`catalog_tokens_floor`], judged only for catalogs large enough to tell).
pub fn dropped_tools(tools: &[ToolSpec], calls: usize, usage: Option<&Usage>) -> Option<String> {
    let prompt = usage?.input_tokens;
    let floor = catalog_tokens_floor(tools);
    (calls == 0 && !tools.is_empty() && prompt > 0 && floor >= MIN_FLOOR && prompt < floor).then(
        || {
            format!(
                "it reported {prompt} prompt tokens, fewer than the tool catalog alone takes \
                 (at least {floor}): it dropped the `tools` parameter"
            )
        },
    )
}

/// Why a reply to a request with `tools` shows that native calling does not work there, when it
/// says nothing at all: no text and no tool call (llama-cpp-python's
/// `chatml-function-calling` under `tool_choice: "auto"` answers every text reply so: its
/// grammar leaves no room for text). A request without tools is never judged.
pub fn empty_reply(tools: &[ToolSpec], calls: usize, text: Option<&str>) -> Option<String> {
    (calls == 0 && !tools.is_empty() && text.is_none_or(|t| t.trim().is_empty())).then(|| {
        "it answered a request with tools with nothing: no text and no tool call".to_string()
    })
}

/// A native stream whose end is held until its usage shows whether the server dropped the tools.
fn checked_stream(
    auto: Arc<AtomicBool>,
    model: String,
    dialect: Dialect,
    tools: Vec<ToolSpec>,
    inner: EventStream,
) -> EventStream {
    struct State {
        inner: EventStream,
        tools: Vec<ToolSpec>,
        calls: usize,
        usage: Option<Usage>,
        /// Whether any text came.
        text: bool,
        finish: Option<StreamEvent>,
        ended: bool,
        flag: Arc<AtomicBool>,
        model: String,
        dialect: Dialect,
    }
    let state = State {
        inner,
        tools,
        calls: 0,
        usage: None,
        text: false,
        finish: None,
        ended: false,
        flag: auto,
        model,
        dialect,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        loop {
            match st.inner.next().await {
                Some(Ok(StreamEvent::Finish(reason))) => {
                    st.finish = Some(StreamEvent::Finish(reason));
                }
                Some(Ok(event)) => {
                    match &event {
                        StreamEvent::ToolCallStart { .. } => st.calls += 1,
                        StreamEvent::Usage(u) => st.usage = Some(*u),
                        StreamEvent::TextDelta(t) if !t.trim().is_empty() => st.text = true,
                        _ => {}
                    }
                    return Some((Ok(event), st));
                }
                Some(Err(e)) => {
                    st.ended = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.ended = true;
                    let said = st.text.then_some("text");
                    if let Some(why) = dropped_tools(&st.tools, st.calls, st.usage.as_ref())
                        .or_else(|| empty_reply(&st.tools, st.calls, said))
                    {
                        announce(&st.flag, &st.model, st.dialect, &why);
                        return Some((
                            Err(ModelError::StreamInterrupted(format!(
                                "the server ignored the tools ({why}); asking again with \
                                 prompt-based tool calling"
                            ))),
                            st,
                        ));
                    }
                    return st.finish.take().map(|f| (Ok(f), st));
                }
            }
        }
    }))
}

/// Switches `flag` to prompt-based calling, saying so the first time.
fn announce(flag: &AtomicBool, model: &str, dialect: Dialect, why: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            model,
            %dialect,
            "the server refused native tool calling ({why}); using prompt-based tool calling \
             from now on"
        );
    }
}

impl std::fmt::Debug for Auto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auto")
            .field("inner", &self.native.name())
            .field("dialect", &self.prompted.dialect())
            .field("prompted", &self.is_prompted())
            .finish()
    }
}

impl Auto {
    /// One complete call, native through `native` (this model's, or a session of it) until the
    /// fallback.
    async fn complete_with(
        &self,
        native: &dyn Model,
        request: &ModelRequest<'_>,
    ) -> Result<ModelResponse, ModelError> {
        if !self.is_prompted() {
            match native.complete(request).await {
                Err(ModelError::ToolsUnsupported(why)) => self.fall_back(&why),
                Ok(r) => {
                    let calls = r.tool_calls.len();
                    match dropped_tools(request.tools, calls, r.usage.as_ref())
                        .or_else(|| empty_reply(request.tools, calls, r.text.as_deref()))
                    {
                        Some(why) => self.fall_back(&why),
                        None => return Ok(r),
                    }
                }
                other => return other,
            }
        }
        self.prompted.complete(request).await
    }

    /// One streamed call, native through `native` until the fallback.
    async fn stream_with(
        &self,
        native: &dyn Model,
        request: &ModelRequest<'_>,
    ) -> Result<EventStream, ModelError> {
        if !self.is_prompted() {
            match native.stream(request).await {
                Err(ModelError::ToolsUnsupported(why)) => self.fall_back(&why),
                Err(e) => return Err(e),
                Ok(mut stream) => match stream.next().await {
                    Some(Err(ModelError::ToolsUnsupported(why))) => self.fall_back(&why),
                    Some(first) => {
                        let rest = Box::pin(futures::stream::iter([first]).chain(stream));
                        if request.tools.is_empty() {
                            return Ok(rest);
                        }
                        return Ok(checked_stream(
                            self.fell_back.clone(),
                            self.native.name().to_string(),
                            self.prompted.dialect(),
                            request.tools.to_vec(),
                            rest,
                        ));
                    }
                    None => return Ok(Box::pin(futures::stream::empty())),
                },
            }
        }
        self.prompted.stream(request).await
    }
}

#[async_trait]
impl Model for Auto {
    fn name(&self) -> &str {
        self.native.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.complete_with(&*self.native, request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        self.stream_with(&*self.native, request).await
    }

    /// Native calls go through a session of the wrapped model (prompted ones rewrite the
    /// conversation, so they go to the model itself).
    fn session(&self) -> Box<dyn Model + '_> {
        Box::new(AutoSession {
            auto: self,
            native: self.native.session(),
        })
    }
}

/// [`Auto`]'s session: native calls through a session of the wrapped model.
struct AutoSession<'a> {
    auto: &'a Auto,
    native: Box<dyn Model + 'a>,
}

#[async_trait]
impl Model for AutoSession<'_> {
    fn name(&self) -> &str {
        self.auto.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.auto.complete_with(&*self.native, request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        self.auto.stream_with(&*self.native, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::model::{ModelSettings, ToolSpec};
    use crate::stream::StreamEvent;
    use serde_json::json;
    use std::sync::Mutex;

    /// Refuses any request with tools (as an opening error, or as the stream's first event),
    /// answers the others with a `<PTK_CALL>` reply; records how many tools each request had.
    struct Server {
        in_stream: bool,
        seen: Mutex<Vec<usize>>,
    }

    impl Server {
        fn check(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
            self.seen.lock().unwrap().push(request.tools.len());
            if request.tools.is_empty() {
                Ok(ModelResponse::text(
                    "<PTK_CALL>{\"tool\": \"f\", \"args\": {}}</PTK_CALL>",
                ))
            } else {
                Err(ModelError::ToolsUnsupported(
                    "model does not support tools".into(),
                ))
            }
        }
    }

    #[async_trait]
    impl Model for Server {
        fn name(&self) -> &str {
            "server"
        }

        async fn complete(&self, r: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
            self.check(r)
        }

        async fn stream(&self, r: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
            let events: Vec<Result<StreamEvent, ModelError>> = match self.check(r) {
                Ok(response) => response.into_events().into_iter().map(Ok).collect(),
                Err(e) if self.in_stream => vec![Err(e)],
                Err(e) => return Err(e),
            };
            Ok(Box::pin(futures::stream::iter(events)))
        }
    }

    #[tokio::test]
    async fn falls_back_once_and_stays_prompted() {
        let tools = [ToolSpec {
            name: "f".into(),
            description: "F".into(),
            parameters: json!({"type": "object"}),
        }];
        let messages = [Message::user("go")];
        let settings = ModelSettings::default();
        let request = ModelRequest {
            messages: (&messages).into(),
            reminders: &[],
            tools: &tools,
            settings: &settings,
        };
        for (streamed, in_stream) in [(false, false), (true, false), (true, true)] {
            let server = Arc::new(Server {
                in_stream,
                seen: Mutex::new(Vec::new()),
            });
            let auto = Auto::new(server.clone(), Dialect::Ptk);
            for _ in 0..2 {
                let response = if streamed {
                    ModelResponse::from_stream(auto.stream(&request).await.unwrap())
                        .await
                        .unwrap()
                } else {
                    auto.complete(&request).await.unwrap()
                };
                assert_eq!(response.tool_calls.len(), 1);
                assert_eq!(response.tool_calls[0].name, "f");
                assert!(auto.is_prompted());
            }
            // One refused native request, then prompt-based requests only.
            assert_eq!(*server.seen.lock().unwrap(), [1, 0, 0]);
        }
        // Other errors pass through, and do not switch.
        struct Down;
        #[async_trait]
        impl Model for Down {
            fn name(&self) -> &str {
                "down"
            }
            async fn complete(&self, _: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
                Err(ModelError::Other("down".into()))
            }
        }
        let auto = Auto::new(Arc::new(Down), Dialect::Ptk);
        assert!(matches!(
            auto.complete(&request).await,
            Err(ModelError::Other(_))
        ));
        assert!(!auto.is_prompted());
    }
}
