//! An incremental Server-Sent Events reader.
//!
//! Bytes go in as they arrive, in chunks of any size; complete events come out. Comment lines
//! (starting with `:`) are skipped, `event:` lines are optional, several `data:` lines join with
//! `\n`, and both `\n` and `\r\n` line ends are accepted. A `[DONE]` marker is passed through as
//! data; callers decide what it means.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// The reader's state between chunks.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseDecoder {
    /// A fresh decoder.
    pub fn new() -> Self {
        SseDecoder::default()
    }

    /// Adds bytes and returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.line(&line, &mut out);
        }
        self.buf.drain(..start);
        out
    }

    /// Ends the input: an event not followed by a blank line is still delivered.
    pub fn finish(&mut self) -> Option<SseEvent> {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            let line = String::from_utf8_lossy(&rest).into_owned();
            let mut out = Vec::new();
            self.line(line.trim_end_matches('\r'), &mut out);
            if let Some(e) = out.pop() {
                return Some(e);
            }
        }
        self.dispatch()
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let data = self.data.take();
        let event = self.event.take();
        data.map(|data| SseEvent { event, data })
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if let Some(e) = self.dispatch() {
                out.push(e);
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = Some(value.to_string()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BODY: &str = ": keep-alive\n\nevent: message_start\ndata: {\"a\":1}\n\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]\n\n";

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(d.push(c));
        }
        out.extend(d.finish());
        out
    }

    #[test]
    fn reads_fields_comments_and_multiline_data() {
        let events = all(&[BODY.as_bytes()]);
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: Some("message_start".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: None,
                    data: "x\ny".into()
                },
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                },
            ]
        );
    }

    #[test]
    fn last_event_without_blank_line_is_kept() {
        assert_eq!(all(&[b"data: {}"]).len(), 1);
        assert_eq!(all(&[b"data: {}\n"]).len(), 1);
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_events(cuts in proptest::collection::vec(0usize..BODY.len(), 0..8)) {
            let bytes = BODY.as_bytes();
            let mut cuts = cuts;
            cuts.sort();
            let mut chunks = Vec::new();
            let mut last = 0;
            for c in cuts {
                chunks.push(&bytes[last..c]);
                last = c;
            }
            chunks.push(&bytes[last..]);
            prop_assert_eq!(all(&chunks), all(&[bytes]));
        }
    }
}
