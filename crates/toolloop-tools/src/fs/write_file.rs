//! `write_file`: a file replaced atomically (or created), never through a link.

use super::confine::{Found, Handle, Kind};
use super::root::{Root, dangling, not_regular, open_regular};
use super::{FileTool, cancelled, confine, file_tool, io_error};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;
use toolloop::tool::{SideEffect, ToolError, ToolOutput};

#[derive(Deserialize, JsonSchema)]
pub(super) struct WriteFileArgs {
    /// The file to write, relative to the root, with `/` separators. Missing parent
    /// directories are created.
    #[schemars(example = &"notes/hello.txt")]
    path: String,
    /// The complete new content of the file (UTF-8 text).
    #[schemars(example = &"Hello from toolloop.\n")]
    content: String,
}

/// `write_file`: writes a UTF-8 text file under the root, creating missing parent directories.
///
/// Arguments: `path`, `content`. Replaces an existing regular file atomically (a new file
/// renamed over it, with its permission bits and owner), without reading it; writing content
/// the file already has changes nothing. FIFOs, sockets and devices are refused. Not
/// parallel-safe; idempotent.
#[derive(Debug, Clone)]
pub struct WriteFile {
    root: Root,
}

impl WriteFile {
    /// A `write_file` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    pub(super) fn with_root(root: Root) -> Self {
        WriteFile { root }
    }

    fn write(
        &self,
        args: &WriteFileArgs,
        stop: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let content = args.content.as_bytes();
        let bytes = content.len();
        // A new file is put in place only if nothing took its name meanwhile; if something
        // did, the path is resolved again (a link planted there is then checked like any link).
        for _ in 0..WRITE_ATTEMPTS {
            let (parent, name, rel, existing) = match self.root.find(&args.path, true)? {
                Found::Dir { rel, .. } => {
                    return Err(ToolError::new(format!(
                        "`{rel}` is a directory; write_file writes files only"
                    )));
                }
                Found::Entry { meta, rel, .. } if meta.kind != Kind::File => {
                    return Err(not_regular(
                        &rel,
                        meta.kind,
                        "write_file writes regular files only",
                    ));
                }
                Found::Entry {
                    parent,
                    name,
                    meta,
                    rel,
                } => (parent, name, rel, Some(meta)),
                Found::Missing {
                    via_link: Some(link),
                    ..
                } => return Err(dangling(&args.path, &link)),
                Found::Missing {
                    parent, name, rel, ..
                } => (parent, name, rel, None),
            };
            let rel = rel.as_str();
            // Only a file of the same size can already have this content, and then only these
            // many bytes are compared.
            if let Some(meta) = existing
                && meta.len == bytes as u64
                && has_content(&parent, &name, content, stop)
            {
                return Ok(ToolOutput {
                    message: format!("`{rel}` already has this content ({bytes} bytes)"),
                    data: Some(json!({
                        "path": rel, "bytes": bytes, "created": false, "changed": false,
                    })),
                    ..ToolOutput::default()
                });
            }
            match replace(&parent, &name, content, existing, stop) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) if stop.is_cancelled() => {
                    let _ = e;
                    return Err(cancelled("write_file"));
                }
                Err(e) => return Err(io_error("write", rel, e)),
            }
            let (verb, created) = match existing {
                Some(_) => ("replaced", false),
                None => ("created", true),
            };
            return Ok(ToolOutput {
                message: format!("{verb} `{rel}` ({bytes} bytes)"),
                data: Some(json!({
                    "path": rel, "bytes": bytes, "created": created, "changed": true,
                })),
                ..ToolOutput::default()
            });
        }
        Err(ToolError::new(format!(
            "path `{}` kept changing while it was written; try again",
            args.path
        )))
    }
}

/// How many times `write_file` resolves a path again when its target changed meanwhile.
const WRITE_ATTEMPTS: usize = 4;

/// Whether the regular file `name` in `parent` holds exactly `content`; reads no more than
/// `content.len() + 1` bytes of it.
fn has_content(parent: &Handle, name: &OsStr, content: &[u8], stop: &CancellationToken) -> bool {
    let Ok((file, size)) = open_regular(parent, name, "", "") else {
        return false;
    };
    if size != content.len() as u64 {
        return false;
    }
    let mut reader = BufReader::with_capacity(64 * 1024, file.take(size + 1));
    let mut at = 0usize;
    loop {
        if stop.is_cancelled() {
            return false;
        }
        let Ok(buf) = reader.fill_buf() else {
            return false;
        };
        if buf.is_empty() {
            return at == content.len();
        }
        let n = buf.len();
        if content.get(at..at + n) != Some(buf) {
            return false;
        }
        at += n;
        reader.consume(n);
    }
}

/// Puts `content` in place as `name` in `parent`, atomically: it is written to a new file in
/// the same directory (created exclusively, never through a link), flushed to disk, given the
/// permission bits (and, where allowed, the owner) of the file it replaces, then renamed over
/// `name`. When `existing` is `None`, the rename does not replace anything that appeared
/// meanwhile and `Ok(false)` says so. Nothing is left behind on failure or cancellation.
fn replace(
    parent: &Handle,
    name: &OsStr,
    content: &[u8],
    existing: Option<confine::Meta>,
    stop: &CancellationToken,
) -> io::Result<bool> {
    // Created with the permission bits it will have (or narrower, by the umask), so the new
    // content is never more visible than the old was.
    let mode = existing.map_or(0o666, |meta| meta.mode & 0o777);
    let (temp_name, mut file) = create_temp(parent, mode)?;
    let temp = TempFile {
        parent,
        name: &temp_name,
    };
    for chunk in content.chunks(1024 * 1024) {
        if stop.is_cancelled() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        file.write_all(chunk)?;
    }
    #[cfg(unix)]
    if let Some(meta) = existing {
        use std::os::unix::fs::PermissionsExt;
        if let Some((uid, gid)) = meta.owner {
            // Only a privileged process may give a file away; otherwise it stays ours.
            let _ = std::os::unix::fs::fchown(&file, Some(uid), Some(gid));
        }
        file.set_permissions(fs::Permissions::from_mode(meta.mode & 0o777))?;
    }
    file.sync_all()?;
    drop(file);
    if stop.is_cancelled() {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
    }
    match parent.rename(&temp_name, name, existing.is_some()) {
        Ok(()) => {
            std::mem::forget(temp);
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// A temporary file in `parent`, created exclusively under a fresh name.
fn create_temp(parent: &Handle, mode: u32) -> io::Result<(OsString, fs::File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut last = None;
    for _ in 0..16 {
        let name = OsString::from(format!(
            ".toolloop-{}-{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match parent.create_new(&name, mode) {
            Ok(file) => return Ok((name, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

/// Removes a temporary file when dropped (unless forgotten once renamed into place).
struct TempFile<'a> {
    parent: &'a Handle,
    name: &'a OsStr,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        let _ = self.parent.remove_file(self.name);
    }
}

impl FileTool for WriteFile {
    const NAME: &'static str = "write_file";
    const DESCRIPTION: &'static str = "Write a UTF-8 text file under the workspace root: `content` \
         becomes the whole file. Creates the file and any missing parent directories, or replaces \
         the file if it exists. Paths are relative to the root; absolute paths, `..` and links \
         leading outside the root are refused.";
    const SIDE_EFFECT: SideEffect = SideEffect::Idempotent;
    type Args = WriteFileArgs;
    fn root(&self) -> &Root {
        &self.root
    }
    fn run(&self, args: &WriteFileArgs, stop: &CancellationToken) -> Result<ToolOutput, ToolError> {
        self.write(args, stop)
    }
}

file_tool!(WriteFile);
