//! Checking and repairing a stored transcript, so that the next request is valid for every
//! provider.
//!
//! Every provider wants each tool call of an assistant turn answered exactly once, by results
//! that come right after that turn (OpenAI: `tool` messages before anything else; Anthropic:
//! `tool_result` blocks at the start of the next user message; Gemini: `functionResponse` parts
//! matched by name and order). A transcript saved by a process that was killed, or edited by
//! hand, may break that rule; [`repair_transcript`] puts it back:
//!
//! - a tool call with no result gets a synthetic error result saying the outcome is unknown;
//! - a result that arrives later (after another message) is moved up behind its call;
//! - a result that answers no earlier call (an orphan), or answers a call a second time, is
//!   dropped;
//! - the results of a turn are put in the order of its calls;
//! - an assistant turn with no text, no tool calls and no provider parts is dropped (some
//!   providers reject empty turns).
//!
//! [`check_transcript`] reports the same problems without changing anything.

use crate::message::{Message, ToolResult};
use crate::result::error_content;
use std::collections::{HashMap, HashSet};

/// The content of the synthetic result given to a call that has none.
pub fn missing_result_content() -> String {
    error_content(
        "Outcome unknown: this call has no recorded result (the run that made it stopped \
         before the result was saved). It may or may not have taken effect; check before \
         repeating it.",
    )
}

/// What is wrong with a transcript, one line per problem; empty when it is valid.
pub fn check_transcript(messages: &[Message]) -> Vec<String> {
    let mut copy = messages.to_vec();
    repair_transcript(&mut copy)
}

/// Repairs a transcript in place (see the [module docs](self)) and says what it repaired, one
/// line per change; an empty list means the transcript was already valid and is unchanged.
///
/// The result is valid: every call of every assistant turn is answered exactly once, by the
/// tool messages that directly follow the turn, in the order of the calls, and no other tool
/// message exists. Repairing twice changes nothing the second time.
pub fn repair_transcript(messages: &mut Vec<Message>) -> Vec<String> {
    let mut repairs = Vec::new();
    let original = std::mem::take(messages);
    // Where each result is, by call id (first occurrence), to move late results into place.
    let mut pending: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, m) in original.iter().enumerate() {
        if let Message::Tool(r) = m {
            pending.entry(r.call_id.clone()).or_default().push(i);
        }
    }
    let mut used: HashSet<usize> = HashSet::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut out: Vec<Message> = Vec::with_capacity(original.len());
    let mut answered_results: Vec<Message> = Vec::new();
    let mut i = 0;
    while i < original.len() {
        match &original[i] {
            Message::Assistant(a)
                if a.text.as_deref().is_none_or(str::is_empty)
                    && a.tool_calls.is_empty()
                    && a.parts.is_empty() =>
            {
                repairs.push(format!("message {i}: dropped an empty assistant turn"));
                i += 1;
            }
            Message::Assistant(a) if !a.tool_calls.is_empty() => {
                // A call id repeated within one turn cannot be answered unambiguously.
                let mut turn = a.clone();
                let mut ids: HashSet<String> = HashSet::new();
                turn.tool_calls.retain(|c| {
                    let first = ids.insert(c.id.clone());
                    if !first {
                        repairs.push(format!(
                            "message {i}: dropped a second call with id `{}` ({}) from the turn",
                            short(&c.id),
                            short(&c.name)
                        ));
                    }
                    first
                });
                // The block of results right after the turn.
                let block_start = i + 1;
                let mut block_end = block_start;
                while matches!(original.get(block_end), Some(Message::Tool(_))) {
                    block_end += 1;
                }
                // A late result is looked for up to the next turn that makes calls.
                let limit = original[block_end..]
                    .iter()
                    .position(|m| matches!(m, Message::Assistant(x) if !x.tool_calls.is_empty()))
                    .map_or(original.len(), |p| block_end + p);
                for call in &turn.tool_calls {
                    let found = pending.get(&call.id).and_then(|at| {
                        at.iter()
                            .copied()
                            .find(|&j| j > i && j < limit && !used.contains(&j))
                    });
                    match found {
                        Some(j) => {
                            used.insert(j);
                            let Message::Tool(r) = &original[j] else {
                                continue;
                            };
                            if j >= block_end {
                                repairs.push(format!(
                                    "message {j}: moved the result of call `{}` ({}) up behind its call",
                                    short(&call.id), short(&call.name)
                                ));
                            }
                            answered_results.push(Message::Tool(r.clone()));
                        }
                        None => {
                            repairs.push(format!(
                                "message {i}: call `{}` ({}) had no result; added a synthetic \"outcome unknown\" error result",
                                short(&call.id), short(&call.name)
                            ));
                            answered_results.push(synthetic(call.id.clone(), call.name.clone()));
                        }
                    }
                    answered.insert(call.id.clone());
                }
                out.push(Message::Assistant(turn));
                out.append(&mut answered_results);
                // Results of the block that were not used: orphans or duplicates.
                for (j, m) in original
                    .iter()
                    .enumerate()
                    .take(block_end)
                    .skip(block_start)
                {
                    if !used.contains(&j)
                        && let Message::Tool(r) = m
                    {
                        used.insert(j);
                        repairs.push(drop_note(j, r, &answered));
                    }
                }
                // Say so when the block's results were not in the order of the calls.
                let mut seen = HashSet::new();
                let block_order: Vec<&str> = original[block_start..block_end]
                    .iter()
                    .filter_map(|m| match m {
                        Message::Tool(r) if ids.contains(&r.call_id) => Some(r.call_id.as_str()),
                        _ => None,
                    })
                    .filter(|id| seen.insert(*id))
                    .collect();
                let call_order: Vec<&str> = a
                    .tool_calls
                    .iter()
                    .map(|c| c.id.as_str())
                    .filter(|id| block_order.contains(id))
                    .collect::<Vec<_>>();
                let mut seen = HashSet::new();
                let call_order: Vec<&str> = call_order
                    .into_iter()
                    .filter(|id| seen.insert(*id))
                    .collect();
                if block_order != call_order {
                    repairs.push(format!(
                        "message {i}: put the results of the turn in the order of its calls"
                    ));
                }
                i = block_end;
            }
            Message::Tool(r) => {
                if !used.contains(&i) {
                    used.insert(i);
                    repairs.push(drop_note(i, r, &answered));
                }
                i += 1;
            }
            other => {
                out.push(other.clone());
                i += 1;
            }
        }
    }
    *messages = out;
    repairs
}

fn drop_note(at: usize, r: &ToolResult, answered: &HashSet<String>) -> String {
    if answered.contains(&r.call_id) {
        format!(
            "message {at}: dropped a second result for call `{}` ({})",
            short(&r.call_id),
            short(&r.name)
        )
    } else {
        format!(
            "message {at}: dropped a result for call `{}` ({}) that answers no earlier call",
            short(&r.call_id),
            short(&r.name)
        )
    }
}

/// An id or a name as a repair note repeats it (shortened: either can be any length).
fn short(text: &str) -> std::borrow::Cow<'_, str> {
    crate::result::shorten(text, crate::result::ECHO_CHARS)
}

fn synthetic(call_id: String, name: String) -> Message {
    Message::Tool(ToolResult {
        call_id,
        name,
        content: missing_result_content(),
        is_error: true,
        images: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AssistantMessage, ToolCall};
    use proptest::prelude::*;
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: format!("t{id}"),
            arguments: json!({}),
            invalid_arguments: None,
            provider_data: None,
        }
    }

    fn turn(ids: &[&str]) -> Message {
        Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: ids.iter().map(|id| call(id)).collect(),
            parts: vec![],
        })
    }

    fn result(id: &str) -> Message {
        Message::Tool(ToolResult {
            call_id: id.into(),
            name: format!("t{id}"),
            content: format!("r{id}"),
            is_error: false,
            images: Vec::new(),
        })
    }

    /// The rule every provider needs.
    fn is_valid(messages: &[Message]) -> bool {
        let mut i = 0;
        while i < messages.len() {
            match &messages[i] {
                Message::Assistant(a) if !a.tool_calls.is_empty() => {
                    for (k, c) in a.tool_calls.iter().enumerate() {
                        match messages.get(i + 1 + k) {
                            Some(Message::Tool(r)) if r.call_id == c.id => {}
                            _ => return false,
                        }
                    }
                    i += 1 + a.tool_calls.len();
                }
                Message::Assistant(a)
                    if a.text.as_deref().is_none_or(str::is_empty) && a.parts.is_empty() =>
                {
                    return false;
                }
                Message::Tool(_) => return false,
                _ => i += 1,
            }
        }
        true
    }

    #[test]
    fn a_valid_transcript_is_untouched() {
        let mut t = vec![
            Message::system("s"),
            Message::user("u"),
            turn(&["a", "b"]),
            result("a"),
            result("b"),
            Message::assistant("done"),
        ];
        let before = t.clone();
        assert!(repair_transcript(&mut t).is_empty());
        assert_eq!(t, before);
    }

    #[test]
    fn a_call_without_result_gets_a_synthetic_error() {
        let mut t = vec![Message::user("u"), turn(&["a", "b"]), result("a")];
        let repairs = repair_transcript(&mut t);
        assert_eq!(repairs.len(), 1, "{repairs:?}");
        assert!(repairs[0].contains("`b`"), "{repairs:?}");
        let Message::Tool(r) = &t[3] else {
            panic!("{t:?}")
        };
        assert_eq!(r.call_id, "b");
        assert_eq!(r.name, "tb");
        assert!(r.is_error);
        assert!(r.content.contains("Outcome unknown"));
        assert!(is_valid(&t));
    }

    #[test]
    fn a_call_cut_off_at_the_end_is_answered() {
        let mut t = vec![Message::user("u"), turn(&["a"])];
        assert_eq!(repair_transcript(&mut t).len(), 1);
        assert!(is_valid(&t));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn orphans_and_duplicates_are_dropped() {
        let mut t = vec![
            Message::user("u"),
            result("x"),
            turn(&["a"]),
            result("a"),
            result("a"),
            result("y"),
            Message::assistant("ok"),
        ];
        let repairs = repair_transcript(&mut t);
        assert_eq!(repairs.len(), 3, "{repairs:?}");
        assert!(repairs.iter().any(|r| r.contains("second result")));
        assert_eq!(
            t,
            vec![
                Message::user("u"),
                turn(&["a"]),
                result("a"),
                Message::assistant("ok")
            ]
        );
    }

    #[test]
    fn late_results_move_up_and_results_follow_call_order() {
        let mut t = vec![
            turn(&["a", "b"]),
            result("b"),
            Message::user("u"),
            result("a"),
        ];
        let repairs = repair_transcript(&mut t);
        assert!(repairs.iter().any(|r| r.contains("moved")), "{repairs:?}");
        assert_eq!(
            t,
            vec![
                turn(&["a", "b"]),
                result("a"),
                result("b"),
                Message::user("u")
            ]
        );
        let mut t = vec![turn(&["a", "b"]), result("b"), result("a")];
        let repairs = repair_transcript(&mut t);
        assert_eq!(repairs.len(), 1, "{repairs:?}");
        assert!(repairs[0].contains("order"));
        assert_eq!(t, vec![turn(&["a", "b"]), result("a"), result("b")]);
    }

    #[test]
    fn empty_assistant_turns_are_dropped() {
        let mut t = vec![
            Message::user("u"),
            Message::Assistant(AssistantMessage::default()),
        ];
        assert_eq!(repair_transcript(&mut t).len(), 1);
        assert_eq!(t, vec![Message::user("u")]);
    }

    #[test]
    fn call_ids_are_scoped_to_their_turn() {
        // The same id in two turns: each turn's result answers it.
        let mut t = vec![turn(&["a"]), result("a"), turn(&["a"]), result("a")];
        assert!(repair_transcript(&mut t).is_empty());
        // The same id twice in one turn: the second call is dropped.
        let mut t = vec![turn(&["a", "a"]), result("a")];
        let repairs = repair_transcript(&mut t);
        assert_eq!(repairs.len(), 1, "{repairs:?}");
        assert_eq!(t, vec![turn(&["a"]), result("a")]);
        // A result after the next calling turn is not taken by the earlier turn.
        let mut t = vec![turn(&["a"]), turn(&["a"]), result("a")];
        repair_transcript(&mut t);
        assert!(is_valid(&t));
        let Message::Tool(r) = &t[1] else {
            panic!("{t:?}")
        };
        assert!(r.is_error);
        assert_eq!(t[3], result("a"));
    }

    /// Random transcripts: a few ids, calls, results, user and assistant messages in any order.
    fn any_message() -> impl Strategy<Value = Message> {
        let id = prop::sample::select(vec!["a", "b", "c", "d", "e"]);
        prop_oneof![
            Just(Message::user("u")),
            Just(Message::assistant("text")),
            Just(Message::Assistant(AssistantMessage::default())),
            prop::collection::vec(id.clone(), 1..4).prop_map(|ids| turn(&ids)),
            id.prop_map(result),
        ]
    }

    proptest! {
        #[test]
        fn repaired_transcripts_are_valid_and_stable(mut t in prop::collection::vec(any_message(), 0..14)) {
            let users_before = t.iter().filter(|m| matches!(m, Message::User { .. })).count();
            let repairs = repair_transcript(&mut t);
            prop_assert!(is_valid(&t), "not valid after {repairs:?}: {t:?}");
            // Nothing but tool results and empty turns is removed or added.
            let users_after = t.iter().filter(|m| matches!(m, Message::User { .. })).count();
            prop_assert_eq!(users_before, users_after);
            // A second repair finds nothing.
            let again = t.clone();
            prop_assert!(repair_transcript(&mut t).is_empty());
            prop_assert_eq!(t, again);
        }

        #[test]
        fn valid_transcripts_are_left_alone(turns in prop::collection::vec(prop::collection::vec(0u8..3, 0..4), 0..6)) {
            let mut t = vec![Message::user("u")];
            let mut n = 0;
            for calls in turns {
                if calls.is_empty() {
                    t.push(Message::assistant("answer"));
                    t.push(Message::user("again"));
                    continue;
                }
                let ids: Vec<String> = calls.iter().map(|_| { n += 1; format!("c{n}") }).collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                t.push(turn(&refs));
                for id in &ids {
                    t.push(result(id));
                }
            }
            let before = t.clone();
            prop_assert!(repair_transcript(&mut t).is_empty());
            prop_assert_eq!(t, before);
        }
    }
}
