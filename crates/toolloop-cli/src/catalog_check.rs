//! `--tool-protocol native` with an OpenAI-compatible server (`openai:` with a base URL other
//! than OpenAI's own): a server that drops the tool catalog without a word (a proxy that strips
//! `tools`, llama-cpp-python's `chatml-function-calling` without a `tool_choice`) is told by its
//! usage, as `auto` tells it ([`toolloop::ptk::dropped_tools`]: a reply with no tool call
//! and fewer prompt tokens than the catalog alone takes). Native calling does not switch: the
//! run goes on as asked, and a warning says, once, that the model did not see the tools and
//! which protocol would let it.

use async_trait::async_trait;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use toolloop::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse};
use toolloop::stream::StreamEvent;
use toolloop::usage::Usage;

/// `inner`, with its replies checked for a dropped catalog.
pub(crate) struct CatalogCheck {
    inner: Arc<dyn Model>,
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

/// Says, the first time, that the server dropped the catalog (`why`).
fn warn(warned: &AtomicBool, model: &str, why: &str) {
    if !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            model,
            "the server ignored the tools ({why}): the model did not see them; \
             --tool-protocol auto or prompt would show them to it"
        );
    }
}

/// Checks one complete reply.
fn check_reply(warned: &AtomicBool, model: &str, request: &ModelRequest<'_>, r: &ModelResponse) {
    if let Some(why) =
        toolloop::ptk::dropped_tools(request.tools, r.tool_calls.len(), r.usage.as_ref())
    {
        warn(warned, model, &why);
    }
}

/// `stream` as it is, checked when it ends (its usage may come after its finish).
fn check_stream(
    warned: Arc<AtomicBool>,
    model: String,
    tools: Vec<toolloop::model::ToolSpec>,
    stream: EventStream,
) -> EventStream {
    /// The tool calls and the usage seen so far.
    type Seen = Arc<std::sync::Mutex<(usize, Option<Usage>)>>;
    let seen: Seen = Arc::default();
    let counted = seen.clone();
    let events = stream.map(move |event| {
        if let Ok(mut seen) = counted.lock() {
            match &event {
                Ok(StreamEvent::ToolCallStart { .. }) => seen.0 += 1,
                Ok(StreamEvent::Usage(u)) => seen.1 = Some(*u),
                _ => {}
            }
        }
        event
    });
    let end = futures::stream::once(async move {
        if let Ok(seen) = seen.lock()
            && let Some(why) = toolloop::ptk::dropped_tools(&tools, seen.0, seen.1.as_ref())
        {
            warn(&warned, &model, &why);
        }
        None
    })
    .filter_map(|nothing: Option<Result<StreamEvent, ModelError>>| async move { nothing });
    Box::pin(events.chain(end))
}

async fn complete(
    model: &dyn Model,
    warned: &AtomicBool,
    request: &ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    let r = model.complete(request).await?;
    check_reply(warned, model.name(), request, &r);
    Ok(r)
}

async fn stream(
    model: &dyn Model,
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
impl Model for CatalogCheck {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        complete(&*self.inner, &self.warned, request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        stream(&*self.inner, &self.warned, request).await
    }

    fn session(&self) -> Box<dyn Model + '_> {
        Box::new(Session {
            inner: self.inner.session(),
            warned: self.warned.clone(),
        })
    }
}

/// [`CatalogCheck`]'s session: the calls go through a session of the wrapped model.
struct Session<'a> {
    inner: Box<dyn Model + 'a>,
    warned: Arc<AtomicBool>,
}

#[async_trait]
impl Model for Session<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        complete(&*self.inner, &self.warned, request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        stream(&*self.inner, &self.warned, request).await
    }
}
