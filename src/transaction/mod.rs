//! Transactional messages: RocketMQ's `TransactionalMessageBridge`,
//! `EndTransactionProcessor` (the message side) and `TransactionalMessageCheckService`.
//!
//! | file | RocketMQ | what |
//! |---|---|---|
//! | `mod.rs` | `TransactionalMessageBridge`, `EndTransactionProcessor.endMessageTransaction` | the messages a transaction writes |
//! | `check.rs` | `TransactionalMessageServiceImpl.check` | finds half messages left undecided |
//!
//! **Layout** (RocketMQ's). A half message (sysFlag prepared, or `TRAN_MSG` true) is
//! stored in [`HALF_TOPIC`] queue 0 as an ordinary (non-transactional) record, with
//! `REAL_TOPIC`/`REAL_QID` naming its queue: no consumer sees it. A commit puts it
//! again into its real queue (sysFlag commit, `TRAN_MSG` and `REAL_*` removed, its
//! `UNIQ_KEY` kept, `preparedTransactionOffset` = the half record's log offset); commit
//! and rollback both write an op record into [`OP_TOPIC`] queue 0 whose body is the
//! half message's queue offset in decimal and whose tags are `d`. A half message with
//! no op record is undecided.
//!
//! **Check-back.** An undecided half message older than the transaction timeout is
//! put again at the end of the half queue with `TRANSACTION_CHECK_TIMES` + 1, an op
//! record retires the original, and the producer is asked about the copy (`check.rs`); after `transactionCheckMax` checks
//! it goes to [`CHECK_MAX_TOPIC`] (RocketMQ 5's) for an operator to inspect. The
//! checker's progress in the half queue is the consumer offset of [`CHECK_GROUP`], as
//! RocketMQ keeps it.
//!
//! **Guarantees.** A half message is never lost: it stays in the half queue until a
//! commit, a rollback or the discard; its decision is durable as the store's flush mode
//! makes puts durable. Like RocketMQ's, decisions are at-least-once: a producer that
//! commits a half message after the checker put it back (its local transaction took
//! longer than the timeout) is asked again about the copy and, if it commits it too,
//! the message is delivered twice.

pub mod check;

use crate::format::properties::{TAGS, TRAN_MSG};
use crate::format::record::{SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_MASK};
use crate::format::schedule::{REAL_QID, REAL_TOPIC, set_property};
use crate::message::{Message, StoredMessage};
use bytes::Bytes;

/// Half messages (RocketMQ `TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC`).
pub const HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
/// Decisions (`RMQ_SYS_TRANS_OP_HALF_TOPIC`).
pub const OP_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
/// Half messages checked `transactionCheckMax` times with no answer (RocketMQ 5's
/// `TRANS_CHECK_MAX_TIME_TOPIC`).
pub const CHECK_MAX_TOPIC: &str = "TRANS_CHECK_MAX_TIME_TOPIC";
/// The checker's consumer group (`TransactionalMessageUtil.buildConsumerGroup`).
pub const CHECK_GROUP: &str = "CID_RMQ_SYS_TRANS";
/// The producer group a half message belongs to.
pub const PGROUP: &str = "PGROUP";
/// How many times a half message was checked back.
pub const CHECK_TIMES: &str = "TRANSACTION_CHECK_TIMES";
/// The client's transaction id (`MessageConst.PROPERTY_TRANSACTION_ID`).
pub const TRANSACTION_ID: &str = "__transactionId__";
/// An op record's tags: removed (`TransactionalMessageUtil.REMOVE_TAG`).
pub const REMOVE_TAG: &str = "d";

/// The message a prepared send stores: `m` moved to [`HALF_TOPIC`] queue 0 with
/// `REAL_TOPIC`/`REAL_QID`, as a plain record (`parseHalfMessageInner`).
pub fn half(mut m: Message) -> Message {
    set_property(&mut m.properties, REAL_TOPIC, m.topic.clone());
    set_property(&mut m.properties, REAL_QID, m.queue_id.to_string());
    m.sys_flag &= !SYSFLAG_TRANSACTION_MASK;
    m.topic = HALF_TOPIC.to_string();
    m.queue_id = 0;
    m
}

/// Where a half message goes when committed; `None` when its `REAL_*` properties are
/// missing or not a queue (not a half message coremq or RocketMQ wrote).
pub fn real_queue(half: &StoredMessage) -> Option<(String, i32)> {
    let topic = half.property(REAL_TOPIC)?.to_string();
    let q = half.property(REAL_QID)?.trim().parse().ok()?;
    Some((topic, q))
}

/// The committed message of `half` (stored at `log_offset`): its real queue, sysFlag
/// commit, `REAL_*` and `TRAN_MSG` removed (`endMessageTransaction`).
pub fn committed(half: &StoredMessage, log_offset: u64) -> Option<Message> {
    let (topic, queue_id) = real_queue(half)?;
    let mut m = copy(half);
    m.properties
        .retain(|(n, _)| n != REAL_TOPIC && n != REAL_QID && n != TRAN_MSG);
    m.topic = topic;
    m.queue_id = queue_id;
    m.sys_flag = (half.sys_flag & !SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT;
    m.prepared_transaction_offset = log_offset as i64;
    Some(m)
}

/// The op record that decides the half message at queue offset `half_offset`.
pub fn op_record(half_offset: u64, born_host: std::net::SocketAddr) -> Message {
    Message {
        topic: OP_TOPIC.to_string(),
        queue_id: 0,
        flag: 0,
        body: Bytes::from(half_offset.to_string()),
        properties: vec![(TAGS.to_string(), REMOVE_TAG.to_string())],
        born_timestamp_ms: crate::now_ms(),
        born_host,
        sys_flag: 0,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// The half message at queue offset an op record's body names.
pub fn decided_offset(op_body: &[u8]) -> Option<u64> {
    std::str::from_utf8(op_body).ok()?.trim().parse().ok()
}

/// How many times `half` was checked back.
pub fn check_times(half: &StoredMessage) -> u32 {
    half.property(CHECK_TIMES)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `half` again at the end of the half queue, checked once more (`putBackHalfMsgQueue`).
pub fn put_back(half: &StoredMessage) -> Message {
    let mut m = copy(half);
    set_property(
        &mut m.properties,
        CHECK_TIMES,
        (check_times(half) + 1).to_string(),
    );
    m
}

/// `half` discarded to [`CHECK_MAX_TOPIC`] queue 0 (properties kept: `REAL_TOPIC`
/// names where it was going).
pub fn discarded(half: &StoredMessage) -> Message {
    let mut m = copy(half);
    m.topic = CHECK_MAX_TOPIC.to_string();
    m.queue_id = 0;
    m
}

fn copy(s: &StoredMessage) -> Message {
    Message {
        topic: s.topic.clone(),
        queue_id: s.queue_id,
        flag: s.flag,
        body: s.body.clone(),
        properties: s.properties.clone(),
        born_timestamp_ms: s.born_timestamp_ms,
        born_host: s.born_host,
        sys_flag: s.sys_flag,
        reconsume_times: s.reconsume_times,
        prepared_transaction_offset: s.prepared_transaction_offset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::SYSFLAG_TRANSACTION_PREPARED;

    fn stored(m: &Message, queue_offset: u64) -> StoredMessage {
        StoredMessage {
            topic: m.topic.clone(),
            queue_id: m.queue_id,
            flag: m.flag,
            queue_offset,
            log_offset: 4096,
            size: 100,
            sys_flag: m.sys_flag,
            born_timestamp_ms: m.born_timestamp_ms,
            born_host: m.born_host,
            store_timestamp_ms: 1,
            store_host: m.born_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: m.body.clone(),
            properties: m.properties.clone(),
            msg_id: None,
        }
    }

    /// Half, commit, op, put-back and discard records as RocketMQ writes them.
    #[test]
    fn the_records_of_a_transaction() {
        let mut m = Message::new("Orders", 3, b"x".to_vec());
        m.sys_flag = SYSFLAG_TRANSACTION_PREPARED | 1;
        m.properties = vec![
            (TRAN_MSG.into(), "true".into()),
            (PGROUP.into(), "pg".into()),
            ("UNIQ_KEY".into(), "U1".into()),
        ];
        let h = half(m);
        assert_eq!(
            (h.topic.as_str(), h.queue_id, h.sys_flag),
            (HALF_TOPIC, 0, 1)
        );
        let s = stored(&h, 7);
        assert_eq!(real_queue(&s), Some(("Orders".into(), 3)));
        let c = committed(&s, 4096).unwrap();
        assert_eq!((c.topic.as_str(), c.queue_id), ("Orders", 3));
        assert_eq!(c.sys_flag, SYSFLAG_TRANSACTION_COMMIT | 1);
        assert_eq!(c.prepared_transaction_offset, 4096);
        assert_eq!(c.property("UNIQ_KEY"), Some("U1"));
        assert_eq!(c.property(PGROUP), Some("pg"));
        for gone in [TRAN_MSG, REAL_TOPIC, REAL_QID] {
            assert_eq!(c.property(gone), None, "{gone}");
        }
        let op = op_record(7, h.born_host);
        assert_eq!((op.topic.as_str(), op.queue_id), (OP_TOPIC, 0));
        assert_eq!(op.property(TAGS), Some(REMOVE_TAG));
        assert_eq!(decided_offset(&op.body), Some(7));
        assert_eq!(decided_offset(b"x7"), None);
        assert_eq!(check_times(&s), 0);
        let back = put_back(&s);
        assert_eq!(back.topic, HALF_TOPIC);
        let again = put_back(&stored(&back, 8));
        assert_eq!(again.property(CHECK_TIMES), Some("2"));
        let d = discarded(&s);
        assert_eq!((d.topic.as_str(), d.queue_id), (CHECK_MAX_TOPIC, 0));
        assert_eq!(d.property(REAL_TOPIC), Some("Orders"));
        let mut broken = s.clone();
        broken.properties.retain(|(n, _)| n != REAL_QID);
        assert!(committed(&broken, 1).is_none());
    }
}
