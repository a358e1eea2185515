//! A step's output: its final text, or, for a step with an `output_schema`, the JSON value of
//! its answer, validated by the loop (see [`toolloop::output`]): an answer that does not match
//! goes back to the model with the errors, within the run's budget of invalid answers.

use crate::definition::Step;
use serde_json::Value;
use toolloop::agent::AgentBuilder;
use toolloop::outcome::Outcome;
use toolloop::output::OutputSchema;

fn schema(step: &Step, schema: &Value) -> OutputSchema {
    OutputSchema::new(step.id.clone(), schema.clone())
}

/// Checks a step's output schema before anything runs.
pub(crate) fn check_schema(step: &Step, value: &Value) -> Result<(), String> {
    schema(step, value)
        .compile()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Sets the step's output schema on its agent.
pub(crate) fn configure(builder: AgentBuilder, step: &Step) -> AgentBuilder {
    match &step.output_schema {
        Some(s) => builder.output_schema(schema(step, s)),
        None => builder,
    }
}

/// The step's output from its run's outcome.
pub(crate) fn read(step: &Step, outcome: &Outcome) -> Result<Value, String> {
    match (&step.output_schema, &outcome.output) {
        (None, _) => Ok(Value::String(outcome.text.clone().unwrap_or_default())),
        (Some(_), Some(v)) => Ok(v.clone()),
        (Some(_), None) => Err("the run gave no output that matches the output_schema".into()),
    }
}
