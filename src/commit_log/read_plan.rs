//! Where a consumer's records come from: the read side of RocketMQ's
//! `CommitLog.getMessage`, planned for direct I/O with no page cache under it.
//!
//! A `get` names its records (log offset and size, in queue order); the CommitLog
//! decides per record: a resident write window (copied alone, no I/O), the read cache
//! (large shared block reads, for sparse gets of committed bytes), or its own disk
//! read, merged with its neighbours' when the bytes between them are few.
//!
//! Decisions:
//! * A record joins the previous read only when the gap is at most `MERGE_GAP` (8 KiB)
//!   and the read stays under `MAX_SPAN` (1 MiB): merging without that bound read 32
//!   bytes per byte kept for a queue interleaved with 63 others (scenario 5b), and the
//!   returned records pinned those spans (2.6 GiB RSS).
//! * The read cache serves only the leading records wholly below the cacheable
//!   committed bytes and outside the windows (windows hold the newest bytes and
//!   committed only grows, so those come first), and only when they fill less than
//!   half their span: a dense get (one queue written alone, scenario 5a) reads its own
//!   large spans as fast as the disk instead of waiting behind read-ahead.
//! * Up to `IN_FLIGHT` (16) disk reads go out together, not one after another.

use super::CommitLog;
use super::read_cache::ReadCache;
use crate::error::Result;
use crate::wake::join_all;
use bytes::Bytes;
use std::rc::Rc;

const MERGE_GAP: u64 = 8 << 10;
const MAX_SPAN: u64 = 1 << 20;
const IN_FLIGHT: usize = 16;

impl CommitLog {
    /// The records of `wanted`, in order: `range` gives each one's log offset and size;
    /// `check` sees each record's bytes as they arrive (the caller verifies them there,
    /// so a damaged record fails the read before later reads are waited for).
    pub(crate) async fn read_records<T>(
        &self,
        cache: Option<&Rc<ReadCache>>,
        wanted: &[T],
        range: impl Fn(&T) -> (u64, u64),
        mut check: impl FnMut(&T, &[u8]) -> Result<()>,
    ) -> Result<Vec<Bytes>> {
        let cached = match cache {
            Some(cache) => {
                let k = self.cacheable_prefix(cache, wanted, &range);
                let ranges: Vec<(u64, usize)> = wanted[..k]
                    .iter()
                    .map(|w| {
                        let (start, size) = range(w);
                        (start, size as usize)
                    })
                    .collect();
                cache.read_ranges(self, &ranges).await?
            }
            None => Vec::new(),
        };
        for (w, raw) in wanted.iter().zip(&cached) {
            check(w, raw)?;
        }
        let mut out = cached;
        let first = out.len();
        let mut spans: Vec<(u64, u64, std::ops::Range<usize>)> = Vec::new();
        let mut i = first;
        while i < wanted.len() {
            let (start, size) = range(&wanted[i]);
            let mut end = start + size;
            let mut j = i + 1;
            // Records in memory are copied alone.
            if !self.is_resident(start) {
                while j < wanted.len() {
                    let (next, size) = range(&wanted[j]);
                    let next_end = next + size;
                    if next < end || next - end > MERGE_GAP || next_end - start > MAX_SPAN {
                        break;
                    }
                    end = next_end;
                    j += 1;
                }
            }
            spans.push((start, end, i..j));
            i = j;
        }
        out.reserve(wanted.len() - first);
        for group in spans.chunks(IN_FLIGHT) {
            let reads = group
                .iter()
                .map(|(start, end, _)| self.read(*start, (end - start) as usize))
                .collect();
            for (data, (start, _, which)) in join_all(reads).await.into_iter().zip(group) {
                let span = data?;
                for w in &wanted[which.clone()] {
                    let (at, size) = range(w);
                    let at = (at - start) as usize;
                    let raw = span.slice(at..at + size as usize);
                    check(w, &raw)?;
                    out.push(raw);
                }
            }
        }
        Ok(out)
    }

    /// How many of the leading records of `wanted` go through the read cache (see the
    /// module docs): 0 for a dense get.
    fn cacheable_prefix<T>(
        &self,
        cache: &ReadCache,
        wanted: &[T],
        range: &impl Fn(&T) -> (u64, u64),
    ) -> usize {
        let max_record = self.cfg.max_record_bytes() as u64;
        let below = cache.cacheable_below(self.committed.get());
        let k = wanted
            .iter()
            .take_while(|w| {
                let (start, size) = range(w);
                size > 0
                    && size <= max_record
                    && start.checked_add(size).is_some_and(|end| end <= below)
                    && !self.is_resident(start)
            })
            .count();
        let Some(last) = wanted[..k].last() else {
            return 0;
        };
        let (first_start, _) = range(&wanted[0]);
        let (last_start, last_size) = range(last);
        let span = last_start + last_size - first_start;
        let bytes: u64 = wanted[..k].iter().map(|w| range(w).1).sum();
        if bytes * 2 >= span { 0 } else { k }
    }
}
