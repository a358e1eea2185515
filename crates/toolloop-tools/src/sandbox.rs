//! The command sandbox: what a program started by toolloop (a `run_command` child, a stdio MCP
//! server) may do, enforced by the operating system in that program and in everything it
//! starts, never in toolloop's own process.
//!
//! A [`SandboxPolicy`] is a value: a [`SandboxMode`], whether the network is allowed, and the
//! secret paths no sandboxed program may read. [`SandboxPolicy::prepare`] builds everything
//! before the child is forked (the rules, a private temporary directory); [`Confinement::apply`]
//! puts it on a [`std::process::Command`], where it is enforced between fork and exec.
//!
//! # Linux
//!
//! - **Files** ([Landlock](https://docs.kernel.org/userspace-api/landlock.html), kernel ABI 3 or
//!   later, Linux 6.2): with [`SandboxMode::WorkspaceWrite`], a program may create, write,
//!   truncate, rename, link and remove only beneath the root and its private temporary
//!   directory (`TMPDIR` points there; it is removed when the command ends), and write to
//!   `/dev/null`, `/dev/zero` and `/dev/full`. With [`SandboxMode::ReadOnly`], the root is not
//!   writable either. Landlock checks the path a file is reached by, so a symbolic link in the
//!   root that points outside, `/proc/self/root/…`, or a rename out of the root are refused;
//!   a hard link to an outside file cannot be made (Landlock refuses a link that would give a
//!   file more rights than it has where it is). A hard link made *before* the command ran,
//!   inside the root, to a file outside it is writable: it is a path beneath the root.
//! - **Reads** are allowed everywhere except the secret paths
//!   ([`SandboxPolicy::default_secret_paths`]: `~/.ssh`, `~/.aws`, `~/.gnupg`,
//!   `~/.config/gcloud`, and what the caller adds). Landlock only grants, and a grant on a
//!   directory covers everything beneath it; it cannot take a subpath back. So "everything but"
//!   is built by splitting: read (and execute) is granted on each entry of `/` except those
//!   that hold a secret path, and each directory that holds one is split the same way, down to
//!   the secret itself, which gets nothing. A split directory keeps the right to *list* it and
//!   what is beneath it (so the names of the files in `~/.ssh` can be listed, their contents
//!   cannot be read); a file created in a split directory after the command started is not
//!   readable by it. A secret path inside the writable root cannot be kept from a command that
//!   may write there, and is dropped from the list (see [`Confinement::dropped_secrets`]).
//! - **Network** (off unless [`SandboxPolicy::network`]): the program runs in a network
//!   namespace of its own (with the user namespace that lets an unprivileged process make one,
//!   mapping the user's own uid and gid, so that files keep their owner): it has no interface
//!   but a loopback that is down, so TCP, UDP, ICMP and raw sockets reach nothing, and
//!   abstract Unix sockets outside it cannot be named. The namespace is made once per process
//!   and joined by every sandboxed program without network (making and tearing down one per
//!   command costs the kernel milliseconds); they share its dead loopback, and Landlock keeps
//!   them from signalling or tracing one another. A network namespace was chosen over a
//!   seccomp filter on `socket()`: it holds for every way of making a socket (io_uring's
//!   socket operation, 32-bit system calls) without a list of system calls to keep up to date,
//!   and it cuts abstract Unix sockets too. Landlock's TCP rules (ABI 4) are added as a second
//!   layer: TCP `connect` and `bind` are refused whatever the namespace.
//! - Landlock's scopes (ABI 6): the program cannot send signals to processes outside the
//!   sandbox, nor connect to abstract Unix sockets made outside it.
//! - Everything the program starts inherits all of it (Landlock domains, namespaces and
//!   `no_new_privs` pass to children and cannot be dropped).
//!
//! What it does not do: reads of files not on the secret list are allowed (a project's own
//! `.env`, `/etc`); Unix sockets with a path (a Docker socket, an SSH agent's) can be
//! connected to where the file permissions allow it (Landlock controls them from ABI 9 only);
//! the same secret reached through another mount (a bind mount) is readable; shared memory
//! (`/dev/shm`) is not writable. The kernel itself is shared (a kernel bug is an escape), unlike a
//! virtual machine.
//!
//! # Elsewhere
//!
//! macOS (Seatbelt) and other systems are not supported yet: [`SandboxPolicy::support`] says
//! so, and callers fall back to asking a person about each command.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The environment variable that forces "no sandbox available" (a test and diagnostic
/// override): with `TOOLLOOP_SANDBOX_UNAVAILABLE=1`, [`SandboxPolicy::support`] says the
/// sandbox cannot be used, so commands are asked about as without one. It can only make
/// toolloop ask more.
pub const UNAVAILABLE_VAR: &str = "TOOLLOOP_SANDBOX_UNAVAILABLE";

/// How much a sandboxed program may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Reads as below; writes only to its private temporary directory.
    ReadOnly,
    /// Reads everywhere but the secret paths; writes only beneath the root and its private
    /// temporary directory.
    #[default]
    WorkspaceWrite,
    /// No sandbox: the program has all of the user's rights.
    Off,
}

impl SandboxMode {
    /// `read-only`, `workspace-write` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::Off => "off",
        }
    }
}

impl std::fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SandboxMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "read-only" => Ok(SandboxMode::ReadOnly),
            "workspace-write" => Ok(SandboxMode::WorkspaceWrite),
            "off" => Ok(SandboxMode::Off),
            other => Err(format!(
                "`{other}` is not a sandbox mode: expected read-only, workspace-write or off"
            )),
        }
    }
}

/// What a sandboxed program may do (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// How much it may change.
    pub mode: SandboxMode,
    /// Whether it may use the network (default: no).
    pub network: bool,
    /// Paths it may not read (files or directories, with everything beneath them).
    pub secret_paths: Vec<PathBuf>,
}

/// Why the sandbox cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Setting the sandbox up for one program failed (the program must then not run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxError(pub String);

impl std::fmt::Display for SandboxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the sandbox could not be set up: {}", self.0)
    }
}

impl std::error::Error for SandboxError {}

impl SandboxPolicy {
    /// A policy of `mode`, without network, with the default secret paths of the user's home
    /// (`$HOME`).
    pub fn new(mode: SandboxMode) -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        SandboxPolicy {
            mode,
            network: false,
            secret_paths: Self::default_secret_paths(home.as_deref()),
        }
    }

    /// No sandbox.
    pub fn off() -> Self {
        SandboxPolicy {
            mode: SandboxMode::Off,
            network: false,
            secret_paths: Vec::new(),
        }
    }

    /// `~/.ssh`, `~/.aws`, `~/.gnupg` and `~/.config/gcloud` of `home` (none without one).
    pub fn default_secret_paths(home: Option<&Path>) -> Vec<PathBuf> {
        let Some(home) = home.filter(|h| h.is_absolute()) else {
            return Vec::new();
        };
        [".ssh", ".aws", ".gnupg", ".config/gcloud"]
            .iter()
            .map(|p| home.join(p))
            .collect()
    }

    /// Allows the network or not.
    pub fn network(mut self, allow: bool) -> Self {
        self.network = allow;
        self
    }

    /// Adds a path no sandboxed program may read.
    pub fn secret(mut self, path: impl Into<PathBuf>) -> Self {
        self.secret_paths.push(path.into());
        self
    }

    /// The secret paths that lie beneath `root` when the policy lets programs write there
    /// ([`SandboxMode::WorkspaceWrite`]): the sandbox cannot keep those from a program (it
    /// could replace them), and does not try; a caller should tell the user.
    pub fn secrets_within(&self, root: &Path) -> Vec<PathBuf> {
        if self.mode != SandboxMode::WorkspaceWrite {
            return Vec::new();
        }
        let Ok(root) = std::fs::canonicalize(root) else {
            return Vec::new();
        };
        self.secret_paths
            .iter()
            .filter(|s| resolve(s).is_some_and(|r| r.starts_with(&root)))
            .cloned()
            .collect()
    }

    /// Whether this policy confines anything (its mode is not [`SandboxMode::Off`]).
    pub fn is_on(&self) -> bool {
        self.mode != SandboxMode::Off
    }

    /// Whether this system can enforce the policy: on Linux, Landlock of ABI 3 or later and,
    /// without network, an unprivileged user and network namespace; never elsewhere (yet).
    /// `Ok` for a policy that is off. [`UNAVAILABLE_VAR`] forces an `Err`.
    pub fn support(&self) -> Result<(), Unavailable> {
        if !self.is_on() {
            return Ok(());
        }
        if std::env::var_os(UNAVAILABLE_VAR).is_some_and(|v| !v.is_empty() && v != "0") {
            return Err(Unavailable(format!(
                "{UNAVAILABLE_VAR} is set (the sandbox is taken as unavailable)"
            )));
        }
        imp::support(self.network)
    }

    /// Builds what [`Confinement::apply`] puts on a command that runs in `root`: the rules and
    /// a private temporary directory. Done before the fork, in this process (the child only
    /// enforces what is ready). Fails when the system cannot enforce the policy.
    pub fn prepare(&self, root: &Path) -> Result<Confinement, SandboxError> {
        if !self.is_on() {
            return Ok(Confinement::none());
        }
        self.support().map_err(|e| SandboxError(e.0))?;
        imp::prepare(self, root)
    }
}

/// What one sandboxed program gets, made by [`SandboxPolicy::prepare`]. Keep it until the
/// program (and what it started) has ended: dropping it removes the private temporary
/// directory.
#[derive(Debug)]
pub struct Confinement {
    temp: Option<TempDir>,
    dropped: Vec<PathBuf>,
    #[cfg(target_os = "linux")]
    linux: Option<imp::Prepared>,
}

impl Confinement {
    fn none() -> Self {
        Confinement {
            temp: None,
            dropped: Vec::new(),
            #[cfg(target_os = "linux")]
            linux: None,
        }
    }

    /// Whether anything is enforced.
    pub fn is_on(&self) -> bool {
        self.temp.is_some()
    }

    /// The program's private temporary directory (its `TMPDIR`).
    pub fn temp_dir(&self) -> Option<&Path> {
        self.temp.as_ref().map(|t| t.0.as_path())
    }

    /// Secret paths that lie beneath the writable root, and so could not be kept from the
    /// program.
    pub fn dropped_secrets(&self) -> &[PathBuf] {
        &self.dropped
    }

    /// Puts the sandbox on `cmd`: sets `TMPDIR`, and installs the step run in the child
    /// between fork and exec (entering the namespaces, then restricting itself with Landlock).
    /// Call it once per command; a second call adds nothing.
    pub fn apply(&mut self, cmd: &mut std::process::Command) {
        if let Some(t) = &self.temp {
            cmd.env("TMPDIR", &t.0);
        }
        #[cfg(target_os = "linux")]
        if let Some(p) = self.linux.take() {
            p.apply(cmd);
        }
    }
}

/// A path made absolute and free of symbolic links as far as it exists (the rest as given,
/// `.` and `..` taken lexically); `None` for a relative path.
fn resolve(p: &Path) -> Option<PathBuf> {
    use std::path::Component;
    if !p.is_absolute() {
        return None;
    }
    let mut clean = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    let mut existing = clean;
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Some(out);
        }
        rest.push(existing.file_name()?.to_os_string());
        if !existing.pop() {
            return None;
        }
    }
}

/// A directory removed, with what it holds, when dropped.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    /// A new private (0700) directory under the system's temporary directory.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn new() -> std::io::Result<TempDir> {
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let base = std::env::temp_dir();
        let mut last = None;
        for _ in 0..8 {
            let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = base.join(format!(
                "toolloop-sandbox-{}-{nanos:x}-{n}",
                std::process::id()
            ));
            let mut b = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            match b.create(&dir) {
                Ok(()) => return Ok(TempDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether a failed sandboxed command's error output reads like the sandbox refused it:
/// a permission error from Landlock, or a network that is not there. A heuristic, for telling
/// the model (and a person) that running it outside the sandbox might succeed.
pub fn looks_blocked(stderr: &str) -> bool {
    const SIGNS: &[&str] = &[
        "Permission denied",
        "Operation not permitted",
        "Network is unreachable",
        "Read-only file system",
        "Temporary failure in name resolution",
        "Could not resolve host",
        "Name or service not known",
        "Cannot assign requested address",
        "EACCES",
        "EPERM",
        "ENETUNREACH",
    ];
    SIGNS.iter().any(|s| stderr.contains(s))
}

#[cfg(target_os = "linux")]
mod imp {
    use super::resolve;
    use super::{Confinement, SandboxError, SandboxMode, SandboxPolicy, TempDir, Unavailable};
    use landlock::{
        ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
        RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope,
    };
    use std::ffi::CString;
    use std::os::fd::OwnedFd;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    /// The Landlock ABI whose rights are handled (the newest one tested; a newer kernel
    /// enforces these, an older one what it has of them).
    const ABI_USED: ABI = ABI::V7;

    /// The kernel's Landlock ABI version (0: none).
    fn landlock_abi() -> i64 {
        // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with no attributes only returns a number.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                1u32,
            )
        };
        v.max(0)
    }

    pub(super) fn support(network: bool) -> Result<(), Unavailable> {
        let abi = landlock_abi();
        if abi == 0 {
            return Err(Unavailable(
                "this kernel has no Landlock (it is not built in, or not enabled at boot: \
                 `lsm=…,landlock`)"
                    .into(),
            ));
        }
        if abi < 3 {
            return Err(Unavailable(format!(
                "this kernel's Landlock is ABI {abi}; the sandbox needs ABI 3 (Linux 6.2) or \
                 later, which can refuse truncating files"
            )));
        }
        if !network {
            shared_ns().map_err(|e| {
                Unavailable(format!(
                    "an unprivileged user and network namespace cannot be made here ({e}), so \
                     the network cannot be cut off (allow it with the network setting, or \
                     enable user namespaces: sysctl user.max_user_namespaces, \
                     kernel.unprivileged_userns_clone)"
                ))
            })?;
        }
        Ok(())
    }

    /// The user and network namespace that sandboxed programs without network join: made once
    /// per process, held by descriptors (which keep it alive), so that no program pays for
    /// making and tearing down a network namespace (a few milliseconds of the kernel's time
    /// each). Programs in it share its loopback, which is down; each has its own Landlock
    /// domain, so none can signal or trace another.
    #[derive(Debug)]
    struct SharedNs {
        user: OwnedFd,
        net: OwnedFd,
    }

    fn shared_ns() -> Result<&'static SharedNs, String> {
        static NS: OnceLock<Result<SharedNs, String>> = OnceLock::new();
        NS.get_or_init(make_shared_ns)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors, owned from here on.
        unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
        }
    }

    /// Makes the shared namespace: a child enters a new user and network namespace between
    /// fork and exec, sends its process id, and waits there while this process opens its
    /// `/proc/<pid>/ns/{user,net}`; then it is let go and exits without running anything.
    fn make_shared_ns() -> Result<SharedNs, String> {
        use std::os::fd::AsRawFd;
        let ns = Netns::new();
        let (ready_r, ready_w) = pipe().map_err(|e| e.to_string())?;
        let (release_r, release_w) = pipe().map_err(|e| e.to_string())?;
        let (ready_wfd, release_rfd, release_wfd) = (
            ready_w.as_raw_fd(),
            release_r.as_raw_fd(),
            release_w.as_raw_fd(),
        );
        let mut cmd = std::process::Command::new("/");
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: the step makes system calls only (close, unshare, open/write/close on
        // /proc/self, getpid, write, read), with buffers made before the fork; it allocates
        // nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                libc::close(release_wfd);
                ns.enter()?;
                let pid = libc::getpid().to_ne_bytes();
                if libc::write(ready_wfd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                    return Err(std::io::Error::last_os_error());
                }
                let mut b = [0u8; 1];
                // Until this process closes its end.
                libc::read(release_rfd, b.as_mut_ptr().cast(), 1);
                Err(std::io::Error::from_raw_os_error(libc::ECANCELED))
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let spawner = std::thread::spawn(move || {
            let r = cmd.spawn();
            let _ = tx.send(());
            r
        });
        let mut pid = None;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(10) {
            let mut fds = [libc::pollfd {
                fd: ready_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one pollfd, a short timeout.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 10) };
            if n > 0 {
                let mut buf = [0u8; 4];
                // SAFETY: a 4-byte buffer.
                let got =
                    unsafe { libc::read(ready_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if got == 4 {
                    pid = Some(libc::pid_t::from_ne_bytes(buf));
                }
                break;
            }
            if rx.try_recv().is_ok() {
                break;
            }
        }
        let opened = pid.map(|pid| {
            let open = |kind: &str| {
                std::fs::File::open(format!("/proc/{pid}/ns/{kind}")).map(OwnedFd::from)
            };
            (open("user"), open("net"))
        });
        drop(release_w);
        let spawned = spawner
            .join()
            .map_err(|_| "the namespace maker panicked".to_string())?;
        drop((ready_w, release_r));
        match spawned {
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {}
            Err(e) => return Err(e.to_string()),
            Ok(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the namespace maker ran a program".into());
            }
        }
        match opened {
            Some((Ok(user), Ok(net))) => Ok(SharedNs { user, net }),
            Some((Err(e), _)) | Some((_, Err(e))) => Err(format!("opening its namespaces: {e}")),
            None => Err("the namespace maker did not answer".into()),
        }
    }

    /// Entering a new user and network namespace, mapping this user's own ids (formatted
    /// before the fork).
    #[derive(Debug)]
    struct Netns {
        uid_map: CString,
        gid_map: CString,
    }

    impl Netns {
        fn new() -> Self {
            // SAFETY: getuid and getgid cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            let line = |id: u32| CString::new(format!("{id} {id} 1\n")).unwrap_or_default();
            Netns {
                uid_map: line(uid),
                gid_map: line(gid),
            }
        }

        /// In the child: system calls only.
        fn enter(&self) -> std::io::Result<()> {
            // SAFETY: unshare takes flags only.
            if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            write_file(c"/proc/self/setgroups", b"deny")?;
            write_file(c"/proc/self/uid_map", self.uid_map.as_bytes())?;
            write_file(c"/proc/self/gid_map", self.gid_map.as_bytes())?;
            Ok(())
        }
    }

    /// Writes `data` to the file at `path` in one write (open, write, close: async-signal-safe).
    fn write_file(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
        // SAFETY: a NUL-terminated path, a buffer of `data.len()` bytes, an fd closed once.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, data.as_ptr().cast(), data.len());
            let err = (n < 0).then(std::io::Error::last_os_error);
            libc::close(fd);
            match err {
                Some(e) => Err(e),
                None if n as usize != data.len() => {
                    Err(std::io::Error::from_raw_os_error(libc::EIO))
                }
                None => Ok(()),
            }
        }
    }

    /// What the child enforces, ready before the fork.
    #[derive(Debug)]
    pub(super) struct Prepared {
        ruleset: RulesetCreated,
        /// The shared namespace to join (no network).
        netns: Option<&'static SharedNs>,
    }

    /// In the child: joins the shared user namespace, then its network namespace (system
    /// calls only).
    fn join(ns: &SharedNs) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: setns takes a descriptor and a flag.
        unsafe {
            if libc::setns(ns.user.as_raw_fd(), libc::CLONE_NEWUSER) != 0
                || libc::setns(ns.net.as_raw_fd(), libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    impl Prepared {
        pub(super) fn apply(self, cmd: &mut std::process::Command) {
            let mut ruleset = Some(self.ruleset);
            let netns = self.netns;
            // SAFETY: the step runs in the child between fork and exec. It makes system calls
            // only: setns (twice), prctl(PR_SET_NO_NEW_PRIVS) and landlock_restrict_self
            // (through the landlock crate, which allocates nothing there), and close (the
            // ruleset's fd). Errors are raw OS errors (no allocation).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                    if let Some(ns) = netns {
                        join(ns)?;
                    }
                    let Some(rs) = ruleset.take() else {
                        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
                    };
                    match rs.restrict_self() {
                        Ok(_) => Ok(()),
                        Err(_) => Err(std::io::Error::from_raw_os_error(libc::EPERM)),
                    }
                });
            }
        }
    }

    fn err(what: impl std::fmt::Display) -> SandboxError {
        SandboxError(what.to_string())
    }

    /// A path opened without following a last symbolic link (a link gets a rule of its own,
    /// never its target's).
    fn open_path(p: &Path) -> Option<OwnedFd> {
        use rustix::fs::{Mode, OFlags};
        rustix::fs::open(
            p,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
    }

    /// The read rules: every entry of `/` readable except the secrets, directories holding a
    /// secret split (see the module's documentation). Pairs of a path and whether it is
    /// granted whole (read and execute beneath it) or only listed (a split directory).
    fn read_rules(secrets: &[PathBuf]) -> Vec<(PathBuf, bool)> {
        let mut out = Vec::new();
        let mut todo = vec![PathBuf::from("/")];
        while let Some(dir) = todo.pop() {
            out.push((dir.clone(), false));
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = dir.join(e.file_name());
                if secrets.contains(&p) {
                    continue;
                }
                let holds = secrets.iter().any(|s| s.starts_with(&p));
                let real_dir = e.file_type().is_ok_and(|t| t.is_dir());
                if holds && real_dir {
                    todo.push(p);
                } else if !holds {
                    out.push((p, true));
                }
            }
        }
        out
    }

    pub(super) fn prepare(
        policy: &SandboxPolicy,
        root: &Path,
    ) -> Result<Confinement, SandboxError> {
        let root = std::fs::canonicalize(root)
            .map_err(|e| err(format!("the root `{}`: {e}", root.display())))?;
        let temp = TempDir::new().map_err(|e| {
            err(format!(
                "cannot make a private temporary directory in `{}`: {e}",
                std::env::temp_dir().display()
            ))
        })?;
        let writable_root = policy.mode == SandboxMode::WorkspaceWrite;
        let mut secrets = Vec::new();
        let mut dropped = Vec::new();
        for s in &policy.secret_paths {
            let r = resolve(s).ok_or_else(|| {
                err(format!(
                    "the secret path `{}` is not an absolute path",
                    s.display()
                ))
            })?;
            if writable_root && r.starts_with(&root) {
                dropped.push(s.clone());
            } else if r != Path::new("/") {
                secrets.push(r);
            }
        }
        let abi = ABI_USED;
        let mut rs = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))
            .map_err(err)?;
        if !policy.network {
            rs = rs.handle_access(AccessNet::from_all(abi)).map_err(err)?;
        }
        let mut rs = rs
            .scope(Scope::from_all(abi))
            .map_err(err)?
            .create()
            .map_err(err)?;
        let read: BitFlags<AccessFs> = AccessFs::from_read(abi);
        let list: BitFlags<AccessFs> = AccessFs::ReadDir.into();
        let write: BitFlags<AccessFs> = AccessFs::from_all(abi);
        let add = |rs: RulesetCreated,
                   p: &Path,
                   access: BitFlags<AccessFs>|
         -> Result<RulesetCreated, SandboxError> {
            // A path gone since it was listed gets no rule.
            let Some(fd) = open_path(p) else {
                return Ok(rs);
            };
            rs.add_rule(PathBeneath::new(fd, access))
                .map_err(|e| err(format!("a rule for `{}`: {e}", p.display())))
        };
        for (p, whole) in read_rules(&secrets) {
            rs = add(rs, &p, if whole { read } else { list })?;
        }
        if writable_root {
            rs = add(rs, &root, write)?;
        }
        rs = add(rs, &temp.0, write)?;
        let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
        for dev in ["/dev/null", "/dev/zero", "/dev/full"] {
            if let Ok(fd) = landlock::PathFd::new(dev) {
                rs = rs
                    .add_rule(PathBeneath::new(fd, device))
                    .map_err(|e| err(format!("a rule for `{dev}`: {e}")))?;
            }
        }
        Ok(Confinement {
            temp: Some(temp),
            dropped,
            linux: Some(Prepared {
                ruleset: rs,
                netns: if policy.network {
                    None
                } else {
                    Some(shared_ns().map_err(err)?)
                },
            }),
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::{Confinement, SandboxError, SandboxPolicy, Unavailable};
    use std::path::Path;

    pub(super) fn support(_network: bool) -> Result<(), Unavailable> {
        #[cfg(target_os = "macos")]
        let why = "the sandbox is not built for macOS yet (Seatbelt is planned)";
        #[cfg(not(target_os = "macos"))]
        let why = "the sandbox is built for Linux only";
        Err(Unavailable(why.into()))
    }

    pub(super) fn prepare(
        _policy: &SandboxPolicy,
        _root: &Path,
    ) -> Result<Confinement, SandboxError> {
        Err(SandboxError(support(false).unwrap_err().0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_paths_are_resolved_and_those_in_a_writable_root_named() {
        let dir =
            std::env::temp_dir().join(format!("toolloop-sandbox-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("project")).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        let policy = SandboxPolicy::off()
            .secret(dir.join("project/../project/.secret"))
            .secret(dir.join("elsewhere"));
        assert!(
            policy.secrets_within(&dir.join("project")).is_empty(),
            "off"
        );
        let policy = SandboxPolicy {
            mode: SandboxMode::WorkspaceWrite,
            ..policy
        };
        assert_eq!(
            policy.secrets_within(&dir.join("project")),
            [dir.join("project/../project/.secret")]
        );
        assert_eq!(
            resolve(&dir.join("project/./x/../y")),
            Some(dir.join("project/y"))
        );
        assert_eq!(resolve(Path::new("relative")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn modes_read_and_print_alike() {
        for m in [
            SandboxMode::ReadOnly,
            SandboxMode::WorkspaceWrite,
            SandboxMode::Off,
        ] {
            assert_eq!(m.as_str().parse::<SandboxMode>(), Ok(m));
        }
        assert!("write".parse::<SandboxMode>().is_err());
    }

    #[test]
    fn blocked_commands_are_told_from_others() {
        assert!(looks_blocked(
            "sh: 1: cannot create /etc/x: Permission denied"
        ));
        assert!(looks_blocked("curl: (7) Network is unreachable"));
        assert!(!looks_blocked("error[E0308]: mismatched types"));
    }
}
