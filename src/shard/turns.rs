//! Bounded turns for a shard's background work.
//!
//! A glommio executor runs one task queue at a time. A queue that keeps finding work
//! and yields within itself (the index flush copying its snapshot in pieces, dispatch
//! walking a long range) keeps the CPU until the executor's preempt timer fires (5 ms
//! by default, [`crate::shard::DEFAULT_PREEMPT_TIMER`]); meanwhile timers and I/O
//! completions are not even polled. Every foreground operation that became due then
//! waits: a put charged from its intended start, a node's socket read, a reply.
//!
//! So each background queue of a shard is created here with a bound on its turns
//! (glommio patch l, `ExecutorProxy::bound_task_queue_turns`): once a turn has lasted
//! [`StoreConfig::background_turn`](crate::StoreConfig::background_turn), its next
//! yield ends the turn and the executor polls I/O and timers and runs the other
//! queues before the background queue again.
//!
//! A turn that ends at its bound costs one pass through the executor's I/O poll (one
//! `io_uring_enter` at most) before the queue runs again.
//!
//! Invariants:
//! * A bound is honoured at yields only: background code yields (`yield_if_needed`,
//!   which now also answers "the turn is over") between pieces that each stay well
//!   under the bound; a piece that does not yield is not cut.
//! * Foreground queues (producers, the handle's inbox, a node's connections, the
//!   sync-mode writer) are not bounded: they run until the preempt timer, as before.
//! * Shares still decide who runs next among queues that are runnable.

use glommio::{Latency, Shares, TaskQueueHandle, executor};
use std::time::Duration;

/// [`StoreConfig::background_turn`](crate::StoreConfig::background_turn)'s default:
/// put p99 at 60,000 msg/s with tailing consumers (1 KiB, 64 queues, key index on)
/// 0.12-0.18 ms, against 0.22-0.30 ms at 200 us, 0.38-0.50 ms at 1 ms and 0.61-1.0 ms
/// unbounded (20 us: no better than 50); the closed-loop rate did not move (1.30-1.35
/// million msg/s at 0, 20, 50 and 200 us).
pub const DEFAULT_BACKGROUND_TURN: Duration = Duration::from_micros(50);

/// Creates a task queue of the shard on the current executor, named for the stall
/// detector, its turns bounded by `turn` (`Duration::ZERO`: unbounded, for foreground
/// work).
pub(crate) fn task_queue(
    name: &str,
    shares: usize,
    latency: Latency,
    turn: Duration,
) -> TaskQueueHandle {
    let q = executor().create_task_queue(Shares::Static(shares), latency, name);
    crate::shard::stall::name_queue(q, name);
    if !turn.is_zero() {
        // The queue was just created on this executor: it exists.
        let _ = executor().bound_task_queue_turns(q, Some(turn));
    }
    q
}
