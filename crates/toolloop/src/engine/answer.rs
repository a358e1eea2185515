//! The answer path: a model's response comes in (its usage and cost counted, its call ids made
//! unique) and, when it holds no tool call, is the run's answer, checked against the output
//! schema; and how a run ends (a failed model call, the round limit, an interruption, the
//! outcome).

use super::*;

impl Machine {
    pub(super) fn add_cost(&mut self, cost: Option<f64>) {
        self.state.cost = match (self.state.cost, cost) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
    }

    /// [`Input::ModelResponded`], in the phase it fits.
    pub(super) fn model_responded(
        &mut self,
        response: ModelResponse,
        cost: Option<f64>,
        subjects: Vec<Option<Subject>>,
    ) -> Result<(), PhaseError> {
        // Refused before anything changes: a call the policy weighs without its subject (a
        // policy that weighs no call of these tools has none to refuse).
        let weighs_any = self.approvals_weigh_any();
        for (i, call) in response
            .tool_calls
            .iter()
            .enumerate()
            .filter(|_| weighs_any)
        {
            let weighed = self.catalog.get(&call.name).is_some_and(|e| {
                self.config
                    .approvals
                    .weighs_subject(&call.name, e.approval_default())
            });
            if weighed && subjects.get(i).is_none_or(Option::is_none) {
                return Err(self.phase_error(
                    "model_responded",
                    format!(
                        "; call {i} (`{}`) has no approval subject, and the approval policy \
                         weighs it",
                        result::shorten(&call.name, result::ECHO_CHARS)
                    ),
                ));
            }
        }
        let usage = response.usage;
        self.context_observed(usage.as_ref(), response.context_edited);
        match usage {
            Some(u) => *self.state.usage.get_or_insert_with(Usage::default) += u,
            None => self.state.calls_without_usage += 1,
        }
        self.add_cost(if usage.is_some() { cost } else { None });
        let ModelResponse {
            text,
            mut tool_calls,
            finish_reason,
            parts,
            malformed_call,
            ..
        } = response;
        self.unique_call_ids(&mut tool_calls);
        if tool_calls.is_empty() {
            self.answered(text, parts, finish_reason, usage, malformed_call);
        } else {
            self.triage(text, tool_calls, parts, finish_reason, usage, subjects);
        }
        Ok(())
    }

    /// A response without tool calls: a final answer (checked against the output schema, if
    /// one is set), an answer the output-token limit cut short, or a malformed call the model
    /// is told about.
    pub(super) fn answered(
        &mut self,
        text: Option<String>,
        parts: Vec<crate::message::ProviderPart>,
        finish_reason: FinishReason,
        usage: Option<Usage>,
        malformed_call: Option<String>,
    ) {
        let round = self.state.round;

        self.state
            .messages
            .push(Message::Assistant(AssistantMessage {
                text: text.clone(),
                tool_calls: Vec::new(),
                parts,
            }));
        self.round_finished_event(finish_reason, usage);
        if let Some(reason) = malformed_call {
            // The explanation may quote the server or the model at any length.
            let reason = result::cap(reason, self.config.max_result_chars);
            emit!(
                self,
                Event::MalformedToolCall {
                    round,
                    reason: reason.clone(),
                }
            );
            self.state.messages.push(Message::user(reason.clone()));
            self.state.consecutive_invalid += 1;
            self.state.phase = Phase::Ready;
            self.check_invalid_budget(ErrorCode::ParseError, &reason);
            return;
        }
        if finish_reason == FinishReason::Length {
            // An answer the output-token limit cut short is kept, but it is not an answer.
            self.finish(
                StopReason::OutputTruncated,
                text,
                Some(RunError {
                    code: ErrorCode::OutputTruncated,
                    message: "the output-token limit cut the answer short; the partial text \
                              is kept. Raise the output limit or ask for a shorter answer"
                        .into(),
                }),
            );
            return;
        }
        if let Some(check) = &self.output_check {
            let checked = match check {
                Ok(check) => check.check(text.as_deref().unwrap_or_default()),
                Err(e) => Err(crate::output::InvalidOutput(vec![format!(
                    "the output schema cannot be used ({e})"
                )])),
            };
            match checked {
                Ok(value) => {
                    self.finish(StopReason::Answered, text, None);
                    if let Phase::Done { output, .. } = &mut self.state.phase {
                        *output = Some(value);
                    }
                }
                Err(invalid) => self.invalid_output(round, invalid),
            }
            return;
        }
        if text.as_deref().is_none_or(|t| t.trim().is_empty()) {
            self.finish(
                StopReason::EmptyAnswer,
                text,
                Some(RunError {
                    code: ErrorCode::EmptyAnswer,
                    message: "the model answered with nothing (no text and no tool call); \
                              a server or proxy that cannot use a request sometimes replies \
                              this way: the request log (--debug-requests) shows the \
                              exchange"
                        .into(),
                }),
            );
            return;
        }
        self.finish(StopReason::Answered, text, None);
    }

    /// A final answer failed the output schema: the errors go back to the model as a user
    /// message, and the answer counts as an invalid call.
    pub(super) fn invalid_output(&mut self, round: u32, invalid: crate::output::InvalidOutput) {
        let errors = invalid.to_string();
        let name = self
            .state
            .output_schema
            .as_ref()
            .map(|s| result::shorten(&s.name, result::ECHO_CHARS).into_owned())
            .unwrap_or_default();
        let feedback = result::cap(
            format!(
                "Your final answer does not match the required output schema `{name}`: {errors}. \
                 Reply again with only a JSON value that matches the schema (or call a tool if \
                 you need more information)."
            ),
            self.config.max_result_chars,
        );
        emit!(
            self,
            Event::InvalidOutput {
                round,
                errors: errors.clone(),
            }
        );
        self.state.messages.push(Message::user(feedback));
        self.state.consecutive_invalid += 1;
        self.state.phase = Phase::Ready;
        let errors = result::cap(errors, self.config.max_result_chars);
        self.check_invalid_budget(ErrorCode::InvalidOutput, &errors);
    }

    pub(super) fn check_invalid_budget(&mut self, code: ErrorCode, what: &str) {
        let over = match self.config.invalid_calls {
            InvalidCallPolicy::Strict => self.state.consecutive_invalid > 0,
            InvalidCallPolicy::Feedback { budget } => self.state.consecutive_invalid > budget,
        };
        if over {
            let n = self.state.consecutive_invalid;
            let message = if code == ErrorCode::InvalidOutput {
                format!(
                    "{n} invalid tool calls or final answers in a row; the last answer does not \
                     match the output schema: {what}"
                )
            } else {
                format!("{n} invalid tool calls in a row: {what}")
            };
            self.finish(
                StopReason::TooManyInvalidCalls,
                None,
                Some(RunError { code, message }),
            );
        }
    }

    /// [`Input::ModelFailed`], in the phase it fits.
    pub(super) fn model_failed(&mut self, message: String) {
        self.finish(
            StopReason::ModelError,
            None,
            Some(RunError {
                code: ErrorCode::LlmCallFailed,
                message,
            }),
        );
    }

    /// [`Input::RoundLimitDecided`].
    pub(super) fn round_limit_decided(
        &mut self,
        decision: RoundLimitDecision,
    ) -> Result<(), PhaseError> {
        if self.state.phase != Phase::RoundLimit {
            return Err(self.phase_error("round_limit_decided", String::new()));
        }
        match decision {
            RoundLimitDecision::Extend(n) if n > 0 => {
                // Saturating: a hook may grant any u32, and a limit that wrapped would fall below
                // the rounds already run.
                self.state.round_limit = self.state.round_limit.saturating_add(n);
                self.state.phase = Phase::Ready;
            }
            RoundLimitDecision::Signal(signal) => {
                self.finish(StopReason::TerminalSignal, None, None);
                self.set_signal(signal);
            }
            _ => self.finish_max_rounds(),
        }
        Ok(())
    }

    /// [`Input::Interrupted`].
    pub(super) fn interrupt(&mut self, why: Interrupt) {
        if matches!(self.state.phase, Phase::Done { .. }) {
            return;
        }
        let (reason, code, message) = match why {
            Interrupt::Cancelled => (
                StopReason::Cancelled,
                ErrorCode::Cancelled,
                "the run was cancelled",
            ),
            Interrupt::Timeout => (
                StopReason::Timeout,
                ErrorCode::Timeout,
                "the run's timeout passed",
            ),
            Interrupt::StoreFailed => (
                StopReason::StoreFailed,
                ErrorCode::StoreFailed,
                "the run log could not be written",
            ),
        };
        if let Phase::Tools { slots, .. } = &mut self.state.phase {
            for slot in slots.iter_mut().filter(|s| s.status.is_none()) {
                slot.status = Some(CallStatus::Cancelled);
                slot.content = Some(result::error_content(&format!(
                    "Cancelled: {message} before this call finished."
                )));
            }
            self.finish_round(Some(()));
        }
        self.finish(
            reason,
            None,
            Some(RunError {
                code,
                message: message.to_string(),
            }),
        );
    }

    pub(super) fn round_finished_event(
        &mut self,
        finish_reason: FinishReason,
        usage: Option<Usage>,
    ) {
        emit!(
            self,
            Event::RoundFinished {
                round: self.state.round,
                finish_reason,
                usage,
                total_usage: self.state.usage,
            }
        );
    }

    pub(super) fn set_signal(&mut self, signal: String) {
        if let Phase::Done { signal: s, .. } = &mut self.state.phase {
            *s = Some(signal);
        }
    }

    /// Ends the run at the round limit, before the model gave a final answer.
    pub(super) fn finish_max_rounds(&mut self) {
        let limit = self.state.round_limit;
        self.finish(
            StopReason::MaxRounds,
            None,
            Some(RunError {
                code: ErrorCode::MaxIterationsReached,
                message: format!(
                    "max rounds reached ({limit}) before the model gave a final answer"
                ),
            }),
        );
    }

    pub(super) fn finish(
        &mut self,
        stop_reason: StopReason,
        text: Option<String>,
        error: Option<RunError>,
    ) {
        // A failed run's error tells how it stopped; a run with no error succeeded.
        let stop_reason = match &error {
            Some(e) => e.code.stop_reason(),
            None => stop_reason,
        };
        debug_assert_eq!(error.is_none(), stop_reason.is_success(), "{stop_reason:?}");
        self.state.phase = Phase::Done {
            stop_reason,
            signal: None,
            text,
            output: None,
            error,
        };
    }

    /// Whether the run is over.
    pub fn is_finished(&self) -> bool {
        matches!(self.state.phase, Phase::Done { .. })
    }

    /// The outcome of a finished run (an unfinished one reads as cancelled).
    pub fn into_outcome(mut self, duration_ms: u64) -> Outcome {
        if !self.is_finished() {
            self.interrupt(Interrupt::Cancelled);
        }
        // The view holds the whole conversation: a next run goes on from it.
        self.sync_view();
        let LoopState {
            messages,
            round,
            usage,
            calls_without_usage,
            cost,
            calls,
            phase,
            pending_approvals,
            context,
            ..
        } = self.state;
        // With no reported usage there is nothing to price: the cost is unknown, not zero.
        let cost = if usage.is_some() { cost } else { None };
        let Phase::Done {
            stop_reason,
            signal,
            text,
            output,
            error,
        } = phase
        else {
            unreachable!("interrupt always finishes the run")
        };
        // A run that did not answer still shows the last thing the model wrote.
        let text = if stop_reason == StopReason::Answered {
            text
        } else {
            text.or_else(|| {
                messages.iter().rev().find_map(|m| match m {
                    Message::Assistant(a) => a.text.clone().filter(|t| !t.is_empty()),
                    _ => None,
                })
            })
        };
        Outcome {
            success: stop_reason.is_success(),
            stop_reason,
            text,
            output,
            signal,
            rounds: round,
            tool_calls: calls,
            messages,
            usage,
            calls_without_usage,
            cost,
            duration_ms,
            error,
            run_id: None,
            pending_approvals,
            context,
        }
    }
}
