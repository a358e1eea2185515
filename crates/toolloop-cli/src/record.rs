//! Record and replay: `--record FILE` writes a cassette of the run (every model request and
//! response, the tools' results, the run's settings); `--model replay:FILE` plays one back
//! offline, `--replay-fallback SPEC` sends what it lacks to a live model (appended to it), and
//! `--replay-tools` answers the tools from it, running nothing. The format and the matching are
//! the library's ([`toolloop::transport::cassette`]).

use crate::CliError;
use crate::args::ProviderArgs;
use crate::cx::Cx;
use clap::Args;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use toolloop::tool::Tool;
use toolloop::transport::cassette::Cassette;

/// The record and replay flags (for this invocation only: not saved with a run).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct RecordArgs {
    /// Record the run in a cassette FILE (JSON lines, mode 0600, keys redacted): every model
    /// request and response, streamed or not, the tools' results and the run's settings. Play
    /// it back with `--model replay:FILE`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// With `--model replay:FILE`: a request the cassette does not hold goes to this live model
    /// (provider:model, with the other provider flags) and is appended to the cassette, instead
    /// of failing the run. The model must speak the recorded API.
    #[arg(long, value_name = "SPEC")]
    pub replay_fallback: Option<String>,
    /// With `--model replay:FILE`: the tools answer with their recorded results and run
    /// nothing (no file is written, no command run, no MCP server started); a call the
    /// cassette does not hold fails.
    #[arg(long)]
    pub replay_tools: bool,
}

/// The cassette of one command, and how it is used: set once, by [`setup`] before the run
/// (or by [`resolve`] for a run resumed from the store); kept in [`crate::cx::Cx`].
#[derive(Default)]
pub(crate) struct Recording {
    /// The cassette every provider's transport records in or plays back from.
    cassette: OnceLock<Arc<Cassette>>,
    /// Whether the tools answer from the cassette (`--replay-tools`).
    replay_tools: OnceLock<bool>,
    /// The `--replay-fallback` model, kept by [`note_fallback`].
    fallback: OnceLock<String>,
}

impl Recording {
    /// The cassette every provider's transport records in or plays back from, if any.
    pub(crate) fn cassette(&self) -> Option<Arc<Cassette>> {
        self.cassette.get().cloned()
    }
}

/// The cassette file `--model replay:FILE` names.
pub(crate) fn replay_file(model: &str) -> Option<&str> {
    model.trim().strip_prefix("replay:").map(str::trim)
}

/// Checks the flags and opens the cassette: the one `--model replay:FILE` names, or a new one
/// at `--record FILE` holding `settings` (the run's, secrets redacted).
pub(crate) fn setup(
    cx: &Cx,
    args: &RecordArgs,
    model: &str,
    settings: Value,
) -> Result<(), CliError> {
    let replay = replay_file(model);
    if replay.is_none() {
        if args.replay_tools {
            return Err(CliError::usage(
                "--replay-tools answers the tools from a cassette: give --model replay:FILE",
            ));
        }
        if args.replay_fallback.is_some() {
            return Err(CliError::usage(
                "--replay-fallback is for playing a cassette back: give --model replay:FILE",
            ));
        }
    }
    let redactor = crate::secrets::redactor(cx);
    let cassette = match (replay, &args.record) {
        (Some(_), Some(_)) => {
            return Err(CliError::usage(
                "--record and --model replay: cannot go together; with --replay-fallback SPEC, \
                 what the cassette lacks is appended to it",
            ));
        }
        (Some(file), None) => {
            if file.is_empty() {
                return Err(CliError::usage(
                    "--model replay: names no file: expected replay:FILE",
                ));
            }
            Cassette::load(file)
                .map_err(|e| CliError::usage(format!("--model replay:{e}")))?
                .with_fallback(args.replay_fallback.is_some())
                .with_redactor(redactor)
        }
        (None, Some(path)) => {
            let mut settings = settings;
            toolloop::redact::redact_json_value(&redactor, &mut settings);
            Cassette::record(path, settings)
                .map_err(|e| CliError::usage(format!("--record {e}")))?
                .with_redactor(redactor)
        }
        (None, None) => return Ok(()),
    };
    let _ = cx.record.cassette.set(Arc::new(cassette));
    let _ = cx.record.replay_tools.set(args.replay_tools);
    Ok(())
}

/// The provider flags a `replay:FILE` model stands for: the recorded ones, pointed at an
/// address that is never contacted (every answer comes from the cassette), or, with
/// `--replay-fallback`, the live model's. Other specs are returned as they are.
pub(crate) fn resolve<'a>(
    cx: &Cx,
    args: &'a ProviderArgs,
) -> Result<std::borrow::Cow<'a, ProviderArgs>, CliError> {
    use std::borrow::Cow;
    let Some(file) = replay_file(&args.model) else {
        return Ok(Cow::Borrowed(args));
    };
    let cassette = match cx.record.cassette() {
        Some(c) => c,
        None => {
            // A run resumed from the store, or started without `prepare`: play back strictly.
            let loaded =
                Cassette::load(file).map_err(|e| CliError::usage(format!("--model replay:{e}")))?;
            let c = Arc::new(loaded.with_redactor(crate::secrets::redactor(cx)));
            // Another run of this command may have set one meanwhile: the first one is used.
            let _ = cx.record.cassette.set(c.clone());
            cx.record.cassette().unwrap_or(c)
        }
    };
    if cassette.has_fallback() {
        // `setup` checked that a fallback was given.
        let mut live = args.clone();
        live.model = cx.record.fallback.get().cloned().unwrap_or_default();
        cx.config.resolve_model(&mut live)?;
        if replay_file(&live.model).is_some() {
            return Err(CliError::usage(
                "--replay-fallback: expected a live model, not a cassette",
            ));
        }
        return Ok(Cow::Owned(live));
    }
    let mut recorded: ProviderArgs = serde_json::from_value(cassette.settings()).map_err(|e| {
        CliError::usage(format!(
            "--model replay:{file}: the cassette's settings do not name a model ({e}); record \
             it with `toolloop run --record FILE`"
        ))
    })?;
    if replay_file(&recorded.model).is_some() {
        return Err(CliError::usage(format!(
            "--model replay:{file}: the cassette's model is itself a cassette"
        )));
    }
    // Never contacted: a request the cassette lacks fails before anything is sent.
    recorded.base_url = Some("http://replay.invalid".into());
    recorded.api_key_env = None;
    recorded.connect_retry = Some(std::time::Duration::ZERO);
    Ok(Cow::Owned(recorded))
}

/// Keeps the `--replay-fallback` model for [`resolve`].
pub(crate) fn note_fallback(cx: &Cx, args: &RecordArgs) {
    if let Some(spec) = &args.replay_fallback {
        let _ = cx.record.fallback.set(spec.trim().to_string());
    }
}

/// With `--replay-tools`, the MCP servers' tools as the cassette recorded them (their results
/// answered from it; no server is started); `None` otherwise, or when the recording had none.
pub(crate) fn replayed_mcp_tools(cx: &Cx) -> Option<Arc<dyn toolloop::tool_source::ToolSource>> {
    let cassette = cx.record.cassette()?;
    if !cassette.is_replay() || !cx.record.replay_tools.get().copied().unwrap_or(false) {
        return None;
    }
    cassette.replayed_source("mcp")
}

/// The tools, their results recorded in the cassette, or answered from it with
/// `--replay-tools`; as they are without a cassette, or when a cassette is played back with the
/// tools run live.
pub(crate) fn wrap_tools(cx: &Cx, tools: Vec<Arc<dyn Tool>>) -> Vec<Arc<dyn Tool>> {
    let Some(cassette) = cx.record.cassette() else {
        return tools;
    };
    let replay_tools = cx.record.replay_tools.get().copied().unwrap_or(false);
    if cassette.is_replay() && !replay_tools {
        return tools;
    }
    tools
        .into_iter()
        .map(|t| cassette.wrap_tool(t, replay_tools))
        .collect()
}
