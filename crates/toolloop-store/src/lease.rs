//! Who holds a run, and whether that holder is provably gone.
//!
//! A lease names its holder's host (host name and, on Linux, the boot id), process id and
//! process start time. Another process on the same host and boot can tell at once that the
//! holder died (no such process, or the pid now belongs to a process that started later), so a
//! run killed with SIGKILL can be resumed right away. A holder on another host is presumed alive
//! until its lease expires: the holder renews it while it runs.

use std::sync::OnceLock;

/// This process, as a lease records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Process {
    /// `hostname` or `hostname/boot-id`.
    pub host: String,
    /// The process id.
    pub pid: i64,
    /// The process start time (clock ticks since boot, from `/proc`), or `""` when unknown.
    pub start: String,
}

/// This process.
pub(super) fn me() -> &'static Process {
    static ME: OnceLock<Process> = OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id();
        Process {
            host: host(),
            pid: i64::from(pid),
            start: start_time(i64::from(pid)).unwrap_or_default(),
        }
    })
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn host() -> String {
    let name = read_trimmed("/proc/sys/kernel/hostname")
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    match read_trimmed("/proc/sys/kernel/random/boot_id") {
        Some(boot) => format!("{name}/{boot}"),
        None => name,
    }
}

/// Field 22 of `/proc/<pid>/stat` (after the command name, which may hold spaces or parens).
fn start_time(pid: i64) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19).map(str::to_string)
}

/// Whether the process a lease names is certainly gone: same host and boot as this process
/// (which needs a boot id, so Linux), and no process with that pid and start time exists.
pub(super) fn is_gone(host: &str, pid: i64, start: &str) -> bool {
    let me = me();
    if host != me.host || !host.contains('/') || start.is_empty() {
        return false;
    }
    match start_time(pid) {
        None => true,
        Some(now) => now != start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_gone() {
        let me = me();
        assert_eq!(me.pid, i64::from(std::process::id()));
        if cfg!(target_os = "linux") {
            assert!(!me.start.is_empty());
            assert!(!is_gone(&me.host, me.pid, &me.start));
            // A pid that cannot exist (above the kernel's limit).
            assert!(is_gone(&me.host, 1 << 30, &me.start));
            // The same pid with another start time: reused by a newer process.
            assert!(is_gone(&me.host, me.pid, "1"));
        }
        // Another host: never presumed gone.
        assert!(!is_gone("elsewhere/boot", 1 << 30, "5"));
    }
}
