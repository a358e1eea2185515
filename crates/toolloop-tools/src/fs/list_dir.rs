//! `list_dir`: a directory's entries.

use super::confine::{Found, Kind};
use super::root::Root;
use super::{FileTool, LIST_MAX_ENTRIES, cancelled, default_dot, file_tool, io_error};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::io;
use std::path::Path;
use tokio_util::sync::CancellationToken;
use toolloop::tool::{SideEffect, ToolError, ToolOutput};

#[derive(Deserialize, JsonSchema)]
pub(super) struct ListDirArgs {
    /// The directory to list, relative to the root; `.` is the root itself.
    #[serde(default = "default_dot")]
    #[schemars(example = &"src")]
    path: String,
}

/// `list_dir`: lists a directory under the root.
///
/// Argument: `path` (default `.`). Each entry has `name`, `kind` (`file`, `dir`, `symlink` or
/// `other`) and, for files, `size` in bytes; entries are sorted by name, at most
/// [`LIST_MAX_ENTRIES`]. Symbolic links are listed, not followed. Parallel-safe, read-only.
#[derive(Debug, Clone)]
pub struct ListDir {
    root: Root,
}

impl ListDir {
    /// A `list_dir` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    pub(super) fn with_root(root: Root) -> Self {
        ListDir { root }
    }

    fn list(&self, args: &ListDirArgs, stop: &CancellationToken) -> Result<ToolOutput, ToolError> {
        let (dir, rel) = match self.root.existing(&args.path)? {
            Found::Dir { dir, rel } => (dir, rel),
            Found::Entry { meta, rel, .. } if meta.kind == Kind::File => {
                return Err(ToolError::new(format!(
                    "`{rel}` is a file, not a directory; use read_file to read it"
                )));
            }
            Found::Entry { meta, rel, .. } => {
                return Err(ToolError::new(format!(
                    "`{rel}` is {}, not a directory",
                    meta.kind.described()
                )));
            }
            Found::Missing { rel, .. } => return Err(self.root.missing(&rel)),
        };
        let rel = rel.as_str();
        // Listed by the handle: what is listed is the directory that was resolved.
        let mut entries = Vec::new();
        for name in dir.names().map_err(|e| io_error("list", rel, e))? {
            if stop.is_cancelled() {
                return Err(cancelled("list_dir"));
            }
            let (kind, size) = match dir.lstat(&name).map(|m| (m.kind, m.len)) {
                Ok((Kind::Symlink, _)) => ("symlink", None),
                Ok((Kind::Dir, _)) => ("dir", None),
                Ok((Kind::File, len)) => ("file", Some(len)),
                _ => ("other", None),
            };
            entries.push((name.to_string_lossy().into_owned(), kind, size));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let total = entries.len();
        let truncated = total > LIST_MAX_ENTRIES;
        entries.truncate(LIST_MAX_ENTRIES);
        let count = |k: &str| entries.iter().filter(|e| e.1 == k).count();
        let mut message = format!(
            "`{rel}`: {total} entries ({} dirs, {} files, {} symlinks)",
            count("dir"),
            count("file"),
            count("symlink")
        );
        if truncated {
            message.push_str(&format!("; only the first {LIST_MAX_ENTRIES} are listed"));
        }
        let listed: Vec<Value> = entries
            .into_iter()
            .map(|(name, kind, size)| match size {
                Some(size) => json!({"name": name, "kind": kind, "size": size}),
                None => json!({"name": name, "kind": kind}),
            })
            .collect();
        Ok(ToolOutput {
            message,
            data: Some(json!({
                "path": rel,
                "entries": listed,
                "total": total,
                "truncated": truncated,
            })),
            ..ToolOutput::default()
        })
    }
}

impl FileTool for ListDir {
    const NAME: &'static str = "list_dir";
    const DESCRIPTION: &'static str = "List a directory under the workspace root. Each entry has \
         `name`, `kind` (file, dir, symlink or other) and, for files, `size` in bytes; entries are \
         sorted by name. `path` is relative to the root (default `.`, the root itself).";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    type Args = ListDirArgs;
    fn root(&self) -> &Root {
        &self.root
    }
    fn run(&self, args: &ListDirArgs, stop: &CancellationToken) -> Result<ToolOutput, ToolError> {
        self.list(args, stop)
    }
}

file_tool!(ListDir);
