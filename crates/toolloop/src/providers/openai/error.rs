//! Error bodies and error chunks, and the errors that mean tools are unsupported.

use super::response::as_count;
use crate::model::{ApiError, ModelError};
use crate::transport::http::{retry_after, retryable_status};
use crate::transport::wire;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// Reads an error body (the [`crate::transport::http::ErrorParser`] of this adapter). Understands
/// OpenAI's `{"error": {message, type, code}}`, a numeric `code` (OpenRouter, llama.cpp), a plain
/// string `error` (Ollama), vLLM's top-level `{"object": "error", message, type, code}`, FastAPI's
/// `detail`, a one-element array (Gemini), and a body that is not JSON at all.
pub fn parse_error(status: u16, headers: &HeaderMap, body: &[u8]) -> ApiError {
    let mut err = match serde_json::from_slice::<Value>(body) {
        Ok(v) => api_error_from_value(status, &v, Some(status)),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            ApiError {
                status,
                error_type: None,
                code: None,
                message: if text.is_empty() {
                    format!("HTTP {status} with an empty body")
                } else {
                    preview(text)
                },
                retryable: retryable_status(status),
                retry_after: None,
            }
        }
    };
    if err.retry_after.is_none() {
        err.retry_after = retry_after(headers);
    }
    if tools_unsupported(&err) {
        err.retryable = false;
    }
    err
}

/// An [`ApiError`] from an error body or an error chunk. `http_status` is the status the
/// retryability is judged by; for an in-stream error it is the status the error object carries.
pub(crate) fn api_error_from_value(status: u16, v: &Value, http_status: Option<u16>) -> ApiError {
    let v = match v {
        Value::Array(items) => items.first().unwrap_or(v),
        other => other,
    };
    let text = |x: Option<&Value>| -> Option<String> {
        match x? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let (obj, message) = match v.get("error") {
        Some(e @ Value::Object(_)) => (e, text(e.get("message"))),
        Some(Value::String(s)) => (v, Some(s.clone())),
        _ => (v, text(v.get("message")).or_else(|| text(v.get("detail")))),
    };
    let message = message
        .or_else(|| v.get("detail").map(|d| d.to_string()))
        .unwrap_or_else(|| preview(&v.to_string()));
    let error_type = text(obj.get("type"));
    let code = text(obj.get("code"));
    let judged = http_status.or_else(|| {
        as_count(obj.get("status_code"))
            .or_else(|| as_count(obj.get("code")))
            .and_then(|n| u16::try_from(n).ok())
    });
    let retryable = match judged {
        Some(s) => retryable_status(s),
        None => error_type.as_deref().is_some_and(|t| {
            let t = t.to_ascii_lowercase();
            t.contains("server_error") || t.contains("overloaded") || t.contains("rate_limit")
        }),
    };
    let mut err = ApiError {
        status,
        error_type,
        code,
        message,
        retryable,
        retry_after: None,
    };
    if tools_unsupported(&err) {
        err.retryable = false;
    }
    err
}

/// Whether an error says the server or model does not accept a tool catalog.
pub(super) fn tools_unsupported(err: &ApiError) -> bool {
    if !matches!(err.status, 400 | 404 | 422 | 500) {
        return false;
    }
    let m = err.message.to_ascii_lowercase();
    const PATTERNS: &[&str] = &[
        "does not support tools",
        "doesn't support tools",
        "does not support tool",
        "doesn't support tool",
        "does not support function",
        "doesn't support function",
        "enable-auto-tool-choice",
        "tools param requires --jinja",
        "tool use is not supported",
        "tool calling is not supported",
        "tool calls are not supported",
        "tools are not supported",
        "tools is not supported",
        "function calling is not supported",
        "function calling is not enabled",
        "no endpoints found that support tool use",
    ];
    PATTERNS.iter().any(|p| m.contains(p))
}

/// Turns an API error that says tools are unsupported into [`ModelError::ToolsUnsupported`].
pub(crate) fn classify(e: ModelError) -> ModelError {
    match e {
        ModelError::Api(a) if tools_unsupported(&a) => ModelError::ToolsUnsupported(a.message),
        other => other,
    }
}

/// The start of the error for a 2xx stream that ended without a single event.
pub(super) const EMPTY_STREAM: &str = "the server answered with an empty stream";

/// The error for a 2xx stream that ended without a single event.
pub(super) fn empty_stream() -> ModelError {
    ModelError::Transport {
        message: format!(
            "{EMPTY_STREAM} (HTTP 200 and no event at all): it sent no reply. Some servers do \
             this when they refuse a request while streaming (llama-cpp-python refuses \
             `tool_choice` this way); a call without streaming (--no-stream) shows their error"
        ),
        retryable: false,
    }
}

/// Whether `e` is the error of an empty stream (see [`empty_stream`]).
pub(super) fn is_empty_stream(e: &ModelError) -> bool {
    matches!(e, ModelError::Transport { message, .. } if message.starts_with(EMPTY_STREAM))
}

/// Why `e` reads as the server refusing the request's `tool_choice`, if it does: an empty
/// stream (llama-cpp-python's answer to `"auto"` while streaming), or a 400, 422 or 500 that
/// names the field.
pub(super) fn refuses_tool_choice(e: &ModelError) -> Option<String> {
    if is_empty_stream(e) {
        return Some("an empty stream".into());
    }
    match e {
        ModelError::Api(a) if matches!(a.status, 400 | 422 | 500) => {
            let m = a.message.to_ascii_lowercase();
            (m.contains("tool_choice") || m.contains("tool choice"))
                .then(|| format!("HTTP {}: {}", a.status, preview(&a.message)))
        }
        _ => None,
    }
}

/// Why `e` reads as the server refusing a `json_schema` response format, if it does: a 400,
/// 422 or 500 that names `response_format`, `json_schema` or the formats it takes instead
/// (llama-cpp-python: "Input should be 'text' or 'json_object'").
pub(super) fn refuses_json_schema(e: &ModelError) -> Option<String> {
    match e {
        ModelError::Api(a) if matches!(a.status, 400 | 422 | 500) => {
            let m = a.message.to_ascii_lowercase();
            ["response_format", "json_schema", "json_object"]
                .iter()
                .any(|p| m.contains(p))
                .then(|| format!("HTTP {}: {}", a.status, preview(&a.message)))
        }
        _ => None,
    }
}

/// A short, char-boundary-safe excerpt of external text for error messages.
pub(super) fn preview(text: &str) -> String {
    wire::preview(text, 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies() {
        let h = HeaderMap::new();
        let e = parse_error(
            400,
            &h,
            br#"{"error":{"message":"bad","type":"invalid_request_error","code":"x"}}"#,
        );
        assert_eq!(
            (
                e.error_type.as_deref(),
                e.code.as_deref(),
                e.message.as_str(),
                e.retryable
            ),
            (Some("invalid_request_error"), Some("x"), "bad", false)
        );
        let e = parse_error(429, &h, br#"{"error":{"code":429,"message":"slow"}}"#);
        assert_eq!((e.code.as_deref(), e.retryable), (Some("429"), true));
        let e = parse_error(404, &h, br#"{"error":"model 'x' not found"}"#);
        assert_eq!(e.message, "model 'x' not found");
        let e = parse_error(
            400,
            &h,
            br#"{"object":"error","message":"\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set","type":"BadRequestError","param":null,"code":400}"#,
        );
        assert_eq!(e.error_type.as_deref(), Some("BadRequestError"));
        assert!(tools_unsupported(&e));
        assert!(matches!(
            classify(ModelError::Api(e)),
            ModelError::ToolsUnsupported(m) if m.contains("enable-auto-tool-choice")
        ));
        let e = parse_error(
            400,
            &h,
            br#"{"error":{"message":"registry.ollama.ai/library/gemma:2b does not support tools","type":"api_error","param":null,"code":null}}"#,
        );
        assert!(matches!(
            classify(ModelError::Api(e)),
            ModelError::ToolsUnsupported(_)
        ));
        let e = parse_error(502, &h, b"<html>Bad Gateway</html>");
        assert_eq!(
            (e.message.as_str(), e.retryable),
            ("<html>Bad Gateway</html>", true)
        );
        let e = parse_error(503, &h, b"");
        assert!(e.message.contains("503") && e.retryable);
        let e = parse_error(
            400,
            &h,
            br#"[{"error":{"code":400,"message":"m","status":"INVALID_ARGUMENT"}}]"#,
        );
        assert_eq!(e.message, "m");
        // A plain 400 about something else stays an API error.
        let e = parse_error(400, &h, br#"{"error":{"message":"bad temperature"}}"#);
        assert!(matches!(classify(ModelError::Api(e)), ModelError::Api(_)));
        // Long non-JSON bodies are cut on a char boundary.
        let long = "é".repeat(1000);
        let e = parse_error(500, &h, long.as_bytes());
        assert!(e.message.chars().count() <= 301);
    }
}
