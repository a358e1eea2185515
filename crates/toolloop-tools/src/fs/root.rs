//! The root directory: opened once, and every model-given path checked and resolved beneath
//! it (see [`confine`](super::confine) for the handles).

use super::confine::{Found, Handle, Kind, Refusal};
use super::{confine, io_error};
use std::ffi::OsStr;
use std::fmt::Display;
use std::path::{Component, Path};
use std::{fs, io};
use toolloop::tool::ToolError;

/// A path as written, without `.` components, repeated or trailing `/` (`..` stays).
pub(super) fn lexical(raw: &str) -> String {
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

/// The opened root directory and the checks of model-given paths against it.
#[derive(Debug, Clone)]
pub(super) struct Root {
    pub(super) inner: confine::Root,
}

impl Root {
    pub(super) fn new(root: &Path) -> io::Result<Root> {
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
    pub(super) fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub(super) fn outside(&self, raw: &str, why: impl Display) -> ToolError {
        ToolError::new(format!(
            "path `{raw}` is outside the root `{}`: {why}",
            self.dir().display()
        ))
    }

    /// `path` (under the root) relative to the root, with `/` separators.
    pub(super) fn rel(&self, path: &Path) -> String {
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
    pub(super) fn components<'a>(&self, raw: &'a str) -> Result<Vec<&'a OsStr>, ToolError> {
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
    pub(super) fn find(&self, raw: &str, create_dirs: bool) -> Result<Found, ToolError> {
        let names = self.components(raw)?;
        self.inner
            .resolve(&names, create_dirs)
            .map_err(|refusal| self.refused(raw, refusal))
    }

    /// Why the path `raw` was refused, for the model.
    pub(super) fn refused(&self, raw: &str, refusal: Refusal) -> ToolError {
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
    pub(super) fn touches(&self, raw: &str) -> Result<String, String> {
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
    pub(super) fn existing(&self, raw: &str) -> Result<Found, ToolError> {
        match self.find(raw, false)? {
            Found::Missing {
                via_link: Some(link),
                ..
            } => Err(dangling(raw, &link)),
            Found::Missing { rel, .. } => Err(self.missing(&rel)),
            found => Ok(found),
        }
    }

    pub(super) fn missing(&self, rel: &str) -> ToolError {
        ToolError::new(format!(
            "`{rel}` does not exist in the root `{}`; use list_dir or search_files to find the \
             right path",
            self.dir().display()
        ))
    }

    pub(super) fn absolute_refusal(&self, raw: &str, raw_path: &Path) -> ToolError {
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
pub(super) fn dangling(raw: &str, link: &str) -> ToolError {
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
pub(super) fn not_regular(rel: &str, kind: Kind, what: &str) -> ToolError {
    ToolError::new(format!(
        "`{rel}` is {}, not a regular file; {what}",
        kind.described()
    ))
}

/// Opens the regular file `name` in `parent` for reading, without following a link and without
/// waiting, and checks by the handle that a regular file is what was opened.
pub(super) fn open_regular(
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
