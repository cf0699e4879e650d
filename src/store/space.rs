//! Disk-space watermarks for puts: RocketMQ's disk-full flag (`diskSpaceWarningLevelRatio`,
//! set by `CleanCommitLogService`, checked by `putMessage` through `RunningFlags`), here
//! checked by the put itself: refused with `DiskFull` before any write can hit ENOSPC
//! (`disk_min_free_bytes` is kept free), taken again once space is freed.
//!
//! Decisions: free space is read (`statvfs`) every `disk_check_interval`, or on every put
//! once the estimate nears the reserve, so a put far from the watermark makes no system
//! call; and the clock is the coarse monotonic one (see [`coarse_now`]).

use super::Inner;
use std::time::Duration;

/// The monotonic clock at its coarse resolution (a few milliseconds), as the free
/// space check needs it on every put: `Instant::now` there was ~1% of the CPU per
/// 1 KiB put (perf, scenario 1), the coarse clock reads a value the kernel keeps.
fn coarse_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return Duration::MAX;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The last reading of the file system's free space.
#[derive(Default)]
pub(super) struct SpaceCheck {
    /// When `avail` was read, on the [`coarse_now`] clock.
    at: Option<Duration>,
    total: u64,
    avail: u64,
    /// Commit-log end when `avail` was read.
    log_end: u64,
    full: bool,
}

impl Inner {
    /// Whether a put of `incoming` bytes leaves the file system within its watermarks
    /// (RocketMQ refuses puts once the disk is over `diskSpaceWarningLevelRatio`).
    /// Free space is re-read every `disk_check_interval`, and on every put once the
    /// estimate (last reading minus the log bytes written since, doubled for queue
    /// and index overhead) comes near the reserve.
    pub(super) fn disk_has_room(&self, incoming: u64) -> bool {
        let reserve = self.cfg.disk_reserve_bytes();
        let written = self.log.written();
        let mut sc = self.space.borrow_mut();
        let since = written.saturating_sub(sc.log_end).saturating_mul(2);
        let estimate = sc.avail.saturating_sub(since);
        let now = coarse_now();
        let stale = sc
            .at
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.disk_check_interval);
        if stale || sc.full || estimate < reserve + incoming * 2 {
            match self.cfg.disk.space(&self.cfg.root) {
                Ok(Some((total, avail))) => {
                    sc.total = total;
                    sc.avail = avail;
                }
                Ok(None) => {
                    sc.total = 0;
                    sc.avail = u64::MAX;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read free space; not refusing puts");
                    sc.total = 0;
                    sc.avail = u64::MAX;
                }
            }
            sc.at = Some(now);
            sc.log_end = written;
            let used = sc.total.saturating_sub(sc.avail);
            let ratio = if sc.total == 0 {
                0.0
            } else {
                used as f64 / sc.total as f64
            };
            let full =
                sc.avail < reserve.saturating_add(incoming) || ratio >= self.cfg.disk_full_ratio;
            if full != sc.full {
                if full {
                    // Retention frees space: a pass now, not at its next interval.
                    self.clean.wake();
                    tracing::error!(
                        root = %self.cfg.root.display(), avail = sc.avail, total = sc.total, reserve,
                        ratio = self.cfg.disk_full_ratio, "disk full: refusing puts until space is freed"
                    );
                } else {
                    tracing::warn!(root = %self.cfg.root.display(), avail = sc.avail, "disk has room again: taking puts");
                }
                sc.full = full;
            }
            return !full;
        }
        true
    }
}
