//! The clocks, CPU time and memory figures the reports are made of.

use crate::stats::process::{cpu_seconds, rusage};
use std::sync::OnceLock;
use std::time::Instant;

/// The monotonic clock's zero, and the wall clock (ms since the epoch) then.
static CLOCK_BASE: OnceLock<(Instant, i64)> = OnceLock::new();

fn clock_base() -> &'static (Instant, i64) {
    CLOCK_BASE.get_or_init(|| (Instant::now(), crate::now_ms()))
}

/// Nanoseconds of a monotonic clock shared by every thread of the process (since its
/// first use), so a time taken on one shard can be compared on another.
pub fn now_ns() -> u64 {
    clock_base().0.elapsed().as_nanos() as u64
}

/// Wall-clock milliseconds at `now_ns() == ns` (a message's born timestamp without
/// another clock read).
pub(super) fn wall_ms(ns: u64) -> i64 {
    clock_base().1 + (ns / 1_000_000) as i64
}

/// The process's CPU time (user + system) in seconds and its peak RSS in bytes.
pub(super) fn process_usage() -> (f64, u64) {
    rusage(libc::RUSAGE_SELF).map_or((0.0, 0), |ru| {
        (cpu_seconds(&ru), ru.ru_maxrss as u64 * 1024)
    })
}

/// The calling thread's CPU time (user + system) in seconds, to the nanosecond
/// (`stats::process::thread_cpu_ns`: a shard that produced for under a tick without
/// switching read 0 s through `getrusage(RUSAGE_THREAD)`, and `tests/bench_store.rs` failed).
pub(super) fn thread_cpu_seconds() -> f64 {
    crate::stats::process::thread_cpu_ns() as f64 * 1e-9
}

/// `VmRSS` and `VmHWM` of this process in bytes (0 when unknown).
pub(super) fn memory_status() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The CPUs this process may run on, ascending.
pub fn allowed_cpus() -> Vec<usize> {
    crate::shard::wait::allowed_cpus()
}

/// The 1, 5 and 15 minute load averages before a run (other load on the machine skews
/// the numbers).
pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod memory_tests {
    #[test]
    fn memory_status_reads_this_process() {
        let (rss, hwm) = super::memory_status();
        assert!(rss > 0 && hwm >= rss, "{rss} {hwm}");
    }
}
