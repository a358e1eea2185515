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

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::ffi::{OsStr, OsString};
use std::fmt::Display;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Component, Path};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;
use toolloop::approval::Subject;
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, schema_of};

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

/// A path as written, without `.` components, repeated or trailing `/` (`..` stays).
fn lexical(raw: &str) -> String {
    let parts: Vec<&str> = raw
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    match (raw.starts_with('/'), parts.is_empty()) {
        (true, _) => format!("/{}", parts.join("/")),
        (false, true) => ".".into(),
        (false, false) => parts.join("/"),
    }
}

// ---------------------------------------------------------------------------------------------
// Confinement
// ---------------------------------------------------------------------------------------------

mod confine;

use confine::{Found, Handle, Kind, Refusal};

/// The opened root directory and the checks of model-given paths against it.
#[derive(Debug, Clone)]
struct Root {
    inner: confine::Root,
}

impl Root {
    fn new(root: &Path) -> io::Result<Root> {
        let cannot = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("the root `{}` cannot be used: {e}", root.display()),
            )
        };
        let dir = fs::canonicalize(root).map_err(cannot)?;
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("the root `{}` is not a directory", root.display()),
            ));
        }
        Ok(Root {
            inner: confine::Root::open(&dir).map_err(cannot)?,
        })
    }

    /// The canonical path of the root.
    fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn outside(&self, raw: &str, why: impl Display) -> ToolError {
        ToolError::new(format!(
            "path `{raw}` is outside the root `{}`: {why}",
            self.dir().display()
        ))
    }

    /// `path` (under the root) relative to the root, with `/` separators.
    fn rel(&self, path: &Path) -> String {
        let rel = path.strip_prefix(self.dir()).unwrap_or(path);
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.is_empty() {
            ".".into()
        } else {
            parts.join("/")
        }
    }

    /// The components of a path given by the model; refuses absolute paths and `..`.
    fn components<'a>(&self, raw: &'a str) -> Result<Vec<&'a OsStr>, ToolError> {
        let raw_path = Path::new(if raw.is_empty() { "." } else { raw });
        let mut names = Vec::new();
        for component in raw_path.components() {
            match component {
                Component::Prefix(_) | Component::RootDir => {
                    return Err(self.absolute_refusal(raw, raw_path));
                }
                Component::ParentDir => {
                    return Err(self.outside(raw, "`..` is not allowed"));
                }
                Component::CurDir => {}
                Component::Normal(name) => names.push(name),
            }
        }
        Ok(names)
    }

    /// Resolves a path given by the model beneath the root (see the module docs for the
    /// rules). With `create_dirs`, missing parent directories are created on the way.
    fn find(&self, raw: &str, create_dirs: bool) -> Result<Found, ToolError> {
        let names = self.components(raw)?;
        self.inner
            .resolve(&names, create_dirs)
            .map_err(|refusal| self.refused(raw, refusal))
    }

    /// Why the path `raw` was refused, for the model.
    fn refused(&self, raw: &str, refusal: Refusal) -> ToolError {
        match refusal {
            Refusal::Escape { target } => self.outside(
                raw,
                format!(
                    "it resolves through a symbolic link to `{}`",
                    target.display()
                ),
            ),
            Refusal::Missing {
                via_link: Some(link),
                ..
            } => dangling(raw, &link),
            Refusal::Missing {
                rel,
                via_link: None,
            } => self.missing(&rel),
            Refusal::NotADirectory { rel, kind } => ToolError::new(format!(
                "path `{raw}` cannot be used: `{rel}` is {}, not a directory",
                kind.described()
            )),
            Refusal::TooManyLinks => ToolError::new(format!(
                "path `{raw}` cannot be resolved: it goes through too many symbolic links"
            )),
            Refusal::Unstable { rel } => ToolError::new(format!(
                "path `{raw}` cannot be resolved: `{rel}` kept changing while it was looked \
                     up; try again"
            )),
            Refusal::Io { rel, error } => {
                ToolError::new(format!("path `{raw}` cannot be used: `{rel}`: {error}"))
            }
        }
    }

    /// The root-relative path a call on `raw` would touch, resolved as [`Root::find`] does
    /// without creating anything (a missing file or missing directories on the way are named
    /// as they would be created); why not, when it does not resolve to one.
    fn touches(&self, raw: &str) -> Result<String, String> {
        let names = self.components(raw).map_err(|e| e.message)?;
        match self.inner.resolve(&names, false) {
            Ok(Found::Dir { rel, .. } | Found::Entry { rel, .. }) => Ok(rel),
            Ok(Found::Missing {
                rel,
                via_link: None,
                ..
            }) => Ok(rel),
            Err(Refusal::Missing {
                rel,
                via_link: None,
            }) => Ok(rel),
            Ok(Found::Missing {
                via_link: Some(link),
                ..
            })
            | Err(Refusal::Missing {
                via_link: Some(link),
                ..
            }) => Err(dangling(raw, &link).message),
            Err(refusal) => Err(self.refused(raw, refusal).message),
        }
    }

    /// Like [`Root::find`] without creating anything, for a path that must exist.
    fn existing(&self, raw: &str) -> Result<Found, ToolError> {
        match self.find(raw, false)? {
            Found::Missing {
                via_link: Some(link),
                ..
            } => Err(dangling(raw, &link)),
            Found::Missing { rel, .. } => Err(self.missing(&rel)),
            found => Ok(found),
        }
    }

    fn missing(&self, rel: &str) -> ToolError {
        ToolError::new(format!(
            "`{rel}` does not exist in the root `{}`; use list_dir or search_files to find the \
             right path",
            self.dir().display()
        ))
    }

    fn absolute_refusal(&self, raw: &str, raw_path: &Path) -> ToolError {
        // An absolute path inside the root is still refused, but the message shows the fix.
        let inside = raw_path
            .strip_prefix(self.dir())
            .ok()
            .filter(|rest| !rest.components().any(|c| c == Component::ParentDir));
        match inside {
            Some(rest) => ToolError::new(format!(
                "path `{raw}` is refused: absolute paths are not allowed; give it relative to \
                 the root `{}`, as `{}`",
                self.dir().display(),
                self.rel(&self.dir().join(rest))
            )),
            None => self.outside(
                raw,
                "absolute paths are not allowed; give a path relative to the root",
            ),
        }
    }
}

/// A path that goes through `link`, a symbolic link to nothing.
fn dangling(raw: &str, link: &str) -> ToolError {
    let whole = raw.trim_start_matches("./").trim_end_matches('/');
    if whole == link {
        ToolError::new(format!(
            "path `{raw}` is a symbolic link to something that does not exist"
        ))
    } else {
        ToolError::new(format!(
            "path `{raw}` goes through `{link}`, a symbolic link to something that does not exist"
        ))
    }
}

/// A refusal of something that is not a regular file (`what` says what the tool works on).
fn not_regular(rel: &str, kind: Kind, what: &str) -> ToolError {
    ToolError::new(format!(
        "`{rel}` is {}, not a regular file; {what}",
        kind.described()
    ))
}

/// Opens the regular file `name` in `parent` for reading, without following a link and without
/// waiting, and checks by the handle that a regular file is what was opened.
fn open_regular(
    parent: &Handle,
    name: &OsStr,
    rel: &str,
    what: &str,
) -> Result<(fs::File, u64), ToolError> {
    let file = parent
        .open_read(name)
        .map_err(|e| io_error("open", rel, e))?;
    let meta = file.metadata().map_err(|e| io_error("open", rel, e))?;
    let kind = confine::kind_of(&meta.file_type());
    if kind != Kind::File {
        return Err(not_regular(rel, kind, what));
    }
    Ok((file, meta.len()))
}

// ---------------------------------------------------------------------------------------------
// Shared plumbing
// ---------------------------------------------------------------------------------------------

fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::new(format!("the arguments of `{tool}` do not fit: {e}")))
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

// ---------------------------------------------------------------------------------------------
// read_file
// ---------------------------------------------------------------------------------------------

fn default_dot() -> String {
    ".".into()
}

fn default_read_limit() -> usize {
    DEFAULT_READ_LIMIT
}

#[derive(Deserialize, JsonSchema)]
struct ReadFileArgs {
    /// The file to read, relative to the root, with `/` separators.
    #[schemars(example = &"README.md", example = &"src/main.rs")]
    path: String,
    /// How many lines to skip before reading; 0 starts at the first line. To continue a
    /// partial read, pass the `next_offset` of the previous result.
    #[serde(default)]
    offset: usize,
    /// The most lines to return.
    #[serde(default = "default_read_limit")]
    #[schemars(range(min = 1))]
    limit: usize,
}

/// `read_file`: reads lines of a UTF-8 text file under the root.
///
/// Arguments: `path`, `offset` (lines to skip, default 0), `limit` (lines, default
/// [`DEFAULT_READ_LIMIT`]). The output stops at [`READ_MAX_BYTES`] (configurable with
/// [`ReadFile::with_max_bytes`]) and says which `offset` continues it. Binary files (a NUL byte
/// in the first 8 KiB) and text that is not UTF-8 are refused. Parallel-safe, read-only.
#[derive(Debug, Clone)]
pub struct ReadFile {
    root: Root,
    max_bytes: usize,
    parameters: Value,
}

impl ReadFile {
    /// A `read_file` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    fn with_root(root: Root) -> Self {
        ReadFile {
            root,
            max_bytes: READ_MAX_BYTES,
            parameters: schema_of::<ReadFileArgs>(),
        }
    }

    /// Sets the most bytes of text one call returns (at least 1).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn approval_subject(&self, args: &Value) -> Subject {
        path_subject(&self.root, args)
    }
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> &str {
        "Read a UTF-8 text file under the workspace root. Returns `content` (the lines read, \
         newlines kept) with `first_line` and `last_line` (1-based). Reads up to `limit` lines \
         (default 2000) after skipping `offset` lines, and at most 256 KiB per call; when more \
         remains, the result gives `next_offset` to continue. Paths are relative to the root; \
         absolute paths, `..` and links leading outside the root are refused. Binary files are \
         refused."
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn parallel_safe(&self) -> bool {
        true
    }
    fn side_effect(&self) -> SideEffect {
        SideEffect::ReadOnly
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ReadFileArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), &ctx, move |stop| this.read(&args, stop)).await
    }
}

impl ReadFile {
    fn read(&self, args: &ReadFileArgs, stop: &CancellationToken) -> Result<ToolOutput, ToolError> {
        const WHAT: &str = "read_file reads text files only";
        let (file, size, rel) = match self.root.existing(&args.path)? {
            Found::Dir { rel, .. } => {
                return Err(ToolError::new(format!(
                    "`{rel}` is a directory, not a file; use list_dir to see what it holds"
                )));
            }
            Found::Entry {
                parent,
                name,
                meta,
                rel,
            } => {
                // Refused before opening: opening some devices does something by itself.
                if meta.kind != Kind::File {
                    return Err(not_regular(&rel, meta.kind, WHAT));
                }
                let (file, size) = open_regular(&parent, &name, &rel, WHAT)?;
                (file, size, rel)
            }
            Found::Missing { rel, .. } => return Err(self.root.missing(&rel)),
        };
        let rel = rel.as_str();
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        let head = reader.fill_buf().map_err(|e| io_error("read", rel, e))?;
        if looks_binary(head) {
            return Err(ToolError::new(format!(
                "`{rel}` is a binary file ({size} bytes); read_file reads UTF-8 text only"
            )));
        }

        let read_err = |e| io_error("read", rel, e);
        let mut line_no = 0usize; // lines consumed so far
        while line_no < args.offset {
            if skip_line(&mut reader, stop).map_err(read_err)? == 0 {
                break;
            }
            line_no += 1;
        }
        let at_end = |r: &mut BufReader<fs::File>| r.fill_buf().map(<[u8]>::is_empty);
        if args.offset > 0 && at_end(&mut reader).map_err(read_err)? {
            return Err(ToolError::new(format!(
                "offset {} is past the end of `{rel}`, which has {line_no} lines",
                args.offset
            )));
        }

        let limit = args.limit.max(1);
        let mut content = String::new();
        let mut lines = 0usize;
        let mut capped = false;
        let mut cut_line = false;
        let mut buf = Vec::new();
        while lines < limit {
            if stop.is_cancelled() {
                return Err(cancelled("read_file"));
            }
            buf.clear();
            let room = self.max_bytes - content.len();
            let n = (&mut reader)
                .take(room as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(read_err)?;
            if n == 0 {
                break;
            }
            if buf.len() > room {
                capped = true;
                if lines == 0 {
                    // One line longer than the cap: show its head, move past the rest.
                    let head = &buf[..room];
                    let text = match std::str::from_utf8(head) {
                        Ok(s) => s,
                        Err(e) if e.error_len().is_none() => {
                            std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default()
                        }
                        Err(_) => return Err(not_utf8(rel, line_no + 1)),
                    };
                    content.push_str(text);
                    if buf.last() != Some(&b'\n') {
                        skip_line(&mut reader, stop).map_err(read_err)?;
                    }
                    cut_line = true;
                    line_no += 1;
                    lines += 1;
                }
                break;
            }
            let text = std::str::from_utf8(&buf).map_err(|_| not_utf8(rel, line_no + 1))?;
            content.push_str(text);
            line_no += 1;
            lines += 1;
        }
        let more = !at_end(&mut reader).map_err(read_err)?;
        let first_line = args.offset + 1;
        let next_offset = more.then_some(line_no);

        let mut message = if lines == 0 {
            format!("`{rel}` is empty")
        } else {
            format!("`{rel}`: lines {first_line}-{line_no}")
        };
        if cut_line {
            message.push_str(&format!(
                "; line {line_no} is longer than the {} cap, only its start is shown",
                kib(self.max_bytes)
            ));
        } else if capped {
            message.push_str(&format!(
                "; stopped at the {} output cap",
                kib(self.max_bytes)
            ));
        }
        match next_offset {
            Some(next) => message.push_str(&format!(
                "; the file goes on ({size} bytes in all): call read_file again with offset={next}"
            )),
            None if lines > 0 => message.push_str(" (end of file)"),
            None => {}
        }
        Ok(ToolOutput {
            message,
            data: Some(json!({
                "path": rel,
                "content": content,
                "first_line": first_line,
                "last_line": line_no,
                "next_offset": next_offset,
                "size_bytes": size,
                "truncated": capped,
            })),
            ..ToolOutput::default()
        })
    }
}

/// Reads past the next line ending (or to the end of the file); the number of bytes passed.
/// Stops with an error when told to.
fn skip_line(reader: &mut BufReader<fs::File>, stop: &CancellationToken) -> io::Result<usize> {
    let mut passed = 0;
    loop {
        if stop.is_cancelled() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(passed);
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(at) => {
                reader.consume(at + 1);
                return Ok(passed + at + 1);
            }
            None => {
                let n = buf.len();
                reader.consume(n);
                passed += n;
            }
        }
    }
}

fn not_utf8(rel: &str, line: usize) -> ToolError {
    ToolError::new(format!(
        "`{rel}` is not UTF-8 text (line {line} has bytes that are not UTF-8); read_file reads \
         UTF-8 text only"
    ))
}

// ---------------------------------------------------------------------------------------------
// list_dir
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
struct ListDirArgs {
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
    parameters: Value,
}

impl ListDir {
    /// A `list_dir` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    fn with_root(root: Root) -> Self {
        ListDir {
            root,
            parameters: schema_of::<ListDirArgs>(),
        }
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

#[async_trait]
impl Tool for ListDir {
    fn approval_subject(&self, args: &Value) -> Subject {
        path_subject(&self.root, args)
    }
    fn name(&self) -> &str {
        "list_dir"
    }
    fn description(&self) -> &str {
        "List a directory under the workspace root. Each entry has `name`, `kind` (file, dir, \
         symlink or other) and, for files, `size` in bytes; entries are sorted by name. `path` \
         is relative to the root (default `.`, the root itself)."
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn parallel_safe(&self) -> bool {
        true
    }
    fn side_effect(&self) -> SideEffect {
        SideEffect::ReadOnly
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ListDirArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), &ctx, move |stop| this.list(&args, stop)).await
    }
}

// ---------------------------------------------------------------------------------------------
// search_files
// ---------------------------------------------------------------------------------------------

fn default_pattern() -> String {
    "*.md".into()
}

fn default_max_results() -> usize {
    100
}

#[derive(Deserialize, JsonSchema)]
struct SearchFilesArgs {
    /// A glob for file names, such as `*.rs` or `Cargo.toml`. With a `/` it matches the path
    /// from the root instead, such as `src/**/*.rs`. `*` matches every file.
    #[serde(default = "default_pattern")]
    #[schemars(example = &"*.rs", example = &"*")]
    pattern: String,
    /// A regular expression (Rust `regex` syntax) to look for in the content of the files the
    /// glob selects; when given, only files with a matching line are reported, with the
    /// matching lines and their numbers.
    #[schemars(example = &"^#+ ", example = &"fn main")]
    regex: Option<String>,
    /// The directory to search, relative to the root; `.` is the root itself.
    #[serde(default = "default_dot")]
    path: String,
    /// The most files (or, with `regex`, matching lines) to report.
    #[serde(default = "default_max_results")]
    #[schemars(range(min = 1, max = 1000))]
    max_results: usize,
}

/// `search_files`: finds files by name glob and, optionally, lines by content regex.
///
/// Arguments: `pattern` (a [`globset`] glob on the file name, or on the root-relative path
/// when it has a `/`; default `*.md`), `regex` (a [`regex`] searched line by line; optional),
/// `path` (default `.`), `max_results` (default 100, at most [`SEARCH_MAX_RESULTS`]). The walk
/// (the [`ignore`] crate) respects `.gitignore` files, skips `.git`, does not follow directory
/// links and skips links that lead outside the root; every file found is resolved again
/// beneath the root before it is reported or read. A content search skips binary files and
/// files over [`SEARCH_MAX_FILE_BYTES`]. Parallel-safe, read-only; stops when the run is
/// cancelled.
#[derive(Debug, Clone)]
pub struct SearchFiles {
    root: Root,
    parameters: Value,
}

impl SearchFiles {
    /// A `search_files` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    fn with_root(root: Root) -> Self {
        SearchFiles {
            root,
            parameters: schema_of::<SearchFilesArgs>(),
        }
    }

    /// The regular file a path found by the walk names, resolved again beneath the root
    /// (following links that stay inside): its directory and name there.
    fn regular_file(&self, path: &Path) -> Option<(Arc<Handle>, OsString)> {
        let names: Vec<&OsStr> = path
            .strip_prefix(self.root.dir())
            .ok()?
            .components()
            .map(|c| match c {
                Component::Normal(name) => Some(name),
                _ => None,
            })
            .collect::<Option<_>>()?;
        match self.root.inner.resolve(&names, false) {
            Ok(Found::Entry {
                parent, name, meta, ..
            }) if meta.kind == Kind::File => Some((parent, name)),
            _ => None,
        }
    }

    fn search(
        &self,
        args: &SearchFilesArgs,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let start_rel = match self.root.existing(&args.path)? {
            Found::Dir { rel, .. } | Found::Entry { rel, .. } | Found::Missing { rel, .. } => rel,
        };
        let start_path = if start_rel == "." {
            self.root.dir().to_path_buf()
        } else {
            self.root.dir().join(&start_rel)
        };
        let mut builder = globset::GlobBuilder::new(&args.pattern);
        builder.literal_separator(true);
        let glob = toolloop::approval::compile_glob(&builder, &args.pattern).map_err(|e| {
            ToolError::new(format!(
                "pattern `{}` is not a valid glob: {e}",
                toolloop::result::shorten(&args.pattern, 200)
            ))
        })?;
        let on_path = args.pattern.contains('/');
        let regex = match args.regex.as_deref().filter(|r| !r.is_empty()) {
            Some(r) => Some(regex::bytes::RegexBuilder::new(r).build().map_err(|e| {
                ToolError::new(format!(
                    "regex `{r}` is not a valid regular expression: {e}"
                ))
            })?),
            None => None,
        };
        let max = args.max_results.clamp(1, SEARCH_MAX_RESULTS);

        // The walk finds names; each file is then resolved again beneath the root and read by
        // its handle, so a directory swapped for a link during the walk cannot bring in
        // anything from outside.
        let walker = ignore::WalkBuilder::new(&start_path)
            .hidden(false)
            .require_git(false)
            .follow_links(false)
            .sort_by_file_name(|a, b| a.cmp(b))
            .filter_entry(|e| e.file_name() != ".git")
            .build();
        let mut files: Vec<String> = Vec::new();
        let mut matches: Vec<Value> = Vec::new();
        let mut truncated = false;
        let mut skipped = 0usize;
        'walk: for entry in walker {
            if cancel.is_cancelled() {
                return Err(ToolError::new("search_files was cancelled"));
            }
            let Ok(entry) = entry else {
                skipped += 1;
                continue;
            };
            let Some(file_type) = entry.file_type() else {
                continue;
            };
            if !file_type.is_file() && !file_type.is_symlink() {
                continue;
            }
            let path = entry.path();
            let rel = self.root.rel(path);
            let selected = if on_path {
                glob.is_match(&rel)
            } else {
                path.file_name().is_some_and(|name| glob.is_match(name))
            };
            if !selected {
                continue;
            }
            // Links are reported where they are, read where they lead, and only if that stays
            // inside the root.
            let Some((parent, name)) = self.regular_file(path) else {
                continue;
            };
            let Some(regex) = &regex else {
                if files.len() == max {
                    truncated = true;
                    break;
                }
                files.push(rel);
                continue;
            };
            let Some(bytes) = read_for_search(&parent, &name) else {
                skipped += 1;
                continue;
            };
            let mut found = false;
            for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
                if !regex.is_match(line) {
                    continue;
                }
                if matches.len() == max {
                    truncated = true;
                    break 'walk;
                }
                if !found {
                    files.push(rel.clone());
                    found = true;
                }
                matches.push(json!({
                    "path": rel,
                    "line": index + 1,
                    "text": shorten(&String::from_utf8_lossy(line)),
                }));
            }
        }

        let scope = format!("`{}` under `{}`", args.pattern, start_rel);
        let mut message = match &args.regex {
            Some(r) if regex.is_some() => format!(
                "{} matching lines for `{r}` in {} files matching {scope}",
                matches.len(),
                files.len()
            ),
            _ => format!("{} files matching {scope}", files.len()),
        };
        if truncated {
            message.push_str(&format!(
                "; stopped at max_results={max}, narrow the search to see the rest"
            ));
        }
        if skipped > 0 && regex.is_some() {
            message.push_str(&format!(
                "; {skipped} files skipped (binary, unreadable or over 10 MiB)"
            ));
        }
        let mut data = json!({
            "path": start_rel,
            "pattern": args.pattern,
            "files": files,
            "truncated": truncated,
        });
        if regex.is_some() {
            data["matches"] = Value::Array(matches);
        }
        Ok(ToolOutput {
            message,
            data: Some(data),
            ..ToolOutput::default()
        })
    }
}

/// The content of a file for a content search; `None` for binary, oversize or unreadable files.
fn read_for_search(parent: &Handle, name: &OsStr) -> Option<Vec<u8>> {
    let (file, size) = open_regular(parent, name, "", "").ok()?;
    if size > SEARCH_MAX_FILE_BYTES {
        return None;
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(SEARCH_MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > SEARCH_MAX_FILE_BYTES {
        return None;
    }
    (!looks_binary(&bytes)).then_some(bytes)
}

/// A matching line for display: without its line ending, and at most [`MATCH_TEXT_CHARS`].
fn shorten(line: &str) -> String {
    let line = line.trim_end_matches('\r');
    match line.char_indices().nth(MATCH_TEXT_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

#[async_trait]
impl Tool for SearchFiles {
    fn approval_subject(&self, args: &Value) -> Subject {
        path_subject(&self.root, args)
    }
    fn name(&self) -> &str {
        "search_files"
    }
    fn description(&self) -> &str {
        "Find files under a directory of the workspace root. `pattern` is a glob on file names \
         (`*.rs`, `Cargo.toml`; with a `/` it matches the path from the root, as in \
         `src/**/*.rs`). With `regex`, only files containing a matching line are reported, \
         together with each matching line and its 1-based line number. Respects .gitignore and \
         skips .git. Returns at most `max_results` files (or matching lines)."
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn parallel_safe(&self) -> bool {
        true
    }
    fn side_effect(&self) -> SideEffect {
        SideEffect::ReadOnly
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: SearchFilesArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), &ctx, move |stop| this.search(&args, stop)).await
    }
}

// ---------------------------------------------------------------------------------------------
// write_file
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
struct WriteFileArgs {
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
    parameters: Value,
}

impl WriteFile {
    /// A `write_file` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    fn with_root(root: Root) -> Self {
        WriteFile {
            root,
            parameters: schema_of::<WriteFileArgs>(),
        }
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

#[async_trait]
impl Tool for WriteFile {
    fn approval_subject(&self, args: &Value) -> Subject {
        path_subject(&self.root, args)
    }
    fn name(&self) -> &str {
        "write_file"
    }
    fn description(&self) -> &str {
        "Write a UTF-8 text file under the workspace root: `content` becomes the whole file. \
         Creates the file and any missing parent directories, or replaces the file if it \
         exists. Paths are relative to the root; absolute paths, `..` and links leading \
         outside the root are refused."
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn side_effect(&self) -> SideEffect {
        SideEffect::Idempotent
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: WriteFileArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), &ctx, move |stop| this.write(&args, stop)).await
    }
}
