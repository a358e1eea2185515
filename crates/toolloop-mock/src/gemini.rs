//! Gemini, server side: `POST /v1beta/models/{model}:generateContent` and
//! `:streamGenerateContent` (SSE with `?alt=sse`, else a JSON array of responses).

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Shared;
use super::engine::{self, Ledger, OfferedTool, Problem, Progress, Reply, Str, pieces};
use super::fault::{Drawn, Protocol};
use super::response::{ArgsOnWire, Payload, Prepared, SseWriter};
use super::scenario::Scenario;

/// Which method the path asked for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Generate,
    Stream { sse: bool },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    #[serde(borrow)]
    contents: Vec<InContent<'a>>,
    #[serde(default, borrow)]
    tools: Option<Vec<InTool<'a>>>,
    #[serde(default, borrow)]
    tool_config: Option<ToolConfig<'a>>,
    #[serde(default)]
    generation_config: Option<Value>,
}

impl Request<'_> {
    /// The JSON Schema the answer must match (`responseJsonSchema`, or `responseSchema`), when
    /// the request asks for one; an error when it does without `responseMimeType`
    /// `application/json`, as Gemini refuses it.
    fn output_schema(&self) -> Result<Option<&Value>, Prepared> {
        let Some(config) = self.generation_config.as_ref() else {
            return Ok(None);
        };
        let schema = config
            .get("responseJsonSchema")
            .or_else(|| config.get("responseSchema"));
        let Some(schema) = schema else {
            return Ok(None);
        };
        if config.get("responseMimeType").and_then(Value::as_str) != Some("application/json") {
            return Err(bad(
                "generation_config.response_mime_type: a response schema needs \
                 response_mime_type application/json",
            ));
        }
        Ok(Some(schema))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    #[serde(default, borrow)]
    function_calling_config: Option<FunctionCallingConfig<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FunctionCallingConfig<'a> {
    #[serde(default, borrow)]
    mode: Option<Str<'a>>,
    #[serde(default, borrow)]
    allowed_function_names: Option<Vec<Str<'a>>>,
}

#[derive(Deserialize)]
struct InContent<'a> {
    #[serde(default, borrow)]
    role: Option<Str<'a>>,
    #[serde(default, borrow)]
    parts: Vec<InPart<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InPart<'a> {
    #[serde(default, borrow)]
    function_call: Option<FunctionRef<'a>>,
    #[serde(default, borrow)]
    function_response: Option<FunctionRef<'a>>,
    #[serde(default)]
    inline_data: Option<Value>,
    #[serde(default)]
    file_data: Option<Value>,
}

impl InPart<'_> {
    /// Checks an image part (`inlineData` with base64 `data` of its `mimeType`, or `fileData`
    /// with an http(s) `fileUri`); whether this is one.
    fn image(&self) -> Result<bool, String> {
        let field = |part: &Value, name: &str| {
            part.get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("missing `{name}`"))
        };
        if let Some(inline) = &self.inline_data {
            let mime = field(inline, "mimeType")?;
            super::image::check_data(&mime, &field(inline, "data")?)?;
            return Ok(true);
        }
        if let Some(file) = &self.file_data {
            super::image::check_web_url(&field(file, "fileUri")?)?;
            return Ok(true);
        }
        Ok(false)
    }
}

#[derive(Deserialize)]
struct FunctionRef<'a> {
    #[serde(borrow)]
    name: Str<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InTool<'a> {
    #[serde(default, borrow)]
    function_declarations: Option<Vec<Declaration<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Declaration<'a> {
    #[serde(borrow)]
    name: Str<'a>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    parameters_json_schema: Option<Value>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: u16,
    message: &'a str,
    status: &'static str,
}

/// An error in Google's shape.
pub(crate) fn error(status: StatusCode, message: &str) -> Prepared {
    let name = match status.as_u16() {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 => "METHOD_NOT_ALLOWED",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        500..=599 => "INTERNAL",
        _ => "INVALID_ARGUMENT",
    };
    Prepared::json(
        status,
        &ErrorBody {
            error: ErrorDetail {
                code: status.as_u16(),
                message,
                status: name,
            },
        },
    )
}

fn bad(message: &str) -> Prepared {
    error(StatusCode::BAD_REQUEST, message)
}

/// Splits `models/{model}:{method}` (the part after `models/`) into the model and the method;
/// `None` when the method is not one the mock serves.
pub(crate) fn split_path(rest: &str) -> Result<(&str, &str), Prepared> {
    match rest.rsplit_once(':') {
        Some((model, method)) if !model.is_empty() => Ok((model, method)),
        _ => Err(error(
            StatusCode::NOT_FOUND,
            &format!(
                "models/{rest} is not a method path; expected models/{{model}}:generateContent \
                 or models/{{model}}:streamGenerateContent"
            ),
        )),
    }
}

/// Answers one request body for `model`.
pub(crate) fn handle(shared: &Shared, model: &str, method: Method, body: &[u8]) -> Prepared {
    let request: Request<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad(&format!("Invalid JSON payload received. {e}")),
    };
    let scenario = match engine::native_scenario(model) {
        Ok(s) => s,
        Err(message) => return bad(&message),
    };
    let progress = match walk(&request.contents) {
        Ok(p) => engine::read_summaries(p, body),
        Err(prepared) => return prepared,
    };
    let output = match request.output_schema() {
        Ok(o) => o.cloned().map(|mut schema| {
            lowercase_types(&mut schema, 0);
            schema
        }),
        Err(prepared) => return prepared,
    };
    if let Some((tokens, window)) = engine::over_window(shared, &scenario, body.len()) {
        return bad(&format!(
            "The input token count ({tokens}) exceeds the maximum number of tokens allowed \
             ({window})."
        ));
    }
    if output.is_some() {
        shared.saw_output_schema();
    }
    // The body does not name the model, and both methods take the same body: the route does.
    let route = match method {
        Method::Generate => format!("gemini:{model}:generateContent"),
        Method::Stream { sse } => format!("gemini:{model}:streamGenerateContent:{sse}"),
    };
    let fault = shared
        .faults
        .draw(&scenario, Protocol::Gemini, &route, body);
    if let Some(early) = fault.and_then(|d| Prepared::early_fault(d, &scenario, error)) {
        return early;
    }
    let config = request
        .tool_config
        .as_ref()
        .and_then(|c| c.function_calling_config.as_ref());
    let allow = config
        .and_then(|c| c.mode.as_deref())
        .is_none_or(|m| !m.eq_ignore_ascii_case("none"));
    let allowed = config.and_then(|c| c.allowed_function_names.as_deref());
    let mut schemas: Vec<(&str, Option<Value>)> = request
        .tools
        .iter()
        .flatten()
        .filter(|_| allow)
        .flat_map(|t| t.function_declarations.iter().flatten())
        .filter(|d| allowed.is_none_or(|names| names.contains(&d.name)))
        .map(|d| {
            let schema = d.parameters_json_schema.as_ref().or(d.parameters.as_ref());
            (d.name.as_ref(), schema.cloned())
        })
        .collect();
    // Gemini's OpenAPI-style schemas may spell types in capitals (`OBJECT`, `STRING`).
    for (_, schema) in &mut schemas {
        if let Some(schema) = schema {
            lowercase_types(schema, 0);
        }
    }
    let tools: Vec<OfferedTool<'_>> = schemas
        .iter()
        .map(|(name, schema)| OfferedTool {
            name,
            schema: schema.as_ref(),
        })
        .collect();
    let turn = Turn {
        progress,
        body_len: body.len(),
        fault,
        output,
    };
    reply(shared, model, method, &scenario, &tools, turn)
}

/// Where the conversation stands, the request's size, and the fault drawn for the reply.
struct Turn {
    progress: Progress,
    body_len: usize,
    fault: Option<Drawn>,
    /// The JSON Schema the answer must match, when the request asks for one.
    output: Option<Value>,
}

fn lowercase_types(schema: &mut Value, depth: usize) {
    if depth > 32 {
        return;
    }
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match (key.as_str(), &mut *value) {
                    ("type", Value::String(t)) => t.make_ascii_lowercase(),
                    _ => lowercase_types(value, depth + 1),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                lowercase_types(item, depth + 1);
            }
        }
        _ => {}
    }
}

/// Checks that the `functionCall` parts of each model turn are answered, one
/// `functionResponse` each (matched by name, in order), in the next content; and works out
/// where the task stands.
fn walk(contents: &[InContent<'_>]) -> Result<Progress, Prepared> {
    if contents.is_empty() {
        return Err(bad(
            "* GenerateContentRequest.contents: contents is not specified",
        ));
    }
    let mut progress = Progress::default();
    let mut ledger = Ledger::default();
    for (i, content) in contents.iter().enumerate() {
        let role = content.role.as_deref().unwrap_or("user");
        match role {
            "model" => {
                if ledger.is_open() {
                    close(&mut ledger, i)?;
                }
                let calls = content
                    .parts
                    .iter()
                    .filter_map(|p| p.function_call.as_ref());
                if calls.clone().next().is_some() {
                    let keys = calls.map(|c| (c.name.as_ref(), c.name.as_ref()));
                    // Keys are names, which may repeat: no uniqueness to check.
                    let _ = ledger.open(i, keys, false);
                    progress.tool_calls();
                } else {
                    progress.assistant_text();
                }
            }
            "user" | "function" => {
                let answering = ledger.is_open();
                let turn = ledger.turn;
                let mut results = 0;
                let mut images = 0u32;
                for (j, part) in content.parts.iter().enumerate() {
                    match part.image() {
                        Ok(true) => images = images.saturating_add(1),
                        Ok(false) => {}
                        Err(e) => {
                            return Err(bad(&format!("contents[{i}].parts[{j}]: {e}")));
                        }
                    }
                    let Some(response) = &part.function_response else {
                        continue;
                    };
                    let name = response.name.as_ref();
                    if !answering {
                        return Err(bad(&format!(
                            "contents[{i}].parts[{j}]: functionResponse `{name}` does not follow \
                             a model turn with function calls. Please ensure that function \
                             response turn comes immediately after a function call turn."
                        )));
                    }
                    match ledger.answer_by_name(name) {
                        Ok(()) => results += 1,
                        Err(Problem::Twice(_)) => {
                            return Err(bad(&format!(
                                "contents[{i}].parts[{j}]: functionResponse `{name}` answers more \
                                 calls than contents[{turn}] made to `{name}`. Please ensure that \
                                 the number of function response parts is equal to the number \
                                 of function call parts of the function call turn."
                            )));
                        }
                        Err(_) => {
                            return Err(bad(&format!(
                                "contents[{i}].parts[{j}]: functionResponse `{name}` matches no \
                                 functionCall of contents[{turn}]; each response must name a \
                                 function the previous turn called."
                            )));
                        }
                    }
                }
                if answering {
                    close(&mut ledger, i)?;
                    for _ in 0..results {
                        progress.tool_result();
                    }
                } else {
                    progress.user_text();
                }
                progress.user_images(images);
            }
            other => {
                return Err(bad(&format!(
                    "contents[{i}].role: expected `user` or `model`, got `{other}`"
                )));
            }
        }
    }
    if ledger.is_open() {
        close(&mut ledger, contents.len())?;
    }
    Ok(progress)
}

fn close(ledger: &mut Ledger<'_>, at: usize) -> Result<(), Prepared> {
    let turn = ledger.turn;
    match ledger.close() {
        Ok(()) => Ok(()),
        Err(Problem::Missing(names)) => Err(bad(&format!(
            "Please ensure that the number of function response parts is equal to the number of \
             function call parts of the function call turn. contents[{turn}] calls {} without a \
             functionResponse in contents[{at}].",
            engine::join(&names)
        ))),
        Err(other) => Err(bad(&format!("contents[{turn}]: {other:?}"))),
    }
}

// ---- responses ----

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    candidates: [Candidate<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_metadata: Option<UsageMetadata>,
    model_version: &'a str,
    response_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    content: OutContent<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'static str>,
    index: u32,
}

#[derive(Serialize)]
struct OutContent<'a> {
    parts: Vec<OutPart<'a>>,
    role: &'static str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutPart<'a> {
    Text {
        text: &'a str,
    },
    Call {
        #[serde(rename = "functionCall")]
        function_call: OutCall<'a>,
    },
}

#[derive(Serialize)]
struct OutCall<'a> {
    name: &'a str,
    args: &'a Value,
}

#[derive(Serialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    prompt_token_count: u64,
    candidates_token_count: u64,
    total_token_count: u64,
}

fn reply(
    shared: &Shared,
    model: &str,
    method: Method,
    scenario: &Scenario,
    tools: &[OfferedTool<'_>],
    Turn {
        progress,
        body_len,
        fault,
        output,
    }: Turn,
) -> Prepared {
    let reply = engine::plan(
        scenario,
        tools,
        progress,
        "",
        &shared.ids,
        shared.scripted(),
        output.as_ref(),
    );
    let (input, output) = engine::usage(body_len, &reply);
    let usage = UsageMetadata {
        prompt_token_count: input,
        candidates_token_count: output,
        total_token_count: input + output,
    };
    let id = format!("mock{:016x}", shared.next_response_id());
    let response = |parts: Vec<OutPart<'_>>, last: bool| -> Vec<u8> {
        super::response::to_vec(&Response {
            candidates: [Candidate {
                content: OutContent {
                    parts,
                    role: "model",
                },
                finish_reason: last.then_some("STOP"),
                index: 0,
            }],
            usage_metadata: last.then_some(usage),
            model_version: model,
            response_id: &id,
        })
    };
    let call_parts = |calls: &[engine::Call<'_>]| -> Vec<u8> {
        let parts = calls
            .iter()
            .map(|c| OutPart::Call {
                function_call: OutCall {
                    name: c.name,
                    args: &c.arguments,
                },
            })
            .collect();
        response(parts, true)
    };
    // The chunks of a streamed reply: text in pieces, calls whole in one chunk (as Gemini
    // streams them); finish reason and usage on the last.
    let chunks = || -> Vec<Vec<u8>> {
        match &reply {
            Reply::Calls(calls) => vec![call_parts(calls)],
            Reply::Text(text) => {
                let parts: Vec<&str> = pieces(text, scenario.chunk).collect();
                let last = parts.len().saturating_sub(1);
                parts
                    .iter()
                    .enumerate()
                    .map(|(k, piece)| response(vec![OutPart::Text { text: piece }], k == last))
                    .collect()
            }
        }
    };
    let payload = match method {
        Method::Generate => Payload::Json(match &reply {
            Reply::Calls(calls) => call_parts(calls),
            Reply::Text(text) => response(vec![OutPart::Text { text }], true),
        }),
        Method::Stream { sse: true } => {
            let mut sse = SseWriter::new(true);
            for chunk in chunks() {
                sse.raw(&chunk);
            }
            Payload::Sse(sse)
        }
        Method::Stream { sse: false } => {
            let mut out = Vec::with_capacity(512);
            out.push(b'[');
            for (k, chunk) in chunks().iter().enumerate() {
                if k > 0 {
                    out.extend_from_slice(b",\r\n");
                }
                out.extend_from_slice(chunk);
            }
            out.push(b']');
            Payload::Json(out)
        }
    };
    Prepared::answer(payload, shared, scenario, fault, &reply, ArgsOnWire::Object)
}
