//! Call triage and scheduling: a response's calls are checked (known tool, valid arguments,
//! unique id, not a duplicate, within budget) and settled or planned to run; the planned ones
//! run in batches ([`Batch`]); their intents and results come in; `stop_when` is asked; and
//! the round ends, its results in the transcript in the model's call order.

use super::*;

/// Calls that run together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Whether the calls run at the same time (at most `max_parallel` at once).
    pub parallel: bool,
    /// Indices of the calls in the round (see [`Machine::round_call`]).
    pub calls: Vec<usize>,
}

fn duplicate_warning(name: &str) -> String {
    let name = result::shorten(name, result::ECHO_CHARS);
    result::error_content(&format!(
        "Not run: `{name}` was already called with these same arguments, and its result is \
         above. Repeating the call looks like a loop: try a different approach, or give your \
         final answer if you have enough information."
    ))
}

/// A fingerprint of a call's name and arguments: calls that [`Machine::is_duplicate`] finds the
/// same (the same name, and [`ToolCall::same_arguments`]) have the same fingerprint. An object's
/// keys count in any order, and the number zero with either sign is one number, as in the
/// values' equality.
pub(super) fn call_print(call: &ToolCall) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let state = foldhash::fast::FixedState::with_seed(0x6475_705f_6361_6c6c);
    let mut h = state.build_hasher();
    call.name.hash(&mut h);
    match &call.invalid_arguments {
        Some(raw) => (0u8, raw).hash(&mut h),
        None => (1u8, value_print(&call.arguments, &state)).hash(&mut h),
    }
    h.finish()
}

/// [`call_print`]'s fingerprint of a JSON value.
fn value_print(v: &serde_json::Value, state: &foldhash::fast::FixedState) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = state.build_hasher();
    match v {
        serde_json::Value::Null => h.write_u8(0),
        serde_json::Value::Bool(b) => (1u8, *b).hash(&mut h),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => (2u8, u).hash(&mut h),
            (None, Some(i), _) => (3u8, i).hash(&mut h),
            // Zero's two signs are one number.
            (None, None, f) => (4u8, f.filter(|f| *f != 0.0).map_or(0, f64::to_bits)).hash(&mut h),
        },
        serde_json::Value::String(s) => (5u8, s).hash(&mut h),
        serde_json::Value::Array(items) => {
            (6u8, items.len()).hash(&mut h);
            for item in items {
                h.write_u64(value_print(item, state));
            }
        }
        serde_json::Value::Object(map) => {
            // Summed, so that the keys' order does not count.
            let entries = map.iter().fold(0u64, |sum, (k, v)| {
                sum.wrapping_add(state.hash_one((k, value_print(v, state))))
            });
            (7u8, map.len(), entries).hash(&mut h);
        }
    }
    h.finish()
}

/// Candidate `n` (from 2) for replacing the call id `original`, in its shape: an id of letters
/// and digits only (some servers accept nothing else, in a fixed length) stays letters and
/// digits of the same length, its end replaced by `n` in base 36; any other id gets `_n`
/// appended (`toolu_01A` becomes `toolu_01A_2`); no id at all becomes `call_n`. An id longer
/// than 64 characters is cut to its first 64 first.
pub(super) fn replacement_id(original: &str, n: u64) -> String {
    let mut suffix = Vec::new();
    let mut k = n;
    while k > 0 {
        suffix.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(k % 36) as usize]);
        k /= 36;
    }
    suffix.reverse();
    let suffix = String::from_utf8(suffix).unwrap_or_default();
    let head: String = original.chars().take(64).collect();
    if head.is_empty() {
        return format!("call_{suffix}");
    }
    if head.bytes().all(|b| b.is_ascii_alphanumeric()) && head.len() > suffix.len() {
        return format!("{}{suffix}", &head[..head.len() - suffix.len()]);
    }
    format!("{head}_{suffix}")
}

impl Machine {
    /// A response's tool calls: each is settled at once (truncated, invalid, a duplicate, over
    /// budget, after a strict stop) or is to run, weighed against the approval policy by the
    /// subject the driver gave; the round's calls wait in [`Phase::Tools`].
    pub(super) fn triage(
        &mut self,
        text: Option<String>,
        tool_calls: Vec<ToolCall>,
        parts: Vec<crate::message::ProviderPart>,
        finish_reason: FinishReason,
        usage: Option<Usage>,
        subjects: Vec<Option<Subject>>,
    ) {
        let round = self.state.round;
        self.round_prints.clear();
        if self.config.detect_duplicates {
            self.index_executed();
        }
        let mut slots = Vec::with_capacity(tool_calls.len());
        // The round adds the assistant's message and one result per call to the transcript,
        // and one entry per call to the record.
        room_for_rounds(&mut self.state.messages, 1 + tool_calls.len());
        room_for_rounds(&mut self.state.calls, tool_calls.len());
        let mut planned = 0u32;
        let mut strict_stop = false;
        let truncated = finish_reason == FinishReason::Length;
        let mut subjects = subjects.into_iter();
        // Each call's tool is looked up once, by its place in the catalog. Borrowed, not
        // cloned: the catalog's `Arc` is shared by every run of the agent, and a count written
        // from each run's every round is memory all of them contend for.
        let catalog: &Catalog = &self.catalog;
        let weighs_any = self.approvals_weigh_any();
        for call in &tool_calls {
            let subject = subjects.next().flatten();
            let tool = catalog.index(&call.name);
            let print = if self.config.detect_duplicates {
                let print = call_print(call);
                self.round_prints.push(print);
                print
            } else {
                0
            };
            emit!(
                self,
                Event::ToolCallRequested {
                    round,
                    call: call.clone(),
                }
            );
            if call
                .provider_data
                .as_ref()
                .and_then(|d| d.get("repaired"))
                .and_then(|v| v.as_bool())
                == Some(true)
            {
                emit!(
                    self,
                    Event::ToolCallRepaired {
                        round,
                        call: call.clone(),
                    }
                );
            }
            let mut slot = Slot {
                call: Arc::new(call.clone()),
                run: false,
                parallel_safe: false,
                status: None,
                content: None,
                output: None,
                duration_ms: 0,
                attempts: 0,
                over_budget: false,
                approval: None,
                subject: None,
                started: false,
            };
            let settle = |slot: &mut Slot, status: CallStatus, content: String| {
                slot.status = Some(status);
                slot.content = Some(content);
            };
            if strict_stop {
                settle(
                    &mut slot,
                    CallStatus::Skipped,
                    result::error_content(
                        "Not run: the run stopped at an earlier invalid call in this turn.",
                    ),
                );
                slots.push(slot);
                continue;
            }
            if truncated && call.invalid_arguments.is_some() {
                let why = format!(
                    "Not run: the output-token limit cut this call to `{}` short before its \
                     arguments were complete. Make the call again with shorter arguments.",
                    result::shorten(&call.name, result::ECHO_CHARS)
                );
                emit!(
                    self,
                    Event::InvalidToolCall {
                        round,
                        call: call.clone(),
                        reason: why.clone(),
                    }
                );
                settle(
                    &mut slot,
                    CallStatus::Truncated,
                    result::error_content(&why),
                );
                slots.push(slot);
                continue;
            }
            if self.is_read_result(call) {
                let (status, content) = self.read_result(call);
                settle(&mut slot, status, content);
                slots.push(slot);
                continue;
            }
            if let Some(reason) = self.invalid_reason(call, tool) {
                emit!(
                    self,
                    Event::InvalidToolCall {
                        round,
                        call: call.clone(),
                        reason: reason.clone(),
                    }
                );
                settle(
                    &mut slot,
                    CallStatus::Invalid,
                    result::error_content(&reason),
                );
                if self.config.invalid_calls == InvalidCallPolicy::Strict {
                    strict_stop = true;
                }
                slots.push(slot);
                continue;
            }
            if self.config.detect_duplicates && self.is_duplicate(call, print, &slots) {
                emit!(
                    self,
                    Event::DuplicateDetected {
                        round,
                        call: call.clone(),
                    }
                );
                settle(
                    &mut slot,
                    CallStatus::Duplicate,
                    duplicate_warning(&call.name),
                );
                slots.push(slot);
                continue;
            }
            if self.state.tool_calls_executed + planned >= self.config.max_tool_calls {
                let max = self.config.max_tool_calls;
                settle(
                    &mut slot,
                    CallStatus::Skipped,
                    result::error_content(&format!(
                        "Not run: the tool-call budget of this run ({max}) is spent."
                    )),
                );
                slot.over_budget = true;
                slots.push(slot);
                continue;
            }
            planned += 1;
            slot.run = true;
            slot.subject = subject;
            // A valid call's tool is in the catalog.
            let entry = tool.map(|i| catalog.entry_at(i));
            // Without a subject, a call the policy does not weigh is allowed by default.
            if (weighs_any || slot.subject.is_some())
                && !matches!(
                    self.verdict_by(
                        call,
                        slot.subject.as_ref(),
                        entry.map_or(Action::Allow, CatalogEntry::approval_default)
                    ),
                    Verdict::Allow { rule: None }
                )
            {
                slot.approval = Some(ApprovalState::Pending);
            }
            slot.parallel_safe = entry.is_some_and(|e| e.parallel_safe);
            slots.push(slot);
        }
        self.state
            .messages
            .push(Message::Assistant(AssistantMessage {
                text,
                tool_calls,
                parts,
            }));
        self.state.phase = Phase::Tools {
            finish_reason,
            usage,
            slots,
            stop_checked: false,
            stop_signal: None,
        };
    }

    /// Gives each call an id that no other call of the conversation has: a call whose id is
    /// empty, repeats an earlier call's id in the same reply, or is already in the conversation
    /// gets a fresh id made from it (see [`replacement_id`]), and its result will carry that id.
    /// Every provider's responses come through here, so no transcript ever holds two calls with
    /// one id (which repairing a reloaded transcript would have to drop). The new ids depend on
    /// the response and the conversation only, so replaying a run log gives the same ones.
    ///
    /// No provider needs the model's own id back once the call and its result carry the same
    /// new one: the OpenAI and Anthropic APIs match a result to its call within the request
    /// (Anthropic only asks for `[a-zA-Z0-9_-]` ids, and some OpenAI-compatible servers for
    /// nine letters and digits: [`replacement_id`] keeps an id's shape), and Gemini's own call
    /// id is kept apart in the call's provider data and sent back as it came.
    pub(super) fn unique_call_ids(&mut self, calls: &mut [ToolCall]) {
        let index = &self.call_ids;
        let in_conversation = |messages: &[Message], id: &str| {
            index.contains(&id_key(id))
                && messages.iter().any(|m| match m {
                    Message::Assistant(a) => a.tool_calls.iter().any(|c| c.id == id),
                    Message::Tool(r) => r.call_id == id,
                    _ => false,
                })
        };
        let clash = |calls: &[ToolCall], i: usize, messages: &[Message]| {
            let id = &calls[i].id;
            id.is_empty() || calls[..i].iter().any(|c| &c.id == id) || in_conversation(messages, id)
        };
        let mut replaced = Vec::new();
        for i in 0..calls.len() {
            if !clash(calls, i, &self.state.messages) {
                continue;
            }
            let original = std::mem::take(&mut calls[i].id);
            // The first candidate free of the conversation and of every id of this reply (the
            // later calls' own ids included, so that they keep theirs).
            let fresh = (2u64..)
                .map(|n| replacement_id(&original, n))
                .find(|id| {
                    !calls.iter().any(|c| &c.id == id) && !in_conversation(&self.state.messages, id)
                })
                .unwrap_or_default();
            replaced.push((original, fresh.clone()));
            calls[i].id = fresh;
        }
        self.call_ids.extend(calls.iter().map(|c| id_key(&c.id)));
        for (original, id) in replaced {
            emit!(
                self,
                Event::CallIdReplaced {
                    round: self.state.round,
                    original: result::shorten(&original, result::ECHO_CHARS).into_owned(),
                    id,
                }
            );
        }
    }

    /// Why a call cannot run, if it cannot: in words for the model, the call's name shortened
    /// and the whole capped at the result limit (the reason becomes the call's result, and an
    /// argument error may quote the arguments). `tool` is the call's place in the catalog
    /// ([`Catalog::index`]).
    pub(super) fn invalid_reason(&self, call: &ToolCall, tool: Option<usize>) -> Option<String> {
        let reason = self.invalid_reason_uncapped(call, tool)?;
        Some(result::cap(reason, self.config.max_result_chars))
    }

    pub(super) fn invalid_reason_uncapped(
        &self,
        call: &ToolCall,
        tool: Option<usize>,
    ) -> Option<String> {
        let name = result::shorten(&call.name, result::ECHO_CHARS);
        let Some(tool) = tool else {
            let names: Vec<&str> = self.catalog.names().collect();
            let available = if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            };
            return Some(format!(
                "Unknown tool `{name}`. The tools that exist are: {available}."
            ));
        };
        if let Some(raw) = &call.invalid_arguments {
            let err = serde_json::from_str::<serde_json::Value>(raw)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "not a JSON object".into());
            return Some(format!(
                "The arguments for `{name}` are not valid JSON ({err}). Send the arguments as \
                 one JSON object that matches the tool's schema."
            ));
        }
        if let Err(e) = self.catalog.validate_at(tool, &call.arguments) {
            return Some(format!(
                "Invalid arguments for `{name}`: {e}. Fix them to match the tool's schema."
            ));
        }
        None
    }

    /// Whether `call` (whose [`call_print`] is `print`) repeats one of the last
    /// `duplicate_window` calls to run: this round's, latest first, then the executed calls
    /// before it. The earlier rounds' calls are found through `executed_prints` (brought up to
    /// date by [`Machine::index_executed`]), so only a fingerprint match reads a call itself:
    /// with a thousand runs in flight, every call read is memory out of the cache.
    pub(super) fn is_duplicate(&self, call: &ToolCall, print: u64, this_round: &[Slot]) -> bool {
        let window = self.config.duplicate_window;
        if window == 0 {
            return false;
        }
        let same = |c: &ToolCall| c.name == call.name && c.same_arguments(call);
        let mut left = window;
        for slot in this_round.iter().rev().filter(|s| s.run) {
            if left == 0 {
                return false;
            }
            left -= 1;
            if same(&slot.call) {
                return true;
            }
        }
        self.executed_prints
            .iter()
            .rev()
            .take(left)
            .any(|&(p, i)| p == print && self.state.calls.get(i).is_some_and(|c| same(&c.call)))
    }

    /// Adds the executed calls of the round just settled (`settled` calls, from `before` in
    /// `state.calls`) to `executed_prints`, with the fingerprints taken at triage; when those
    /// are not at hand (a machine resumed during the round), [`Machine::index_executed`] makes
    /// them at the next triage.
    fn index_round(&mut self, before: usize, settled: usize) {
        if self.printed_calls == before && self.round_prints.len() == settled {
            let prints = self.round_prints.iter();
            self.executed_prints.extend(
                self.state.calls[before..]
                    .iter()
                    .zip(prints)
                    .enumerate()
                    .filter(|(_, (c, _))| c.status.executed())
                    .map(|(k, (_, &p))| (p, before + k)),
            );
            self.printed_calls = self.state.calls.len();
        }
        self.round_prints.clear();
    }

    /// Adds the calls settled since the last time to `executed_prints` (all of them, for a
    /// machine rebuilt from a snapshot or a log). `state.calls` only grows.
    pub(super) fn index_executed(&mut self) {
        if self.printed_calls > self.state.calls.len() {
            self.executed_prints.clear();
            self.printed_calls = 0;
        }
        let new = &self.state.calls[self.printed_calls..];
        self.executed_prints.extend(
            new.iter()
                .enumerate()
                .filter(|(_, c)| c.status.executed())
                .map(|(i, c)| (call_print(&c.call), self.printed_calls + i)),
        );
        self.printed_calls = self.state.calls.len();
    }

    pub(super) fn schedule(&self, slots: &[Slot], pending: Vec<usize>) -> Vec<Batch> {
        let max_parallel = self.config.max_parallel.max(1);
        if max_parallel == 1 {
            return pending
                .iter()
                .map(|&i| Batch {
                    parallel: false,
                    calls: vec![i],
                })
                .collect();
        }
        match self.config.parallel_mode {
            ParallelMode::AllOrNothing => {
                if pending.len() > 1 && pending.iter().all(|&i| slots[i].parallel_safe) {
                    vec![Batch {
                        parallel: true,
                        calls: pending,
                    }]
                } else {
                    pending
                        .iter()
                        .map(|&i| Batch {
                            parallel: false,
                            calls: vec![i],
                        })
                        .collect()
                }
            }
            ParallelMode::Mixed => {
                if pending.len() > 1 && pending.iter().all(|&i| slots[i].parallel_safe) {
                    // One batch of them all, as the loop below would make.
                    return vec![Batch {
                        parallel: true,
                        calls: pending,
                    }];
                }
                let mut batches: Vec<Batch> = Vec::new();
                for i in pending {
                    let safe = slots[i].parallel_safe;
                    match batches.last_mut() {
                        Some(b) if safe && b.parallel => b.calls.push(i),
                        _ => batches.push(Batch {
                            parallel: safe,
                            calls: vec![i],
                        }),
                    }
                }
                for b in &mut batches {
                    if b.calls.len() == 1 {
                        b.parallel = false;
                    }
                }
                batches
            }
        }
    }

    /// [`Input::ToolsChanged`]. Emits [`Event::ToolsChanged`] when the catalog differs (the
    /// same catalog just takes the old one's place).
    pub(super) fn tools_changed(
        &mut self,
        round: u32,
        catalog: Arc<Catalog>,
    ) -> Result<(), PhaseError> {
        let before_first = self.state.round == 0 && self.state.phase == Phase::Ready;
        if round == 0 && !before_first {
            return Err(self.phase_error(
                "tools_changed",
                "; round 0's tools come before the run's first model call".into(),
            ));
        }
        if round > 0 {
            self.awaiting_model("tools_changed", round)?;
        }
        if self.events_on && !Arc::ptr_eq(&self.catalog, &catalog) && *self.catalog != *catalog {
            let old = self.catalog.entries();
            let new = catalog.entries();
            let named = |list: &[CatalogEntry], name: &str| list.iter().any(|e| e.name == name);
            let added = new
                .iter()
                .filter(|e| !named(old, &e.name))
                .map(|e| e.name.clone())
                .collect();
            let removed = old
                .iter()
                .filter(|e| !named(new, &e.name))
                .map(|e| e.name.clone())
                .collect();
            let changed = new
                .iter()
                .filter(|e| old.iter().any(|o| o.name == e.name && o != *e))
                .map(|e| e.name.clone())
                .collect();
            self.events.push(Event::ToolsChanged {
                round: self.state.round,
                added,
                removed,
                changed,
            });
        }
        self.catalog = catalog;
        self.context_tools_changed();
        Ok(())
    }

    /// The calls of the current round and what they returned, for `stop_when`
    /// ([`Step::CheckStop`]); empty outside a round.
    pub fn round_calls(&self) -> Vec<RoundCall<'_>> {
        match &self.state.phase {
            Phase::Tools { slots, .. } => slots
                .iter()
                .map(|s| RoundCall {
                    call: &s.call,
                    result: s.output.as_ref(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// [`Input::StopChecked`].
    pub(super) fn stop_checked(&mut self, signal: Option<String>) -> Result<(), PhaseError> {
        let asked = match &self.state.phase {
            Phase::Tools {
                slots,
                stop_checked,
                ..
            } => {
                self.hooks.stop_when
                    && !*stop_checked
                    && slots.iter().all(|s| !s.run || s.status.is_some())
                    && self.stop_when_decides(slots)
            }
            _ => false,
        };
        if !asked {
            return Err(self.phase_error(
                "stop_checked",
                "; stop_when is asked once, after every call of the round ran".into(),
            ));
        }
        if let Phase::Tools {
            stop_checked,
            stop_signal,
            ..
        } = &mut self.state.phase
        {
            *stop_checked = true;
            *stop_signal = signal;
        }
        Ok(())
    }

    /// Whether `stop_when`'s answer can matter for this round: nothing ends the run before it
    /// (the strict policy's invalid call, a terminal tool's signal).
    pub(super) fn stop_when_decides(&self, slots: &[Slot]) -> bool {
        let strict = self.config.invalid_calls == InvalidCallPolicy::Strict
            && slots.iter().any(|s| s.status == Some(CallStatus::Invalid));
        !strict && self.terminal_signal(slots).is_none()
    }

    /// [`Input::ToolStarted`]: only a call that is to run, approved, with no result yet can
    /// start; it may start again (a call in flight at a crash, run again on resume).
    pub(super) fn tool_started(&mut self, index: usize, call_id: &str) -> Result<(), PhaseError> {
        let slot = Self::pending_slot(&mut self.state.phase, "tool_started", index, false)?;
        if slot.call.id != call_id {
            let detail = format!(
                "; call {index} has the id `{}`, not `{}`",
                result::shorten(&slot.call.id, result::ECHO_CHARS),
                result::shorten(call_id, result::ECHO_CHARS)
            );
            return Err(self.phase_error("tool_started", detail));
        }
        slot.started = true;
        Ok(())
    }

    /// The calls of the round that started and have no result: in flight at a crash, when the
    /// machine was rebuilt from a log ([`Machine::replay`]). The driver runs each again, or
    /// gives it [`Input::ToolUnknown`].
    pub fn in_flight(&self) -> Vec<usize> {
        match &self.state.phase {
            Phase::Tools { slots, .. } => slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.started && s.status.is_none())
                .map(|(i, _)| i)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// [`Input::ToolFinished`].
    pub(super) fn tool_finished(
        &mut self,
        index: usize,
        outcome: Result<ToolOutput, ToolError>,
        duration_ms: u64,
        attempts: u32,
    ) -> Result<(), PhaseError> {
        let round = self.state.round;
        let max_chars = self.config.max_result_chars;
        let slot = Self::pending_slot(&mut self.state.phase, "tool_finished", index, false)?;
        let status = if outcome.is_ok() {
            CallStatus::Ok
        } else {
            CallStatus::Failed
        };
        slot.content = Some(result::cap(result::serialize(&outcome), max_chars));
        let spent = match &outcome {
            Ok(o) => o.spent.as_deref().cloned(),
            Err(e) => e.spent.as_deref().cloned(),
        };
        slot.status = Some(status);
        slot.output = Some(outcome);
        slot.duration_ms = duration_ms;
        slot.attempts = attempts;
        self.state.tool_calls_executed += 1;
        emit!(self, finished(round, &slot.call, status, duration_ms));
        if let Some(spent) = spent {
            self.add_spent(&spent);
        }
        Ok(())
    }

    /// Call `index` of the round, when it is to run and has no result yet.
    pub(super) fn pending_slot<'a>(
        phase: &'a mut Phase,
        input: &'static str,
        index: usize,
        unapproved: bool,
    ) -> Result<&'a mut Slot, PhaseError> {
        let described = phase.describe();
        let error = |detail: String| PhaseError {
            input,
            phase: described,
            detail,
        };
        let Phase::Tools { slots, .. } = phase else {
            return Err(error(format!(
                "; no round's calls are running (call {index})"
            )));
        };
        let count = slots.len();
        match slots.get_mut(index) {
            None => Err(error(format!(
                "; the round has {count} calls, there is no call {index}"
            ))),
            Some(s) if !s.run => Err(error(format!("; call {index} was settled without running"))),
            Some(s) if s.status.is_some() => {
                Err(error(format!("; call {index} already has its result")))
            }
            Some(s) if !unapproved && s.approval == Some(ApprovalState::Pending) => Err(error(
                format!("; call {index} waits for its approval and cannot run before it"),
            )),
            Some(s) => Ok(s),
        }
    }

    /// [`Input::ToolUnknown`].
    pub(super) fn tool_outcome_unknown(&mut self, index: usize) -> Result<(), PhaseError> {
        let round = self.state.round;
        let slot = Self::pending_slot(&mut self.state.phase, "tool_outcome_unknown", index, false)?;
        slot.status = Some(CallStatus::Unknown);
        slot.content = Some(result::error_content(
            "Outcome unknown: the run stopped while this call was in flight, and the call \
             changes the world, so it was not run again. It may or may not have taken effect; \
             check before calling it again.",
        ));
        emit!(self, finished(round, &slot.call, CallStatus::Unknown, 0));
        Ok(())
    }

    /// Appends the round's results in call order, records the calls, and runs the terminal
    /// checks (unless `interrupted`).
    pub(super) fn finish_round(&mut self, interrupted: Option<()>) {
        let Phase::Tools {
            finish_reason,
            usage,
            slots,
            stop_signal,
            ..
        } = std::mem::replace(&mut self.state.phase, Phase::Ready)
        else {
            return;
        };
        // Every result the model reads is capped here, whatever settled it: a tool's output, an
        // error that quotes the model's input, a notice.
        let max_chars = self.config.max_result_chars;
        let mut slots = slots;
        for slot in &mut slots {
            if let Some(content) = slot.content.take() {
                slot.content = Some(result::cap(content, max_chars));
            }
        }
        let round = self.state.round;
        let mut invalid_code = None;
        let mut truncated = false;
        let mut over_budget = false;
        for slot in &slots {
            match slot.status.unwrap_or(CallStatus::Cancelled) {
                CallStatus::Ok | CallStatus::Failed => self.state.consecutive_invalid = 0,
                CallStatus::Invalid => {
                    self.state.consecutive_invalid += 1;
                    invalid_code = Some(if self.catalog.get(&slot.call.name).is_none() {
                        ErrorCode::ToolNotFound
                    } else {
                        ErrorCode::InvalidToolCall
                    });
                }
                CallStatus::Truncated => {
                    truncated = true;
                    if self.config.on_truncated_call == TruncatedCallPolicy::Continue {
                        self.state.consecutive_invalid += 1;
                    }
                }
                _ => {}
            }
            over_budget |= slot.over_budget;
        }
        // What ends the run, decided while the round's calls are at hand: the strict policy's
        // first invalid call, then a terminal tool's signal, then `stop_when`.
        let strict = match (invalid_code, self.config.invalid_calls) {
            (Some(code), InvalidCallPolicy::Strict) if interrupted.is_none() => {
                let message = slots
                    .iter()
                    .find(|s| s.status == Some(CallStatus::Invalid))
                    .and_then(|s| s.content.clone())
                    .unwrap_or_default();
                Some(RunError { code, message })
            }
            _ => None,
        };
        let signal = if interrupted.is_none() && strict.is_none() {
            self.terminal_signal(&slots).or(stop_signal)
        } else {
            None
        };
        // The calls move into the history; each result goes to the transcript and the history.
        let (before, settled) = (self.state.calls.len(), slots.len());
        for slot in slots {
            let status = slot.status.unwrap_or(CallStatus::Cancelled);
            let content = slot
                .content
                .unwrap_or_else(|| result::error_content("Not run."));
            let (images, spent) = match slot.output {
                Some(Ok(output)) => (output.images, output.spent),
                Some(Err(e)) => (Vec::new(), e.spent),
                None => (Vec::new(), None),
            };
            self.state.messages.push(Message::Tool(ToolResult {
                call_id: slot.call.id.clone(),
                name: slot.call.name.clone(),
                is_error: status != CallStatus::Ok,
                content: content.clone(),
                images,
            }));
            self.state.calls.push(ExecutedCall {
                round,
                call: Arc::unwrap_or_clone(slot.call),
                status,
                content,
                duration_ms: slot.duration_ms,
                attempts: slot.attempts,
                spent,
            });
        }
        self.index_round(before, settled);
        self.round_finished_event(finish_reason, usage);
        if interrupted.is_some() {
            return;
        }
        if let Some(error) = strict {
            self.finish(StopReason::TooManyInvalidCalls, None, Some(error));
            return;
        }
        if let Some(signal) = signal {
            self.finish(StopReason::TerminalSignal, None, None);
            self.set_signal(signal);
            return;
        }
        if truncated && self.config.on_truncated_call == TruncatedCallPolicy::Stop {
            self.finish(
                StopReason::OutputTruncated,
                None,
                Some(RunError {
                    code: ErrorCode::OutputTruncated,
                    message: "the output-token limit cut a tool call short; raise the output \
                              limit or ask for smaller steps"
                        .into(),
                }),
            );
            return;
        }
        if over_budget {
            let max = self.config.max_tool_calls;
            self.finish(
                StopReason::MaxToolCalls,
                None,
                Some(RunError {
                    code: ErrorCode::MaxToolCallsReached,
                    message: format!(
                        "max tool calls reached ({max}) and the model asked for more; possible \
                         infinite loop"
                    ),
                }),
            );
            return;
        }
        let code = invalid_code.unwrap_or(ErrorCode::InvalidToolCall);
        self.check_invalid_budget(code, "the model kept making invalid tool calls");
    }

    /// A terminal tool's signal in this round, if any (it ends the run before `stop_when` is
    /// asked).
    pub(super) fn terminal_signal(&self, slots: &[Slot]) -> Option<String> {
        // Without a terminal tool, only a call's own signal ends the run.
        let terminal = self.catalog.any_terminal();
        slots.iter().find_map(|s| match &s.output {
            Some(Ok(out)) => out.signal.clone().or_else(|| {
                terminal
                    .then(|| self.catalog.get(&s.call.name))
                    .flatten()
                    .filter(|e| e.terminal)
                    .map(|_| s.call.name.clone())
            }),
            _ => None,
        })
    }
}

/// The most room [`room_for_rounds`] makes beyond a round's own elements: a reply of thousands
/// of calls (a model's output, bounded only by the body's size limit) takes room for itself,
/// not for three more rounds like it.
const MOST_ROOM_AHEAD: usize = 64;

/// Makes room in `v`, a run's transcript or record, for a round's `additional` elements. When it
/// is full, it grows to hold this round and three more like it (at most [`MOST_ROOM_AHEAD`]
/// elements more), or to twice its size if that is more: a doubling from four elements would
/// copy every element, long gone from the cache, at every second or third round of a run.
fn room_for_rounds<T>(v: &mut Vec<T>, additional: usize) {
    if v.capacity() - v.len() < additional {
        let ahead = additional.saturating_mul(3).min(MOST_ROOM_AHEAD);
        let want = (v.len() + additional + ahead).max(2 * v.capacity());
        v.reserve_exact(want - v.len());
    }
}

/// The event of a call that finished with `status`.
fn finished(round: u32, call: &ToolCall, status: CallStatus, duration_ms: u64) -> Event {
    Event::ToolFinished {
        round,
        call_id: call.id.clone(),
        name: call.name.clone(),
        success: status == CallStatus::Ok,
        status,
        duration_ms,
    }
}

#[cfg(test)]
mod room_tests {
    use super::{MOST_ROOM_AHEAD, room_for_rounds};

    #[test]
    fn a_full_transcript_grows_by_four_rounds_or_doubles() {
        // A caller's one message, then a round of two calls (three elements).
        let mut v = vec![0u8];
        room_for_rounds(&mut v, 3);
        assert_eq!(v.capacity(), 13);
        v.extend([0; 12]);
        // Full: four more rounds of three are 25, twice the size 26.
        room_for_rounds(&mut v, 3);
        assert_eq!(v.capacity(), 26);
        // Room enough: nothing moves.
        let before = v.as_ptr();
        room_for_rounds(&mut v, 3);
        assert_eq!((v.capacity(), v.as_ptr()), (26, before));
        // An empty record takes four rounds of its first round's calls.
        let mut record: Vec<u64> = Vec::new();
        room_for_rounds(&mut record, 2);
        assert_eq!(record.capacity(), 8);
        // A round of a thousand calls: room for itself and 64 more, not for four thousand.
        let mut huge: Vec<u64> = Vec::new();
        room_for_rounds(&mut huge, 1000);
        assert_eq!(huge.capacity(), 1000 + MOST_ROOM_AHEAD);
    }
}
