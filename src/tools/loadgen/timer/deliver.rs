//! Scenario 9's consumers: each shard polls its queues for the timed messages it stored
//! and accounts every delivery (lateness = store timestamp - `TIMER_OUT_MS`, duplicates,
//! early, misrouted), until all came and a second more, or the deadline.

use super::super::consume::RETURNED;
use super::super::plan::QueueRef;
use super::DELIVERY_GRACE_MS;
use crate::format::properties::UNIQ_KEY;
use crate::format::record::{self, Decoded};
use crate::format::schedule::TIMER_OUT_MS;
use crate::{GetStatus, ShardContext};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Once every message was seen, how long the consumers go on looking for duplicates.
const DUPLICATE_WATCH_MS: i64 = 1_000;
/// A consumer's pause when a pass over its queues found nothing.
const POLL_IDLE: Duration = Duration::from_millis(10);
/// Records per get.
const GET_BATCH: usize = 256;
/// Lateness histograms: milliseconds, up to an hour.
const LATENESS_MAX_MS: u64 = 3_600_000;

/// What the consumers are told.
pub(super) struct ConsumeSpec {
    pub owned: Vec<Arc<Vec<QueueRef>>>,
    /// Where each shard's queues start (after the plain phase).
    pub from: Vec<Vec<u64>>,
    /// Each shard's timed indices: `[base, base + count)`.
    pub base: Vec<u64>,
    pub count: Vec<u64>,
    /// Timed messages each shard stored (what it must deliver).
    pub expected: Vec<u64>,
    pub window_start: i64,
    pub spread_secs: u64,
    pub deadline_ms: i64,
    /// Delivered messages seen (the progress line).
    pub done: Arc<[AtomicU64; 2]>,
}

/// What one shard's consumer saw.
pub(super) struct Seen {
    /// Distinct timed messages delivered.
    delivered: u64,
    duplicates: u64,
    early: u64,
    misrouted: u64,
    /// Records that are none of this run's timed messages, or do not decode.
    foreign: u64,
    first_error: Option<String>,
    /// Lateness in ms (an early record counts as 0 here and in `early`).
    lateness: Histogram<u64>,
    /// Lateness per second of due time (from the first due time).
    by_due_second: Vec<Option<Histogram<u64>>>,
    /// Deliveries per second of store time (from the first due time).
    per_second: Vec<u64>,
    first_delivery_ms: Option<i64>,
    last_delivery_ms: Option<i64>,
}

pub(super) fn lateness_histogram(digits: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENESS_MAX_MS, digits).expect("valid histogram bounds")
}

/// What every shard's consumer saw, together.
pub(super) struct Delivery {
    pub lateness: Histogram<u64>,
    pub by_due: Vec<Option<Histogram<u64>>>,
    pub per_second: Vec<u64>,
    pub delivered: u64,
    pub duplicates: u64,
    pub early: u64,
    pub misrouted: u64,
    pub foreign: u64,
    pub first_delivery: Option<i64>,
    pub last_delivery: Option<i64>,
    pub first_error: Option<String>,
}

impl Delivery {
    pub(super) fn merge(seen: Vec<Seen>, spread_secs: u64) -> Result<Delivery, String> {
        let mut d = Delivery {
            lateness: lateness_histogram(3),
            by_due: vec![None; spread_secs as usize],
            per_second: vec![0u64; per_second_len(spread_secs)],
            delivered: 0,
            duplicates: 0,
            early: 0,
            misrouted: 0,
            foreign: 0,
            first_delivery: None,
            last_delivery: None,
            first_error: None,
        };
        for s in seen {
            d.lateness
                .add(&s.lateness)
                .map_err(|e| format!("merging histograms: {e}"))?;
            for (into, h) in d.by_due.iter_mut().zip(s.by_due_second) {
                if let Some(h) = h {
                    match into {
                        Some(i) => i.add(&h).map_err(|e| format!("merging histograms: {e}"))?,
                        None => *into = Some(h),
                    }
                }
            }
            for (a, b) in d.per_second.iter_mut().zip(&s.per_second) {
                *a += b;
            }
            d.delivered += s.delivered;
            d.duplicates += s.duplicates;
            d.early += s.early;
            d.misrouted += s.misrouted;
            d.foreign += s.foreign;
            d.first_delivery = min_opt(d.first_delivery, s.first_delivery_ms);
            d.last_delivery = d.last_delivery.max(s.last_delivery_ms);
            d.first_error = d.first_error.or(s.first_error);
        }
        Ok(d)
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Deliveries are counted per second from the first due time to the consumers'
/// deadline.
pub(super) fn per_second_len(spread_secs: u64) -> usize {
    spread_secs as usize + (DELIVERY_GRACE_MS / 1000) as usize + 2
}

/// A shard's consumer: polls its queues until every timed message it stored was
/// delivered (and a second more), or the deadline.
pub(super) async fn consume_shard(ctx: ShardContext, spec: Arc<ConsumeSpec>) -> Seen {
    let s = ctx.shard;
    let store = ctx.store;
    let queues = spec.owned[s].clone();
    let mut offsets = spec.from[s].clone();
    let (base, count) = (spec.base[s], spec.count[s]);
    let mut bits = vec![0u64; count.div_ceil(64) as usize];
    let mut seen = Seen {
        delivered: 0,
        duplicates: 0,
        early: 0,
        misrouted: 0,
        foreign: 0,
        first_error: None,
        lateness: lateness_histogram(3),
        by_due_second: (0..spec.spread_secs).map(|_| None).collect(),
        per_second: vec![0; per_second_len(spec.spread_secs)],
        first_delivery_ms: None,
        last_delivery_ms: None,
    };
    let mut all_seen_at = None;
    'poll: loop {
        let mut got_any = false;
        for (qi, q) in queues.iter().enumerate() {
            while offsets[qi] < store.max_queue_offset(&q.topic, q.id) {
                let got = match store
                    .get(&q.topic, q.id, offsets[qi], GET_BATCH, 4 << 20)
                    .await
                {
                    Ok(g) => g,
                    Err(e) => {
                        seen.first_error = Some(format!("get {}/{}: {e}", q.topic, q.id));
                        break 'poll;
                    }
                };
                if got.status != GetStatus::Found {
                    seen.first_error = Some(format!(
                        "get {}/{} at {}: {:?}",
                        q.topic, q.id, offsets[qi], got.status
                    ));
                    break 'poll;
                }
                got_any = true;
                for raw in &got.records {
                    take(&spec, &mut seen, &mut bits, base, count, &queues, q, raw);
                }
                offsets[qi] = got.next_begin_offset;
                glommio::yield_if_needed().await;
            }
        }
        let now = crate::now_ms();
        if seen.delivered >= spec.expected[s] {
            let at = *all_seen_at.get_or_insert(now);
            if now - at >= DUPLICATE_WATCH_MS {
                break;
            }
        }
        if now >= spec.deadline_ms {
            break;
        }
        if !got_any {
            glommio::timer::sleep(POLL_IDLE).await;
        }
    }
    seen
}

/// Accounts one record read from queue `q` of this shard.
#[allow(clippy::too_many_arguments)]
fn take(
    spec: &ConsumeSpec,
    seen: &mut Seen,
    bits: &mut [u64],
    base: u64,
    count: u64,
    queues: &[QueueRef],
    q: &QueueRef,
    raw: &[u8],
) {
    let Ok(Decoded::Record(r)) = record::decode(raw, RETURNED) else {
        seen.foreign += 1;
        return;
    };
    let index = r
        .property(UNIQ_KEY)
        .and_then(|k| k.strip_prefix('T'))
        .and_then(|k| k.parse::<u64>().ok())
        .filter(|i| (base..base + count).contains(i));
    let due = r.property(TIMER_OUT_MS).and_then(|v| v.parse::<i64>().ok());
    let (Some(i), Some(due)) = (index, due) else {
        seen.foreign += 1;
        return;
    };
    let k = i - base;
    let (word, bit) = ((k / 64) as usize, 1u64 << (k % 64));
    if bits[word] & bit != 0 {
        seen.duplicates += 1;
        return;
    }
    bits[word] |= bit;
    seen.delivered += 1;
    spec.done[0].fetch_add(1, Ordering::Relaxed);
    spec.done[1].fetch_add(r.body.len() as u64, Ordering::Relaxed);
    if queues[(k % queues.len() as u64) as usize].id != q.id {
        seen.misrouted += 1;
    }
    let stored = r.store_timestamp;
    let late = stored - due;
    if late < 0 {
        seen.early += 1;
    }
    let late = late.max(0) as u64;
    seen.lateness.saturating_record(late);
    let sec = (due - spec.window_start).max(0) as usize / 1000;
    if let Some(slot) = seen.by_due_second.get_mut(sec) {
        slot.get_or_insert_with(|| lateness_histogram(2))
            .saturating_record(late);
    }
    let at = ((stored - spec.window_start).max(0) / 1000) as usize;
    let last = seen.per_second.len() - 1;
    seen.per_second[at.min(last)] += 1;
    seen.first_delivery_ms = min_opt(seen.first_delivery_ms, Some(stored));
    seen.last_delivery_ms = seen.last_delivery_ms.max(Some(stored));
}
