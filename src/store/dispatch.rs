//! Dispatch: RocketMQ's `ReputMessageService`. Tails the CommitLog and builds each
//! record's ConsumeQueue entry and key-index entries; recovery uses the same code
//! ([`Inner::place_entry`] for its record sink, [`Inner::redispatch`] for a second
//! pass).
//!
//! Invariants:
//! * Records become visible to queue readers (`dispatched`) only once dispatched; in
//!   sync-flush mode the dispatcher stops at the flushed offset, so a consumer never
//!   sees a record that recovery could lose. A sync round may end inside a record: the
//!   rest of it is not durable yet, so it is dispatched with a later range.
//! * When the log fails (fail-stop) the dispatcher still dispatches everything the log
//!   confirmed before the failure, then stops and closes `dispatched`.
//! * Dispatch is idempotent: an entry the queue already holds is skipped, a gap is
//!   `Error::Corrupt` (the queue disagrees with the log) and stops the shard's writes.
//! * Every walk over records goes through [`Inner::dispatch_in_place`] (a
//!   [`Records`] walk that does not await); the one record whose index pages must be
//!   loaded is finished by [`Inner::finish_pending`].
//!
//! Decisions:
//! * Records in a resident write window are decoded where they lie (no copy, no
//!   await), and `max_dispatch_lag_bytes` (48 MiB by default, within the 64 MiB write
//!   pool) keeps dispatch there: reading the records back and copying them cost ~0.4 us
//!   of the ~2.5 us of CPU per 1 KiB put (`docs/performance/store.md`).
//! * Records in a window are walked at most `DISPATCH_PASS_BYTES` (32 KiB) at a time,
//!   with a yield between passes, so a background turn can end there (polls of a whole
//!   1 MiB window took up to 1.8 ms).
//! * Records not resident are read up to 1 MiB at a time into one reused buffer.

use super::{Inner, State};
use crate::commit_log::LogReader;
use crate::config::FlushMode;
use crate::consume_queue::Placed;
use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::consume_queue::CqEntry;
use crate::format::record::{self, Decoded, RecordView, Records, Verify};
use crate::format::schedule::{SCHEDULE_TOPIC, TIMER_TOPIC};
use std::rc::Rc;
use std::time::Duration;

/// The dispatcher looks again this long after its last wake-up even when nothing
/// woke it (a safety net: every write wakes it), doubling while these looks find
/// nothing, up to [`DISPATCH_SAFETY_WAKE_IDLE`], on the shard's tick
/// (`crate::shard::tick`, with the idle shard's other looks): on an idle node the
/// 100 ms look was about 10 of each shard's ~32 wake-ups a second
/// (docs/performance/node.md).
const DISPATCH_SAFETY_WAKE: Duration = Duration::from_millis(100);
/// The longest safety wait of an idle dispatcher: the shard's idle look.
const DISPATCH_SAFETY_WAKE_IDLE: Duration = crate::shard::stall::IDLE_LOOK;

/// The most log bytes one dispatch pass walks without yielding: about 30 records of
/// 1 KiB, well under a background turn (`StoreConfig::background_turn`); dispatch polls
/// of a whole 1 MiB window took up to 1.8 ms.
const DISPATCH_PASS_BYTES: usize = 32 << 10;

/// What [`Inner::dispatch_in_place`] did.
struct InPlace {
    /// Bytes of whole records (and a blank) dispatched.
    consumed: usize,
    /// Queue entries appended.
    appended: u64,
    /// The walk ended at a blank (the rest of the segment is unused).
    blank: bool,
    /// The record at `consumed` whose keys need an awaiting index insert: its size
    /// and how many of its keys are in (its queue entry is placed).
    pending: Option<(usize, usize)>,
}

impl Inner {
    /// The dispatcher task: dispatches what the log confirms (flushed in sync mode,
    /// written in async mode) until the store stops or fails.
    pub(super) async fn run_dispatcher(self: Rc<Self>) {
        // The safety wake-up of every wait below, one timer re-armed each time: a new
        // glommio timer per wait was an allocation per put at low rates.
        let mut safety = glommio::timer::Timer::new(DISPATCH_SAFETY_WAKE);
        let mut safety_wait = DISPATCH_SAFETY_WAKE;
        loop {
            let from = self.dispatched.get();
            let to = self.confirm_offset();
            if from < to {
                safety_wait = DISPATCH_SAFETY_WAKE;
                // A log that begins past its base (a slave started at its master's
                // last segment) meets queues that begin past 0.
                let late = self.log.min_offset() > self.cfg.log_base_offset;
                if let Err(e) = self.dispatch_range(from, to, late).await {
                    tracing::error!(error = %e, "dispatch failed; the shard stops taking writes");
                    *self.failed.borrow_mut() = Some(e.to_string());
                    self.dispatched.close();
                    return;
                }
                glommio::yield_if_needed().await;
                if self.dispatched.get() > from {
                    continue;
                }
                // Only a record cut by `to` is left (a sync round ended inside it):
                // wait for the rest of it below rather than spin.
            }
            if self.log.failure().is_some() {
                if self.confirm_offset() > to {
                    // Confirmed more while the range above awaited.
                    continue;
                }
                // The writer failed: nothing more becomes durable, and everything it
                // confirmed is dispatched. Closed, so `wait_dispatched` and puts
                // waiting for dispatch return.
                self.dispatched.close();
                return;
            }
            // Stopping: exit once everything written is flushed and dispatched.
            let log_done = self.log.flushed.get() >= self.log.written();
            if self.state.get() != State::Running && log_done && to >= self.log.written() {
                // Nothing more becomes visible: a reader waiting past the end
                // (`Store::wait_dispatched_past`) is told so.
                self.dispatched.close();
                return;
            }
            // Running: flushed past `to` is more to dispatch (sync mode). Stopping: the
            // writer's last flush is what ends this loop (above), and it reaches the
            // written end, never past it; waiting for `to + 1` then left the stop to
            // the safety wake-up (up to 100 ms per shutdown).
            let flush_target = if self.state.get() == State::Running {
                to + 1
            } else {
                self.log.written()
            };
            let flushed = self.log.flushed.wait_for(flush_target);
            safety.reset(if safety_wait > DISPATCH_SAFETY_WAKE {
                crate::shard::tick::until(safety_wait)
            } else {
                safety_wait
            });
            let looked = futures_lite::future::or(
                futures_lite::future::or(
                    async {
                        self.dispatch_wake.wait().await;
                        false
                    },
                    async {
                        flushed.await;
                        false
                    },
                ),
                async {
                    (&mut safety).await;
                    true
                },
            )
            .await;
            if looked {
                safety_wait = (safety_wait * 2).min(DISPATCH_SAFETY_WAKE_IDLE);
            }
        }
    }

    /// How far readers may see: the durable end in sync mode, the written end in async.
    pub(super) fn confirm_offset(&self) -> u64 {
        match self.cfg.flush_mode {
            FlushMode::Sync => self.log.flushed.get(),
            FlushMode::Async => self.log.written(),
        }
    }

    /// Builds ConsumeQueue entries (and key-index entries) for the records in
    /// `[from, to)`, reading the log. Returns how many entries were appended
    /// (duplicates are skipped).
    async fn dispatch_range(&self, from: u64, to: u64, rebuild: bool) -> Result<u64> {
        let mut pos = from;
        let mut appended = 0;
        let seg = self.log.segment_bytes();
        let max_total = self.cfg.max_record_bytes();
        let mut buf = std::mem::take(&mut *self.dispatch_buf.borrow_mut());
        let result = async {
            while pos < to {
                let seg_end = pos / seg * seg + seg;
                let mut len = (to.min(seg_end) - pos).min(1 << 20).max(8.min(to - pos)) as usize;
                let pass = len.min(DISPATCH_PASS_BYTES);
                let in_place = self.log.with_resident(pos, pass, |bytes| {
                    self.dispatch_in_place(bytes, pos, rebuild)
                });
                if let Some(done) = in_place {
                    let done = done?;
                    appended += done.appended;
                    pos += done.consumed as u64;
                    if let Some((size, skip)) = done.pending {
                        // The window cannot be held across the index's await: finish
                        // that record from a copy.
                        self.log.read_into(pos, size, &mut buf).await?;
                        self.finish_pending(&buf, pos, skip).await?;
                        pos += size as u64;
                    }
                    if done.consumed > 0 || done.pending.is_some() {
                        self.dispatched.set(pos.max(self.dispatched.get()));
                        // Between passes: a bounded turn ends here (`crate::shard::turns`).
                        glommio::yield_if_needed().await;
                        continue;
                    }
                    // The first record runs past its window: copy just that record
                    // out below (its header first, then all of it).
                    len = len.min(8);
                }
                self.log.read_into(pos, len, &mut buf).await?;
                let (size, _) = record::peek_header(&buf).unwrap_or((0, 0));
                if size as usize > buf.len() && (size as usize) <= max_total {
                    if pos + size as u64 > to {
                        // A sync round ended inside this record (module docs).
                        break;
                    }
                    self.log.read_into(pos, size as usize, &mut buf).await?;
                }
                let mut at = 0;
                loop {
                    let done = self.dispatch_in_place(&buf[at..], pos + at as u64, rebuild)?;
                    appended += done.appended;
                    at += done.consumed;
                    let Some((size, skip)) = done.pending else {
                        break;
                    };
                    self.finish_pending(&buf[at..], pos + at as u64, skip)
                        .await?;
                    at += size;
                }
                if at == 0 {
                    // No whole record at `pos` although the log holds these bytes.
                    return Err(self.invalid_record(pos, Corruption::Truncated));
                }
                pos += at as u64;
                self.dispatched.set(pos.max(self.dispatched.get()));
            }
            Ok(appended)
        }
        .await;
        *self.dispatch_buf.borrow_mut() = buf;
        result
    }

    /// Dispatches the whole records at the start of `bytes` (log offset `pos`) without
    /// awaiting, so it runs on a resident window's bytes where they lie. Stops at the
    /// end of `bytes`, at a record cut by that end, after a blank, or at a record whose
    /// keys need the index to await (`pending`).
    fn dispatch_in_place(&self, bytes: &[u8], pos: u64, rebuild: bool) -> Result<InPlace> {
        self.dispatch_pass.set(self.dispatch_pass.get() + 1);
        let mut done = InPlace {
            consumed: 0,
            appended: 0,
            blank: false,
            pending: None,
        };
        let mut records = Records::new(
            bytes,
            pos,
            Verify::framing(pos, self.cfg.max_record_bytes()),
        );
        for (at, d) in records.by_ref() {
            match d {
                Ok(Decoded::Record(r)) => {
                    self.note_delivered(&r);
                    if r.is_dispatched_to_queue() {
                        done.appended += self.place_entry(&r, rebuild)? as u64;
                    }
                    if let Some(ix) = &self.index
                        && let Some(skip) = ix.add_now(&r)
                    {
                        done.consumed = at;
                        done.pending = Some((r.total_size as usize, skip));
                        return Ok(done);
                    }
                }
                Ok(Decoded::Blank(_)) => done.blank = true,
                // A record cut by the end of `bytes`: the walk stops before it.
                Err(Corruption::Truncated) => {}
                Err(kind) => return Err(self.invalid_record(pos + at as u64, kind)),
            }
        }
        done.consumed = records.consumed();
        Ok(done)
    }

    /// Adds the keys of the record `bytes` starts with (log offset `pos`), from key
    /// `skip` on: the record [`Inner::dispatch_in_place`] left pending, whose queue
    /// entry is placed.
    async fn finish_pending(&self, bytes: &[u8], pos: u64, skip: usize) -> Result<()> {
        let verify = Verify::framing(pos, self.cfg.max_record_bytes());
        let Ok(Decoded::Record(r)) = record::decode(bytes, verify) else {
            unreachable!("the record was decoded in place")
        };
        if let Some(ix) = &self.index {
            ix.add_from(&r, skip).await?;
        }
        Ok(())
    }

    /// [`Inner::dispatch_range`] for recovery, before the store runs: reads `[from, to)`
    /// through a read-ahead [`LogReader`] (several 1 MiB reads in flight, records
    /// decoded in the read buffers) instead of one 1 MiB read and copy at a time.
    pub(super) async fn redispatch(&self, from: u64, to: u64, rebuild: bool) -> Result<u64> {
        let mut reader = LogReader::new(&self.log, from, to);
        let seg = self.log.segment_bytes();
        let max_total = self.cfg.max_record_bytes();
        let mut pos = from;
        let mut appended = 0;
        let result = async {
            while pos < to {
                let seg_end = pos / seg * seg + seg;
                let room = (to.min(seg_end) - pos) as usize;
                let bytes = reader.record(pos, room, max_total).await?;
                let done = self.dispatch_in_place(bytes, pos, rebuild)?;
                appended += done.appended;
                if let Some((size, skip)) = done.pending {
                    let at = pos + done.consumed as u64;
                    self.finish_pending(&bytes[done.consumed..], at, skip)
                        .await?;
                    pos = at + size as u64;
                } else if done.blank {
                    pos = seg_end;
                } else if done.consumed == 0 {
                    // The reader gives a whole record when the log holds one.
                    return Err(self.invalid_record(pos, Corruption::Truncated));
                } else {
                    pos += done.consumed as u64;
                }
            }
            Ok(appended)
        }
        .await;
        reader.finish().await;
        result
    }

    /// Gives the record its ConsumeQueue entry; `false` when the queue already had it.
    /// `rebuild`: the queue is being rebuilt from the log's first record, so an empty
    /// queue may start at a later offset.
    pub(super) fn place_entry(&self, r: &RecordView<'_>, rebuild: bool) -> Result<bool> {
        // A deleted topic's records stay in the log until retention removes them;
        // they never get an entry again (`clean/topics.rs`).
        if self.clean.deleted.is_deleted(r.topic, r.phys_offset as u64) {
            return Ok(false);
        }
        let q = self.queues.get_or_create(r.topic, r.queue_id);
        let entry = CqEntry {
            phys_offset: r.phys_offset,
            size: r.total_size as i32,
            tags_code: self.tags_code_of(r),
        };
        self.last_dispatched_ts.set(r.store_timestamp);
        match q.cq.put(r.queue_offset as u64, entry, rebuild) {
            Placed::Appended => {
                if r.topic == SCHEDULE_TOPIC {
                    self.schedule_arrived(r.queue_id);
                } else if r.topic == TIMER_TOPIC {
                    self.timer_arrived();
                } else if let Some(hook) = &self.cfg.on_arrival {
                    // Once a pass: a batch or a run of one queue's records is one call.
                    let pass = self.dispatch_pass.get();
                    if q.told_in_pass.get() != pass {
                        q.told_in_pass.set(pass);
                        (hook.0)(r.topic, r.queue_id);
                    }
                }
                Ok(true)
            }
            Placed::Duplicate => Ok(false),
            Placed::Gap { expected } => Err(Error::Corrupt {
                path: self
                    .cfg
                    .root
                    .join("consumequeue")
                    .join(r.topic)
                    .join(r.queue_id.to_string()),
                offset: expected,
                kind: Corruption::BadLength(r.queue_offset),
                detail: Some(format!(
                    "record at {} has queue offset {} but the queue ends at {expected}",
                    r.phys_offset, r.queue_offset
                )),
            }),
        }
    }

    /// The error for damage dispatch meets at log offset `at`.
    fn invalid_record(&self, at: u64, kind: Corruption) -> Error {
        Error::Corrupt {
            path: self.log.dir().to_path_buf(),
            offset: at,
            kind,
            detail: Some("dispatch met an invalid record".into()),
        }
    }
}
