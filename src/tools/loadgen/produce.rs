//! Producers (RocketMQ's benchmark `Producer`): lanes of outstanding puts, the
//! messages they put, and pacing under `--rate`.
//!
//! A producer is a sequence of message numbers shared by its `--outstanding` lanes;
//! each lane takes the next number (or `--batch` of them), waits for the number's
//! intended time under `--rate`, fills its messages and puts them through a
//! [`PutPath`]: the owning shard's `Store` (`local.rs`) or the `Handle` from an
//! outside thread (`outside.rs`). The put latency runs from the send time: the
//! intended one when the lane starts late, so a saturated run is charged its queueing
//! (no coordinated omission).

use super::measure::{now_ns, wall_ms};
use super::plan::{Plan, QueueRef};
use super::report::new_histogram;
use crate::format::properties;
use crate::{Message, PutStatus};
use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Sends closer than this to their intended time go at once: timers are not finer.
const PACE_SLACK_NS: u64 = 20_000;

/// Bodies are cut from chunks of this size, as a broker cuts them from its network
/// read buffers: one allocation serves many messages.
const BODY_CHUNK: usize = 256 << 10;

/// Where a lane's puts go.
pub(super) trait PutPath {
    /// Puts `msgs` (1 or a batch, all to one queue). A path that takes messages by
    /// value leaves `msgs` empty: the lane then builds new ones.
    async fn put(&self, msgs: &mut Vec<Message>) -> PutStatus;
    /// Waits until [`now_ns`] reaches `ns`.
    async fn sleep_until(&self, ns: u64);
    /// After every put, to the queue at `slot` in its producer's queue list
    /// ([`Plan::slot_of`](super::plan::Plan::slot_of)).
    async fn after_put(&self, slot: usize);
}

/// What a group of producers (one shard's, or one outside thread's) measured.
pub(super) struct Produced {
    pub start_ns: u64,
    /// When the last put returned.
    pub end_ns: u64,
    /// Nanoseconds.
    pub put_latency: Histogram<u64>,
    /// Nanoseconds a paced put began after its intended time (empty without --rate).
    pub start_late: Histogram<u64>,
    /// Nanoseconds from when the lane began a put (filling the message) to its return.
    pub service: Histogram<u64>,
    pub first_error: Option<String>,
}

/// Latencies and the first failure of the lanes of a group, recorded as they go.
pub(super) struct LaneStats {
    pub put_latency: RefCell<Histogram<u64>>,
    pub start_late: RefCell<Histogram<u64>>,
    pub service: RefCell<Histogram<u64>>,
    pub first_error: RefCell<Option<String>>,
}

impl LaneStats {
    pub fn new() -> Rc<LaneStats> {
        Rc::new(LaneStats {
            put_latency: RefCell::new(new_histogram()),
            start_late: RefCell::new(new_histogram()),
            service: RefCell::new(new_histogram()),
            first_error: RefCell::new(None),
        })
    }

    /// The group's result once its lanes, which ended at `ends`, are done.
    pub fn finish(&self, start_ns: u64, ends: impl IntoIterator<Item = u64>) -> Produced {
        Produced {
            start_ns,
            end_ns: ends.into_iter().max().unwrap_or(start_ns),
            put_latency: self.put_latency.replace(new_histogram()),
            start_late: self.start_late.replace(new_histogram()),
            service: self.service.replace(new_histogram()),
            first_error: self.first_error.borrow_mut().take(),
        }
    }
}

/// One producer: its lanes share the message sequence.
pub(super) struct Producer {
    plan: Arc<Plan>,
    /// Index among all producers of the run (it names the keys).
    g: usize,
    /// Next message number of this producer.
    next: Cell<u64>,
    quota: Option<u64>,
    /// Messages/s under `--rate`.
    rate: Option<f64>,
    start_ns: u64,
    deadline_ns: Option<u64>,
    /// What bodies are cut from.
    chunk: RefCell<BytesMut>,
    stats: Rc<LaneStats>,
}

impl Producer {
    pub fn new(plan: &Arc<Plan>, g: usize, start_ns: u64, stats: &Rc<LaneStats>) -> Rc<Producer> {
        Rc::new(Producer {
            plan: plan.clone(),
            g,
            next: Cell::new(0),
            quota: plan.quota(g),
            rate: plan.producer_rate(),
            start_ns,
            deadline_ns: match plan.cfg.messages {
                Some(_) => None,
                None => Some(start_ns + (plan.cfg.duration * 1e9) as u64),
            },
            chunk: RefCell::new(BytesMut::new()),
            stats: stats.clone(),
        })
    }

    /// Makes `m` message `seq` of this producer: `len` body bytes starting with the
    /// send time. A lane refills the same messages put after put where the path lets
    /// it: their strings keep their allocations (six allocations and frees per message
    /// were ~7% of the CPU per async 1 KiB put in perf).
    fn fill(&self, m: &mut Message, queue: &QueueRef, seq: u64, len: usize, sent: u64) {
        let plan = &self.plan;
        m.body = {
            let mut chunk = self.chunk.borrow_mut();
            if chunk.capacity() < len {
                *chunk = BytesMut::with_capacity(BODY_CHUNK.max(len));
            }
            chunk.extend_from_slice(&sent.to_le_bytes());
            let from = (seq as usize * 64) % (plan.pattern.len() - plan.cfg.body.max + 1);
            chunk.extend_from_slice(&plan.pattern[from..from + len - 8]);
            chunk.split().freeze()
        };
        if m.topic != queue.topic {
            m.topic.clear();
            m.topic.push_str(&queue.topic);
        }
        m.queue_id = queue.id;
        m.born_timestamp_ms = wall_ms(sent);
        if m.properties.is_empty() {
            m.properties.push((properties::TAGS.into(), "bench".into()));
            if plan.cfg.keys > 0 {
                m.properties.push((properties::KEYS.into(), String::new()));
            }
        }
        if plan.cfg.keys > 0 {
            let keys = &mut m.properties[1].1;
            keys.clear();
            for j in 0..plan.cfg.keys {
                if j > 0 {
                    keys.push(' ');
                }
                push_key(keys, self.g, seq, j);
            }
        }
    }

    /// Counts a put of `n` messages (`bytes` of bodies) sent at `sent` that returned
    /// `status` at `done`.
    fn account(
        &self,
        queue: &QueueRef,
        n: u64,
        bytes: u64,
        sent: u64,
        done: u64,
        status: PutStatus,
    ) {
        let c = &self.plan.counters[queue.shard];
        if status.is_stored() {
            self.stats
                .put_latency
                .borrow_mut()
                .saturating_record(done.saturating_sub(sent));
            c.messages.fetch_add(n, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(n, Ordering::Relaxed);
            let what = format!("put to {}/{}: {status:?}", queue.topic, queue.id);
            self.stats.first_error.borrow_mut().get_or_insert(what);
        }
    }
}

/// One outstanding put of a producer, repeated. Returns when its last put returned.
pub(super) async fn lane<P: PutPath>(p: Rc<Producer>, path: Rc<P>, lane_id: u64) -> u64 {
    let cfg = &p.plan.cfg;
    let batch = cfg.batch as u64;
    let mut rng = Rng::new(((p.g as u64) << 32) | lane_id);
    let mut last_done = p.start_ns;
    let mut msgs = Vec::with_capacity(batch as usize);
    loop {
        let k = p.next.get();
        let n = match p.quota {
            Some(quota) if k >= quota => break,
            Some(quota) => batch.min(quota - k),
            None => batch,
        };
        let intended = p.rate.map(|r| p.start_ns + (k as f64 * 1e9 / r) as u64);
        // One clock read serves the deadline check and, unless the send is paced and
        // sleeps, the start time: clock reads were ~5% of the CPU per message.
        let mut now = now_ns();
        if let Some(deadline) = p.deadline_ns
            && intended.unwrap_or(now) >= deadline
        {
            break;
        }
        p.next.set(k + n);
        if let Some(at) = intended
            && at > now + PACE_SLACK_NS
        {
            path.sleep_until(at).await;
            now = now_ns();
        }
        // A send that starts late is charged from its intended time; one that starts
        // a little early (within the timer slack) from when it really started.
        let sent = intended.map_or(now, |at| at.min(now));
        if intended.is_some() {
            // How much of its latency a paced put spent waiting to begin: the
            // executor busy with other work, or the timer's wake-up.
            p.stats
                .start_late
                .borrow_mut()
                .saturating_record(now - sent);
        }
        let slot = p.plan.slot_of(p.g, k);
        let queue = p.plan.queue_of(p.g, k);
        let mut bytes = 0;
        for i in 0..n as usize {
            let len = rng.between(cfg.body.min, cfg.body.max);
            bytes += len as u64;
            if msgs.len() <= i {
                msgs.push(Message::new(queue.topic.as_str(), queue.id, Bytes::new()));
            }
            p.fill(&mut msgs[i], queue, k + i as u64, len, sent);
        }
        msgs.truncate(n as usize);
        let status = path.put(&mut msgs).await;
        let done = now_ns();
        last_done = done;
        p.stats
            .service
            .borrow_mut()
            .saturating_record(done.saturating_sub(now));
        p.account(queue, n, bytes, sent, done, status);
        path.after_put(slot).await;
    }
    last_done
}

/// Appends the key `k<g>-<seq>-<j>`: key `j` of message `seq` of producer `g`.
pub(super) fn push_key(out: &mut String, g: usize, seq: u64, j: u32) {
    out.push('k');
    push_decimal(out, g as u64);
    out.push('-');
    push_decimal(out, seq);
    out.push('-');
    push_decimal(out, j.into());
}

/// Appends `n` in decimal: `write!` was a visible share of the producer's CPU.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[i..]).expect("ASCII digits"));
}

/// xorshift64*: body sizes, the body pattern and the keys asked for, cheaply.
pub(super) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, min: usize, max: usize) -> usize {
        if min == max {
            min
        } else {
            min + (self.next() % (max - min + 1) as u64) as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_match_display() {
        for n in [0u64, 7, 10, 99, 12345, u32::MAX as u64, u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
        let mut key = String::new();
        push_key(&mut key, 3, 1234, 2);
        assert_eq!(key, "k3-1234-2");
    }
}
