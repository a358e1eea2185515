//! A person's decisions on a logged run's waiting calls: listed, recorded in the run's log (or
//! its sub-agents' logs), and acted on when the run is resumed.

use super::{Agent, RunLog};
use crate::approval::{Answer, ApprovalError, DecidedBy, Decision, PendingApproval, Verdict};
use crate::engine::{Input, Step};
use crate::journal::JournalError;
use std::sync::Arc;

impl Agent {
    /// The calls of a logged run that wait for a person's approval (a run that stopped with
    /// [`StopReason::AwaitingApproval`](crate::outcome::StopReason::AwaitingApproval), or one that crashed while a person was asked). Empty
    /// when none does.
    pub async fn pending_approvals(
        &self,
        run_id: &str,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        self.decide_approvals(run_id, None, None).await
    }

    /// Records a person's decision on calls of a logged run that wait for approval: `calls`
    /// names them by call id (`None`: every waiting call). Returns the calls decided. The
    /// decisions are bound to the calls' exact arguments and take effect when the run is
    /// resumed ([`Agent::resume`]), in this process or another. `answer` `None` decides
    /// nothing and returns the waiting calls.
    pub async fn decide_approvals(
        &self,
        run_id: &str,
        calls: Option<&[String]>,
        answer: Option<Answer>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        Box::pin(self.decide_approvals_in(run_id, calls, answer)).await
    }

    /// [`Agent::decide_approvals`]: the run's own calls, or else its children's (sub-agents of
    /// calls in flight: see [`crate::subagent`]), each decided in the child's own log.
    async fn decide_approvals_in(
        &self,
        run_id: &str,
        calls: Option<&[String]>,
        answer: Option<Answer>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        let journal = self
            .parts
            .journal
            .clone()
            .ok_or_else(|| JournalError::Store("no run log (journal) is configured".into()))?;
        let log = RunLog::new(journal.clone(), run_id.to_string());
        let (mut machine, toolbox) = self.take_and_replay(&log).await?;
        let waiting: Vec<PendingApproval> = match machine.next_step() {
            Step::Approve(requests) => requests
                .into_iter()
                .filter(|r| r.verdict == Verdict::Ask)
                .map(|r| r.pending)
                .collect(),
            _ => Vec::new(),
        };
        // Children of calls in flight, when the run's own calls wait for nothing.
        let children: Vec<(String, String, Agent)> = if waiting.is_empty() {
            machine
                .in_flight()
                .into_iter()
                .filter_map(|i| machine.round_call(i))
                .filter_map(|call| {
                    let sub = toolbox.get(&call.name)?.sub_agent()?;
                    let mut agent = sub.agent().clone();
                    Arc::make_mut(&mut agent.parts).journal = Some(journal.clone());
                    Some((
                        sub.name().to_string(),
                        crate::subagent::SubAgent::child_run_id(run_id, &call.id),
                        agent,
                    ))
                })
                .collect()
        } else {
            Vec::new()
        };
        if !children.is_empty() {
            let _ = log.journal.release(run_id, &log.holder).await;
            return self.decide_children(run_id, children, calls, answer).await;
        }
        let result = (|| {
            let Some(answer) = answer else {
                return Ok((waiting, Vec::new()));
            };
            let chosen: Vec<PendingApproval> = match calls {
                None => waiting.clone(),
                Some(ids) => {
                    let mut chosen = Vec::new();
                    for id in ids {
                        match waiting.iter().find(|p| &p.call.id == id) {
                            Some(p) => chosen.push(p.clone()),
                            None => {
                                return Err(ApprovalError::NotWaiting {
                                    run_id: run_id.to_string(),
                                    call_id: id.clone(),
                                    waiting: waiting.iter().map(|p| p.call.id.clone()).collect(),
                                });
                            }
                        }
                    }
                    chosen
                }
            };
            let records = chosen
                .iter()
                .map(|p| {
                    let (approved, reason) = match &answer {
                        Answer::Approve => (true, None),
                        Answer::Deny { reason } => (false, reason.clone()),
                    };
                    Input::ApprovalDecided {
                        round: p.round,
                        index: p.index,
                        decision: Decision::new(&p.call, approved, reason, DecidedBy::Person),
                    }
                })
                .collect();
            Ok((chosen, records))
        })();
        let written = match &result {
            Ok((_, records)) if !records.is_empty() => {
                log.journal.append_all(run_id, records).await
            }
            _ => Ok(()),
        };
        let _ = log.journal.release(run_id, &log.holder).await;
        written?;
        result.map(|(chosen, _)| chosen)
    }

    /// Lists or decides what the children of a run's calls in flight wait for: `children` are
    /// each child's name, run id and agent.
    async fn decide_children(
        &self,
        run_id: &str,
        children: Vec<(String, String, Agent)>,
        calls: Option<&[String]>,
        answer: Option<Answer>,
    ) -> Result<Vec<PendingApproval>, ApprovalError> {
        let below = |name: &str, child_id: &str, mut p: PendingApproval| {
            p.path.insert(0, name.to_string());
            if p.run_id.is_none() {
                p.run_id = Some(child_id.to_string());
            }
            p
        };
        let mut waiting = Vec::new();
        for (name, child_id, agent) in &children {
            match agent.decide_approvals(child_id, None, None).await {
                Ok(list) => waiting.extend(list.into_iter().map(|p| below(name, child_id, p))),
                // A child that never started its log waits for nothing.
                Err(ApprovalError::Journal(JournalError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        let Some(answer) = answer else {
            return Ok(waiting);
        };
        if let Some(ids) = calls
            && let Some(id) = ids
                .iter()
                .find(|id| !waiting.iter().any(|p| &p.call.id == *id))
        {
            return Err(ApprovalError::NotWaiting {
                run_id: run_id.to_string(),
                call_id: id.clone(),
                waiting: waiting.iter().map(|p| p.call.id.clone()).collect(),
            });
        }
        let mut decided = Vec::new();
        for (name, child_id, agent) in &children {
            let mine: Vec<String> = waiting
                .iter()
                .filter(|p| p.path.first() == Some(name) && p.run_id.is_some())
                .filter(|p| {
                    // The child's subtree: its own calls and its children's.
                    p.run_id.as_deref() == Some(child_id.as_str())
                        || p.run_id
                            .as_deref()
                            .is_some_and(|r| r.starts_with(&format!("{child_id}/")))
                })
                .filter(|p| calls.is_none_or(|ids| ids.contains(&p.call.id)))
                .map(|p| p.call.id.clone())
                .collect();
            if mine.is_empty() {
                continue;
            }
            let list = agent
                .decide_approvals(child_id, Some(&mine), Some(answer.clone()))
                .await?;
            decided.extend(list.into_iter().map(|p| below(name, child_id, p)));
        }
        Ok(decided)
    }
}
