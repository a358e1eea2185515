//! `run_command`: runs a program in the root directory and returns its exit code and output.
//!
//! The model gives an argument vector (`["cargo", "test", "--quiet"]`); no shell reads it, so
//! an argument is never split, globbed or taken for a `;`. Shells (`sh`, `bash`, `zsh`, …, and
//! `env`, which would start one) are refused unless [`CommandConfig::allow_shell`] is set.
//!
//! The child:
//! - runs in the root, with stdin empty;
//! - gets the environment of this process without anything that may be a credential, by the
//!   one rule of [`toolloop::redact::is_secret_env`]: names containing `KEY`, `TOKEN`, `SECRET`,
//!   `PASSWORD` (and `PASSWD`, `CREDENTIAL`, `COOKIE`, or ending in `AUTH`), the providers' and
//!   stores' variables, the names marked secret (the command's `--api-key-env`), and values
//!   holding a URL with credentials (`https_proxy=http://user:password@proxy`);
//! - leads a process group of its own; when the call times out or the run is cancelled, the
//!   whole group gets SIGTERM, then SIGKILL after [`CommandConfig::kill_grace`]; whatever the
//!   command leaves running in its group when it exits is killed too, and so is the group when
//!   the call is dropped;
//! - on Linux, is killed with every process it started, even one that left its process group
//!   and session (`setsid`): the command is made a child subreaper (`PR_SET_CHILD_SUBREAPER`),
//!   so that what its children leave behind stays in its tree while it runs, and it carries
//!   a variable, [`COMMAND_ID_VAR`], with a value of this call's own, which whatever it starts
//!   inherits. When the call ends (the command exits, times out or is cancelled, or the call
//!   is dropped), every process in the command's tree and every process whose environment
//!   holds that value (with their trees) gets SIGKILL, found by walking `/proc` until none is
//!   left; nothing else is touched. A process that both leaves the tree (its parent exits)
//!   and clears its environment is not found;
//! - has its stdout and stderr kept up to [`CommandConfig::max_output_bytes`] each: the head
//!   and the tail, with the number of bytes left out between them.
//!
//! The result's data holds `exit_code` (or `signal`), `stdout` and `stderr`; a command that
//! exits non-zero is a result like any other (the model reads the code and the output), while
//! a timeout or a cancellation is a tool error carrying the output so far.
//!
//! # The sandbox
//!
//! With a [`SandboxPolicy`] that is on ([`CommandConfig::sandbox`]) and a system that can
//! enforce it ([`SandboxPolicy::support`]), every command runs in the sandbox (see
//! [`crate::sandbox`]): it may write only beneath the root and its private `TMPDIR`, cannot
//! read the secret paths, and has no network unless the policy allows it. Such a command is
//! allowed without asking by default ([`CommandConfig::sandboxed_approval`]). A command that
//! fails with an error that reads like the sandbox refused it gets a `sandbox` note in its
//! result; the model may then call again with `"sandbox": false`, and that call is asked
//! about, always (a rule that allows it does not; a rule that denies it still wins).
//!
//! Where the system cannot enforce the policy, [`RunCommand::sandbox_unavailable`] says why,
//! and commands run outside it and are asked about as without a sandbox (never silently
//! allowed).
//!
//! # Approvals
//!
//! The tool is side-effecting; outside the sandbox it asks for approval by default (see
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

use crate::sandbox::SandboxPolicy;

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
    /// The sandbox commands run in (default: off; [`SandboxPolicy::new`] makes one).
    pub sandbox: SandboxPolicy,
    /// The approval of a call that runs in the sandbox when no rule matches (default:
    /// allow, since it cannot write outside the root, read the secrets or reach the network).
    pub sandboxed_approval: Action,
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
            sandbox: SandboxPolicy::off(),
            sandboxed_approval: Action::Allow,
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
    /// Why the configured sandbox cannot be used here (commands then run outside it).
    unavailable: Option<crate::sandbox::Unavailable>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunCommandArgs {
    /// The program and its arguments, one string each (no shell: quotes, `*`, `;`, `|` and `>`
    /// are passed as they are).
    command: Vec<String>,
    /// Seconds to let it run (at most the configured limit).
    timeout_secs: Option<f64>,
    /// `false` asks to run the command outside the sandbox, after the sandbox stopped it; a
    /// person decides. Leave it out otherwise.
    sandbox: Option<bool>,
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

/// The variable every `run_command` child carries, with a value of its call's own (the
/// process id of this process, a time and a count), by which what the command leaves running
/// is found and killed when the call ends.
pub const COMMAND_ID_VAR: &str = "TOOLLOOP_COMMAND_ID";

/// A value for [`COMMAND_ID_VAR`] no other call has.
fn new_command_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}-{n}", std::process::id())
}

/// Whether an environment variable's name says it may hold a credential, so that it is kept
/// from the command ([`toolloop::redact::is_secret_env_name`]; the whole rule, values
/// included, is [`toolloop::redact::is_secret_env`]).
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
/// (`env`, `busybox`, `xargs`, …), each command it could run. A shell (`sh -c`)
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
        let unavailable = config.sandbox.support().err();
        let sandboxed = config.sandbox.is_on() && unavailable.is_none();
        let sandbox = if sandboxed {
            let write = match config.sandbox.mode {
                crate::sandbox::SandboxMode::ReadOnly => "may write only in $TMPDIR",
                _ => "may write only in the project directory and $TMPDIR",
            };
            let net = if config.sandbox.network {
                ""
            } else {
                ", has no network"
            };
            format!(
                " Commands run in a sandbox: each {write}{net}, and cannot read credentials. \
                 If the sandbox stopped a command, you may call again with \"sandbox\": false \
                 to ask the user to run it outside."
            )
        } else {
            String::new()
        };
        let description = format!(
            "Runs a program in the project directory and returns its exit code, stdout and \
             stderr (long output keeps its head and tail). {shell} At most {}s per \
             command.{sandbox}",
            config.timeout.as_secs()
        );
        Ok(RunCommand {
            config,
            root,
            schema: schema_of::<RunCommandArgs>(),
            description,
            unavailable,
        })
    }

    /// Whether commands run in the sandbox (it is configured and this system enforces it).
    pub fn sandboxed(&self) -> bool {
        self.config.sandbox.is_on() && self.unavailable.is_none()
    }

    /// Why the configured sandbox cannot be used here, when it cannot: commands then run
    /// outside it and are asked about. A caller should tell the user (the command prints a
    /// warning).
    pub fn sandbox_unavailable(&self) -> Option<&crate::sandbox::Unavailable> {
        self.unavailable.as_ref()
    }

    /// Whether this call asks to leave the sandbox (`"sandbox": false` while it is on).
    fn leaves_sandbox(&self, args: &Value) -> bool {
        self.sandboxed() && args.get("sandbox") == Some(&Value::Bool(false))
    }
}

/// Kills a process group, and on Linux the command's whole tree, when dropped (a call dropped
/// mid-way, by a tool timeout or a cancelled run, leaves nothing running).
struct Group(Option<i32>, String);

impl Group {
    /// SIGKILL to every process carrying the command's [`COMMAND_ID_VAR`] value, and their
    /// trees (see the module's documentation).
    fn kill_tree(&self) {
        #[cfg(target_os = "linux")]
        tree::kill(None, &self.1);
    }

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
        self.kill_tree();
    }
}

/// Finding and killing what a command left running, through `/proc`.
#[cfg(target_os = "linux")]
mod tree {
    use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
    use std::collections::HashSet;
    use std::os::fd::OwnedFd;

    /// Every process: its id and its parent's.
    fn processes() -> Vec<(i32, i32)> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            Some((pid, parent(pid)?))
        })
        .collect()
    }

    /// The parent of `pid` (the field after the state, after the name in parentheses, which
    /// may itself hold parentheses).
    fn parent(pid: i32) -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether the environment of `pid` holds `marker` (`NAME=value`) as one whole variable.
    fn carries(pid: i32, marker: &[u8]) -> bool {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            return false;
        };
        env.split(|b| *b == 0).any(|var| var == marker)
    }

    /// `roots` and their descendants, by the parent links of `procs`.
    fn with_descendants(procs: &[(i32, i32)], roots: &mut HashSet<i32>) {
        loop {
            let before = roots.len();
            for &(pid, ppid) in procs {
                if roots.contains(&ppid) {
                    roots.insert(pid);
                }
            }
            if roots.len() == before {
                return;
            }
        }
    }

    /// The processes of the tree of `root` (a process not yet waited for, itself left out)
    /// and those carrying `id` (with their trees), each pinned by a process descriptor, so
    /// that a signal sent through it reaches that process and no other that took its id
    /// later. Never this process or init.
    pub(super) fn find(root: Option<i32>, id: &str) -> Vec<OwnedFd> {
        let marker = format!("{}={id}", super::COMMAND_ID_VAR).into_bytes();
        let me = std::process::id() as i32;
        let procs = processes();
        let carriers: HashSet<i32> = procs
            .iter()
            .map(|&(pid, _)| pid)
            .filter(|&pid| carries(pid, &marker))
            .collect();
        let mut targets = carriers.clone();
        targets.extend(root);
        with_descendants(&procs, &mut targets);
        targets.remove(&me);
        targets.remove(&1);
        if let Some(root) = root {
            targets.remove(&root);
        }
        targets
            .into_iter()
            .filter_map(|pid| {
                let fd = pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
                // One found by the variable is checked again now that it is pinned.
                (!carriers.contains(&pid) || carries(pid, &marker)).then_some(fd)
            })
            .collect()
    }

    /// Sends `signal` to the pinned processes; whether any was still there to get it.
    pub(super) fn signal(pinned: &[OwnedFd], signal: Signal) -> bool {
        // Every one gets it (no stopping at the first).
        let mut sent = false;
        for fd in pinned {
            sent |= pidfd_send_signal(fd, signal).is_ok();
        }
        sent
    }

    /// SIGKILL to the tree of `root` (a process not yet waited for, signalled after its
    /// descendants, so that they are found under it before they are handed to another parent)
    /// and to every process carrying `id` (and their trees), pass after pass until none is
    /// found.
    pub(super) fn kill(root: Option<i32>, id: &str) {
        for _ in 0..50 {
            let sent = signal(&find(root, id), Signal::KILL);
            if let Some(pid) = root.and_then(Pid::from_raw) {
                // Not waited for yet, it stays (a zombie) until the caller waits for it.
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            if !sent {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
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
    /// The one place where the sandbox decides approvals: a command in the sandbox gets
    /// [`CommandConfig::sandboxed_approval`] (allow by default), one outside it asks.
    fn default_approval(&self) -> Action {
        if self.sandboxed() {
            self.config.sandboxed_approval
        } else {
            Action::Ask
        }
    }
    fn approval_required(&self, args: &Value) -> bool {
        self.leaves_sandbox(args)
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
        let id = new_command_id();
        let sandboxed = self.sandboxed() && args.sandbox != Some(false);
        // Made here, not on a blocking thread: it takes well under a millisecond (a few
        // directory listings), less than a hand-off to another thread on a busy machine.
        let mut confinement = if sandboxed {
            let prepared = self.config.sandbox.prepare(&self.root);
            Some(prepared.map_err(|e| ToolError::new(e.to_string()))?)
        } else {
            None
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&args.command[1..])
            .current_dir(&self.root)
            .env_clear()
            .envs(toolloop::redact::child_env())
            .env(COMMAND_ID_VAR, &id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        cmd.process_group(0);
        // SAFETY: the closure runs in the child between fork and exec, and makes one system
        // call (prctl), which is async-signal-safe; it allocates nothing and takes no lock.
        #[cfg(target_os = "linux")]
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::set_child_subreaper(Some(rustix::process::Pid::INIT))
                    .map_err(std::io::Error::from)
            });
        }
        if let Some(c) = confinement.as_mut() {
            c.apply(cmd.as_std_mut());
        }
        let mut child = cmd.spawn().map_err(|e| {
            ToolError::new(format!(
                "cannot start `{}`: {e}",
                toolloop::result::shorten(program, 200)
            ))
        })?;
        let group = Group(child.id().and_then(|id| i32::try_from(id).ok()), id);
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
                // The command's tree as it is now (what left its group with `setsid`
                // included), found from the command while it is not waited for (its id still
                // its own) and pinned: once the command exits, what it started is handed to
                // another parent and could no longer be found under it.
                #[cfg(target_os = "linux")]
                let pinned = {
                    let (root, id) = (group.0, group.1.clone());
                    tokio::task::spawn_blocking(move || tree::find(root, &id))
                        .await
                        .unwrap_or_default()
                };
                group.signal(false);
                #[cfg(target_os = "linux")]
                tree::signal(&pinned, rustix::process::Signal::TERM);
                if tokio::time::timeout(self.config.kill_grace, child.wait())
                    .await
                    .is_err()
                {
                    group.signal(true);
                    let (root, id) = (group.0, group.1.clone());
                    let _ = tokio::task::spawn_blocking(move || {
                        #[cfg(target_os = "linux")]
                        tree::kill(root, &id);
                        #[cfg(not(target_os = "linux"))]
                        let _ = (root, id);
                    })
                    .await;
                    let _ = child.wait().await;
                }
                #[cfg(target_os = "linux")]
                tree::signal(&pinned, rustix::process::Signal::KILL);
                stop
            }
        };
        // Whatever the command left running goes with it (it would hold the output pipes
        // open): its group, and what carries its id; then its private temporary directory.
        group.signal(true);
        let _ = tokio::task::spawn_blocking(move || drop((group, confinement))).await;
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
                let mut message = match (code, signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by signal {s}"),
                    _ => "ended".into(),
                };
                let mut data = json!({
                    "exit_code": code,
                    "signal": signal,
                    "stdout": stdout,
                    "stderr": stderr,
                });
                if sandboxed
                    && !status.success()
                    && crate::sandbox::looks_blocked(&format!("{stderr}\n{stdout}"))
                {
                    let note = format!(
                        "the command ran in the sandbox ({}{}), which may have stopped it; if \
                         it needs to write outside the project directory, read a protected \
                         file or use the network, call run_command again with the same \
                         command and \"sandbox\": false: the user will be asked",
                        self.config.sandbox.mode,
                        if self.config.sandbox.network {
                            ""
                        } else {
                            ", no network"
                        }
                    );
                    message.push_str(&format!(" ({note})"));
                    data["sandbox"] = Value::String(note);
                }
                Ok(ToolOutput {
                    message,
                    data: Some(data),
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
