//! Scenario 9's put phases: plain or timed messages from shard-local producers,
//! `--outstanding` lanes a shard, each phase timed from its first put until every shard's
//! puts returned and were dispatched, with the process's CPU over it.

use super::super::measure::process_usage;
use super::super::plan::QueueRef;
use super::super::produce::Rng;
use super::super::progress::with_progress;
use super::super::run::on_every_shard;
use crate::format::properties::{TAGS, UNIQ_KEY};
use crate::format::schedule::TIMER_DELIVER_MS;
use crate::{Message, ShardContext};
use bytes::Bytes;
use glommio::{Latency, Shares, executor, spawn_local_into};
use serde_json::{Value, json};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What one put phase puts on each shard.
pub(super) struct PhaseSpec {
    pub timed: bool,
    /// First message index and count, per shard.
    pub from: Vec<u64>,
    pub count: Vec<u64>,
    /// Each shard's first index of this kind: message `i` goes to queue
    /// `owned[(i - base) % len]`.
    pub base: Vec<u64>,
    pub owned: Vec<Arc<Vec<QueueRef>>>,
    /// Due times: `window_start + uniform [0, spread_ms)`.
    pub window_start: i64,
    pub spread_ms: i64,
    pub body: Bytes,
    pub body_min: usize,
    pub body_max: usize,
    pub outstanding: u32,
    pub seed: u64,
    /// Messages and body bytes put (the progress line).
    pub done: Arc<[AtomicU64; 2]>,
}

/// What one shard's put phase did.
struct PhaseShard {
    stored: u64,
    errors: u64,
    first_error: Option<String>,
    /// Each owned queue's end once the phase's puts were dispatched.
    queue_ends: Vec<u64>,
}

/// A put phase's figures.
pub(super) struct Phase {
    pub name: &'static str,
    pub messages: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub seconds: f64,
    pub cpu_seconds: f64,
    /// Each shard's queue ends after the phase.
    pub queue_ends: Vec<Vec<u64>>,
    /// Each shard's failed puts.
    pub shard_errors: Vec<u64>,
}

impl Phase {
    pub(super) fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds.max(1e-9)
    }

    pub(super) fn cpu_us(&self) -> f64 {
        self.cpu_seconds * 1e6 / self.messages.max(1) as f64
    }

    pub(super) fn to_json(&self) -> Value {
        json!({
            "messages": self.messages,
            "errors": self.errors,
            "seconds": self.seconds,
            "messages_per_sec": self.rate(),
            "cpu_seconds": self.cpu_seconds,
            "cpu_us_per_message": self.cpu_us(),
        })
    }

    pub(super) fn line(&self) -> String {
        format!(
            "  {:<11} {} messages in {:.2} s: {:.0} msg/s, {:.2} µs CPU/msg{}\n",
            self.name,
            self.messages,
            self.seconds,
            self.rate(),
            self.cpu_us(),
            if self.errors > 0 {
                format!(", {} failed", self.errors)
            } else {
                String::new()
            }
        )
    }
}

/// `n` split over shards in proportion to `weights` (a shard of weight 0 gets none).
pub(super) fn split(n: u64, weights: &[u64]) -> Vec<u64> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return vec![0; weights.len()];
    }
    let mut out: Vec<u64> = weights.iter().map(|w| n * w / total).collect();
    let mut left = n - out.iter().sum::<u64>();
    for (o, w) in out.iter_mut().zip(weights) {
        if left == 0 {
            break;
        }
        if *w > 0 {
            *o += 1;
            left -= 1;
        }
    }
    out
}

/// Where each shard's range starts when they follow one another.
pub(super) fn starts(counts: &[u64]) -> Vec<u64> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            let s = at;
            at += c;
            s
        })
        .collect()
}

/// Runs one put phase on every shard: its time (first put to every shard's puts
/// returned and dispatched) and CPU.
pub(super) fn put_phase(
    name: &'static str,
    handle: &crate::Handle,
    spec: Arc<PhaseSpec>,
    done: &Arc<[AtomicU64; 2]>,
    quiet: bool,
) -> Result<Phase, String> {
    let what = format!("{name} put");
    // Timed inside: `with_progress` returns once its progress thread saw the stop (up to
    // 50 ms later).
    let (results, seconds, cpu0, cpu1) = with_progress(&what, done, quiet, || {
        let (cpu0, _) = process_usage();
        let started = Instant::now();
        let r = on_every_shard(handle, move |ctx| put_shard(ctx, spec));
        (r, started.elapsed().as_secs_f64(), cpu0, process_usage().0)
    });
    let results = results?;
    let mut phase = Phase {
        name,
        messages: 0,
        errors: 0,
        first_error: None,
        seconds,
        cpu_seconds: cpu1 - cpu0,
        queue_ends: Vec::new(),
        shard_errors: Vec::new(),
    };
    for r in results {
        phase.messages += r.stored;
        phase.errors += r.errors;
        phase.first_error = phase.first_error.or(r.first_error);
        phase.queue_ends.push(r.queue_ends);
        phase.shard_errors.push(r.errors);
    }
    Ok(phase)
}

/// A shard's part of a put phase: `--outstanding` lanes taking message indices in turn.
async fn put_shard(ctx: ShardContext, spec: Arc<PhaseSpec>) -> PhaseShard {
    let s = ctx.shard;
    let store = ctx.store;
    let (from, count) = (spec.from[s], spec.count[s]);
    let next = Rc::new(Cell::new(from));
    let end = from + count;
    let stored = Rc::new(Cell::new(0u64));
    let errors = Rc::new(Cell::new(0u64));
    let first_error = Rc::new(RefCell::new(None::<String>));
    if count > 0 {
        let tq = executor().create_task_queue(
            Shares::Static(1000),
            Latency::NotImportant,
            "timer-bench",
        );
        let mut lanes = Vec::new();
        for l in 0..spec.outstanding.min(count as u32) {
            let (store, spec, next) = (store.clone(), spec.clone(), next.clone());
            let (stored, errors, first_error) =
                (stored.clone(), errors.clone(), first_error.clone());
            let lane = async move {
                let mut rng = Rng::new(spec.seed ^ ((s as u64) << 32) ^ l as u64);
                let queues = &spec.owned[s];
                let mut msg = Message::new(queues[0].topic.as_str(), 0, Bytes::new());
                msg.properties = vec![
                    (TAGS.into(), "bench".into()),
                    (UNIQ_KEY.into(), String::new()),
                ];
                if spec.timed {
                    msg.properties
                        .push((TIMER_DELIVER_MS.into(), String::new()));
                }
                loop {
                    let i = next.get();
                    if i >= end {
                        break;
                    }
                    next.set(i + 1);
                    let q = &queues[((i - spec.base[s]) % queues.len() as u64) as usize];
                    msg.queue_id = q.id;
                    let len = spec.body_min
                        + (rng.next() % (spec.body_max - spec.body_min + 1) as u64) as usize;
                    let at = (rng.next() % (64 * 1024)) as usize;
                    msg.body = spec.body.slice(at..at + len);
                    msg.born_timestamp_ms = crate::now_ms();
                    let key = &mut msg.properties[1].1;
                    key.clear();
                    let _ = write!(key, "{}{i}", if spec.timed { 'T' } else { 'P' });
                    if spec.timed {
                        let due = spec.window_start + (rng.next() % spec.spread_ms as u64) as i64;
                        let v = &mut msg.properties[2].1;
                        v.clear();
                        let _ = write!(v, "{due}");
                    }
                    let r = store.put(&msg).await;
                    if r.status.is_stored() {
                        stored.set(stored.get() + 1);
                        spec.done[0].fetch_add(1, Ordering::Relaxed);
                        spec.done[1].fetch_add(len as u64, Ordering::Relaxed);
                    } else {
                        errors.set(errors.get() + 1);
                        first_error
                            .borrow_mut()
                            .get_or_insert(format!("put to {}/{}: {:?}", q.topic, q.id, r.status));
                    }
                    futures_lite::future::yield_now().await;
                }
            };
            lanes.push(spawn_local_into(lane, tq).expect("spawn a put lane"));
        }
        for l in lanes {
            l.await;
        }
    }
    store.wait_dispatched().await;
    let queue_ends = spec.owned[s]
        .iter()
        .map(|q| store.max_queue_offset(&q.topic, q.id))
        .collect();
    let first_error = first_error.borrow_mut().take();
    PhaseShard {
        stored: stored.get(),
        errors: errors.get(),
        first_error,
        queue_ends,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_follows_the_weights_exactly() {
        assert_eq!(split(10, &[1, 1]), vec![5, 5]);
        assert_eq!(split(11, &[1, 0, 1]), vec![6, 0, 5]);
        assert_eq!(split(7, &[0, 0]), vec![0, 0]);
        let s = split(1_000_001, &[33, 31]);
        assert_eq!(s.iter().sum::<u64>(), 1_000_001);
        assert_eq!(starts(&[3, 0, 4]), vec![0, 3, 3]);
    }
}
