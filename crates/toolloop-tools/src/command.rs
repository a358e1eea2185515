//! `run_command`: runs a program in the root directory and returns its exit code and output.
//!
//! The model gives an argument vector (`["cargo", "test", "--quiet"]`); no shell reads it, so
//! an argument is never split, globbed or taken for a `;`. Shells (`sh`, `bash`, `zsh`, …, and
//! `env`, which would start one) are refused unless [`CommandConfig::allow_shell`] is set.
//!
//! The child:
//! - runs in the root, with stdin empty;
//! - gets the environment of this process without anything that looks like a credential (see
//!   [`is_secret_var`]: `*_API_KEY`, `*_TOKEN`, `*SECRET*`, `*PASSWORD*`, the providers' and
//!   stores' variables);
//! - leads a process group of its own; when the call times out or the run is cancelled, the
//!   whole group gets SIGTERM, then SIGKILL after [`CommandConfig::kill_grace`]; whatever the
//!   command leaves running in its group when it exits is killed too, and so is the group when
//!   the call is dropped;
//! - has its stdout and stderr kept up to [`CommandConfig::max_output_bytes`] each: the head
//!   and the tail, with the number of bytes left out between them.
//!
//! The result's data holds `exit_code` (or `signal`), `stdout` and `stderr`; a command that
//! exits non-zero is a result like any other (the model reads the code and the output), while
//! a timeout or a cancellation is a tool error carrying the output so far.
//!
//! The tool is side-effecting and asks for approval by default (see
//! [`toolloop::approval`]); rules match its approval subject, the command line with each
//! argument quoted as a POSIX shell would need (`cargo test --quiet`, `echo 'a b'`).

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use toolloop::approval::{Action, Subject};
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, schema_of};

/// How `run_command` runs programs.
#[derive(Debug, Clone)]
pub struct CommandConfig {
    /// The directory commands run in.
    pub root: PathBuf,
    /// The longest a command may run (default 120 s); a call may ask for less.
    pub timeout: Duration,
    /// How long a command has to exit after SIGTERM before SIGKILL (default 2 s).
    pub kill_grace: Duration,
    /// The most bytes of stdout, and of stderr, kept: half from the head, half from the tail
    /// (default 32 KiB).
    pub max_output_bytes: usize,
    /// Whether shells may be run (`["sh", "-c", "…"]`). Default: no.
    pub allow_shell: bool,
}

impl CommandConfig {
    /// The defaults, running in `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CommandConfig {
            root: root.into(),
            timeout: Duration::from_secs(120),
            kill_grace: Duration::from_secs(2),
            max_output_bytes: 32 * 1024,
            allow_shell: false,
        }
    }
}

/// The `run_command` tool.
#[derive(Debug)]
pub struct RunCommand {
    config: CommandConfig,
    root: PathBuf,
    schema: Value,
    description: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunCommandArgs {
    /// The program and its arguments, one string each (no shell: quotes, `*`, `;`, `|` and `>`
    /// are passed as they are).
    command: Vec<String>,
    /// Seconds to let it run (at most the configured limit).
    timeout_secs: Option<f64>,
}

/// Programs refused without [`CommandConfig::allow_shell`]: shells, and launchers that would
/// start one.
const SHELLS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "fish",
    "csh",
    "tcsh",
    "ash",
    "busybox",
    "pwsh",
    "powershell",
    "cmd",
    "env",
    "nu",
    "xonsh",
];

/// Whether an environment variable may hold a credential, and is kept from the command: the
/// rule every child process of toolloop follows ([`toolloop::redact::is_secret_env_name`]).
pub fn is_secret_var(name: &str) -> bool {
    toolloop::redact::is_secret_env_name(name)
}

/// A command line as a POSIX shell would read it back: arguments made only of safe
/// characters as they are, others in single quotes.
pub fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let safe = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%^".contains(&b));
            if safe {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Programs that run the rest of their arguments as a command (`env rm x`, `busybox rm x`,
/// `xargs rm`, `find . -exec rm {} ;`): with one of these, every later argument may start the
/// command that runs.
const LAUNCHERS: &[&str] = &[
    "env",
    "busybox",
    "toybox",
    "nice",
    "nohup",
    "timeout",
    "time",
    "stdbuf",
    "setsid",
    "ionice",
    "chrt",
    "taskset",
    "xargs",
    "sudo",
    "doas",
    "runuser",
    "setpriv",
    "prlimit",
    "command",
    "exec",
    "flock",
    "chroot",
    "unshare",
    "nsenter",
    "strace",
    "ltrace",
    "valgrind",
    "firejail",
    "find",
    "watch",
    "parallel",
    "systemd-run",
];

/// The argument positions a launcher's command is looked for in (a longer command line is
/// uncertain).
const MAX_LAUNCHED_AT: usize = 64;

/// The longest command line whose launched commands are checked one by one (a longer one is
/// uncertain).
const MAX_LAUNCHED_BYTES: usize = 16 * 1024;

/// A program's name as rules compare it: the last component of its path, lower-case, without
/// a Windows `.exe`.
fn program_name(program: &str) -> Option<String> {
    let name = Path::new(program)
        .file_name()?
        .to_str()?
        .to_ascii_lowercase();
    Some(match name.strip_suffix(".exe") {
        Some(stem) => stem.to_string(),
        None => name,
    })
}

/// Where the command tool finds `program`, as the system will when it starts it in `root`:
/// a path with a `/` from the root, a bare name on `PATH` (a relative entry of `PATH` from the
/// root too).
fn locate(root: &Path, program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(root.join(program));
    }
    if program.is_empty() {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| root.join(dir).join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    meta.is_file()
}

/// `run_command`'s approval subject: the command line as given (what `allow` rules match),
/// with, for `deny` and `ask` rules, the same command with its program named by its base name,
/// by the path it is found at and by the file that path resolves to (links followed: `/bin/rm`,
/// `./rm`, `//usr/bin//rm` and a link to `rm` all read `rm …`), and, after a launcher
/// ([`LAUNCHERS`]: `env`, `busybox`, `xargs`, …), each command it could run. A shell (`sh -c`)
/// runs what its script says, which no rule can read: the subject is uncertain, so every
/// `deny` and `ask` rule of `run_command` applies to it.
pub fn command_subject(root: &Path, argv: &[String]) -> Subject {
    let mut subject = Subject::new(command_line(argv));
    if argv.is_empty() {
        return subject;
    }
    let mut launched = false;
    for start in 0..argv.len() {
        if start > 0 && !launched {
            break;
        }
        if start >= MAX_LAUNCHED_AT || (start > 0 && subject.text.len() > MAX_LAUNCHED_BYTES) {
            return subject.uncertain(
                "a launcher runs a command that is too long to check argument by argument",
            );
        }
        let (program, rest) = (&argv[start], &argv[start + 1..]);
        let mut names: Vec<String> = Vec::new();
        let mut spellings: Vec<String> = vec![program.clone()];
        if let Some(name) = program_name(program) {
            names.push(name.clone());
            spellings.push(name);
        }
        if let Some(found) = locate(root, program) {
            spellings.push(found.to_string_lossy().into_owned());
            if let Ok(real) = std::fs::canonicalize(&found) {
                if let Some(name) = real.to_str().and_then(program_name) {
                    names.push(name.clone());
                    spellings.push(name);
                }
                spellings.push(real.to_string_lossy().into_owned());
            }
        }
        for spelling in spellings {
            let mut line = vec![spelling];
            line.extend_from_slice(rest);
            subject = subject.alias(command_line(&line));
        }
        if names
            .iter()
            .any(|n| SHELLS.contains(&n.as_str()) && !LAUNCHERS.contains(&n.as_str()))
        {
            return subject.uncertain(format!(
                "`{}` is a shell, which runs whatever its script says",
                names[0]
            ));
        }
        launched |= names.iter().any(|n| LAUNCHERS.contains(&n.as_str()));
    }
    subject
}

impl RunCommand {
    /// The tool. Fails when the root is not a directory.
    pub fn new(config: CommandConfig) -> std::io::Result<Self> {
        let root = std::fs::canonicalize(&config.root)?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("the root `{}` is not a directory", config.root.display()),
            ));
        }
        let shell = if config.allow_shell {
            "Shells may be used (`[\"sh\", \"-c\", \"…\"]`)."
        } else {
            "No shell: give the program and its arguments; shells are not available."
        };
        let description = format!(
            "Runs a program in the project directory and returns its exit code, stdout and \
             stderr (long output keeps its head and tail). {shell} At most {}s per command.",
            config.timeout.as_secs()
        );
        Ok(RunCommand {
            config,
            root,
            schema: schema_of::<RunCommandArgs>(),
            description,
        })
    }
}

/// Kills a process group when dropped (a call dropped mid-way, by a tool timeout or a
/// cancelled run, leaves nothing running).
struct Group(Option<i32>);

impl Group {
    fn signal(&self, kill: bool) {
        #[cfg(unix)]
        if let Some(pid) = self.0.and_then(rustix::process::Pid::from_raw) {
            let sig = if kill {
                rustix::process::Signal::KILL
            } else {
                rustix::process::Signal::TERM
            };
            let _ = rustix::process::kill_process_group(pid, sig);
        }
        #[cfg(not(unix))]
        let _ = kill;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(true);
    }
}

/// The head and tail of a stream, and how many bytes it had.
struct Capped {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Capped {
    fn text(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if !self.tail.is_empty() {
            let kept = (self.head.len() + self.tail.len()) as u64;
            out.push_str(&format!(
                "\n[… {} bytes left out …]\n",
                self.total.saturating_sub(kept)
            ));
            let (a, b) = self.tail.as_slices();
            out.push_str(&String::from_utf8_lossy(&[a, b].concat()));
        }
        out
    }
}

async fn read_capped(mut r: impl AsyncRead + Unpin, max: usize) -> Capped {
    let half = max / 2;
    let mut c = Capped {
        head: Vec::new(),
        tail: VecDeque::new(),
        total: 0,
    };
    let mut buf = [0u8; 8192];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        c.total += n as u64;
        let mut rest = &buf[..n];
        if c.head.len() < max.saturating_sub(half) && c.tail.is_empty() {
            let room = max.saturating_sub(half) - c.head.len();
            let take = room.min(rest.len());
            c.head.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        c.tail.extend(rest);
        while c.tail.len() > half {
            c.tail.pop_front();
        }
    }
    c
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
    Cancelled,
}

#[async_trait]
impl Tool for RunCommand {
    fn name(&self) -> &str {
        "run_command"
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> &Value {
        &self.schema
    }
    fn side_effect(&self) -> SideEffect {
        SideEffect::SideEffecting
    }
    fn approval_subject(&self, args: &Value) -> Subject {
        match args.get("command").and_then(Value::as_array) {
            Some(items) => {
                let argv: Vec<String> = items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                command_subject(&self.root, &argv)
            }
            None => toolloop::message::canonical_json(args).into(),
        }
    }
    fn default_approval(&self) -> Action {
        Action::Ask
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: RunCommandArgs = serde_json::from_value(args)
            .map_err(|e| ToolError::new(format!("arguments do not fit run_command: {e}")))?;
        let Some(program) = args.command.first() else {
            return Err(ToolError::new(
                "`command` is empty: give the program and its arguments",
            ));
        };
        let base = Path::new(program)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(program);
        if !self.config.allow_shell && SHELLS.contains(&base) {
            return Err(ToolError::new(format!(
                "`{base}` is a shell (or starts one), and shells are not available: run the \
                 program directly, with its arguments as separate strings"
            )));
        }
        let mut timeout = self.config.timeout;
        if let Some(t) = args.timeout_secs.filter(|t| t.is_finite() && *t > 0.0) {
            timeout = timeout.min(Duration::from_secs_f64(t.min(1e9)));
        }
        if let Some(d) = ctx.deadline {
            timeout = timeout.min(d.saturating_duration_since(tokio::time::Instant::now()));
        }
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&args.command[1..])
            .current_dir(&self.root)
            .env_clear()
            .envs(std::env::vars_os().filter(|(k, _)| !is_secret_var(&k.to_string_lossy())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            ToolError::new(format!(
                "cannot start `{}`: {e}",
                toolloop::result::shorten(program, 200)
            ))
        })?;
        let group = Group(child.id().and_then(|id| i32::try_from(id).ok()));
        let max = self.config.max_output_bytes;
        let stdout = child
            .stdout
            .take()
            .map(|o| tokio::spawn(read_capped(o, max)));
        let stderr = child
            .stderr
            .take()
            .map(|e| tokio::spawn(read_capped(e, max)));
        let ending = tokio::select! {
            s = child.wait() => match s {
                Ok(s) => Ending::Exited(s),
                Err(e) => return Err(ToolError::new(format!("waiting for the command failed: {e}"))),
            },
            _ = tokio::time::sleep(timeout) => Ending::TimedOut,
            _ = ctx.cancel.cancelled() => Ending::Cancelled,
        };
        let ending = match ending {
            Ending::Exited(s) => Ending::Exited(s),
            stop => {
                group.signal(false);
                if tokio::time::timeout(self.config.kill_grace, child.wait())
                    .await
                    .is_err()
                {
                    group.signal(true);
                    let _ = child.wait().await;
                }
                stop
            }
        };
        // Whatever the command left running in its group goes with it (it would hold the
        // output pipes open).
        group.signal(true);
        let collect = |h: Option<tokio::task::JoinHandle<Capped>>| async move {
            let h = h?;
            tokio::time::timeout(Duration::from_secs(2), h)
                .await
                .ok()?
                .ok()
        };
        let stdout = collect(stdout).await.map(|c| c.text()).unwrap_or_default();
        let stderr = collect(stderr).await.map(|c| c.text()).unwrap_or_default();
        match ending {
            Ending::Exited(status) => {
                let code = status.code();
                #[cfg(unix)]
                let signal = std::os::unix::process::ExitStatusExt::signal(&status);
                #[cfg(not(unix))]
                let signal: Option<i32> = None;
                let message = match (code, signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by signal {s}"),
                    _ => "ended".into(),
                };
                Ok(ToolOutput {
                    message,
                    data: Some(json!({
                        "exit_code": code,
                        "signal": signal,
                        "stdout": stdout,
                        "stderr": stderr,
                    })),
                    ..ToolOutput::default()
                })
            }
            Ending::TimedOut | Ending::Cancelled => {
                let what = if matches!(ending, Ending::TimedOut) {
                    format!(
                        "the command did not finish within {:.1}s and was killed",
                        timeout.as_secs_f64()
                    )
                } else {
                    "the run was cancelled and the command was killed".to_string()
                };
                let mut e = ToolError::new(what);
                e.data = Some(json!({"stdout": stdout, "stderr": stderr}));
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command_line(&argv(&["cargo", "test", "-q"])),
            "cargo test -q"
        );
        assert_eq!(
            command_line(&argv(&["echo", "a b", "it's", ""])),
            r"echo 'a b' 'it'\''s' ''"
        );
        assert_eq!(command_line(&argv(&["x", "a;rm"])), "x 'a;rm'");
    }
}
