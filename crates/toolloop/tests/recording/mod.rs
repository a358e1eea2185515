//! A model that records what it is sent: each request, through a function that keeps what a
//! test checks, then passed on to the model it wraps, complete or streamed.
#![allow(dead_code)]

use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use toolloop::model::{EventStream, Model, ModelError, ModelRequest, ModelResponse};

/// What a [`Recording`] keeps of one request.
type Take<T> = Box<dyn Fn(&ModelRequest<'_>) -> T + Send + Sync>;

/// Wraps a model and records what each request held (as `take` reads it).
pub(crate) struct Recording<T> {
    inner: Arc<dyn Model>,
    take: Take<T>,
    seen: Arc<Mutex<Vec<T>>>,
}

impl<T: Send + 'static> Recording<T> {
    /// Records `take(request)` for every request `inner` is sent.
    pub(crate) fn new(
        inner: Arc<dyn Model>,
        take: impl Fn(&ModelRequest<'_>) -> T + Send + Sync + 'static,
    ) -> Self {
        Recording {
            inner,
            take: Box::new(take),
            seen: Arc::default(),
        }
    }

    /// What was recorded, shared: it fills as the model is called.
    pub(crate) fn seen(&self) -> Arc<Mutex<Vec<T>>> {
        self.seen.clone()
    }

    fn record(&self, request: &ModelRequest<'_>) {
        let kept = (self.take)(request);
        self.seen.lock().unwrap().push(kept);
    }
}

#[async_trait]
impl<T: Send + 'static> Model for Recording<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.record(request);
        self.inner.complete(request).await
    }

    async fn stream(&self, request: &ModelRequest<'_>) -> Result<EventStream, ModelError> {
        self.record(request);
        self.inner.stream(request).await
    }
}
