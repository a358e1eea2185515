//! The context policy of the command's runs (see `toolloop::context::policy`): the flags
//! (`--context-window`, `--compact-at`, `--keep-rounds`, `--spill-over`, `--compact-model`,
//! `--no-compact`, `--no-native-context`, the same keys in the configuration file), the policy they make, and the
//! chat's `/context` and `/compact`.

use clap::Args;
use toolloop::Message;
use toolloop::agent::AgentBuilder;
use toolloop::context::ContextPolicy;
use toolloop::context::estimate::{Size, TokenEstimator};

/// How a run stays inside the model's context window.
#[derive(Args, Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ContextArgs {
    /// The model's context window in tokens (default: the model's, from LiteLLM's dataset; a
    /// mock's `window=`). Without one, the conversation is compacted only when the provider
    /// refuses a request for its size.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Compact the conversation when the next request is estimated past this share of the
    /// window, above 0 and at most 1 (default 0.8).
    #[arg(long, value_name = "SHARE", value_parser = parse_share)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_at: Option<f64>,
    /// Keep the results of the last K rounds whole; older ones are cut to a one-line stub
    /// (default 8; 0: never).
    #[arg(long, value_name = "K")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_rounds: Option<u32>,
    /// Send a tool result longer than this many bytes as its head and tail, the model reading
    /// the rest with `read_result` (default 16384; 0: never).
    #[arg(long, value_name = "BYTES")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_over: Option<usize>,
    /// The model that writes the summary when the conversation is compacted (provider:model,
    /// or a configured name; default: the run's model).
    #[arg(long, value_name = "SPEC")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_model: Option<String>,
    /// Never compact (results are still cleared and spilled).
    #[arg(long)]
    #[serde(default)]
    pub no_compact: bool,
    /// Clear and compact on this side only, never with the provider's own context management
    /// (Anthropic's clearing of old tool results, the Responses API's compaction), which is
    /// used by default where the API offers it.
    #[arg(long)]
    #[serde(default)]
    pub no_native_context: bool,
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a share of the window; expected a number above 0 and at most 1 (0.8)"
        )),
    }
}

/// The bytes of a result at which it is spilled, by default, and the preview of its head and
/// tail.
const SPILL_OVER: usize = 16 * 1024;
const PREVIEW: usize = 1024;

impl ContextArgs {
    /// The policy the flags make, for the model `spec` names.
    pub(crate) fn policy(&self, spec: &str) -> Result<ContextPolicy, String> {
        let defaults = ContextPolicy::default();
        let spill_over = match self.spill_over.unwrap_or(SPILL_OVER) {
            0 => None,
            n => Some(n),
        };
        let policy = ContextPolicy {
            window: self.context_window.or_else(|| mock_window(spec)),
            compact_at: self.compact_at.unwrap_or(defaults.compact_at),
            keep_rounds: self.keep_rounds.unwrap_or(defaults.keep_rounds),
            spill_over,
            spill_preview: spill_over.map_or(0, |n| PREVIEW.min(n / 4)),
            compact: !self.no_compact,
            native: !self.no_native_context,
            provider: defaults.provider,
        };
        policy
            .validate()
            .map_err(|e| format!("--spill-over: {e}"))?;
        Ok(policy)
    }

    /// Puts the policy and the summarising model on `builder`.
    pub(crate) fn apply(
        &self,
        provider: &crate::spec::ProviderArgs,
        builder: AgentBuilder,
    ) -> Result<AgentBuilder, String> {
        let mut builder = builder.context(self.policy(&provider.model)?);
        if let Some(spec) = &self.compact_model {
            let model = crate::spec::model_from_args_named(provider, Some(spec))
                .map_err(|e| format!("--compact-model: {e}"))?;
            builder = builder.context_model_arc(model);
        }
        Ok(builder)
    }
}

/// The window a mock scenario gives (`…mock:window=8000`), so that a run against the mock
/// knows it as it knows a real model's.
fn mock_window(spec: &str) -> Option<u64> {
    let name = spec.trim().split_once(':').map_or(spec, |(_, rest)| rest);
    if !name.starts_with("mock") {
        return None;
    }
    toolloop_mock::Scenario::from_model(name).ok()?.window
}

/// Tokens by part of a conversation, as `/context` shows them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parts {
    pub system: u64,
    pub tools: u64,
    pub history: u64,
    pub results: u64,
}

impl Parts {
    /// Estimates the parts of `messages` and the tool catalog `tools`.
    pub(crate) fn of(messages: &[Message], tools: &[toolloop::model::ToolSpec]) -> Parts {
        let e = TokenEstimator::new();
        let mut parts = Parts {
            tools: e.tokens_of(Size::of_tools(tools)),
            ..Parts::default()
        };
        for m in messages {
            let t = e.tokens_of_message(m);
            match m {
                Message::System { .. } => parts.system += t,
                Message::Tool(_) => parts.results += t,
                _ => parts.history += t,
            }
        }
        parts
    }

    fn total(&self) -> u64 {
        self.system + self.tools + self.history + self.results
    }

    /// The parts as a bar of `width` cells over the window (or over their total when the
    /// window is not known), with a legend.
    pub(crate) fn render(&self, window: Option<u64>, width: usize) -> String {
        let scale = window.unwrap_or(self.total()).max(1) as f64;
        // A part that is there shows, however small.
        let cells = |t: u64| match ((t as f64 / scale) * width as f64).round() as usize {
            0 if t > 0 => 1,
            n => n,
        };
        let mut bar = String::new();
        for (t, c) in [
            (self.system, 'S'),
            (self.tools, 'T'),
            (self.history, 'H'),
            (self.results, 'R'),
        ] {
            bar.extend(std::iter::repeat_n(c, cells(t)));
        }
        let mut bar: String = bar.chars().take(width).collect();
        let used: usize = bar.chars().count();
        if used < width {
            bar.extend(std::iter::repeat_n('·', width - used));
        }
        let share = match window {
            Some(w) => format!(
                "{} of {w} tokens ({:.0}%)",
                self.total(),
                self.total() as f64 * 100.0 / w.max(1) as f64
            ),
            None => format!("{} tokens (window unknown)", self.total()),
        };
        format!(
            "[{bar}] {share}\n  S system {}  T tools {}  H history {}  R results {}",
            self.system, self.tools, self.history, self.results
        )
    }
}

/// The window `agent` runs with: `--context-window`, a mock's, or the model's known one.
fn window_of(agent: &crate::run::AgentArgs) -> Option<u64> {
    let spec = agent.provider.model.trim();
    agent.context.policy(spec).ok()?.window.or_else(|| {
        let name = spec.split_once(':').map_or(spec, |(_, m)| m);
        toolloop::context::LimitTable::builtin().context_window(name)
    })
}

/// `/context`: the session's token use by part, as a bar over the window.
pub(crate) async fn show(
    agent: &crate::run::AgentArgs,
    store: &crate::durable::StoreArgs,
    session: &str,
) {
    let Ok(store) = crate::durable::open_store(store).await else {
        return;
    };
    let messages = match store.session_messages(session).await {
        Ok(m) => m,
        Err(e) => {
            eprintln!("toolloop: session {session}: {e}");
            return;
        }
    };
    let mut messages = messages;
    if let Some(system) = &agent.system
        && !matches!(messages.first(), Some(Message::System { .. }))
    {
        messages.insert(0, Message::system(system.clone()));
    }
    let specs: Vec<toolloop::model::ToolSpec> = match crate::run::tools(agent).await {
        Ok(tools) => tools
            .all()
            .await
            .iter()
            .map(|t| toolloop::model::ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.parameters().clone(),
            })
            .collect(),
        Err(e) => {
            let _ = e.report();
            return;
        }
    };
    let parts = Parts::of(&messages, &specs);
    eprintln!("{}", parts.render(window_of(agent), 40));
}

/// `/compact [focus]`: the session's conversation is summarised now (by `--compact-model`, or
/// the chat's model), and the next message goes on from the summary.
pub(crate) async fn compact(
    agent: &crate::run::AgentArgs,
    store: &crate::durable::StoreArgs,
    session: &str,
    focus: &str,
) {
    let Ok(store) = crate::durable::open_store(store).await else {
        return;
    };
    let holder = format!("pid {} (/compact)", std::process::id());
    if let Err(e) = store.lock_session(session, &holder).await {
        eprintln!("toolloop: {e}");
        return;
    }
    let done = async {
        let messages = store
            .session_messages(session)
            .await
            .map_err(|e| format!("session {session}: {e}"))?;
        let model = crate::spec::model_from_args_named(
            &agent.provider,
            agent.context.compact_model.as_deref(),
        )?;
        let settings = toolloop::model::ModelSettings {
            temperature: agent.temperature,
            max_output_tokens: agent.max_output_tokens,
            ..Default::default()
        };
        let max_bytes = window_of(agent).map_or(400_000, |w| (w as usize).saturating_mul(2));
        let mut compacted = toolloop::context::driver::compact_conversation(
            &*model,
            &settings,
            &messages,
            Some(focus),
            max_bytes,
        )
        .await?;
        // The summary is the model's text, stored with the session: redacted as an answer is.
        let lead = compacted
            .messages
            .iter()
            .take_while(|m| matches!(m, Message::System { .. }))
            .count();
        if let Some(summary) = compacted.messages.get_mut(lead) {
            *summary = Message::user(crate::secrets::redactor().redact(summary.text()));
        }
        store
            .save_session(session, &compacted.messages)
            .await
            .map_err(|e| format!("session {session}: {e}"))?;
        let before = Parts::of(&messages, &[]).total();
        let after = Parts::of(&compacted.messages, &[]).total();
        Ok::<_, String>(format!(
            "compacted: {} messages summarised, about {before} → {after} tokens",
            compacted.summarised
        ))
    }
    .await;
    let _ = store.unlock_session(session, &holder).await;
    match done {
        Ok(line) => eprintln!("{line}"),
        Err(e) => eprintln!("toolloop: /compact: {}", crate::terminal::escape(&e, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_the_policy() {
        let a = ContextArgs::default();
        let p = a.policy("openai:gpt-4o").unwrap();
        assert_eq!(p.window, None);
        assert_eq!(p.compact_at, 0.8);
        assert_eq!(p.keep_rounds, 8);
        assert_eq!(p.spill_over, Some(SPILL_OVER));
        assert!(p.compact);
        assert!(p.native, "the providers' own stages by default");
        let p = a.policy("openai:mock:rounds=3,window=8000").unwrap();
        assert_eq!(p.window, Some(8000));
        let a = ContextArgs {
            context_window: Some(1000),
            compact_at: Some(0.5),
            keep_rounds: Some(0),
            spill_over: Some(0),
            no_compact: true,
            no_native_context: true,
            ..ContextArgs::default()
        };
        let p = a.policy("mock:window=8000").unwrap();
        assert!(!p.native);
        assert_eq!(
            (
                p.window,
                p.compact_at,
                p.keep_rounds,
                p.spill_over,
                p.compact
            ),
            (Some(1000), 0.5, 0, None, false)
        );
        assert!(parse_share("0").is_err() && parse_share("1.5").is_err());
        assert!(parse_share("nan").is_err() && parse_share("x").is_err());
        assert_eq!(parse_share("1"), Ok(1.0));
    }

    #[test]
    fn the_bar_shows_each_part() {
        let parts = Parts {
            system: 100,
            tools: 100,
            history: 200,
            results: 400,
        };
        let r = parts.render(Some(1000), 10);
        assert!(
            r.starts_with("[STHHRRRR··] 800 of 1000 tokens (80%)"),
            "{r}"
        );
        let r = parts.render(None, 8);
        assert!(r.starts_with("[STHHRRRR] 800 tokens"), "{r}");
        let r = parts.render(Some(100_000), 10);
        assert!(
            r.starts_with("[STHR······] 800 of 100000 tokens (1%)"),
            "{r}"
        );
    }
}
