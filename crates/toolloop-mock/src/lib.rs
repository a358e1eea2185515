//! A mock LLM provider server on 127.0.0.1, for tests, demos, benchmarks and offline agent
//! testing (`toolloop mock --port <p>`).
//!
//! It speaks four wire protocols, server side, with the same scenarios and the same checks:
//!
//! | protocol | endpoint | streaming |
//! |---|---|---|
//! | OpenAI Chat Completions | `POST /v1/chat/completions` (also `/chat/completions`) | `"stream": true`; SSE chunks, a usage chunk with `stream_options.include_usage`, then `data: [DONE]` |
//! | OpenAI Responses | `POST /v1/responses` (also `/responses`) | `"stream": true`; `response.created`, `response.output_item.added` / `.done`, `response.output_text.delta`, `response.function_call_arguments.delta` / `.done`, `response.completed` (each with `event:` and `sequence_number`) |
//! | Anthropic Messages | `POST /v1/messages` (needs the `anthropic-version` header and `max_tokens`) | `"stream": true`; `message_start`, `ping`, `content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta`) / `content_block_stop`, `message_delta`, `message_stop` |
//! | Gemini | `POST /v1beta/models/{model}:generateContent` (also under `/v1/`) | `:streamGenerateContent?alt=sse` gives `data:` chunks of `GenerateContentResponse`; without `alt=sse`, a JSON array of them |
//!
//! `GET /v1/models` lists one model, `mock`, for clients that check it.
//!
//! # Scenarios
//!
//! The model name picks the scenario (Gemini: the `{model}` of the path):
//!
//! ```text
//! model  := NAME [ ":" params ]         NAME is free text without ":", usually `mock`
//! params := param { "," param }
//! param  := key "=" value
//! ```
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `rounds` | 0 to 10000 | 1 | rounds of tool calls before the final answer |
//! | `parallel` | 1 to 256 | 1 | tool calls per round |
//! | `latency` | duration | the server's `default_latency`, else 0 | wait before each response |
//! | `chunk` | 0 to 1000000 | 16 | longest text or argument fragment per streamed delta, in characters; 0 = whole |
//! | `chunk_delay` | duration | 0 | pause between streamed events |
//! | `faults` | share `0` to `1` (`0.2`), or percentage (`20%`) | 0 | share of responses that are faults (see below) |
//! | `seed` | 0 to 2⁶⁴−1 | 0 | seed of the fault draws |
//! | `fault_kinds` | `all`, or kinds joined with `+` | `all` | kinds of faults drawn |
//! | `retry_after` | duration | 1s | the wait a `429` fault asks for |
//! | `slow_delay` | duration | 1s | how late a `slow` fault's response head comes |
//! | `text_calls` | a dialect: `ptk`, `hermes`, `mistral`, `llama3`, `qwen3-coder`, `json` | off | text-only mode: calls written in the reply's content in that dialect (see below); OpenAI route only |
//! | `accept_tools` | `true` or `false` | `false` | with `text_calls`: accept requests that carry `tools` (still writing calls as text) |
//! | `distinct` | `true` or `false` | `false` | every call's arguments differ: the first string argument gets ` #N` appended (N the call's number in the task), so duplicate-call detection lets every call run |
//! | `window` | 1 to 100000000 | none | the model's context window in tokens: a larger request is refused as the API refuses one (see below) |
//! | `drop_tools` | `true`, `false` or `without_choice` | `false` | OpenAI route: the server drops the `tools` parameter (and `tool_choice`) without a word, always or when the request has no `tool_choice` (llama-cpp-python's `chatml-function-calling`); the reply is made as without tools and the prompt tokens are counted without the catalog |
//! | `refuse_auto_stream` | `true` or `false` | `false` | OpenAI route: a streamed request with `tool_choice: "auto"` gets an empty stream, status 200 and no event (llama-cpp-python: "Automatic streaming tool choice is not supported") |
//! | `refuse_json_schema` | `true` or `false` | `false` | OpenAI route: a `response_format` of type `json_schema` gets llama-cpp-python's HTTP 500 validation error ("Input should be 'text' or 'json_object'"); `json_object` is taken |
//! | `empty_auto_answer` | `true` or `false` | `false` | OpenAI route: a final answer to a request with tools and `tool_choice: "auto"` is empty, no text and no call (llama-cpp-python's `chatml-function-calling`, whose grammar leaves no room for text then) |
//! | `refuse_context` | `true` or `false` | `false` | Anthropic and Responses routes: a request asking for context management done by the server (`context_management`, or Anthropic's `context-management-2025-06-27` beta) is refused with HTTP 400 naming it, in the API's own error shape, as a model or server without the feature does |
//! | `traceback` | `true` or `false` | `false` | error faults (`500`, `503`) carry a Python traceback, several lines long, as their message |
//!
//! A duration is `0`, or a number with a unit: `250us` (or `µs`), `5ms`, `1.5s`, `1m`; at most
//! 10 minutes. A name without `:` (`mock`, `gpt-4o`) is the default scenario. An unknown key, a
//! key given twice, or a bad value gives HTTP 400 naming the key and what was expected.
//!
//! Examples:
//!
//! - `mock`: one round with one call, then the answer.
//! - `mock:rounds=3,parallel=2`: three rounds of two parallel calls, then the answer.
//! - `mock:rounds=0`: answers at once.
//! - `mock:rounds=5,latency=20ms,chunk=4,chunk_delay=10ms`: slow, finely streamed; good for demos.
//! - `mock:rounds=3,parallel=2,faults=0.2,seed=7`: a fifth of the responses are faults of any kind.
//! - `mock:faults=20%,fault_kinds=429+500+reset_body,retry_after=50ms`: only those kinds.
//! - `mock:text_calls=hermes,rounds=2,parallel=3`: a model without tool support, for
//!   prompt-based tool calling (`--tool-protocol prompt` or `auto`).
//! - `mock:text_calls=mistral,accept_tools=true`: a server whose tool parser misses the model's
//!   calls and leaks them into `content` (for the OpenAI adapter's rescue).
//!
//! # What a scenario does
//!
//! The server keeps no state: each request says where the conversation stands. The task begins
//! at the last user message (a user message that directly follows tool results, such as a
//! reminder, continues the task). The round is the number of assistant turns with tool calls
//! since then. While the round is below `rounds` and the request offers tools, the reply is
//! `parallel` tool calls, round-robin over the offered tools (continuing across rounds), with
//! arguments built by [`toolloop::schema::sample`] from each tool's schema and ids unique for the
//! server's lifetime (`call_mock…` for OpenAI's two APIs, `toolu_mock…` for Anthropic; Gemini has no ids).
//! Then the reply is a final text, `Done. I saw N tool results in R rounds.`, followed by
//! ` I see M images.` when the task's user turns held images. Images are checked as the APIs
//! check them: base64 data (or a `data:` URL) must decode to an image of the media type it
//! declares (PNG, JPEG, GIF or WebP), and a URL must be `http` or `https` (nothing is fetched);
//! otherwise the answer is 400 naming the image.
//!
//! `tool_choice` `none` (Gemini: function calling mode `NONE`) makes it answer at once; a named
//! tool (Gemini: `allowedFunctionNames`) restricts the calls to it.
//!
//! # Output formats
//!
//! A request that asks for JSON matching a schema natively (OpenAI `response_format` of type
//! `json_schema`; Anthropic `output_config.format`, or the beta `output_format`, of type
//! `json_schema`; Gemini `generationConfig.responseJsonSchema` or `responseSchema`) gets, as its
//! final answer, [`toolloop::schema::sample`] of that schema as JSON text, and is counted in
//! [`MockStats::output_schemas`]. The server checks the format as the APIs do: OpenAI's needs a
//! `name` and a `schema`, and with `strict: true` every object must set `additionalProperties:
//! false` and list all its properties in `required`; Gemini's needs `responseMimeType`
//! `application/json`. Otherwise it answers 400 naming what is wrong.
//! [`MockOptions::answers`] replaces the final answers with scripted ones.
//!
//! # Text-only mode
//!
//! `text_calls=<dialect>` plays a model without native tool calling, behind an
//! OpenAI-compatible server (Anthropic and Gemini routes answer 400). Its rounds and checks are
//! the same, in text:
//!
//! - **Calls** are written in the reply's `content` with [`toolloop::ptk::write_calls`], after a
//!   sentence naming them (`I'll call read_file, list_dir.`), with `finish_reason` `stop` and no
//!   `tool_calls`; streamed, the content comes in `chunk`-character deltas like any text, so
//!   call tags are split across deltas.
//! - **Tools**: a request carrying a non-empty `tools` parameter is refused with Ollama's answer,
//!   HTTP 400 `registry.ollama.ai/library/<model> does not support tools` (so that a client's
//!   fallback kicks in; the refusal counts as rejected in [`MockStats`]), unless
//!   `accept_tools=true`, in which case those tools and their schemas are used. Without a
//!   `tools` parameter, the tools are read from the catalog that the client wrote into its
//!   system prompt ([`toolloop::ptk::render_system_prompt`]): each `## NAME` section and its
//!   parameter lines. The arguments are the required parameters and those with a default,
//!   sampled from their types (`"a"`, `0`, …, the default, the first enum value); for the tool
//!   that the catalog's example call names, the example's arguments, which the client built from
//!   the real schema. No catalog, no tools: the mock answers at once.
//! - **History**: an assistant message without `tool_calls` whose text holds calls (read with
//!   [`toolloop::ptk::parse_reply`]) is a round of calls. The message right after it must be a user
//!   message starting `PTK_RESULT:`, holding one `PTK_RESULT: NAME (call id: ID)` header line
//!   (`, error)` for a failed call) per call: every call answered exactly once, matched by name
//!   (the text form has no ids; a call id may appear only once). Results that answer no call,
//!   answer one twice, are missing, or whose header does not read give a 400 naming the message
//!   and the calls. Native `tool_calls` and `tool` messages (what a client sends back after
//!   rescuing the calls, with `accept_tools=true`) are checked as in native mode.
//!
//! Usage: input tokens are a quarter of the request's size in bytes, output tokens a few per
//! call or per four characters of text, so clients can sum them.
//!
//! # Context window
//!
//! With `window=N`, a request that the mock counts as more than `N` tokens (a quarter of its
//! body's bytes, the figure its usage reports) is refused the way each API refuses a request
//! too large for the model, and counted in [`MockStats::context_refusals`] (the HTTP 400s in
//! `rejected` too):
//!
//! | protocol | refusal |
//! |---|---|
//! | Chat Completions | HTTP 400, `{"error": {"message": "This model's maximum context length is N tokens. However, your messages resulted in M tokens. Please reduce the length of the messages.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}` |
//! | Responses | HTTP 400 with code `context_length_exceeded` and "Your input exceeds the context window of this model. Please adjust your input and try again." (`param` `input`); streamed, status 200 with `response.created`, `response.in_progress` and an `error` event holding the same error |
//! | Anthropic | HTTP 400 `invalid_request_error`, "prompt is too long: M tokens > N maximum" |
//! | Gemini | HTTP 400 `INVALID_ARGUMENT`, "The input token count (M) exceeds the maximum number of tokens allowed (N)." |
//!
//! The check comes after the conversation's own checks and before fault draws: a request over
//! the window never draws a fault.
//!
//! A request to summarise a conversation, as toolloop's context policy compacts one (its user
//! message holds [`toolloop::context::policy::COMPACT_MARKER`] and the conversation rendered as
//! text), is answered with `Mock summary: R rounds, N tool results.`, R and N counted in the
//! rendered conversation (an earlier mock summary's included), and counted in
//! [`MockStats::summaries`]. A conversation that holds a mock summary goes on from its counts:
//! its task ends after as many rounds in all as the scenario asks, compacted or not. (The
//! counts are read from the request's body, so a new task that follows a summary starts from
//! them too.)
//!
//! # Context management by the server
//!
//! The mock applies the context management the real APIs do themselves, and reports it their
//! way (counted in [`MockStats::native_clears`] and [`MockStats::native_compactions`]):
//!
//! - Anthropic `context_management` with a `clear_tool_uses_20250919` edit (refused with a 400
//!   without the `anthropic-beta: context-management-2025-06-27` header): once the request
//!   passes the edit's `trigger` (default 100 000 input tokens), the results of all tool uses
//!   but the last `keep` (default 3; `exclude_tools` kept too) count as cleared, unless less
//!   than `clear_at_least` tokens would go. The request's tokens (for `window=` and the usage)
//!   are counted after the clearing, and the edit is reported in `context_management.
//!   applied_edits` (`cleared_tool_uses`, `cleared_input_tokens`) in the message, or in the
//!   stream's `message_delta`. The client sends the whole conversation each time, as it does
//!   to the real API.
//! - Responses `context_management: [{"type": "compaction", "compact_threshold": N}]`: a
//!   request over `N` tokens is compacted: the response starts with a `compaction` item (an
//!   opaque `encrypted_content` that carries where the task stands), and the request's tokens
//!   are counted as its instructions, tools and that item. A compaction item sent back stands
//!   for everything before it (the task goes on from it; a content the mock did not make is
//!   refused with a 400); the client may leave out what comes before it, and what it sends
//!   is counted.
//!
//! # Fault injection
//!
//! With `faults=` above 0, that share of the responses the mock would give are faults instead,
//! of a kind drawn from `fault_kinds` ([`FaultKind`] names them):
//!
//! | kind | what the client gets |
//! |---|---|
//! | `429` | HTTP 429 in the protocol's error shape, with `retry-after-ms` (the `retry_after` wait) and `Retry-After` (whole seconds, rounded up) |
//! | `500`, `503` | HTTP 500 or 503 in the protocol's error shape |
//! | `529` | HTTP 529 `overloaded_error`; drawn on the Anthropic API only (elsewhere it is left out of the draw) |
//! | `reset` | the connection is reset (RST) before any byte of the response |
//! | `reset_body` | status 200 and part of the body (cut at a point drawn from the seed), then a reset |
//! | `cut_call` | the body ends cleanly in the middle of the first tool call's arguments, or of the text when the reply has no call: an OpenAI or Anthropic stream stops after the event holding half the arguments; a Gemini stream, which sends calls whole, stops in the middle of that chunk's line; a JSON body is cut there |
//! | `malformed_json` | status 200 and a body that is not valid JSON (`{"mock_fault":malformed,…`); a stream's first event is not JSON |
//! | `slow` | the response head comes `slow_delay` late |
//!
//! Faults strike only requests the mock accepts: a request with a broken conversation still gets
//! its 400. Draws are reproducible. A request's key is a hash of its route, its model and its
//! body, with the counters of the mock's call ids masked (they change from one server run to
//! the next); the server counts how many times it has seen each key, and attempt `n` of key `k`
//! is a fault when a hash of `(seed, k, n)` falls below the share. So a retried request draws
//! anew and can succeed, and a client that sends the same requests meets the same faults on
//! every run. Requests with identical bodies share their count: give concurrent conversations
//! different text to give them their own draws. [`MockStats::faults`] counts the faults sent,
//! by kind; they are not counted as rejected.
//!
//! # What it checks
//!
//! Every tool call in the history must be answered exactly once, right after the turn that made
//! it: OpenAI by `tool` messages with the call's `tool_call_id` (the Responses API by
//! `function_call_output` items with the call's `call_id`, after the round's `function_call` items); Anthropic by `tool_result`
//! blocks (before any other content) in the next user message; Gemini by `functionResponse`
//! parts in the next content, matched by name and order. A missing, duplicated or unknown
//! result, a malformed JSON body, or a body over [`MockOptions::max_body_bytes`] gives an HTTP
//! error in that provider's error shape, with a message naming the call and what was expected.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use toolloop_mock::{MockOptions, start};
//!
//! let server = start(MockOptions::default()).await?;
//! let base_url = server.base_url(); // e.g. http://127.0.0.1:41234
//! assert!(base_url.starts_with("http://127.0.0.1:"));
//! // Point an OpenAI client at `{base_url}/v1` with model `mock:rounds=3,parallel=2`.
//! assert_eq!(server.stats().requests, 0);
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod anthropic;
mod conn;
mod engine;
mod fault;
mod gemini;
mod image;
mod native;
mod openai;
mod response;
mod responses;
mod scenario;
mod text;

pub use fault::{FaultCounts, FaultKind, FaultKinds};
pub use scenario::{
    DropTools, MAX_DELAY, MAX_PARALLEL, MAX_ROUNDS, MAX_WINDOW, Scenario, ScenarioError,
};

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use conn::{ConnHandle, ResettableListener};
use fault::FaultState;
use response::Prepared;

/// How to run the mock server.
#[derive(Debug, Clone)]
pub struct MockOptions {
    /// Port on 127.0.0.1; 0 picks any free port.
    pub port: u16,
    /// Latency for scenarios that do not set `latency=`.
    pub default_latency: Option<Duration>,
    /// Largest request body accepted; larger ones get 413. Default 32 MiB.
    pub max_body_bytes: usize,
    /// Exact calls to make, round by round, in place of the scenario's sampled ones (empty:
    /// none). Round `r` of a task makes the calls of `script[r]` (those whose tool the request
    /// offers); after the last round the mock answers. `toolloop mock --script FILE` reads it
    /// from JSON: `[[{"name": "run_command", "arguments": {"command": ["make"]}}], …]`.
    pub script: Vec<Vec<ScriptCall>>,
    /// Canned final answers by prompt (OpenAI API): when the mock would give its final answer
    /// and the task's first user message contains an entry's `when`, it answers that entry's `text`
    /// instead (the first entry that matches). For workflows whose steps read each other's
    /// output (a JSON answer, say). `toolloop mock --answers FILE` reads it from JSON:
    /// `[{"when": "Extract", "text": "{\"title\": \"Rivers\"}"}, …]`. Takes precedence over
    /// `answers`.
    pub answers_by_prompt: Vec<MockAnswer>,
    /// Exact final answers, in place of the default ones (empty: none): the `n`-th answer of a
    /// conversation (counting the assistant turns without tool calls it already holds) is
    /// `answers[n]`, and the last one repeats. A test scripts an answer that fails the output
    /// schema first, then a valid one, say.
    pub answers: Vec<String>,
}

/// A canned final answer (see [`MockOptions::answers_by_prompt`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MockAnswer {
    /// Text the task's first user message contains.
    pub when: String,
    /// The answer.
    pub text: String,
}

/// One call of a [`MockOptions::script`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScriptCall {
    /// The tool.
    pub name: String,
    /// Its arguments.
    #[serde(default)]
    pub arguments: serde_json::Value,
}

impl Default for MockOptions {
    fn default() -> Self {
        MockOptions {
            port: 0,
            default_latency: None,
            max_body_bytes: 32 * 1024 * 1024,
            script: Vec::new(),
            answers: Vec::new(),
            answers_by_prompt: Vec::new(),
        }
    }
}

/// What the server has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockStats {
    /// Requests answered, rejected ones included.
    pub requests: u64,
    /// Requests answered with a 4xx error (bad scenario, unanswered call, malformed body, …);
    /// injected faults are not counted here.
    pub rejected: u64,
    /// Injected faults, by kind (each counted once decided, before any wait).
    pub faults: FaultCounts,
    /// Server-side time spent on all requests, from the handler's start to the response head
    /// (latency included, streamed body pacing excluded).
    pub processing: Duration,
    /// The longest time spent on one request.
    pub max_processing: Duration,
    /// Accepted requests that asked for JSON matching a schema natively: OpenAI
    /// `response_format` of type `json_schema`, Anthropic `output_config.format` of type
    /// `json_schema`, Gemini `generationConfig.responseJsonSchema` (or `responseSchema`).
    pub output_schemas: u64,
    /// Requests refused for being larger than the scenario's context window (`window=`). Those
    /// refused with an HTTP 400 are counted in `rejected` too; a streamed Responses request is
    /// refused inside a 200 stream, as that API does.
    pub context_refusals: u64,
    /// Requests answered with a quirk of a real server that the scenario plays (`drop_tools`,
    /// `refuse_auto_stream`, `refuse_json_schema`, `empty_auto_answer`, `refuse_context`): a
    /// catalog dropped, an empty stream, a format refused, an empty answer, context
    /// management refused.
    pub quirks: u64,
    /// Requests to summarise a conversation (toolloop's compaction: see "Context window"),
    /// answered with a mock summary.
    pub summaries: u64,
    /// Anthropic requests whose old tool results the server cleared (`context_management`;
    /// see "Context management by the server").
    pub native_clears: u64,
    /// Responses requests the server compacted (`context_management` of type `compaction`).
    pub native_compactions: u64,
}

impl MockStats {
    /// Mean server-side time per request (zero before any request).
    pub fn mean_processing(&self) -> Duration {
        if self.requests == 0 {
            Duration::ZERO
        } else {
            self.processing / u32::try_from(self.requests).unwrap_or(u32::MAX)
        }
    }
}

/// State shared by the handlers.
pub(crate) struct Shared {
    ids: AtomicU64,
    responses: AtomicU64,
    default_latency: Duration,
    requests: AtomicU64,
    rejected: AtomicU64,
    nanos: AtomicU64,
    max_nanos: AtomicU64,
    pub(crate) faults: FaultState,
    pub(crate) script: Vec<Vec<ScriptCall>>,
    pub(crate) answers_by_prompt: Vec<MockAnswer>,
    pub(crate) answers: Vec<String>,
    output_schemas: AtomicU64,
    context_refusals: AtomicU64,
    quirks: AtomicU64,
    summaries: AtomicU64,
    native_clears: AtomicU64,
    native_compactions: AtomicU64,
}

impl Shared {
    fn new(options: &MockOptions) -> Shared {
        // Ids differ from one server run to the next, so that a conversation carried over a
        // restart does not meet its old ids again.
        let nonce = (unix_nanos() & 0xffff_ffff) << 24;
        Shared {
            ids: AtomicU64::new(nonce),
            responses: AtomicU64::new(nonce),
            default_latency: options.default_latency.unwrap_or_default(),
            requests: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            max_nanos: AtomicU64::new(0),
            faults: FaultState::default(),
            script: options.script.clone(),
            answers: options.answers.clone(),
            answers_by_prompt: options.answers_by_prompt.clone(),
            output_schemas: AtomicU64::new(0),
            context_refusals: AtomicU64::new(0),
            quirks: AtomicU64::new(0),
            summaries: AtomicU64::new(0),
            native_clears: AtomicU64::new(0),
            native_compactions: AtomicU64::new(0),
        }
    }

    /// Counts a request answered with a real server's quirk.
    pub(crate) fn saw_quirk(&self) {
        self.quirks.fetch_add(1, Ordering::Relaxed);
    }

    /// What the test scripted.
    pub(crate) fn scripted(&self) -> engine::Scripted<'_> {
        engine::Scripted {
            calls: &self.script,
            answers: &self.answers,
            summaries: Some(&self.summaries),
        }
    }

    /// Counts a request that asks for JSON matching a schema natively.
    pub(crate) fn saw_output_schema(&self) {
        self.output_schemas.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request whose old tool results the server cleared.
    pub(crate) fn count_native_clear(&self) {
        self.native_clears.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request the server compacted.
    pub(crate) fn count_native_compaction(&self) {
        self.native_compactions.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused for being larger than the context window.
    pub(crate) fn count_context_refusal(&self) {
        self.context_refusals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn next_response_id(&self) -> u64 {
        self.responses.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn latency(&self, scenario: &Scenario) -> Duration {
        scenario.latency.unwrap_or(self.default_latency)
    }

    fn record(&self, elapsed: Duration, rejected: bool) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.requests.fetch_add(1, Ordering::Relaxed);
        if rejected {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.max_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    fn stats(&self) -> MockStats {
        MockStats {
            requests: self.requests.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            faults: self.faults.counts(),
            processing: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            max_processing: Duration::from_nanos(self.max_nanos.load(Ordering::Relaxed)),
            output_schemas: self.output_schemas.load(Ordering::Relaxed),
            context_refusals: self.context_refusals.load(Ordering::Relaxed),
            quirks: self.quirks.load(Ordering::Relaxed),
            summaries: self.summaries.load(Ordering::Relaxed),
            native_clears: self.native_clears.load(Ordering::Relaxed),
            native_compactions: self.native_compactions.load(Ordering::Relaxed),
        }
    }
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(crate) fn unix_time() -> u64 {
    unix_nanos() / 1_000_000_000
}

/// A running mock server. Dropping it stops the server too (in the background); call
/// [`MockServer::shutdown`] to wait until it has stopped.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("stats", &self.stats())
            .finish()
    }
}

impl MockServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`. OpenAI clients want `{base_url}/v1`; Anthropic and Gemini
    /// clients take it as is.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Counters so far.
    pub fn stats(&self) -> MockStats {
        self.shared.stats()
    }

    /// Stops accepting connections, lets requests in flight finish, and waits for the server
    /// to stop.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("mock server stopped with an error: {e}"),
                Err(e) => tracing::warn!("mock server task failed: {e}"),
            }
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Starts the server on 127.0.0.1 and returns once it is listening.
pub async fn start(options: MockOptions) -> io::Result<MockServer> {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, options.port)).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared::new(&options));
    let app = router(shared.clone(), options.max_body_bytes);
    let listener = ResettableListener(listener);
    let app = app.into_make_service_with_connect_info::<ConnHandle>();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    Ok(MockServer {
        addr,
        shared,
        stop: Some(stop),
        task: Some(task),
    })
}

/// Runs the server until Ctrl-C, printing its address to stderr.
pub async fn serve(options: MockOptions) -> io::Result<()> {
    let server = start(options).await?;
    let base = server.base_url();
    eprintln!(
        "toolloop mock listening on {base}\n  OpenAI:    {base}/v1 (POST /v1/chat/completions)\n  \
         Anthropic: {base} (POST /v1/messages)\n  Gemini:    {base} (POST \
         /v1beta/models/MODEL:generateContent)\n  model names pick the scenario, e.g. \
         mock:rounds=3,parallel=2,latency=5ms; add faults=0.2,seed=7 for a fifth of faults; \
         Ctrl-C stops"
    );
    tokio::signal::ctrl_c().await?;
    server.shutdown().await;
    Ok(())
}

fn router(shared: Arc<Shared>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai_route))
        .route("/chat/completions", post(openai_route))
        .route("/v1/responses", post(responses_route))
        .route("/responses", post(responses_route))
        .route("/v1/messages", post(anthropic_route))
        .route("/v1beta/models/{*rest}", post(gemini_route))
        .route("/v1/models/{*rest}", post(gemini_route))
        .route("/v1/models", get(list_models))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(shared)
}

/// Waits out the latency, counts the request and builds the response.
async fn finish(
    shared: &Shared,
    started: Instant,
    prepared: Prepared,
    conn: Option<&ConnHandle>,
) -> Response {
    // Counted before the wait: a client may give up on a slow response, which drops this.
    if let Some(kind) = prepared.fault() {
        shared.faults.count(kind);
    }
    if !prepared.latency.is_zero() {
        tokio::time::sleep(prepared.latency).await;
    }
    let elapsed = started.elapsed();
    let rejected = prepared.status.is_client_error() && prepared.fault().is_none();
    shared.record(elapsed, rejected);
    prepared.into_response(elapsed, conn)
}

fn body_error(rejection: &BytesRejection) -> (StatusCode, String) {
    (
        rejection.status(),
        format!("could not read the request body: {}", rejection.body_text()),
    )
}

async fn openai_route(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let error = |status, message: &str| openai::error(status, message, None, None);
    answer_post(&shared, &conn, body, |b| openai::handle(&shared, b), error).await
}

async fn responses_route(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let error = |status, message: &str| openai::error(status, message, None, None);
    answer_post(
        &shared,
        &conn,
        body,
        |b| responses::handle(&shared, b),
        error,
    )
    .await
}

async fn anthropic_route(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let handle = |b: &Bytes| anthropic::handle(&shared, &headers, b);
    answer_post(&shared, &conn, body, handle, anthropic::error).await
}

/// A request of one wire: its body answered by `handle`, or, when the body cannot be read,
/// by the wire's `error`; then sent ([`finish`]).
async fn answer_post(
    shared: &Shared,
    conn: &ConnHandle,
    body: Result<Bytes, BytesRejection>,
    handle: impl FnOnce(&Bytes) -> Prepared,
    error: impl FnOnce(StatusCode, &str) -> Prepared,
) -> Response {
    let started = Instant::now();
    let prepared = match body {
        Ok(body) => handle(&body),
        Err(rejection) => {
            let (status, message) = body_error(&rejection);
            error(status, &message)
        }
    };
    finish(shared, started, prepared, Some(conn)).await
}

async fn gemini_route(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let prepared = gemini_prepare(&shared, path, &uri, body);
    finish(&shared, started, prepared, Some(&conn)).await
}

fn gemini_prepare(
    shared: &Shared,
    path: Result<Path<String>, PathRejection>,
    uri: &Uri,
    body: Result<Bytes, BytesRejection>,
) -> Prepared {
    let rest = match path {
        Ok(Path(rest)) => rest,
        Err(rejection) => {
            return gemini::error(
                StatusCode::BAD_REQUEST,
                &format!("bad model path: {}", rejection.body_text()),
            );
        }
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let (status, message) = body_error(&rejection);
            return gemini::error(status, &message);
        }
    };
    let (model, method) = match gemini::split_path(&rest) {
        Ok(split) => split,
        Err(prepared) => return prepared,
    };
    let sse = uri
        .query()
        .is_some_and(|q| q.split('&').any(|pair| pair == "alt=sse"));
    let method = match method {
        "generateContent" => gemini::Method::Generate,
        "streamGenerateContent" => gemini::Method::Stream { sse },
        other => {
            return gemini::error(
                StatusCode::NOT_FOUND,
                &format!(
                    "method `{other}` is not served by the mock; expected generateContent or \
                     streamGenerateContent"
                ),
            );
        }
    };
    gemini::handle(shared, model, method, &body)
}

async fn list_models() -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{"id": "mock", "object": "model", "created": 0, "owned_by": "toolloop"}],
    });
    Prepared::json(StatusCode::OK, &body).into_response(Duration::ZERO, None)
}

fn error_for_path(path: &str, status: StatusCode, message: &str) -> Prepared {
    if path.contains("/models/") && !path.contains("chat") {
        gemini::error(status, message)
    } else if path.ends_with("/messages") {
        anthropic::error(status, message)
    } else {
        openai::error(status, message, None, None)
    }
}

async fn not_found(State(shared): State<Arc<Shared>>, uri: Uri) -> Response {
    let started = Instant::now();
    let message = format!(
        "no such endpoint: {}; the mock serves POST /v1/chat/completions, POST /v1/responses, \
         POST /v1/messages and \
         POST /v1beta/models/{{model}}:generateContent / :streamGenerateContent",
        uri.path()
    );
    let prepared = error_for_path(uri.path(), StatusCode::NOT_FOUND, &message);
    finish(&shared, started, prepared, None).await
}

async fn method_not_allowed(State(shared): State<Arc<Shared>>, uri: Uri) -> Response {
    let started = Instant::now();
    let message = format!("{} accepts POST only", uri.path());
    let prepared = error_for_path(uri.path(), StatusCode::METHOD_NOT_ALLOWED, &message);
    finish(&shared, started, prepared, None).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            prop::sample::select(vec![
                "user",
                "assistant",
                "tool",
                "model",
                "function",
                "tool_use",
                "tool_result",
                "text",
                "none",
                "c1",
                "c2",
                "mock:rounds=2,parallel=3",
                "mock:rounds=x",
                "mock:text_calls=hermes,parallel=2",
                "PTK_RESULT: f (call id: c1)\nok",
                "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                "# Tools\n\nYou have access to these tools:\n\n## f\nParameters:\n  - q: string (required)\n",
                "é",
            ])
            .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "model",
                            "messages",
                            "contents",
                            "role",
                            "content",
                            "parts",
                            "tool_calls",
                            "tool_call_id",
                            "id",
                            "name",
                            "function",
                            "tools",
                            "tool_use_id",
                            "type",
                            "functionCall",
                            "functionResponse",
                            "parameters",
                            "input_schema",
                            "stream",
                            "max_tokens",
                            "functionDeclarations",
                            "tool_choice",
                            "toolConfig",
                        ]),
                        inner,
                    ),
                    0..6,
                )
                .prop_map(|pairs| {
                    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    fn all_protocols(shared: &Shared, body: &[u8]) -> Vec<StatusCode> {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", "2023-06-01".parse().unwrap());
        let mut statuses = vec![
            openai::handle(shared, body).status,
            responses::handle(shared, body).status,
            anthropic::handle(shared, &headers, body).status,
        ];
        for method in [
            gemini::Method::Generate,
            gemini::Method::Stream { sse: true },
            gemini::Method::Stream { sse: false },
        ] {
            statuses.push(gemini::handle(shared, "mock:rounds=2,parallel=2", method, body).status);
        }
        statuses
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256)) {
            let shared = Shared::new(&MockOptions::default());
            for status in all_protocols(&shared, &body) {
                prop_assert!(status == StatusCode::OK || status.is_client_error());
            }
        }

        #[test]
        fn never_panics_on_arbitrary_json(value in json_value(), wrap in 0..3u8) {
            let shared = Shared::new(&MockOptions::default());
            // Most of the time, put the value where the handlers look, so deeper code runs (in
            // native and in text-only mode).
            let model = if wrap == 1 { "mock:rounds=2,parallel=2" } else { "mock:text_calls=ptk" };
            let value = if wrap > 0 {
                json!({"model": model, "max_tokens": 5, "input": value.clone(),
                    "messages": value.clone(), "contents": value})
            } else {
                value
            };
            let body = value.to_string();
            for status in all_protocols(&shared, body.as_bytes()) {
                prop_assert!(status == StatusCode::OK || status.is_client_error());
            }
        }
    }

    #[test]
    fn every_protocol_serves_the_same_scenario() {
        let shared = Shared::new(&MockOptions::default());
        let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
        let openai = json!({"model": "mock:parallel=2", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]});
        let anthropic = json!({"model": "mock:parallel=2", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": schema}]});
        let gemini = json!({"contents": [{"parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": schema}]}]});
        let body = |p: Prepared| match p.payload {
            response::Payload::Json(bytes) => serde_json::from_slice::<Value>(&bytes).unwrap(),
            response::Payload::Sse(_) => panic!("not streamed"),
        };
        let o = body(openai::handle(&shared, openai.to_string().as_bytes()));
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", "2023-06-01".parse().unwrap());
        let a = body(anthropic::handle(
            &shared,
            &headers,
            anthropic.to_string().as_bytes(),
        ));
        let g = body(gemini::handle(
            &shared,
            "mock:parallel=2",
            gemini::Method::Generate,
            gemini.to_string().as_bytes(),
        ));
        let args: Value = serde_json::from_str(
            o["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(args, json!({"q": "a"}));
        assert_eq!(a["content"][1]["input"], args);
        assert_eq!(
            g["candidates"][0]["content"]["parts"][1]["functionCall"]["args"],
            args
        );
    }
}
