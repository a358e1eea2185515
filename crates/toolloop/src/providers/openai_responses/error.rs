//! Error bodies, failed responses and error events.
//!
//! The Responses API reports HTTP errors in the same `{"error": {message, type, param, code}}`
//! shape as Chat Completions, so the body is read by the Chat Completions adapter's
//! [`parse_error`](crate::providers::openai::parse_error) (the same classification, `Retry-After`
//! and "tools unsupported" detection).

use crate::context::ContextOverflow;
use crate::context::overflow::contains_ignore_case;
use crate::model::ApiError;
use crate::providers::adapter::ErrorMeaning;
use crate::providers::openai::api_error_from_value;
use serde_json::Value;

pub use crate::providers::openai::parse_error;

/// Whether an error says the request does not fit the model's context window. The Responses
/// API says it with code `context_length_exceeded` and "Your input exceeds the context window
/// of this model. Please adjust your input and try again." (`param` `input`, no counts), in an
/// HTTP 400 body, in a stream's `error` event, or in a `failed` response's `error` (sources in
/// the tests). A server that speaks this API with Chat Completions' sentences is understood too.
pub(super) fn context_overflow(err: &ApiError) -> Option<ContextOverflow> {
    if contains_ignore_case(&err.message, "exceeds the context window") {
        let code = err.code.clone().or_else(|| err.error_type.clone());
        return Some(ContextOverflow::new(err.status, code, err.message.clone()));
    }
    crate::providers::openai::context_overflow(err)
}

/// What this API's errors mean for the run: a refusal for the context's size (with its counts,
/// [`context_overflow`]), and a refusal of tools.
pub(crate) const ERRORS: ErrorMeaning = ErrorMeaning {
    context_overflow,
    tools_unsupported: crate::providers::openai::tools_unsupported,
};

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
    err.retryable = (said(err.code.as_deref()) || said(err.error_type.as_deref()))
        && context_overflow(&err).is_none();
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelError;
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

    #[test]
    fn context_overflow_in_each_place_the_api_reports_it() {
        use http::header::HeaderMap;
        const MESSAGE: &str = "Your input exceeds the context window of this model. Please adjust your input and try again.";
        let typed = |e: ApiError| match ERRORS.classify(ModelError::Api(e)) {
            ModelError::ContextOverflow(o) => o,
            other => panic!("not an overflow: {other:?}"),
        };
        // An HTTP error body (james-6-23/codex2api#415 gives the code, type and message).
        let body = json!({"error": {"message": MESSAGE, "type": "invalid_request_error",
            "param": "input", "code": "context_length_exceeded"}});
        let e = parse_error(400, &HeaderMap::new(), body.to_string().as_bytes());
        assert!(!e.retryable);
        let o = typed(e);
        assert_eq!(
            (o.status, o.code.as_deref()),
            (400, Some("context_length_exceeded"))
        );
        assert_eq!((o.input_tokens, o.limit), (None, None));
        // A stream's `error` event (dyad-sh/dyad#1672).
        let e = event_error(
            200,
            &json!({"type": "error", "sequence_number": 2, "error": {"type": "invalid_request_error",
                "code": "context_length_exceeded", "message": MESSAGE, "param": "input"}}),
        );
        assert!(!e.retryable);
        assert_eq!(typed(e).message, MESSAGE);
        // A `failed` response's error (`{"code", "message"}`), and the event's flat form
        // (the-open-agent/openagent#2344).
        let e = event_error(
            200,
            &json!({"code": "context_length_exceeded", "message": MESSAGE}),
        );
        assert_eq!(typed(e).code.as_deref(), Some("context_length_exceeded"));
        let e = event_error(
            200,
            &json!({"type": "invalid_request_error", "code": "context_length_exceeded",
                "message": MESSAGE, "param": "input"}),
        );
        assert_eq!(typed(e).status, 200);
        // A server that speaks this API with Chat Completions' sentence.
        let e = event_error(
            200,
            &json!({"code": "invalid_request_error", "message": "This model's maximum context length is 8192 tokens. However, your request has 9000 input tokens."}),
        );
        let o = typed(e);
        assert_eq!((o.input_tokens, o.limit), (Some(9000), Some(8192)));
        // Anything else is not.
        let e = event_error(
            200,
            &json!({"code": "invalid_prompt", "message": "Invalid prompt"}),
        );
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
            ModelError::Api(_)
        ));
    }
}
