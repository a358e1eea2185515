//! Keys kept out of the process's environment.
//!
//! Everything the command starts (`run_command`'s programs, MCP servers) could read the keys
//! the command was given: from its own environment, and from `/proc/<toolloop's pid>/environ`,
//! which shows the environment the process was started with, whatever it later unsets. So, at
//! start, before the async runtime (and so before any thread) exists, [`seal`]:
//!
//! 1. takes every variable that the one rule of [`toolloop::redact::is_secret_env`] finds
//!    secret (names containing `KEY`, `TOKEN`, `SECRET`, `PASSWORD`, …, the variables named by
//!    `--api-key-env` and by the configuration file's models, values holding a URL with
//!    credentials) out of the environment, and keeps them in memory, where the providers read
//!    their keys ([`var`]);
//! 2. on Linux, when the process was started with any such variable, starts itself again
//!    (`execve` of `/proc/self/exe`, the same process id, arguments and descriptors) with an
//!    environment block without them; the variables go across in an anonymous memory file
//!    (`memfd`) whose descriptor number is the one thing the new environment says
//!    (`TOOLLOOP_SECRETS_FD`), and which is read and closed at once. This is how
//!    `/proc/<pid>/environ` comes to show no key: the kernel shows the block the process was
//!    started with, and the alternative, overwriting that block in place, needs unsafe code
//!    that finds it through libc's `environ` and writes over memory the program does not own.
//!    Starting again costs one more start of the program (6 ms for a debug build on a busy
//!    two-core machine), only when there is something to hide;
//! 3. makes the process non-dumpable (`PR_SET_DUMPABLE` 0): no core file, and no other
//!    process of the same user may read its memory (`/proc/<pid>/mem`, `ptrace`), where the
//!    keys still are.
//!
//! Proxy variables (`http_proxy`, `https_proxy`, `all_proxy`, in either case) that carry a
//! password are kept in the process's environment (not in the block `/proc` shows), because
//! the HTTP clients read their proxy there; like every secret, no child process gets them.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::OnceLock;

/// The variables taken out of the environment at start, by name. Process-wide, as the
/// environment they were taken from is: they are taken before the command line is read (and
/// before any thread exists, see [`seal`]), so before any per-command state (`Cx`) can exist,
/// and what a provider reads through [`var`] is what the environment would have said.
static KEPT: OnceLock<HashMap<OsString, OsString>> = OnceLock::new();

/// The variable that tells a process started again where its secrets are.
#[cfg(target_os = "linux")]
const FD_VAR: &str = "TOOLLOOP_SECRETS_FD";
/// The name of the memory file that carries them (as `/proc/self/fd/N` shows it).
#[cfg(target_os = "linux")]
const MEMFD_NAME: &str = "toolloop-secrets";

/// Proxy variables, which the HTTP clients read from the environment.
const PROXY_VARS: &[&str] = &["http_proxy", "https_proxy", "all_proxy"];

fn is_proxy_var(name: &OsStr) -> bool {
    PROXY_VARS
        .iter()
        .any(|p| name.to_string_lossy().eq_ignore_ascii_case(p))
}

/// The variables kept out of the environment at start, for a child that is this same program
/// (`toolloop eval`'s runs), which keeps them out of its own environment in turn.
pub(crate) fn kept() -> Vec<(OsString, OsString)> {
    KEPT.get()
        .map(|k| k.iter().map(|(n, v)| (n.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// A variable's value: as kept at start when it was secret, else from the environment.
pub(crate) fn var(name: &str) -> Option<String> {
    if let Some(v) = KEPT.get().and_then(|k| k.get(OsStr::new(name))) {
        return v.to_str().map(str::to_string);
    }
    std::env::var(name).ok()
}

/// The keys of the models a command built, which the model's answers are redacted of (kept
/// in [`crate::cx::Cx`]).
#[derive(Default)]
pub(crate) struct ModelKeys(std::sync::Mutex<Option<toolloop::redact::Redactor>>);

/// The fewest characters a key must have to be looked for in the model's text: a shorter one
/// is no real credential (`test`, for a local server), and replacing it would garble answers.
const ANSWER_KEY_MIN_CHARS: usize = 8;

/// Notes the key of a model the command built: a model's answer that repeats it is redacted
/// ([`redactor`]), when it has at least [`ANSWER_KEY_MIN_CHARS`] characters; nor is it
/// recorded in the command's cassette.
pub(crate) fn note_key(cx: &crate::cx::Cx, key: &str) {
    if key.trim().chars().count() < ANSWER_KEY_MIN_CHARS {
        return;
    }
    let mut keys = cx.model_keys.0.lock().unwrap_or_else(|p| p.into_inner());
    keys.get_or_insert_with(toolloop::redact::Redactor::new)
        .add_secret(key);
    if let Some(cassette) = cx.record.cassette() {
        cassette.add_secret(key);
    }
}

/// A redactor of the keys of every model the command built so far ([`note_key`]).
pub(crate) fn redactor(cx: &crate::cx::Cx) -> toolloop::redact::Redactor {
    cx.model_keys
        .0
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default()
}

/// The secrets a process started again by [`seal`] was handed, put back into its
/// environment for the command line to read (flags' environment defaults, such as
/// `TOOLLOOP_STORE`); [`seal`] takes them out again. Empty in a process started normally.
///
/// Call first thing in `main`, while the process has one thread.
pub(crate) fn inherit() -> Inherited {
    #[cfg(target_os = "linux")]
    {
        let Some(fd) = std::env::var_os(FD_VAR) else {
            return Inherited::default();
        };
        // SAFETY: `main` calls this before anything else, while the process
        // has a single thread, so nothing reads the environment concurrently.
        unsafe { std::env::remove_var(FD_VAR) };
        let Some(fd) = fd.to_str().and_then(|f| f.parse::<i32>().ok()) else {
            return Inherited::default();
        };
        let link = format!("/proc/self/fd/{fd}");
        // Only a memory file of ours is read (a variable set by hand names anything).
        let ours = std::fs::read_link(&link).is_ok_and(|target| {
            target
                .to_string_lossy()
                .starts_with(&format!("/memfd:{MEMFD_NAME}"))
        });
        if !ours {
            return Inherited::default();
        }
        let bytes = std::fs::read(&link).unwrap_or_default();
        // SAFETY: the descriptor is the memory file the process that started this one left
        // open for it (checked above: a memfd of that name); nothing else in this process
        // owns it (nothing has run yet), and it is closed once, here.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        let vars = decode(&bytes);
        for (k, v) in &vars {
            // SAFETY: as above, the process still has a single thread.
            unsafe { std::env::set_var(k, v) };
        }
        // Started through /proc/self/exe, the process is named `exe` (in ps, top, /proc's
        // status): give it its program's name back.
        if let Some(name) = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_name().map(|n| n.as_encoded_bytes().to_vec()))
            .and_then(|mut n| {
                n.truncate(15);
                std::ffi::CString::new(n).ok()
            })
        {
            let _ = rustix::thread::set_name(&name);
        }
        Inherited {
            vars,
            restarted: true,
        }
    }
    #[cfg(not(target_os = "linux"))]
    Inherited::default()
}

/// What [`inherit`] found.
#[derive(Default)]
pub(crate) struct Inherited {
    vars: Vec<(OsString, OsString)>,
    restarted: bool,
}

/// Takes the secrets out of the environment (see the module's documentation): those of the
/// one rule, and the variables in `key_vars` (`--api-key-env`, the configuration file's
/// models). On Linux, a process started with any secret in its environment block is started
/// again without them, and does not return from here; if that fails, the secrets are only
/// taken out of the environment (said on stderr).
///
/// Call from `main` after the command line is read and before any thread exists.
pub(crate) fn seal(key_vars: &[String], inherited: Inherited) {
    for name in key_vars {
        toolloop::redact::mark_secret_env_name(name);
    }
    let mut secret: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, v)| toolloop::redact::is_secret_env_os(k, v))
        .collect();
    // What the process that started this one took out stays out.
    for (k, v) in inherited.vars {
        if !secret.iter().any(|(s, _)| *s == k) && std::env::var_os(&k).is_some() {
            secret.push((k, v));
        }
    }
    #[cfg(target_os = "linux")]
    if !inherited.restarted && !secret.is_empty() {
        let e = restart_without(&secret);
        eprintln!(
            "toolloop: cannot start again without the keys in the environment ({e}); they are \
             taken out of it but stay visible in /proc/{}/environ",
            std::process::id()
        );
    }
    for (k, _) in &secret {
        if !is_proxy_var(k) {
            // SAFETY: called from `main` before the async runtime starts: the process has a
            // single thread.
            unsafe { std::env::remove_var(k) };
        }
    }
    let _ = KEPT.set(secret.into_iter().collect());
    #[cfg(target_os = "linux")]
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
}

/// Starts this program again, in this process, with the environment less `secret`, which
/// goes across in a memory file. Returns only on failure.
#[cfg(target_os = "linux")]
fn restart_without(secret: &[(OsString, OsString)]) -> std::io::Error {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let fd = match rustix::fs::memfd_create(MEMFD_NAME, rustix::fs::MemfdFlags::empty()) {
        Ok(fd) => fd,
        Err(e) => return e.into(),
    };
    let mut file = std::fs::File::from(fd);
    if let Err(e) = file.write_all(&encode(secret)) {
        return e;
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("toolloop"));
    let names: Vec<&OsString> = secret.iter().map(|(k, _)| k).collect();
    let mut command = std::process::Command::new("/proc/self/exe");
    command.arg0(arg0).args(args);
    for name in names {
        command.env_remove(name);
    }
    command.env(FD_VAR, fd.to_string());
    // Only returns on failure; `file` is closed then.
    command.exec()
}

/// `name=value` pairs as `name\0value\0…`.
#[cfg(target_os = "linux")]
fn encode(vars: &[(OsString, OsString)]) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for (k, v) in vars {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(target_os = "linux")]
fn decode(bytes: &[u8]) -> Vec<(OsString, OsString)> {
    use std::os::unix::ffi::OsStrExt;
    let mut parts = bytes.split(|b| *b == 0);
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
        if k.is_empty() {
            break;
        }
        out.push((
            OsStr::from_bytes(k).to_os_string(),
            OsStr::from_bytes(v).to_os_string(),
        ));
    }
    out
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn variables_go_across_as_they_are() {
        let vars = vec![
            (OsString::from("A_KEY"), OsString::from("x=y z")),
            (OsString::from("EMPTY_TOKEN"), OsString::new()),
        ];
        assert_eq!(decode(&encode(&vars)), vars);
    }
}
