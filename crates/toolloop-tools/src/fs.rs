//! File-system tools confined to a root directory: `read_file`, `list_dir`, `search_files` and
//! `write_file`, the built-in tools of the `toolloop` command.
//!
//! Every path a model gives is relative to the root. A path is refused, with a message that says
//! what was refused and why, when it is absolute, when it has a `..` component, or when it
//! resolves through a symbolic link (anywhere along the path) to somewhere outside the root.
//! The root is canonicalized once; an existing path is canonicalized and must stay under it; a
//! path that does not exist yet (for `write_file`) is checked through its nearest existing
//! ancestor. Symbolic links that stay inside the root work as usual.
//!
//! The checks happen just before the file is used; a process that swaps a directory for a
//! symbolic link between the check and the use is outside what these tools guard against.
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
use std::fmt::Display;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
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

// ---------------------------------------------------------------------------------------------
// Confinement
// ---------------------------------------------------------------------------------------------

/// A canonical root directory and the path checks against it.
#[derive(Debug, Clone)]
struct Root {
    dir: PathBuf,
}

/// A path that passed the checks.
#[derive(Debug)]
struct Resolved {
    /// Where to act: the canonical path, or for a path that does not exist yet, the canonical
    /// nearest existing ancestor joined with the rest.
    path: PathBuf,
    /// The path relative to the root, with `/` separators (`.` for the root itself).
    rel: String,
    /// Whether the path existed when it was checked.
    exists: bool,
}

impl Root {
    fn new(root: &Path) -> io::Result<Root> {
        let dir = fs::canonicalize(root).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the root `{}` cannot be used: {e}", root.display()),
            )
        })?;
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("the root `{}` is not a directory", root.display()),
            ));
        }
        Ok(Root { dir })
    }

    fn outside(&self, raw: &str, why: impl Display) -> ToolError {
        ToolError::new(format!(
            "path `{raw}` is outside the root `{}`: {why}",
            self.dir.display()
        ))
    }

    /// `path` (under the root) relative to the root, with `/` separators.
    fn rel(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.dir).unwrap_or(path);
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

    /// Checks a path given by the model; see the module docs for the rules.
    fn resolve(&self, raw: &str) -> Result<Resolved, ToolError> {
        let raw_path = Path::new(if raw.is_empty() { "." } else { raw });
        for component in raw_path.components() {
            match component {
                Component::Prefix(_) | Component::RootDir => {
                    return Err(self.absolute_refusal(raw, raw_path));
                }
                Component::ParentDir => {
                    return Err(self.outside(raw, "`..` is not allowed"));
                }
                Component::CurDir | Component::Normal(_) => {}
            }
        }
        let full = self.dir.join(raw_path);
        match fs::symlink_metadata(&full) {
            Ok(_) => {
                let canonical = fs::canonicalize(&full).map_err(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        ToolError::new(format!(
                            "path `{raw}` is a symbolic link to something that does not exist"
                        ))
                    } else {
                        ToolError::new(format!("path `{raw}` cannot be resolved: {e}"))
                    }
                })?;
                self.check_inside(raw, &canonical)?;
                Ok(Resolved {
                    rel: self.rel(&canonical),
                    path: canonical,
                    exists: true,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The nearest ancestor that exists decides where a new file would land.
                let mut ancestor = full.as_path();
                loop {
                    match ancestor.parent() {
                        Some(parent) => ancestor = parent,
                        None => {
                            return Err(ToolError::new(format!(
                                "path `{raw}` cannot be resolved: no part of it exists"
                            )));
                        }
                    }
                    if fs::symlink_metadata(ancestor).is_ok() {
                        break;
                    }
                }
                let canonical = fs::canonicalize(ancestor).map_err(|e| {
                    let shown = self.rel(ancestor);
                    if e.kind() == io::ErrorKind::NotFound {
                        ToolError::new(format!(
                            "path `{raw}` goes through `{shown}`, a symbolic link to something \
                             that does not exist"
                        ))
                    } else {
                        ToolError::new(format!("path `{raw}` cannot be resolved: {e}"))
                    }
                })?;
                self.check_inside(raw, &canonical)?;
                let rest = full.strip_prefix(ancestor).unwrap_or(Path::new(""));
                let path = canonical.join(rest);
                Ok(Resolved {
                    rel: self.rel(&path),
                    path,
                    exists: false,
                })
            }
            Err(e) => Err(ToolError::new(format!("path `{raw}` cannot be used: {e}"))),
        }
    }

    fn absolute_refusal(&self, raw: &str, raw_path: &Path) -> ToolError {
        // An absolute path inside the root is still refused, but the message shows the fix.
        let inside = raw_path
            .strip_prefix(&self.dir)
            .ok()
            .filter(|rest| !rest.components().any(|c| c == Component::ParentDir));
        match inside {
            Some(rest) => ToolError::new(format!(
                "path `{raw}` is refused: absolute paths are not allowed; give it relative to \
                 the root `{}`, as `{}`",
                self.dir.display(),
                self.rel(&self.dir.join(rest))
            )),
            None => self.outside(
                raw,
                "absolute paths are not allowed; give a path relative to the root",
            ),
        }
    }

    fn check_inside(&self, raw: &str, canonical: &Path) -> Result<(), ToolError> {
        if canonical.starts_with(&self.dir) {
            Ok(())
        } else {
            Err(self.outside(
                raw,
                format!(
                    "it resolves through a symbolic link to `{}`",
                    canonical.display()
                ),
            ))
        }
    }

    fn existing(&self, raw: &str) -> Result<Resolved, ToolError> {
        let resolved = self.resolve(raw)?;
        if resolved.exists {
            Ok(resolved)
        } else {
            Err(ToolError::new(format!(
                "`{}` does not exist in the root `{}`; use list_dir or search_files to find \
                 the right path",
                resolved.rel,
                self.dir.display()
            )))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared plumbing
// ---------------------------------------------------------------------------------------------

fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::new(format!("the arguments of `{tool}` do not fit: {e}")))
}

/// Runs blocking file-system work off the async threads.
async fn blocking<F>(tool: &str, work: F) -> Result<ToolOutput, ToolError>
where
    F: FnOnce() -> Result<ToolOutput, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(ToolError::new(format!(
            "`{tool}` stopped unexpectedly: {e}"
        )))
    })
}

fn io_error(what: &str, rel: &str, e: io::Error) -> ToolError {
    ToolError::new(format!("cannot {what} `{rel}`: {e}"))
}

fn looks_binary(head: &[u8]) -> bool {
    head[..head.len().min(SNIFF_BYTES)].contains(&0)
}

fn kib(bytes: usize) -> String {
    if bytes % 1024 == 0 {
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
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ReadFileArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), move || this.read(&args)).await
    }
}

impl ReadFile {
    fn read(&self, args: &ReadFileArgs) -> Result<ToolOutput, ToolError> {
        let target = self.root.existing(&args.path)?;
        let rel = target.rel.as_str();
        let meta = fs::metadata(&target.path).map_err(|e| io_error("read", rel, e))?;
        if meta.is_dir() {
            return Err(ToolError::new(format!(
                "`{rel}` is a directory, not a file; use list_dir to see what it holds"
            )));
        }
        if !meta.is_file() {
            return Err(ToolError::new(format!(
                "`{rel}` is not a regular file; read_file reads text files only"
            )));
        }
        let size = meta.len();
        let file = fs::File::open(&target.path).map_err(|e| io_error("open", rel, e))?;
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
            if reader.skip_until(b'\n').map_err(read_err)? == 0 {
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
                        reader.skip_until(b'\n').map_err(read_err)?;
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
            signal: None,
        })
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

    fn list(&self, args: &ListDirArgs) -> Result<ToolOutput, ToolError> {
        let target = self.root.existing(&args.path)?;
        let rel = target.rel.as_str();
        if !target.path.is_dir() {
            return Err(ToolError::new(format!(
                "`{rel}` is a file, not a directory; use read_file to read it"
            )));
        }
        let mut entries = Vec::new();
        for entry in fs::read_dir(&target.path).map_err(|e| io_error("list", rel, e))? {
            let entry = entry.map_err(|e| io_error("list", rel, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let (kind, size) = match entry.metadata() {
                Ok(m) if m.is_symlink() => ("symlink", None),
                Ok(m) if m.is_dir() => ("dir", None),
                Ok(m) if m.is_file() => ("file", Some(m.len())),
                _ => ("other", None),
            };
            entries.push((name, kind, size));
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
            signal: None,
        })
    }
}

#[async_trait]
impl Tool for ListDir {
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
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ListDirArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), move || this.list(&args)).await
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
/// links and skips links that lead outside the root. A content search skips binary files and
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

    fn search(
        &self,
        args: &SearchFilesArgs,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let start = self.root.existing(&args.path)?;
        let glob = globset::GlobBuilder::new(&args.pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| {
                ToolError::new(format!(
                    "pattern `{}` is not a valid glob: {e}",
                    args.pattern
                ))
            })?
            .compile_matcher();
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

        let walker = ignore::WalkBuilder::new(&start.path)
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
            let path = entry.path();
            let source = if file_type.is_symlink() {
                // Links are reported where they are, read where they lead, and only if that
                // stays inside the root.
                match fs::canonicalize(path) {
                    Ok(target) if target.starts_with(&self.root.dir) && target.is_file() => target,
                    _ => continue,
                }
            } else if file_type.is_file() {
                path.to_path_buf()
            } else {
                continue;
            };
            let rel = self.root.rel(path);
            let selected = if on_path {
                glob.is_match(&rel)
            } else {
                path.file_name().is_some_and(|name| glob.is_match(name))
            };
            if !selected {
                continue;
            }
            let Some(regex) = &regex else {
                if files.len() == max {
                    truncated = true;
                    break;
                }
                files.push(rel);
                continue;
            };
            let Some(bytes) = read_for_search(&source) else {
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

        let scope = format!("`{}` under `{}`", args.pattern, start.rel);
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
            "path": start.rel,
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
            signal: None,
        })
    }
}

/// The content of a file for a content search; `None` for binary, oversize or unreadable files.
fn read_for_search(path: &Path) -> Option<Vec<u8>> {
    let meta = fs::metadata(path).ok()?;
    if meta.len() > SEARCH_MAX_FILE_BYTES {
        return None;
    }
    let bytes = fs::read(path).ok()?;
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
        let cancel = ctx.cancel.clone();
        blocking(self.name(), move || this.search(&args, &cancel)).await
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
/// Arguments: `path`, `content`. Replaces an existing file; writing content the file already
/// has changes nothing. Not parallel-safe; idempotent.
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

    fn write(&self, args: &WriteFileArgs) -> Result<ToolOutput, ToolError> {
        let target = self.root.resolve(&args.path)?;
        let rel = target.rel.as_str();
        let bytes = args.content.len();
        if target.exists {
            if target.path.is_dir() {
                return Err(ToolError::new(format!(
                    "`{rel}` is a directory; write_file writes files only"
                )));
            }
            if fs::read(&target.path).is_ok_and(|old| old == args.content.as_bytes()) {
                return Ok(ToolOutput {
                    message: format!("`{rel}` already has this content ({bytes} bytes)"),
                    data: Some(json!({
                        "path": rel, "bytes": bytes, "created": false, "changed": false,
                    })),
                    signal: None,
                });
            }
        } else if let Some(parent) = target.path.parent() {
            fs::create_dir_all(parent).map_err(|e| {
                ToolError::new(format!(
                    "cannot create the parent directories of `{rel}`: {e}"
                ))
            })?;
        }
        fs::write(&target.path, &args.content).map_err(|e| io_error("write", rel, e))?;
        let verb = if target.exists { "replaced" } else { "created" };
        Ok(ToolOutput {
            message: format!("{verb} `{rel}` ({bytes} bytes)"),
            data: Some(json!({
                "path": rel, "bytes": bytes, "created": !target.exists, "changed": true,
            })),
            signal: None,
        })
    }
}

#[async_trait]
impl Tool for WriteFile {
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
    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: WriteFileArgs = parse_args(self.name(), args)?;
        let this = self.clone();
        blocking(self.name(), move || this.write(&args)).await
    }
}
