//! An incremental Server-Sent Events reader.
//!
//! Bytes go in as they arrive, in chunks of any size; complete events come out. Comment lines
//! (starting with `:`) are skipped, `event:` lines are optional, several `data:` lines join with
//! `\n`, and both `\n` and `\r\n` line ends are accepted. A `[DONE]` marker is passed through as
//! data; callers decide what it means. [`SseDecoder::push_each`] lends each event to a closure
//! instead of returning copies: the adapters read streams that way, without allocating per event.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// The reader's state between chunks.
///
/// Lines are read where they lie in the bytes given, and only the start of a line that a chunk
/// cut is kept until the next chunk. The event being read keeps its strings from one event to the
/// next, so that [`SseDecoder::push_each`] reads a stream without allocating once its buffers
/// have grown.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// The start of a line that the bytes given so far have not ended.
    partial: Vec<u8>,
    /// The event being read: its fields so far.
    current: SseEvent,
    /// Whether a `data:` line came for the current event (an event without one is not
    /// delivered).
    has_data: bool,
    /// The string of the last `event:` field, kept for the next one.
    spare_event: String,
}

impl SseDecoder {
    /// A fresh decoder.
    pub fn new() -> Self {
        SseDecoder::default()
    }

    /// A fresh decoder whose buffer for an event's data holds `bytes` before it has to grow.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut decoder = SseDecoder::default();
        decoder.current.data.reserve(bytes);
        decoder
    }

    /// Adds bytes and returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let read = self.push_each(bytes, |e| {
            out.push(e.clone());
            Ok::<(), std::convert::Infallible>(())
        });
        match read {
            Ok(()) => out,
            Err(never) => match never {},
        }
    }

    /// Adds bytes and lends each event they complete to `f`, in order, without copying it. An
    /// error from `f` stops the reading: it is returned, and the rest of `bytes` is not read.
    pub fn push_each<E>(
        &mut self,
        bytes: &[u8],
        mut f: impl FnMut(&SseEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        self.push_each_mut(bytes, |e| f(e))
    }

    /// As [`SseDecoder::push_each`], each event lent mutably: `f` may change it in place (its
    /// strings are the decoder's, and the next event starts empty whatever `f` left in them).
    pub fn push_each_mut<E>(
        &mut self,
        mut bytes: &[u8],
        mut f: impl FnMut(&mut SseEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.partial.is_empty() {
            let Some(pos) = memchr::memchr(b'\n', bytes) else {
                self.partial.extend_from_slice(bytes);
                return Ok(());
            };
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(&bytes[..pos]);
            bytes = &bytes[pos + 1..];
            let read = self.line(strip_cr(&line), &mut f);
            line.clear();
            self.partial = line;
            read?;
        }
        while let Some(pos) = memchr::memchr(b'\n', bytes) {
            let line = &bytes[..pos];
            bytes = &bytes[pos + 1..];
            self.line(strip_cr(line), &mut f)?;
        }
        self.partial.extend_from_slice(bytes);
        Ok(())
    }

    /// Ends the input: an event not followed by a blank line is still delivered.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut last = None;
        let read = self.finish_each(|e| {
            last = Some(e.clone());
            Ok::<(), std::convert::Infallible>(())
        });
        match read {
            Ok(()) => last,
            Err(never) => match never {},
        }
    }

    /// Ends the input as [`SseDecoder::finish`] does, lending the last event to `f`.
    pub fn finish_each<E>(
        &mut self,
        mut f: impl FnMut(&SseEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        self.finish_each_mut(|e| f(e))
    }

    /// As [`SseDecoder::finish_each`], the last event lent mutably (see
    /// [`SseDecoder::push_each_mut`]).
    pub fn finish_each_mut<E>(
        &mut self,
        mut f: impl FnMut(&mut SseEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            let mut end = rest.len();
            while end > 0 && rest[end - 1] == b'\r' {
                end -= 1;
            }
            // A line left without its newline can only end an event, never deliver one before.
            self.line(&rest[..end], &mut f)?;
        }
        self.dispatch(&mut f)
    }

    /// Delivers the event read so far, if it has data, and starts the next one.
    fn dispatch<E>(&mut self, f: &mut impl FnMut(&mut SseEvent) -> Result<(), E>) -> Result<(), E> {
        let delivered = if self.has_data {
            f(&mut self.current)
        } else {
            Ok(())
        };
        self.has_data = false;
        self.current.data.clear();
        if let Some(mut event) = self.current.event.take() {
            event.clear();
            self.spare_event = event;
        }
        delivered
    }

    fn line<E>(
        &mut self,
        line: &[u8],
        f: &mut impl FnMut(&mut SseEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        if line.is_empty() {
            return self.dispatch(f);
        }
        if line[0] == b':' {
            return Ok(());
        }
        // `:` is ASCII, so it never lies inside a multi-byte character, and the field and the
        // value decode (lossily) as the whole line would.
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.has_data = true;
                push_lossy(&mut self.current.data, value);
            }
            b"event" => {
                let mut event = std::mem::take(&mut self.spare_event);
                if let Some(old) = self.current.event.take() {
                    event = old;
                    event.clear();
                }
                push_lossy(&mut event, value);
                self.current.event = Some(event);
            }
            _ => {}
        }
        Ok(())
    }
}

/// A line without the `\r` of a `\r\n` line end.
fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Appends `bytes` as text, invalid UTF-8 replaced by U+FFFD.
fn push_lossy(to: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => to.push_str(text),
        Err(_) => to.push_str(&String::from_utf8_lossy(bytes)),
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

    #[test]
    fn text_cut_inside_a_character_is_whole_and_invalid_bytes_are_replaced() {
        let body = "data: ünï\n\n".as_bytes();
        // Cut between the two bytes of `ü`, then of `ï`.
        assert_eq!(all(&[&body[..7], &body[7..10], &body[10..]]), all(&[body]));
        assert_eq!(all(&[body])[0].data, "ünï");
        let events = all(&[b"data: a\xffb\n", b"event: x\xfe\n\n"]);
        assert_eq!(
            events,
            vec![SseEvent {
                event: Some("x\u{fffd}".into()),
                data: "a\u{fffd}b".into()
            }]
        );
    }

    #[test]
    fn an_event_without_data_is_not_delivered_and_its_name_does_not_carry_over() {
        assert_eq!(
            all(&[b"event: ping\n\ndata: x\n\n"]),
            vec![SseEvent {
                event: None,
                data: "x".into()
            }]
        );
        // Ended by the end of the input, with a `\r` left.
        assert_eq!(
            all(&[b"event: a\ndata: y\n\r"]),
            vec![SseEvent {
                event: Some("a".into()),
                data: "y".into()
            }]
        );
    }

    #[test]
    fn what_a_reader_changes_in_a_lent_event_does_not_reach_the_next() {
        let mut d = SseDecoder::new();
        let mut seen = Vec::new();
        let body = b"event: a\ndata: one\n\ndata: two\n\ndata: three";
        d.push_each_mut(body, |e| {
            seen.push(e.clone());
            e.data.push_str(" changed");
            e.event = Some("changed".into());
            Ok::<(), ()>(())
        })
        .unwrap();
        d.finish_each_mut(|e| {
            seen.push(e.clone());
            Ok::<(), ()>(())
        })
        .unwrap();
        let data: Vec<(Option<&str>, &str)> = seen
            .iter()
            .map(|e| (e.event.as_deref(), e.data.as_str()))
            .collect();
        assert_eq!(
            data,
            vec![(Some("a"), "one"), (None, "two"), (None, "three")]
        );
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
