//! Error bodies, failed responses and error events.
//!
//! The Responses API reports HTTP errors in the same `{"error": {message, type, param, code}}`
//! shape as Chat Completions, so the body is read by the Chat Completions adapter's
//! [`parse_error`](crate::providers::openai::parse_error) (the same classification, `Retry-After`
//! and "tools unsupported" detection).

use crate::model::{ApiError, ModelError};
use crate::providers::openai::api_error_from_value;
use serde_json::Value;

pub use crate::providers::openai::parse_error;

/// Turns an API error that says tools are unsupported into [`ModelError::ToolsUnsupported`].
pub(super) fn classify(e: ModelError) -> ModelError {
    crate::providers::openai::classify(e)
}

/// The error of a stream's `error` event (`{"type": "error", "code", "message", "param"}`, or
/// the same fields under `error`), or of a `failed` response's `error` object
/// (`{"code", "message"}`). Retryable when its code or type says the server failed or was
/// overloaded or rate-limited.
pub(super) fn event_error(status: u16, v: &Value) -> ApiError {
    let v = match v.get("error") {
        Some(e @ Value::Object(_)) => e,
        _ => v,
    };
    let mut err = api_error_from_value(status, v, None);
    if err.error_type.is_none() {
        err.error_type = v
            .get("type")
            .and_then(Value::as_str)
            .filter(|t| *t != "error")
            .map(str::to_string);
    }
    if err.error_type.as_deref() == Some("error") {
        err.error_type = None;
    }
    let said = |s: Option<&str>| {
        s.is_some_and(|s| {
            let s = s.to_ascii_lowercase();
            s.contains("server_error")
                || s.contains("overloaded")
                || s.contains("rate_limit")
                || s.contains("unavailable")
        })
    };
    err.retryable = said(err.code.as_deref()) || said(err.error_type.as_deref());
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_events_are_classified_by_code() {
        let e = event_error(
            200,
            &json!({"type": "error", "code": "server_error", "message": "boom", "param": null}),
        );
        assert_eq!(
            (e.code.as_deref(), e.message.as_str()),
            (Some("server_error"), "boom")
        );
        assert!(e.retryable);
        let e = event_error(
            200,
            &json!({"code": "invalid_prompt", "message": "Invalid prompt"}),
        );
        assert!(!e.retryable);
        assert_eq!(e.code.as_deref(), Some("invalid_prompt"));
        let e = event_error(
            200,
            &json!({"type": "error", "error": {"type": "rate_limit_exceeded", "message": "slow"}}),
        );
        assert!(e.retryable);
        assert_eq!(e.message, "slow");
    }
}
