//! Error bodies and error events.

use crate::context::ContextOverflow;
use crate::context::overflow::{contains_ignore_case, number_after};
use crate::model::ApiError;
use crate::providers::adapter::snippet;
use crate::providers::adapter::{ErrorMeaning, tools_always_supported};
use crate::transport::wire::retryable_status;
use http::header::HeaderMap;
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
    let mut err = ApiError {
        status,
        error_type,
        code: None,
        message,
        retryable,
        retry_after: None,
    };
    if context_overflow(&err).is_some() {
        err.retryable = false;
    }
    err
}

/// Whether an error says the request does not fit the model's context window, with the counts
/// its message gives. Anthropic answers 400 `invalid_request_error` with "prompt is too long: N
/// tokens > M maximum", or, when the input fits but the input and `max_tokens` together do
/// not, "input length and `max_tokens` exceed context limit: N + O > M, decrease input length
/// or `max_tokens` and try again" (sources in the tests).
pub(crate) fn context_overflow(err: &ApiError) -> Option<ContextOverflow> {
    let m = err.message.as_str();
    let mut o = ContextOverflow::new(err.status, err.error_type.clone(), m);
    if contains_ignore_case(m, "prompt is too long") {
        o.input_tokens = number_after(m, "prompt is too long:");
        o.limit = number_after(m, "tokens >");
    } else if contains_ignore_case(m, "exceed context limit") {
        o.input_tokens = number_after(m, "exceed context limit:");
        o.output_tokens = o
            .input_tokens
            .and_then(|n| number_after(m, &format!("{n} +")));
        o.limit = number_after(m, "> ");
    } else {
        return None;
    }
    Some(o)
}

/// What this API's errors mean for the run: a refusal for the context's size (with its counts,
/// [`context_overflow`]).
pub(crate) const ERRORS: ErrorMeaning = ErrorMeaning {
    context_overflow,
    tools_unsupported: tools_always_supported,
};

pub(super) fn stream_error(v: &Value) -> ApiError {
    let error = &v["error"];
    let error_type = error["type"].as_str().map(str::to_string);
    let mut err = ApiError {
        status: 200,
        retryable: error_type.as_deref().is_some_and(retryable_type),
        error_type,
        code: None,
        message: error["message"]
            .as_str()
            .unwrap_or("error event in the stream with no message")
            .to_string(),
        retry_after: None,
    };
    if context_overflow(&err).is_some() {
        err.retryable = false;
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelError;

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

    #[test]
    fn context_overflow_is_typed_with_its_counts() {
        let h = HeaderMap::new();
        // anthropics/claude-code#12186.
        let e = parse_error(
            400,
            &h,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"},"request_id":"req_011CVQe1dLrGNMJyE1ghG1av"}"#,
        );
        assert!(!e.retryable);
        let ModelError::ContextOverflow(o) = ERRORS.classify(ModelError::Api(e)) else {
            panic!("not an overflow");
        };
        assert_eq!(
            (o.status, o.input_tokens, o.output_tokens, o.limit),
            (400, Some(208_310), None, Some(200_000))
        );
        assert_eq!(o.code.as_deref(), Some("invalid_request_error"));
        // Input and `max_tokens` together over the window (continuedev/continue#6080).
        let e = parse_error(
            400,
            &h,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, decrease input length or `max_tokens` and try again"}}"#,
        );
        let ModelError::ContextOverflow(o) = ERRORS.classify(ModelError::Api(e)) else {
            panic!("not an overflow");
        };
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(199_759), Some(8192), Some(200_000))
        );
        // In a stream's error event.
        let e = stream_error(&serde_json::json!({"type": "error", "error": {
            "type": "invalid_request_error", "message": "prompt is too long: 12 tokens > 10 maximum"}}));
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
            ModelError::ContextOverflow(o) if o.status == 200 && o.limit == Some(10)
        ));
        // An output limit alone is not an overflow (ChatGPTNextWeb/NextChat#4964).
        let e = parse_error(
            400,
            &h,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for claude-3-5-sonnet-20240620"}}"#,
        );
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
            ModelError::Api(_)
        ));
    }
}
