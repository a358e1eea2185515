//! `search_files`: files by glob, and lines by regular expression, under the root.

use super::confine::{Found, Handle, Kind};
use super::root::{Root, open_regular};
use super::{
    FileTool, MATCH_TEXT_CHARS, SEARCH_MAX_FILE_BYTES, SEARCH_MAX_RESULTS, default_dot, file_tool,
    looks_binary,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::path::{Component, Path};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolloop::tool::{SideEffect, ToolError, ToolOutput};

fn default_pattern() -> String {
    "*.md".into()
}

fn default_max_results() -> usize {
    100
}

#[derive(Deserialize, JsonSchema)]
pub(super) struct SearchFilesArgs {
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
}

impl SearchFiles {
    /// A `search_files` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    pub(super) fn with_root(root: Root) -> Self {
        SearchFiles { root }
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

impl FileTool for SearchFiles {
    const NAME: &'static str = "search_files";
    const DESCRIPTION: &'static str = "Find files under a directory of the workspace root. \
         `pattern` is a glob on file names (`*.rs`, `Cargo.toml`; with a `/` it matches the path \
         from the root, as in `src/**/*.rs`). With `regex`, only files containing a matching line \
         are reported, together with each matching line and its 1-based line number. Respects \
         .gitignore and skips .git. Returns at most `max_results` files (or matching lines).";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    type Args = SearchFilesArgs;
    fn root(&self) -> &Root {
        &self.root
    }
    fn run(
        &self,
        args: &SearchFilesArgs,
        stop: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        self.search(args, stop)
    }
}

file_tool!(SearchFiles);
