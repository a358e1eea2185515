//! The configuration file: defaults for the flags of `run` and `chat`, and named models.
//!
//! The file is TOML, at `$XDG_CONFIG_HOME/toolloop/config.toml` (`~/.config/toolloop/…`), or
//! wherever `TOOLLOOP_CONFIG` points. Its top-level keys are the long flags of `toolloop run`
//! with `_` for `-` (`model`, `max_rounds`, `timeout`, `store`, …); a `[models.NAME]` table names
//! a model with its provider settings, so that `--model NAME` picks all of them:
//!
//! ```toml
//! model = "fast"
//! max_rounds = 20
//! timeout = "5m"
//!
//! [models.fast]
//! model = "openai:gpt-4.1-mini"
//!
//! [models.local]
//! model = "openai:qwen3-coder"
//! base_url = "http://127.0.0.1:11434/v1"
//! tool_protocol = "prompt"
//! dialect = "qwen3-coder"
//! extra = { top_k = 20 }
//! ```
//!
//! Precedence: flags, then environment variables, then the file, then the built-in defaults.
//! A key the command does not know is an error naming it (a typo never passes silently); values
//! are checked by the same parsers as the flags.

use crate::CliError;
use crate::args::{ProviderArgs, ToolProtocol};
use clap::parser::ValueSource;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The environment variable that names the configuration file (empty: no file).
pub(crate) const CONFIG_VAR: &str = "TOOLLOOP_CONFIG";

/// The subcommands whose flags the file sets (paths of subcommand names).
const CONFIGURED: &[&[&str]] = &[
    &["run"],
    &["chat"],
    &["workflow", "run"],
    &["workflow", "check"],
];

/// A named model: `[models.NAME]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamedModel {
    /// `provider:model`, as `--model` takes it.
    pub model: String,
    /// `--base-url`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// `--api-key-env`: the variable that holds the key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `--extra`: request fields merged into every request.
    #[serde(default)]
    pub extra: Option<Value>,
    /// `--tool-protocol`.
    #[serde(default)]
    pub tool_protocol: Option<ToolProtocol>,
    /// `--dialect`.
    #[serde(default)]
    pub dialect: Option<String>,
}

/// The file as read.
#[derive(Debug, Default)]
pub(crate) struct ConfigFile {
    /// Where it was read from.
    pub path: Option<PathBuf>,
    /// Flag defaults: flag id → values.
    pub flags: BTreeMap<String, Vec<String>>,
    /// Named models.
    pub models: BTreeMap<String, NamedModel>,
    /// Agents the main agent may delegate to: `[agents.NAME]` (see [`crate::agents`]).
    pub agents: BTreeMap<String, crate::args::AgentDef>,
}

/// Where the configuration file is looked for: `TOOLLOOP_CONFIG`, else the platform's
/// configuration directory; `None` when neither is known (no HOME): then there is no file.
pub(crate) fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(CONFIG_VAR) {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    use etcetera::BaseStrategy;
    etcetera::choose_base_strategy()
        .ok()
        .map(|s| s.config_dir().join("toolloop").join("config.toml"))
}

/// Reads the file at [`path`]; a missing file is an empty configuration (unless
/// `TOOLLOOP_CONFIG` names it: then it must exist).
pub(crate) fn load() -> Result<ConfigFile, CliError> {
    let Some(path) = path() else {
        return Ok(ConfigFile::default());
    };
    let explicit = std::env::var_os(CONFIG_VAR).is_some();
    match toolloop::user_file::read_to_string(&path, toolloop::user_file::DEFAULT_MAX_BYTES) {
        Ok(text) => parse(&text, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            Ok(ConfigFile::default())
        }
        Err(e) => Err(CliError::invalid(
            format!("configuration file {}", path.display()),
            e,
        )),
    }
}

/// Parses a configuration file's text (`path` names it in errors).
pub(crate) fn parse(text: &str, path: &Path) -> Result<ConfigFile, CliError> {
    let at = || format!("configuration file {}", path.display());
    let table: toml::Table = toml::from_str(text).map_err(|e| CliError::invalid(at(), e))?;
    let mut config = ConfigFile {
        path: Some(path.to_path_buf()),
        ..ConfigFile::default()
    };
    for (key, value) in table {
        if key == "agents" {
            config.agents = crate::args::parse_defs(value, &at())?;
            continue;
        }
        if key == "models" {
            let models: BTreeMap<String, NamedModel> = value
                .try_into()
                .map_err(|e| CliError::invalid(format!("{}: [models]", at()), e))?;
            for (name, m) in &models {
                if name.contains(':') || name == "test" {
                    return Err(CliError::usage(format!(
                        "{}: [models.{name}]: a model's name may not be `test` or contain `:`",
                        at()
                    )));
                }
                if m.model.trim().is_empty() {
                    return Err(CliError::usage(format!(
                        "{}: [models.{name}]: `model` is empty",
                        at()
                    )));
                }
            }
            config.models = models;
            continue;
        }
        let values = match value {
            toml::Value::Array(items) => items
                .into_iter()
                .map(|v| scalar(&key, v))
                .collect::<Result<Vec<_>, _>>(),
            v => scalar(&key, v).map(|s| vec![s]),
        }
        .map_err(|e| e.context(at()))?;
        config.flags.insert(key, values);
    }
    Ok(config)
}

fn scalar(key: &str, value: toml::Value) -> Result<String, CliError> {
    match value {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Table(t) => Ok(toml_to_json(toml::Value::Table(t)).to_string()),
        _ => Err(CliError::usage(format!(
            "`{key}`: expected a string, a number, a boolean or a table"
        ))),
    }
}

fn toml_to_json(value: toml::Value) -> Value {
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => {
            Value::Object(t.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect())
        }
    }
}

/// The configuration the command runs with: the file read at start (empty when there is
/// none), and the flags given on the command line or by an environment variable. Made in
/// `main`, kept in [`crate::cx::Cx`].
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    /// The configuration file.
    pub file: ConfigFile,
    /// The ids of the flags given on the command line or by an environment variable.
    pub explicit: HashSet<String>,
}

/// Sets the file's values as the defaults of the `run` and `chat` flags they name. An unknown
/// key is an error naming it and the flags there are.
pub(crate) fn apply(
    mut command: clap::Command,
    config: &ConfigFile,
) -> Result<clap::Command, CliError> {
    let at = config
        .path
        .as_ref()
        .map(|p| format!("configuration file {}", p.display()))
        .unwrap_or_default();
    for (key, values) in &config.flags {
        let mut known = false;
        for path in CONFIGURED {
            let mut cmd = Some(&command);
            for name in *path {
                cmd = cmd.and_then(|c| c.find_subcommand(name));
            }
            let Some(cmd) = cmd else {
                continue;
            };
            let Some(arg) = cmd.get_arguments().find(|a| a.get_id().as_str() == key) else {
                continue;
            };
            if arg.is_positional() {
                continue;
            }
            known = true;
            let values = values.clone();
            command = match path {
                [sub] => command.mut_subcommand(*sub, |c| {
                    c.mut_arg(key.as_str(), |a| a.default_values(values))
                }),
                [outer, inner] => command.mut_subcommand(*outer, |c| {
                    c.mut_subcommand(*inner, |c| {
                        c.mut_arg(key.as_str(), |a| a.default_values(values))
                    })
                }),
                _ => command,
            };
        }
        if !known {
            return Err(CliError::usage(format!(
                "{at}: unknown key `{key}`; expected a long flag of `toolloop run` with `_` for \
                 `-` (e.g. `max_rounds`), or a [models.NAME] table"
            )));
        }
    }
    Ok(command)
}

/// Which flags of the chosen subcommand came from the command line or the environment (they
/// win over a named model's settings).
pub(crate) fn explicit_flags(matches: &clap::ArgMatches) -> HashSet<String> {
    let mut explicit = HashSet::new();
    // The innermost subcommand (`toolloop workflow run`: `run`).
    let mut matches = matches;
    while let Some((_, sub)) = matches.subcommand()
        && sub.subcommand().is_some()
    {
        matches = sub;
    }
    if let Some((_, sub)) = matches.subcommand() {
        for id in sub.ids() {
            if matches!(
                sub.value_source(id.as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            ) {
                explicit.insert(id.as_str().to_string());
            }
        }
    }
    explicit
}

impl Loaded {
    /// Whether a model was chosen by a flag, the environment or the file (not the built-in
    /// default).
    pub(crate) fn model_chosen(&self) -> bool {
        self.explicit("model") || self.file.flags.contains_key("model")
    }

    /// Whether the flag `id` (`max_rounds`) was given on the command line, in the environment,
    /// or in the configuration file (not left at its built-in default).
    pub(crate) fn is_set(&self, id: &str) -> bool {
        self.explicit(id) || self.file.flags.contains_key(id)
    }

    fn explicit(&self, id: &str) -> bool {
        self.explicit.contains(id)
    }

    /// When `--model` names a model of the file, puts its settings in `args` (a setting given by a
    /// flag or the environment wins). Afterwards `args.model` is `provider:model`, so the run's
    /// saved configuration does not depend on the file.
    pub(crate) fn resolve_model(&self, args: &mut ProviderArgs) -> Result<(), CliError> {
        let name = args.model.trim().to_string();
        let name = name.as_str();
        let Some(named) = self.file.models.get(name).cloned() else {
            return Ok(());
        };
        args.model = named.model.trim().to_string();
        if args.base_url.is_none() {
            args.base_url = named.base_url;
        }
        if args.api_key_env.is_none() {
            args.api_key_env = named.api_key_env;
        }
        if args.extra.is_none()
            && let Some(extra) = named.extra
        {
            if !extra.is_object() {
                return Err(CliError::usage(format!(
                    "[models.{name}] extra: expected a table"
                )));
            }
            args.extra = Some(Box::new(extra));
        }
        if !self.explicit("tool_protocol")
            && let Some(p) = named.tool_protocol
        {
            args.tool_protocol = p;
        }
        if !self.explicit("dialect")
            && let Some(d) = named.dialect
        {
            args.dialect = d
                .parse()
                .map_err(|e| CliError::usage(format!("[models.{name}] dialect: {e}")))?;
        }
        Ok(())
    }
}

/// `toolloop config path|show`.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum ConfigCommand {
    /// Print where the configuration file is read from.
    Path,
    /// Print the configuration file as the command reads it.
    Show,
}

/// Runs `toolloop config …`.
pub(crate) fn config_command(
    cx: &crate::cx::Cx,
    command: ConfigCommand,
) -> Result<std::process::ExitCode, CliError> {
    match command {
        ConfigCommand::Path => match path() {
            Some(p) => {
                crate::outln!("{}", crate::terminal::escape(&p.to_string_lossy(), false));
                Ok(std::process::ExitCode::SUCCESS)
            }
            None => Err(CliError::failed(format!(
                "no configuration directory (HOME is not set); set {CONFIG_VAR}"
            ))),
        },
        ConfigCommand::Show => {
            let config = &cx.config.file;
            let Some(path) = &config.path else {
                crate::error::warn("no configuration file");
                return Ok(std::process::ExitCode::SUCCESS);
            };
            crate::outln!(
                "# {}",
                crate::terminal::escape(&path.to_string_lossy(), false)
            );
            let mut table = toml::Table::new();
            for (k, v) in &config.flags {
                let value = match v.as_slice() {
                    [one] => toml::Value::String(one.clone()),
                    many => {
                        toml::Value::Array(many.iter().cloned().map(toml::Value::String).collect())
                    }
                };
                table.insert(k.clone(), value);
            }
            if !config.models.is_empty()
                && let Ok(v) = toml::Value::try_from(&config.models)
            {
                table.insert("models".into(), v);
            }
            match toml::to_string(&table) {
                // A store URL's or a base URL's password is not shown.
                Ok(text) => crate::outln!(
                    "{}",
                    crate::terminal::escape(&toolloop::redact::redact_url_credentials(&text), true)
                ),
                Err(e) => crate::error::warn(e),
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}
