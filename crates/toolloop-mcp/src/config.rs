//! What a server is: how to reach it ([`Transport`]) and how its tools are named and called
//! ([`ServerConfig`]); and the `mcpServers` JSON of Claude Desktop, Cursor and Claude Code
//! ([`parse_mcp_servers`]).

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toolloop_tools::sandbox::{SandboxMode, SandboxPolicy};

/// How to reach a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables set for it, on top of this process's environment without its secrets
        /// (see [`child_env`]). A secret the server needs must be listed here.
        env: BTreeMap<String, String>,
        /// Its working directory (default: this process's).
        cwd: Option<PathBuf>,
    },
    /// A server at a streamable HTTP endpoint.
    Http {
        /// The endpoint (`http://127.0.0.1:3001/mcp`, `https://…`).
        url: String,
        /// Headers sent with every request (`Authorization: Bearer …`).
        headers: BTreeMap<String, String>,
    },
}

/// The longest an MCP call may take when its server's configuration does not say (10
/// minutes): a server that never answers does not hold a run without a timeout forever.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// One server and how its tools are offered.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The server's name (the key in `mcpServers`): in error messages and in prefixed tool
    /// names.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// When set, every tool of this server is named `<prefix>__<tool>`. When not, a tool keeps
    /// its own name unless that name collides with another server's tool or a built-in tool;
    /// then it is `<server>__<tool>`.
    pub prefix: Option<String>,
    /// The longest a call may take; the server is told to cancel it after that (default
    /// [`DEFAULT_CALL_TIMEOUT`], the `timeout` of its `mcpServers` entry; `None`: no limit but
    /// the run's). A run's own timeout bounds every call too.
    pub call_timeout: Option<Duration>,
    /// The longest the server may take to start and answer `initialize`, and to answer
    /// `tools/list` (default 30 s). A run's own timeout bounds both too.
    pub startup_timeout: Duration,
    /// How many times the server is started again after it died (default 3); after that its
    /// calls fail.
    pub max_restarts: u32,
    /// The sandbox a child process server runs in (see [`toolloop_tools::sandbox`]), with its
    /// working directory (or this process's) as the root it may write in. Default: none. A
    /// server whose sandbox the system cannot enforce does not start (its error says why).
    pub sandbox: Option<SandboxPolicy>,
}

impl ServerConfig {
    /// A server with the default settings.
    pub fn new(name: impl Into<String>, transport: Transport) -> Self {
        ServerConfig {
            name: name.into(),
            transport,
            prefix: None,
            call_timeout: Some(DEFAULT_CALL_TIMEOUT),
            startup_timeout: Duration::from_secs(30),
            max_restarts: 3,
            sandbox: None,
        }
    }

    /// A child process server.
    pub fn stdio<I, S>(name: impl Into<String>, command: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ServerConfig::new(
            name,
            Transport::Stdio {
                command: command.into(),
                args: args.into_iter().map(Into::into).collect(),
                env: BTreeMap::new(),
                cwd: None,
            },
        )
    }

    /// A streamable HTTP server.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        ServerConfig::new(
            name,
            Transport::Http {
                url: url.into(),
                headers: BTreeMap::new(),
            },
        )
    }

    /// Sets a variable of a child process server (ignored for HTTP).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let Transport::Stdio { env, .. } = &mut self.transport {
            env.insert(key.into(), value.into());
        }
        self
    }

    /// Sets the working directory of a child process server (ignored for HTTP).
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        if let Transport::Stdio { cwd, .. } = &mut self.transport {
            *cwd = Some(dir.into());
        }
        self
    }

    /// Sets a header of an HTTP server (ignored for stdio).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        if let Transport::Http { headers, .. } = &mut self.transport {
            headers.insert(name.into(), value.into());
        }
        self
    }

    /// Names every tool of this server `<prefix>__<tool>`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The longest a call may take.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// The secrets the configuration holds, which nothing toolloop says about the server may
    /// repeat (a server's error that echoes them is redacted): every header value of an HTTP
    /// server (and the credential of an `Authorization: Bearer …`-style value), the password
    /// of its URL, and the values of a child's variables whose names look secret
    /// ([`is_secret_env_name`]).
    pub fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        match &self.transport {
            Transport::Http { url, headers } => {
                for value in headers.values() {
                    let value = value.trim();
                    out.push(value.to_string());
                    if let Some((_, credential)) = value.split_once(' ') {
                        out.push(credential.trim().to_string());
                    }
                }
                let authority = url
                    .split_once("://")
                    .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""))
                    .unwrap_or("");
                if let Some((userinfo, _)) = authority.rsplit_once('@')
                    && let Some((_, password)) = userinfo.split_once(':')
                {
                    out.push(password.to_string());
                }
            }
            Transport::Stdio { env, .. } => {
                for (name, value) in env {
                    if is_secret_env_name(name) {
                        out.push(value.clone());
                    }
                }
            }
        }
        out.retain(|s| !s.is_empty());
        out
    }

    /// Runs a child process server in a sandbox (ignored for HTTP).
    pub fn sandbox(mut self, policy: SandboxPolicy) -> Self {
        self.sandbox = Some(policy);
        self
    }
}

/// Whether an environment variable's name looks like it holds a secret, by the rule every child
/// process of toolloop follows ([`toolloop::redact::is_secret_env_name`]). Such variables are
/// not passed on to child process servers unless the server's `env` lists them.
pub fn is_secret_env_name(name: &str) -> bool {
    toolloop::redact::is_secret_env_name(name)
}

/// The environment of a child process server: this process's variables without the secret
/// ones (the one rule of [`toolloop::redact::is_secret_env`]: by name, and values holding a
/// URL with credentials), then the server's own `env` (which may set anything).
pub fn child_env(
    inherited: impl IntoIterator<Item = (String, String)>,
    own: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = inherited
        .into_iter()
        .filter(|(k, v)| !toolloop::redact::is_secret_env(k, v))
        .collect();
    env.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Why a configuration could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// What was wrong, naming the server and the field.
    pub message: String,
}

fn err(message: impl Into<String>) -> ConfigError {
    ConfigError {
        message: message.into(),
    }
}

/// Replaces `${VAR}` (and `${VAR:-default}`) with the variable's value from `lookup`. A
/// variable that is not set (and has no default) is an error naming it; `$$` is a `$`.
pub fn expand_vars(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                return Err(format!("`${{` without a closing `}}` in `{text}`"));
            };
            let inner = &body[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "`${{{inner}}}` is not a variable: expected ${{NAME}} or ${{NAME:-default}}"
                ));
            }
            match lookup(name).or_else(|| default.map(str::to_string)) {
                Some(v) => out.push_str(&v),
                None => return Err(format!("the variable {name} is not set")),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Reads the servers of an `mcpServers` document (Claude Desktop, Cursor, Claude Code:
/// `{"mcpServers": {"name": {"command": …, "args": […], "env": {…}, "cwd": …}, "web":
/// {"url": …, "headers": {…}}}}`), expanding `${VAR}` in every string with `lookup`. A
/// server with `"disabled": true` is left out. Also reads `prefix` (see
/// [`ServerConfig::prefix`]) and `timeout` (seconds per call). `type` may be `stdio`, `http`
/// or `streamable-http`; `sse` (the old transport) is refused.
///
/// toolloop's own settings of a server go under the key `toolloop`, which other clients
/// ignore: `"toolloop": {"sandbox": "workspace-write", "network": false}` runs a child
/// process server in the sandbox ([`ServerConfig::sandbox`]; `sandbox` is `read-only`,
/// `workspace-write` or `off`, `network` allows the network).
pub fn parse_mcp_servers(
    doc: &Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ServerConfig>, ConfigError> {
    parse_with(doc, &|text| expand_vars(text, lookup))
}

/// Reads the servers of an `mcpServers` document as [`parse_mcp_servers`] does, but with every
/// string as written: `${VAR}` stays `${VAR}`. For showing a file not trusted yet, whose
/// variables must not be read.
pub fn parse_mcp_servers_verbatim(doc: &Value) -> Result<Vec<ServerConfig>, ConfigError> {
    parse_with(doc, &|text| Ok(text.to_string()))
}

/// Replaces the variables of one string (or leaves them).
type Expand<'a> = &'a dyn Fn(&str) -> Result<String, String>;

fn parse_with(doc: &Value, expand: Expand<'_>) -> Result<Vec<ServerConfig>, ConfigError> {
    let Some(servers) = doc.get("mcpServers") else {
        return Err(err(
            "no `mcpServers` object: expected {\"mcpServers\": {\"name\": {\"command\": …} or {\"url\": …}}}",
        ));
    };
    let Some(servers) = servers.as_object() else {
        return Err(err("`mcpServers` is not an object of servers by name"));
    };
    let mut out = Vec::new();
    for (name, spec) in servers {
        if let Some(server) = parse_server(name, spec, expand)? {
            out.push(server);
        }
    }
    Ok(out)
}

fn parse_server(
    name: &str,
    spec: &Value,
    expand: Expand<'_>,
) -> Result<Option<ServerConfig>, ConfigError> {
    let at = |field: &str| format!("mcpServers.{name}.{field}");
    let Some(obj) = spec.as_object() else {
        return Err(err(format!("mcpServers.{name} is not an object")));
    };
    if obj.get("disabled").and_then(Value::as_bool) == Some(true) {
        return Ok(None);
    }
    let valid_name = !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if !valid_name {
        return Err(err(format!(
            "server name `{name}`: expected 1 to 32 characters from a-z, A-Z, 0-9, `_` and `-` \
             (it prefixes tool names)"
        )));
    }
    let string = |field: &str| -> Result<Option<String>, ConfigError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => expand(s)
                .map(Some)
                .map_err(|e| err(format!("{}: {e}", at(field)))),
            Some(_) => Err(err(format!("{} is not a string", at(field)))),
        }
    };
    let map = |field: &str| -> Result<BTreeMap<String, String>, ConfigError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => expand(s)
                        .map(|v| (k.clone(), v))
                        .map_err(|e| err(format!("{}.{k}: {e}", at(field)))),
                    _ => Err(err(format!("{}.{k} is not a string", at(field)))),
                })
                .collect(),
            Some(_) => Err(err(format!("{} is not an object of strings", at(field)))),
        }
    };
    let kind = string("type")?;
    let command = string("command")?;
    let url = string("url")?;
    let transport = match (kind.as_deref(), command, url) {
        (Some("sse"), _, _) => {
            return Err(err(format!(
                "{}: the SSE transport is not supported; use the server's streamable HTTP \
                 endpoint (type `http`)",
                at("type")
            )));
        }
        (Some(t), _, _)
            if !matches!(t, "stdio" | "http" | "streamable-http" | "streamableHttp") =>
        {
            return Err(err(format!(
                "{}: `{t}` is not a transport: expected stdio or http",
                at("type")
            )));
        }
        (_, Some(_), Some(_)) => {
            return Err(err(format!(
                "mcpServers.{name} has both `command` and `url`: expected one"
            )));
        }
        (_, Some(command), None) => {
            let args = match obj.get("args") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) => {
                            expand(s).map_err(|e| err(format!("{}[{i}]: {e}", at("args"))))
                        }
                        _ => Err(err(format!("{}[{i}] is not a string", at("args")))),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(err(format!("{} is not an array of strings", at("args")))),
            };
            Transport::Stdio {
                command,
                args,
                env: map("env")?,
                cwd: string("cwd")?.map(PathBuf::from),
            }
        }
        (_, None, Some(url)) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(err(format!(
                    "{}: `{url}` is not an http:// or https:// URL",
                    at("url")
                )));
            }
            Transport::Http {
                url,
                headers: map("headers")?,
            }
        }
        (_, None, None) => {
            return Err(err(format!(
                "mcpServers.{name} has neither `command` (a child process) nor `url` (streamable \
                 HTTP)"
            )));
        }
    };
    let stdio = matches!(transport, Transport::Stdio { .. });
    let mut server = ServerConfig::new(name, transport);
    server.sandbox = parse_own(name, obj.get("toolloop"), stdio)?;
    if let Some(prefix) = string("prefix")? {
        server.prefix = Some(prefix);
    }
    match obj.get("timeout") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_f64() {
            Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => {
                server.call_timeout = Some(Duration::from_secs_f64(s));
            }
            _ => {
                return Err(err(format!(
                    "{}: expected seconds per call, above 0 and at most 86400",
                    at("timeout")
                )));
            }
        },
    }
    Ok(Some(server))
}

/// toolloop's own settings of a server (the `toolloop` object): its sandbox.
fn parse_own(
    name: &str,
    own: Option<&Value>,
    stdio: bool,
) -> Result<Option<SandboxPolicy>, ConfigError> {
    let at = format!("mcpServers.{name}.toolloop");
    let obj = match own {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(err(format!("{at} is not an object"))),
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "sandbox" | "network"))
    {
        return Err(err(format!(
            "{at}.{k} is not a setting: expected `sandbox` or `network`"
        )));
    }
    let mode = match obj.get("sandbox") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse::<SandboxMode>()
                .map_err(|e| err(format!("{at}.sandbox: {e}")))?,
        ),
        Some(_) => return Err(err(format!("{at}.sandbox is not a string"))),
    };
    let network = match obj.get("network") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(err(format!("{at}.network is not true or false"))),
    };
    match mode {
        None | Some(SandboxMode::Off) => Ok(None),
        Some(_) if !stdio => Err(err(format!(
            "{at}.sandbox: only a child process server (`command`) can run in the sandbox"
        ))),
        Some(mode) => Ok(Some(SandboxPolicy::new(mode).network(network))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_sandbox_under_toolloops_own_key() {
        let doc = json!({"mcpServers": {
            "boxed": {"command": "srv", "toolloop": {"sandbox": "workspace-write"}},
            "net": {"command": "srv", "toolloop": {"sandbox": "read-only", "network": true}},
            "plain": {"command": "srv"},
        }});
        let servers = parse_mcp_servers(&doc, &vars).unwrap();
        let get = |n: &str| {
            servers
                .iter()
                .find(|s| s.name == n)
                .unwrap()
                .sandbox
                .clone()
        };
        let boxed = get("boxed").unwrap();
        assert_eq!(
            (boxed.mode, boxed.network),
            (SandboxMode::WorkspaceWrite, false)
        );
        let net = get("net").unwrap();
        assert_eq!((net.mode, net.network), (SandboxMode::ReadOnly, true));
        assert_eq!(get("plain"), None);
        for bad in [
            json!({"command": "s", "toolloop": {"sandbox": "strict"}}),
            json!({"command": "s", "toolloop": {"sandbox": "off", "nope": 1}}),
            json!({"url": "https://x/mcp", "toolloop": {"sandbox": "read-only"}}),
        ] {
            let e = parse_mcp_servers(&json!({"mcpServers": {"x": bad}}), &vars).unwrap_err();
            assert!(e.message.contains("mcpServers.x.toolloop"), "{e}");
        }
    }

    fn vars(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/me".into()),
            "GH_TOKEN" => Some("ghp_x".into()),
            _ => None,
        }
    }

    #[test]
    fn expands_variables_and_names_missing_ones() {
        assert_eq!(
            expand_vars("${HOME}/x $$ ${NOPE:-d} $", &vars).unwrap(),
            "/home/me/x $ d $"
        );
        let e = expand_vars("a ${MISSING} b", &vars).unwrap_err();
        assert!(e.contains("MISSING"), "{e}");
        assert!(expand_vars("${bad name}", &vars).is_err());
        assert!(expand_vars("${OPEN", &vars).is_err());
    }

    #[test]
    fn reads_the_claude_desktop_format() {
        let doc = json!({"mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "server", "${HOME}"], "env": {"GH_TOKEN": "${GH_TOKEN}"}, "cwd": "/tmp"},
            "web": {"type": "http", "url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${GH_TOKEN}"}, "prefix": "w", "timeout": 2.5},
            "off": {"command": "x", "disabled": true}
        }});
        let servers = parse_mcp_servers(&doc, &vars).unwrap();
        assert_eq!(servers.len(), 2);
        let fs = servers.iter().find(|s| s.name == "fs").unwrap();
        assert_eq!(
            fs.transport,
            Transport::Stdio {
                command: "npx".into(),
                args: vec!["-y".into(), "server".into(), "/home/me".into()],
                env: BTreeMap::from([("GH_TOKEN".into(), "ghp_x".into())]),
                cwd: Some("/tmp".into()),
            }
        );
        let web = servers.iter().find(|s| s.name == "web").unwrap();
        assert_eq!(web.prefix.as_deref(), Some("w"));
        assert_eq!(web.call_timeout, Some(Duration::from_millis(2500)));
        match &web.transport {
            Transport::Http { url, headers } => {
                assert_eq!(url, "https://example.com/mcp");
                assert_eq!(headers["Authorization"], "Bearer ghp_x");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verbatim_reading_expands_nothing() {
        let doc = json!({"mcpServers": {
            "fs": {"command": "npx", "args": ["${HOME}"], "env": {"K": "${GH_TOKEN}"}},
            "web": {"url": "https://x/mcp", "headers": {"Authorization": "Bearer ${MISSING}"}}
        }});
        let servers = parse_mcp_servers_verbatim(&doc).unwrap();
        let fs = servers.iter().find(|s| s.name == "fs").unwrap();
        assert_eq!(
            fs.transport,
            Transport::Stdio {
                command: "npx".into(),
                args: vec!["${HOME}".into()],
                env: BTreeMap::from([("K".into(), "${GH_TOKEN}".into())]),
                cwd: None,
            }
        );
        let web = servers.iter().find(|s| s.name == "web").unwrap();
        assert_eq!(web.secrets(), ["Bearer ${MISSING}", "${MISSING}"]);
    }

    #[test]
    fn errors_name_the_server_and_field() {
        let cases = [
            (
                json!({"mcpServers": {"a": {"command": 3}}}),
                "mcpServers.a.command",
            ),
            (json!({"mcpServers": {"a": {}}}), "neither `command`"),
            (
                json!({"mcpServers": {"a": {"url": "ftp://x"}}}),
                "mcpServers.a.url",
            ),
            (
                json!({"mcpServers": {"a": {"type": "sse", "url": "http://x"}}}),
                "SSE",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "env": {"K": "${NOPE}"}}}}),
                "mcpServers.a.env.K: the variable NOPE",
            ),
            (
                json!({"mcpServers": {"a b": {"command": "x"}}}),
                "server name `a b`",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "timeout": -1}}}),
                "mcpServers.a.timeout",
            ),
            (json!({"servers": {}}), "no `mcpServers`"),
        ];
        for (doc, want) in cases {
            let e = parse_mcp_servers(&doc, &vars).unwrap_err().message;
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }

    #[test]
    fn secrets_stay_out_of_child_environments_unless_listed() {
        let inherited = [
            ("PATH", "/bin"),
            ("OPENAI_API_KEY", "sk-1"),
            ("GITHUB_TOKEN", "t"),
            ("MY_SECRET_THING", "s"),
            ("DB_PASSWORD", "p"),
            ("AWS_SECRET_ACCESS_KEY", "a"),
            ("TOOLLOOP_STORE", "postgres://u:pw@db/toolloop"),
            ("OPENAI_BASE_URL", "https://u:pw@proxy/v1"),
            ("APIKEY", "k"),
            ("https_proxy", "http://user:pass@proxy:3128"),
            ("no_proxy", "localhost"),
            ("LANG", "C"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let own = BTreeMap::from([("GITHUB_TOKEN".to_string(), "given".to_string())]);
        let env = child_env(inherited, &own);
        assert_eq!(
            env.keys().map(String::as_str).collect::<Vec<_>>(),
            ["GITHUB_TOKEN", "LANG", "PATH", "no_proxy"]
        );
        assert_eq!(env["GITHUB_TOKEN"], "given");
    }
}
