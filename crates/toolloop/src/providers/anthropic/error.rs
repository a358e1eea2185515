//! Error bodies and error events.

use crate::model::ApiError;
use crate::transport::http::retryable_status;
use crate::transport::wire::snippet;
use reqwest::header::HeaderMap;
use serde_json::Value;

pub(super) fn error_type_for_status(status: u16) -> Option<&'static str> {
    Some(match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        500 => "api_error",
        529 => "overloaded_error",
        _ => return None,
    })
}

pub(super) fn retryable_type(t: &str) -> bool {
    matches!(t, "overloaded_error" | "rate_limit_error" | "api_error")
}

/// Turns an Anthropic error response (`{"type":"error","error":{"type","message"}}`) into an
/// [`ApiError`]. 429, 500, 503 and 529 (and the overloaded, rate-limit and API error types) are
/// retryable; the transport adds the `retry-after` wait.
pub fn parse_error(status: u16, _headers: &HeaderMap, body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let error_type = error
        .and_then(|e| e["type"].as_str())
        .map(str::to_string)
        .or_else(|| error_type_for_status(status).map(str::to_string));
    let message = match error.and_then(|e| e["message"].as_str()) {
        Some(m) => m.to_string(),
        None if body.is_empty() => format!("HTTP {status} with an empty body"),
        None => format!("HTTP {status}: {}", snippet(body, 500)),
    };
    let retryable = retryable_status(status) || error_type.as_deref().is_some_and(retryable_type);
    ApiError {
        status,
        error_type,
        code: None,
        message,
        retryable,
        retry_after: None,
    }
}

pub(super) fn stream_error(v: &Value) -> ApiError {
    let error = &v["error"];
    let error_type = error["type"].as_str().map(str::to_string);
    ApiError {
        status: 200,
        retryable: error_type.as_deref().is_some_and(retryable_type),
        error_type,
        code: None,
        message: error["message"]
            .as_str()
            .unwrap_or("error event in the stream with no message")
            .to_string(),
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_typed() {
        let h = HeaderMap::new();
        let e = parse_error(
            529,
            &h,
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert_eq!(
            (e.error_type.as_deref(), e.retryable),
            (Some("overloaded_error"), true)
        );
        let e = parse_error(401, &h, b"");
        assert_eq!(
            (e.error_type.as_deref(), e.retryable),
            (Some("authentication_error"), false)
        );
        let e = parse_error(413, &h, b"<html>too big</html>");
        assert_eq!(e.error_type.as_deref(), Some("request_too_large"));
        assert!(e.message.contains("too big"));
        for s in [429, 500, 503] {
            assert!(parse_error(s, &h, b"{}").retryable, "{s}");
        }
        for s in [400, 403, 404] {
            assert!(!parse_error(s, &h, b"{}").retryable, "{s}");
        }
    }
}
