//! `Tool::approval_required`: a call only a person may approve is asked about even when a rule
//! or the default allows it; a rule that denies it still wins.

use async_trait::async_trait;
use futures::FutureExt;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use toolloop::agent::Agent;
use toolloop::approval::{Action, Answer, Approvals, Rule};
use toolloop::message::ToolCall;
use toolloop::model::ModelResponse;
use toolloop::outcome::CallStatus;
use toolloop::providers::scripted::ScriptedModel;
use toolloop::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// Runs anything; a call with `"outside": true` needs a person.
struct Guarded {
    schema: Value,
}

#[async_trait]
impl Tool for Guarded {
    fn name(&self) -> &str {
        "guarded"
    }
    fn description(&self) -> &str {
        "Does a thing, inside or outside its guard."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn approval_required(&self, args: &Value) -> bool {
        args["outside"] == json!(true)
    }
    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("done"))
    }
}

fn call(id: &str, outside: bool) -> ToolCall {
    let mut c = ToolCall::new("guarded", json!({"outside": outside}));
    c.id = id.into();
    c
}

async fn run(approvals: Approvals) -> (Vec<String>, Vec<CallStatus>) {
    run_answering(approvals, false).await
}

async fn run_answering(approvals: Approvals, approve: bool) -> (Vec<String>, Vec<CallStatus>) {
    let model = ScriptedModel::new(vec![
        ModelResponse::tool_calls(vec![call("in", false), call("out", true)]),
        ModelResponse::text("finished"),
    ]);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let out = Agent::builder(model)
        .tool(Guarded {
            schema: json!({"type": "object", "properties": {"outside": {"type": "boolean"}}}),
        })
        .approvals(approvals)
        .on_approval(move |p| {
            seen.lock().unwrap().push(p.call.id.clone());
            async move {
                if approve {
                    Answer::Approve
                } else {
                    Answer::Deny { reason: None }
                }
            }
            .boxed()
        })
        .build()
        .unwrap()
        .prompt("go")
        .await;
    let statuses = out.tool_calls.iter().map(|c| c.status).collect();
    let asked = asked.lock().unwrap().clone();
    (asked, statuses)
}

#[tokio::test]
async fn a_call_that_needs_a_person_is_asked_about_whatever_allows_it() {
    // The tool's own default (allow).
    let (asked, statuses) = run(Approvals::default()).await;
    assert_eq!(asked, ["out"]);
    assert_eq!(statuses, [CallStatus::Ok, CallStatus::Denied]);
    // A rule that allows every call of the tool, and an allow default.
    let allow = Rule::parse(Action::Allow, "guarded").unwrap();
    let (asked, _) = run(Approvals::default().rule(allow)).await;
    assert_eq!(asked, ["out"]);
    let (asked, _) = run(Approvals {
        rules: Vec::new(),
        default: Some(Action::Allow),
    })
    .await;
    assert_eq!(asked, ["out"]);
    // A rule that denies still wins: nobody is asked.
    let deny = Rule::parse(Action::Deny, "guarded").unwrap();
    let (asked, statuses) = run(Approvals::default().rule(deny)).await;
    assert!(asked.is_empty());
    assert_eq!(statuses, [CallStatus::Denied, CallStatus::Denied]);
}

#[tokio::test]
async fn a_call_a_person_approved_runs_its_subject_checked_again_unchanged() {
    // The subject the driver checks just before the call runs carries the same `person` mark
    // as the one the call was weighed by, so the approved call runs.
    let (asked, statuses) = run_answering(Approvals::default(), true).await;
    assert_eq!(asked, ["out"]);
    assert_eq!(statuses, [CallStatus::Ok, CallStatus::Ok]);
}
