//! The scenario grammar: what the mock does, read from the model name.
//!
//! See the [module docs](super) for the grammar and examples.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::fault::{FaultKind, FaultKinds};
use toolloop::ptk::Dialect;

/// The most rounds a scenario may ask for.
pub const MAX_ROUNDS: u32 = 10_000;
/// The most parallel calls per round a scenario may ask for.
pub const MAX_PARALLEL: u32 = 256;
/// The largest context window a scenario may give (`window=`), in tokens.
pub const MAX_WINDOW: u64 = 100_000_000;
/// The longest latency or chunk delay a scenario may ask for.
pub const MAX_DELAY: Duration = Duration::from_secs(600);

/// The keys a scenario understands, for error messages.
const KEYS: &str = "rounds, parallel, latency, chunk, chunk_delay, faults, seed, fault_kinds, \
                    retry_after, slow_delay, text_calls, accept_tools, distinct, drop_tools, \
                    refuse_auto_stream, refuse_json_schema, traceback, window, \
                    empty_auto_answer, refuse_context";

/// When the server drops the `tools` parameter without a word (`drop_tools=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DropTools {
    /// Never (the default).
    #[default]
    Never,
    /// Always (`drop_tools=true`), as a proxy that strips the parameter.
    Always,
    /// When the request has no `tool_choice` (`drop_tools=without_choice`), as llama-cpp-python's
    /// `chatml-function-calling` handler does.
    WithoutChoice,
}

/// A parsed scenario: how many rounds of tool calls, how wide, how slow.
///
/// Build one from a model name with [`Scenario::from_model`] (or `str::parse`), or start from
/// [`Scenario::default`] and set fields; [`Scenario::model_name`] / `Display` render it back
/// into a model name the mock accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scenario {
    /// Rounds of tool calls before the final answer (`rounds=`, default 1).
    pub rounds: u32,
    /// Tool calls per round (`parallel=`, default 1).
    pub parallel: u32,
    /// Time to wait before answering (`latency=`); `None` uses the server's default.
    pub latency: Option<Duration>,
    /// Longest text or argument fragment in one streamed delta, in characters (`chunk=`,
    /// default 16); 0 sends each text and each call's arguments in one delta.
    pub chunk: usize,
    /// Pause between streamed events (`chunk_delay=`, default 0).
    pub chunk_delay: Duration,
    /// Share of responses that are faults, in parts per million (`faults=0.2` gives 200000;
    /// default 0, no faults).
    pub faults: u32,
    /// Seed of the fault draws (`seed=`, default 0).
    pub seed: u64,
    /// Kinds of faults to draw from (`fault_kinds=429+reset`, default all).
    pub fault_kinds: FaultKinds,
    /// The wait a 429 fault asks for (`retry_after=`, default 1 s): `retry-after-ms` exactly,
    /// `Retry-After` in whole seconds, rounded up.
    pub retry_after: Duration,
    /// How late a `slow` fault's response head comes (`slow_delay=`, default 1 s).
    pub slow_delay: Duration,
    /// Text-only mode (`text_calls=<dialect>`, default off): the mock writes its tool calls in
    /// the content of its replies, in this dialect, instead of native tool calls, and reads the
    /// calls' results back from the conversation's text (`PTK_RESULT:` messages).
    pub text_calls: Option<Dialect>,
    /// In text-only mode, accept requests that carry a `tools` parameter (`accept_tools=true`,
    /// default false: such requests get the 400 a server without tool support gives).
    pub accept_tools: bool,
    /// Make every call's arguments differ (`distinct=true`, default false): the first string
    /// argument of each call gets ` #N` appended, N the call's number in the task, so a loop's
    /// duplicate-call detection lets every call run.
    pub distinct: bool,
    /// The model's context window, in tokens (`window=`, default none): a request the mock
    /// counts as larger (a quarter of its body's bytes, as in its usage) is refused the way
    /// each API refuses one, and counted in [`crate::MockStats::context_refusals`].
    pub window: Option<u64>,
    /// Drop the `tools` parameter (and `tool_choice`) without a word (`drop_tools=true`, or
    /// `without_choice`: when the request has no `tool_choice`): the reply is made as if no
    /// tools were offered, and the prompt tokens are counted without the catalog.
    pub drop_tools: DropTools,
    /// Answer a streamed request with `tool_choice: "auto"` with an empty stream (status 200,
    /// no event), as llama-cpp-python does (`refuse_auto_stream=true`).
    pub refuse_auto_stream: bool,
    /// Refuse a `response_format` of type `json_schema` with llama-cpp-python's HTTP 500
    /// validation error, "Input should be 'text' or 'json_object'" (`refuse_json_schema=true`).
    pub refuse_json_schema: bool,
    /// Error faults (`500`, `503`) carry a Python traceback, several lines long, as their
    /// message (`traceback=true`).
    pub traceback: bool,
    /// A final answer to a request with tools and `tool_choice: "auto"` is empty (no text, no
    /// call), as llama-cpp-python's `chatml-function-calling` answers every text reply then
    /// (`empty_auto_answer=true`).
    pub empty_auto_answer: bool,
    /// Refuse a request that asks for context management done by the server, as a model or
    /// server without it does (`refuse_context=true`): HTTP 400 naming the field in each API's
    /// own error shape (Anthropic Messages: `context_management` or its beta header;
    /// Responses: `Unknown parameter: 'context_management'`).
    pub refuse_context: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            rounds: 1,
            parallel: 1,
            latency: None,
            chunk: 16,
            chunk_delay: Duration::ZERO,
            faults: 0,
            seed: 0,
            fault_kinds: FaultKinds::ALL,
            retry_after: Duration::from_secs(1),
            slow_delay: Duration::from_secs(1),
            text_calls: None,
            accept_tools: false,
            distinct: false,
            window: None,
            drop_tools: DropTools::Never,
            refuse_auto_stream: false,
            refuse_json_schema: false,
            empty_auto_answer: false,
            traceback: false,
            refuse_context: false,
        }
    }
}

/// A model name the mock could not read as a scenario. `Display` names the key and what was
/// expected; the server sends it back in a 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    /// The key at fault, when one is.
    pub key: Option<String>,
    /// What was wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ScenarioError {}

fn error(key: Option<&str>, message: String) -> ScenarioError {
    ScenarioError {
        key: key.map(str::to_owned),
        message: format!("bad mock scenario: {message}"),
    }
}

impl Scenario {
    /// Reads the scenario from a model name: `NAME` or `NAME:key=value,key=value`.
    ///
    /// Everything before the first `:` is free (it is usually `mock`); everything after it must
    /// be `key=value` pairs. A name with no `:` is the default scenario.
    pub fn from_model(model: &str) -> Result<Scenario, ScenarioError> {
        let mut scenario = Scenario::default();
        let Some((_, params)) = model.split_once(':') else {
            return Ok(scenario);
        };
        let mut seen: [bool; 20] = [false; 20];
        for param in params.split(',') {
            let param = param.trim();
            if param.is_empty() {
                continue;
            }
            let Some((key, value)) = param.split_once('=') else {
                return Err(error(
                    None,
                    format!(
                        "`{param}` in model `{model}` is not `key=value`; expected a name like \
                         `mock:rounds=3,parallel=2,latency=5ms`"
                    ),
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            let slot = match key {
                "rounds" => {
                    scenario.rounds = number(key, value, 0, MAX_ROUNDS)?;
                    0
                }
                "parallel" => {
                    scenario.parallel = number(key, value, 1, MAX_PARALLEL)?;
                    1
                }
                "latency" => {
                    scenario.latency = Some(duration(key, value)?);
                    2
                }
                "chunk" => {
                    scenario.chunk = number(key, value, 0, 1_000_000)? as usize;
                    3
                }
                "chunk_delay" => {
                    scenario.chunk_delay = duration(key, value)?;
                    4
                }
                "faults" => {
                    scenario.faults = share(key, value)?;
                    5
                }
                "seed" => {
                    scenario.seed = value.parse().map_err(|_| {
                        error(
                            Some(key),
                            format!(
                                "key `{key}` expects a whole number from 0 to {}, got `{value}`",
                                u64::MAX
                            ),
                        )
                    })?;
                    6
                }
                "fault_kinds" => {
                    scenario.fault_kinds = kinds(key, value)?;
                    7
                }
                "retry_after" => {
                    scenario.retry_after = duration(key, value)?;
                    8
                }
                "slow_delay" => {
                    scenario.slow_delay = duration(key, value)?;
                    9
                }
                "text_calls" => {
                    scenario.text_calls = Some(value.parse().map_err(|e| {
                        error(Some(key), format!("key `{key}` expects a dialect: {e}"))
                    })?);
                    10
                }
                "accept_tools" => {
                    scenario.accept_tools = boolean(key, value)?;
                    11
                }
                "distinct" => {
                    scenario.distinct = boolean(key, value)?;
                    12
                }
                "drop_tools" => {
                    scenario.drop_tools = match value {
                        "true" => DropTools::Always,
                        "false" => DropTools::Never,
                        "without_choice" => DropTools::WithoutChoice,
                        _ => {
                            return Err(error(
                                Some(key),
                                format!(
                                    "key `{key}` expects `true`, `false` or `without_choice`, \
                                     got `{value}`"
                                ),
                            ));
                        }
                    };
                    13
                }
                "refuse_auto_stream" => {
                    scenario.refuse_auto_stream = boolean(key, value)?;
                    14
                }
                "refuse_json_schema" => {
                    scenario.refuse_json_schema = boolean(key, value)?;
                    15
                }
                "traceback" => {
                    scenario.traceback = boolean(key, value)?;
                    16
                }
                "window" => {
                    scenario.window = Some(match value.parse::<u64>() {
                        Ok(n) if (1..=MAX_WINDOW).contains(&n) => n,
                        _ => {
                            return Err(error(
                                Some(key),
                                format!(
                                    "key `{key}` expects a context window in tokens, a whole \
                                     number from 1 to {MAX_WINDOW}, got `{value}`"
                                ),
                            ));
                        }
                    });
                    17
                }
                "empty_auto_answer" => {
                    scenario.empty_auto_answer = boolean(key, value)?;
                    18
                }
                "refuse_context" => {
                    scenario.refuse_context = boolean(key, value)?;
                    19
                }
                _ => {
                    return Err(error(
                        Some(key),
                        format!("unknown key `{key}`; expected one of {KEYS}"),
                    ));
                }
            };
            if std::mem::replace(&mut seen[slot], true) {
                return Err(error(Some(key), format!("key `{key}` is given twice")));
            }
        }
        if scenario.accept_tools && scenario.text_calls.is_none() {
            return Err(error(
                Some("accept_tools"),
                "key `accept_tools` only applies to text-only mode; give `text_calls=<dialect>` \
                 too"
                .into(),
            ));
        }
        Ok(scenario)
    }

    /// The model name that selects this scenario, e.g. `mock:rounds=3,parallel=2,latency=5ms`.
    /// Keys left at their default are omitted.
    pub fn model_name(&self) -> String {
        self.to_string()
    }
}

impl FromStr for Scenario {
    type Err = ScenarioError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scenario::from_model(s)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default = Scenario::default();
        f.write_str("mock")?;
        let mut sep = ':';
        let mut put = |f: &mut fmt::Formatter<'_>, item: fmt::Arguments<'_>| {
            let r = write!(f, "{sep}{item}");
            sep = ',';
            r
        };
        if self.rounds != default.rounds {
            put(f, format_args!("rounds={}", self.rounds))?;
        }
        if self.parallel != default.parallel {
            put(f, format_args!("parallel={}", self.parallel))?;
        }
        if let Some(latency) = self.latency {
            put(f, format_args!("latency={}us", latency.as_micros()))?;
        }
        if self.chunk != default.chunk {
            put(f, format_args!("chunk={}", self.chunk))?;
        }
        if self.chunk_delay != default.chunk_delay {
            put(
                f,
                format_args!("chunk_delay={}us", self.chunk_delay.as_micros()),
            )?;
        }
        if self.faults != default.faults {
            let share = f64::from(self.faults) / 1e6;
            put(f, format_args!("faults={share}"))?;
        }
        if self.seed != default.seed {
            put(f, format_args!("seed={}", self.seed))?;
        }
        if self.fault_kinds != default.fault_kinds {
            put(f, format_args!("fault_kinds={}", self.fault_kinds))?;
        }
        if self.retry_after != default.retry_after {
            put(
                f,
                format_args!("retry_after={}us", self.retry_after.as_micros()),
            )?;
        }
        if self.slow_delay != default.slow_delay {
            put(
                f,
                format_args!("slow_delay={}us", self.slow_delay.as_micros()),
            )?;
        }
        if let Some(dialect) = self.text_calls {
            put(f, format_args!("text_calls={dialect}"))?;
        }
        if self.accept_tools {
            put(f, format_args!("accept_tools=true"))?;
        }
        if self.distinct {
            put(f, format_args!("distinct=true"))?;
        }
        match self.drop_tools {
            DropTools::Never => {}
            DropTools::Always => put(f, format_args!("drop_tools=true"))?,
            DropTools::WithoutChoice => put(f, format_args!("drop_tools=without_choice"))?,
        }
        if self.refuse_auto_stream {
            put(f, format_args!("refuse_auto_stream=true"))?;
        }
        if self.refuse_json_schema {
            put(f, format_args!("refuse_json_schema=true"))?;
        }
        if self.traceback {
            put(f, format_args!("traceback=true"))?;
        }
        if self.empty_auto_answer {
            put(f, format_args!("empty_auto_answer=true"))?;
        }
        if self.refuse_context {
            put(f, format_args!("refuse_context=true"))?;
        }
        if let Some(window) = self.window {
            put(f, format_args!("window={window}"))?;
        }
        Ok(())
    }
}

fn boolean(key: &str, value: &str) -> Result<bool, ScenarioError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(error(
            Some(key),
            format!("key `{key}` expects `true` or `false`, got `{value}`"),
        )),
    }
}

fn number(key: &str, value: &str, min: u32, max: u32) -> Result<u32, ScenarioError> {
    match value.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(error(
            Some(key),
            format!("key `{key}` expects a whole number from {min} to {max}, got `{value}`"),
        )),
    }
}

/// A share from 0 to 1 (`0.2`) or a percentage (`20%`), in parts per million.
fn share(key: &str, value: &str) -> Result<u32, ScenarioError> {
    let bad = || {
        error(
            Some(key),
            format!(
                "key `{key}` expects a share of responses from 0 to 1 (`0.2`) or a percentage \
                 (`20%`), got `{value}`"
            ),
        )
    };
    let (number, scale) = match value.strip_suffix('%') {
        Some(n) => (n.trim(), 1e4),
        None => (value, 1e6),
    };
    if !number.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return Err(bad());
    }
    let n: f64 = number.parse().map_err(|_| bad())?;
    let ppm = (n * scale).round();
    if !ppm.is_finite() || !(0.0..=1e6).contains(&ppm) {
        return Err(bad());
    }
    Ok(ppm as u32)
}

/// `all`, or kind names joined with `+`: `429+500+reset_body`.
fn kinds(key: &str, value: &str) -> Result<FaultKinds, ScenarioError> {
    if value == "all" {
        return Ok(FaultKinds::ALL);
    }
    let names = || {
        FaultKind::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut set = FaultKinds::NONE;
    for name in value.split('+') {
        let name = name.trim();
        match FaultKind::from_name(name) {
            Some(kind) => set = set.with(kind),
            None => {
                return Err(error(
                    Some(key),
                    format!(
                        "key `{key}` expects `all` or fault kinds joined with `+` (such as \
                         `429+500+reset_body`); `{name}` is not one of {}",
                        names()
                    ),
                ));
            }
        }
    }
    Ok(set)
}

/// `0`, `250us` (or `µs`), `5ms`, `1.5s`, `2m`.
fn duration(key: &str, value: &str) -> Result<Duration, ScenarioError> {
    let bad = || {
        error(
            Some(key),
            format!(
                "key `{key}` expects a duration such as `0`, `250us`, `5ms`, `1.5s` or `1m` \
                 (at most 10 minutes), got `{value}`"
            ),
        )
    };
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let n: f64 = number.parse().map_err(|_| bad())?;
    let seconds_per_unit = match unit {
        "" if n == 0.0 => 0.0,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        _ => return Err(bad()),
    };
    let seconds = n * seconds_per_unit;
    if !seconds.is_finite() || seconds < 0.0 || seconds > MAX_DELAY.as_secs_f64() {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_server_quirks_read_and_render_back() {
        let s = Scenario::from_model(
            "mock:drop_tools=without_choice,refuse_auto_stream=true,refuse_json_schema=true,\
             traceback=true",
        )
        .unwrap();
        assert_eq!(s.drop_tools, DropTools::WithoutChoice);
        assert!(s.refuse_auto_stream && s.refuse_json_schema && s.traceback);
        assert_eq!(Scenario::from_model(&s.model_name()).unwrap(), s);
        let always = Scenario::from_model("mock:drop_tools=true").unwrap();
        assert_eq!(always.drop_tools, DropTools::Always);
        assert_eq!(always.model_name(), "mock:drop_tools=true");
        let e = Scenario::from_model("mock:drop_tools=sometimes").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("drop_tools"));
        assert!(e.message.contains("`without_choice`"), "{e}");
        let refusing = Scenario::from_model("mock:refuse_context=true").unwrap();
        assert!(refusing.refuse_context);
        assert_eq!(refusing.model_name(), "mock:refuse_context=true");
    }

    #[test]
    fn defaults_without_parameters() {
        assert_eq!(Scenario::from_model("mock").unwrap(), Scenario::default());
        assert_eq!(Scenario::from_model("gpt-4o").unwrap(), Scenario::default());
        assert_eq!(Scenario::from_model("mock:").unwrap(), Scenario::default());
    }

    #[test]
    fn reads_every_key() {
        let s =
            Scenario::from_model("mock:rounds=3, parallel=2,latency=5ms,chunk=0,chunk_delay=1.5s")
                .unwrap();
        assert_eq!(s.rounds, 3);
        assert_eq!(s.parallel, 2);
        assert_eq!(s.latency, Some(Duration::from_millis(5)));
        assert_eq!(s.chunk, 0);
        assert_eq!(s.chunk_delay, Duration::from_millis(1500));
        assert_eq!(
            Scenario::from_model("x:latency=250us").unwrap().latency,
            Some(Duration::from_micros(250))
        );
        assert_eq!(
            Scenario::from_model("x:latency=0").unwrap().latency,
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn reads_the_fault_keys() {
        let s = Scenario::from_model(
            "mock:rounds=3,parallel=2,faults=0.2,seed=7,fault_kinds=429+500+reset_body,\
             retry_after=20ms,slow_delay=300ms",
        )
        .unwrap();
        assert_eq!(s.faults, 200_000);
        assert_eq!(s.seed, 7);
        let kinds: Vec<FaultKind> = s.fault_kinds.iter().collect();
        assert_eq!(
            kinds,
            [
                FaultKind::RateLimited,
                FaultKind::ServerError,
                FaultKind::ResetBody
            ]
        );
        assert_eq!(s.retry_after, Duration::from_millis(20));
        assert_eq!(s.slow_delay, Duration::from_millis(300));
        assert_eq!(
            Scenario::from_model("m:faults=20%").unwrap().faults,
            200_000
        );
        assert_eq!(
            Scenario::from_model("m:faults=1").unwrap().faults,
            1_000_000
        );
        assert_eq!(Scenario::from_model("m:faults=0.5%").unwrap().faults, 5_000);
        let all = Scenario::from_model("m:fault_kinds=all").unwrap();
        assert_eq!(all.fault_kinds, FaultKinds::ALL);
        assert_eq!(
            s.model_name(),
            "mock:rounds=3,parallel=2,faults=0.2,seed=7,fault_kinds=429+500+reset_body,\
             retry_after=20000us,slow_delay=300000us"
        );
        assert_eq!(Scenario::from_model(&s.model_name()).unwrap(), s);
    }

    #[test]
    fn round_trips_through_the_model_name() {
        let s = Scenario::from_model("mock:rounds=7,parallel=3,latency=2ms,chunk=4").unwrap();
        assert_eq!(
            s.model_name(),
            "mock:rounds=7,parallel=3,latency=2000us,chunk=4"
        );
        assert_eq!(Scenario::from_model(&s.model_name()).unwrap(), s);
        assert_eq!(Scenario::default().model_name(), "mock");
        let s = Scenario::from_model("mock:text_calls=Qwen3-Coder,accept_tools=true").unwrap();
        assert_eq!(s.text_calls, Some(Dialect::Qwen3Coder));
        assert!(s.accept_tools);
        assert_eq!(
            s.model_name(),
            "mock:text_calls=qwen3-coder,accept_tools=true"
        );
        assert_eq!(Scenario::from_model(&s.model_name()).unwrap(), s);
    }

    #[test]
    fn reads_the_window() {
        let s = Scenario::from_model("mock:rounds=2,window=8000").unwrap();
        assert_eq!(s.window, Some(8000));
        assert_eq!(s.model_name(), "mock:rounds=2,window=8000");
        assert_eq!(Scenario::from_model(&s.model_name()).unwrap(), s);
        assert_eq!(Scenario::default().window, None);
        for bad in ["0", "-1", "8k", "", "100000001"] {
            let e = Scenario::from_model(&format!("mock:window={bad}")).unwrap_err();
            assert_eq!(e.key.as_deref(), Some("window"), "{bad}");
            assert!(e.message.contains("context window in tokens"), "{e}");
        }
        let e = Scenario::from_model("mock:window=1,window=2").unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
    }

    #[test]
    fn errors_name_the_key_and_the_expectation() {
        let e = Scenario::from_model("mock:rounds=x").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("rounds"));
        assert!(e.message.contains("whole number from 0 to"), "{e}");
        let e = Scenario::from_model("mock:parallel=0").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("parallel"));
        let e = Scenario::from_model("mock:wat=1").unwrap_err();
        assert!(e.message.contains("unknown key `wat`"), "{e}");
        let e = Scenario::from_model("mock:text_calls=1").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("text_calls"));
        assert!(e.message.contains("qwen3-coder"), "{e}");
        let e = Scenario::from_model("mock:accept_tools=true").unwrap_err();
        assert!(e.message.contains("text_calls"), "{e}");
        let e = Scenario::from_model("mock:text_calls=ptk,accept_tools=yes").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("accept_tools"));
        let e = Scenario::from_model("mock:faults=1.5").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("faults"));
        assert!(e.message.contains("from 0 to 1"), "{e}");
        for bad in ["-0.1", "x", "nan", "inf", "120%", "", "+0.5"] {
            let e = Scenario::from_model(&format!("mock:faults={bad}")).unwrap_err();
            assert_eq!(e.key.as_deref(), Some("faults"), "{bad}");
        }
        let e = Scenario::from_model("mock:seed=-1").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("seed"));
        let e = Scenario::from_model("mock:fault_kinds=429+404").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("fault_kinds"));
        assert!(e.message.contains("`404` is not one of 429, 500"), "{e}");
        let e = Scenario::from_model("mock:fault_kinds=").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("fault_kinds"));
        let e = Scenario::from_model("mock:faults=0.1,faults=0.2").unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        let e = Scenario::from_model("mock:latency=5 parsecs").unwrap_err();
        assert!(e.message.contains("duration"), "{e}");
        let e = Scenario::from_model("mock:latency=1h").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("latency"));
        let e = Scenario::from_model("mock:rounds=1,rounds=2").unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        let e = Scenario::from_model("qwen3:8b").unwrap_err();
        assert!(e.message.contains("not `key=value`"), "{e}");
        let e = Scenario::from_model("mock:latency=é").unwrap_err();
        assert!(e.message.contains("duration"), "{e}");
    }
}
