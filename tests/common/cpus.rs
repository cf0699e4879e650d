//! CPU masks as Linux shows them in `/proc/.../status` (`Cpus_allowed_list`), and the
//! thread a shard runs on.
#![allow(dead_code)]

/// A `Cpus_allowed_list` value ("0-2,5") as CPU numbers.
pub fn parse_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

/// The CPUs in a `status` text's `Cpus_allowed_list`, if it has one.
pub fn in_status(status: &str) -> Option<Vec<usize>> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(parse_list)
}

/// The CPUs of the `status` file at `path` (a thread's or the process's).
pub fn of(path: &str) -> Vec<usize> {
    in_status(&std::fs::read_to_string(path).unwrap()).expect("Cpus_allowed_list in status")
}

/// The CPUs this process may use, when there are two or more (else says so and
/// returns `None`: a test about where shards run has nothing to choose between).
pub fn two_or_more() -> Option<Vec<usize>> {
    let allowed = of("/proc/self/status");
    if allowed.len() < 2 {
        eprintln!("one CPU only ({allowed:?}): nothing to choose between");
        return None;
    }
    Some(allowed)
}

/// The thread id of shard 0's executor.
pub fn shard0_tid(h: &coremq::Handle) -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    futures_lite::future::block_on(h.run_on(0, |_| async { unsafe { libc::gettid() } })).unwrap()
}
