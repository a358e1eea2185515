//! A server that refuses the context management a request asks of it (see
//! [`crate::context::native`]): learned from its answer and remembered for the model's later
//! requests, as the OpenAI adapter learns a refused `tool_choice`.
//!
//! An adapter that sends [`ModelSettings::context`] sends a request as asked; when the server
//! answers with a refusal naming the field ([`refuses_context`]), the adapter remembers it
//! ([`ContextRefusal::learn`], with one warning), sends the request again without the field,
//! and marks the response [`NativeReport::refused`]: the machine then does the stages itself.
//! Later requests to the same model leave the field out from the start
//! ([`ContextRefusal::settings_without`]) and are marked the same way, and
//! [`crate::model::Model::native_context`] declares no support.

use crate::context::NativeReport;
use crate::model::{ModelError, ModelRequest, ModelResponse, ModelSettings};
use crate::stream::StreamEvent;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a model's server refused context management, shared by the model's clones.
#[derive(Debug, Clone, Default)]
pub(crate) struct ContextRefusal(Arc<AtomicBool>);

impl ContextRefusal {
    /// Whether the server refused it.
    pub(crate) fn refused(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The request's settings without its context ask, when it has one and the server refused
    /// it before.
    pub(crate) fn settings_without(&self, request: &ModelRequest<'_>) -> Option<ModelSettings> {
        (request.settings.context.is_some() && self.refused()).then(|| without(request.settings))
    }

    /// When `error` answers a request that asked for context management with a refusal of it:
    /// remembers it (warning once, naming the server and the model) and gives the settings to
    /// send the request again with.
    pub(crate) fn learn(
        &self,
        request: &ModelRequest<'_>,
        error: &ModelError,
        server: &str,
        model: &str,
    ) -> Option<ModelSettings> {
        request.settings.context?;
        let why = refuses_context(error)?;
        if !self.0.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the server at {server} refused context management for model `{model}` ({why}); \
                 sending requests without it from now on, and clearing and compacting the \
                 conversation in the loop instead"
            );
        }
        Some(without(request.settings))
    }
}

fn without(settings: &ModelSettings) -> ModelSettings {
    ModelSettings {
        context: None,
        ..settings.clone()
    }
}

/// The report of a request sent without the context management it asked for.
pub(crate) fn refused_report() -> NativeReport {
    NativeReport {
        refused: true,
        ..NativeReport::default()
    }
}

/// A response to a request sent without the context management it asked for, marked so.
pub(crate) fn mark_refused(mut response: ModelResponse) -> ModelResponse {
    response
        .context_edited
        .get_or_insert_with(NativeReport::default)
        .merge(refused_report());
    response
}

/// The event that opens a stream sent without the context management it asked for.
pub(crate) fn refused_event() -> StreamEvent {
    StreamEvent::ContextEdited(refused_report())
}

/// Why `e` reads as the server refusing context management, if it does: a 400 or 422 whose
/// message (or code) names `context_management`, Anthropic's `context-management-…` beta, or
/// "context management". Anthropic: "context_management: Extra inputs are not permitted", or
/// "Unexpected value(s) `context-management-2025-06-27` for the `anthropic-beta` header";
/// Responses: "Unknown parameter: 'context_management'.".
pub(crate) fn refuses_context(e: &ModelError) -> Option<String> {
    let ModelError::Api(a) = e else {
        return None;
    };
    if !matches!(a.status, 400 | 422) {
        return None;
    }
    let names = |t: &str| {
        let t = t.to_ascii_lowercase();
        [
            "context_management",
            "context-management",
            "context management",
        ]
        .iter()
        .any(|p| t.contains(p))
    };
    (names(&a.message) || a.code.as_deref().is_some_and(names)).then(|| {
        format!(
            "HTTP {}: {}",
            a.status,
            super::plumbing::preview(&a.message, 200)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ApiError;

    fn api(status: u16, message: &str) -> ModelError {
        ModelError::Api(ApiError {
            status,
            error_type: Some("invalid_request_error".into()),
            code: None,
            message: message.into(),
            retryable: false,
            retry_after: None,
        })
    }

    #[test]
    fn a_refusal_names_the_field_or_the_beta() {
        for m in [
            "context_management: Extra inputs are not permitted",
            "Unexpected value(s) `context-management-2025-06-27` for the `anthropic-beta` header.",
            "Unknown parameter: 'context_management'.",
        ] {
            assert!(refuses_context(&api(400, m)).is_some(), "{m}");
        }
        assert!(refuses_context(&api(400, "prompt is too long")).is_none());
        assert!(refuses_context(&api(500, "context_management broke")).is_none());
    }
}
