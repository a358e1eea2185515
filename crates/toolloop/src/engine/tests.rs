//! The machine driven by hand, with no runtime and no I/O: each test hands it model responses,
//! tool results and hook answers as inputs, and checks the steps it asks for.

use super::calls::replacement_id;
use super::*;
use crate::tool::{ToolContext, tool_fn};
use crate::toolbox::Toolbox;
use serde_json::{Value, json};

/// A machine over one tool, `echo`, and a conversation of one user message.
struct Harness {
    m: Machine,
}

/// Hooks that are set but must never be called: the machine only asks for their answers.
fn hooks_never_called() -> Hooks {
    fn stop_when(_: &[RoundCall<'_>]) -> Option<String> {
        panic!("the machine called stop_when")
    }
    fn on_round_limit(_: LoopView<'_>) -> futures::future::BoxFuture<'static, RoundLimitDecision> {
        panic!("the machine called on_round_limit")
    }
    fn reminders(_: LoopView<'_>) -> Vec<String> {
        panic!("the machine called reminders")
    }
    Hooks {
        stop_when: Some(Arc::new(stop_when)),
        on_round_limit: Some(Arc::new(on_round_limit)),
        reminders: Some(Arc::new(reminders)),
    }
}

impl Harness {
    fn new(config: LoopConfig, hooks: Hooks, messages: Vec<Message>) -> Self {
        let mut toolbox = Toolbox::new();
        toolbox
            .add(tool_fn(
                "echo",
                "Echoes.",
                |a: Value, _: ToolContext| async move {
                    Ok::<_, ToolError>(ToolOutput::text(a.to_string()))
                },
            ))
            .unwrap();
        let m = Machine::new(
            Arc::new(config),
            (&hooks).into(),
            toolbox.catalog().clone(),
            messages,
        );
        Harness { m }
    }

    fn plain() -> Self {
        Harness::new(
            LoopConfig::default(),
            Hooks::default(),
            vec![Message::user("go")],
        )
    }

    fn expect_call_model(&mut self) -> (u32, Vec<String>) {
        match self.m.next_step() {
            Step::CallModel { round, reminders } => (round, reminders),
            other => panic!("expected a model call, got {other:?}"),
        }
    }

    fn respond(&mut self, response: ModelResponse) {
        self.m.handle(responded(self.m.round(), response)).unwrap();
    }

    fn expect_tools(&mut self) -> Vec<usize> {
        match self.m.next_step() {
            Step::RunTools(batches) => batches.into_iter().flat_map(|b| b.calls).collect(),
            other => panic!("expected tool calls, got {other:?}"),
        }
    }

    fn finish_tools(&mut self) {
        for i in self.expect_tools() {
            let round = self.m.round();
            self.m.handle(finished(round, i, "ok")).unwrap();
        }
    }
}

fn responded(round: u32, response: ModelResponse) -> Input {
    Input::ModelResponded {
        round,
        response,
        cost: None,
        subjects: Vec::new(),
    }
}

fn finished(round: u32, index: usize, text: &str) -> Input {
    Input::ToolFinished {
        round,
        index,
        result: Ok(ToolOutput::text(text)),
        duration_ms: 0,
        attempts: 1,
    }
}

fn echo(id: &str, n: i64) -> ToolCall {
    let mut c = ToolCall::new("echo", json!({ "n": n }));
    c.id = id.into();
    c
}

/// `on_round_limit` may grant any number of rounds: a grant past `u32::MAX` holds the limit
/// there (the run goes on) instead of overflowing into a limit below the rounds already run.
#[test]
fn a_round_limit_extension_saturates() {
    fn on_round_limit(_: LoopView<'_>) -> futures::future::BoxFuture<'static, RoundLimitDecision> {
        panic!("the machine called on_round_limit")
    }
    let hooks = Hooks {
        on_round_limit: Some(Arc::new(on_round_limit)),
        ..Hooks::default()
    };
    let config = LoopConfig {
        max_rounds: 1,
        ..LoopConfig::default()
    };
    let mut h = Harness::new(config, hooks, vec![Message::user("go")]);
    // One more round, then as many as a u32 holds: 2 + u32::MAX would overflow.
    for (round, grant, limit) in [(1, 1, 2), (2, u32::MAX, u32::MAX)] {
        assert_eq!(h.expect_call_model().0, round);
        // A new call each round (a repeated one would be answered as a duplicate).
        h.respond(ModelResponse::tool_calls(vec![echo(
            &format!("c{round}"),
            round.into(),
        )]));
        h.finish_tools();
        assert_eq!(h.m.next_step(), Step::DecideRoundLimit);
        h.m.handle(Input::RoundLimitDecided {
            decision: RoundLimitDecision::Extend(grant),
        })
        .unwrap();
        assert_eq!(h.m.state().round_limit(), limit);
    }
    assert_eq!(h.expect_call_model().0, 3, "the run goes on");
}

#[test]
fn hooks_are_steps_the_driver_answers_and_the_machine_never_calls() {
    let mut h = Harness::new(
        LoopConfig::default(),
        hooks_never_called(),
        vec![Message::user("go")],
    );
    assert_eq!(h.m.next_step(), Step::GetReminders);
    assert_eq!(h.m.view().round, 1, "the view is of the round about to run");
    h.m.handle(Input::RemindersGiven {
        round: 1,
        reminders: vec!["be brief".into()],
    })
    .unwrap();
    assert_eq!(h.expect_call_model(), (1, vec!["be brief".to_string()]));
    h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
    h.finish_tools();
    assert_eq!(h.m.next_step(), Step::CheckStop);
    let calls = h.m.round_calls();
    assert_eq!(calls.len(), 1);
    assert!(matches!(calls[0].result, Some(Ok(_))));
    h.m.handle(Input::StopChecked {
        round: 1,
        signal: Some("enough".into()),
    })
    .unwrap();
    assert_eq!(h.m.next_step(), Step::Finished);
    let out = h.m.into_outcome(0);
    assert_eq!(out.stop_reason, StopReason::TerminalSignal);
    assert_eq!(out.signal.as_deref(), Some("enough"));
}

#[test]
fn stop_when_without_a_signal_lets_the_run_go_on_and_is_asked_once() {
    let mut h = Harness::new(
        LoopConfig::default(),
        Hooks {
            reminders: None,
            ..hooks_never_called()
        },
        vec![Message::user("go")],
    );
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
    h.finish_tools();
    assert_eq!(h.m.next_step(), Step::CheckStop);
    let unsignalled = Input::StopChecked {
        round: 1,
        signal: None,
    };
    h.m.handle(unsignalled.clone()).unwrap();
    assert!(h.m.handle(unsignalled).is_err(), "asked once");
    assert_eq!(h.expect_call_model().0, 2);
}

#[test]
fn inputs_in_the_wrong_phase_are_refused_and_change_nothing() {
    let mut h = Harness::plain();
    let refused = |h: &mut Harness, input: Input| {
        let before = h.m.state().clone();
        let e = h.m.handle(input).expect_err("refused");
        assert_eq!(h.m.state(), &before, "{e}");
        e
    };
    let e = refused(&mut h, responded(1, ModelResponse::text("x")));
    assert_eq!(e.input, "model_responded");
    assert!(e.to_string().contains("ready for the next round"), "{e}");
    refused(&mut h, finished(0, 0, "x"));
    let failed = |round| Input::ModelFailed {
        round,
        message: "x".into(),
    };
    refused(&mut h, failed(1));
    let e = refused(
        &mut h,
        Input::Started {
            messages: Vec::new(),
            output_schema: None,
        },
    );
    assert!(e.to_string().contains("starts once"), "{e}");

    h.expect_call_model();
    // An answer for another round than the call's.
    let e = refused(&mut h, responded(2, ModelResponse::text("x")));
    assert!(e.to_string().contains("round 2"), "{e}");
    refused(&mut h, failed(0));
    refused(
        &mut h,
        Input::RemindersGiven {
            round: 1,
            reminders: vec![],
        },
    );
    refused(
        &mut h,
        Input::StopChecked {
            round: 1,
            signal: None,
        },
    );
    refused(
        &mut h,
        Input::RoundLimitDecided {
            decision: RoundLimitDecision::Stop,
        },
    );
    refused(&mut h, Input::ToolUnknown { round: 1, index: 0 });
    h.m.handle(Input::ModelRequested { round: 1 }).unwrap();
    h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
    refused(&mut h, responded(1, ModelResponse::text("x")));
    // The tools change only before a model call, never under a round's calls.
    let no_tools = || Input::ToolsChanged {
        round: 1,
        tools: Arc::new(Catalog::default()),
    };
    let e = refused(&mut h, no_tools());
    assert_eq!(e.input, "tools_changed");
    let e = refused(&mut h, finished(1, 5, "x"));
    assert!(e.to_string().contains("no call 5"), "{e}");
    let e = refused(&mut h, finished(2, 0, "x"));
    assert!(e.to_string().contains("round 2"), "{e}");
    let e = refused(
        &mut h,
        Input::ToolStarted {
            round: 1,
            index: 0,
            call_id: "b".into(),
        },
    );
    assert!(e.to_string().contains("not `b`"), "{e}");
    h.m.handle(Input::ToolStarted {
        round: 1,
        index: 0,
        call_id: "a".into(),
    })
    .unwrap();
    assert_eq!(h.m.in_flight(), [0]);
    h.m.handle(finished(1, 0, "x")).unwrap();
    assert!(h.m.in_flight().is_empty());
    let e = refused(&mut h, finished(1, 0, "y"));
    assert!(e.to_string().contains("already has its result"), "{e}");
    // No stop_when hook: nothing to answer.
    refused(
        &mut h,
        Input::StopChecked {
            round: 1,
            signal: None,
        },
    );
    h.expect_call_model();
    // While the model call waits to be made, it takes the new tools (for its round).
    let e = refused(
        &mut h,
        Input::ToolsChanged {
            round: 3,
            tools: Arc::new(Catalog::default()),
        },
    );
    assert!(e.to_string().contains("round 3"), "{e}");
    h.m.handle(Input::ToolsChanged {
        round: 2,
        tools: Arc::new(Catalog::default()),
    })
    .unwrap();
    assert!(h.m.catalog().is_empty());
    h.respond(ModelResponse::text("done"));
    refused(&mut h, responded(2, ModelResponse::text("x")));
    let e = refused(&mut h, no_tools());
    assert_eq!(e.input, "tools_changed");
    assert_eq!(h.m.next_step(), Step::Finished);
    // The end of the log changes nothing.
    h.m.handle(Input::Finished).unwrap();
}

/// A tool whose calls are asked about by default, and whose subject is its command.
fn shell_catalog() -> Arc<Catalog> {
    Arc::new(
        Catalog::new(vec![CatalogEntry {
            name: "shell".into(),
            description: "Runs a command.".into(),
            parameters: json!({"type": "object"}),
            side_effect: crate::tool::SideEffect::SideEffecting,
            parallel_safe: false,
            terminal: false,
            default_approval: Some(Action::Ask),
        }])
        .unwrap(),
    )
}

/// A catalog of one tool, `shell`, whose own default approval is `default`.
fn shell_catalog_defaulting(default: Action) -> Arc<Catalog> {
    let mut entry = shell_catalog().entries()[0].clone();
    entry.default_approval = Some(default);
    Arc::new(Catalog::new(vec![entry]).unwrap())
}

#[test]
fn calls_are_weighed_when_a_rule_a_default_or_their_tool_asks_and_only_then() {
    use crate::approval::{Approvals, Rule};
    let ls = || {
        let mut c = ToolCall::new("shell", json!({ "command": "ls" }));
        c.id = "l".into();
        c
    };
    let deny = Verdict::Deny {
        rule: "the tool `shell` is denied by default".into(),
    };
    // (the policy, the tool's own default, whether the policy weighs the call, the verdict on
    // `ls` when it is not allowed by default)
    let cases = [
        (Approvals::default(), Action::Allow, false, None),
        (Approvals::default(), Action::Ask, true, Some(Verdict::Ask)),
        (Approvals::default(), Action::Deny, true, Some(deny.clone())),
        (
            Approvals {
                default: Some(Action::Allow),
                ..Approvals::default()
            },
            Action::Ask,
            false,
            None,
        ),
        (
            Approvals {
                default: Some(Action::Ask),
                ..Approvals::default()
            },
            Action::Allow,
            true,
            Some(Verdict::Ask),
        ),
        (
            Approvals::default().rule(Rule::parse(Action::Allow, "shell:git *").unwrap()),
            Action::Allow,
            true,
            None,
        ),
    ];
    for (approvals, default, weighed, verdict) in cases {
        let case = format!("{approvals:?}, the tool's default {default:?}");
        let machine = || {
            let config = LoopConfig {
                approvals: approvals.clone(),
                ..LoopConfig::default()
            };
            let mut m = Machine::new(
                Arc::new(config),
                HookFlags::default(),
                shell_catalog_defaulting(default),
                vec![Message::user("go")],
            );
            assert!(matches!(m.next_step(), Step::CallModel { round: 1, .. }));
            m
        };
        let response = ModelResponse::tool_calls(vec![ls()]);
        // Without its subject, a weighed call's response is refused; another runs at once.
        let mut m = machine();
        match (m.handle(responded(1, response.clone())), weighed) {
            (Err(e), true) => assert!(e.to_string().contains("approval subject"), "{case}: {e}"),
            (Ok(()), false) => assert!(
                matches!(m.next_step(), Step::RunTools(_)),
                "{case}: the call runs unasked"
            ),
            (r, _) => panic!("{case}: {r:?}"),
        }
        // With it, a weighed call gets the policy's verdict (the tool's default here, or a
        // person's approval for a subject only a person approves).
        for person in [false, true] {
            let subject: Subject = "ls".into();
            let subject = if person {
                subject.needs_person()
            } else {
                subject
            };
            let mut m = machine();
            m.handle(Input::ModelResponded {
                round: 1,
                response: response.clone(),
                cost: None,
                subjects: vec![Some(subject)],
            })
            .unwrap();
            // Only a person approves a call whose subject says so, unless a rule denies it.
            let verdict = match &verdict {
                Some(Verdict::Deny { .. }) => verdict.clone(),
                _ if person => Some(Verdict::Ask),
                _ => verdict.clone(),
            };
            match m.next_step() {
                Step::Approve(requests) => {
                    assert_eq!(
                        Some(&requests[0].verdict),
                        verdict.as_ref(),
                        "{case}, {person}"
                    )
                }
                Step::RunTools(_) => assert_eq!(verdict, None, "{case}, person {person}"),
                other => panic!("{case}: {other:?}"),
            }
        }
    }
}

#[test]
fn approval_subjects_come_with_the_response_and_rules_judge_them() {
    let config = LoopConfig {
        approvals: crate::approval::Approvals::default()
            .rule(crate::approval::Rule::parse(Action::Allow, "shell:git *").unwrap())
            .rule(crate::approval::Rule::parse(Action::Deny, "shell:rm *").unwrap()),
        ..LoopConfig::default()
    };
    let mut m = Machine::new(
        Arc::new(config),
        HookFlags::default(),
        shell_catalog(),
        vec![Message::user("go")],
    );
    let call = |id: &str, command: &str| {
        let mut c = ToolCall::new("shell", json!({ "command": command }));
        c.id = id.into();
        c
    };
    let response = ModelResponse::tool_calls(vec![
        call("g", "git status"),
        call("r", "rm -rf /"),
        call("l", "ls"),
    ]);
    assert!(matches!(m.next_step(), Step::CallModel { round: 1, .. }));
    // Without the subjects the policy weighs, the response is refused.
    let e = m.handle(responded(1, response.clone())).unwrap_err();
    assert!(e.to_string().contains("approval subject"), "{e}");
    let e = m
        .handle(Input::ModelResponded {
            round: 1,
            response: response.clone(),
            cost: None,
            subjects: vec![Some("git status".into()), Some("rm -rf /".into())],
        })
        .unwrap_err();
    assert!(e.to_string().contains("call 2"), "{e}");
    m.handle(Input::ModelResponded {
        round: 1,
        response,
        cost: None,
        subjects: ["git status", "rm -rf /", "ls"]
            .map(|s| Some(s.into()))
            .to_vec(),
    })
    .unwrap();
    let Step::Approve(requests) = m.next_step() else {
        panic!("the calls wait for their approval")
    };
    let verdicts: Vec<(&str, &Verdict)> = requests
        .iter()
        .map(|r| (r.pending.subject.as_str(), &r.verdict))
        .collect();
    assert_eq!(
        verdicts,
        [
            (
                "git status",
                &Verdict::Allow {
                    rule: Some("allow shell:git *".into())
                }
            ),
            (
                "rm -rf /",
                &Verdict::Deny {
                    rule: "deny shell:rm *".into()
                }
            ),
            ("ls", &Verdict::Ask),
        ]
    );
    // The subjects are part of the state: a saved state asks the same.
    let mut resumed = Machine::resume(
        Arc::new(m.config().clone()),
        HookFlags::default(),
        shell_catalog(),
        m.snapshot(),
    );
    assert_eq!(resumed.next_step(), Step::Approve(requests));
}

#[test]
fn rules_judge_every_spelling_the_input_carries_and_the_machine_keeps_it() {
    let config = LoopConfig {
        approvals: crate::approval::Approvals::default()
            .rule(crate::approval::Rule::parse(Action::Allow, "shell:*").unwrap())
            .rule(crate::approval::Rule::parse(Action::Deny, "shell:rm *").unwrap()),
        ..LoopConfig::default()
    };
    let mut m = Machine::new(
        Arc::new(config),
        HookFlags::default(),
        shell_catalog(),
        vec![Message::user("go")],
    );
    let call = |id: &str| {
        let mut c = ToolCall::new("shell", json!({ "id": id }));
        c.id = id.into();
        c
    };
    assert!(matches!(m.next_step(), Step::CallModel { round: 1, .. }));
    // `/bin/rm` is `rm` by another spelling; a shell script cannot be told for sure.
    let launched = Subject::new("/bin/rm -rf x").alias("rm -rf x");
    let script = Subject::new("sh -c 'echo hi'").uncertain("a shell runs it");
    let plain = Subject::new("ls");
    let input = Input::ModelResponded {
        round: 1,
        response: ModelResponse::tool_calls(vec![call("a"), call("b"), call("c")]),
        cost: None,
        subjects: vec![
            Some(launched.clone()),
            Some(script.clone()),
            Some(plain.clone()),
        ],
    };
    // The input reads back as it was written, and a subject of one spelling is a string.
    let value = serde_json::to_value(&input).unwrap();
    assert_eq!(value["subjects"][2], json!("ls"));
    assert_eq!(serde_json::from_value::<Input>(value).unwrap(), input);
    m.handle(input).unwrap();
    let Step::Approve(requests) = m.next_step() else {
        panic!("the calls wait for their approval")
    };
    let verdicts: Vec<&Verdict> = requests.iter().map(|r| &r.verdict).collect();
    assert_eq!(
        verdicts,
        [
            &Verdict::Deny {
                rule: "deny shell:rm *".into()
            },
            &Verdict::Deny {
                rule: "deny shell:rm * (which applies because a shell runs it)".into()
            },
            &Verdict::Allow {
                rule: Some("allow shell:*".into())
            },
        ]
    );
    // The machine keeps what each call was weighed by, for the driver's check before it runs.
    assert_eq!(m.weighed_subject(0), Some(&launched));
    assert_eq!(m.weighed_subject(1), Some(&script));
    assert_eq!(m.weighed_subject(2), Some(&plain));
    assert_eq!(m.weighed_subject(3), None);
}

#[test]
fn call_ids_are_made_unique_on_arrival() {
    // An id from the conversation the run starts with, an id repeated in the reply, and no
    // id at all.
    let earlier = Message::Assistant(AssistantMessage {
        text: None,
        tool_calls: vec![echo("x", 0)],
        parts: vec![],
    });
    let result = Message::Tool(ToolResult {
        call_id: "x".into(),
        name: "echo".into(),
        content: "{}".into(),
        is_error: false,
        images: Vec::new(),
    });
    let mut h = Harness::new(
        LoopConfig::default(),
        Hooks::default(),
        vec![Message::user("go"), earlier, result],
    );
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![
        echo("x", 1),
        echo("y", 2),
        echo("y", 3),
        echo("", 4),
        echo("x_2", 5),
    ]));
    let ids: Vec<String> = (0..5)
        .map(|i| h.m.round_call(i).unwrap().id.clone())
        .collect();
    // `x_2` is the reply's own id, so the first `x` gets the next free one.
    assert_eq!(ids, ["x_3", "y", "y_2", "call_2", "x_2"]);
    let replaced: Vec<(String, String)> =
        h.m.take_events()
            .filter_map(|e| match e {
                Event::CallIdReplaced { original, id, .. } => Some((original, id)),
                _ => None,
            })
            .collect();
    assert_eq!(replaced.len(), 3, "{replaced:?}");
    h.finish_tools();
    h.expect_call_model();
    h.respond(ModelResponse::text("done"));
    let out = h.m.into_outcome(0);
    assert!(crate::transcript::check_transcript(&out.messages).is_empty());
}

#[test]
fn replacement_ids_keep_their_shape() {
    assert_eq!(replacement_id("toolu_01A", 2), "toolu_01A_2");
    assert_eq!(replacement_id("aB3dE5gH1", 2), "aB3dE5gH2");
    assert_eq!(replacement_id("aB3dE5gH1", 40), "aB3dE5g14");
    assert_eq!(replacement_id("", 3), "call_3");
    assert_eq!(replacement_id(&"z".repeat(1000), 2).len(), 64);
}

fn city_schema() -> OutputSchema {
    OutputSchema::new(
        "City",
        json!({"type": "object", "properties": {"name": {"type": "string"}},
               "required": ["name"]}),
    )
}

#[test]
fn a_final_answer_is_validated_against_the_output_schema() {
    let mut h = Harness::plain();
    h.m.set_output_schema(Some(city_schema())).unwrap();
    h.expect_call_model();
    // Tool calls still work while a schema is set.
    h.respond(ModelResponse::tool_calls(vec![echo("a", 1)]));
    h.finish_tools();
    h.expect_call_model();
    h.respond(ModelResponse::text("```json\n{\"name\": \"Lyon\"}\n```"));
    assert_eq!(h.m.next_step(), Step::Finished);
    let out = h.m.into_outcome(0);
    assert_eq!(out.stop_reason, StopReason::Answered);
    assert_eq!(out.output, Some(json!({"name": "Lyon"})));
    #[derive(serde::Deserialize)]
    struct City {
        name: String,
    }
    assert_eq!(out.parse::<City>().unwrap().name, "Lyon");
}

#[test]
fn an_invalid_answer_goes_back_with_the_errors_and_a_corrected_one_is_taken() {
    let mut h = Harness::plain();
    h.m.set_output_schema(Some(city_schema())).unwrap();
    h.expect_call_model();
    h.respond(ModelResponse::text("{\"name\": 7}"));
    let invalid: Vec<String> =
        h.m.take_events()
            .filter_map(|e| match e {
                Event::InvalidOutput { errors, .. } => Some(errors),
                _ => None,
            })
            .collect();
    assert_eq!(invalid.len(), 1);
    assert!(invalid[0].contains("/name"), "{invalid:?}");
    // The answer stays in the transcript, followed by the errors for the model.
    match h.m.messages().last() {
        Some(Message::User { content, .. }) => {
            assert!(
                content.contains("`City`") && content.contains("/name"),
                "{content}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.expect_call_model().0, 2);
    h.respond(ModelResponse::text("{\"name\": \"Lyon\"}"));
    let out = h.m.into_outcome(0);
    assert!(out.success);
    assert_eq!(out.output, Some(json!({"name": "Lyon"})));
    assert_eq!(out.text.as_deref(), Some("{\"name\": \"Lyon\"}"));
}

#[test]
fn answers_that_keep_failing_the_schema_stop_the_run_over_the_budget() {
    let mut h = Harness::new(
        LoopConfig {
            invalid_calls: InvalidCallPolicy::Feedback { budget: 1 },
            ..LoopConfig::default()
        },
        Hooks::default(),
        vec![Message::user("go")],
    );
    h.m.set_output_schema(Some(city_schema())).unwrap();
    h.expect_call_model();
    h.respond(ModelResponse::text("Lyon"));
    h.expect_call_model();
    h.respond(ModelResponse::text("{}"));
    assert_eq!(h.m.next_step(), Step::Finished);
    let out = h.m.into_outcome(0);
    assert_eq!(out.stop_reason, StopReason::TooManyInvalidCalls);
    let error = out.error.clone().unwrap();
    assert_eq!(error.code, ErrorCode::InvalidOutput);
    assert!(
        error.message.contains("2 invalid") && error.message.contains("required"),
        "{}",
        error.message
    );
    assert_eq!(out.output, None);
    assert!(out.parse::<Value>().is_err());
    // Both answers and both errors are in the transcript.
    assert_eq!(out.messages.len(), 5, "{:?}", out.messages);
    assert_eq!(out.text.as_deref(), Some("{}"));
}

#[test]
fn the_strict_policy_stops_at_the_first_invalid_answer() {
    let mut h = Harness::new(
        LoopConfig {
            invalid_calls: InvalidCallPolicy::Strict,
            ..LoopConfig::default()
        },
        Hooks::default(),
        vec![Message::user("go")],
    );
    h.m.set_output_schema(Some(city_schema())).unwrap();
    h.expect_call_model();
    h.respond(ModelResponse::text("not json"));
    let out = h.m.into_outcome(0);
    assert_eq!(out.error.unwrap().code, ErrorCode::InvalidOutput);
}

#[test]
fn a_schema_that_does_not_compile_is_refused() {
    let mut h = Harness::plain();
    let bad = OutputSchema::new("bad", json!({"type": 12}));
    assert!(h.m.set_output_schema(Some(bad)).is_err());
    assert!(h.m.output_schema().is_none());
    // Without a schema any text is the answer.
    h.expect_call_model();
    h.respond(ModelResponse::text("anything"));
    let out = h.m.into_outcome(0);
    assert!(out.success && out.output.is_none());
}

#[test]
fn a_mixed_round_runs_parallel_safe_calls_together_and_others_alone() {
    let mut h = Harness::plain();
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![echo("a", 1), echo("b", 2)]));
    // `echo` is not marked parallel-safe: one batch per call, in the model's order.
    match h.m.next_step() {
        Step::RunTools(batches) => {
            assert_eq!(batches.len(), 2);
            assert!(batches.iter().all(|b| !b.parallel && b.calls.len() == 1));
            assert_eq!(batches[0].calls, [0]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_snapshot_is_versioned_and_resumes_where_the_machine_was() {
    let mut h = Harness::new(
        LoopConfig::default(),
        Hooks::default(),
        vec![Message::user("hi")],
    );
    let Step::CallModel { round, .. } = h.m.next_step() else {
        panic!("expected a model call")
    };
    assert_eq!(round, 1);
    let saved = serde_json::to_value(h.m.snapshot()).unwrap();
    assert_eq!(saved["version"], json!(SNAPSHOT_VERSION));
    assert_eq!(saved["state"]["round"], json!(1));
    let snapshot: Snapshot = serde_json::from_value(saved.clone()).unwrap();
    let resumed = Machine::resume(
        Arc::new(h.m.config().clone()),
        HookFlags::default(),
        h.m.catalog().clone(),
        snapshot,
    );
    assert_eq!(resumed.state(), h.m.state());
    assert_eq!(resumed.state().round(), 1);

    // One written by a later release is refused, naming both versions.
    let mut later = saved;
    later["version"] = json!(SNAPSHOT_VERSION + 1);
    let e = serde_json::from_value::<Snapshot>(later)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("version {}", SNAPSHOT_VERSION + 1))
            && e.contains(&format!("up to {SNAPSHOT_VERSION}")),
        "{e}"
    );
    // A bare state (no version) is not a snapshot.
    let bare = serde_json::to_value(h.m.state()).unwrap();
    assert!(serde_json::from_value::<Snapshot>(bare).is_err());
}

/// The earlier rounds' calls are compared through their fingerprints: a call the same as one of
/// them (its keys in another order, a zero of the other sign) is a duplicate, in a machine
/// resumed from a snapshot too; a call that differs in one value runs.
#[test]
fn duplicates_of_earlier_rounds_are_found_after_a_resume() {
    let call = |id: &str, args: Value| {
        let mut c = ToolCall::new("echo", args);
        c.id = id.into();
        c
    };
    let mut h = Harness::plain();
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![call(
        "c1",
        json!({"a": 1, "z": 0.0, "list": [1, "x", {"k": true}]}),
    )]));
    h.finish_tools();
    let mut h = h.resumed();
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![
        call(
            "c2",
            json!({"list": [1, "x", {"k": true}], "z": -0.0, "a": 1}),
        ),
        call(
            "c3",
            json!({"a": 1, "z": 0.0, "list": [1, "x", {"k": false}]}),
        ),
    ]));
    assert_eq!(h.expect_tools(), vec![1]);
    h.m.handle(finished(2, 1, "ok")).unwrap();
    // Round 2's executed call was indexed with the fingerprint taken at its triage. Round 3's
    // machine is resumed before its calls finish, so round 4's triage indexes them itself.
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![
        call(
            "c4",
            json!({"list": [1, "x", {"k": false}], "a": 1, "z": 0}),
        ),
        call(
            "c5",
            json!({"a": 1, "z": 0, "list": [1, "x", {"k": false}]}),
        ),
        call("c6", json!({"new": true})),
    ]));
    let mut h = h.resumed();
    // `0` is not `0.0`: c4 differs from c3 and runs; c5 repeats c4; c6 is new.
    assert_eq!(h.expect_tools(), vec![0, 2]);
    h.m.handle(finished(3, 0, "ok")).unwrap();
    h.m.handle(finished(3, 2, "ok")).unwrap();
    h.expect_call_model();
    h.respond(ModelResponse::tool_calls(vec![
        call("c7", json!({"new": true})),
        call(
            "c8",
            json!({"a": 1, "z": 0.0, "list": [1, "x", {"k": true}]}),
        ),
    ]));
    // c7 repeats c6; c8 repeats c1, which is outside the window: the three latest executed
    // calls are c6, c4 and c3 (c7 is not run, so it does not count).
    assert_eq!(h.expect_tools(), vec![1]);
    h.m.handle(finished(4, 1, "ok")).unwrap();
    h.expect_call_model();
    let statuses: Vec<CallStatus> = h.m.state().calls().iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            CallStatus::Ok,
            CallStatus::Duplicate,
            CallStatus::Ok,
            CallStatus::Ok,
            CallStatus::Duplicate,
            CallStatus::Ok,
            CallStatus::Duplicate,
            CallStatus::Ok,
        ]
    );
}

impl Harness {
    /// A machine resumed from this one's snapshot, with the same configuration and catalog.
    fn resumed(self) -> Harness {
        Harness {
            m: Machine::resume(
                Arc::new(self.m.config().clone()),
                HookFlags::default(),
                self.m.catalog().clone(),
                self.m.snapshot(),
            ),
        }
    }
}

/// Random JSON values with the shapes that make equal values look different: numbers written
/// as integers, floats and signed zeros, and objects whose keys come in any order.
fn json_values() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(json!(null)),
        any::<bool>().prop_map(Value::from),
        prop_oneof![Just(0i64), Just(1), Just(-1), any::<i64>()].prop_map(Value::from),
        prop_oneof![Just(0.0f64), Just(-0.0), Just(1.0), Just(0.5), -1e6..1e6f64]
            .prop_map(|f| json!(f)),
        "[a-c]{0,2}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(("[a-d]", inner), 0..4)
                .prop_map(|entries| { Value::Object(entries.into_iter().collect()) }),
        ]
    })
}

/// An equal value written differently: every object's keys in reverse order, and every
/// floating-point zero with the other sign.
fn written_differently(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(written_differently).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .rev()
                .map(|(k, v)| (k.clone(), written_differently(v)))
                .collect(),
        ),
        Value::Number(n) if n.is_f64() && n.as_f64() == Some(0.0) => {
            json!(-n.as_f64().unwrap_or_default())
        }
        other => other.clone(),
    }
}

proptest::proptest! {
    /// The duplicate check only compares calls whose fingerprints match, so calls it finds the
    /// same must never have different fingerprints: same name and [`ToolCall::same_arguments`]
    /// imply the same [`super::calls::call_print`], for any two values, and for a value and
    /// itself written differently (keys reordered, zeros of the other sign).
    #[test]
    fn calls_the_duplicate_check_finds_the_same_have_one_fingerprint(
        a in json_values(),
        b in json_values(),
    ) {
        use super::calls::call_print;
        let call = |args: Value| ToolCall::new("echo", args);
        let (x, y) = (call(a.clone()), call(b));
        if x.same_arguments(&y) {
            proptest::prop_assert_eq!(call_print(&x), call_print(&y));
        }
        let reordered = call(written_differently(&a));
        proptest::prop_assert!(x.same_arguments(&reordered));
        proptest::prop_assert_eq!(call_print(&x), call_print(&reordered));
    }
}
