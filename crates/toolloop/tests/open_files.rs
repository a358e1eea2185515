//! `raise_open_files_limit`: the soft limit on open files goes up to the hard one, and the
//! process can then hold more connections than its old soft limit. Its own test binary, since
//! it changes the process's limits.
#![cfg(unix)]

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use toolloop::transport::raise_open_files_limit;

#[test]
fn raises_the_soft_limit_to_the_hard_one() {
    let start = getrlimit(Resource::Nofile);
    let hard = start.maximum;
    // Start low, as many systems start programs (1,024 there; 64 here, so the test is quick).
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(64),
            maximum: hard,
        },
    )
    .expect("a process may lower its own soft limit");
    // With 64, the process cannot hold 200 descriptors (a connection takes one, as a file does).
    let open = || std::fs::File::open("/dev/null");
    let mut held = Vec::new();
    let refused = (0..200).find_map(|_| match open() {
        Ok(f) => {
            held.push(f);
            None
        }
        Err(e) => Some(e),
    });
    let refused = refused.expect("64 descriptors do not hold 200 files");
    assert_eq!(refused.raw_os_error(), Some(24), "{refused}");
    held.clear();

    let limit = raise_open_files_limit().expect("the soft limit goes up");
    assert_eq!(limit.before, Some(64));
    assert_eq!(limit.hard, hard);
    assert_eq!(limit.now, hard);
    assert_eq!(getrlimit(Resource::Nofile).current, hard);
    if hard.is_none_or(|h| h >= 1024) {
        // Now the same 200 fit.
        for _ in 0..200 {
            held.push(open().expect("a descriptor under the new limit"));
        }
    }
    // Again: nothing left to raise, nothing changes.
    let again = raise_open_files_limit().expect("nothing to do");
    assert_eq!((again.before, again.now), (hard, hard));
}
