//! A shard's shared tick: the periodic wake-ups of an idle shard (the stall detector's
//! backed-off heartbeat, the placement check, the queue flusher's round, the delay
//! levels' looks) end at multiples of their periods counted from one instant per
//! executor thread, so the executor serves the ones due together in one wake-up
//! instead of one each. Invariant: every period given is a multiple of the shortest
//! one (100 ms, the heartbeat's), else its ends fall between the others'.
//!
//! Deciding figure: an idle node's shards woke ~16 times a second for timers of four
//! periods set at their own moments (docs/performance/store.md).

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// The first [`until`] call on this thread: the ticks are counted from it.
    static ANCHOR: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How long until the next multiple of `period` since this thread's anchor (never
/// zero, at most `period`).
pub(crate) fn until(period: Duration) -> Duration {
    let now = Instant::now();
    let anchor = ANCHOR.with(|a| {
        let anchor = a.get().unwrap_or(now);
        a.set(Some(anchor));
        anchor
    });
    let period_ns = period.as_nanos().max(1);
    let ticks = (now - anchor).as_nanos() / period_ns + 1;
    let next = anchor + Duration::from_nanos((ticks * period_ns).min(u64::MAX as u128) as u64);
    next - now
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How far apart two instants are.
    fn apart(a: Instant, b: Instant) -> Duration {
        if a > b { a - b } else { b - a }
    }

    #[test]
    fn waits_of_one_thread_end_on_shared_ticks() {
        let period = Duration::from_millis(300);
        let first = until(period);
        let first_at = Instant::now() + first;
        assert!(first > Duration::ZERO && first <= period, "{first:?}");
        // A wait begun later in the same period ends at the same instant.
        std::thread::sleep(Duration::from_millis(60));
        let later_at = Instant::now() + until(period);
        assert!(
            apart(first_at, later_at) < Duration::from_millis(5),
            "a later wait ends {:?} apart from the first",
            apart(first_at, later_at)
        );
        // A shorter period that divides this one ends on the same instants too.
        let short = until(period / 3);
        let short_at = Instant::now() + short;
        let to_first = first_at.saturating_duration_since(Instant::now());
        let off = apart(short_at, first_at).as_nanos() % (period / 3).as_nanos();
        let off = Duration::from_nanos(off.min((period / 3).as_nanos() - off) as u64);
        assert!(
            short <= to_first + Duration::from_millis(5),
            "{short:?} past {to_first:?}"
        );
        assert!(
            off < Duration::from_millis(5),
            "the shorter period's tick is {off:?} off"
        );
        // Past that tick, the next one: one period on, not one period from now.
        std::thread::sleep(
            first_at.saturating_duration_since(Instant::now()) + Duration::from_millis(20),
        );
        let next_at = Instant::now() + until(period);
        assert!(
            apart(next_at, first_at + period) < Duration::from_millis(5),
            "the tick after is {:?} away from one period after the first",
            apart(next_at, first_at + period)
        );
    }

    /// The module's invariant: every idle period is a multiple of the heartbeat's.
    #[test]
    fn the_idle_periods_are_multiples_of_the_heartbeats() {
        let beat = crate::shard::stall::IDLE_TICK.as_nanos();
        let periods = [
            ("placement check", crate::shard::idle_unpin::WINDOW),
            ("idle look", crate::shard::stall::IDLE_LOOK),
            ("delay level look", crate::schedule::IDLE_POLL),
            ("delay level wait", crate::schedule::DUE_WAIT_MAX),
            (
                "queue flusher round",
                crate::StoreConfig::new("/unused").consume_queue_flush_interval,
            ),
        ];
        for (what, period) in periods {
            assert_eq!(
                period.as_nanos() % beat,
                0,
                "the {what}'s period {period:?} is not a multiple of the heartbeat's"
            );
        }
    }
}
