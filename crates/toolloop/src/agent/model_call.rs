//! One model call as a run makes it: complete or streamed (restarted when the stream breaks),
//! its text redacted before anything else sees it.

use super::{Agent, EventHandler};
use crate::event::Event;
use crate::model::{Model, ModelError, ModelRequest, ModelResponse};
use crate::redact::StreamRedactor;
use crate::stream::{Accumulator, StreamEvent};
use futures::StreamExt;

impl Agent {
    pub(super) async fn call_model(
        &self,
        model: &dyn Model,
        request: ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        // One layer of future around the model's own (each layer is a cold cache line to poll
        // when the response comes). The stream is boxed: a run waiting on a complete reply
        // holds none of a stream's state.
        let mut response = if self.parts.config.stream {
            Box::pin(self.stream_with_restarts(model, &request, round, sink)).await?
        } else {
            model.complete(&request).await?
        };
        if let Some(r) = &self.parts.redactor
            && let Some(text) = &mut response.text
        {
            *text = r.redact(text);
        }
        Ok(response)
    }

    /// A streamed call, asked again when its stream breaks (up to `stream_restarts` times).
    async fn stream_with_restarts(
        &self,
        model: &dyn Model,
        request: &ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        let mut attempt = 1;
        loop {
            match self.stream_once(model, request, round, sink).await {
                Err(ModelError::StreamInterrupted(reason))
                    if attempt <= self.parts.config.stream_restarts =>
                {
                    attempt += 1;
                    tracing::info!(round, attempt, %reason, "the model's stream broke; asking again");
                    if let Some(sink) = sink {
                        sink(&Event::ModelRetry {
                            round,
                            attempt,
                            reason,
                        });
                    }
                }
                other => return other,
            }
        }
    }

    async fn stream_once(
        &self,
        model: &dyn Model,
        request: &ModelRequest<'_>,
        round: u32,
        sink: Option<&EventHandler>,
    ) -> Result<ModelResponse, ModelError> {
        let mut stream = model.stream(request).await?;
        let mut acc = Accumulator::new();
        // Text deltas go out as events only when someone listens (the response's text is
        // redacted whole, by `call_model`).
        let mut held = sink.and(self.parts.redactor.as_deref().map(StreamRedactor::new));
        let emit = |text: String| {
            if let Some(sink) = sink
                && !text.is_empty()
            {
                sink(&Event::TextDelta { round, text });
            }
        };
        while let Some(event) = stream.next().await {
            let event = event?;
            if sink.is_some()
                && let StreamEvent::TextDelta(text) = &event
            {
                match &mut held {
                    Some(held) => emit(held.push(text)),
                    None => emit(text.clone()),
                }
            }
            acc.push(event);
        }
        if let Some(held) = held {
            emit(held.finish());
        }
        Ok(acc.finish())
    }
}
