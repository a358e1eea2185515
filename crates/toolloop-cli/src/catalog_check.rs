//! `--tool-protocol native` with an OpenAI-compatible server (`openai:` with a base URL other
//! than OpenAI's own): a server that drops the tool catalog without a word (a proxy that strips
//! `tools`, llama-cpp-python's `chatml-function-calling` without a `tool_choice`) is told by its
//! usage, as `auto` tells it ([`toolloop::ptk::dropped_tools`]: a reply with no tool call
//! and fewer prompt tokens than the catalog alone takes), and so is one whose reply says nothing
//! at all ([`toolloop::ptk::empty_reply`]: llama-cpp-python's `chatml-function-calling` under
//! `tool_choice: "auto"`). Native calling does not switch: the run goes on as asked, and a
//! warning says, once, what the reply showed and which protocol would do better.

use async_trait::async_trait;
use futures::StreamExt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use toolloop::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse};
use toolloop::stream::StreamEvent;
use toolloop::usage::Usage;

/// `inner`, with its replies checked for a dropped catalog: the model itself, or one of its
/// sessions (a `Box<dyn Model>`, see [`Model::session`]), which shares the model's one warning.
pub(crate) struct CatalogCheck<M = Arc<dyn Model>> {
    inner: M,
    warned: Arc<AtomicBool>,
}

impl CatalogCheck {
    pub(crate) fn new(inner: Arc<dyn Model>) -> Self {
        CatalogCheck {
            inner,
            warned: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// What a reply to a request with tools shows of native calling on this server, if anything.
enum Sign {
    /// The catalog was dropped (why).
    Dropped(String),
    /// The reply said nothing at all (why).
    Empty(String),
}

fn sign(
    tools: &[toolloop::model::ToolSpec],
    calls: usize,
    usage: Option<&Usage>,
    text: Option<&str>,
) -> Option<Sign> {
    toolloop::ptk::dropped_tools(tools, calls, usage)
        .map(Sign::Dropped)
        .or_else(|| toolloop::ptk::empty_reply(tools, calls, text).map(Sign::Empty))
}

/// Says, the first time, what the server's reply showed.
fn warn(warned: &AtomicBool, model: &str, sign: Sign) {
    if warned.swap(true, Ordering::Relaxed) {
        return;
    }
    match sign {
        Sign::Dropped(why) => tracing::warn!(
            model,
            "the server ignored the tools ({why}): the model did not see them; \
             --tool-protocol auto or prompt would show them to it"
        ),
        Sign::Empty(why) => tracing::warn!(
            model,
            "native tool calling does not seem to work on this server ({why}, as \
             llama-cpp-python's chatml-function-calling does); --tool-protocol auto or prompt \
             would go on with prompt-based calling"
        ),
    }
}

/// Checks one complete reply.
fn check_reply(warned: &AtomicBool, model: &str, request: &ModelRequest<'_>, r: &ModelResponse) {
    let calls = r.tool_calls.len();
    if let Some(s) = sign(request.tools, calls, r.usage.as_ref(), r.text.as_deref()) {
        warn(warned, model, s);
    }
}

/// `stream` as it is, checked when it ends (its usage may come after its finish).
fn check_stream(
    warned: Arc<AtomicBool>,
    model: String,
    tools: Vec<toolloop::model::ToolSpec>,
    stream: EventStream,
) -> EventStream {
    /// The tool calls, the usage and whether text came, so far.
    type Seen = Arc<std::sync::Mutex<(usize, Option<Usage>, bool)>>;
    let seen: Seen = Arc::default();
    let counted = seen.clone();
    let events = stream.map(move |event| {
        if let Ok(mut seen) = counted.lock() {
            match &event {
                Ok(StreamEvent::ToolCallStart { .. }) => seen.0 += 1,
                Ok(StreamEvent::Usage(u)) => seen.1 = Some(*u),
                Ok(StreamEvent::TextDelta(t)) if !t.trim().is_empty() => seen.2 = true,
                _ => {}
            }
        }
        event
    });
    let end = futures::stream::once(async move {
        if let Ok(seen) = seen.lock()
            && let Some(s) = sign(&tools, seen.0, seen.1.as_ref(), seen.2.then_some("text"))
        {
            warn(&warned, &model, s);
        }
        None
    })
    .filter_map(|nothing: Option<Result<StreamEvent, ModelError>>| async move { nothing });
    Box::pin(events.chain(end))
}

async fn complete<T: Model + ?Sized>(
    model: &T,
    warned: &AtomicBool,
    request: &ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    let r = model.complete(request).await?;
    check_reply(warned, model.name(), request, &r);
    Ok(r)
}

async fn stream<T: Model + ?Sized>(
    model: &T,
    warned: &Arc<AtomicBool>,
    request: &ModelRequest<'_>,
) -> Result<EventStream, ModelError> {
    let events = model.stream(request).await?;
    if request.tools.is_empty() || warned.load(Ordering::Relaxed) {
        return Ok(events);
    }
    Ok(check_stream(
        warned.clone(),
        model.name().to_string(),
        request.tools.to_vec(),
        events,
    ))
}

#[async_trait]
impl<M> Model for CatalogCheck<M>
where
    M: Deref + Send + Sync,
    M::Target: Model,
{
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        complete(&*self.inner, &self.warned, request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        stream(&*self.inner, &self.warned, request).await
    }

    /// The calls go through a session of the wrapped model, checked the same way.
    fn session(&self) -> Box<dyn Model + '_> {
        Box::new(CatalogCheck {
            inner: self.inner.session(),
            warned: self.warned.clone(),
        })
    }
}
