//! The process's own resource use, read with `getrusage` (microsecond resolution, the
//! time of threads that have exited included): the node's `process_cpu_seconds_total`
//! and the load generator's CPU figures. `/proc/<pid>/stat` counts in clock ticks
//! (10 ms here): a node's CPU over 3 s comes in steps of 0.33% of a core (an idle node
//! read 1.00% twice, 0.48-0.60% with getrusage). A thread's own CPU comes from its
//! clock instead ([`thread_cpu_ns`]).

/// `getrusage(who)`, or `None` when it fails.
pub(crate) fn rusage(who: libc::c_int) -> Option<libc::rusage> {
    // SAFETY: getrusage only writes the struct it is given.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        (libc::getrusage(who, &mut ru) == 0).then_some(ru)
    }
}

/// User + system CPU of a `rusage`, in seconds.
pub(crate) fn cpu_seconds(ru: &libc::rusage) -> f64 {
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// This process's CPU time so far (user + system, every thread), in seconds.
pub fn process_cpu_seconds() -> f64 {
    rusage(libc::RUSAGE_SELF).map_or(0.0, |ru| cpu_seconds(&ru))
}

/// The calling thread's CPU time (user + system) in ns, to the nanosecond
/// (`CLOCK_THREAD_CPUTIME_ID`; `getrusage(RUSAGE_THREAD)` gives a running thread's time
/// as of its last tick or switch, so work under a tick without a switch read as 0);
/// 0 when the clock cannot be read.
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn process_cpu_time_grows_with_work() {
        // Spins until 20 ms of CPU are counted; a loaded machine only makes it take
        // longer. A reading that does not move fails at the deadline.
        let before = super::process_cpu_seconds();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        let mut spent = 0.0;
        while spent < 0.02 && start.elapsed() < std::time::Duration::from_secs(20) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            spent = super::process_cpu_seconds() - before;
        }
        assert!(
            spent >= 0.02,
            "{:?} of spinning counted as {spent} s of CPU",
            start.elapsed()
        );
    }
}
