//! Templates of prompts and `when` conditions, on minijinja: `{{ inputs.x }}`,
//! `{{ steps.ID.output }}`, `{{ steps.ID.output.FIELD }}` for a step with an output schema.
//!
//! An undefined variable is an error, at check time when it can be seen in the text (see
//! [`variables`]) and at render time otherwise: nothing renders as an empty string silently.

use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde_json::Value;
use std::collections::BTreeSet;

/// The environment every template of a workflow is rendered in: strict about undefined values,
/// no HTML escaping (prompts are plain text), trailing newlines kept.
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_keep_trailing_newline(true);
    // Bound the work a template can do (a loop over a model's output, say).
    env.set_recursion_limit(64);
    env
}

/// The variables a template reads from outside, as dotted paths (`steps.extract.output.title`):
/// attribute lookups are followed, subscripts (`steps["x"]`) end the path. Fails when the
/// template does not parse.
pub(crate) fn variables(env: &Environment<'_>, source: &str) -> Result<BTreeSet<String>, String> {
    let template = env.template_from_str(source).map_err(describe)?;
    Ok(template.undeclared_variables(true).into_iter().collect())
}

/// Like [`variables`], for an expression (`when`).
pub(crate) fn expression_variables(
    env: &Environment<'_>,
    source: &str,
) -> Result<BTreeSet<String>, String> {
    let expr = env.compile_expression(source).map_err(describe)?;
    Ok(expr.undeclared_variables(true).into_iter().collect())
}

/// Renders a template over `context`.
pub(crate) fn render(
    env: &Environment<'_>,
    source: &str,
    context: &Value,
) -> Result<String, String> {
    let template = env.template_from_str(source).map_err(describe)?;
    template.render(context).map_err(describe)
}

/// Evaluates a condition over `context`: its truth as the template language sees it (an empty
/// string, `0`, `none`, an empty list are false).
pub(crate) fn truth(env: &Environment<'_>, source: &str, context: &Value) -> Result<bool, String> {
    let expr = env.compile_expression(source).map_err(describe)?;
    let value = expr
        .eval(minijinja::Value::from_serialize(context))
        .map_err(describe)?;
    Ok(value.is_true())
}

/// The error with what minijinja says of where it happened.
fn describe(e: minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
