//! The delivered-positions table: for every lane of a schedule (a shard's delay level,
//! or its timer; `format::schedule`), the newest delivery this shard's log holds. It is
//! what makes scheduled delivery exactly-once across crashes: the delivery tasks start
//! from it, so a message delivered before a crash is never delivered again, and one
//! whose delivery the crash took is delivered once more.
//!
//! RocketMQ keeps the same progress in `config/delayOffset.json`, written every 10 s
//! from memory, so a crash repeats up to 10 s of deliveries (and, with async flush, a
//! power loss can skip some). Here the table is derived from the log alone:
//! * every delivered record carries its position as its first property; the
//!   dispatcher (live, and recovery's replay) hands each such record to [`note`], in
//!   log order;
//! * a note stays *pending* until the log is durable past the record; the checkpoint
//!   round merges what is durable ([`Delivered::merge_upto`]) and writes the merged
//!   table to `config/delayOffset.json` **before** it writes the checkpoint that
//!   points past those records, so the file covers everything below the
//!   checkpoint's resume point and recovery's replay (from that point) notes the rest;
//! * the file is written only when the merged table changed (a file that did not
//!   change covers the newer resume point as well).
//!
//! Recovery never lets the table claim a record the log lost: pending notes are in
//! memory only, and a merged one lies below the durable flushed offset.
//!
//! [`note`]: Delivered::note

use crate::format::delay_offset::{DelayOffsets, Key, Lane};
use crate::format::schedule::{Position, TIMER_LANE};
use std::collections::{BTreeMap, VecDeque};

#[derive(Debug, Default)]
pub(crate) struct Delivered {
    /// Newest delivered position per lane, for records below `base_upto`.
    base: BTreeMap<Lane, Key>,
    base_upto: u64,
    /// Deliveries at or past `base_upto`, in log order: (record end, lane, key).
    pending: VecDeque<(u64, Lane, Key)>,
    /// What the file holds (`None`: not written by this process yet).
    written: Option<BTreeMap<Lane, Key>>,
    /// `dataVersion.counter` of the file.
    counter: i64,
}

impl Delivered {
    /// The table as `config/delayOffset.json` holds it; `own_shard`'s delay levels
    /// come from RocketMQ's `offsetTable` (next offset `n` = position `n - 1`).
    pub(crate) fn from_file(file: &DelayOffsets, own_shard: u32) -> Delivered {
        let mut base = file.delivered.clone();
        for (&level, &next) in &file.offset_table {
            if next > 0 {
                let key = (next as u64 - 1, 0);
                let e = base.entry((own_shard, level as u32)).or_insert(key);
                *e = (*e).max(key);
            }
        }
        Delivered {
            base,
            counter: file.counter,
            ..Default::default()
        }
    }

    /// A delivered record ending at log offset `end` (records come in log order; a
    /// replay may bring one again).
    pub(crate) fn note(&mut self, end: u64, p: Position) {
        let (lane, key) = ((p.shard, p.lane), (p.hi, p.lo));
        if end <= self.base_upto {
            let e = self.base.entry(lane).or_insert(key);
            *e = (*e).max(key);
        } else {
            self.pending.push_back((end, lane, key));
        }
    }

    /// The newest delivery of `lane` this log holds (durable or not).
    pub(crate) fn newest(&self, lane: Lane) -> Option<Key> {
        let pending = self
            .pending
            .iter()
            .filter(|(_, l, _)| *l == lane)
            .map(|(_, _, k)| *k)
            .max();
        self.base.get(&lane).copied().max(pending)
    }

    /// Merges the notes of records ending at or below `upto` (durable and dispatched).
    pub(crate) fn merge_upto(&mut self, upto: u64) {
        while let Some(&(end, lane, key)) = self.pending.front() {
            if end > upto {
                break;
            }
            self.pending.pop_front();
            let e = self.base.entry(lane).or_insert(key);
            *e = (*e).max(key);
        }
        self.base_upto = self.base_upto.max(upto);
    }

    /// The file to write after a merge, or `None` when it would say what the written
    /// one says.
    pub(crate) fn file_if_changed(&mut self, own_shard: u32) -> Option<DelayOffsets> {
        if self.written.as_ref() == Some(&self.base) {
            return None;
        }
        self.counter += 1;
        let mut file = DelayOffsets {
            counter: self.counter,
            log_offset: Some(self.base_upto),
            ..Default::default()
        };
        for (&(shard, lane), &(hi, lo)) in &self.base {
            if shard == own_shard && lane != TIMER_LANE && i32::try_from(lane).is_ok() {
                file.offset_table.insert(lane as i32, hi as i64 + 1);
            } else {
                file.delivered.insert((shard, lane), (hi, lo));
            }
        }
        Some(file)
    }

    /// The file was written with the base as it is now.
    pub(crate) fn written(&mut self, base: BTreeMap<Lane, Key>) {
        self.written = Some(base);
    }

    pub(crate) fn base(&self) -> &BTreeMap<Lane, Key> {
        &self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(shard: u32, lane: u32, hi: u64) -> Position {
        Position {
            shard,
            lane,
            hi,
            lo: 0,
        }
    }

    #[test]
    fn pending_notes_merge_only_when_durable() {
        let mut d = Delivered::default();
        d.note(100, pos(0, 3, 5));
        d.note(200, pos(0, 3, 6));
        assert_eq!(d.newest((0, 3)), Some((6, 0)));
        d.merge_upto(150);
        let f = d.file_if_changed(0).unwrap();
        assert_eq!(f.offset_table.get(&3), Some(&6), "next offset after 5");
        assert_eq!(f.log_offset, Some(150));
        d.written(d.base().clone());
        assert!(d.file_if_changed(0).is_none(), "unchanged");
        d.merge_upto(200);
        let f = d.file_if_changed(0).unwrap();
        assert_eq!(f.offset_table.get(&3), Some(&7));
        // A replayed record below the merged point goes straight to the base.
        d.note(50, pos(1, 2, 9));
        assert_eq!(d.newest((1, 2)), Some((9, 0)));
    }

    #[test]
    fn own_levels_in_offset_table_others_in_coremq_rows() {
        let mut d = Delivered::default();
        d.note(10, pos(1, 3, 4));
        d.note(20, pos(0, 3, 8));
        d.note(
            30,
            Position {
                shard: 1,
                lane: TIMER_LANE,
                hi: 1000,
                lo: 2,
            },
        );
        d.merge_upto(30);
        let f = d.file_if_changed(1).unwrap();
        assert_eq!(f.offset_table.get(&3), Some(&5));
        assert_eq!(f.delivered.get(&(0, 3)), Some(&(8, 0)));
        assert_eq!(f.delivered.get(&(1, TIMER_LANE)), Some(&(1000, 2)));
        let back = Delivered::from_file(&f, 1);
        assert_eq!(back.base(), d.base());
    }
}
