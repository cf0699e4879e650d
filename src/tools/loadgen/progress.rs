//! The progress lines on stderr: once a second, what moved; when nothing moved for a
//! second, where each shard's log stands and whether its executor still runs tasks.

use super::plan::Plan;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The once-a-second progress line of a produce run.
pub(super) struct Progress<'a> {
    plan: &'a Plan,
    started: Instant,
    enabled: bool,
}

impl<'a> Progress<'a> {
    pub fn new(plan: &'a Plan, started: Instant, enabled: bool) -> Progress<'a> {
        Progress {
            plan,
            started,
            enabled,
        }
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for c in &self.plan.counters {
            t.0 += c.messages.load(Ordering::Relaxed);
            t.1 += c.bytes.load(Ordering::Relaxed);
            t.2 += c.consumed.load(Ordering::Relaxed);
            t.3 += c.errors.load(Ordering::Relaxed);
        }
        t
    }

    pub fn run(&self, stop: &AtomicBool) {
        if !self.enabled {
            return;
        }
        let mut last = (0, 0, 0, 0);
        let mut beats = vec![0; self.plan.counters.len()];
        let mut last_at = self.started;
        let mut next = self.started + Duration::from_secs(1);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            let t = self.totals();
            let dt = now.duration_since(last_at).as_secs_f64();
            let dispatch_lag: u64 = self
                .plan
                .counters
                .iter()
                .map(|c| {
                    let written = c.log[0].load(Ordering::Relaxed);
                    written.saturating_sub(c.log[3].load(Ordering::Relaxed))
                })
                .sum();
            let mut line = format!(
                "[{:>6.1}s] put {:>10.0} msg/s {:>8.1} MB/s  total {:>11}  dispatch lag {:>7.1} MB",
                now.duration_since(self.started).as_secs_f64(),
                (t.0 - last.0) as f64 / dt,
                (t.1 - last.1) as f64 / dt / 1e6,
                t.0,
                dispatch_lag as f64 / 1e6
            );
            if self.plan.cfg.consumers {
                let _ = write!(
                    line,
                    "  consumed {:>10.0} msg/s  lag {:>9}",
                    (t.2 - last.2) as f64 / dt,
                    t.0.saturating_sub(t.2)
                );
            }
            if t.3 > 0 {
                let _ = write!(line, "  errors {}", t.3);
            }
            if self.plan.all_produced() {
                line.push_str(if self.plan.cfg.consumers {
                    "  (producers done: draining, then shutting down)"
                } else {
                    "  (producers done: shutting down)"
                });
            }
            eprintln!("{line}");
            if t.0 == last.0 && t.2 == last.2 {
                // Nothing moved for a second: show where each shard stands.
                for (i, c) in self.plan.counters.iter().enumerate() {
                    if c.produced.load(Ordering::Relaxed) {
                        continue;
                    }
                    let [w, cm, f, d] = c.log.each_ref().map(|a| a.load(Ordering::Relaxed));
                    let beat = c.heartbeat.load(Ordering::Relaxed);
                    let idle = if beat == beats[i] {
                        "; its executor ran no task for a second (a 100 ms timer did not fire)"
                    } else {
                        ""
                    };
                    eprintln!(
                        "           shard {i}: no progress; log written {w} committed {cm} \
                         flushed {f} dispatched {d}{idle}"
                    );
                }
            }
            for (b, c) in beats.iter_mut().zip(&self.plan.counters) {
                *b = c.heartbeat.load(Ordering::Relaxed);
            }
            last = t;
            last_at = now;
            next += Duration::from_secs(1);
        }
    }
}

/// A once-a-second line on stderr with what `done` (messages, bytes) counts, until
/// `stop`.
fn simple_progress(what: &str, done: &[AtomicU64; 2], stop: &AtomicBool) {
    let started = Instant::now();
    let mut last = (0, 0);
    let mut next = started + Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        let t = (
            done[0].load(Ordering::Relaxed),
            done[1].load(Ordering::Relaxed),
        );
        eprintln!(
            "[{:>6.1}s] {what} {:>10.0} /s {:>8.1} MB/s  total {:>11}",
            now.duration_since(started).as_secs_f64(),
            (t.0 - last.0) as f64,
            (t.1 - last.1) as f64 / 1e6,
            t.0
        );
        last = t;
        next += Duration::from_secs(1);
    }
}

/// Runs `work` while [`simple_progress`] reports `done` (unless `quiet`).
pub(super) fn with_progress<T>(
    what: &str,
    done: &[AtomicU64; 2],
    quiet: bool,
    work: impl FnOnce() -> T,
) -> T {
    /// Stops the progress line however `work` ends (a panic included).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        if !quiet {
            s.spawn(|| simple_progress(what, done, &stop));
        }
        let _stop = Stop(&stop);
        work()
    })
}
