//! Error bodies and error chunks, and the errors that mean tools are unsupported.

use super::response::as_count;
use crate::context::ContextOverflow;
use crate::context::overflow::{contains_ignore_case, number_after};
use crate::model::{ApiError, ModelError};
use crate::providers::adapter;
use crate::providers::adapter::ErrorMeaning;
use crate::transport::wire::{retry_after, retryable_status};
use http::header::HeaderMap;
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
    if tools_unsupported(&err) || context_overflow(&err).is_some() {
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
    let mut message = message;
    // llama.cpp gives the counts of a context overflow beside its message; keep them in it.
    if let (Some(n), Some(ctx)) = (
        as_count(obj.get("n_prompt_tokens")),
        as_count(obj.get("n_ctx")),
    ) && !message.contains("n_prompt_tokens")
    {
        message = format!("{message} (n_prompt_tokens: {n}, n_ctx: {ctx})");
    }
    let mut err = ApiError {
        status,
        error_type,
        code,
        message,
        retryable,
        retry_after: None,
    };
    if tools_unsupported(&err) || context_overflow(&err).is_some() {
        err.retryable = false;
    }
    err
}

/// Whether an error says the request does not fit the model's context window, with the counts
/// its message gives. The shapes of OpenAI's Chat Completions and of the servers that speak it
/// (each with its source in the tests):
/// - OpenAI: code `context_length_exceeded`, "This model's maximum context length is N tokens.
///   However, your messages resulted in M tokens." or "… you requested M tokens (A in the
///   messages, B in the completion)";
/// - vLLM: the same sentences with type `BadRequestError` and code 400, and the newer "…
///   However, your request has A input tokens plus B 'max_tokens'"; DeepSeek and OpenRouter
///   ("This endpoint's maximum context length is …") say it the same way;
/// - llama.cpp's server: type `exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`
///   beside the message ("the request exceeds the available context size …", or "request (N
///   tokens) exceeds the available context size (M tokens) …"), status 400, or 500 in the
///   builds that introduced the type;
/// - Ollama: "the input length exceeds the context length", or llama.cpp's error nested in its
///   message;
/// - Gemini's OpenAI-compatible endpoint: Gemini's own message (see
///   [`crate::providers::gemini`]).
pub(crate) fn context_overflow(err: &ApiError) -> Option<ContextOverflow> {
    let m = err.message.as_str();
    let said = |phrase: &str| contains_ignore_case(m, phrase);
    let by_code = err.code.as_deref() == Some("context_length_exceeded")
        || err.error_type.as_deref() == Some("exceed_context_size_error");
    let by_message = said("maximum context length is")
        || said("exceeds the available context size")
        || said("exceed_context_size_error")
        || said("input length exceeds the context length");
    let gemini = crate::providers::gemini::overflow_counts(m);
    if !(by_code || by_message || gemini.is_some()) {
        return None;
    }
    // The code that names the error: a numeric code (vLLM's, llama.cpp's) only repeats the status.
    let named = |c: &Option<String>| c.clone().filter(|c| !c.bytes().all(|b| b.is_ascii_digit()));
    let code = named(&err.code)
        .or_else(|| named(&err.error_type))
        .or_else(|| err.code.clone());
    let mut o = ContextOverflow::new(err.status, code, m);
    if let Some((input, limit)) = gemini {
        (o.input_tokens, o.limit) = (input, limit);
        return Some(o);
    }
    o.limit = number_after(m, "maximum context length is")
        .or_else(|| number_after(m, "n_ctx"))
        .or_else(|| number_after(m, "available context size"));
    o.input_tokens = number_after(m, "n_prompt_tokens")
        .or_else(|| number_after(m, "resulted in"))
        .or_else(|| number_after(m, "your request has"))
        .or_else(|| number_after(m, "request"))
        .or_else(|| {
            // "you requested M tokens (A in the messages, …)": A; "(A in your prompt; …)": A.
            said("requested")
                .then(|| number_after(m, "tokens ("))
                .flatten()
        });
    o.output_tokens = number_after(m, "in the messages,")
        .or_else(|| number_after(m, "in your prompt;"))
        .or_else(|| number_after(m, "input tokens plus"));
    Some(o)
}

/// Whether an error says the server or model does not accept a tool catalog.
pub(crate) fn tools_unsupported(err: &ApiError) -> bool {
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

/// What this API's errors mean for the run: a refusal for the context's size (with its counts,
/// [`context_overflow`]), and a refusal of tools.
pub(crate) const ERRORS: ErrorMeaning = ErrorMeaning {
    context_overflow,
    tools_unsupported,
};

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
                .then(|| format!("HTTP {}: {}", a.status, gist(&a.message)))
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
                .then(|| format!("HTTP {}: {}", a.status, gist(&a.message)))
        }
        _ => None,
    }
}

/// A short, char-boundary-safe excerpt of external text for error messages.
pub(super) fn preview(text: &str) -> String {
    adapter::preview(text, 300)
}

/// The gist of a server's error message for a one-line warning: its first paragraph (a Python
/// traceback after it is left out), its lines joined, cut short.
fn gist(text: &str) -> String {
    let first = text.split("\n\n").next().unwrap_or(text);
    let joined: Vec<&str> = first
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    preview(&joined.join(" "))
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
            ERRORS.classify(ModelError::Api(e)),
            ModelError::ToolsUnsupported(m) if m.contains("enable-auto-tool-choice")
        ));
        let e = parse_error(
            400,
            &h,
            br#"{"error":{"message":"registry.ollama.ai/library/gemma:2b does not support tools","type":"api_error","param":null,"code":null}}"#,
        );
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
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
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
            ModelError::Api(_)
        ));
        // Long non-JSON bodies are cut on a char boundary.
        let long = "é".repeat(1000);
        let e = parse_error(500, &h, long.as_bytes());
        assert!(e.message.chars().count() <= 301);
    }

    /// The overflow as the Chat Completions adapter reads it from a recorded body.
    fn overflow(status: u16, body: &str) -> ContextOverflow {
        let e = parse_error(status, &HeaderMap::new(), body.as_bytes());
        assert!(!e.retryable, "an overflow is never retried: {e:?}");
        match ERRORS.classify(ModelError::Api(e)) {
            ModelError::ContextOverflow(o) => o,
            other => panic!("not an overflow: {other:?}"),
        }
    }

    #[test]
    fn context_overflow_in_each_servers_shape() {
        // OpenAI, Chat Completions (chathub-dev/chathub#126, rahul2002m/ChatPDF#6).
        let o = overflow(
            400,
            r#"{"error":{"message":"This model's maximum context length is 4097 tokens. However, your messages resulted in 4294 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(4294), None, Some(4097))
        );
        assert_eq!(o.code.as_deref(), Some("context_length_exceeded"));
        // OpenAI's older sentence (emmethalm/infiniteGPT#6; hwchase17/chat-your-data#10).
        let o = overflow(
            400,
            r#"{"error":{"message":"This model's maximum context length is 4097 tokens. However, you requested 4972 tokens (3222 in the messages, 1750 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(3222), Some(1750), Some(4097))
        );
        let o = overflow(
            400,
            r#"{"error":{"message":"This model's maximum context length is 4097 tokens, however you requested 4231 tokens (3975 in your prompt; 256 for the completion). Please reduce your prompt; or completion length.","type":"invalid_request_error","param":null,"code":null}}"#,
        );
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(3975), Some(256), Some(4097))
        );
        // vLLM (ogx-ai/ogx#4534, from llamastack/llama-stack discussion 981).
        let o = overflow(
            400,
            r#"{"object":"error","message":"This model's maximum context length is 6048 tokens. However, you requested 6616 tokens (568 in the messages, 6048 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
        );
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(568), Some(6048), Some(6048))
        );
        assert_eq!(o.code.as_deref(), Some("BadRequestError"));
        // vLLM's newer sentence (vllm-project/vllm#33425).
        let o = overflow(
            400,
            r#"{"error":{"message":"This model's maximum context length is 2048 tokens. However, your request has 8 input tokens plus 2045 'max_tokens'. Please reduce one or the other. (parameter=input_tokens, max_tokens, value=(8, 2045))","type":"BadRequestError","param":"input_tokens, max_tokens","code":400}}"#,
        );
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(8), Some(2045), Some(2048))
        );
        // DeepSeek, whose code is not the usual one (evalstate/fast-agent#621).
        let o = overflow(
            400,
            r#"{"error":{"message":"This model's maximum context length is 131072 tokens. However, you requested 131134 tokens (122942 in the messages, 8192 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}"#,
        );
        assert_eq!(
            (o.input_tokens, o.output_tokens, o.limit),
            (Some(122_942), Some(8192), Some(131_072))
        );
        // OpenRouter (refly-ai/refly#1177).
        let o = overflow(
            400,
            r#"{"error":{"message":"This endpoint's maximum context length is 32768 tokens. However, you requested about 42832 tokens (42832 of text input). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.","code":400}}"#,
        );
        assert_eq!((o.input_tokens, o.limit), (Some(42_832), Some(32_768)));
        // llama.cpp's server, with the counts beside the message; a 500 at first
        // (ggml-org/llama.cpp#15780), a 400 since (oobabooga/textgen#7257).
        for status in [500, 400] {
            let o = overflow(
                status,
                &format!(
                    r#"{{"error":{{"code":{status},"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":1407,"n_ctx":256}}}}"#
                ),
            );
            assert_eq!((o.input_tokens, o.limit), (Some(1407), Some(256)));
            assert_eq!(o.code.as_deref(), Some("exceed_context_size_error"));
            assert_eq!(o.status, status);
        }
        // An older llama.cpp, with no counts (continuedev/continue#9797).
        let o = overflow(
            400,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"invalid_request_error"}}"#,
        );
        assert_eq!((o.input_tokens, o.limit), (None, None));
        // Ollama, whose message nests llama.cpp's error with `truncate: false`, and its own
        // sentence (nano-step/nano-brain#208).
        let o = overflow(
            400,
            r#"{"error":"{\"error\":{\"code\":400,\"message\":\"request (8889 tokens) exceeds the available context size (4096 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":8889,\"n_ctx\":4096}}"}"#,
        );
        assert_eq!((o.input_tokens, o.limit), (Some(8889), Some(4096)));
        let o = overflow(
            400,
            r#"{"error":"the input length exceeds the context length"}"#,
        );
        assert_eq!(o.input_tokens, None);
        // Gemini's OpenAI-compatible endpoint says what Gemini says (google-gemini/gemini-cli#6678).
        let o = overflow(
            400,
            r#"[{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}]"#,
        );
        assert_eq!(
            (o.input_tokens, o.limit),
            (Some(1_200_293), Some(1_048_576))
        );
        // The same in a streamed error chunk.
        let e = api_error_from_value(
            200,
            &serde_json::json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.", "code": "context_length_exceeded"}}),
            None,
        );
        assert!(matches!(
            ERRORS.classify(ModelError::Api(e)),
            ModelError::ContextOverflow(o) if o.input_tokens == Some(9000) && o.status == 200
        ));
        // Other errors that speak of tokens are not overflows.
        for body in [
            r#"{"error":{"message":"max_tokens is too large: 100000. This model supports at most 16384 completion tokens.","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}}"#,
            r#"{"error":{"message":"Rate limit reached for tokens per min (TPM)","code":"rate_limit_exceeded"}}"#,
        ] {
            let e = parse_error(400, &HeaderMap::new(), body.as_bytes());
            assert!(
                matches!(ERRORS.classify(ModelError::Api(e)), ModelError::Api(_)),
                "{body}"
            );
        }
    }
}
