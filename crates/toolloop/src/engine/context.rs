//! The context policy, applied by the machine (see [`crate::context::policy`]): the
//! conversation it sends (the *view*) next to the transcript it keeps whole, the edits made to
//! the view at the start of a round (results spilled and cleared, [`ContextEdits`]), the
//! compaction of its older part ([`CompactRequest`]), and a provider's refusal of a request too
//! large for its window.
//!
//! Each of these is decided by the machine, asked of the driver with a [`Step`]
//! ([`Step::EditContext`], [`Step::Compact`]), and comes back as an [`Input`]
//! ([`Input::ContextEdited`], [`Input::Compacted`], [`Input::CompactionFailed`],
//! [`Input::ContextOverflowed`]) that the driver logs: a replay applies the logged edits and
//! summaries, calls no model, and sends what the run sent. A record the log lacks (a log of a
//! run with another policy, or none) is taken as no edit and no compaction.
//!
//! The size of the next request is estimated with a [`TokenEstimator`] that follows the view
//! (every change to it is added or removed, so the estimate is O(1) per round) and is anchored
//! on the input tokens each response reports.

use super::*;
use crate::context::ContextOverflow;
use crate::context::estimate::{Size, TokenEstimator};
use crate::context::policy::{self, COMPACT_MARKER, COMPACT_PROMPT, ContextPolicy, READ_RESULT};
use crate::message::Messages;

/// The conversation as it is sent, and what the policy did to it: part of [`LoopState`] when a
/// context policy is set.
///
/// The view is kept as edits over the transcript, not as a copy of it: its own messages first
/// (after a compaction, the leading system messages and the summary), then the transcript's
/// from a point on, with the results spilled and cleared replaced. [`ContextState::view`]
/// reads it over the transcript ([`crate::Outcome::view`], [`Machine::sent_messages`]).
///
/// Its serde form holds those parts; a state saved in the earlier form, with the whole view
/// in `view`, loads as the same view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "SavedContextState")]
pub struct ContextState {
    /// The view's own messages, before its part read from the transcript.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    head: Vec<Message>,
    /// The view's messages after `head` are the transcript's from this index on (to `synced`).
    #[serde(default)]
    shared_from: usize,
    /// The view's messages that differ from the transcript's (results spilled and cleared),
    /// by view index, in order of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    edited: Vec<(usize, Message)>,
    /// How many of the transcript's messages the view holds (the rest are added at the next
    /// round's start).
    pub synced: usize,
    /// The view's results from here on have not been weighed for spilling.
    pub unspilled_from: usize,
    /// Every tool result of the view before this index is cleared.
    pub cleared_upto: usize,
    /// The view indices of the assistant turns that made tool calls, oldest first.
    pub turns: Vec<usize>,
    /// Results spilled so far (`read_result` is offered once one was).
    pub spilled: u32,
    /// The round whose context is ready (edits made, compaction done or not needed).
    pub prepared: u32,
    /// The round whose model call was refused for its size and retried after a compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<u32>,
    /// Compactions made.
    pub compactions: u32,
    /// The provider refused the context management asked of it
    /// ([`crate::context::NativeReport::refused`]): the machine clears and compacts itself
    /// from then on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub native_refused: bool,
    /// The summariser's usage, apart from the run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The summariser's cost, while every summarisation's cost was known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// [`ContextState`] as saved, in its form today or in the earlier one (the whole view in
/// `view`).
#[derive(Deserialize)]
struct SavedContextState {
    #[serde(default)]
    view: Option<Vec<Message>>,
    #[serde(default)]
    head: Vec<Message>,
    #[serde(default)]
    shared_from: usize,
    #[serde(default)]
    edited: Vec<(usize, Message)>,
    synced: usize,
    unspilled_from: usize,
    cleared_upto: usize,
    turns: Vec<usize>,
    spilled: u32,
    prepared: u32,
    #[serde(default)]
    retried: Option<u32>,
    compactions: u32,
    #[serde(default)]
    native_refused: bool,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    cost: Option<f64>,
}

impl From<SavedContextState> for ContextState {
    fn from(s: SavedContextState) -> Self {
        // The earlier form held the whole view: it is the view's own part, and the
        // transcript's messages after `synced` follow it.
        let (head, shared_from, mut edited) = match s.view {
            Some(view) => (view, s.synced, Vec::new()),
            None => (s.head, s.shared_from, s.edited),
        };
        // One edit per message, in order, none in the view's own part: a damaged file must
        // not break the order [`Messages`] reads them in.
        edited.sort_by_key(|(i, _)| *i);
        edited.dedup_by_key(|(i, _)| *i);
        edited.retain(|(i, _)| *i >= head.len());
        ContextState {
            head,
            shared_from: shared_from.min(s.synced),
            edited,
            synced: s.synced,
            unspilled_from: s.unspilled_from,
            cleared_upto: s.cleared_upto,
            turns: s.turns,
            spilled: s.spilled,
            prepared: s.prepared,
            retried: s.retried,
            compactions: s.compactions,
            native_refused: s.native_refused,
            usage: s.usage,
            cost: s.cost,
        }
    }
}

impl ContextState {
    /// The conversation as sent, read over `transcript` (the run's transcript:
    /// [`LoopState::messages`], [`crate::Outcome::messages`]): its messages with spilled and
    /// cleared results and compacted parts replaced, read in place.
    pub fn view<'a>(&'a self, transcript: &'a [Message]) -> Messages<'a> {
        let to = self.synced.min(transcript.len());
        let tail = &transcript[self.shared_from.min(to)..to];
        Messages::edited(&self.head, tail, &self.edited)
    }

    /// How many messages the view holds.
    pub fn view_len(&self) -> usize {
        self.head.len() + self.synced.saturating_sub(self.shared_from)
    }

    /// Whether the state is one a run leaves over a transcript of `transcript` messages: it
    /// holds no more of the transcript than there is, and its indices are the view's. A
    /// snapshot is checked when it is read ([`Snapshot`]), so that a damaged or hand-written
    /// one is refused rather than resumed into a machine that reads past the view.
    pub(super) fn check(&self, transcript: usize) -> Result<(), String> {
        if self.synced > transcript {
            return Err(format!(
                "the context state's `synced` is {}, the transcript holds {transcript} messages",
                self.synced
            ));
        }
        let len = self.view_len();
        if let Some((i, _)) = self.edited.last()
            && *i >= len
        {
            return Err(format!(
                "the context state's `edited` replaces message {i}, the view holds {len}"
            ));
        }
        for (name, at) in [
            ("unspilled_from", self.unspilled_from),
            ("cleared_upto", self.cleared_upto),
        ] {
            if at > len {
                return Err(format!(
                    "the context state's `{name}` is {at}, the view holds {len} messages"
                ));
            }
        }
        if !self.turns.windows(2).all(|w| w[0] < w[1])
            || self.turns.last().is_some_and(|&t| t >= len)
        {
            return Err(format!(
                "the context state's `turns` are not increasing indices of the view's {len} \
                 messages"
            ));
        }
        Ok(())
    }

    /// Puts `message` in the view at `index`, in place of what is there.
    fn replace(&mut self, index: usize, message: Message) {
        if let Some(m) = self.head.get_mut(index) {
            *m = message;
            return;
        }
        match self.edited.binary_search_by_key(&index, |(i, _)| *i) {
            Ok(j) => self.edited[j].1 = message,
            Err(j) => self.edited.insert(j, (index, message)),
        }
    }
}

/// `r` with `content` in place of its own (and its images, unless `images`).
fn replaced(r: &ToolResult, content: String, images: bool) -> Message {
    Message::Tool(ToolResult {
        call_id: r.call_id.clone(),
        name: r.name.clone(),
        content,
        is_error: r.is_error,
        images: if images { r.images.clone() } else { Vec::new() },
    })
}

/// The stub a cleared result becomes, when it is shorter than the result.
fn cleared(r: &ToolResult) -> Option<Message> {
    clears(r).then(|| {
        let stub = policy::cleared_stub(&r.name, &r.call_id, r.content.len());
        replaced(r, stub, false)
    })
}

/// Whether clearing `r` makes it shorter (the stub is shorter than its content), known
/// without building the stub.
fn clears(r: &ToolResult) -> bool {
    policy::shorter_stub_len(&r.name, &r.call_id, r.content.len()).is_some()
}

/// Edits to the view at the start of a round ([`Step::EditContext`], [`Input::ContextEdited`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextEdits {
    /// Results sent as a preview (by call id), among those added since the last edit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spilled: Vec<String>,
    /// Bytes shown at the head and at the tail of a spilled result.
    #[serde(default)]
    pub preview: usize,
    /// Every tool result of the view before this index becomes a stub (unchanged when it is
    /// not past the last edit's).
    pub clear_before: usize,
}

/// A summarisation to make ([`Step::Compact`]): the view's messages `lead..cut` are replaced
/// by one user message holding the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactRequest {
    /// The round about to run (or, after a refusal, the round retried).
    pub round: u32,
    /// The view's leading system messages, kept.
    pub lead: usize,
    /// The view's messages from here on are kept.
    pub cut: usize,
    /// The estimated tokens of the next request before the compaction.
    pub tokens_before: u64,
    /// Whether a provider's refusal asked for it (the call is retried after it).
    pub forced: bool,
    /// The summarisation call's messages: [`COMPACT_PROMPT`] as the system prompt, the part
    /// to summarise rendered as text ([`policy::render_for_summary`]) as the user message.
    pub messages: Vec<Message>,
}

/// The summariser's answer ([`Input::Compacted`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// The view index the request cut at ([`CompactRequest::cut`]).
    pub cut: usize,
    /// The summary.
    pub summary: String,
    /// The summariser's usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Its cost, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

impl ContextEdits {
    fn is_empty(&self, cleared_upto: usize) -> bool {
        self.spilled.is_empty() && self.clear_before <= cleared_upto
    }
}

/// The machine's estimator of the next request's size (not part of the state: rebuilt from
/// the view).
#[derive(Debug, Clone, Default)]
pub(super) struct Estimate {
    pub(super) tokens: TokenEstimator,
    /// The size of the tools offered.
    pub(super) tools: Size,
    /// The size of the current round's reminders (counted only while a response is read).
    pub(super) reminders: Size,
}

impl Machine {
    /// The context policy in force, if any.
    pub fn context_policy(&self) -> Option<&ContextPolicy> {
        self.config.context.as_ref()
    }

    /// What the context policy did so far, when one is set.
    pub fn context_state(&self) -> Option<&ContextState> {
        self.state.context.as_deref()
    }

    /// The conversation to send to the model: the transcript itself, or, with a context policy,
    /// the view the policy keeps of it (see [`crate::context::policy`]), read in place.
    pub fn sent_messages(&self) -> Messages<'_> {
        match &self.state.context {
            Some(c) => c.view(&self.state.messages),
            None => Messages::from(self.state.messages.as_slice()),
        }
    }

    /// What the next request asks of the provider itself, if anything (see
    /// [`crate::context::native`]): [`ContextPolicy::native_request`], with the clearing of
    /// old results where the machine's own would be: the machine makes its clearing edits as
    /// ever (in batches of [`ContextPolicy::keep_rounds`] rounds, and all but the last round
    /// past the threshold), logged, but leaves the view whole, and the request keeps the
    /// results of the calls after the edits' boundary. The provider then clears the same
    /// results round after round, more only at a batch, and a prompt cache holds between
    /// batches. A function of the view and the logged edits: a resumed run asks what the run
    /// would have asked.
    pub fn native_request(&self) -> Option<crate::context::NativeContext> {
        let policy = self.config.context.as_ref()?;
        let mut request = policy.native_request()?;
        if let Some(clear) = request.clear_tool_results.as_mut() {
            let c = self.state.context.as_deref()?;
            let view = c.view(&self.state.messages);
            let kept: usize = c
                .turns
                .iter()
                .filter(|&&t| t >= c.cleared_upto)
                .map(|&t| match view.get(t) {
                    Some(Message::Assistant(a)) => a.tool_calls.len(),
                    _ => 0,
                })
                .sum();
            clear.keep_tool_uses = u32::try_from(kept).unwrap_or(u32::MAX);
        }
        Some(request)
    }

    /// The estimated input tokens of the next request (with a context policy; `None` without).
    pub fn context_estimate(&self) -> Option<u64> {
        self.state.context.as_ref()?;
        Some(self.estimate.tokens.estimate())
    }

    /// Whether the model is offered `read_result` (a result was spilled and the run's tools
    /// have no tool of that name): the driver adds [`policy::read_result_spec`] to the tools
    /// it sends.
    pub fn offers_read_result(&self) -> bool {
        self.state.context.as_ref().is_some_and(|c| c.spilled > 0)
            && self.catalog.get(READ_RESULT).is_none()
    }

    /// Sets up the view for a new machine, or rebuilds the estimate for a resumed one.
    pub(super) fn init_context(&mut self) {
        if self.config.context.is_none() {
            self.state.context = None;
            return;
        }
        if self.state.context.is_none() {
            self.state.context = Some(Box::default());
        }
        if self
            .state
            .context
            .as_ref()
            .is_some_and(|c| c.native_refused)
        {
            self.hand_back_native();
        }
        self.sync_view();
        self.rebuild_estimate(None);
    }

    /// A fresh estimate of the view and the tools, at the ratio calibrated so far.
    fn rebuild_estimate(&mut self, bytes_per_token: Option<f64>) {
        let mut tokens =
            bytes_per_token.map_or_else(TokenEstimator::new, TokenEstimator::with_bytes_per_token);
        let mut tools = Size::of_tools(self.catalog.specs());
        if self.offers_read_result() {
            let s = Size::of_tools(std::slice::from_ref(&policy::read_result_spec()));
            tools.bytes += s.bytes;
        }
        tokens.add_size(tools);
        if let Some(c) = &self.state.context {
            for m in c.view(&self.state.messages) {
                tokens.add(m);
            }
        }
        self.estimate = Estimate {
            tokens,
            tools,
            reminders: Size::default(),
        };
    }

    /// The tools changed: the estimate follows.
    pub(super) fn context_tools_changed(&mut self) {
        if self.state.context.is_some() {
            let ratio = self.estimate.tokens.bytes_per_token();
            self.estimate.tokens.remove_size(self.estimate.tools);
            let mut tools = Size::of_tools(self.catalog.specs());
            if self.offers_read_result() {
                tools.bytes += Size::of_tools(&[policy::read_result_spec()]).bytes;
            }
            self.estimate.tokens.add_size(tools);
            self.estimate.tools = tools;
            let _ = ratio;
        }
    }

    /// Adds the transcript's new messages to the view, as they are.
    pub(super) fn sync_view(&mut self) {
        let Some(c) = self.state.context.as_mut() else {
            return;
        };
        // The view reads the transcript's messages in place: only the turns and the estimate
        // follow.
        let from = c.synced.min(self.state.messages.len());
        let at = c.view_len();
        for (i, m) in self.state.messages[from..].iter().enumerate() {
            if let Message::Assistant(a) = m
                && !a.tool_calls.is_empty()
            {
                c.turns.push(at + i);
            }
            self.estimate.tokens.add(m);
        }
        c.synced = self.state.messages.len();
    }

    /// The round's reminders are sent with the next request: counted while its response is
    /// read.
    pub(super) fn context_round_started(&mut self, reminders: &[String]) {
        if self.state.context.is_some() {
            self.sync_view();
            let bytes = reminders.iter().map(|r| r.len() as u64).sum();
            self.estimate.reminders = Size { bytes, images: 0 };
        }
    }

    /// A response reported the request's input tokens: the estimate is anchored on them.
    ///
    /// When the provider may edit the request itself (see [`crate::context::native`]), the
    /// reported figure holds less than the view: the estimate is anchored on it, and the ratio
    /// of bytes per token is not calibrated from it. What the provider reports it did is
    /// told as an event.
    pub(super) fn context_observed(
        &mut self,
        usage: Option<&Usage>,
        edited: Option<crate::context::NativeReport>,
    ) {
        let Some(policy) = self.config.context.as_ref() else {
            return;
        };
        let native = policy.native_clears() || policy.native_compacts();
        let reminders = std::mem::take(&mut self.estimate.reminders);
        if let Some(u) = usage
            && u.input_tokens > 0
        {
            self.estimate.tokens.add_size(reminders);
            if native || edited.is_some() {
                self.estimate.tokens.observe_edited(u.input_tokens);
            } else {
                self.estimate.tokens.observe(u.input_tokens);
            }
            self.estimate.tokens.remove_size(reminders);
        }
        if let Some(report) = edited {
            if report.refused {
                self.native_refused();
            }
            let round = self.state.round;
            emit!(self, Event::ContextEditedByProvider { round, report });
        }
    }

    /// The provider refused the context management asked of it: the machine does the stages
    /// itself from the next round on. The results the provider was to clear (the view kept
    /// them whole, [`Machine::native_request`]) become stubs now, as the estimate already
    /// counts them. A function of the view and of the logged response: a replay makes the same
    /// switch at the same point.
    fn native_refused(&mut self) {
        let Some(c) = self.state.context.as_mut() else {
            return;
        };
        if std::mem::replace(&mut c.native_refused, true) {
            return;
        }
        let cleared_natively = self
            .config
            .context
            .as_ref()
            .is_some_and(ContextPolicy::native_clears);
        if cleared_natively {
            let upto = c.cleared_upto.min(c.view_len());
            for i in 0..upto {
                if let Some(Message::Tool(r)) = c.view(&self.state.messages).get(i)
                    && let Some(stub) = cleared(r)
                {
                    c.replace(i, stub);
                }
            }
        }
        self.hand_back_native();
    }

    /// The policy in force without the provider's stages.
    fn hand_back_native(&mut self) {
        if let Some(policy) = Arc::make_mut(&mut self.config).context.as_mut() {
            policy.provider = crate::context::NativeSupport::default();
        }
    }

    /// At a round's start (before its reminders and its model call), the step the context
    /// policy asks for, if any: edits to the view, then a compaction.
    pub(super) fn context_step(&mut self) -> Option<Step> {
        let policy = self.config.context.clone()?;
        let next = self.state.round + 1;
        if self.state.context.as_ref()?.prepared >= next {
            return None;
        }
        self.sync_view();
        let edits = self.plan_edits(&policy);
        let c = self.state.context.as_mut()?;
        if !edits.is_empty(c.cleared_upto) {
            self.state.phase = Phase::EditingContext {
                edits: edits.clone(),
            };
            return Some(Step::EditContext { round: next, edits });
        }
        c.unspilled_from = c.view_len();
        // Past the threshold, the results of every round but the last are cleared first: a
        // model call is made only when that is not enough.
        if let Some(edits) = self.pressure_clear(&policy) {
            self.state.phase = Phase::EditingContext {
                edits: edits.clone(),
            };
            return Some(Step::EditContext { round: next, edits });
        }
        if let Some(request) = self.plan_compaction(&policy, next, false) {
            self.state.phase = Phase::Compacting {
                request: Box::new(request.clone()),
                retry: None,
            };
            return Some(Step::Compact(Box::new(request)));
        }
        if let Some(c) = self.state.context.as_mut() {
            c.prepared = next;
        }
        None
    }

    /// The edits the policy makes to the view now.
    fn plan_edits(&self, policy: &ContextPolicy) -> ContextEdits {
        let Some(c) = &self.state.context else {
            return ContextEdits::default();
        };
        let mut spilled = Vec::new();
        if let Some(over) = policy.spill_over {
            let view = c.view(&self.state.messages);
            for m in view.slice(c.unspilled_from.min(view.len())..) {
                if let Message::Tool(r) = m
                    && r.content.len() > over
                    && r.name != READ_RESULT
                {
                    spilled.push(r.call_id.clone());
                }
            }
        }
        // Results are cleared in batches: once `keep` rounds past the last `keep` wait, all of
        // them at once. A provider's prompt cache then holds across `keep` rounds, where
        // clearing one result every round would change the prefix every round.
        let keep = policy.keep_rounds as usize;
        // The turns before the last `keep` whose results are not cleared yet are those from
        // the first at or past `cleared_upto` (the turns are in order): there are `keep` of
        // them when the `keep`-th before the boundary is one, an O(1) check every round.
        let clear_before = match c.turns.len().checked_sub(keep) {
            Some(boundary)
                if keep > 0 && boundary >= keep && c.turns[boundary - keep] >= c.cleared_upto =>
            {
                c.turns[boundary].max(c.cleared_upto)
            }
            _ => c.cleared_upto,
        };
        ContextEdits {
            spilled,
            preview: policy.spill_preview,
            clear_before,
        }
    }

    /// When the next request is estimated past the threshold and clearing the results before
    /// the last round's frees at least a quarter of the threshold: the edit that clears them
    /// all. Freeing less, the conversation is compacted instead: clearing a round or two at a
    /// time under pressure would change the conversation's prefix (and invalidate a prompt
    /// cache) every round.
    fn pressure_clear(&self, policy: &ContextPolicy) -> Option<ContextEdits> {
        let c = self.state.context.as_ref()?;
        let threshold = policy.threshold()?;
        if self.estimate.tokens.estimate() <= threshold {
            return None;
        }
        let last = *c.turns.last()?;
        let mut freed = Size::default();
        let view = c.view(&self.state.messages);
        for m in view.slice(c.cleared_upto.min(last)..last.min(view.len())) {
            if let Message::Tool(r) = m {
                let bytes = r.content.len();
                if let Some(stub) = policy::shorter_stub_len(&r.name, &r.call_id, bytes) {
                    freed.bytes += (bytes - stub) as u64;
                }
            }
        }
        (freed.bytes > 0 && self.estimate.tokens.tokens_of(freed) >= threshold / 4).then(|| {
            ContextEdits {
                spilled: Vec::new(),
                preview: policy.spill_preview,
                clear_before: last,
            }
        })
    }

    /// [`Input::ContextEdited`].
    pub(super) fn context_edited(
        &mut self,
        round: u32,
        edits: ContextEdits,
    ) -> Result<(), PhaseError> {
        if !matches!(self.state.phase, Phase::EditingContext { .. }) {
            return Err(self.phase_error("context_edited", String::new()));
        }
        if round != self.state.round + 1 {
            return Err(self.phase_error(
                "context_edited",
                format!(
                    "; it is for round {round}, round {} is about to start",
                    self.state.round + 1
                ),
            ));
        }
        let held = self.state.context.as_ref().map(|c| c.view_len());
        match held {
            None => {
                return Err(self.phase_error("context_edited", "; no context policy is set".into()));
            }
            Some(len) if edits.clear_before > len => {
                return Err(self.phase_error(
                    "context_edited",
                    format!(
                        "; it clears up to message {}, the view holds {len}",
                        edits.clear_before
                    ),
                ));
            }
            _ => {}
        }
        let Some(c) = self.state.context.as_mut() else {
            return Ok(());
        };
        let offered_before = c.spilled > 0;
        let from = c.unspilled_from.min(c.view_len());
        for id in &edits.spilled {
            let view = c.view(&self.state.messages);
            let found = view
                .slice(from..)
                .iter()
                .position(|m| matches!(m, Message::Tool(r) if &r.call_id == id));
            let Some(i) = found.map(|p| p + from) else {
                continue;
            };
            let Some(Message::Tool(r)) = view.get(i) else {
                continue;
            };
            let bytes = r.content.len();
            let before = Size::of_text(&r.content);
            let preview = policy::spilled_preview(&r.content, id, edits.preview);
            let shown = preview.len();
            self.estimate.tokens.remove_size(before);
            self.estimate.tokens.add_size(Size::of_text(&preview));
            let preview = replaced(r, preview, true);
            c.replace(i, preview);
            c.spilled += 1;
            emit!(
                self,
                Event::ResultSpilled {
                    round,
                    call_id: id.clone(),
                    bytes,
                    shown,
                }
            );
        }
        // A provider that clears old results itself clears these (the request says up to
        // where, [`Machine::native_request`]): the view keeps them whole, the estimate counts
        // them cleared.
        let native = self
            .config
            .context
            .as_ref()
            .is_some_and(ContextPolicy::native_clears);
        // First the estimate, in one pass over the view's messages (nothing is built: a
        // result no longer than its stub stays as it is); then, when the machine clears them
        // itself and some shrink, their stubs, in place.
        let range = c.cleared_upto.min(edits.clear_before)..edits.clear_before;
        let mut shrinking = 0;
        for m in c.view(&self.state.messages).slice(range.clone()) {
            if let Message::Tool(r) = m
                && let Some(stub) = policy::shorter_stub_len(&r.name, &r.call_id, r.content.len())
            {
                self.estimate.tokens.remove_size(Size::of_text(&r.content));
                self.estimate.tokens.add_size(Size {
                    bytes: stub as u64,
                    images: 0,
                });
                shrinking += 1;
            }
        }
        if !native && shrinking > 0 {
            c.edited.reserve(shrinking);
            // The usual batch: transcript messages that no edit touched, with none after
            // them, so that their stubs follow the edits in order.
            let own = c.head.len();
            let usual = (range.start >= own
                && c.edited.last().is_none_or(|(i, _)| *i < range.start))
            .then(|| c.shared_from + (range.start - own))
            .and_then(|from| self.state.messages.get(from..from + range.len()));
            if let Some(tail) = usual {
                c.edited
                    .extend(tail.iter().enumerate().filter_map(|(k, m)| match m {
                        Message::Tool(r) => cleared(r).map(|stub| (range.start + k, stub)),
                        _ => None,
                    }));
            } else {
                for i in range {
                    if let Some(Message::Tool(r)) = c.view(&self.state.messages).get(i)
                        && let Some(stub) = cleared(r)
                    {
                        c.replace(i, stub);
                    }
                }
            }
        }
        c.cleared_upto = c.cleared_upto.max(edits.clear_before);
        c.unspilled_from = c.view_len();
        let offered_now = c.spilled > 0;
        self.state.phase = Phase::Ready;
        if offered_now && !offered_before {
            self.context_tools_changed();
        }
        Ok(())
    }

    /// The compaction the policy makes now, if the estimate passes the threshold (or, `forced`,
    /// whatever it is) and the view has a part to summarise.
    fn plan_compaction(
        &self,
        policy: &ContextPolicy,
        round: u32,
        forced: bool,
    ) -> Option<CompactRequest> {
        if !policy.compact {
            return None;
        }
        let c = self.state.context.as_ref()?;
        // A provider that compacts at the threshold itself is left to do it, and without a
        // window the estimate starts none (checked before the estimate is made: the usual
        // case, every round); a refusal for size (`forced`) is still answered with a summary.
        let threshold = policy.threshold();
        if !forced && (threshold.is_none() || policy.native_compacts()) {
            return None;
        }
        let tokens_before = self.estimate.tokens.estimate();
        if !forced && threshold.is_some_and(|t| tokens_before <= t) {
            return None;
        }
        let view = c.view(&self.state.messages);
        let lead = view
            .iter()
            .take_while(|m| matches!(m, Message::System { .. }))
            .count();
        // What is kept: the most recent messages, back to a turn's start, while they fit in 40 %
        // of the window (half the estimate when the window is not known), at most
        // `keep_rounds` turns of calls, and at least the latest turn.
        let budget = match policy.window {
            Some(w) => w.saturating_mul(2) / 5,
            None => tokens_before / 2,
        };
        let max_turns = policy.keep_rounds.max(1) as usize;
        let mut kept = Size::default();
        let mut cut = None;
        let mut turns = 0usize;
        for i in (lead + 1..view.len()).rev() {
            let s = Size::of_message(&view[i]);
            kept.bytes += s.bytes;
            kept.images += s.images;
            if matches!(view[i], Message::Tool(_)) {
                continue;
            }
            let is_turn = matches!(&view[i], Message::Assistant(a) if !a.tool_calls.is_empty());
            if cut.is_some()
                && (self.estimate.tokens.tokens_of(kept) > budget || turns >= max_turns)
            {
                break;
            }
            cut = Some(i);
            if is_turn {
                turns += 1;
            }
        }
        let cut = cut?;
        // The summarising request holds the rendered part (plain text, at the usual 4 bytes
        // per token rather than the ratio calibrated on requests' JSON) in about 60 % of the
        // window, leaving room for the prompt and the summary.
        let window_bytes = policy.window.map_or(400_000.0, |w| {
            w as f64 * crate::context::estimate::DEFAULT_BYTES_PER_TOKEN * 0.6
        });
        // Results the provider clears are summarised as what the model read of them.
        let text = if policy.native_clears() && c.cleared_upto > lead {
            let mut part = view.slice(lead..cut).to_vec();
            for m in part.iter_mut().take(c.cleared_upto.saturating_sub(lead)) {
                if let Message::Tool(r) = m
                    && clears(r)
                {
                    r.content = policy::cleared_stub(&r.name, &r.call_id, r.content.len());
                    r.images.clear();
                }
            }
            policy::render_for_summary(&part, window_bytes as usize)
        } else {
            policy::render_for_summary(&view.slice(lead..cut).to_vec(), window_bytes as usize)
        };
        Some(CompactRequest {
            round,
            lead,
            cut,
            tokens_before,
            forced,
            messages: vec![
                Message::system(COMPACT_PROMPT),
                Message::user(format!("{COMPACT_MARKER}\n{text}")),
            ],
        })
    }

    /// [`Input::Compacted`].
    pub(super) fn compacted(
        &mut self,
        round: u32,
        compaction: Compaction,
    ) -> Result<(), PhaseError> {
        let Phase::Compacting { request, retry } = &self.state.phase else {
            return Err(self.phase_error("compacted", String::new()));
        };
        if round != request.round || compaction.cut != request.cut {
            return Err(self.phase_error(
                "compacted",
                format!(
                    "; it is for round {round} cut at {}, the compaction asked is for round {} \
                     cut at {}",
                    compaction.cut, request.round, request.cut
                ),
            ));
        }
        let (lead, cut, before, retry) = (
            request.lead,
            request.cut,
            request.tokens_before,
            retry.clone(),
        );
        let ratio = self.estimate.tokens.bytes_per_token();
        let Some(c) = self.state.context.as_mut() else {
            return Err(self.phase_error("compacted", "; no context policy is set".into()));
        };
        let summary = Message::user(format!(
            "{}\n{}",
            policy::SUMMARY_HEADER,
            compaction.summary
        ));
        let dropped = cut - lead;
        // The view becomes its first `lead` messages, the summary, and its messages from `cut`
        // on: its own part is the first two (and any of its own part after `cut`), the
        // transcript's starts where `cut` was in it.
        let view = c.view(&self.state.messages);
        let own = c.head.len();
        let mut head = view.slice(..lead).to_vec();
        head.push(summary);
        if cut < own {
            head.extend(view.slice(cut..own).iter().cloned());
        }
        c.shared_from += cut.saturating_sub(own);
        c.edited = std::mem::take(&mut c.edited)
            .into_iter()
            .filter(|(i, _)| *i >= cut)
            .map(|(i, m)| (i - dropped + 1, m))
            .collect();
        c.head = head;
        c.turns = c
            .view(&self.state.messages)
            .iter()
            .enumerate()
            .filter(|(_, m)| matches!(m, Message::Assistant(a) if !a.tool_calls.is_empty()))
            .map(|(i, _)| i)
            .collect();
        c.cleared_upto = if c.cleared_upto >= cut {
            c.cleared_upto - dropped + 1
        } else {
            lead + 1
        };
        c.unspilled_from = c.view_len();
        c.compactions += 1;
        if let Some(u) = compaction.usage {
            *c.usage.get_or_insert_with(Usage::default) += u;
        }
        c.cost = match (c.cost, compaction.cost, c.compactions) {
            (_, None, _) => None,
            (_, Some(b), 1) => Some(b),
            (Some(a), Some(b), _) => Some(a + b),
            (None, Some(_), _) => None,
        };
        self.rebuild_estimate(Some(ratio));
        let after = self.estimate.tokens.estimate();
        emit!(
            self,
            Event::ContextCompacted {
                round,
                tokens_before: before,
                tokens_after: after,
                messages_summarised: dropped,
                usage: compaction.usage,
            }
        );
        self.compaction_done(round, retry);
        Ok(())
    }

    /// After a compaction (made or failed): the round goes on, or the refused call is retried.
    fn compaction_done(&mut self, round: u32, retry: Option<Vec<String>>) {
        match retry {
            Some(reminders) => {
                let bytes = reminders.iter().map(|r| r.len() as u64).sum();
                self.estimate.reminders = Size { bytes, images: 0 };
                self.state.phase = Phase::AwaitingModel { reminders };
            }
            None => {
                if let Some(c) = self.state.context.as_mut() {
                    c.prepared = round;
                }
                self.state.phase = Phase::Ready;
            }
        }
    }

    /// [`Input::CompactionFailed`]: the round goes on with the view as it is (a refused call
    /// is not retried: the run stops with `context_exhausted`).
    pub(super) fn compaction_failed(
        &mut self,
        round: u32,
        message: String,
    ) -> Result<(), PhaseError> {
        let Phase::Compacting { request, retry } = &self.state.phase else {
            return Err(self.phase_error("compaction_failed", String::new()));
        };
        if round != request.round {
            return Err(self.phase_error(
                "compaction_failed",
                format!(
                    "; it is for round {round}, the compaction is for round {}",
                    request.round
                ),
            ));
        }
        if retry.is_some() {
            self.exhausted(format!(
                "the request did not fit the model's context window, and compacting the \
                 conversation failed: {message}"
            ));
            return Ok(());
        }
        self.compaction_done(round, None);
        Ok(())
    }

    /// [`Input::ContextOverflowed`]: the provider refused the call for its size. The machine
    /// compacts and retries it once; refused again, or with nothing to compact, the run stops
    /// with `context_exhausted`.
    pub(super) fn context_overflowed(&mut self, overflow: ContextOverflow) {
        let round = self.state.round;
        let Phase::AwaitingModel { reminders } = &self.state.phase else {
            return;
        };
        let reminders = reminders.clone();
        self.estimate.reminders = Size::default();
        let policy = self.config.context.clone();
        let retried = self.state.context.as_ref().and_then(|c| c.retried);
        let request = match (&policy, retried) {
            (Some(p), r) if r != Some(round) => self.plan_compaction(p, round, true),
            _ => None,
        };
        match (request, policy) {
            (Some(request), Some(_)) => {
                if let Some(c) = self.state.context.as_mut() {
                    c.retried = Some(round);
                }
                self.state.phase = Phase::Compacting {
                    request: Box::new(request),
                    retry: Some(reminders),
                };
            }
            (_, Some(_)) => self.exhausted(format!(
                "{overflow}; {}",
                if retried == Some(round) {
                    "it was refused again after the conversation was compacted"
                } else {
                    "there is nothing left to compact"
                }
            )),
            (_, None) => self.model_failed(overflow.to_string()),
        }
    }

    fn exhausted(&mut self, message: String) {
        self.finish(
            StopReason::ContextExhausted,
            None,
            Some(RunError {
                code: ErrorCode::ContextExhausted,
                message,
            }),
        );
    }

    /// During replay, a context step the log does not hold: the live run did not take it (it
    /// ran with another policy, or none); the round goes on with the view as it is.
    pub(super) fn skip_context_step(&mut self) {
        let next = self.state.round + 1;
        match std::mem::replace(&mut self.state.phase, Phase::Ready) {
            Phase::Compacting {
                retry: Some(reminders),
                ..
            } => self.state.phase = Phase::AwaitingModel { reminders },
            _ => {
                if let Some(c) = self.state.context.as_mut() {
                    c.unspilled_from = c.view_len();
                    c.prepared = next;
                }
            }
        }
    }

    /// The answer to a `read_result` call, settled by the machine from the transcript: its
    /// status and content.
    pub(super) fn read_result(&self, call: &ToolCall) -> (CallStatus, String) {
        let args = &call.arguments;
        let Some(handle) = args.get("handle").and_then(|h| h.as_str()) else {
            return (
                CallStatus::Invalid,
                result::error_content("`read_result` needs a `handle` (a string)."),
            );
        };
        let offset = args.get("offset").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        let most = self
            .config
            .context
            .as_ref()
            .and_then(|p| p.spill_over)
            .map_or(policy::READ_RESULT_MAX, |o| {
                (o / 2).clamp(1, policy::READ_RESULT_MAX)
            });
        let limit = args
            .get("limit")
            .and_then(|v| v.as_u64())
            .map_or(most, |l| (l as usize).min(most));
        let found = self.state.messages.iter().rev().find_map(|m| match m {
            Message::Tool(r) if r.call_id == handle && r.name != READ_RESULT => Some(r),
            _ => None,
        });
        match found {
            Some(r) => (CallStatus::Ok, policy::read_page(&r.content, offset, limit)),
            None => (
                CallStatus::Failed,
                result::error_content(&format!(
                    "No result has the handle `{}`.",
                    result::shorten(handle, result::ECHO_CHARS)
                )),
            ),
        }
    }

    /// Whether a call is `read_result`, answered by the machine.
    pub(super) fn is_read_result(&self, call: &ToolCall) -> bool {
        call.name == READ_RESULT && self.offers_read_result()
    }
}
