//! `--model <provider:model>`: which model to run, and the provider flags.

use clap::{Args, ValueEnum};
use serde_json::Value;
use std::sync::Arc;
use toolloop::model::{Model, ModelError};
use toolloop::providers::anthropic::{AnthropicConfig, AnthropicModel};
use toolloop::providers::gemini::{GeminiConfig, GeminiModel};
use toolloop::providers::openai::{OpenAiConfig, OpenAiModel};
use toolloop::providers::openai_responses::{ResponsesConfig, ResponsesModel};
use toolloop::providers::scripted::ScriptedModel;
use toolloop::providers::test_model::{TestAnswer, TestModel};
use toolloop::ptk::{Auto, Dialect, Prompted};

/// Provider flags shared by the commands that call a model.
#[derive(Args, Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct ProviderArgs {
    /// The model, as provider:model: test, scripted:<file>, openai:<model> (Chat Completions),
    /// openai-responses:<model> (the Responses API), anthropic:<model>, gemini:<model>, or
    /// replay:<cassette> (a run recorded with --record, played back offline).
    #[arg(short = 'm', long, env = "TOOLLOOP_MODEL", default_value = "test")]
    pub model: String,
    /// Read the API key from this environment variable instead of the provider's usual one.
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// The provider's base URL (any OpenAI-compatible server for openai:…; a mock or proxy): an
    /// http:// or https:// URL with a host, without a query or fragment.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Extra request fields, as a JSON object merged into every request (`{"top_k": 20}`). It may
    /// not set the fields the run owns (the conversation, the tools, the model, streaming).
    #[arg(long, value_name = "JSON", value_parser = parse_extra)]
    pub extra: Option<Box<Value>>,
    /// How tools are offered: native (the API's tool calling), prompt (the catalog in the
    /// system prompt, calls read from the text, for models without tool support) or auto
    /// (native, switching to prompt for the rest of the run when the server refuses tools).
    #[arg(long, value_enum, value_name = "PROTOCOL", default_value_t = ToolProtocol::Native)]
    pub tool_protocol: ToolProtocol,
    /// The format prompt-based tool calling teaches the model: ptk, hermes, mistral, llama3,
    /// qwen3-coder, json, deepseek, deepseek-v3.1, kimi-k2, glm or pythonic (replies are read
    /// in every format).
    #[arg(long, value_name = "DIALECT", default_value = "ptk", value_parser = parse_dialect)]
    pub dialect: Dialect,
    /// With prompt-based calling: the model's replies begin inside reasoning whose `<think>` its
    /// chat template wrote (DeepSeek R1, Qwen3 thinking models), so the text before a first
    /// `</think>` is reasoning, kept out of the answer.
    #[arg(long)]
    #[serde(default)]
    pub implicit_think: bool,
    /// How long to keep trying a server that refuses connections (a local server restarting,
    /// or still loading its model), with backoff: seconds or a duration (`30s`, `2m`), at most
    /// an hour; `0` gives up after the usual retries. Default 10s.
    #[arg(long, value_name = "DURATION", value_parser = parse_connect_retry)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_retry: Option<std::time::Duration>,
}

/// A `--connect-retry`: `0`, or a duration of at most an hour.
fn parse_connect_retry(s: &str) -> Result<std::time::Duration, String> {
    if s.trim().parse::<f64>().is_ok_and(|n| n == 0.0) {
        return Ok(std::time::Duration::ZERO);
    }
    let d = crate::run::parse_timeout(s)?;
    if d > std::time::Duration::from_secs(3600) {
        return Err(format!("`{s}` is longer than an hour"));
    }
    Ok(d)
}

/// Sets `--connect-retry` on a provider's transport.
fn connect_retry(args: &ProviderArgs, transport: &mut toolloop::transport::http::HttpTransport) {
    if let Some(wait) = args.connect_retry {
        transport.connect_retry = wait;
    }
}

/// How tools are offered to the model (`--tool-protocol`).
#[derive(
    ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToolProtocol {
    /// The API's own tool calling.
    #[default]
    Native,
    /// Prompt-based tool calling, whatever the model supports.
    Prompt,
    /// Native, falling back to prompt-based when the server refuses the `tools` parameter.
    Auto,
}

fn parse_dialect(s: &str) -> Result<Dialect, String> {
    s.parse::<Dialect>().map_err(|e| e.to_string())
}

fn parse_extra(s: &str) -> Result<Box<Value>, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(v @ Value::Object(_)) => Ok(Box::new(v)),
        Ok(_) => Err("expected a JSON object, like '{\"top_k\": 20}'".into()),
        Err(e) => Err(format!(
            "not valid JSON ({e}); expected an object like '{{\"top_k\": 20}}'"
        )),
    }
}

/// The providers `--model` accepts, for error messages.
pub(crate) const KNOWN: &str = "test, scripted:<file>, openai:<model>, openai-responses:<model>, \
                         anthropic:<model>, gemini:<model>, replay:<cassette>";

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

fn named_key_is_set(args: &ProviderArgs) -> Result<(), String> {
    if let Some(var) = &args.api_key_env
        && crate::secrets::var(var).is_none_or(|v| v.trim().is_empty())
    {
        return Err(format!(
            "--api-key-env {var}: the variable is not set (or is empty)"
        ));
    }
    Ok(())
}

/// Checks the base URL before anything is sent, naming where it came from: `--base-url`, else
/// the first of `url_vars` that is set.
fn check_base_url(args: &ProviderArgs, url_vars: &[&str]) -> Result<(), String> {
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
    toolloop::providers::check_base_url(&url).map_err(|e| format!("{source}: {e}"))
}

/// Refuses an `--extra` that sets a request field the provider's adapter writes itself
/// (`owned`, the adapter's list).
fn check_extra(args: &ProviderArgs, provider: &str, owned: &[&str]) -> Result<(), String> {
    let Some(Value::Object(fields)) = args.extra.as_deref() else {
        return Ok(());
    };
    match fields.keys().find(|k| owned.contains(&k.as_str())) {
        None => Ok(()),
        Some(name) => Err(format!(
            "--extra may not set `{name}`: the {provider} adapter writes it itself (the \
             conversation, the tools, the model and streaming belong to the run); the fields it \
             owns are {}",
            owned.join(", ")
        )),
    }
}

/// The request debug log of the process (`--debug-requests`, `DEBUG_LLM=1`), set once at start.
static DEBUG_LOG: std::sync::OnceLock<Arc<toolloop::transport::request_log::RequestLog>> =
    std::sync::OnceLock::new();

/// Sets where every model request and response is logged: a file, or stderr for `-`.
pub(crate) fn set_debug_log(target: &str) -> Result<(), String> {
    use toolloop::transport::request_log::RequestLog;
    let log = if target == "-" {
        RequestLog::stderr()
    } else {
        RequestLog::create(std::path::Path::new(target))
            .map_err(|e| format!("--debug-requests {target}: {e}"))?
    };
    let _ = DEBUG_LOG.set(Arc::new(log));
    Ok(())
}

fn debug_log() -> Option<Arc<toolloop::transport::request_log::RequestLog>> {
    DEBUG_LOG.get().cloned()
}

/// Builds the model a spec names, with the tool protocol asked for.
pub(crate) fn model_from_args(args: &ProviderArgs) -> Result<Arc<dyn Model>, String> {
    // `replay:FILE`: the recorded provider, answered from the cassette.
    let args = crate::record::resolve(args)?;
    let args = args.as_ref();
    let model = provider_model(args)?;
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
    args: &ProviderArgs,
    name: Option<&str>,
) -> Result<Arc<dyn Model>, String> {
    let Some(name) = name else {
        return model_from_args(args);
    };
    let mut args = args.clone();
    args.model = name.to_string();
    crate::config::resolve_model(&mut args)?;
    model_from_args(&args)
}

/// The provider's model, as the spec names it. Its key is noted, so that answers repeating it
/// are redacted ([`crate::secrets::note_key`]), and the variable it came from is kept from
/// child processes (a run resumed from the store names it only now).
fn provider_model(args: &ProviderArgs) -> Result<Arc<dyn Model>, String> {
    if let Some(var) = &args.api_key_env {
        toolloop::redact::mark_secret_env_name(var);
    }
    let spec = args.model.trim();
    let (provider, rest) = match spec.split_once(':') {
        Some((p, r)) => (p, Some(r)),
        None => (spec, None),
    };
    let need_name = |rest: Option<&str>| -> Result<String, String> {
        match rest.map(str::trim) {
            Some(m) if !m.is_empty() => Ok(m.to_string()),
            _ => Err(format!(
                "`{spec}` names no model: expected {provider}:<model>"
            )),
        }
    };
    let cfg_err = |e: ModelError| e.to_string();
    match provider {
        "test" if rest.is_none() => Ok(Arc::new(TestModel::new().answer(TestAnswer::Summary))),
        "scripted" => {
            let path = need_name(rest)?;
            ScriptedModel::from_file(path)
                .map(|m| Arc::new(m) as Arc<dyn Model>)
                .map_err(|e| e.to_string())
        }
        "openai" => {
            let model = need_name(rest)?;
            check_base_url(args, &["OPENAI_BASE_URL"])?;
            check_extra(args, "OpenAI", toolloop::providers::openai::OWNED_FIELDS)?;
            let mut config = OpenAiConfig::from_vars(
                &model,
                args.api_key_env.as_deref(),
                lookup(args, &[], &["OPENAI_BASE_URL"]),
            )
            .map_err(cfg_err)?;
            config.extra = args.extra.as_deref().cloned();
            config.validate().map_err(cfg_err)?;
            config.transport.debug_log = debug_log();
            config.transport.cassette = crate::record::cassette();
            connect_retry(args, &mut config.transport);
            if let Some(key) = &config.api_key {
                crate::secrets::note_key(key);
            }
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
            check_base_url(args, &["OPENAI_BASE_URL"])?;
            check_extra(
                args,
                "OpenAI Responses",
                toolloop::providers::openai_responses::OWNED_FIELDS,
            )?;
            let mut config = ResponsesConfig::from_vars(
                &model,
                args.api_key_env.as_deref(),
                lookup(args, &[], &["OPENAI_BASE_URL"]),
            )
            .map_err(cfg_err)?;
            config.extra = args.extra.as_deref().cloned();
            config.validate().map_err(cfg_err)?;
            config.transport.debug_log = debug_log();
            config.transport.cassette = crate::record::cassette();
            connect_retry(args, &mut config.transport);
            if let Some(key) = &config.api_key {
                crate::secrets::note_key(key);
            }
            Ok(Arc::new(ResponsesModel::new(config)))
        }
        "anthropic" => {
            let model = need_name(rest)?;
            named_key_is_set(args)?;
            check_base_url(args, &["ANTHROPIC_BASE_URL"])?;
            check_extra(
                args,
                "Anthropic",
                toolloop::providers::anthropic::OWNED_FIELDS,
            )?;
            let mut config = AnthropicConfig::from_vars(
                model,
                lookup(args, &["ANTHROPIC_API_KEY"], &["ANTHROPIC_BASE_URL"]),
            )
            .map_err(cfg_err)?;
            config.extra = args.extra.as_deref().cloned();
            config.validate().map_err(cfg_err)?;
            config.transport.debug_log = debug_log();
            config.transport.cassette = crate::record::cassette();
            connect_retry(args, &mut config.transport);
            if let Some(key) = &config.api_key {
                crate::secrets::note_key(key);
            }
            Ok(Arc::new(AnthropicModel::new(config)))
        }
        "gemini" => {
            let model = need_name(rest)?;
            named_key_is_set(args)?;
            check_base_url(args, &["GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"])?;
            check_extra(args, "Gemini", toolloop::providers::gemini::OWNED_FIELDS)?;
            let mut config = GeminiConfig::from_vars(
                model,
                lookup(
                    args,
                    &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
                    &["GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"],
                ),
            )
            .map_err(cfg_err)?;
            config.extra = args.extra.as_deref().cloned();
            config.validate().map_err(cfg_err)?;
            config.transport.debug_log = debug_log();
            config.transport.cassette = crate::record::cassette();
            connect_retry(args, &mut config.transport);
            if let Some(key) = &config.api_key {
                crate::secrets::note_key(key);
            }
            Ok(Arc::new(GeminiModel::new(config)))
        }
        _ => Err(format!("unknown model `{spec}`: expected one of {KNOWN}")),
    }
}
