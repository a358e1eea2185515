//! The context policy of the command's runs (see `toolloop::context::policy`): the flags
//! (`--context-window`, `--compact-at`, `--keep-rounds`, `--spill-over`, `--compact-model`,
//! `--no-compact`, `--no-native-context`, the same keys in the configuration file), the policy they make, and the
//! chat's `/context` and `/compact`.

use crate::CliError;
use crate::args::ContextArgs;
use crate::cx::Cx;
use toolloop::Message;
use toolloop::agent::AgentBuilder;
use toolloop::context::ContextPolicy;
use toolloop::context::estimate::{Size, TokenEstimator};

/// The bytes of a result at which it is spilled, by default, and the preview of its head and
/// tail.
const SPILL_OVER: usize = 16 * 1024;
const PREVIEW: usize = 1024;

impl ContextArgs {
    /// The policy the flags make, for the model `spec` names.
    pub(crate) fn policy(&self, spec: &str) -> Result<ContextPolicy, CliError> {
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
            .map_err(|e| CliError::usage(format!("--spill-over: {e}")))?;
        Ok(policy)
    }

    /// Puts the policy and the summarising model on `builder`.
    pub(crate) fn apply(
        &self,
        cx: &Cx,
        provider: &crate::args::ProviderArgs,
        builder: AgentBuilder,
    ) -> Result<AgentBuilder, CliError> {
        let mut builder = builder.context(self.policy(&provider.model)?);
        if let Some(spec) = &self.compact_model {
            let model = crate::spec::model_from_args_named(cx, provider, Some(spec))
                .map_err(|e| e.context("--compact-model"))?;
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
fn window_of(agent: &crate::args::AgentArgs) -> Option<u64> {
    let spec = agent.provider.model.trim();
    agent.context.policy(spec).ok()?.window.or_else(|| {
        let name = spec.split_once(':').map_or(spec, |(_, m)| m);
        toolloop::context::LimitTable::builtin().context_window(name)
    })
}

/// `/context`: the session's token use by part, as a bar over the window.
pub(crate) async fn show(
    cx: &Cx,
    agent: &crate::args::AgentArgs,
    store: &crate::args::StoreArgs,
    session: &str,
) {
    let store = match crate::durable::open_store(cx, store).await {
        Ok(s) => s,
        Err(e) => return crate::error::warn(crate::error::chain(&e)),
    };
    let messages = match store.session_messages(session).await {
        Ok(m) => m,
        Err(e) => return crate::error::warn(format!("session {session}: {e}")),
    };
    let mut messages = messages;
    if let Some(system) = &agent.system
        && !matches!(messages.first(), Some(Message::System { .. }))
    {
        messages.insert(0, Message::system(system.clone()));
    }
    let specs: Vec<toolloop::model::ToolSpec> = match crate::setup::tools(cx, agent).await {
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
        Err(e) => return crate::error::warn(crate::error::chain(&e)),
    };
    let parts = Parts::of(&messages, &specs);
    eprintln!("{}", parts.render(window_of(agent), 40));
}

/// `/compact [focus]`: the session's conversation is summarised now (by `--compact-model`, or
/// the chat's model), and the next message goes on from the summary.
pub(crate) async fn compact(
    cx: &Cx,
    agent: &crate::args::AgentArgs,
    store: &crate::args::StoreArgs,
    session: &str,
    focus: &str,
) {
    let store = match crate::durable::open_store(cx, store).await {
        Ok(s) => s,
        Err(e) => return crate::error::warn(crate::error::chain(&e)),
    };
    let holder = format!("pid {} (/compact)", std::process::id());
    if let Err(e) = store.lock_session(session, &holder).await {
        return crate::error::warn(e);
    }
    let done = async {
        let messages = store
            .session_messages(session)
            .await
            .map_err(|e| CliError::Store {
                context: format!("session {session}"),
                source: e,
            })?;
        let model = crate::spec::model_from_args_named(
            cx,
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
        .await
        .map_err(CliError::Failed)?;
        // The summary is the model's text, stored with the session: redacted as an answer is.
        let lead = compacted
            .messages
            .iter()
            .take_while(|m| matches!(m, Message::System { .. }))
            .count();
        if let Some(summary) = compacted.messages.get_mut(lead) {
            *summary = Message::user(crate::secrets::redactor(cx).redact(summary.text()));
        }
        store
            .save_session(session, &compacted.messages)
            .await
            .map_err(|e| CliError::Store {
                context: format!("session {session}"),
                source: e,
            })?;
        let before = Parts::of(&messages, &[]).total();
        let after = Parts::of(&compacted.messages, &[]).total();
        Ok::<_, CliError>(format!(
            "compacted: {} messages summarised, about {before} → {after} tokens",
            compacted.summarised
        ))
    }
    .await;
    let _ = store.unlock_session(session, &holder).await;
    match done {
        Ok(line) => eprintln!("{line}"),
        Err(e) => crate::error::warn(format!("/compact: {}", crate::error::chain(&e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::parse_share;

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
