//! `--model <provider:model>`: which model to run.

use std::sync::Arc;
use toolloop::model::Model;
use toolloop::providers::scripted::ScriptedModel;
use toolloop::providers::test_model::TestModel;

/// What the providers need besides the model spec.
#[derive(Debug, Clone, Default)]
pub struct ProviderOptions {}

/// The providers `--model` accepts, for error messages.
pub const KNOWN: &str = "test, scripted:<file>";

/// Builds the model a spec names.
pub fn model_from_spec(spec: &str, _opts: &ProviderOptions) -> Result<Arc<dyn Model>, String> {
    let (provider, rest) = match spec.split_once(':') {
        Some((p, r)) => (p, Some(r)),
        None => (spec, None),
    };
    match (provider, rest) {
        ("test", None) => Ok(Arc::new(TestModel::new())),
        ("scripted", Some(path)) if !path.is_empty() => ScriptedModel::from_file(path)
            .map(|m| Arc::new(m) as Arc<dyn Model>)
            .map_err(|e| e.to_string()),
        _ => Err(format!(
            "unknown model `{spec}`: expected one of {KNOWN} (provider:model)"
        )),
    }
}
