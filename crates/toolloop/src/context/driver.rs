//! The driver's side of the context policy (see [`crate::context::policy`]): the summarisation
//! call a [`Step::Compact`] asks for, the tools a request offers (`read_result` once a result
//! was spilled), and what a provider's refusal of a request too large for its window becomes.
//! [`crate::Agent`]'s driver and any other driver (a durable-execution engine's) use these.

use crate::context::policy;
use crate::engine::{CompactRequest, Compaction, Input, Machine, Step};
use crate::message::Message;
use crate::model::{Model, ModelError, ModelRequest, ModelSettings, ToolChoice, ToolSpec};
use crate::price::Price;
use std::borrow::Cow;

/// The settings of a summarisation call: the run's (model name, temperature, extra fields),
/// without tools, tool choice, output schema or provider-native context management;
/// `separate` (a model of its own) uses its own name.
pub fn summary_settings(run: &ModelSettings, separate: bool) -> ModelSettings {
    ModelSettings {
        model: if separate { None } else { run.model.clone() },
        tool_choice: ToolChoice::default(),
        output: None,
        context: None,
        ..run.clone()
    }
}

/// The settings of the next model call: `settings` with the context management the machine
/// asks of the provider ([`Machine::native_request`], in [`ModelSettings::context`]).
/// Borrowed as they are when that changes nothing.
pub fn request_settings<'a>(
    machine: &Machine,
    settings: &'a ModelSettings,
) -> Cow<'a, ModelSettings> {
    let native = machine.native_request();
    if settings.context == native {
        Cow::Borrowed(settings)
    } else {
        Cow::Owned(ModelSettings {
            context: native,
            ..settings.clone()
        })
    }
}

/// Makes the summarisation call of a [`Step::Compact`] and gives the input that reports it:
/// [`Input::Compacted`] with the summary, its usage and its cost at `price`, or
/// [`Input::CompactionFailed`].
pub async fn summarise(
    model: &dyn Model,
    settings: &ModelSettings,
    price: Option<&Price>,
    request: &CompactRequest,
) -> Input {
    let call = ModelRequest {
        messages: (&request.messages).into(),
        reminders: &[],
        tools: &[],
        settings,
    };
    match model.complete(&call).await {
        Ok(response) => match response.text.filter(|t| !t.trim().is_empty()) {
            Some(summary) => Input::Compacted {
                round: request.round,
                compaction: Compaction {
                    cut: request.cut,
                    summary,
                    usage: response.usage,
                    cost: response.usage.and_then(|u| price.map(|p| p.cost(&u))),
                },
            },
            None => Input::CompactionFailed {
                round: request.round,
                message: "the summariser answered with no text".into(),
            },
        },
        Err(e) => Input::CompactionFailed {
            round: request.round,
            message: e.to_string(),
        },
    }
}

/// The tools a request offers: the run's, and `read_result` when the machine offers it
/// ([`Machine::offers_read_result`]).
pub fn request_tools<'a>(machine: &Machine, tools: &'a [ToolSpec]) -> Cow<'a, [ToolSpec]> {
    if machine.offers_read_result() {
        let mut all = tools.to_vec();
        all.push(policy::read_result_spec());
        Cow::Owned(all)
    } else {
        Cow::Borrowed(tools)
    }
}

/// The input a failed model call of round `round` becomes: [`Input::ContextOverflowed`] for a
/// refusal for size when the machine has a context policy (it compacts and retries), else
/// [`Input::ModelFailed`].
pub fn failed_call_input(machine: &Machine, round: u32, error: ModelError) -> Input {
    match error {
        ModelError::ContextOverflow(overflow) if machine.context_policy().is_some() => {
            Input::ContextOverflowed { round, overflow }
        }
        e => Input::ModelFailed {
            round,
            message: e.to_string(),
        },
    }
}

/// The input of a [`Step::EditContext`]: the edits, logged as they are.
pub fn edits_input(step: Step) -> Option<Input> {
    match step {
        Step::EditContext { round, edits } => Some(Input::ContextEdited { round, edits }),
        _ => None,
    }
}

/// A compacted conversation ([`compact_conversation`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    /// The conversation: its system messages, the summary, and the messages kept.
    pub messages: Vec<Message>,
    /// The messages the summary replaced.
    pub summarised: usize,
    /// The summariser's usage.
    pub usage: Option<crate::usage::Usage>,
}

/// Compacts a conversation between runs (a chat's `/compact`): everything but its system
/// messages and its last user turn (and what follows it) is summarised by one call to `model`
/// with [`policy::COMPACT_PROMPT`], and `focus`, when given, is what the summary must keep
/// above all. A conversation with nothing before its last user turn is summarised whole.
/// `max_bytes` bounds the rendered conversation sent to the summariser.
pub async fn compact_conversation(
    model: &dyn Model,
    settings: &ModelSettings,
    messages: &[Message],
    focus: Option<&str>,
    max_bytes: usize,
) -> Result<Compacted, String> {
    let lead = messages
        .iter()
        .take_while(|m| matches!(m, Message::System { .. }))
        .count();
    let last_user = messages
        .iter()
        .rposition(|m| matches!(m, Message::User { .. }))
        .filter(|&i| i > lead);
    let cut = last_user.unwrap_or(messages.len());
    if cut <= lead {
        return Err("there is nothing to compact yet".into());
    }
    let mut instruction = format!(
        "{}\n{}",
        policy::COMPACT_MARKER,
        policy::render_for_summary(&messages[lead..cut], max_bytes)
    );
    if let Some(focus) = focus.map(str::trim).filter(|f| !f.is_empty()) {
        instruction = format!("Above all, keep what concerns: {focus}\n\n{instruction}");
    }
    let request_messages = [
        Message::system(policy::COMPACT_PROMPT),
        Message::user(instruction),
    ];
    let request = ModelRequest {
        messages: (&request_messages).into(),
        reminders: &[],
        tools: &[],
        settings,
    };
    let response = model.complete(&request).await.map_err(|e| e.to_string())?;
    let summary = response
        .text
        .filter(|t| !t.trim().is_empty())
        .ok_or("the summariser answered with no text")?;
    let mut out = messages[..lead].to_vec();
    out.push(Message::user(format!(
        "{}\n{summary}",
        policy::SUMMARY_HEADER
    )));
    out.extend_from_slice(&messages[cut..]);
    Ok(Compacted {
        messages: out,
        summarised: cut - lead,
        usage: response.usage,
    })
}
