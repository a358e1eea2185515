//! Record and replay: a *cassette* holds every model request and response of a run, as the HTTP
//! transport sent and received them (keys redacted), the results of the run's tools, and the
//! run's settings; a run played back from it calls no server and runs no tool.
//!
//! Set [`HttpTransport::cassette`](super::http::HttpTransport::cassette) on a provider's
//! transport (the command: `--record FILE`, `--model replay:FILE`). Recording happens in the
//! transport every adapter's HTTP goes through, so it works alike for the four wire APIs, and
//! for streamed responses (the Server-Sent Events are kept as received, so that a replay
//! streams them again).
//!
//! # Matching
//!
//! A replayed request is matched to a recorded one by a *normalised hash*: the last segment of
//! the URL's path (`completions`, `messages`, `responses`, `<model>:streamGenerateContent`), and
//! the JSON body with its keys sorted and these volatile fields removed wherever they are, except
//! inside tool arguments and schemas: `id`, `tool_call_id`, `call_id`, `tool_use_id`, `created`,
//! `timestamp`, `user`, `metadata`, `prompt_cache_key`, `previous_response_id`. The host, the
//! headers and the query are not part of it (a replay may name another server). Two requests
//! with the same hash are answered in the order they were recorded. A request that matches
//! nothing is an error showing how it differs from the recording ([`diff`]), or, with a
//! fallback ([`Cassette::with_fallback`]), is sent to the server and appended to the cassette.
//!
//! # The file
//!
//! JSON lines, written whole to a new file renamed over the old (never a half-written
//! cassette), readable by its owner only (0600). The first line is the header,
//! `{"type": "cassette", "format": "toolloop-cassette", "version": 1, "settings": {…}}`; then,
//! in the order they happened:
//!
//! - `{"type": "exchange", "endpoint", "hash", "url", "request", "status", "body"}` for a whole
//!   response (`body`: the JSON, or the text when it is not JSON), or with `"events": [...]` in
//!   place of `body` for a streamed one (each string one event, with its blank line);
//! - `{"type": "tool", "name", "args", "output"}` (or `"error"`) for a tool's result;
//! - `{"type": "catalog", "source", "tools": [{"name", "description", "parameters",
//!   "side_effect", "parallel_safe"}]}` for the last listing of a tool source (an MCP server's
//!   tools: [`Cassette::wrap_source`]), so that a replay that starts no server offers them
//!   again ([`Cassette::replayed_source`]).
//!
//! Keys never reach the file: the credential headers are not stored, and the URL, the bodies and
//! the events go through the same [`Redactor`] as the request debug log (the request's own
//! credentials, and those given with [`Cassette::with_redactor`]). A cassette is read with a
//! size limit ([`MAX_CASSETTE_BYTES`]); one that is not a cassette, of another version, or
//! corrupt is refused with an error naming the line.

use super::request_log::{body_value, redact_text};
use crate::redact::Redactor;
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput};
use crate::tool_source::{ToolSource, ToolSourceError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The `format` of a cassette's header.
pub const FORMAT: &str = "toolloop-cassette";
/// The version of the cassette format this code writes and reads.
pub const VERSION: u32 = 1;
/// The largest cassette read (256 MiB).
pub const MAX_CASSETTE_BYTES: u64 = 256 * 1024 * 1024;
/// The volatile fields left out of a request's hash (see the [module documentation](self)).
pub const VOLATILE_FIELDS: &[&str] = &[
    "id",
    "tool_call_id",
    "call_id",
    "tool_use_id",
    "created",
    "timestamp",
    "user",
    "metadata",
    "prompt_cache_key",
    "previous_response_id",
];
/// Fields whose contents are data (tool arguments, schemas): the volatile fields are kept there.
const DATA_FIELDS: &[&str] = &[
    "input",
    "args",
    "arguments",
    "parameters",
    "properties",
    "schema",
    "json_schema",
    "input_schema",
];
/// The most differences a mismatch error lists.
const MAX_DIFF_LINES: usize = 12;
/// The most characters of a value a mismatch error shows.
const MAX_DIFF_VALUE: usize = 160;

/// One recorded model call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exchange {
    /// The last segment of the URL's path.
    pub endpoint: String,
    /// The normalised hash of the request (hex), for people: it is computed anew when a
    /// cassette is read.
    #[serde(default)]
    pub hash: String,
    /// The URL, credentials redacted.
    #[serde(default)]
    pub url: String,
    /// The request body (the JSON, redacted).
    pub request: Value,
    /// The response's HTTP status.
    pub status: u16,
    /// A whole response body: the JSON, or the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// A streamed response: its events as received, each with its blank line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
}

impl Exchange {
    /// The whole response body as bytes (the events joined, for a streamed one).
    pub fn body_bytes(&self) -> Vec<u8> {
        match (&self.body, &self.events) {
            (Some(Value::String(s)), _) => s.clone().into_bytes(),
            (Some(v), _) => serde_json::to_vec(v).unwrap_or_default(),
            (None, Some(events)) => events.concat().into_bytes(),
            (None, None) => Vec::new(),
        }
    }
}

/// One recorded tool result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolRecord {
    /// The tool's name.
    pub name: String,
    /// The call's arguments.
    pub args: Value,
    /// What it returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ToolOutput>,
    /// How it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Cassette {
        format: String,
        version: u32,
        #[serde(default)]
        settings: Value,
    },
    Exchange(Exchange),
    Tool(ToolRecord),
    Catalog(Catalog),
}

/// The tools a [`ToolSource`] (an MCP server's) offered, as the model saw them, so that a
/// replay that starts no server offers them again ([`Cassette::replayed_source`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// The source's name.
    pub source: String,
    /// Its tools, in the order it listed them.
    pub tools: Vec<ToolSpec>,
}

/// One tool of a [`Catalog`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// Its description.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of its arguments.
    #[serde(default)]
    pub parameters: Value,
    /// What its calls may change.
    #[serde(default)]
    pub side_effect: crate::tool::SideEffect,
    /// Whether its calls may run at once.
    #[serde(default)]
    pub parallel_safe: bool,
}

/// Why a cassette could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CassetteError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The cassette's path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a cassette this version reads.
    #[error("{path}: {message}")]
    Invalid {
        /// The cassette's path.
        path: PathBuf,
        /// What is wrong, naming the line.
        message: String,
    },
}

#[derive(Debug, Default)]
struct Inner {
    settings: Value,
    exchanges: Vec<Exchange>,
    /// The normalised form of each exchange's request (for matching).
    keys: Vec<String>,
    used: Vec<bool>,
    tools: Vec<ToolRecord>,
    tools_used: Vec<bool>,
    /// The tool sources' last listings, by source.
    catalogs: Vec<Catalog>,
    replayed: u64,
    write_error: Option<String>,
}

/// A cassette, recording or playing back (see the [module documentation](self)).
#[derive(Debug)]
pub struct Cassette {
    path: Option<PathBuf>,
    replay: bool,
    fallback: bool,
    redactor: Mutex<Redactor>,
    inner: Mutex<Inner>,
}

/// What [`Cassette::replay_request`] found.
#[derive(Debug)]
pub enum Replayed {
    /// The recorded exchange.
    Hit(Exchange),
    /// No recorded request matched; the message shows how the closest one differs. With a
    /// fallback, the request goes to the server.
    Miss(String),
}

impl Cassette {
    /// A cassette recording to `path`, with the run's `settings` (written at once: a path that
    /// cannot be written fails here, before the run).
    pub fn record(path: impl Into<PathBuf>, settings: Value) -> Result<Self, CassetteError> {
        let cassette = Cassette {
            path: Some(path.into()),
            ..Cassette::in_memory(settings)
        };
        let inner = cassette.lock();
        cassette.save(&inner)?;
        drop(inner);
        Ok(cassette)
    }

    /// A cassette recording in memory only (for a program that reads it with
    /// [`Cassette::to_jsonl`]).
    pub fn in_memory(settings: Value) -> Self {
        Cassette {
            path: None,
            replay: false,
            fallback: false,
            redactor: Mutex::new(Redactor::new()),
            inner: Mutex::new(Inner {
                settings,
                ..Inner::default()
            }),
        }
    }

    /// Reads the cassette at `path` for playing back, at most [`MAX_CASSETTE_BYTES`].
    pub fn load(path: impl Into<PathBuf>) -> Result<Self, CassetteError> {
        let path = path.into();
        let text = crate::user_file::read_to_string(&path, MAX_CASSETTE_BYTES).map_err(|e| {
            CassetteError::Io {
                path: path.clone(),
                source: e,
            }
        })?;
        let mut cassette = Cassette::parse(&text).map_err(|message| CassetteError::Invalid {
            path: path.clone(),
            message,
        })?;
        cassette.path = Some(path);
        Ok(cassette)
    }

    /// Reads a cassette from its text, for playing back; the error names the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut inner = Inner::default();
        let mut header = false;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Line = serde_json::from_str(line).map_err(|e| {
                format!("line {n}: not a cassette record ({e}); is it a toolloop cassette?")
            })?;
            match parsed {
                Line::Cassette {
                    format,
                    version,
                    settings,
                } => {
                    if header {
                        return Err(format!("line {n}: a second header"));
                    }
                    if format != FORMAT {
                        return Err(format!(
                            "line {n}: the format is `{}`, not `{FORMAT}`",
                            crate::redact::redact_url_credentials(&format)
                                .chars()
                                .take(60)
                                .collect::<String>()
                        ));
                    }
                    if version != VERSION {
                        return Err(format!(
                            "line {n}: version {version}; this toolloop reads version {VERSION}"
                        ));
                    }
                    header = true;
                    inner.settings = settings;
                }
                _ if !header => {
                    return Err(format!(
                        "line {n}: no header: a cassette begins with \
                         {{\"type\": \"cassette\", \"format\": \"{FORMAT}\", …}}"
                    ));
                }
                Line::Exchange(mut ex) => {
                    let key = normalise(&ex.endpoint, &ex.request);
                    ex.hash = hash_hex(&key);
                    inner.keys.push(key);
                    inner.used.push(false);
                    inner.exchanges.push(ex);
                }
                Line::Tool(t) => {
                    inner.tools.push(t);
                    inner.tools_used.push(false);
                }
                Line::Catalog(c) => {
                    inner.catalogs.retain(|k| k.source != c.source);
                    inner.catalogs.push(c);
                }
            }
        }
        if !header {
            return Err("empty: no cassette header".into());
        }
        Ok(Cassette {
            path: None,
            replay: true,
            fallback: false,
            redactor: Mutex::new(Redactor::new()),
            inner: Mutex::new(inner),
        })
    }

    /// Playing back: a request that matches nothing is sent to the server (the transport's
    /// base URL) and appended to the cassette, instead of failing.
    pub fn with_fallback(mut self, fallback: bool) -> Self {
        self.fallback = fallback;
        self
    }

    /// Secrets to redact from what is recorded, besides each request's own credentials.
    pub fn with_redactor(self, redactor: Redactor) -> Self {
        *self.redactor.lock().unwrap_or_else(|e| e.into_inner()) = redactor;
        self
    }

    /// Adds a secret to redact from what is recorded from now on (a key known only once the
    /// model is built).
    pub fn add_secret(&self, secret: &str) {
        self.redactor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_secret(secret);
    }

    fn own_redactor(&self) -> Redactor {
        self.redactor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the cassette plays back (else it records).
    pub fn is_replay(&self) -> bool {
        self.replay
    }

    /// Whether a request that matches nothing goes to the server.
    pub fn has_fallback(&self) -> bool {
        self.fallback
    }

    /// The run's settings, as recorded.
    pub fn settings(&self) -> Value {
        self.lock().settings.clone()
    }

    /// The recorded model calls.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.lock().exchanges.clone()
    }

    /// The recorded tool results.
    pub fn tool_records(&self) -> Vec<ToolRecord> {
        self.lock().tools.clone()
    }

    /// How many requests were answered from the cassette.
    pub fn replayed(&self) -> u64 {
        self.lock().replayed
    }

    /// Why the cassette could not be written, when it could not (a run does not fail for it).
    pub fn write_error(&self) -> Option<String> {
        self.lock().write_error.clone()
    }

    /// The cassette as its file's text.
    pub fn to_jsonl(&self) -> String {
        render(&self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The recorded exchange for a request to `url` with `body`, the first not yet replayed
    /// with the same normalised hash.
    pub fn replay_request(&self, url: &str, body: &[u8]) -> Replayed {
        let endpoint = endpoint_of(url);
        let request = serde_json::from_slice::<Value>(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
        let key = normalise(&endpoint, &request);
        let mut inner = self.lock();
        let found = (0..inner.exchanges.len()).find(|&i| !inner.used[i] && inner.keys[i] == key);
        if let Some(i) = found {
            inner.used[i] = true;
            inner.replayed += 1;
            return Replayed::Hit(inner.exchanges[i].clone());
        }
        let total = inner.exchanges.len();
        let closest = (0..total)
            .find(|&i| !inner.used[i] && inner.exchanges[i].endpoint == endpoint)
            .or_else(|| (0..total).find(|&i| !inner.used[i]));
        let hash = hash_hex(&key);
        let message = match closest {
            None => format!(
                "the request ({endpoint}, hash {hash}) is not in the cassette: all {total} \
                 recorded requests were replayed already"
            ),
            Some(i) => {
                let recorded = &inner.exchanges[i];
                let mut lines = Vec::new();
                diff_into(
                    "",
                    &strip(&recorded.request, false),
                    &strip(&request, false),
                    &mut lines,
                );
                if recorded.endpoint != endpoint {
                    lines.insert(
                        0,
                        format!(
                            "  endpoint: recorded `{}`, now `{endpoint}`",
                            recorded.endpoint
                        ),
                    );
                }
                let more = lines.len().saturating_sub(MAX_DIFF_LINES);
                lines.truncate(MAX_DIFF_LINES);
                if more > 0 {
                    lines.push(format!("  … and {more} more differences"));
                }
                format!(
                    "the request ({endpoint}, hash {hash}) differs from the recording (recorded \
                     request {} of {total}, not yet replayed):\n{}",
                    i + 1,
                    lines.join("\n")
                )
            }
        };
        Replayed::Miss(self.own_redactor().redact(&message))
    }

    /// Records a whole response to a request (status 2xx), keys redacted with `redactor` and
    /// the cassette's own.
    pub(crate) fn record_body(
        &self,
        url: &str,
        request: &[u8],
        status: u16,
        body: &[u8],
        redactor: &Redactor,
    ) {
        let body = body_value(body, redactor);
        let body = redact_json(&self.own_redactor(), body);
        self.push(url, request, status, Some(body), None, redactor);
    }

    /// Records a streamed response, `stream` being every byte received.
    pub(crate) fn record_stream(
        &self,
        url: &str,
        request: &[u8],
        status: u16,
        stream: &[u8],
        redactor: &Redactor,
    ) {
        let text = redact_text(&String::from_utf8_lossy(stream), redactor);
        let text = self.own_redactor().redact(&text);
        self.push(
            url,
            request,
            status,
            None,
            Some(split_events(&text)),
            redactor,
        );
    }

    fn push(
        &self,
        url: &str,
        request: &[u8],
        status: u16,
        body: Option<Value>,
        events: Option<Vec<String>>,
        redactor: &Redactor,
    ) {
        let endpoint = endpoint_of(url);
        let own = self.own_redactor();
        let request = redact_json(&own, body_value(request, redactor));
        let key = normalise(&endpoint, &request);
        let exchange = Exchange {
            hash: hash_hex(&key),
            endpoint,
            url: own.redact(&redactor.redact(url)),
            request,
            status,
            body,
            events,
        };
        let mut inner = self.lock();
        inner.exchanges.push(exchange);
        inner.keys.push(key);
        // Appended by a fallback: not to be replayed again in this run.
        inner.used.push(self.replay);
        let _ = self
            .save(&inner)
            .map_err(|e| inner.write_error = Some(e.to_string()));
    }

    /// The recorded result of a call of tool `name` with `args`: the first not yet replayed.
    pub fn replay_tool(&self, name: &str, args: &Value) -> Option<Result<ToolOutput, ToolError>> {
        let want = crate::message::canonical_json(args);
        let mut inner = self.lock();
        let i = (0..inner.tools.len()).find(|&i| {
            !inner.tools_used[i]
                && inner.tools[i].name == name
                && crate::message::canonical_json(&inner.tools[i].args) == want
        })?;
        inner.tools_used[i] = true;
        let t = &inner.tools[i];
        Some(match (&t.output, &t.error) {
            (_, Some(e)) => Err(e.clone()),
            (Some(o), None) => Ok(o.clone()),
            (None, None) => Ok(ToolOutput::default()),
        })
    }

    /// Records a tool's result, secrets redacted.
    pub fn record_tool(&self, name: &str, args: &Value, result: &Result<ToolOutput, ToolError>) {
        let own = self.own_redactor();
        let redact = |v: Value| redact_json(&own, v);
        let (output, error) = match result {
            Ok(o) => (
                serde_json::to_value(o)
                    .ok()
                    .map(redact)
                    .and_then(|v| serde_json::from_value(v).ok()),
                None,
            ),
            Err(e) => (
                None,
                serde_json::to_value(e)
                    .ok()
                    .map(redact)
                    .and_then(|v| serde_json::from_value(v).ok()),
            ),
        };
        let record = ToolRecord {
            name: name.to_string(),
            args: redact(args.clone()),
            output,
            error,
        };
        let mut inner = self.lock();
        inner.tools.push(record);
        inner.tools_used.push(true);
        let _ = self
            .save(&inner)
            .map_err(|e| inner.write_error = Some(e.to_string()));
    }

    /// The tools that the source named `source` offered in the recording (its last listing).
    pub fn catalog(&self, source: &str) -> Option<Catalog> {
        self.lock()
            .catalogs
            .iter()
            .find(|c| c.source == source)
            .cloned()
    }

    /// Records what `tools` of the source `source` are (their definitions, secrets redacted),
    /// replacing the source's earlier listing.
    pub fn record_catalog(&self, source: &str, tools: &[Arc<dyn Tool>]) {
        let own = self.own_redactor();
        let catalog = Catalog {
            source: source.to_string(),
            tools: tools
                .iter()
                .map(|t| ToolSpec {
                    name: t.name().to_string(),
                    description: own.redact(t.description()),
                    parameters: redact_json(&own, t.parameters().clone()),
                    side_effect: t.side_effect(),
                    parallel_safe: t.parallel_safe(),
                })
                .collect(),
        };
        let mut inner = self.lock();
        if inner.catalogs.contains(&catalog) {
            return;
        }
        inner.catalogs.retain(|c| c.source != source);
        inner.catalogs.push(catalog);
        let _ = self
            .save(&inner)
            .map_err(|e| inner.write_error = Some(e.to_string()));
    }

    /// `source` (an MCP server's tools, say), its listings recorded as a [`Catalog`] and its
    /// tools' results recorded in the cassette ([`Cassette::wrap_tool`]). Playing back, the
    /// source is returned as it is (its tools run live); see [`Cassette::replayed_source`] for
    /// a replay that starts nothing.
    pub fn wrap_source(self: &Arc<Self>, source: Arc<dyn ToolSource>) -> Arc<dyn ToolSource> {
        if self.is_replay() {
            return source;
        }
        Arc::new(RecordedSource {
            inner: source,
            cassette: self.clone(),
        })
    }

    /// The tools the source named `source` offered in the recording, each answering its calls
    /// from the cassette and running nothing (a call the cassette does not hold fails); `None`
    /// when the cassette holds no listing of that source.
    pub fn replayed_source(self: &Arc<Self>, source: &str) -> Option<Arc<dyn ToolSource>> {
        let catalog = self.catalog(source)?;
        let tools = catalog
            .tools
            .into_iter()
            .map(|spec| {
                self.wrap_tool(
                    Arc::new(RecordedDefinition {
                        spec,
                        cassette: self.clone(),
                    }),
                    true,
                )
            })
            .collect();
        Some(Arc::new(ReplayedSource {
            name: source.to_string(),
            tools,
        }))
    }

    /// `tool`, its calls recorded in the cassette, or, with `replay_tools`, answered from it
    /// without running the tool (a call the cassette does not hold fails, and runs nothing).
    pub fn wrap_tool(self: &Arc<Self>, tool: Arc<dyn Tool>, replay_tools: bool) -> Arc<dyn Tool> {
        Arc::new(RecordedTool {
            inner: tool,
            cassette: self.clone(),
            replay: replay_tools,
        })
    }

    /// Writes the whole cassette to a new file renamed over the old one, mode 0600.
    fn save(&self, inner: &Inner) -> Result<(), CassetteError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let at = |source: std::io::Error| CassetteError::Io {
            path: path.clone(),
            source,
        };
        write_atomic(path, render(inner).as_bytes()).map_err(at)
    }
}

fn render(inner: &Inner) -> String {
    let mut out = String::new();
    let header = json!({
        "type": "cassette",
        "format": FORMAT,
        "version": VERSION,
        "settings": inner.settings,
    });
    out.push_str(&header.to_string());
    out.push('\n');
    // Model calls and tool results interleave in a run; they are written in groups (calls,
    // tool results, tool listings), which replay does not mind (each is matched on its own).
    let lines = (inner.exchanges.iter().cloned().map(Line::Exchange))
        .chain(inner.tools.iter().cloned().map(Line::Tool))
        .chain(inner.catalogs.iter().cloned().map(Line::Catalog));
    for line in lines {
        let line = serde_json::to_value(line).unwrap_or(Value::Null);
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// Writes `bytes` to a new file beside `path` (mode 0600), then renames it over `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cassette".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::now_v7().simple()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let result = (|| {
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn redact_json(redactor: &Redactor, mut value: Value) -> Value {
    if !redactor.is_empty() {
        crate::redact::redact_json_value(redactor, &mut value);
    }
    value
}

/// A stream's text cut into its events, each with the blank line that ends it (joined, they
/// give the text back).
fn split_events(text: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("\n\n") {
        events.push(rest[..i + 2].to_string());
        rest = &rest[i + 2..];
    }
    if !rest.is_empty() {
        events.push(rest.to_string());
    }
    events
}

/// The last segment of a URL's path (`completions`, `messages`, `gemini-x:generateContent`).
pub fn endpoint_of(url: &str) -> String {
    let path = match reqwest::Url::parse(url) {
        Ok(u) => u.path().to_string(),
        Err(_) => url.split(['?', '#']).next().unwrap_or("").to_string(),
    };
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string()
}

/// The normalised form of a request: its endpoint and its body, keys sorted, volatile fields
/// removed ([`VOLATILE_FIELDS`]).
pub fn normalise(endpoint: &str, body: &Value) -> String {
    format!(
        "{endpoint}\n{}",
        crate::message::canonical_json(&strip(body, false))
    )
}

/// The normalised hash of a request (64-bit FNV-1a of [`normalise`], in hex): stable across
/// versions and machines.
pub fn request_hash(url: &str, body: &[u8]) -> String {
    let request = serde_json::from_slice::<Value>(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
    hash_hex(&normalise(&endpoint_of(url), &request))
}

fn hash_hex(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `value` without the volatile fields (kept inside data: tool arguments, schemas).
fn strip(value: &Value, in_data: bool) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                if !in_data && VOLATILE_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                out.insert(
                    k.clone(),
                    strip(v, in_data || DATA_FIELDS.contains(&k.as_str())),
                );
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| strip(v, in_data)).collect()),
        other => other.clone(),
    }
}

/// How `now` differs from `recorded`, a line per difference with its JSON path, values cut
/// short; at most `MAX_DIFF_LINES` lines.
pub fn diff(recorded: &Value, now: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    diff_into("", recorded, now, &mut lines);
    lines.truncate(MAX_DIFF_LINES);
    lines
}

/// The differences at `path`, where the recording has `a` and the request now has `b` (either
/// may be absent).
fn diff_entry(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
    match (a, b) {
        (Some(x), Some(y)) => diff_into(path, x, y, out),
        (Some(x), None) => out.push(format!("  {path}: recorded {}, now absent", show(x))),
        (None, Some(y)) => out.push(format!(
            "  {path}: absent in the recording, now {}",
            show(y)
        )),
        (None, None) => {}
    }
}

fn diff_into(path: &str, recorded: &Value, now: &Value, out: &mut Vec<String>) {
    if out.len() > MAX_DIFF_LINES * 4 {
        return;
    }
    let at = |p: &str| {
        if p.is_empty() {
            "(body)".to_string()
        } else {
            p.to_string()
        }
    };
    match (recorded, now) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_entry(&p, a.get(k), b.get(k), out);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let p = format!("{path}[{i}]");
                diff_entry(&p, a.get(i), b.get(i), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!(
            "  {}: recorded {}, now {}",
            at(path),
            show(a),
            show(b)
        )),
    }
}

fn show(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() <= MAX_DIFF_VALUE {
        return text;
    }
    let cut: String = text.chars().take(MAX_DIFF_VALUE).collect();
    format!("{cut}… ({} characters)", text.chars().count())
}

/// A tool whose calls a cassette records, or answers ([`Cassette::wrap_tool`]).
struct RecordedTool {
    inner: Arc<dyn Tool>,
    cassette: Arc<Cassette>,
    replay: bool,
}

#[async_trait::async_trait]
impl Tool for RecordedTool {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn parameters(&self) -> &Value {
        self.inner.parameters()
    }
    fn parallel_safe(&self) -> bool {
        self.inner.parallel_safe()
    }
    fn terminal(&self) -> bool {
        self.inner.terminal()
    }
    fn side_effect(&self) -> crate::tool::SideEffect {
        self.inner.side_effect()
    }
    fn approval_subject(&self, args: &Value) -> crate::approval::Subject {
        self.inner.approval_subject(args)
    }
    fn default_approval(&self) -> crate::approval::Action {
        self.inner.default_approval()
    }
    fn approval_required(&self, args: &Value) -> bool {
        self.inner.approval_required(args)
    }
    fn sub_agent(&self) -> Option<&crate::subagent::SubAgent> {
        self.inner.sub_agent()
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if self.replay {
            return match self.cassette.replay_tool(self.inner.name(), &args) {
                Some(result) => result,
                None => Err(ToolError::new(format!(
                    "this call of `{}` is not in the cassette (replaying tools: nothing was \
                     run)",
                    self.inner.name()
                ))),
            };
        }
        let result = self.inner.call(args.clone(), ctx).await;
        self.cassette.record_tool(self.inner.name(), &args, &result);
        result
    }
}

/// A tool source whose listings and results are recorded.
struct RecordedSource {
    inner: Arc<dyn ToolSource>,
    cassette: Arc<Cassette>,
}

#[async_trait::async_trait]
impl ToolSource for RecordedSource {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> u64 {
        self.inner.version()
    }
    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        let tools = self.inner.tools(reserved).await?;
        self.cassette.record_catalog(self.inner.name(), &tools);
        Ok(tools
            .into_iter()
            .map(|t| self.cassette.wrap_tool(t, false))
            .collect())
    }
}

/// The tools of a recorded [`Catalog`], which never change.
struct ReplayedSource {
    name: String,
    tools: Vec<Arc<dyn Tool>>,
}

#[async_trait::async_trait]
impl ToolSource for ReplayedSource {
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> u64 {
        0
    }
    async fn tools(&self, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
        Ok(self
            .tools
            .iter()
            .filter(|t| !reserved.contains(&t.name()))
            .cloned()
            .collect())
    }
}

/// A recorded tool definition; its calls are answered by the [`RecordedTool`] around it.
struct RecordedDefinition {
    spec: ToolSpec,
    cassette: Arc<Cassette>,
}

#[async_trait::async_trait]
impl Tool for RecordedDefinition {
    fn name(&self) -> &str {
        &self.spec.name
    }
    fn description(&self) -> &str {
        &self.spec.description
    }
    fn parameters(&self) -> &Value {
        &self.spec.parameters
    }
    fn parallel_safe(&self) -> bool {
        self.spec.parallel_safe
    }
    fn side_effect(&self) -> crate::tool::SideEffect {
        self.spec.side_effect
    }
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        // Never reached: the wrapper answers from the cassette. Answer from it all the same.
        self.cassette
            .replay_tool(&self.spec.name, &args)
            .unwrap_or_else(|| Err(ToolError::new("this call is not in the cassette")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sources_tools_are_recorded_and_offered_again_on_replay() {
        struct Echo(Value);
        #[async_trait::async_trait]
        impl Tool for Echo {
            fn name(&self) -> &str {
                "echo"
            }
            fn description(&self) -> &str {
                "Gives back the text."
            }
            fn parameters(&self) -> &Value {
                &self.0
            }
            fn side_effect(&self) -> crate::tool::SideEffect {
                crate::tool::SideEffect::ReadOnly
            }
            async fn call(&self, args: Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
                Ok(ToolOutput {
                    message: format!("echo {args}"),
                    ..ToolOutput::default()
                })
            }
        }
        struct Source(Vec<Arc<dyn Tool>>);
        #[async_trait::async_trait]
        impl ToolSource for Source {
            fn name(&self) -> &str {
                "mcp"
            }
            fn version(&self) -> u64 {
                1
            }
            async fn tools(&self, _: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
                Ok(self.0.clone())
            }
        }
        let schema = json!({"type": "object", "properties": {"t": {"type": "integer"}}});
        let recording = Arc::new(Cassette::in_memory(json!({})));
        let source = recording.wrap_source(Arc::new(Source(vec![Arc::new(Echo(schema.clone()))])));
        let ctx = || ToolContext::detached("c1", "echo");
        let live = source.tools(&[]).await.unwrap();
        let out = live[0].call(json!({"t": 1}), ctx()).await.unwrap();
        assert_eq!(out.message, "echo {\"t\":1}");

        let replay = Arc::new(Cassette::parse(&recording.to_jsonl()).unwrap());
        assert!(replay.replayed_source("other").is_none());
        let source = replay.replayed_source("mcp").unwrap();
        let tools = source.tools(&[]).await.unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name(), "echo");
        assert_eq!(tools[0].description(), "Gives back the text.");
        assert_eq!(tools[0].parameters(), &schema);
        assert_eq!(tools[0].side_effect(), crate::tool::SideEffect::ReadOnly);
        let again = tools[0].call(json!({"t": 1}), ctx()).await.unwrap();
        assert_eq!(again.message, out.message);
        // Another call is not in the cassette, and the recorded one is answered once.
        assert!(tools[0].call(json!({"t": 2}), ctx()).await.is_err());
        assert!(tools[0].call(json!({"t": 1}), ctx()).await.is_err());
        // A name the agent's own tools take is left out.
        assert!(source.tools(&["echo"]).await.unwrap().is_empty());
    }

    #[test]
    fn a_sources_listing_is_recorded_with_its_secrets_redacted() {
        struct Keyed(Value);
        #[async_trait::async_trait]
        impl Tool for Keyed {
            fn name(&self) -> &str {
                "fetch"
            }
            fn description(&self) -> &str {
                "Fetches with the token sk-live-0123456789abcdef."
            }
            fn parameters(&self) -> &Value {
                &self.0
            }
            async fn call(&self, _: Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
                Ok(ToolOutput::default())
            }
        }
        let secret = "sk-live-0123456789abcdef";
        let schema = json!({"type": "object", "properties": {"token": {"default": secret}}});
        let cassette =
            Cassette::in_memory(json!({})).with_redactor(Redactor::new().with_secret(secret));
        let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Keyed(schema))];
        cassette.record_catalog("mcp", &tools);
        let text = cassette.to_jsonl();
        assert!(
            text.contains("\"catalog\"") && text.contains("Fetches with"),
            "{text}"
        );
        assert!(!text.contains(secret), "{text}");
    }

    #[test]
    fn events_split_and_join_back() {
        let text = "data: a\n\ndata: b\n\n: keep\n\ndata: [DONE]";
        let events = split_events(text);
        assert_eq!(events.len(), 4);
        assert_eq!(events.concat(), text);
    }

    #[test]
    fn endpoints() {
        assert_eq!(endpoint_of("http://h:1/v1/chat/completions"), "completions");
        assert_eq!(
            endpoint_of("http://h/v1beta/models/g-2:streamGenerateContent?alt=sse"),
            "g-2:streamGenerateContent"
        );
    }

    #[test]
    fn hostile_cassettes_are_refused_with_the_line() {
        for (text, want) in [
            ("", "empty"),
            ("not json", "line 1"),
            (
                r#"{"type":"exchange","endpoint":"x","request":{},"status":200}"#,
                "no header",
            ),
            (
                r#"{"type":"cassette","format":"other","version":1}"#,
                "format",
            ),
            (
                r#"{"type":"cassette","format":"toolloop-cassette","version":99}"#,
                "version 99",
            ),
            (
                "{\"type\":\"cassette\",\"format\":\"toolloop-cassette\",\"version\":1}\n{\"type\":\"exchange\"}",
                "line 2",
            ),
        ] {
            let e = Cassette::parse(text).expect_err(text);
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
