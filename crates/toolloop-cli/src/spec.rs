//! `--model <provider:model>`: which model to run, and the provider flags.

use crate::CliError;
use crate::args::{ProviderArgs, ToolProtocol};
use crate::cx::Cx;
use serde_json::Value;
use std::sync::Arc;
use toolloop::model::Model;
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::providers::test_model::{TestAnswer, TestModel};
use toolloop::ptk::{Auto, Prompted};

/// Sets up a provider's transport from the command (`--debug-requests`, the cassette of
/// `--record`, `--connect-retry`), and notes its key, so that answers repeating it are redacted
/// ([`crate::secrets::note_key`]).
fn connect(
    cx: &Cx,
    args: &ProviderArgs,
    transport: &mut toolloop::transport::http::HttpTransport,
    api_key: Option<&str>,
) {
    transport.debug_log = cx.debug_log.clone();
    transport.cassette = cx.record.cassette();
    if let Some(wait) = args.connect_retry {
        transport.connect_retry = wait;
    }
    if let Some(key) = api_key {
        crate::secrets::note_key(cx, key);
    }
}

/// The providers `--model` accepts, for error messages.
pub(crate) const KNOWN: &str = "test, scripted:<file>, openai:<model>, openai-responses:<model>, \
                         anthropic:<model>, gemini:<model>, replay:<cassette>";

/// What the command sets on an HTTP adapter's configuration once it is read: the flags'
/// `extra`, then the adapter's own checks, then the connection (see [`connect`]).
trait AdapterConfig {
    /// The `extra` request fields, the transport and the key.
    fn parts(
        &mut self,
    ) -> (
        &mut Option<Value>,
        &mut toolloop::transport::http::HttpTransport,
        Option<&str>,
    );
    /// The adapter's checks (`validate` of its configuration).
    fn check(&self) -> Result<(), toolloop::model::ModelError>;
}

macro_rules! adapter_config {
    ($($config:ty),*) => {$(
        impl AdapterConfig for $config {
            fn parts(
                &mut self,
            ) -> (
                &mut Option<Value>,
                &mut toolloop::transport::http::HttpTransport,
                Option<&str>,
            ) {
                (&mut self.extra, &mut self.transport, self.api_key.as_deref())
            }
            fn check(&self) -> Result<(), toolloop::model::ModelError> {
                self.validate()
            }
        }
    )*};
}
adapter_config!(OpenAiConfig, ResponsesConfig, AnthropicConfig, GeminiConfig);

/// How the flags reach one HTTP adapter: its name in messages, the request fields it writes
/// itself, and the variables of its key (which `--api-key-env` replaces; with none, the
/// adapter's configuration reads `--api-key-env` itself) and of its base URL.
struct Adapter<'a> {
    name: &'a str,
    owned: &'a [&'a str],
    key_vars: &'a [&'a str],
    url_vars: &'a [&'a str],
}

/// `openai:<model>`.
const OPENAI: Adapter<'static> = Adapter {
    name: "OpenAI",
    owned: toolloop::providers::openai::OWNED_FIELDS,
    key_vars: &[],
    url_vars: &["OPENAI_BASE_URL"],
};

/// `openai-responses:<model>`.
const OPENAI_RESPONSES: Adapter<'static> = Adapter {
    name: "OpenAI Responses",
    owned: toolloop::providers::openai_responses::OWNED_FIELDS,
    key_vars: &[],
    url_vars: &["OPENAI_BASE_URL"],
};

/// `anthropic:<model>`.
const ANTHROPIC: Adapter<'static> = Adapter {
    name: "Anthropic",
    owned: toolloop::providers::anthropic::OWNED_FIELDS,
    key_vars: &["ANTHROPIC_API_KEY"],
    url_vars: &["ANTHROPIC_BASE_URL"],
};

/// `gemini:<model>`.
const GEMINI: Adapter<'static> = Adapter {
    name: "Gemini",
    owned: toolloop::providers::gemini::OWNED_FIELDS,
    key_vars: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
    url_vars: &["GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"],
};

/// An HTTP adapter's configuration as the flags give it: the base URL (`--base-url`, else the
/// adapter's variable) and `--extra` checked first, then the configuration `read` through the
/// variables (see [`lookup`]), given the flags' `extra`, checked by the adapter, and connected.
fn configured<C: AdapterConfig>(
    cx: &Cx,
    args: &ProviderArgs,
    adapter: &Adapter<'_>,
    read: impl FnOnce(&dyn Fn(&str) -> Option<String>) -> Result<C, toolloop::model::ModelError>,
) -> Result<C, CliError> {
    if !adapter.key_vars.is_empty() {
        named_key_is_set(args)?;
    }
    check_base_url(args, adapter.url_vars)?;
    check_extra(args, adapter.name, adapter.owned)?;
    let mut config =
        read(&lookup(args, adapter.key_vars, adapter.url_vars)).map_err(CliError::ModelSettings)?;
    *config.parts().0 = args.extra.as_deref().cloned();
    config.check().map_err(CliError::ModelSettings)?;
    let (_, transport, key) = config.parts();
    connect(cx, args, transport, key);
    Ok(config)
}

/// Looks up a variable, honouring `--api-key-env` and `--base-url`.
fn lookup<'a>(
    args: &'a ProviderArgs,
    key_vars: &'a [&'a str],
    url_vars: &'a [&'a str],
) -> impl Fn(&str) -> Option<String> + 'a {
    move |name: &str| {
        if url_vars.contains(&name)
            && let Some(url) = &args.base_url
        {
            return Some(url.clone());
        }
        if key_vars.contains(&name)
            && let Some(var) = &args.api_key_env
        {
            return crate::secrets::var(var);
        }
        crate::secrets::var(name)
    }
}

fn named_key_is_set(args: &ProviderArgs) -> Result<(), CliError> {
    if let Some(var) = &args.api_key_env
        && crate::secrets::var(var).is_none_or(|v| v.trim().is_empty())
    {
        return Err(CliError::usage(format!(
            "--api-key-env {var}: the variable is not set (or is empty)"
        )));
    }
    Ok(())
}

/// Checks the base URL before anything is sent, naming where it came from: `--base-url`, else
/// the first of `url_vars` that is set.
fn check_base_url(args: &ProviderArgs, url_vars: &[&str]) -> Result<(), CliError> {
    let (source, url) = match &args.base_url {
        Some(url) => ("--base-url".to_string(), url.clone()),
        None => match url_vars.iter().find_map(|var| {
            crate::secrets::var(var)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (var.to_string(), v))
        }) {
            Some(found) => found,
            None => return Ok(()),
        },
    };
    toolloop::providers::check_base_url(&url).map_err(|e| CliError::invalid(source, e))
}

/// Refuses an `--extra` that sets a request field the provider's adapter writes itself
/// (`owned`, the adapter's list).
fn check_extra(args: &ProviderArgs, provider: &str, owned: &[&str]) -> Result<(), CliError> {
    let Some(Value::Object(fields)) = args.extra.as_deref() else {
        return Ok(());
    };
    match fields.keys().find(|k| owned.contains(&k.as_str())) {
        None => Ok(()),
        Some(name) => Err(CliError::usage(format!(
            "--extra may not set `{name}`: the {provider} adapter writes it itself (the \
             conversation, the tools, the model and streaming belong to the run); the fields it \
             owns are {}",
            owned.join(", ")
        ))),
    }
}

/// Opens where every model request and response is logged (`--debug-requests`, `DEBUG_LLM=1`):
/// a file, or stderr for `-`.
pub(crate) fn debug_log(
    target: &str,
) -> Result<Arc<toolloop::transport::request_log::RequestLog>, CliError> {
    use toolloop::transport::request_log::RequestLog;
    let log = if target == "-" {
        RequestLog::stderr()
    } else {
        RequestLog::create(std::path::Path::new(target))
            .map_err(|e| CliError::invalid(format!("--debug-requests {target}"), e))?
    };
    Ok(Arc::new(log))
}

/// Builds the model a spec names, with the tool protocol asked for.
pub(crate) fn model_from_args(cx: &Cx, args: &ProviderArgs) -> Result<Arc<dyn Model>, CliError> {
    // `replay:FILE`: the recorded provider, answered from the cassette.
    let args = crate::record::resolve(cx, args)?;
    let args = args.as_ref();
    let model = provider_model(cx, args)?;
    Ok(match args.tool_protocol {
        ToolProtocol::Native => model,
        ToolProtocol::Prompt => {
            Arc::new(Prompted::new(model, args.dialect).implicit_think(args.implicit_think))
        }
        ToolProtocol::Auto => {
            Arc::new(Auto::new(model, args.dialect).implicit_think(args.implicit_think))
        }
    })
}

/// The model `name` names (`provider:model`, or a model of the configuration file), with the
/// other provider flags of `args`; `None`: the model `args` names.
pub(crate) fn model_from_args_named(
    cx: &Cx,
    args: &ProviderArgs,
    name: Option<&str>,
) -> Result<Arc<dyn Model>, CliError> {
    let Some(name) = name else {
        return model_from_args(cx, args);
    };
    let mut args = args.clone();
    args.model = name.to_string();
    cx.config.resolve_model(&mut args)?;
    model_from_args(cx, &args)
}

/// The provider's model, as the spec names it. Its key is noted, so that answers repeating it
/// are redacted ([`crate::secrets::note_key`]), and the variable it came from is kept from
/// child processes (a run resumed from the store names it only now).
fn provider_model(cx: &Cx, args: &ProviderArgs) -> Result<Arc<dyn Model>, CliError> {
    if let Some(var) = &args.api_key_env {
        toolloop::redact::mark_secret_env_name(var);
    }
    let spec = args.model.trim();
    let (provider, rest) = match spec.split_once(':') {
        Some((p, r)) => (p, Some(r)),
        None => (spec, None),
    };
    let need_name = |rest: Option<&str>| -> Result<String, CliError> {
        match rest.map(str::trim) {
            Some(m) if !m.is_empty() => Ok(m.to_string()),
            _ => Err(CliError::usage(format!(
                "`{spec}` names no model: expected {provider}:<model>"
            ))),
        }
    };
    match provider {
        "test" if rest.is_none() => Ok(Arc::new(TestModel::new().answer(TestAnswer::Summary))),
        "scripted" => {
            let path = need_name(rest)?;
            ScriptedModel::from_file(path)
                .map(|m| Arc::new(m) as Arc<dyn Model>)
                .map_err(|e| CliError::invalid("--model", e))
        }
        "openai" => {
            let model = need_name(rest)?;
            let config = configured(cx, args, &OPENAI, |vars| {
                OpenAiConfig::from_vars(&model, args.api_key_env.as_deref(), vars)
            })?;
            // A compatible server may drop the catalog without a word; OpenAI's own API does not.
            let compatible = !config.is_openai();
            let model: Arc<dyn Model> = Arc::new(OpenAiModel::new(config));
            Ok(match args.tool_protocol {
                ToolProtocol::Native if compatible => {
                    Arc::new(crate::catalog_check::CatalogCheck::new(model))
                }
                _ => model,
            })
        }
        "openai-responses" => {
            let model = need_name(rest)?;
            let config = configured(cx, args, &OPENAI_RESPONSES, |vars| {
                ResponsesConfig::from_vars(&model, args.api_key_env.as_deref(), vars)
            })?;
            Ok(Arc::new(ResponsesModel::new(config)))
        }
        "anthropic" => {
            let model = need_name(rest)?;
            let config = configured(cx, args, &ANTHROPIC, |vars| {
                AnthropicConfig::from_vars(model, vars)
            })?;
            Ok(Arc::new(AnthropicModel::new(config)))
        }
        "gemini" => {
            let model = need_name(rest)?;
            let config = configured(cx, args, &GEMINI, |vars| {
                GeminiConfig::from_vars(model, vars)
            })?;
            Ok(Arc::new(GeminiModel::new(config)))
        }
        _ => Err(CliError::usage(format!(
            "unknown model `{spec}`: expected one of {KNOWN}"
        ))),
    }
}
