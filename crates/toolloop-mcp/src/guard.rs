//! What a child server writes on stdout, read before rmcp reads it.
//!
//! rmcp drops, with no more than a log line, a message it cannot read: a line longer than
//! [`MAX_MESSAGE_BYTES`], or JSON it cannot decode (nested deeper than serde_json's 128 levels,
//! say). When that message was the answer to a request (a tool list of 20 MiB, a tool result
//! with a schema 200 levels deep), the request would wait forever. So every line goes through
//! [`forward`] first: a line rmcp reads is passed on as it is; an answer it could not read is
//! replaced by a JSON-RPC error for the same request id (code [`UNREADABLE`]), so that the
//! request fails at once with a message saying why. A line that answers nothing (no id, or not
//! a response) is passed on or dropped as rmcp would treat it.

use rmcp::model::ServerJsonRpcMessage;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest message read from a server (rmcp's own limit on a line, 16 MiB).
pub const MAX_MESSAGE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// The JSON-RPC error code of an answer toolloop could not read (set by toolloop, never sent
/// by the server).
pub const UNREADABLE: i32 = -32099;

/// The longest request id kept from an unreadable answer.
const MAX_ID_BYTES: usize = 256;

/// Copies `from` (a server's stdout) to `to` (what rmcp reads) line by line, replacing the
/// answers rmcp could not read with errors (see the module docs). Ends when either side closes.
pub(crate) async fn forward(from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) {
    let mut from = BufReader::with_capacity(64 * 1024, from);
    let mut line: Vec<u8> = Vec::new();
    let mut scan = Scan::default();
    let mut oversized = false;
    loop {
        let (take, end) = {
            let available = match from.fill_buf().await {
                Ok(a) if !a.is_empty() => a,
                _ => break,
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let chunk = &available[..take];
            scan.feed(chunk);
            if !oversized {
                if line.len() + take > MAX_MESSAGE_BYTES + 1 {
                    oversized = true;
                    line = Vec::new();
                } else {
                    line.extend_from_slice(chunk);
                }
            }
            (take, newline.is_some())
        };
        from.consume(take);
        if !end {
            continue;
        }
        let out = if oversized {
            scan.error_answer(&too_large())
        } else {
            checked(&line, &scan)
        };
        let result = match &out {
            Verdict::Pass => to.write_all(&line).await,
            Verdict::Replace(text) => to.write_all(text.as_bytes()).await,
            Verdict::Drop => Ok(()),
        };
        if result.is_err() || to.flush().await.is_err() {
            return;
        }
        line.clear();
        scan = Scan::default();
        oversized = false;
    }
    let _ = to.shutdown().await;
}

enum Verdict {
    /// rmcp reads the line as it is.
    Pass,
    /// The line is replaced by this one (an error for the request it answered).
    Replace(String),
    /// The line is left out.
    Drop,
}

/// What to do with a whole line (at most [`MAX_MESSAGE_BYTES`]).
fn checked(line: &[u8], scan: &Scan) -> Verdict {
    let text = line.strip_suffix(b"\n").unwrap_or(line);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    if text.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Pass;
    }
    match serde_json::from_slice::<ServerJsonRpcMessage>(text) {
        Ok(_) => Verdict::Pass,
        Err(e) => {
            let why = why_unreadable(&e);
            match scan.error_answer(&why) {
                // Not an answer: rmcp ignores it (or tells the server it was invalid).
                Verdict::Drop => Verdict::Pass,
                v => v,
            }
        }
    }
}

/// A running look at one line, without decoding it: how deep it nests, and the `id` of a
/// top-level object with `result` or `error` (an answer). Never recursive, in constant memory.
#[derive(Default)]
struct Scan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    capturing_key: bool,
    key: Vec<u8>,
    /// The last key read at depth 1 was `id`: its value comes next.
    after_id_key: bool,
    capturing_id: bool,
    id: Vec<u8>,
    id_too_long: bool,
    /// The object has `result` or `error`: it is an answer.
    answer: bool,
}

impl Scan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn push_id(&mut self, b: u8) {
        if self.id.len() < MAX_ID_BYTES {
            self.id.push(b);
        } else {
            self.id_too_long = true;
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            if self.capturing_id {
                self.push_id(b);
            }
            if self.capturing_key && self.key.len() <= 8 {
                self.key.push(b);
            }
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.capturing_key {
                    self.capturing_key = false;
                    self.key.pop();
                    self.after_id_key = self.key == b"id";
                    if self.key == b"result" || self.key == b"error" {
                        self.answer = true;
                    }
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.capturing_key = true;
                    self.key.clear();
                } else if self.capturing_id {
                    self.push_id(b);
                }
            }
            b'{' | b'[' => {
                if self.capturing_id {
                    self.push_id(b);
                }
                self.depth += 1;
                if self.depth == 1 && b == b'{' {
                    self.expect_key = true;
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.capturing_id = false;
                } else if self.capturing_id {
                    self.push_id(b);
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 => {
                if self.after_id_key {
                    self.after_id_key = false;
                    self.capturing_id = true;
                    self.id.clear();
                }
            }
            b',' if self.depth == 1 => {
                self.capturing_id = false;
                self.expect_key = true;
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => {
                if self.capturing_id {
                    self.push_id(b);
                }
            }
        }
    }

    /// The id of the answer read, when the line is an answer with a readable one.
    fn answer_id(&self) -> Option<rmcp::model::RequestId> {
        if !self.answer || self.id_too_long {
            return None;
        }
        serde_json::from_slice::<rmcp::model::RequestId>(&self.id).ok()
    }

    /// The error that replaces an unreadable answer: for its id, when it is an answer with one.
    fn error_answer(&self, why: &str) -> Verdict {
        match self.answer_id() {
            Some(id) => Verdict::Replace(format!("{}\n", error_for(&id, why))),
            None => Verdict::Drop,
        }
    }
}

/// The JSON-RPC error (code [`UNREADABLE`]) that stands for an answer to request `id` that
/// could not be read, saying why.
pub(crate) fn error_for(id: &rmcp::model::RequestId, why: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": UNREADABLE, "message": why, "data": Value::Null},
    })
}

/// Why a whole message (an HTTP body, an SSE event's data) cannot be read, and the id of the
/// request it answers when it is an answer with a readable id; `None` when it can be read.
pub(crate) fn unreadable(message: &[u8]) -> Option<(Option<rmcp::model::RequestId>, String)> {
    let why = if message.len() > MAX_MESSAGE_BYTES {
        too_large()
    } else {
        match serde_json::from_slice::<ServerJsonRpcMessage>(message) {
            Ok(_) => return None,
            Err(e) => why_unreadable(&e),
        }
    };
    let mut scan = Scan::default();
    scan.feed(message);
    Some((scan.answer_id(), why))
}

/// What an answer over the size limit is told.
pub(crate) fn too_large() -> String {
    format!(
        "the answer is larger than {} MiB, the most a message may be",
        MAX_MESSAGE_BYTES / (1024 * 1024)
    )
}

fn why_unreadable(e: &serde_json::Error) -> String {
    if e.to_string().contains("recursion limit") {
        "the answer is nested deeper than the 128 levels JSON is read to".to_string()
    } else {
        format!("the answer is not a message toolloop can read ({e})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn through(input: Vec<u8>) -> String {
        let (mut w, r) = tokio::io::duplex(1024);
        let (out_w, mut out_r) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            let _ = w.write_all(&input).await;
        });
        let fwd = tokio::spawn(forward(r, out_w));
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut out_r, &mut out)
            .await
            .unwrap();
        writer.await.unwrap();
        fwd.await.unwrap();
        String::from_utf8(out).unwrap()
    }

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[tokio::test]
    async fn readable_lines_pass_unreadable_answers_become_errors_for_their_id() {
        let ok = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        let junk = "a log line on stdout";
        let deep = format!(
            r#"{{"jsonrpc":"2.0","result":{{"tools":{}}},"id":"a\"b"}}"#,
            nested(200)
        );
        let deep_note = format!(
            r#"{{"jsonrpc":"2.0","method":"x","params":{{"v":{}}}}}"#,
            nested(200)
        );
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":7,"result":{{"content":[{{"type":"text","text":"{}"}}]}}}}"#,
            "x".repeat(MAX_MESSAGE_BYTES + 10)
        );
        let input = format!("{ok}\n{junk}\n{deep}\n{deep_note}\n{huge}\n{ok}\n");
        let out = through(input.into_bytes()).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 6, "{}", &out[..out.len().min(500)]);
        assert_eq!(lines[0], ok);
        assert_eq!(lines[1], junk);
        let e: Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(e["id"], "a\"b");
        assert_eq!(e["error"]["code"], UNREADABLE);
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("128 levels"),
            "{e}"
        );
        // A notification no one waits for goes on: rmcp drops it.
        assert_eq!(lines[3], deep_note);
        let e: Value = serde_json::from_str(lines[4]).unwrap();
        assert_eq!(e["id"], 7);
        assert!(
            e["error"]["message"].as_str().unwrap().contains("16 MiB"),
            "{e}"
        );
        assert_eq!(lines[5], ok);
    }
}
