//! File-system tools confined to a root directory: `read_file`, `list_dir`, `search_files` and
//! `write_file`, the built-in tools of the `toolloop` command.
//!
//! Every path a model gives is relative to the root. A path is refused, with a message that says
//! what was refused and why, when it is absolute, when it has a `..` component, or when it
//! resolves through a symbolic link (anywhere along the path) to somewhere outside the root.
//! Symbolic links that stay inside the root work as usual.
//!
//! The root is opened once, and every path is resolved beneath it by directory handles: one
//! component at a time, each opened relative to the directory before it without following
//! links (`openat` with `O_NOFOLLOW` on Unix), each link met read and its target resolved the
//! same way. Files are read through the handle that was checked, and listings are read from
//! the handle of the directory. A process that swaps a directory for a link to outside while
//! calls run therefore cannot make a tool read, list or write anything outside the root: the
//! swapped-in link is checked like any other. `search_files` walks names with the [`ignore`]
//! crate and resolves each file it reports or reads again beneath the root.
//!
//! Only regular files are read or written: a FIFO, socket or device is refused without
//! waiting on it. `write_file` replaces a file atomically: the content goes to a new file in
//! the same directory (created exclusively, never through a link), is flushed, gets the
//! permission bits and owner of the file it replaces, and is renamed over it; the old file is
//! not read. A new file does not replace a link planted at its name meanwhile. The tools stop
//! when the run is cancelled or out of time, and the call returns at once.
//!
//! Limits: a hard link inside the root to a file outside is the same file, and `read_file`
//! and `search_files` read it (`write_file` replaces the link and leaves the outside file
//! alone); replacing a file gives it a new identity, so other hard links to it keep the old
//! content. A process killed during a write may leave a `.toolloop-*.tmp` file next to the
//! target. `.gitignore` files are read by path, so a concurrent swap can change which files a
//! search skips, never what it returns. On systems other than Unix, paths are checked
//! component by component just before use, which follows the same rules but does not hold
//! against a concurrent swap.
//!
//! Each tool is a module of its own (`read_file`, `list_dir`, `search_files`, `write_file`);
//! `root` checks a model's paths against the root, and `confine` resolves them beneath it by
//! directory handles.
//!
//! ```
//! use toolloop_tools::fs::builtin_tools;
//!
//! let dir = tempfile::tempdir()?;
//! let tools = builtin_tools(dir.path(), false)?;
//! let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
//! assert_eq!(names, ["read_file", "list_dir", "search_files"]);
//! let tools = builtin_tools(dir.path(), true)?;
//! assert_eq!(tools.last().map(|t| t.name()), Some("write_file"));
//! # Ok::<(), std::io::Error>(())
//! ```

mod confine;
mod list_dir;
mod read_file;
mod root;
mod search_files;
mod write_file;

pub use list_dir::ListDir;
pub use read_file::ReadFile;
pub use search_files::SearchFiles;
pub use write_file::WriteFile;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolloop::approval::Subject;
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};

use root::{Root, lexical};

/// The most text `read_file` returns in one call (256 KiB); longer files are read in pages.
pub const READ_MAX_BYTES: usize = 256 * 1024;
/// The number of lines `read_file` returns when the call gives no `limit`.
pub const DEFAULT_READ_LIMIT: usize = 2000;
/// The most entries `list_dir` returns.
pub const LIST_MAX_ENTRIES: usize = 1000;
/// The highest `max_results` `search_files` accepts.
pub const SEARCH_MAX_RESULTS: usize = 1000;
/// Files larger than this are skipped by a `search_files` content search.
pub const SEARCH_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

/// How many leading bytes are checked for NUL to tell binary files from text.
const SNIFF_BYTES: usize = 8 * 1024;
/// Matching lines longer than this (in characters) are shortened in `search_files` results.
const MATCH_TEXT_CHARS: usize = 300;

/// All the built-in file tools for `root`: `read_file`, `list_dir`, `search_files`, and
/// `write_file` when `allow_write` is true.
///
/// Fails when `root` does not exist or is not a directory.
pub fn builtin_tools(root: &Path, allow_write: bool) -> io::Result<Vec<Arc<dyn Tool>>> {
    let root = Root::new(root)?;
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(ReadFile::with_root(root.clone())),
        Arc::new(ListDir::with_root(root.clone())),
        Arc::new(SearchFiles::with_root(root.clone())),
    ];
    if allow_write {
        tools.push(Arc::new(WriteFile::with_root(root)));
    }
    Ok(tools)
}

/// A file tool's approval subject (what `--deny 'write_file:*.lock'` matches): the
/// root-relative path the call will touch, as the tool resolves it (`.`, `//` and a trailing
/// `/` worked out, symbolic links followed), with the path as given, and as written without
/// `.` and `//`, beside it. A path that does not resolve beneath the root (outside it, through
/// a dangling link, refused) is uncertain: every `deny` and `ask` rule of the tool matches it.
/// Without a `path`, the canonical arguments.
fn path_subject(root: &Root, args: &Value) -> Subject {
    let raw = match args.get("path") {
        Some(Value::String(p)) => p.as_str(),
        // The tools' default path.
        None => ".",
        Some(_) => return toolloop::message::canonical_json(args).into(),
    };
    let written = lexical(raw);
    match root.touches(raw) {
        Ok(rel) => Subject::new(rel).alias(written).alias(raw),
        Err(why) => Subject::new(written).alias(raw).uncertain(format!(
            "the path `{raw}` does not resolve beneath the root: {why}"
        )),
    }
}

/// What makes one file tool: its name, description and side effect, its arguments, and the
/// blocking work of a call. [`file_tool!`] makes the [`Tool`] of a type from this, the same for
/// every file tool: the approval subject is the path the call touches ([`path_subject`]), the
/// schema is the arguments' ([`schema_of`]), read-only tools are parallel-safe, and a call
/// parses its arguments and runs the work off the async threads ([`blocking`]).
trait FileTool: Clone + Send + Sync + 'static {
    /// The name the model uses.
    const NAME: &'static str;
    /// What the tool does, for the model.
    const DESCRIPTION: &'static str;
    /// What a call changes; a read-only tool is also parallel-safe.
    const SIDE_EFFECT: SideEffect;
    /// The arguments of a call.
    type Args: DeserializeOwned + JsonSchema + Send + 'static;
    /// The root the tool is confined to.
    fn root(&self) -> &Root;
    /// The work of one call, on a blocking thread; stops when `stop` is cancelled.
    fn run(&self, args: &Self::Args, stop: &CancellationToken) -> Result<ToolOutput, ToolError>;
}

/// The [`Tool`] of a [`FileTool`]. A macro only because `Tool` is another crate's trait: one
/// generic `impl<T: FileTool> Tool for T` is not allowed.
macro_rules! file_tool {
    ($tool:ty) => {
        #[async_trait::async_trait]
        impl toolloop::tool::Tool for $tool {
            fn approval_subject(&self, args: &serde_json::Value) -> toolloop::approval::Subject {
                $crate::fs::path_subject(<Self as $crate::fs::FileTool>::root(self), args)
            }
            fn name(&self) -> &str {
                <Self as $crate::fs::FileTool>::NAME
            }
            fn description(&self) -> &str {
                <Self as $crate::fs::FileTool>::DESCRIPTION
            }
            fn parameters(&self) -> &serde_json::Value {
                static PARAMETERS: std::sync::OnceLock<serde_json::Value> =
                    std::sync::OnceLock::new();
                PARAMETERS
                    .get_or_init(toolloop::tool::schema_of::<<Self as $crate::fs::FileTool>::Args>)
            }
            fn parallel_safe(&self) -> bool {
                <Self as $crate::fs::FileTool>::SIDE_EFFECT == toolloop::tool::SideEffect::ReadOnly
            }
            fn side_effect(&self) -> toolloop::tool::SideEffect {
                <Self as $crate::fs::FileTool>::SIDE_EFFECT
            }
            async fn call(
                &self,
                args: serde_json::Value,
                ctx: toolloop::tool::ToolContext,
            ) -> Result<toolloop::tool::ToolOutput, toolloop::tool::ToolError> {
                $crate::fs::call(self, args, ctx).await
            }
        }
    };
}
use file_tool;

/// A file tool's call: its arguments parsed, its work run by [`blocking`].
async fn call<T: FileTool>(
    tool: &T,
    args: Value,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let args: T::Args = serde_json::from_value(args)
        .map_err(|e| ToolError::new(format!("the arguments of `{}` do not fit: {e}", T::NAME)))?;
    let tool = tool.clone();
    blocking(T::NAME, &ctx, move |stop| tool.run(&args, stop)).await
}

/// Runs blocking file-system work off the async threads.
///
/// The call returns as soon as the run is cancelled or its deadline passes, without waiting
/// for the work; the work is then told to stop (through the token it is given) and stops at
/// its next check. The work is also told to stop when the call is dropped (a tool timeout).
async fn blocking<F>(tool: &str, ctx: &ToolContext, work: F) -> Result<ToolOutput, ToolError>
where
    F: FnOnce(&CancellationToken) -> Result<ToolOutput, ToolError> + Send + 'static,
{
    let stop = ctx.cancel.child_token();
    let _stop_when_done = stop.clone().drop_guard();
    let worker_stop = stop.clone();
    let worker = tokio::task::spawn_blocking(move || work(&worker_stop));
    let deadline = async {
        match ctx.deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        joined = worker => joined.unwrap_or_else(|e| {
            Err(ToolError::new(format!("`{tool}` stopped unexpectedly: {e}")))
        }),
        _ = stop.cancelled() => Err(ToolError::new(format!("`{tool}` was cancelled"))),
        _ = deadline => Err(ToolError::new(format!(
            "`{tool}` was stopped: the run's time is up"
        ))),
    }
}

/// The error of work that noticed it was told to stop.
fn cancelled(tool: &str) -> ToolError {
    ToolError::new(format!("{tool} was cancelled"))
}

fn io_error(what: &str, rel: &str, e: io::Error) -> ToolError {
    ToolError::new(format!("cannot {what} `{rel}`: {e}"))
}

fn looks_binary(head: &[u8]) -> bool {
    head[..head.len().min(SNIFF_BYTES)].contains(&0)
}

fn kib(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} bytes")
    }
}

// read_file

fn default_dot() -> String {
    ".".into()
}
