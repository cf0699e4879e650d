//! Put deadlines: a put answers within `sync_flush_timeout` (plus one tick) of its
//! start whatever the disk does, in both flush modes.
//!
//! A put can wait in three places, each an [`OffsetWatch`] wait with the put's
//! deadline ([`crate::wake::Deadline`]):
//!
//! | wait | watch | on the deadline | RocketMQ |
//! |---|---|---|---|
//! | dispatch more than `max_dispatch_lag_bytes` behind | `dispatched` | `OsPageCacheBusy`, nothing stored | (none) |
//! | no free write buffer | `committed` | `OsPageCacheBusy`, nothing stored | `OS_PAGE_CACHE_BUSY`: put lock held > `osPageCacheBusyTimeOutMills` |
//! | sync flush | `flushed` | `FlushDiskTimeout`, stored | `FLUSH_DISK_TIMEOUT` |
//!
//! The first two end before the record is placed, so the put stored nothing and says so:
//! RocketMQ's clients retry `SYSTEM_BUSY` (what the node answers for `OsPageCacheBusy`),
//! and a retry duplicates nothing. `FlushDiskTimeout` means stored, durability unknown.
//!
//! Decisions:
//! * One ticker task per store expires the three watches every tick (an eighth of the
//!   timeout, 1-20 ms) while some wait has a deadline, and sleeps on a notification
//!   (`armed`, told by every wait that registers with a deadline) while none has,
//!   instead of a timer per put (a glommio timer per sync put was ~4% of a shard's
//!   CPU) or a tick forever (50 wake-ups a second of an idle shard). It is its own
//!   task, not the writer's loop: the writer awaits the disk (a segment creation, a
//!   sync round on the simulated disk or with `RingWriteFdatasync`), and while it
//!   does, a tick there would never come. The lazy ticker needs every timer of a
//!   parked executor to fire on time: glommio patch h (vendor/glommio/COREMQ-PATCHES.md).
//! * The two waits before the append (no free write buffer, dispatch too far behind)
//!   also carry a glommio timer of their own (`OffsetWatch::wait_until_timed`): they
//!   are rare (an overloaded or stalled shard), so the timer costs nothing that
//!   matters, and their answer by the deadline then depends on no other task. (The
//!   19.96 s put CI once saw in `tests/stall.rs` was the executor itself blocked in a
//!   file write's mtime update, fixed by glommio patch i; this keeps the slow path
//!   from resting on the ticker task alone.)
//! * The bound is the same in async mode: RocketMQ's `osPageCacheBusyTimeOutMills`
//!   (1 s) bounds only the put lock; here the put waits for room, so the one timeout a
//!   caller already sets for "how long may a put take" bounds it too.
//! * Nothing blocking runs on the shard while the store runs (`io::offload`): a
//!   stalled `fsync` there would stop the ticker and every put with it.

use super::{Inner, State};
use crate::wake::{Notify, OffsetWatch};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// How often the ticker expires waits: an eighth of the timeout, within 1-20 ms.
pub(super) fn tick(timeout: Duration) -> Duration {
    (timeout / 8).clamp(Duration::from_millis(1), Duration::from_millis(20))
}

/// The ticker task: until the store is stopped or gone (it holds no strong
/// reference, so it never keeps a dropped store alive). While no wait has a deadline
/// it sleeps until one registers (`armed`).
pub(super) async fn run_ticker(inner: Weak<Inner>, tick: Duration, armed: Rc<Notify>) {
    loop {
        let idle = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if inner.state.get() == State::Stopped {
                return;
            }
            !watches(&inner).iter().any(|w| w.has_deadline_waits())
        };
        if idle {
            armed.wait().await;
            continue;
        }
        glommio::timer::sleep(tick).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = Instant::now();
        for w in watches(&inner) {
            w.expire(now);
        }
    }
}

fn watches(inner: &Inner) -> [&OffsetWatch; 3] {
    [&inner.dispatched, &inner.log.committed, &inner.log.flushed]
}

/// Hooks the three watches to `armed` (the ticker's wake-up).
pub(super) fn arm(inner: &Inner, armed: &Rc<Notify>) {
    for w in watches(inner) {
        w.on_deadline_wait(armed.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tick_is_an_eighth_of_the_timeout_within_bounds() {
        assert_eq!(tick(Duration::from_secs(5)), Duration::from_millis(20));
        assert_eq!(tick(Duration::from_millis(80)), Duration::from_millis(10));
        assert_eq!(tick(Duration::from_micros(100)), Duration::from_millis(1));
    }
}
