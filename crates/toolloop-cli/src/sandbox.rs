//! The command sandbox in the command: `--sandbox read-only|workspace-write|off` and
//! `--sandbox-network` (also `sandbox` and `sandbox_network` in the configuration file), and
//! the secret paths toolloop adds to the library's defaults: its own configuration and data
//! directories, the configuration file, and the store's file.

use crate::args::SandboxArgs;
use crate::cx::Cx;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use toolloop_tools::sandbox::{SandboxMode, SandboxPolicy};

/// What the command keeps about the sandbox (in [`Cx`]): the store files opened or named, kept
/// from sandboxed programs, and whether the user was warned about the sandbox.
#[derive(Default)]
pub(crate) struct SandboxState {
    store_files: Mutex<Vec<PathBuf>>,
    warned: AtomicBool,
}

/// Keeps the store at `location` (a SQLite path; a `postgres://` URL is not a file) from
/// sandboxed programs: the file and SQLite's files beside it.
pub(crate) fn protect_store(cx: &Cx, location: Option<&str>) {
    let Some(location) = location.map(str::trim).filter(|l| !l.is_empty()) else {
        return;
    };
    if location.contains("://") && !location.starts_with("sqlite:") {
        return;
    }
    let path = location.strip_prefix("sqlite://").unwrap_or(location);
    let path = path.strip_prefix("sqlite:").unwrap_or(path);
    let path = PathBuf::from(path.split('?').next().unwrap_or(path));
    let Ok(path) = std::path::absolute(&path) else {
        return;
    };
    let mut files = cx
        .sandbox
        .store_files
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let p = PathBuf::from(p);
        if !files.contains(&p) {
            files.push(p);
        }
    }
}

/// The policy of the flags: the library's default secret paths, toolloop's configuration and
/// data directories, the configuration file, `TOOLLOOP_STORE` and the stores named so far.
pub(crate) fn policy(cx: &Cx, args: &SandboxArgs) -> SandboxPolicy {
    let mode = args.sandbox.unwrap_or(SandboxMode::WorkspaceWrite);
    let mut policy = SandboxPolicy::new(mode).network(args.sandbox_network);
    if !policy.is_on() {
        return policy;
    }
    for p in toolloop_secrets(cx) {
        policy = policy.secret(p);
    }
    policy
}

/// Tells the user, once per command, that the sandbox asked for cannot be used here, or that
/// secret paths lie inside the root, where it cannot keep them from commands.
pub(crate) fn warn(
    cx: &Cx,
    tool: &toolloop_tools::command::RunCommand,
    policy: &SandboxPolicy,
    root: &Path,
) {
    if tool.sandboxed() {
        let inside = policy.secrets_within(root);
        if !inside.is_empty() && !cx.sandbox.warned.swap(true, Ordering::Relaxed) {
            let list: Vec<String> = inside
                .iter()
                .map(|p| crate::terminal::escape(&p.display().to_string(), false).into_owned())
                .collect();
            crate::error::warn(format!(
                "warning: {} inside --root, where sandboxed commands may write; the \
                 sandbox cannot keep {} from them (choose a narrower --root)",
                list.join(", "),
                if list.len() == 1 { "it" } else { "them" }
            ));
        }
        return;
    }
    let Some(why) = tool.sandbox_unavailable() else {
        return;
    };
    if !cx.sandbox.warned.swap(true, Ordering::Relaxed) {
        crate::error::warn(format!(
            "warning: commands cannot run in a sandbox here: {why}. run_command calls \
             run with all of your rights and are asked about (use --sandbox off to silence \
             this, or run toolloop in a container or a virtual machine)"
        ));
    }
}

/// The paths toolloop keeps from sandboxed programs on top of the library's defaults: its
/// configuration and data directories, the configuration file, `TOOLLOOP_STORE` and the stores
/// named so far (with SQLite's files beside them).
pub(crate) fn toolloop_secrets(cx: &Cx) -> Vec<PathBuf> {
    use etcetera::BaseStrategy;
    let mut out = Vec::new();
    if let Ok(dirs) = etcetera::choose_base_strategy() {
        out.push(dirs.config_dir().join("toolloop"));
        out.push(dirs.data_dir().join("toolloop"));
    }
    if let Some(p) = toolloop_store::Store::default_location() {
        out.push(p.parent().map(PathBuf::from).unwrap_or(p));
    }
    if let Some(p) = crate::config::path() {
        out.push(p);
    }
    protect_store(cx, std::env::var("TOOLLOOP_STORE").ok().as_deref());
    out.extend(
        cx.sandbox
            .store_files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned(),
    );
    out
}
