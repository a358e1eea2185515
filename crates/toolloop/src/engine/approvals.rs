//! Approvals: a planned call is weighed against the policy by the approval subject the driver
//! gave ([`crate::approval`]); calls that wait are asked about ([`Step::Approve`]), and a
//! decision bound to the call lets it run or settles it as denied.

use super::*;

/// A call waiting for its approval, and what the policy says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The call.
    pub pending: PendingApproval,
    /// The policy's verdict: a rule decides, or a person is asked.
    pub verdict: Verdict,
}

impl Machine {
    /// What the policy says of a call of the round, whose approval subject the driver gave
    /// (`subject`): the subject and the verdict.
    pub(super) fn weigh(&self, call: &ToolCall, subject: Option<&Subject>) -> (String, Verdict) {
        let text = match subject {
            Some(subject) => subject.text.clone(),
            None => call.canonical_arguments(),
        };
        (text, self.verdict(call, subject))
    }

    /// The verdict of [`Machine::weigh`] alone, without the subject's text (which a call the
    /// policy allows never needs).
    pub(super) fn verdict(&self, call: &ToolCall, subject: Option<&Subject>) -> Verdict {
        let default = self
            .catalog
            .get(&call.name)
            .map_or(Action::Allow, CatalogEntry::approval_default);
        self.verdict_by(call, subject, default)
    }

    /// [`Machine::verdict`] for a call whose tool's own default approval is `default` (the
    /// caller looked its tool up already).
    pub(super) fn verdict_by(
        &self,
        call: &ToolCall,
        subject: Option<&Subject>,
        default: Action,
    ) -> Verdict {
        let policy = &self.config.approvals;
        match subject {
            Some(subject) => match policy.verdict_for(&call.name, subject, default) {
                // Only a person approves such a call (`Tool::approval_required`); a rule that
                // denies it still wins.
                Verdict::Allow { .. } if subject.person => Verdict::Ask,
                verdict => verdict,
            },
            // A subject the policy weighs, missing from a state saved before subjects were
            // kept: a person decides.
            None if policy.weighs_subject(&call.name, default) => Verdict::Ask,
            // The policy does not weigh it: the call is allowed by default.
            None => Verdict::Allow { rule: None },
        }
    }

    /// Whether the approval policy can weigh a call of any of the catalog's tools
    /// ([`crate::approval::Approvals::weighs_subject`]): not when it has no rule, no default
    /// of its own other than allow, and no tool's own default asks. Without a policy (the
    /// usual run), a response's calls are then not looked up for their approvals.
    pub(super) fn approvals_weigh_any(&self) -> bool {
        let policy = &self.config.approvals;
        !policy.rules.is_empty()
            || match policy.default {
                Some(action) => action != Action::Allow,
                None => self.catalog.any_asks(),
            }
    }

    pub(super) fn approval_request(&self, index: usize, slot: &Slot) -> ApprovalRequest {
        let (subject, verdict) = self.weigh(&slot.call, slot.subject.as_ref());
        ApprovalRequest {
            pending: PendingApproval {
                round: self.state.round,
                index,
                call: (*slot.call).clone(),
                subject,
                path: Vec::new(),
                run_id: None,
            },
            verdict,
        }
    }

    /// The approval subject call `index` of the round was weighed by (by rules, or for a
    /// person asked about it), where the policy weighs it. A driver checks, just before the
    /// call runs, that its tool gives the same subject now; when it does not (a link or a
    /// program changed since, by a call of the same round, say), the call is not run, and the
    /// result the driver gives it ([`Input::ToolFinished`]) says why.
    pub fn weighed_subject(&self, index: usize) -> Option<&Subject> {
        match &self.state.phase {
            Phase::Tools { slots, .. } => slots.get(index).and_then(|s| s.subject.as_ref()),
            _ => None,
        }
    }

    /// [`Input::ApprovalDecided`].
    pub(super) fn approval_decided(
        &mut self,
        index: usize,
        decision: &Decision,
    ) -> Result<(), PhaseError> {
        let round = self.state.round;
        let slot = Self::pending_slot(&mut self.state.phase, "approval_decided", index, true)?;
        if slot.approval != Some(ApprovalState::Pending) {
            return Err(PhaseError {
                input: "approval_decided",
                phase: "running the round's tool calls",
                detail: format!("; call {index} does not wait for an approval"),
            });
        }
        if !decision.binds(&slot.call) {
            return Err(PhaseError {
                input: "approval_decided",
                phase: "running the round's tool calls",
                detail: format!(
                    "; the decision is for another call or other arguments than call {index}: \
                     an approval holds only for the exact call"
                ),
            });
        }
        if decision.approved {
            slot.approval = Some(ApprovalState::Approved);
        } else {
            slot.approval = None;
            slot.run = false;
            slot.status = Some(CallStatus::Denied);
            slot.content = Some(result::error_content(&decision.denial()));
        }
        let by = match &decision.by {
            crate::approval::DecidedBy::Rule { rule } => rule.clone(),
            crate::approval::DecidedBy::Person => "person".to_string(),
        };
        let (call_id, name) = (slot.call.id.clone(), slot.call.name.clone());
        emit!(
            self,
            Event::ApprovalDecided {
                round,
                call_id,
                name,
                approved: decision.approved,
                by,
            }
        );
        Ok(())
    }

    /// No approval handler: the run stops with [`StopReason::AwaitingApproval`], listing the
    /// calls still waiting ([`Outcome::pending_approvals`]). Nothing of the round has run.
    /// This is not an [`Input`] and is not logged: the run log holds the round, so the run
    /// continues from here on resume, once decisions are recorded (or asked).
    pub fn await_approval(&mut self) -> Result<(), PhaseError> {
        let waiting: Vec<PendingApproval> = match &self.state.phase {
            Phase::Tools { slots, .. } => slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.status.is_none() && s.approval == Some(ApprovalState::Pending))
                .map(|(i, s)| self.approval_request(i, s).pending)
                .collect(),
            _ => Vec::new(),
        };
        if waiting.is_empty() {
            return Err(self.phase_error(
                "await_approval",
                "; no call of the round waits for an approval".into(),
            ));
        }
        self.stop_for_approvals(waiting, "", |p| {
            result::shorten(&p.call.name, result::ECHO_CHARS).into_owned()
        });
        Ok(())
    }

    /// Ends the run to wait for the `waiting` approvals (of calls `whose`, as the message says
    /// it), each named in the message by `name`.
    pub(super) fn stop_for_approvals(
        &mut self,
        waiting: Vec<PendingApproval>,
        whose: &str,
        name: impl Fn(&PendingApproval) -> String,
    ) {
        let n = waiting.len();
        let names: Vec<String> = waiting.iter().map(name).collect();
        self.state.pending_approvals = waiting;
        self.finish(
            StopReason::AwaitingApproval,
            None,
            Some(RunError {
                code: ErrorCode::AwaitingApproval,
                message: format!(
                    "{n} tool call(s){whose} wait for approval ({}); approve or deny them, then \
                     resume the run",
                    names.join(", ")
                ),
            }),
        );
    }
}
