//! Trust in a project's `.mcp.json`: the servers a directory names start only once the user
//! has trusted that exact file.
//!
//! A decision is remembered per file (its canonical path) with the SHA-256 of its bytes, in
//! `mcp-trust.json` in the user's data directory (`$XDG_DATA_HOME/toolloop`, by default
//! `~/.local/share/toolloop`), readable by its owner only. A file whose bytes changed since is
//! undecided again. `toolloop mcp trust` trusts the file as it is now; `toolloop mcp untrust`
//! forgets the decision. A run on a terminal asks once (yes is remembered as trusted, no as
//! declined); without a terminal it starts nothing and says which command trusts the file.
//! Decisions are changed under an advisory lock (`mcp-trust.json.lock`) and written to a new
//! file renamed over the old, so processes deciding at once keep every decision.

use crate::CliError;
use crate::cx::Cx;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The largest MCP configuration file read (1 MiB).
pub(crate) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The name of the file of decisions, in the data directory.
const TRUST_FILE: &str = "mcp-trust.json";

/// The file of decisions.
#[derive(Serialize, Deserialize, Default)]
struct Decisions {
    /// By the canonical path of the `.mcp.json`.
    #[serde(default)]
    files: BTreeMap<String, Decision>,
}

/// What the user decided about one version of a file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The SHA-256 of the file's bytes, in hex.
    pub(crate) sha256: String,
    /// Trusted (its servers start) or declined (they do not; not asked again).
    pub(crate) trusted: bool,
}

/// A project file as read: its canonical path, its bytes, their hash.
pub(crate) struct ProjectFile {
    pub(crate) path: PathBuf,
    pub(crate) bytes: Vec<u8>,
    pub(crate) sha256: String,
}

/// What is known of a file's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trust {
    Trusted,
    Declined,
    Undecided,
}

/// Reads a configuration file: a regular file (not a FIFO or device, which are refused without
/// waiting), at most [`MAX_CONFIG_BYTES`].
pub(crate) fn read_config(path: &Path) -> std::io::Result<Vec<u8>> {
    toolloop::user_file::read(path, MAX_CONFIG_BYTES)
}

/// The root's project file, read; `None` when there is none.
pub(crate) fn read_project(root: &Path) -> Result<Option<ProjectFile>, CliError> {
    let path = root.join(super::PROJECT_FILE);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let path = path
        .canonicalize()
        .map_err(|e| CliError::invalid(path.display().to_string(), e))?;
    let bytes = read_config(&path).map_err(|e| CliError::invalid(path.display().to_string(), e))?;
    let sha256 = hex(&Sha256::digest(&bytes));
    Ok(Some(ProjectFile {
        path,
        bytes,
        sha256,
    }))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where decisions are kept: `<data dir>/toolloop/mcp-trust.json`.
pub(crate) fn decisions_path() -> Option<PathBuf> {
    use etcetera::BaseStrategy;
    let dir = etcetera::choose_base_strategy().ok()?.data_dir();
    Some(dir.join("toolloop").join(TRUST_FILE))
}

fn load(path: &Path) -> Result<Decisions, CliError> {
    match read_config(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            CliError::failed(format!(
                "{}: not a file of MCP trust decisions: {e}",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Decisions::default()),
        Err(e) => Err(CliError::io(path.display().to_string(), e)),
    }
}

/// Writes the decisions whole (a new file renamed over the old), readable by the owner only.
fn save(path: &Path, decisions: &Decisions) -> Result<(), CliError> {
    let at = |e: std::io::Error| CliError::io(path.display().to_string(), e);
    let dir = path
        .parent()
        .ok_or_else(|| CliError::failed(format!("{}: no directory", path.display())))?;
    std::fs::create_dir_all(dir).map_err(at)?;
    let text = serde_json::to_vec_pretty(decisions)
        .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
    let mut tmp = tempfile_in(dir).map_err(at)?;
    tmp.1.write_all(&text).map_err(at)?;
    tmp.1.sync_all().map_err(at)?;
    std::fs::rename(&tmp.0, path).map_err(at)
}

/// A new file in `dir`, readable by its owner only.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = dir.join(format!(".{TRUST_FILE}.{}.{stamp}", std::process::id()));
    options.open(&path).map(|f| (path, f))
}

/// The decisions made in this command (a chat's runs, a workflow's steps), so a file is asked
/// about once, and a note about it is said once (kept in [`Cx`]).
#[derive(Default)]
pub(crate) struct Seen(Mutex<HashMap<FileVersion, (Trust, bool)>>);

/// A file's canonical path and the SHA-256 of its bytes.
type FileVersion = (PathBuf, String);

/// What is known of this version of the file: decided in this process, or remembered.
pub(crate) fn trust_of(cx: &Cx, file: &ProjectFile) -> Trust {
    let key = (file.path.clone(), file.sha256.clone());
    if let Some((t, _)) = cx.trust.0.lock().ok().and_then(|m| m.get(&key).copied()) {
        return t;
    }
    let remembered = decisions_path().and_then(|p| load(&p).ok()).and_then(|d| {
        d.files
            .get(&file.path.to_string_lossy().into_owned())
            .cloned()
    });
    match remembered {
        Some(d) if d.sha256 == file.sha256 && d.trusted => Trust::Trusted,
        Some(d) if d.sha256 == file.sha256 => Trust::Declined,
        _ => Trust::Undecided,
    }
}

/// Notes this process's view of the file; whether a note about it was said before.
pub(crate) fn note(cx: &Cx, file: &ProjectFile, trust: Trust) -> bool {
    let key = (file.path.clone(), file.sha256.clone());
    let Ok(mut seen) = cx.trust.0.lock() else {
        return false;
    };
    let said = seen.get(&key).is_some_and(|(_, said)| *said);
    seen.insert(key, (trust, true));
    said
}

/// How long an update waits for another process's update of the decisions to finish.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Changes the decisions at `path` by `change`, read and written under an exclusive advisory
/// lock (on `<path>.lock`, held until the new file is renamed over the old): two processes
/// trusting files at once both keep their entries. Writes only when `change` says so.
fn update<R>(path: &Path, change: impl FnOnce(&mut Decisions) -> (R, bool)) -> Result<R, CliError> {
    let at = |e: std::io::Error| CliError::io(path.display().to_string(), e);
    let dir = path
        .parent()
        .ok_or_else(|| CliError::failed(format!("{}: no directory", path.display())))?;
    std::fs::create_dir_all(dir).map_err(at)?;
    let _lock = lock(&path.with_extension("json.lock"))?;
    let mut decisions = load(path)?;
    let (out, changed) = change(&mut decisions);
    if changed {
        save(path, &decisions)?;
    }
    Ok(out)
}

/// The exclusive lock on the file at `path` (made when missing, readable by its owner only),
/// released when dropped. Waits up to [`LOCK_WAIT`] for another holder.
fn lock(path: &Path) -> Result<std::fs::File, CliError> {
    let at = |e: std::io::Error| CliError::io(path.display().to_string(), e);
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
    }
    let file = options.open(path).map_err(at)?;
    #[cfg(unix)]
    {
        use rustix::fs::{FlockOperation, flock};
        let started = std::time::Instant::now();
        loop {
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                    if started.elapsed() < LOCK_WAIT =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(CliError::failed(format!(
                        "{}: another toolloop has held the lock for {}s; try again",
                        path.display(),
                        LOCK_WAIT.as_secs()
                    )));
                }
                Err(e) => return Err(at(e.into())),
            }
        }
    }
    Ok(file)
}

/// Remembers a decision about this version of the file.
pub(crate) fn record(cx: &Cx, file: &ProjectFile, trusted: bool) -> Result<PathBuf, CliError> {
    let path = decisions_path().ok_or_else(|| {
        CliError::failed(
            "no data directory to remember the decision in (set HOME or XDG_DATA_HOME)",
        )
    })?;
    record_at(&path, file, trusted)?;
    note(
        cx,
        file,
        if trusted {
            Trust::Trusted
        } else {
            Trust::Declined
        },
    );
    Ok(path)
}

/// Remembers a decision about this version of the file in the decisions at `store`.
fn record_at(store: &Path, file: &ProjectFile, trusted: bool) -> Result<(), CliError> {
    update(store, |decisions| {
        decisions.files.insert(
            file.path.to_string_lossy().into_owned(),
            Decision {
                sha256: file.sha256.clone(),
                trusted,
            },
        );
        ((), true)
    })
}

/// Forgets the decision about the file at `path` (canonical); the decision forgotten.
pub(crate) fn forget(path: &Path) -> Result<Option<Decision>, CliError> {
    let Some(store) = decisions_path() else {
        return Ok(None);
    };
    update(&store, |decisions| {
        let gone = decisions.files.remove(&path.to_string_lossy().into_owned());
        let changed = gone.is_some();
        (gone, changed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads recording decisions about different files at once, each with its own lock file
    /// handle (as separate processes have): every decision is kept.
    #[test]
    fn concurrent_decisions_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("toolloop").join(TRUST_FILE);
        let threads = 8;
        let each = 25;
        let barrier = std::sync::Barrier::new(threads);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (store, barrier) = (&store, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    for i in 0..each {
                        let file = ProjectFile {
                            path: PathBuf::from(format!("/p/{t}/{i}/.mcp.json")),
                            bytes: Vec::new(),
                            sha256: format!("{t}-{i}"),
                        };
                        record_at(store, &file, i % 2 == 0).unwrap();
                    }
                });
            }
        });
        let decisions = load(&store).unwrap();
        assert_eq!(decisions.files.len(), threads * each);
        let d = &decisions.files["/p/3/4/.mcp.json"];
        assert_eq!((d.sha256.as_str(), d.trusted), ("3-4", true));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(store.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
