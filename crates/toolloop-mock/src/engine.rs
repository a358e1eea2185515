//! The scenario engine, free of any wire format: where the conversation stands, whether every
//! tool call was answered, and what to reply next.
//!
//! Protocol modules walk their request, feed [`Progress`] and [`Ledger`], then ask [`plan`] for
//! the reply and render it in their own shapes.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use super::scenario::Scenario;

/// A tool the request offers: its name and parameter schema.
pub(crate) struct OfferedTool<'a> {
    pub name: &'a str,
    pub schema: Option<&'a Value>,
}

/// Where the current task stands, derived from the request alone (the server keeps no state).
///
/// A task starts at a user message. A user message that comes straight after tool results (a
/// reminder an adapter appended, say) continues the task rather than starting a new one.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// Assistant turns with tool calls since the task began.
    pub rounds: u32,
    /// Tool results received since the task began.
    pub results: u32,
    /// Assistant turns without tool calls (answers) in the whole conversation.
    pub answers: u32,
    /// Images in the user turns of the task.
    pub images: u32,
    /// The request asks for a summary of a conversation (toolloop's compaction): the rounds
    /// and results the conversation shows.
    pub summarise: Option<(u32, u32)>,
    after_results: bool,
}

impl Progress {
    pub(crate) fn user_text(&mut self) {
        if !self.after_results {
            *self = Progress {
                answers: self.answers,
                ..Progress::default()
            };
        }
    }

    /// Counts the images of the user turn just read (after [`Progress::user_text`]).
    pub(crate) fn user_images(&mut self, n: u32) {
        self.images = self.images.saturating_add(n);
    }

    pub(crate) fn tool_calls(&mut self) {
        self.rounds = self.rounds.saturating_add(1);
        self.after_results = false;
    }

    pub(crate) fn tool_result(&mut self) {
        self.results = self.results.saturating_add(1);
        self.after_results = true;
    }

    /// A compaction of the conversation (the Responses API's) carried the task this far.
    pub(crate) fn compacted(&mut self, rounds: u32, results: u32) {
        self.rounds = rounds;
        self.results = results;
        self.after_results = false;
    }

    pub(crate) fn assistant_text(&mut self) {
        self.answers = self.answers.saturating_add(1);
        self.after_results = false;
    }
}

/// What went wrong with the answers to one assistant turn's tool calls.
#[derive(Debug)]
pub(crate) enum Problem<'a> {
    /// A result names a call the turn did not make.
    Unknown(&'a str),
    /// A call was answered more than once.
    Twice(&'a str),
    /// Calls left without a result.
    Missing(Vec<&'a str>),
    /// Two calls in one turn share an id.
    DuplicateId(&'a str),
}

struct Slot<'a> {
    key: &'a str,
    name: &'a str,
    answered: bool,
}

/// The calls of the assistant turn being answered, and which have their result.
#[derive(Default)]
pub(crate) struct Ledger<'a> {
    slots: Vec<Slot<'a>>,
    /// Index of the message that made the calls.
    pub turn: usize,
}

impl<'a> Ledger<'a> {
    /// True while an assistant turn's calls are waiting for results.
    pub(crate) fn is_open(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Starts a turn's calls `(key, name)`, keyed by id, or by name where the wire has no ids
    /// (`unique_keys` false).
    pub(crate) fn open(
        &mut self,
        turn: usize,
        calls: impl Iterator<Item = (&'a str, &'a str)>,
        unique_keys: bool,
    ) -> Result<(), Problem<'a>> {
        self.slots.clear();
        self.turn = turn;
        for (key, name) in calls {
            if unique_keys && self.slots.iter().any(|s| s.key == key) {
                return Err(Problem::DuplicateId(key));
            }
            self.slots.push(Slot {
                key,
                name,
                answered: false,
            });
        }
        Ok(())
    }

    /// Records the result for the call with this id.
    pub(crate) fn answer(&mut self, id: &'a str) -> Result<(), Problem<'a>> {
        match self.slots.iter_mut().find(|s| s.key == id) {
            None => Err(Problem::Unknown(id)),
            Some(slot) if slot.answered => Err(Problem::Twice(id)),
            Some(slot) => {
                slot.answered = true;
                Ok(())
            }
        }
    }

    /// Records a result by function name: it answers the first unanswered call of that name.
    pub(crate) fn answer_by_name(&mut self, name: &'a str) -> Result<(), Problem<'a>> {
        if let Some(slot) = self
            .slots
            .iter_mut()
            .find(|s| s.name == name && !s.answered)
        {
            slot.answered = true;
            return Ok(());
        }
        if self.slots.iter().any(|s| s.name == name) {
            Err(Problem::Twice(name))
        } else {
            Err(Problem::Unknown(name))
        }
    }

    /// Ends the turn: every call must have its result.
    pub(crate) fn close(&mut self) -> Result<(), Problem<'a>> {
        let missing: Vec<&'a str> = self
            .slots
            .iter()
            .filter(|s| !s.answered)
            .map(|s| s.key)
            .collect();
        self.slots.clear();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Problem::Missing(missing))
        }
    }
}

/// One tool call the mock makes.
pub(crate) struct Call<'a> {
    pub id: String,
    pub name: &'a str,
    pub arguments: Value,
    /// `arguments` as JSON text.
    pub arguments_json: String,
}

/// The scenario a model name asks for, on a route of a wire with native tool calls; the
/// message of the wire's 400 when it names no valid scenario, or the text-only mode, which
/// only the OpenAI-compatible route serves.
pub(crate) fn native_scenario(model: &str) -> Result<Scenario, String> {
    let scenario = Scenario::from_model(model).map_err(|e| format!("model: {}", e.message))?;
    if scenario.text_calls.is_some() {
        return Err(
            "model: bad mock scenario: text-only mode (`text_calls=`) is served on the \
                    OpenAI-compatible route only (POST /v1/chat/completions)"
                .into(),
        );
    }
    Ok(scenario)
}

/// What the mock answers.
pub(crate) enum Reply<'a> {
    Calls(Vec<Call<'a>>),
    Text(String),
}

/// What the test scripted (see [`crate::MockOptions::script`] and [`crate::MockOptions::answers`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Scripted<'s> {
    pub calls: &'s [Vec<crate::ScriptCall>],
    pub answers: &'s [String],
    pub summaries: Option<&'s AtomicU64>,
}

/// How the mock's summaries begin: `Mock summary: R rounds, N tool results.`
const SUMMARY: &str = "Mock summary: ";

/// The rounds and results of the last mock summary in `text`, if it holds one.
fn last_summary(text: &str) -> Option<(u32, u32)> {
    let at = text.rfind(SUMMARY)? + SUMMARY.len();
    let rest = &text[at..];
    let number = |s: &str| -> Option<(u32, usize)> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        Some((s[..end].parse().ok()?, end))
    };
    let (rounds, end) = number(rest)?;
    let rest = rest[end..].strip_prefix(" rounds, ")?;
    let (results, _) = number(rest)?;
    Some((rounds, results))
}

/// Reads what a request says of toolloop's compaction (see [`toolloop::context::policy`]):
/// a request to summarise a conversation (its user message holds
/// [`toolloop::context::policy::COMPACT_MARKER`]) is answered with a mock summary counting the
/// rounds and results the rendered conversation shows, an earlier mock summary's included;
/// and a conversation that holds a mock summary goes on from the rounds and results it
/// counts, so that a compacted task ends after as many rounds as the scenario asks.
pub(crate) fn read_summaries(mut progress: Progress, body: &[u8]) -> Progress {
    let Ok(text) = std::str::from_utf8(body) else {
        return progress;
    };
    let marker = toolloop::context::policy::COMPACT_MARKER;
    if let Some(at) = text.find(marker) {
        let part = &text[at..];
        let (mut rounds, mut results) = last_summary(part).unwrap_or((0, 0));
        let turns = part.split("[assistant]").skip(1);
        rounds += turns.filter(|t| t.contains("[tool call ")).count() as u32;
        results += part.matches("[tool result ").count() as u32;
        progress.summarise = Some((rounds, results));
    } else if let Some((rounds, results)) = last_summary(text) {
        progress.rounds = progress.rounds.saturating_add(rounds);
        progress.results = progress.results.saturating_add(results);
    }
    progress
}

/// The next reply: the next round of calls while rounds remain and tools are offered, else the
/// final answer: the scripted answer for this point of the conversation, else, when the request
/// asks for JSON matching `output` (a JSON Schema), a minimal instance of it
/// ([`toolloop::schema::sample`]), else a text saying how many tool results the task received.
///
/// Calls go round-robin over `tools` across the whole task; ids are `{id_prefix}` plus a
/// server-wide counter, so they are unique for the server's lifetime (`id_prefix` empty: no ids).
///
/// With a `script` (see [`crate::MockOptions::script`]), round `r` makes the calls of the
/// script's round `r` (those of offered tools), and the answer comes after the script's last
/// round.
pub(crate) fn plan<'a>(
    scenario: &Scenario,
    tools: &[OfferedTool<'a>],
    progress: Progress,
    id_prefix: &str,
    ids: &AtomicU64,
    scripted: Scripted<'_>,
    output: Option<&Value>,
) -> Reply<'a> {
    if let Some((rounds, results)) = progress.summarise {
        if let Some(count) = scripted.summaries {
            count.fetch_add(1, Ordering::Relaxed);
        }
        return Reply::Text(format!("{SUMMARY}{rounds} rounds, {results} tool results."));
    }
    let script = scripted.calls;
    let id_of = |n: u64| {
        if id_prefix.is_empty() {
            String::new()
        } else {
            format!("{id_prefix}{n:016x}")
        }
    };
    if !script.is_empty()
        && let Some(round) = script.get(progress.rounds as usize)
        && !tools.is_empty()
    {
        let first = ids.fetch_add(round.len() as u64, Ordering::Relaxed);
        let calls: Vec<Call<'a>> = round
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let tool = tools.iter().find(|t| t.name == c.name)?;
                Some(Call {
                    id: id_of(first.wrapping_add(i as u64)),
                    name: tool.name,
                    arguments_json: c.arguments.to_string(),
                    arguments: c.arguments.clone(),
                })
            })
            .collect();
        if !calls.is_empty() {
            return Reply::Calls(calls);
        }
    }
    let rounds = if script.is_empty() {
        scenario.rounds
    } else {
        progress.rounds
    };
    if progress.rounds >= rounds || tools.is_empty() {
        let answers = scripted.answers;
        let text = if let Some(last) = answers.last() {
            answers
                .get(progress.answers as usize)
                .unwrap_or(last)
                .clone()
        } else if let Some(schema) = output {
            toolloop::schema::sample(schema).to_string()
        } else {
            format!(
                "Done. I saw {} tool results in {} rounds.{}",
                progress.results,
                progress.rounds,
                super::image::seen(progress.images)
            )
        };
        return Reply::Text(text);
    }
    let parallel = scenario.parallel as usize;
    let first = ids.fetch_add(parallel as u64, Ordering::Relaxed);
    let start = progress.rounds as usize * parallel;
    let calls = (0..parallel)
        .map(|i| {
            let tool = &tools[(start + i) % tools.len()];
            let mut arguments = tool
                .schema
                .map(toolloop::schema::sample)
                .unwrap_or_default();
            if !arguments.is_object() {
                arguments = Value::Object(Default::default());
            }
            if scenario.distinct
                && let Some(Value::String(text)) = arguments
                    .as_object_mut()
                    .and_then(|o| o.values_mut().find(|v| v.is_string()))
            {
                text.push_str(&format!(" #{}", start + i + 1));
            }
            let arguments_json = arguments.to_string();
            let id = if id_prefix.is_empty() {
                String::new()
            } else {
                format!("{id_prefix}{:016x}", first.wrapping_add(i as u64))
            };
            Call {
                id,
                name: tool.name,
                arguments,
                arguments_json,
            }
        })
        .collect();
    Reply::Calls(calls)
}

/// Why strict decoding (OpenAI's `strict: true`) refuses `schema`, if it does: an object schema
/// that does not set `additionalProperties: false`, or does not list every property in
/// `required`. `path` names where the schema sits, for the message.
pub(crate) fn strict_problem(schema: &Value, path: &str) -> Option<String> {
    let obj = schema.as_object()?;
    let is_object = match obj.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => obj.contains_key("properties"),
    };
    if is_object {
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Some(format!(
                "In context={path}, 'additionalProperties' is required to be supplied and to be \
                 false."
            ));
        }
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = obj.get("properties").and_then(Value::as_object)
            && let Some(missing) = props.keys().find(|k| !required.contains(&k.as_str()))
        {
            return Some(format!(
                "In context={path}, 'required' is required to be supplied and to be an array \
                 including every key in properties. Missing '{missing}'."
            ));
        }
    }
    for (key, v) in obj {
        let at = format!("{path}/{key}");
        let found = match key.as_str() {
            "properties" | "$defs" | "definitions" => v.as_object().and_then(|m| {
                m.iter()
                    .find_map(|(k, sub)| strict_problem(sub, &format!("{at}/{k}")))
            }),
            "items" => strict_problem(v, &at),
            "anyOf" | "allOf" | "oneOf" => v.as_array().and_then(|a| {
                a.iter()
                    .enumerate()
                    .find_map(|(i, sub)| strict_problem(sub, &format!("{at}/{i}")))
            }),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The input tokens the mock counts for a request: a quarter of its bytes (at least 1).
pub(crate) fn request_tokens(request_bytes: usize) -> u64 {
    (request_bytes / 4).max(1) as u64
}

/// With a `window=` scenario, a request over the window: its tokens and the window. The caller
/// refuses it in its protocol's shape; it is counted here.
pub(crate) fn over_window(
    shared: &super::Shared,
    scenario: &Scenario,
    request_bytes: usize,
) -> Option<(u64, u64)> {
    let window = scenario.window?;
    let tokens = request_tokens(request_bytes);
    (tokens > window).then(|| {
        shared.count_context_refusal();
        (tokens, window)
    })
}

/// Token counts for a reply: input roughly a quarter of the request's bytes, output a few tokens
/// per call or per four characters of text.
pub(crate) fn usage(request_bytes: usize, reply: &Reply<'_>) -> (u64, u64) {
    let input = request_tokens(request_bytes);
    let output = match reply {
        Reply::Text(text) => text.len() / 4 + 1,
        Reply::Calls(calls) => calls
            .iter()
            .map(|c| (c.name.len() + c.arguments_json.len()) / 4 + 3)
            .sum(),
    };
    (input, output as u64)
}

/// Splits `s` into pieces of at most `max_chars` characters (0: one piece), on char boundaries.
/// An empty string gives one empty piece.
pub(crate) fn pieces(s: &str, max_chars: usize) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let current = rest?;
        if max_chars == 0 {
            rest = None;
            return Some(current);
        }
        match current.char_indices().nth(max_chars) {
            Some((cut, _)) => {
                let (head, tail) = current.split_at(cut);
                rest = Some(tail);
                Some(head)
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

/// [`pieces`] of `s`, and when `cut`, split in two halves with a `None` between them: where a
/// `cut_call` fault ends the stream (the halves are split on a char boundary; the first holds
/// at least one char of a non-empty `s`).
pub(crate) fn pieces_with_cut(
    s: &str,
    max_chars: usize,
    cut: bool,
) -> impl Iterator<Item = Option<&str>> {
    let (head, tail) = if cut {
        let chars = s.chars().count();
        let at = s
            .char_indices()
            .nth((chars / 2).max(1))
            .map_or(s.len(), |(i, _)| i);
        s.split_at(at)
    } else {
        (s, "")
    };
    pieces(head, max_chars)
        .map(Some)
        .chain(cut.then_some(None))
        .chain(pieces(tail, max_chars).filter(|p| !p.is_empty()).map(Some))
}

/// Lists ids for an error message: `a, b, c`.
pub(crate) fn join(ids: &[&str]) -> String {
    ids.join(", ")
}

/// A borrowed-when-possible string from a request body.
pub(crate) type Str<'a> = Cow<'a, str>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pieces_respect_char_boundaries() {
        let parts: Vec<&str> = pieces("héllo wörld", 4).collect();
        assert_eq!(parts, ["héll", "o wö", "rld"]);
        assert_eq!(pieces("", 4).collect::<Vec<_>>(), [""]);
        assert_eq!(pieces("abc", 0).collect::<Vec<_>>(), ["abc"]);
        assert_eq!(pieces("abcd", 4).collect::<Vec<_>>(), ["abcd"]);
    }

    #[test]
    fn pieces_with_cut_mark_the_middle() {
        let all: Vec<Option<&str>> = pieces_with_cut("abcdef", 2, true).collect();
        assert_eq!(all, [Some("ab"), Some("c"), None, Some("de"), Some("f")]);
        let all: Vec<Option<&str>> = pieces_with_cut("{}", 0, true).collect();
        assert_eq!(all, [Some("{"), None, Some("}")]);
        let all: Vec<Option<&str>> = pieces_with_cut("é", 0, true).collect();
        assert_eq!(all, [Some("é"), None]);
        let all: Vec<Option<&str>> = pieces_with_cut("abc", 0, false).collect();
        assert_eq!(all, [Some("abc")]);
    }

    #[test]
    fn progress_resets_on_a_new_task_but_not_on_a_reminder() {
        let mut p = Progress::default();
        p.user_text();
        p.tool_calls();
        p.tool_result();
        p.tool_result();
        p.user_text(); // reminder after results
        assert_eq!((p.rounds, p.results), (1, 2));
        p.tool_calls();
        p.tool_result();
        p.assistant_text();
        p.user_text(); // new question
        assert_eq!((p.rounds, p.results), (0, 0));
    }

    #[test]
    fn ledger_reports_each_problem() {
        let mut l = Ledger::default();
        l.open(1, [("a", "f"), ("b", "g")].into_iter(), true)
            .unwrap();
        l.answer("a").unwrap();
        assert!(matches!(l.answer("a"), Err(Problem::Twice("a"))));
        assert!(matches!(l.answer("z"), Err(Problem::Unknown("z"))));
        assert!(matches!(l.close(), Err(Problem::Missing(m)) if m == ["b"]));
        assert!(!l.is_open());
        assert!(matches!(
            l.open(3, [("a", "f"), ("a", "g")].into_iter(), true),
            Err(Problem::DuplicateId("a"))
        ));
        l.open(5, [("f", "f"), ("f", "f")].into_iter(), false)
            .unwrap();
        l.answer_by_name("f").unwrap();
        l.answer_by_name("f").unwrap();
        assert!(matches!(l.answer_by_name("f"), Err(Problem::Twice("f"))));
        assert!(l.close().is_ok());
    }

    #[test]
    fn plan_goes_round_robin_then_answers() {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        let tools = [
            OfferedTool {
                name: "read",
                schema: Some(&schema),
            },
            OfferedTool {
                name: "list",
                schema: None,
            },
        ];
        let scenario = Scenario::from_model("mock:rounds=2,parallel=3").unwrap();
        let ids = AtomicU64::new(0);
        let mut p = Progress {
            rounds: 1,
            ..Progress::default()
        };
        let Reply::Calls(calls) = plan(
            &scenario,
            &tools,
            p,
            "call_",
            &ids,
            Scripted::default(),
            None,
        ) else {
            panic!("expected calls")
        };
        let names: Vec<&str> = calls.iter().map(|c| c.name).collect();
        assert_eq!(names, ["list", "read", "list"]);
        assert_eq!(calls[1].arguments, json!({"path": "a"}));
        assert_eq!(calls[0].arguments_json, "{}");
        assert_ne!(calls[0].id, calls[1].id);
        p.rounds = 2;
        p.results = 6;
        let Reply::Text(text) = plan(
            &scenario,
            &tools,
            p,
            "call_",
            &ids,
            Scripted::default(),
            None,
        ) else {
            panic!("expected text")
        };
        assert!(text.contains("6 tool results"), "{text}");
    }

    #[test]
    fn the_native_wires_refuse_text_only_mode_and_bad_scenarios() {
        assert_eq!(
            native_scenario("mock:text_calls=qwen3-coder")
                .err()
                .as_deref(),
            Some(
                "model: bad mock scenario: text-only mode (`text_calls=`) is served on the \
                 OpenAI-compatible route only (POST /v1/chat/completions)"
            )
        );
        let bad = native_scenario("mock:rounds=x").unwrap_err();
        assert!(bad.starts_with("model: "), "{bad}");
        assert!(native_scenario("mock:rounds=2").is_ok());
    }

    #[test]
    fn distinct_calls_number_their_first_string_argument() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "path": {"type": "string"}}});
        let tools = [OfferedTool {
            name: "read",
            schema: Some(&schema),
        }];
        let scenario = Scenario::from_model("mock:rounds=3,parallel=2,distinct=true").unwrap();
        let p = Progress {
            rounds: 1,
            ..Progress::default()
        };
        let Reply::Calls(calls) = plan(
            &scenario,
            &tools,
            p,
            "call_",
            &AtomicU64::new(0),
            Scripted::default(),
            None,
        ) else {
            panic!("expected calls")
        };
        let paths: Vec<&Value> = calls.iter().map(|c| &c.arguments["path"]).collect();
        assert_eq!(paths, [&json!("a #3"), &json!("a #4")]);
        assert_eq!(calls[0].arguments["n"], json!(0));
        assert!(calls[1].arguments_json.contains("a #4"));
    }
}
