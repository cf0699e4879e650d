//! `--via handle`: producers on plain OS threads outside the shards, putting through
//! the `Send + Sync` [`Handle`] as an embedder's own threads do.
//!
//! Each thread drives its `--outstanding` lanes with the small executor of
//! `executor.rs` (one waker per lane, timers for `--rate`). The thread is not pinned:
//! the scheduler places it among the shards' CPUs, as it would an application's
//! thread.

use super::executor::{block_on_all, sleep_until};
use super::measure::now_ns;
use super::plan::Plan;
use super::produce::{LaneStats, Produced, Producer, PutPath, lane};
use crate::StoreOps;
use crate::{Handle, Message, PutStatus};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Puts through the handle; it takes the messages by value, so the lane builds new
/// ones for every put (allocations an embedder pays too).
struct HandlePuts(Handle);

impl PutPath for HandlePuts {
    async fn put(&self, msgs: &mut Vec<Message>) -> PutStatus {
        if msgs.len() == 1 {
            // The message comes back to be refilled: no allocations per put, and its
            // strings are never freed by the shard's thread (a glibc free across
            // threads takes the other arena's lock).
            let m = msgs.pop().expect("one message");
            let (r, back) = self.0.put_and_return(m).await;
            msgs.extend(back);
            return r.status;
        }
        let results = self.0.put_batch(std::mem::take(msgs)).await;
        results
            .iter()
            .map(|r| r.status)
            .find(|s| !s.is_stored())
            .unwrap_or(PutStatus::PutOk)
    }

    async fn sleep_until(&self, ns: u64) {
        sleep_until(ns).await
    }

    async fn after_put(&self, _slot: usize) {}
}

/// Starts one thread per outside producer of `plan`; each returns what it measured.
/// The last one to end, however it ends, marks every shard produced.
pub(super) fn spawn_producers(
    plan: &Arc<Plan>,
    handle: &Handle,
) -> Result<Vec<std::thread::JoinHandle<Produced>>, String> {
    let outside = (0..plan.producers.len()).filter(|&g| plan.producers[g].shard.is_none());
    let mut threads = Vec::new();
    for g in outside {
        let (plan, handle) = (plan.clone(), handle.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("producer-{g}"))
            .spawn(move || {
                let _left = Left(plan.clone());
                produce(&plan, g, handle)
            });
        threads.push(spawned.map_err(|e| format!("cannot start producer thread {g}: {e}"))?);
    }
    Ok(threads)
}

/// Counts an outside producer thread out when it ends, a panic included (the shards
/// wait for all of them).
struct Left(Arc<Plan>);

impl Drop for Left {
    fn drop(&mut self) {
        if self.0.outside_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            (0..self.0.shards).for_each(|s| self.0.mark_produced(s));
        }
    }
}

/// Producer `g`'s lanes on this thread.
fn produce(plan: &Arc<Plan>, g: usize, handle: Handle) -> Produced {
    let start_ns = now_ns();
    let stats = LaneStats::new();
    let producer = Producer::new(plan, g, start_ns, &stats);
    let path = Rc::new(HandlePuts(handle));
    let lanes = (0..plan.cfg.outstanding)
        .map(|l| lane(producer.clone(), path.clone(), l as u64))
        .collect();
    let ends = block_on_all(lanes);
    stats.finish(start_ns, ends)
}
