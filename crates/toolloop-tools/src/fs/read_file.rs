//! `read_file`: a text file's lines, in pages.

use super::confine::{Found, Kind};
use super::root::{Root, not_regular, open_regular};
use super::{
    DEFAULT_READ_LIMIT, FileTool, READ_MAX_BYTES, cancelled, file_tool, io_error, kib, looks_binary,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use tokio_util::sync::CancellationToken;
use toolloop::tool::{SideEffect, ToolError, ToolOutput};

fn default_read_limit() -> usize {
    DEFAULT_READ_LIMIT
}

#[derive(Deserialize, JsonSchema)]
pub(super) struct ReadFileArgs {
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
}

impl ReadFile {
    /// A `read_file` tool confined to `root`. Fails when `root` is not an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::with_root(Root::new(root.as_ref())?))
    }

    pub(super) fn with_root(root: Root) -> Self {
        ReadFile {
            root,
            max_bytes: READ_MAX_BYTES,
        }
    }

    /// Sets the most bytes of text one call returns (at least 1).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }
}

impl FileTool for ReadFile {
    const NAME: &'static str = "read_file";
    const DESCRIPTION: &'static str = "Read a UTF-8 text file under the workspace root. Returns \
         `content` (the lines read, newlines kept) with `first_line` and `last_line` (1-based). \
         Reads up to `limit` lines (default 2000) after skipping `offset` lines, and at most 256 \
         KiB per call; when more remains, the result gives `next_offset` to continue. Paths are \
         relative to the root; absolute paths, `..` and links leading outside the root are \
         refused. Binary files are refused.";
    const SIDE_EFFECT: SideEffect = SideEffect::ReadOnly;
    type Args = ReadFileArgs;
    fn root(&self) -> &Root {
        &self.root
    }
    fn run(&self, args: &ReadFileArgs, stop: &CancellationToken) -> Result<ToolOutput, ToolError> {
        self.read(args, stop)
    }
}

file_tool!(ReadFile);

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
