//! Fuzzes the WebAssembly build's JSON Schema checker against the native one (`jsonschema`):
//! any bytes, read as a schema and a value, must give the same verdict from both (or a refusal
//! of the schema by name), and neither may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // The schema, a 0 byte, then the value; both JSON.
    let mut parts = data.splitn(2, |&b| b == 0);
    let (Some(schema), Some(value)) = (parts.next(), parts.next()) else {
        return;
    };
    let (Ok(schema), Ok(value)) = (
        serde_json::from_slice::<Value>(schema),
        serde_json::from_slice::<Value>(value),
    ) else {
        return;
    };
    if let Err(difference) = toolloop::webassembly_checker_agrees(&schema, &value) {
        panic!("the checkers disagree:\n{difference}");
    }
});
