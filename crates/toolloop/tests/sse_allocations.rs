//! The Server-Sent Events reader lends each event without copying it: once its buffers have
//! grown, reading a stream allocates nothing, however the bytes are cut into chunks.

use toolloop::transport::sse::{SseDecoder, SseEvent};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocations;

/// A stream as servers send it: comments, `event:` lines, `\r\n` line ends, data over several
/// lines, non-ASCII text, `[DONE]`.
fn body() -> String {
    let mut s = String::from(": keep-alive\n\n");
    for i in 0..50 {
        if i % 5 == 0 {
            s.push_str("event: content_block_delta\r\n");
        }
        s.push_str(&format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"piece {i} — ünïcode\"}}}}]}}\n"
        ));
        if i % 7 == 0 {
            s.push_str("data: and a second line\n");
        }
        s.push_str(if i % 2 == 0 { "\n" } else { "\r\n" });
    }
    s.push_str("data: [DONE]\n\n");
    s
}

/// Reads `body` in chunks of `size` bytes, lending each event to `seen`.
fn read(decoder: &mut SseDecoder, body: &[u8], size: usize, seen: &mut impl FnMut(&SseEvent)) {
    for chunk in body.chunks(size) {
        decoder
            .push_each(chunk, |e| {
                seen(e);
                Ok::<(), ()>(())
            })
            .unwrap();
    }
    decoder
        .finish_each(|e| {
            seen(e);
            Ok::<(), ()>(())
        })
        .unwrap();
}

#[test]
fn a_stream_is_read_without_allocating_once_the_buffers_have_grown() {
    let body = body();
    let expected = SseDecoder::new().push(body.as_bytes());
    assert_eq!(expected.len(), 51);
    for size in [1, 7, 64, 4096] {
        let mut decoder = SseDecoder::new();
        // The first stream grows the buffers.
        read(&mut decoder, body.as_bytes(), size, &mut |_| {});
        let (mut events, mut bytes) = (0, 0);
        let before = allocations();
        read(&mut decoder, body.as_bytes(), size, &mut |e| {
            assert_eq!(
                e, &expected[events],
                "event {events}, chunks of {size} bytes"
            );
            events += 1;
            bytes += e.data.len();
        });
        let made = allocations() - before;
        assert_eq!(events, expected.len(), "chunks of {size} bytes");
        assert!(bytes > 3000);
        assert_eq!(
            made, 0,
            "reading {events} events in chunks of {size} bytes allocated {made} times"
        );
    }
}

#[test]
fn an_error_from_the_reader_of_events_stops_the_reading() {
    let body = "data: a\n\ndata: b\n\ndata: c\n\n";
    let mut decoder = SseDecoder::new();
    let mut seen = Vec::new();
    let result = decoder.push_each(body.as_bytes(), |e| {
        seen.push(e.data.clone());
        if e.data == "b" { Err("stop") } else { Ok(()) }
    });
    assert_eq!(result, Err("stop"));
    assert_eq!(seen, ["a", "b"]);
}

#[test]
fn a_decoder_with_room_for_a_line_reads_a_whole_stream_without_allocating() {
    // A Chat Completions stream (no `event:` names), each line well under 512 bytes, in one
    // chunk, as a usual reply on a fast connection comes.
    let body: String = body()
        .split_inclusive('\n')
        .filter(|line| !line.starts_with("event:"))
        .collect();
    let expected = SseDecoder::new().push(body.as_bytes());
    assert_eq!(expected.len(), 51);
    let mut decoder = SseDecoder::with_capacity(512);
    let mut events = 0;
    let before = allocations();
    read(&mut decoder, body.as_bytes(), body.len(), &mut |e| {
        assert_eq!(e, &expected[events], "event {events}");
        events += 1;
    });
    let made = allocations() - before;
    assert_eq!(events, expected.len());
    assert_eq!(made, 0, "the first stream allocated {made} times");
    // Without the room, the same first stream allocates.
    let mut fresh = SseDecoder::new();
    let before = allocations();
    read(&mut fresh, body.as_bytes(), body.len(), &mut |_| {});
    assert!(allocations() > before);
}
