//! Fuzzes the OpenAI Responses API adapter's decoders: any bytes, read as an SSE stream or as a
//! complete body, under any status, must decode to a response or an error, never a panic; a
//! decoded call always has valid argument JSON or keeps the invalid text apart.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolloop::providers::openai_responses::decode_recorded;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let status = match first % 4 {
        0 | 1 => 200,
        2 => 429,
        _ => 500,
    };
    for stream in [true, false] {
        let decoded = decode_recorded(status, body, stream);
        for call in &decoded.response.tool_calls {
            assert!(call.invalid_arguments.is_none() || call.arguments.is_object());
        }
        if !(200..300).contains(&status) {
            assert!(decoded.error.is_some());
        }
    }
});
