//! Error bodies, with the retry delay Gemini gives in them.

use crate::context::ContextOverflow;
use crate::context::overflow::{contains_ignore_case, number_after};
use crate::model::ApiError;
use crate::providers::adapter::snippet;
use crate::providers::adapter::{ErrorMeaning, tools_always_supported};
use crate::transport::wire::retryable_status;
use http::header::HeaderMap;
use serde_json::Value;
use std::time::Duration;

/// Parses a `google.protobuf.Duration` as JSON gives it: `"12s"`, `"0.5s"`, or
/// `{"seconds": 12, "nanos": 0}`.
pub fn parse_duration(v: &Value) -> Option<Duration> {
    match v {
        Value::String(s) => s
            .trim()
            .strip_suffix('s')
            .and_then(|n| n.trim().parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)
            .map(Duration::from_secs_f64),
        Value::Object(m) => {
            let secs = m.get("seconds").and_then(|s| {
                s.as_u64()
                    .or_else(|| s.as_str().and_then(|t| t.parse().ok()))
            })?;
            let nanos = m.get("nanos").and_then(Value::as_u64).unwrap_or(0);
            Some(Duration::from_secs(secs) + Duration::from_nanos(nanos.min(999_999_999)))
        }
        _ => None,
    }
}

pub(super) fn api_error(status: u16, error: &Value) -> ApiError {
    let retry_after = error["details"].as_array().and_then(|details| {
        details
            .iter()
            .filter(|d| {
                d["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
            })
            .find_map(|d| parse_duration(&d["retryDelay"]))
    });
    let code = match &error["code"] {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    };
    let code_status = error["code"].as_u64().and_then(|c| u16::try_from(c).ok());
    let message = error["message"]
        .as_str()
        .unwrap_or("the error body has no message")
        .to_string();
    let overflow = overflow_counts(&message).is_some();
    ApiError {
        status,
        error_type: error["status"].as_str().map(str::to_string),
        code,
        message,
        retryable: !overflow
            && (retryable_status(status) || code_status.is_some_and(retryable_status)),
        retry_after,
    }
}

/// When `message` is Gemini's refusal of a request too large for the window ("The input token
/// count (N) exceeds the maximum number of tokens allowed (M).", status `INVALID_ARGUMENT`,
/// HTTP 400), the counts it gives: the input tokens and the window.
pub(crate) fn overflow_counts(message: &str) -> Option<(Option<u64>, Option<u64>)> {
    let said = contains_ignore_case(message, "input token count")
        && contains_ignore_case(message, "exceeds the maximum number of tokens");
    said.then(|| {
        (
            number_after(message, "input token count"),
            number_after(message, "tokens allowed"),
        )
    })
}

/// The [`ContextOverflow`] an error reports, if it is one.
pub(crate) fn context_overflow(err: &ApiError) -> Option<ContextOverflow> {
    let (input_tokens, limit) = overflow_counts(&err.message)?;
    let mut o = ContextOverflow::new(
        err.status,
        err.error_type.clone().or_else(|| err.code.clone()),
        err.message.clone(),
    );
    (o.input_tokens, o.limit) = (input_tokens, limit);
    Some(o)
}

/// What this API's errors mean for the run: a refusal for the context's size (with its counts,
/// [`context_overflow`]).
pub(crate) const ERRORS: ErrorMeaning = ErrorMeaning {
    context_overflow,
    tools_unsupported: tools_always_supported,
};

/// Turns a Gemini error response (`{"error": {code, message, status, details}}`, or a one-element
/// array of it) into an [`ApiError`]: `error_type` is the status name (`RESOURCE_EXHAUSTED`),
/// `code` the numeric code, and a `RetryInfo` detail's `retryDelay` the `retry_after`.
pub fn parse_error(status: u16, _headers: &HeaderMap, body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| match v {
        Value::Array(items) => items.iter().find_map(|i| i.get("error")),
        other => other.get("error"),
    });
    match error.filter(|e| e.is_object()) {
        Some(e) => api_error(status, e),
        None => ApiError {
            status,
            error_type: None,
            code: None,
            message: if body.is_empty() {
                format!("HTTP {status} with an empty body")
            } else {
                format!("HTTP {status}: {}", snippet(body, 500))
            },
            retryable: retryable_status(status),
            retry_after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelError;
    use serde_json::json;

    #[test]
    fn errors_with_retry_info() {
        let body = br#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12s"}]}}"#;
        let e = parse_error(429, &HeaderMap::new(), body);
        assert_eq!(e.error_type.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(e.code.as_deref(), Some("429"));
        assert_eq!(e.retry_after, Some(Duration::from_secs(12)));
        assert!(e.retryable);
        let e = parse_error(
            400,
            &HeaderMap::new(),
            br#"[{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}]"#,
        );
        assert_eq!((e.message.as_str(), e.retryable), ("bad", false));
        assert_eq!(
            parse_duration(&json!("0.25s")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration(&json!({"seconds": 2, "nanos": 500000000})),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(parse_duration(&json!("soon")), None);
    }

    #[test]
    fn context_overflow_is_typed_with_its_counts() {
        // google-gemini/gemini-cli#6678 (the body with `errors`) and #4118 (without).
        for body in [
            r#"[{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","errors":[{"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","domain":"global","reason":"badRequest"}],"status":"INVALID_ARGUMENT"}}]"#,
            r#"{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
        ] {
            let e = parse_error(400, &HeaderMap::new(), body.as_bytes());
            assert!(!e.retryable);
            let ModelError::ContextOverflow(o) = ERRORS.classify(ModelError::Api(e)) else {
                panic!("not an overflow: {body}");
            };
            assert_eq!(
                (o.status, o.input_tokens, o.limit),
                (400, Some(1_200_293), Some(1_048_576))
            );
            assert_eq!(o.code.as_deref(), Some("INVALID_ARGUMENT"));
        }
        // Other invalid arguments stay API errors.
        let e = parse_error(
            400,
            &HeaderMap::new(),
            br#"{"error":{"code":400,"message":"Invalid value at 'generation_config.max_output_tokens'","status":"INVALID_ARGUMENT"}}"#,
        );
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
            ModelError::Api(_)
        ));
    }
}
