//! Replay: a machine rebuilt from a run's log by handing its records to a fresh machine, with
//! the few rules that keep older logs replaying as they ran.

use super::*;

/// Why a run's records do not replay onto the run (see [`Machine::replay`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The log is empty or does not begin with [`Input::Started`].
    #[error("the first record is not `started`")]
    NotStarted,
    /// A stored record does not parse (damaged, or written by an incompatible version).
    #[error("record {record} does not parse: {message}")]
    Unreadable {
        /// The record's position in the log (0 is `started`).
        record: usize,
        /// The parser's message.
        message: String,
    },
    /// A record came where the loop could not take it.
    #[error("record {record}: {source}")]
    Unfit {
        /// The record's position in the log (0 is `started`).
        record: usize,
        /// The input the record stands for, and what the loop was doing.
        #[source]
        source: PhaseError,
    },
}

impl Machine {
    /// Rebuilds a machine from a run's log (see [`crate::journal`]): the first record,
    /// [`Input::Started`], makes the machine, with the run's tools as `catalog` (a logged
    /// [`Input::ToolsChanged`] replaces it) and the hooks the driver has; every other record is
    /// handed to it in order. The calls in flight at a crash are then [`Machine::in_flight`].
    ///
    /// No hook is called and no tool: their answers are records. Between records the loop
    /// takes the steps that need no answer (a round's start, its end), as the live run did.
    /// Three rules keep older logs replaying as they ran: a `reminders` or `stop_when` answer
    /// the log does not hold (logs from before they were recorded) is taken as no reminders
    /// and no signal, which is what a run that went on did see; a call the log shows started
    /// or finished was allowed when it ran (a policy that differs now does not change what
    /// happened); and a recorded decision that does not fit its call (other arguments) is not
    /// applied, so the call is asked about again. Logs written by toolloop 0.1 are brought up
    /// to date first with [`crate::journal::upgrade`]. A record that does not fit the run is
    /// an error.
    pub fn replay(
        config: Arc<LoopConfig>,
        hooks: HookFlags,
        catalog: Arc<Catalog>,
        records: impl IntoIterator<Item = Input>,
    ) -> Result<Machine, ReplayError> {
        let mut records = records.into_iter();
        let Some(Input::Started {
            messages,
            output_schema,
        }) = records.next()
        else {
            return Err(ReplayError::NotStarted);
        };
        let mut m = Machine::new(config, hooks, catalog, messages);
        // The schema the run was started with, even if the agent's has changed since.
        m.output_check = compile_output(output_schema.as_ref());
        m.state.output_schema = output_schema;
        for (i, input) in records.enumerate() {
            let unfit = |source: PhaseError| ReplayError::Unfit {
                record: i + 1,
                source,
            };
            m.catch_up(&input).map_err(unfit)?;
            let decision = matches!(input, Input::ApprovalDecided { .. });
            match m.handle(input) {
                // A decision that does not fit its call: the call is asked about again.
                Err(_) if decision => {}
                done => done.map_err(unfit)?,
            }
        }
        m.events.clear();
        Ok(m)
    }

    /// During replay, before `input`: takes the steps the log does not record (see
    /// [`Machine::replay`]), so that the input comes where the live run took it.
    pub(super) fn catch_up(&mut self, input: &Input) -> Result<(), PhaseError> {
        let kind = input.kind();
        match input {
            Input::ToolsChanged { round, .. } if *round > 0 => self.reach_model_call(kind, *round),
            Input::ModelRequested { round }
            | Input::ModelResponded { round, .. }
            | Input::ModelFailed { round, .. }
            | Input::ContextOverflowed { round, .. } => self.reach_model_call(kind, *round),
            Input::ContextEdited { .. }
            | Input::Compacted { .. }
            | Input::CompactionFailed { .. } => loop {
                match self.next_step() {
                    Step::CheckStop => self.stop_checked(None)?,
                    _ => return Ok(()),
                }
            },
            Input::RemindersGiven { .. } => self.settle_unrecorded(false),
            Input::RoundLimitDecided { .. } => {
                self.settle_unrecorded(false)?;
                if self.next_step() != Step::DecideRoundLimit {
                    return Err(self.phase_error(kind, "; the round limit was not reached".into()));
                }
                Ok(())
            }
            Input::ToolStarted { index, .. }
            | Input::ToolFinished { index, .. }
            | Input::ToolUnknown { index, .. } => {
                self.ran_in_history(*index);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// During replay, before a model call's record: brings the loop to that call (past the
    /// hooks' answers the log does not hold) and checks it is the loop's next step, round
    /// `round`.
    pub(super) fn reach_model_call(
        &mut self,
        input: &'static str,
        round: u32,
    ) -> Result<(), PhaseError> {
        self.settle_unrecorded(true)?;
        match self.next_step() {
            Step::CallModel { round: r, .. } if r == round => Ok(()),
            other => Err(self.phase_error(
                input,
                format!("; round {round} requested, but the loop was at {other:?}"),
            )),
        }
    }

    /// During replay: a call the log shows running was allowed when it ran.
    pub(super) fn ran_in_history(&mut self, index: usize) {
        if let Phase::Tools { slots, .. } = &mut self.state.phase
            && let Some(slot) = slots.get_mut(index)
            && slot.approval == Some(ApprovalState::Pending)
        {
            slot.approval = Some(ApprovalState::Approved);
        }
    }

    /// During replay, before a record that comes after a hook's answer: a `stop_when` (and,
    /// with `reminders_too`, a `reminders`) answer the log does not hold was given by a run
    /// that did not record them; it is taken as no signal (no reminders).
    pub(super) fn settle_unrecorded(&mut self, reminders_too: bool) -> Result<(), PhaseError> {
        loop {
            match self.next_step() {
                Step::CheckStop => self.stop_checked(None)?,
                Step::GetReminders if reminders_too => {
                    self.reminders_given(self.state.round + 1, Vec::new())?
                }
                Step::EditContext { .. } | Step::Compact(_) => self.skip_context_step(),
                _ => return Ok(()),
            }
        }
    }
}
