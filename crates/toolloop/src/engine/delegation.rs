//! Delegation: what the machine knows of sub-agents (see [`crate::subagent`]). A child's run is
//! one tool call of its parent's round; the machine counts what the child spent in the run's
//! usage and cost, and stops the run, unlogged, while a child waits for approvals.

use super::*;
use crate::usage::Spent;

impl Machine {
    /// Counts what a call spent on model calls of its own (a child's run) in the run's usage and
    /// cost.
    pub(super) fn add_spent(&mut self, spent: &Spent) {
        if let Some(u) = spent.usage {
            *self.state.usage.get_or_insert_with(Usage::default) += u;
        }
        self.state.calls_without_usage += spent.calls_without_usage;
        if spent.usage.is_some() || spent.rounds > 0 {
            self.add_cost(spent.cost);
        }
    }

    /// Children of calls in flight wait for approvals (`waiting`, each with its
    /// [`PendingApproval::path`]) and no handler can answer: the run stops with
    /// [`StopReason::AwaitingApproval`], listing them in [`Outcome::pending_approvals`]. Like
    /// [`Machine::await_approval`] this is not an [`Input`] and is not logged: the log leaves
    /// the calls in flight, so a resume runs them again, and each child resumes from its own
    /// log once the decisions are recorded there.
    pub fn await_child_approvals(
        &mut self,
        waiting: Vec<PendingApproval>,
    ) -> Result<(), PhaseError> {
        if !matches!(self.state.phase, Phase::Tools { .. }) || waiting.is_empty() {
            return Err(self.phase_error(
                "await_child_approvals",
                "; no call of the round has a child waiting for an approval".into(),
            ));
        }
        self.stop_for_approvals(waiting, " of sub-agents", |p| {
            let name = result::shorten(&p.call.name, result::ECHO_CHARS);
            format!("{} in {}", name, p.path.join("/"))
        });
        Ok(())
    }
}
