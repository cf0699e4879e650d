//! The put path: RocketMQ's `DefaultMessageStore.putMessage`/`putMessages` and the
//! `CommitLog.asyncPutMessage` checks (message limits, batches, disk space, dispatch
//! lag), with store timestamps that never go backwards in log order. A slave refuses
//! every put (`SlaveMode`); a SYNC_MASTER put also waits for a slave
//! (`group_transfer.rs`).
//!
//! Invariants: from the offset assignment to the append nothing awaits, so records
//! land in queue-offset order; an async put issues no I/O (it waits only for a free
//! write window, for dispatch to come within `max_dispatch_lag_bytes`, or for its task
//! queue's next slice); a sync put returns `PutOk` only once `flushed` covers its end.
//! A sync put whose record was appended answers `FlushDiskTimeout` (stored, durability
//! unknown), never `ServiceNotAvailable`, when its flush failed or timed out: RocketMQ
//! clients retry `ServiceNotAvailable`, which would store a record twice if the first
//! copy turned out durable; a put refused before its append is `ServiceNotAvailable`.
//! Every put answers by its deadline, `sync_flush_timeout` after it started, in both
//! modes, whatever the disk does (`deadlines.rs`): a put that found no room by then
//! stored nothing and says `OsPageCacheBusy`; a stored sync put not yet durable says
//! `FlushDiskTimeout`.
//!
//! Decisions:
//! * Properties are encoded once, into scratch buffers kept across puts, to learn each
//!   record's exact length before placing it: three fresh `Vec`s per put were 10% of
//!   the ~1 us of CPU a 1 KiB put costs (perf, `coremq bench --body 1024`, key index off).
//! * Records are encoded straight into the write window (no staging copy).
//! * Waiting puts are timed out by the store's deadline ticker (`deadlines.rs`), not by
//!   a timer per put; an async put reads the clock only if it has to wait.

use super::{Inner, State, Store, scheduled};
use crate::config::{FlushMode, HaRole};
use crate::format::msg_id::{MessageId, MessageIds};
use crate::format::properties;
use crate::format::record::{self, RecordFields};
use crate::format::schedule::{Admission, Position};
use crate::message::*;
use crate::wake::Deadline;

/// Buffers a put fills before it knows where its records go, kept across puts.
#[derive(Default)]
pub(super) struct PutScratch {
    /// Every message's encoded properties, back to back.
    props: Vec<u8>,
    /// Where each message's properties end in `props`.
    ends: Vec<usize>,
    /// Each record's encoded length.
    lens: Vec<u64>,
}

fn valid_topic_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-')
}

impl Store {
    /// Stores one message. Never fails with an error: refusals and failures are
    /// statuses (see [`PutStatus`]).
    /// Takes the message or a reference to it (a caller that reuses its message
    /// saves its allocations).
    pub async fn put(&self, msg: impl std::borrow::Borrow<Message>) -> PutResult {
        self.put_many(std::slice::from_ref(msg.borrow())).await
    }

    /// Stores a classic batch: every message has the same topic and queue, the records
    /// are consecutive in one segment and get consecutive queue offsets.
    pub async fn put_batch(&self, msgs: &[Message]) -> PutResult {
        let Some(first) = msgs.first() else {
            return PutResult::refused(PutStatus::MessageIllegal(IllegalReason::BatchInvalid));
        };
        if msgs.len() > self.inner.cfg.max_batch_messages
            || msgs
                .iter()
                .any(|m| m.topic != first.topic || m.queue_id != first.queue_id)
        {
            return PutResult::refused(PutStatus::MessageIllegal(IllegalReason::BatchInvalid));
        }
        if msgs
            .iter()
            .any(|m| m.sys_flag & record::SYSFLAG_TRANSACTION_MASK != 0)
        {
            return PutResult::refused(PutStatus::MessageIllegal(IllegalReason::BatchTransaction));
        }
        self.put_many(msgs).await
    }

    /// [`Store::put_many_unrecorded`], counted in the store's statistics (its time
    /// read from the clock only if it waits, `crate::stats`).
    async fn put_many(&self, msgs: &[Message]) -> PutResult {
        let (r, latency_us) = crate::stats::timed(self.put_many_unrecorded(msgs)).await;
        let stored = r.status.is_stored();
        self.inner.stats.put(
            latency_us,
            if stored { msgs.len() as u64 } else { 0 },
            r.wrote_bytes as u64,
            !stored,
        );
        r
    }

    /// Puts `msgs`; a delayed or timed message goes to its schedule topic
    /// (`scheduled.rs`), and a batch may not hold one.
    async fn put_many_unrecorded(&self, msgs: &[Message]) -> PutResult {
        let inner = &self.inner;
        match msgs {
            [m] => match inner.admit(m) {
                Admission::Plain => {}
                Admission::Refused(r) => return PutResult::refused(scheduled::refusal_status(r)),
                a => {
                    let s = inner.scheduled_copy(m, a);
                    return self.put_records(std::slice::from_ref(&s), None).await;
                }
            },
            _ => {
                if msgs.iter().any(|m| inner.admit(m) != Admission::Plain) {
                    return PutResult::refused(PutStatus::MessageIllegal(
                        IllegalReason::BatchScheduled,
                    ));
                }
            }
        }
        self.put_records(msgs, None).await
    }

    /// Stores `msgs` as they are; a delivery (`delivery` set) carries its position
    /// as its first property and never waits for a sync flush.
    pub(super) async fn put_records(
        &self,
        msgs: &[Message],
        delivery: Option<Position>,
    ) -> PutResult {
        let inner = &self.inner;
        for m in msgs {
            if let Some(status) = inner.check_message(m) {
                return PutResult::refused(status);
            }
        }
        // Properties encoded once, into the kept scratch buffers (module docs).
        let mut ps = std::mem::take(&mut *inner.put_scratch.borrow_mut());
        ps.props.clear();
        ps.ends.clear();
        ps.lens.clear();
        for m in msgs {
            let start = ps.props.len();
            if let Some(p) = delivery {
                p.encode_property(&mut ps.props);
            }
            if !properties::encode_into(&m.properties, &mut ps.props) {
                *inner.put_scratch.borrow_mut() = ps;
                return PutResult::refused(PutStatus::MessageIllegal(
                    IllegalReason::PropertyInvalid,
                ));
            }
            let f = inner.fields(m, &ps.props[start..], 0, 0, 0);
            if f.stored_properties_len() > record::MAX_PROPERTIES_LEN {
                *inner.put_scratch.borrow_mut() = ps;
                return PutResult::refused(PutStatus::PropertiesSizeExceeded);
            }
            ps.lens.push(f.encoded_len() as u64);
            ps.ends.push(ps.props.len());
        }
        // The put's deadline (module docs): a sync put waits for the flush anyway, an
        // async one reads the clock only if it has to wait.
        let deadline = match inner.cfg.flush_mode {
            FlushMode::Sync => Deadline::started_now(inner.cfg.sync_flush_timeout),
            FlushMode::Async => Deadline::lazy(inner.cfg.sync_flush_timeout),
        };
        let placed = self.put_encoded(msgs, &ps, &deadline).await;
        *inner.put_scratch.borrow_mut() = ps;
        let (mut result, end) = match placed {
            Ok(placed) => placed,
            Err(refused) => return refused,
        };
        // An async put never waits for I/O; yield when this task queue's slice is
        // used up so a tight put loop cannot starve the writer and dispatcher.
        glommio::yield_if_needed().await;
        let wait = delivery.is_none() && msgs[0].property(properties::WAIT) != Some("false");
        // SYNC_MASTER: the slave's wait runs beside the flush's (RocketMQ's
        // `handleDiskFlush` and `handleHA`); a replica status wins over the flush's.
        let replicated = async {
            if wait && inner.cfg.ha.role == HaRole::SyncMaster {
                Some(inner.wait_for_slave(end).await)
            } else {
                None
            }
        };
        let flushed = async {
            self.flush_wait(&mut result, end, wait, &deadline).await;
            result
        };
        let (replica, mut result) = futures_lite::future::zip(replicated, flushed).await;
        if let Some(status) = replica.filter(|s| *s != PutStatus::PutOk)
            && result.status.is_stored()
        {
            result.status = status;
        }
        result
    }

    /// The flush mode's part of a put's acknowledgement.
    async fn flush_wait(&self, result: &mut PutResult, end: u64, wait: bool, deadline: &Deadline) {
        let inner = &self.inner;
        match inner.cfg.flush_mode {
            FlushMode::Async => {
                // The writer wakes itself when a window seals or its interval passes.
                inner.dispatch_wake.notify();
            }
            FlushMode::Sync => {
                let log = &inner.log;
                if wait {
                    log.sync_put_appended().await;
                    // Timed out by the deadline ticker, not a timer per put. Closed
                    // (`Some(false)`): the flush failed; the record may be durable (module
                    // docs).
                    let deadline = deadline.at();
                    result.status = match log.flushed.wait_until(end, deadline).await {
                        Some(true) => PutStatus::PutOk,
                        Some(false) | None => PutStatus::FlushDiskTimeout,
                    };
                } else {
                    // Not waited for: the thread writes it, the shard goes on.
                    log.wake_sync_writer();
                }
            }
        }
    }

    /// The rest of [`Store::put_many`], with every message's properties encoded
    /// (`ps.props[ends[i-1]..ends[i]]`) and its record length known.
    async fn put_encoded(
        &self,
        msgs: &[Message],
        ps: &PutScratch,
        deadline: &Deadline,
    ) -> std::result::Result<(PutResult, u64), PutResult> {
        let inner = &self.inner;
        let lens = &ps.lens;
        let props_of = |i: usize| {
            let start = if i == 0 { 0 } else { ps.ends[i - 1] };
            &ps.props[start..ps.ends[i]]
        };
        let total: u64 = lens.iter().sum();
        if total as usize > inner.cfg.max_record_bytes() {
            return Err(PutResult::refused(PutStatus::MessageIllegal(
                IllegalReason::BodyTooLarge,
            )));
        }
        if inner.state.get() != State::Running || inner.failed.borrow().is_some() {
            return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
        }
        if inner.cfg.ha.role == HaRole::Slave {
            return Err(PutResult::refused(PutStatus::SlaveMode));
        }
        if inner.cfg.disk_space_check && !inner.disk_has_room(total) {
            return Err(PutResult::refused(PutStatus::DiskFull));
        }
        // Backpressure: when dispatch (queues, key index) falls too far behind the log,
        // puts wait for it, so consumers see messages within a bounded lag and a
        // shutdown never has a long backlog to work off; until the put's deadline.
        let busy = || Err(PutResult::refused(PutStatus::OsPageCacheBusy));
        let max_lag = inner.cfg.max_dispatch_lag_bytes;
        let written = inner.log.written();
        if max_lag > 0 && written.saturating_sub(inner.dispatched.get()) > max_lag {
            inner.dispatch_wake.notify();
            let caught_up = inner
                .dispatched
                .wait_until_timed(written - max_lag / 2, deadline.at())
                .await;
            if caught_up.is_none() {
                return busy();
            }
            if caught_up == Some(false) || inner.state.get() != State::Running {
                return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
            }
        }
        match inner.log.reserve(total, deadline).await {
            Ok(true) => {}
            Ok(false) => return busy(),
            Err(e) => {
                tracing::debug!(error = %e, "put refused");
                return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
            }
        }
        // From here to the append nothing awaits: offsets are assigned and bytes
        // placed in one step, so records land in queue-offset order.
        if inner.state.get() != State::Running {
            return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
        }
        let log = &inner.log;
        let placement = log.placement(total);
        if let Some(at) = placement.blank_at {
            log.append_blank(at);
        }
        let first = &msgs[0];
        let queue = inner.queues.get_or_create(&first.topic, first.queue_id);
        // Prepared and rolled-back transaction records get no ConsumeQueue entry, so
        // (as in RocketMQ) they carry queue offset 0 and do not advance the queue.
        let tx_type = first.sys_flag & record::SYSFLAG_TRANSACTION_MASK;
        let in_queue = tx_type != record::SYSFLAG_TRANSACTION_PREPARED
            && tx_type != record::SYSFLAG_TRANSACTION_ROLLBACK;
        let base_q = if in_queue { queue.next_put.get() } else { 0 };
        let ts = inner.store_timestamp();
        let mut phys = placement.start;
        let mut ids = MessageIds::with_capacity(msgs.len());
        // Records are encoded straight into the write window.
        log.append_with(placement.start, total as usize, ts, |out| {
            let mut at = 0usize;
            for (i, m) in msgs.iter().enumerate() {
                let q = if in_queue { base_q + i as u64 } else { 0 };
                let f = inner.fields(m, props_of(i), q, phys, ts);
                let len = lens[i] as usize;
                record::encode_to(&f, &mut out[at..at + len]);
                ids.push(MessageId {
                    store_host: inner.cfg.store_host,
                    offset: phys,
                });
                phys += lens[i];
                at += len;
            }
            debug_assert_eq!(at as u64, total);
        });
        if in_queue {
            queue.next_put.set(base_q + msgs.len() as u64);
        }
        let end = placement.start + total;
        let result = PutResult {
            status: PutStatus::PutOk,
            log_offset: placement.start,
            wrote_bytes: total as u32,
            queue_offset: base_q,
            msg_ids: ids,
            store_timestamp_ms: ts,
        };
        Ok((result, end))
    }
}

impl Inner {
    fn check_message(&self, m: &Message) -> Option<PutStatus> {
        use IllegalReason::*;
        let illegal = |r| Some(PutStatus::MessageIllegal(r));
        if m.topic.is_empty() {
            return illegal(TopicEmpty);
        }
        let max_topic = if m.topic.starts_with("%RETRY%") {
            255
        } else {
            self.cfg.max_topic_len
        };
        if m.topic.len() > max_topic {
            return illegal(TopicTooLong);
        }
        if !m.topic.bytes().all(valid_topic_char) {
            return illegal(TopicInvalidChars);
        }
        if m.queue_id < 0 || m.queue_id >= self.cfg.max_queue_id_exclusive {
            return illegal(QueueIdOutOfRange);
        }
        if m.body.len() > self.cfg.max_message_bytes {
            return illegal(BodyTooLarge);
        }
        None
    }

    fn fields<'a>(
        &self,
        m: &'a Message,
        props: &'a [u8],
        q: u64,
        phys: u64,
        ts: i64,
    ) -> RecordFields<'a> {
        RecordFields {
            topic: &m.topic,
            queue_id: m.queue_id,
            flag: m.flag,
            queue_offset: q as i64,
            phys_offset: phys as i64,
            sys_flag: m.sys_flag,
            born_timestamp: m.born_timestamp_ms,
            born_host: m.born_host,
            store_timestamp: ts,
            store_host: std::net::SocketAddr::V4(self.cfg.store_host),
            reconsume_times: m.reconsume_times,
            prepared_transaction_offset: m.prepared_transaction_offset,
            body: &m.body,
            properties: props,
            record_crc: self.cfg.record_crc,
        }
    }

    /// Store timestamps never go backwards in log order.
    fn store_timestamp(&self) -> i64 {
        let ts = crate::now_ms().max(self.last_store_ts.get());
        self.last_store_ts.set(ts);
        ts
    }
}
