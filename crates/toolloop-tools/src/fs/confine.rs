//! Confinement to a root directory by directory handles.
//!
//! A path is resolved one component at a time, each component opened relative to the handle of
//! the directory before it, never following a symbolic link by itself. A symbolic link met on
//! the way is read and its target resolved the same way, from the handle of the directory that
//! holds the link (or from the root, for an absolute target that names a place inside the
//! root); a `..` goes back to a handle already held, so nothing is looked up by a path string
//! once the root is open. A process that swaps a directory for a link while a path is being
//! resolved therefore cannot lead the resolution outside the root: the swapped-in link is seen
//! as a link, and its target is checked like any other.
//!
//! On Unix the handles are file descriptors (`openat` with `O_NOFOLLOW`). Elsewhere they are
//! paths checked component by component, which follows the same rules but is not proof
//! against a concurrent swap.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

pub(super) use sys::Handle;

/// How many symbolic links one resolution may go through (as Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;
/// How many times a resolution starts a step again when the entry changed under it.
const MAX_RETRIES: usize = 16;

/// What an entry is, as the entry itself (a link is a link, not what it points to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Device,
    Other,
}

impl Kind {
    /// The kind in words, for messages.
    pub(super) fn described(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::Dir => "a directory",
            Kind::Symlink => "a symbolic link",
            Kind::Fifo => "a FIFO (named pipe)",
            Kind::Socket => "a socket",
            Kind::Device => "a device",
            Kind::Other => "something other than a file or a directory",
        }
    }
}

/// The kind of what a handle refers to.
pub(super) fn kind_of(file_type: &std::fs::FileType) -> Kind {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return Kind::Fifo;
        }
        if file_type.is_socket() {
            return Kind::Socket;
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return Kind::Device;
        }
    }
    if file_type.is_symlink() {
        Kind::Symlink
    } else if file_type.is_dir() {
        Kind::Dir
    } else if file_type.is_file() {
        Kind::File
    } else {
        Kind::Other
    }
}

/// What `lstat` says about an entry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    pub kind: Kind,
    pub len: u64,
    /// Permission bits (`0o7777`); 0 where there are none.
    pub mode: u32,
    /// Owner and group, where there are such.
    pub owner: Option<(u32, u32)>,
}

/// An opened root directory.
#[derive(Debug, Clone)]
pub(super) struct Root {
    /// The canonical path of the root, for messages and for absolute link targets.
    pub dir: PathBuf,
    handle: Arc<Handle>,
}

/// Where a path led.
#[derive(Debug)]
pub(super) enum Found {
    /// A directory, opened.
    Dir { dir: Arc<Handle>, rel: String },
    /// An entry that is not a directory (a link has been followed to it).
    Entry {
        parent: Arc<Handle>,
        name: OsString,
        meta: Meta,
        rel: String,
    },
    /// Nothing is there; `parent` would hold it.
    Missing {
        parent: Arc<Handle>,
        name: OsString,
        rel: String,
        /// The link (relative to the root) whose target is missing, when a link led here.
        via_link: Option<String>,
    },
}

/// Why a path could not be resolved.
#[derive(Debug)]
pub(super) enum Refusal {
    /// A symbolic link leads outside the root; `target` is where (as well as it can be told).
    Escape { target: PathBuf },
    /// A directory on the way does not exist (`rel` is the whole path as resolved so far).
    Missing {
        rel: String,
        via_link: Option<String>,
    },
    /// An entry on the way is not a directory.
    NotADirectory { rel: String, kind: Kind },
    /// More than [`MAX_LINKS`] links.
    TooManyLinks,
    /// The entries on the way kept changing while they were looked up.
    Unstable { rel: String },
    /// The system refused a step.
    Io { rel: String, error: io::Error },
}

/// One component still to resolve, and the link whose target it comes from, if any.
struct Step {
    name: OsString,
    via_link: Option<Arc<str>>,
}

impl Root {
    /// Opens `root` (following links in it: the root itself may be reached through a link).
    pub(super) fn open(root: &Path) -> io::Result<Root> {
        let dir = std::fs::canonicalize(root)?;
        let handle = Handle::open_root(&dir)?;
        Ok(Root {
            dir,
            handle: Arc::new(handle),
        })
    }

    /// Resolves `components` (plain names, no `.` or `..`) beneath the root. With
    /// `create_dirs`, missing directories on the way are created (but not ones a link names).
    pub(super) fn resolve(
        &self,
        components: &[&OsStr],
        create_dirs: bool,
    ) -> Result<Found, Refusal> {
        let mut queue: VecDeque<Step> = components
            .iter()
            .map(|name| Step {
                name: name.to_os_string(),
                via_link: None,
            })
            .collect();
        // The directories entered so far, below the root, with their names.
        let mut stack: Vec<(Arc<Handle>, OsString)> = Vec::new();
        let mut links = 0usize;
        let mut retries = 0usize;
        // Where the last link pointed, for a message when a `..` in its target leaves the root.
        let mut last_target = PathBuf::new();

        while let Some(step) = queue.pop_front() {
            if step.name == "." || step.name.is_empty() {
                continue;
            }
            if step.name == ".." {
                if stack.pop().is_none() {
                    return Err(Refusal::Escape {
                        target: last_target,
                    });
                }
                continue;
            }
            let parent = stack.last().map_or(&self.handle, |(h, _)| h).clone();
            let last = queue.is_empty();
            let lstat = if last {
                parent.lstat(&step.name)
            } else {
                // Most components on the way are directories: open first, look closer if not.
                match parent.open_dir(&step.name) {
                    Ok(dir) => {
                        stack.push((Arc::new(dir), step.name));
                        continue;
                    }
                    Err(_) => parent.lstat(&step.name),
                }
            };
            let rel_here = || rel_of(&stack, Some(&step.name), &queue);
            match lstat {
                Ok(meta) if meta.kind == Kind::Symlink => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Refusal::TooManyLinks);
                    }
                    let target = match parent.read_link(&step.name) {
                        Ok(target) => target,
                        Err(_) => {
                            // No longer a link: look again.
                            retry(&mut retries, &rel_here)?;
                            queue.push_front(step);
                            continue;
                        }
                    };
                    let link_rel: Arc<str> =
                        rel_of(&stack, Some(&step.name), &VecDeque::new()).into();
                    let here = self.dir.join(rel_of(&stack, None, &VecDeque::new()));
                    last_target = normalize(&here.join(&target));
                    let rest = if target.is_absolute() {
                        match self.inside(&target) {
                            Some(rest) => {
                                stack.clear();
                                rest
                            }
                            None => {
                                let shown = std::fs::canonicalize(&target)
                                    .unwrap_or_else(|_| normalize(&target));
                                return Err(Refusal::Escape { target: shown });
                            }
                        }
                    } else {
                        target
                    };
                    let mut expanded = Vec::new();
                    for component in rest.components() {
                        let name = match component {
                            Component::Normal(name) => name.to_os_string(),
                            Component::ParentDir => OsString::from(".."),
                            Component::CurDir => continue,
                            Component::RootDir | Component::Prefix(_) => {
                                return Err(Refusal::Escape {
                                    target: last_target,
                                });
                            }
                        };
                        expanded.push(Step {
                            name,
                            via_link: Some(link_rel.clone()),
                        });
                    }
                    for step in expanded.into_iter().rev() {
                        queue.push_front(step);
                    }
                }
                Ok(meta) if meta.kind == Kind::Dir => match parent.open_dir(&step.name) {
                    Ok(dir) => {
                        let dir = Arc::new(dir);
                        stack.push((dir.clone(), step.name));
                        if last {
                            let rel = rel_of(&stack, None, &queue);
                            return Ok(Found::Dir { dir, rel });
                        }
                    }
                    Err(e) if sys::changed(&e) => {
                        // Swapped between the look and the open: look again.
                        retry(&mut retries, &rel_here)?;
                        queue.push_front(step);
                    }
                    Err(error) => {
                        return Err(Refusal::Io {
                            rel: rel_here(),
                            error,
                        });
                    }
                },
                Ok(meta) if last => {
                    let rel = rel_here();
                    return Ok(Found::Entry {
                        parent,
                        name: step.name,
                        meta,
                        rel,
                    });
                }
                Ok(meta) => {
                    return Err(Refusal::NotADirectory {
                        rel: rel_of(&stack, Some(&step.name), &VecDeque::new()),
                        kind: meta.kind,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let via_link = step.via_link.as_deref().map(str::to_string);
                    if last {
                        let rel = rel_here();
                        return Ok(Found::Missing {
                            parent,
                            name: step.name,
                            rel,
                            via_link,
                        });
                    }
                    if !create_dirs || via_link.is_some() {
                        return Err(Refusal::Missing {
                            rel: rel_here(),
                            via_link,
                        });
                    }
                    match parent.mkdir(&step.name) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            retry(&mut retries, &rel_here)?;
                        }
                        Err(error) => {
                            return Err(Refusal::Io {
                                rel: rel_of(&stack, Some(&step.name), &VecDeque::new()),
                                error,
                            });
                        }
                    }
                    queue.push_front(step);
                }
                Err(error) => {
                    return Err(Refusal::Io {
                        rel: rel_of(&stack, Some(&step.name), &VecDeque::new()),
                        error,
                    });
                }
            }
        }
        // The path ended on a directory already entered (the root, or after a `..`).
        Ok(Found::Dir {
            dir: stack
                .last()
                .map_or_else(|| self.handle.clone(), |(h, _)| h.clone()),
            rel: rel_of(&stack, None, &VecDeque::new()),
        })
    }

    /// The part of an absolute link target below the root, if it is below the root.
    fn inside(&self, target: &Path) -> Option<PathBuf> {
        if let Ok(rest) = target.strip_prefix(&self.dir) {
            return Some(rest.to_path_buf());
        }
        // The target may name the root through another path to it (a link to the root, a
        // differently spelled path). Only the words of the answer are used: what they name is
        // then resolved beneath the root like any other path.
        let canonical = std::fs::canonicalize(target).ok()?;
        canonical
            .strip_prefix(&self.dir)
            .ok()
            .map(Path::to_path_buf)
    }
}

fn retry(retries: &mut usize, rel: &dyn Fn() -> String) -> Result<(), Refusal> {
    *retries += 1;
    if *retries > MAX_RETRIES {
        Err(Refusal::Unstable { rel: rel() })
    } else {
        Ok(())
    }
}

/// The path relative to the root, with `/` separators: the directories entered, `name`, and
/// the components still to resolve (`.` when there is nothing).
fn rel_of(
    stack: &[(Arc<Handle>, OsString)],
    name: Option<&OsStr>,
    rest: &VecDeque<Step>,
) -> String {
    let parts: Vec<String> = stack
        .iter()
        .map(|(_, n)| n.as_os_str())
        .chain(name)
        .chain(rest.iter().map(|s| s.name.as_os_str()))
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// `path` with `.` and `..` worked out in words (for messages only).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(unix)]
mod sys {
    //! Directory handles as file descriptors.

    use super::{Kind, Meta};
    use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};
    use std::ffi::{OsStr, OsString};
    use std::fs::File;
    use std::io;
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};

    /// A directory opened for looking up names in it.
    #[derive(Debug)]
    pub(crate) struct Handle(OwnedFd);

    /// How directories on the way are opened: for lookups only where the system allows it
    /// (so a directory that may be searched but not listed still works).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const LOOKUP: OFlags = OFlags::PATH;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const LOOKUP: OFlags = OFlags::RDONLY;

    // The field types of `stat` differ between systems (`st_mode` is 16 bits on some).
    #[allow(clippy::unnecessary_cast)]
    fn meta_of(stat: &rustix::fs::Stat) -> Meta {
        let kind = match FileType::from_raw_mode(stat.st_mode as _) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
            FileType::CharacterDevice | FileType::BlockDevice => Kind::Device,
            _ => Kind::Other,
        };
        Meta {
            kind,
            len: stat.st_size as u64,
            mode: stat.st_mode as u32 & 0o7777,
            owner: Some((stat.st_uid as u32, stat.st_gid as u32)),
        }
    }

    /// Whether opening a directory failed because the entry is not (or no longer) one.
    pub(super) fn changed(error: &io::Error) -> bool {
        error.kind() == io::ErrorKind::NotFound
            || error.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
            || error.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
    }

    impl Handle {
        pub(crate) fn open_root(dir: &Path) -> io::Result<Handle> {
            let fd = rustix::fs::openat(
                CWD,
                dir,
                LOOKUP | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            Ok(Handle(fd))
        }

        /// The entry `name`, not following a link.
        pub(crate) fn lstat(&self, name: &OsStr) -> io::Result<Meta> {
            let stat = rustix::fs::statat(&self.0, name, AtFlags::SYMLINK_NOFOLLOW)?;
            Ok(meta_of(&stat))
        }

        /// Opens the directory `name`; fails when it is anything else, a link included.
        pub(crate) fn open_dir(&self, name: &OsStr) -> io::Result<Handle> {
            let flags = LOOKUP | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            Ok(Handle(rustix::fs::openat(
                &self.0,
                name,
                flags,
                Mode::empty(),
            )?))
        }

        pub(crate) fn read_link(&self, name: &OsStr) -> io::Result<PathBuf> {
            let target = rustix::fs::readlinkat(&self.0, name, Vec::new())?;
            Ok(PathBuf::from(OsStr::from_bytes(target.as_bytes())))
        }

        /// Opens the entry `name` for reading without following a link, without waiting (a
        /// FIFO opens at once) and without becoming a controlling terminal. The caller checks
        /// what was opened with the handle's metadata.
        pub(crate) fn open_read(&self, name: &OsStr) -> io::Result<File> {
            let flags = OFlags::RDONLY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::NOCTTY
                | OFlags::CLOEXEC;
            Ok(File::from(rustix::fs::openat(
                &self.0,
                name,
                flags,
                Mode::empty(),
            )?))
        }

        /// Creates the file `name`, which must not exist (not even as a link), for writing.
        pub(crate) fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
            let flags = OFlags::WRONLY
                | OFlags::CREATE
                | OFlags::EXCL
                | OFlags::NOFOLLOW
                | OFlags::NOCTTY
                | OFlags::CLOEXEC;
            let mode = Mode::from_bits_truncate(mode as _);
            Ok(File::from(rustix::fs::openat(&self.0, name, flags, mode)?))
        }

        pub(crate) fn mkdir(&self, name: &OsStr) -> io::Result<()> {
            Ok(rustix::fs::mkdirat(
                &self.0,
                name,
                Mode::from_bits_truncate(0o777),
            )?)
        }

        /// Renames `from` to `to` in this directory. Without `replace`, fails with
        /// `AlreadyExists` when `to` exists, where the system can tell atomically.
        pub(crate) fn rename(&self, from: &OsStr, to: &OsStr, replace: bool) -> io::Result<()> {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            if !replace {
                use rustix::fs::RenameFlags;
                match rustix::fs::renameat_with(&self.0, from, &self.0, to, RenameFlags::NOREPLACE)
                {
                    Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {}
                    other => return Ok(other?),
                }
            }
            let _ = replace;
            Ok(rustix::fs::renameat(&self.0, from, &self.0, to)?)
        }

        pub(crate) fn remove_file(&self, name: &OsStr) -> io::Result<()> {
            Ok(rustix::fs::unlinkat(&self.0, name, AtFlags::empty())?)
        }

        /// The names in this directory (without `.` and `..`).
        pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
            let fd = rustix::fs::openat(
                &self.0,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let mut names = Vec::new();
            for entry in rustix::fs::Dir::new(fd)? {
                let entry = entry?;
                let name = entry.file_name().to_bytes();
                if name != b"." && name != b".." {
                    names.push(OsStr::from_bytes(name).to_os_string());
                }
            }
            Ok(names)
        }
    }
}

#[cfg(not(unix))]
mod sys {
    //! Directory handles as checked paths: the same rules, without protection against a
    //! concurrent swap.

    use super::{Meta, kind_of};
    use std::ffi::{OsStr, OsString};
    use std::fs::{self, File, OpenOptions};
    use std::io;
    use std::path::{Path, PathBuf};

    #[derive(Debug)]
    pub struct Handle(PathBuf);

    fn meta_of(meta: &fs::Metadata) -> Meta {
        Meta {
            kind: kind_of(&meta.file_type()),
            len: meta.len(),
            mode: 0,
            owner: None,
        }
    }

    pub fn changed(error: &io::Error) -> bool {
        matches!(
            error.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
        )
    }

    impl Handle {
        pub fn open_root(dir: &Path) -> io::Result<Handle> {
            if fs::metadata(dir)?.is_dir() {
                Ok(Handle(dir.to_path_buf()))
            } else {
                Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    "not a directory",
                ))
            }
        }

        pub fn lstat(&self, name: &OsStr) -> io::Result<Meta> {
            Ok(meta_of(&fs::symlink_metadata(self.0.join(name))?))
        }

        pub fn open_dir(&self, name: &OsStr) -> io::Result<Handle> {
            let path = self.0.join(name);
            if fs::symlink_metadata(&path)?.is_dir() {
                Ok(Handle(path))
            } else {
                Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    "not a directory",
                ))
            }
        }

        pub fn read_link(&self, name: &OsStr) -> io::Result<PathBuf> {
            fs::read_link(self.0.join(name))
        }

        pub fn open_read(&self, name: &OsStr) -> io::Result<File> {
            let path = self.0.join(name);
            if fs::symlink_metadata(&path)?.is_file() {
                File::open(path)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a regular file",
                ))
            }
        }

        pub fn create_new(&self, name: &OsStr, _mode: u32) -> io::Result<File> {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(self.0.join(name))
        }

        pub fn mkdir(&self, name: &OsStr) -> io::Result<()> {
            fs::create_dir(self.0.join(name))
        }

        pub fn rename(&self, from: &OsStr, to: &OsStr, replace: bool) -> io::Result<()> {
            let to = self.0.join(to);
            if !replace && fs::symlink_metadata(&to).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists"));
            }
            fs::rename(self.0.join(from), to)
        }

        pub fn remove_file(&self, name: &OsStr) -> io::Result<()> {
            fs::remove_file(self.0.join(name))
        }

        pub fn names(&self) -> io::Result<Vec<OsString>> {
            fs::read_dir(&self.0)?
                .map(|entry| entry.map(|e| e.file_name()))
                .collect()
        }
    }
}
