//! The request debug log: every request a transport sends and every response it receives, as
//! sent and received, one JSON object per line, with keys redacted.
//!
//! Set [`HttpTransport::debug_log`](super::http::HttpTransport::debug_log) on a provider's
//! transport (the command: `--debug-requests [FILE]`, or `DEBUG_LLM=1`). Lines, all with
//! `time_ms` (Unix time) and `call` (one number per model call, the same for its retries):
//!
//! - `{"event": "request", "attempt", "url", "headers", "body"}`: the body as JSON when it is
//!   JSON;
//! - `{"event": "response", "attempt", "status", "headers", "elapsed_ms"}` when the headers
//!   arrive;
//! - `{"event": "body", "body"}` for a whole response body (an answer or an error), and
//!   `{"event": "chunk", "data"}` for each piece of a streamed one;
//! - `{"event": "failed", "attempt", "error"}` when an attempt gets no response.
//!
//! Secrets are replaced by `[redacted]` wherever they appear: the credential headers
//! (`authorization`, `x-api-key`, …), keys in the URL, and any echo of them in a body.

use crate::redact::{REDACTED, Redactor, redact_json_value, unescape_json_text};
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where the request debug log goes. Shared by every transport that logs to it.
pub struct RequestLog {
    out: Mutex<Box<dyn Write + Send>>,
    calls: AtomicU64,
}

impl std::fmt::Debug for RequestLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLog").finish_non_exhaustive()
    }
}

impl RequestLog {
    /// A log written to `out`, a line per record.
    pub fn new(out: impl Write + Send + 'static) -> Self {
        RequestLog {
            out: Mutex::new(Box::new(out)),
            calls: AtomicU64::new(0),
        }
    }

    /// A log appended to the file at `path`, readable by its owner only (it holds prompts and
    /// answers): created with mode 0600, or, when it exists, set to 0600. The last component
    /// is not followed when it is a symbolic link (a link planted where the log goes would
    /// send it elsewhere), and what is not a regular file (a FIFO, which would block the
    /// open, a device, a directory) is refused.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        use std::io::{Error, ErrorKind};
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600).custom_flags(
                (rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::NONBLOCK
                    | rustix::fs::OFlags::NOCTTY)
                    .bits() as i32,
            );
        }
        let not_regular = || {
            Error::new(
                ErrorKind::InvalidInput,
                "it is not a regular file (a FIFO, socket, device or directory)",
            )
        };
        let file = options.open(path).map_err(|e| {
            // O_NOFOLLOW on a link fails (ELOOP), a FIFO without a reader too (ENXIO): say why.
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => Error::new(
                    ErrorKind::InvalidInput,
                    "it is a symbolic link; give the path of a regular file",
                ),
                Ok(m) if !m.is_file() => not_regular(),
                _ => e,
            }
        })?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(not_regular());
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o777 != 0o600 {
                file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
        }
        Ok(RequestLog::new(std::io::LineWriter::new(file)))
    }

    /// A log written to stderr.
    pub fn stderr() -> Self {
        RequestLog::new(std::io::stderr())
    }

    /// A number for a new model call.
    pub(crate) fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn write(&self, mut record: Value) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if let Some(o) = record.as_object_mut() {
            o.insert("time_ms".into(), Value::from(now));
        }
        let Ok(mut out) = self.out.lock() else {
            return;
        };
        // A log that cannot be written must not fail the call it describes.
        let _ = serde_json::to_writer(&mut *out, &record);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    pub(crate) fn request(
        &self,
        call: u64,
        attempt: u32,
        url: &str,
        headers: &HeaderMap,
        body: &[u8],
        redactor: &Redactor,
    ) {
        self.write(json!({
            "event": "request",
            "call": call,
            "attempt": attempt,
            "url": redactor.redact(url),
            "headers": header_map(headers, redactor),
            "body": body_value(body, redactor),
        }));
    }

    pub(crate) fn response(
        &self,
        call: u64,
        attempt: u32,
        status: u16,
        headers: &HeaderMap,
        elapsed: Duration,
        redactor: &Redactor,
    ) {
        self.write(json!({
            "event": "response",
            "call": call,
            "attempt": attempt,
            "status": status,
            "headers": header_map(headers, redactor),
            "elapsed_ms": elapsed.as_millis() as u64,
        }));
    }

    pub(crate) fn body(&self, call: u64, body: &[u8], redactor: &Redactor) {
        self.write(json!({"event": "body", "call": call, "body": body_value(body, redactor)}));
    }

    pub(crate) fn chunk(&self, call: u64, data: &[u8], redactor: &Redactor) {
        let text = redact_text(&String::from_utf8_lossy(data), redactor);
        self.write(json!({"event": "chunk", "call": call, "data": text}));
    }

    /// A stream that broke after its response began; `retryable`: whether it may be opened
    /// anew (never once it delivered output: the loop then asks again, a new call).
    pub(crate) fn stream_broke(
        &self,
        call: u64,
        attempt: u32,
        error: &str,
        retryable: bool,
        redactor: &Redactor,
    ) {
        self.write(json!({
            "event": "stream_broke",
            "call": call,
            "attempt": attempt,
            "error": redactor.redact(error),
            "retryable": retryable,
        }));
    }

    pub(crate) fn failed(&self, call: u64, attempt: u32, error: &str, redactor: &Redactor) {
        self.write(json!({
            "event": "failed",
            "call": call,
            "attempt": attempt,
            "error": redactor.redact(error),
        }));
    }
}

/// Headers as an object; credential headers are `[redacted]` whatever they hold.
fn header_map(headers: &HeaderMap, redactor: &Redactor) -> Value {
    const CREDENTIALS: &[&str] = &[
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
    ];
    let mut map = Map::new();
    for (name, value) in headers {
        let shown = if value.is_sensitive() || CREDENTIALS.contains(&name.as_str()) {
            REDACTED.to_string()
        } else {
            redactor.redact(&String::from_utf8_lossy(value.as_bytes()))
        };
        map.insert(name.as_str().to_string(), Value::String(shown));
    }
    Value::Object(map)
}

/// A body as JSON when it is JSON, else as text; secrets redacted in the decoded text (a
/// server may write a key it echoes with `\u` escapes, which redacting the bytes would miss).
pub(crate) fn body_value(body: &[u8], redactor: &Redactor) -> Value {
    match serde_json::from_slice::<Value>(body) {
        Ok(mut value) => {
            redact_json_value(redactor, &mut value);
            value
        }
        Err(_) => Value::String(redact_text(&String::from_utf8_lossy(body), redactor)),
    }
}

/// Text that may hold JSON (a piece of a stream): its `\u` escapes written out, then redacted.
pub(crate) fn redact_text(text: &str, redactor: &Redactor) -> String {
    redactor.redact(&unescape_json_text(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_and_chunks_are_redacted_once_decoded() {
        let key = "sk-abc/123456";
        let r = Redactor::new().with_secret(key);
        let escaped: String = key
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let body = format!(r#"{{"error": {{"message": "bad key {escaped}"}}}}"#);
        assert_eq!(
            body_value(body.as_bytes(), &r)["error"]["message"],
            "bad key [redacted]"
        );
        let chunk = format!("data: {{\"delta\": \"{escaped}\"}}\n\n");
        let text = redact_text(&chunk, &r);
        assert!(
            text.contains("[redacted]") && !text.contains("sk-abc"),
            "{text}"
        );
        assert_eq!(
            body_value(format!("not json {escaped}").as_bytes(), &r),
            "not json [redacted]"
        );
        // Escapes of quotes and backslashes stay escapes: the text keeps its meaning.
        assert_eq!(
            unescape_json_text(r#"a\u0022b\\u0041"#),
            r#"a\u0022b\\u0041"#
        );
    }
}
