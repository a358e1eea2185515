//! Reading the small files a user names (a configuration file, a system prompt, a price table,
//! a JSON Schema, a workflow, a script): regular files only, and never more than a limit.
//!
//! A path may name anything: `/dev/zero` would be read forever, a FIFO would block the open
//! until a writer came, a directory would fail late with an unclear error. [`read_to_string`]
//! opens without waiting (`O_NONBLOCK`, so a FIFO opens at once), refuses what is not a
//! regular file, and refuses a file larger than its limit, counting the bytes actually read
//! (a file that grows while it is read is refused too).
//!
//! ```
//! use toolloop::user_file::read_to_string;
//!
//! let err = read_to_string(std::path::Path::new("/dev/zero"), 1024).unwrap_err();
//! assert!(err.to_string().contains("not a regular file"), "{err}");
//! ```

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// The default limit for a user's text file: 1 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 1024 * 1024;

/// Reads the regular file at `path` as UTF-8 text, refusing a file of more than `max_bytes`
/// bytes, a directory, a FIFO, a socket or a device. The error says which (the caller names the
/// flag or the setting and the path).
pub fn read_to_string(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    let bytes = read(path, max_bytes)?;
    String::from_utf8(bytes).map_err(|_| Error::new(ErrorKind::InvalidData, "it is not UTF-8 text"))
}

/// Reads the regular file at `path`, as [`read_to_string`] does, as bytes.
pub fn read(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening a FIFO for reading waits for a writer; without waiting, it opens at once and
    // is then refused below (as is a terminal, which is not made the controlling one).
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(
            (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32,
        );
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "it is a directory, not a file"
        } else {
            "it is not a regular file (a FIFO, socket or device)"
        };
        return Err(Error::new(ErrorKind::InvalidInput, what));
    }
    let too_large = || {
        Error::new(
            ErrorKind::InvalidData,
            format!("it is larger than {}, the most read", size(max_bytes)),
        )
    };
    if meta.len() > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// A size in bytes as people write it (`64 KiB`, `4 MiB`).
fn size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_are_read_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.txt");
        std::fs::write(&path, "hello").unwrap();
        assert_eq!(read_to_string(&path, 5).unwrap(), "hello");
        let e = read_to_string(&path, 4).unwrap_err();
        assert!(e.to_string().contains("larger than 4 bytes"), "{e}");
        let e = read_to_string(dir.path(), 4).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(read_to_string(&path, 5).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn devices_and_fifos_are_refused_at_once() {
        let e = read(Path::new("/dev/zero"), DEFAULT_MAX_BYTES).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let e = read(&fifo, DEFAULT_MAX_BYTES).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
