//! A fixture shared by the run-log tests: a side-effecting `charge` tool that counts its
//! effects by idempotency key, and a script that charges three times over two rounds.
#![allow(dead_code)]

use async_trait::async_trait;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use toolloop::agent::Agent;
use toolloop::journal::Journal;
use toolloop::message::ToolCall;
use toolloop::model::ModelResponse;
use toolloop::providers::scripted::ScriptedModel;
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};

/// Effects by idempotency key.
pub(crate) type Effects = Arc<Mutex<HashMap<String, u32>>>;

/// Charges a card; counts each effect by its idempotency key.
pub(crate) struct Charge {
    pub effects: Effects,
    pub side_effect: SideEffect,
    pub schema: Value,
}

impl Charge {
    /// A charge tool of this kind of side effect.
    pub(crate) fn new(effects: Effects, side_effect: SideEffect) -> Self {
        Charge {
            effects,
            side_effect,
            schema: json!({"type": "object", "properties": {"amount": {"type": "integer"}}}),
        }
    }
}

#[async_trait]
impl Tool for Charge {
    fn name(&self) -> &str {
        "charge"
    }
    fn description(&self) -> &str {
        "Charges a card."
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn side_effect(&self) -> SideEffect {
        self.side_effect
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        *self
            .effects
            .lock()
            .unwrap()
            .entry(ctx.idempotency_key.clone())
            .or_default() += 1;
        Ok(ToolOutput::text(format!("charged {}", args["amount"])))
    }
}

/// Two calls, then one, then the answer; ids `a`, `b`, `c`.
pub(crate) fn script() -> Vec<ModelResponse> {
    let c = |id: &str, amount: u32| ToolCall {
        id: id.into(),
        name: "charge".into(),
        arguments: json!({"amount": amount}),
        invalid_arguments: None,
        provider_data: None,
    };
    vec![
        ModelResponse::tool_calls(vec![c("a", 1), c("b", 2)]),
        ModelResponse::tool_calls(vec![c("c", 3)]),
        ModelResponse::text("charged three times"),
    ]
}

/// An agent with the charge tool, logging to `journal`.
pub(crate) fn agent(
    model: ScriptedModel,
    journal: Arc<dyn Journal>,
    effects: Effects,
    side_effect: SideEffect,
) -> Agent {
    Agent::builder(model)
        .tool(Charge::new(effects, side_effect))
        .journal(journal)
        .build()
        .unwrap()
}
