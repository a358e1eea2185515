//! toolloop's engine for JavaScript: a driver over [`toolloop::engine::Machine`] that does its
//! I/O through a host object the npm package's wrapper (`npm/toolloop.js`) builds.
//!
//! The machine decides (budgets, duplicate detection, exactly one result per call, typed stop
//! reasons); the adapters encode requests and decode responses ([`toolloop::providers::wire`],
//! [`toolloop::ptk`] for models without native tools). JavaScript makes the HTTP calls
//! (`fetch`), runs the tools, and hears the events. Data crosses the boundary as JSON text.
//!
//! The host (every function may return a promise):
//! - `http(url, headers, body, signalled)`: a `POST`; resolves to `{ status, headers, read }`
//!   where `headers` is an object and `read()` gives the body's next chunk (`Uint8Array`) or
//!   `undefined` at its end;
//! - `complete(request)`: a JavaScript model; `request` is JSON text,
//!   `{ from, messages, reminders, tools?, settings?, summary? }`: the conversation is the one
//!   of the previous request up to `from`, then `messages` (only what changed crosses);
//!   `tools` and `settings` come when they changed; a `summary` request (the context policy's
//!   summarisation) carries its whole conversation and is not part of the run's. The answer is
//!   JSON text of a [`toolloop::ModelResponse`] (at least `{ "text": … }`);
//! - `tool(name, arguments, callId, attempt, timeoutMs)`: runs attempt `attempt` of a tool
//!   call, within `timeoutMs` when given; resolves to JSON text, `{ "ok": value }` or
//!   `{ "error": message, "retryable": bool }`;
//! - `approve(pending)`: a person's answer on a call that waits for approval (`pending` is JSON
//!   text of a [`toolloop::approval::PendingApproval`]); resolves to JSON text,
//!   `{ "answer": "approve" }` or `{ "answer": "deny", "reason": … }`. Without it, such a call
//!   waits and the run stops with `awaiting_approval`;
//! - `subject(name, arguments)`: the approval subject of a call of a tool declared with
//!   `approvalSubject` (`arguments` is JSON text), a string, answered at once; approval rules'
//!   subject globs match it (a call of another tool: its canonical JSON arguments). When it
//!   throws, the subject is uncertain: every `deny` and `ask` rule of the tool matches;
//! - `reminders(view)`, when set: before each round, strings sent with that round's request
//!   only (`view` is JSON text, `{ round, toolCalls, usage, lastCall }`; the answer JSON text
//!   of a list of strings);
//! - `stopWhen(calls)`, when set: after a round's calls ran (`calls` is JSON text,
//!   `[{ call, result }]`), the signal that ends the run (JSON text of a string), or `null`;
//! - `onRoundLimit(view)`, when set: when `maxRounds` is reached (`view` as `reminders`
//!   gets it), JSON text of toolloop's [`toolloop::config::RoundLimitDecision`]:
//!   `{ "extend": n }` grants `n` more rounds, `{ "signal": text }` ends the run with it,
//!   `"stop"` stops it. Without it, or when it fails, the run stops with `max_rounds`;
//! - `sleep(ms)`: resolves after `ms` milliseconds, or sooner when the run is stopped;
//! - `event(json)`: an event of the run;
//! - `aborted()`: whether the run must stop: `"timeout"` past its time limit, another true
//!   value when the caller cancelled. The host also cuts short what is under way then.

#![forbid(unsafe_code)]

mod driver;
mod host;

pub use driver::RunSpec;
use driver::run_spec;

use wasm_bindgen::prelude::*;

/// Runs a loop: `spec` is the run as JSON text ([`RunSpec`]), `host` the JavaScript side (see
/// the crate's documentation). Resolves to the result as JSON text: `{ text, stopReason,
/// toolCalls, messages, usage, outcome, state }`.
#[wasm_bindgen]
pub async fn run(spec: String, host: JsValue) -> Result<String, JsValue> {
    let spec: RunSpec = serde_json::from_str(&spec)
        .map_err(|e| JsValue::from_str(&format!("the run's options do not parse: {e}")))?;
    let host = host::Host::new(host);
    run_spec(spec, &host)
        .await
        .map_err(|e| JsValue::from_str(&e))
}

/// The version of the engine (the crate's).
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Decodes a recorded response body as the adapter of `api` (`openai-chat`,
/// `openai-responses`, `anthropic-messages`, `gemini`) decodes it: the HTTP `status`, the
/// body, whether it is a stream. JSON text: `{ response, error }`. The conformance corpus is
/// replayed through it, so that the WebAssembly build's decoders are checked as the native
/// ones are. Only with the `conformance` feature (the tests' build, not the shipped module).
#[cfg(feature = "conformance")]
#[wasm_bindgen(js_name = decodeRecorded)]
pub fn decode_recorded(
    api: &str,
    status: u16,
    body: &[u8],
    stream: bool,
) -> Result<String, JsValue> {
    use toolloop::providers::{anthropic, gemini, openai, openai_responses};
    let decoded = match api {
        "openai-chat" => openai::decode_recorded(status, body, stream),
        "openai-responses" => openai_responses::decode_recorded(status, body, stream),
        "anthropic-messages" => anthropic::decode_recorded(status, body, stream),
        "gemini" => gemini::decode_recorded(status, body, stream),
        other => return Err(JsValue::from_str(&format!("unknown API `{other}`"))),
    };
    serde_json::to_string(&serde_json::json!({
        "response": decoded.response,
        "error": decoded.error,
    }))
    .map_err(|e| JsValue::from_str(&e.to_string()))
}
