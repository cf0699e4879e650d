//! The public message types and the statuses of puts and gets.

use crate::format::msg_id::{MessageId, MessageIds};
use crate::format::properties;
use bytes::Bytes;
use std::net::SocketAddr;

/// Bytes in the CommitLog (a record's position across all segments).
pub type LogOffset = u64;
/// Entries in a ConsumeQueue (a message's position within its queue).
pub type QueueOffset = u64;

/// A message to store.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub queue_id: i32,
    pub flag: i32,
    pub body: Bytes,
    /// User and system properties, stored in this order (`TAGS`, `KEYS`, `UNIQ_KEY`...).
    pub properties: Vec<(String, String)>,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub sys_flag: i32,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl Message {
    pub fn new(topic: impl Into<String>, queue_id: i32, body: impl Into<Bytes>) -> Message {
        Message {
            topic: topic.into(),
            queue_id,
            flag: 0,
            body: body.into(),
            properties: Vec::new(),
            born_timestamp_ms: crate::now_ms(),
            born_host: SocketAddr::from(([127, 0, 0, 1], 0)),
            sys_flag: 0,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.properties.push((name.into(), value.into()));
        self
    }

    pub fn with_tags(self, tags: impl Into<String>) -> Message {
        self.with_property(properties::TAGS, tags)
    }

    /// Space-separated keys, as RocketMQ's `KEYS` property.
    pub fn with_keys(self, keys: impl Into<String>) -> Message {
        self.with_property(properties::KEYS, keys)
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a message was refused as illegal (RocketMQ reports all as `MESSAGE_ILLEGAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IllegalReason {
    TopicEmpty,
    TopicTooLong,
    /// Topic has characters outside RocketMQ's `[%|a-zA-Z0-9_-]`.
    TopicInvalidChars,
    QueueIdOutOfRange,
    BodyTooLarge,
    /// A property name or value contains a 0x01/0x02 separator, or a name is empty.
    PropertyInvalid,
    /// A batch that is empty, too large, or mixes topics/queues.
    BatchInvalid,
    /// A transaction sysflag on a batch (RocketMQ refuses those).
    BatchTransaction,
    /// A batch with a delayed or timed message (RocketMQ refuses delay levels in
    /// batches; put them one at a time).
    BatchScheduled,
    /// `DELAY` or a timer property (`TIMER_DELAY_SEC`, `TIMER_DELAY_MS`,
    /// `TIMER_DELIVER_MS`, `__STARTDELIVERTIME`) is not an integer (RocketMQ 5
    /// `WHEEL_TIMER_MSG_ILLEGAL`).
    ScheduleInvalid,
    /// A delivery time further ahead than `ScheduleConfig::timer_max_delay` (3 days).
    TimerTooFar,
    /// A timed message while `ScheduleConfig::timer_enable` is off (RocketMQ 5
    /// `WHEEL_TIMER_NOT_ENABLE`).
    TimerDisabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutStatus {
    /// Stored (and, in sync-flush mode, durable).
    PutOk,
    /// Sync flush: stored but not known durable within the timeout, or its flush
    /// failed (the store then stops taking writes): after a reopen the record is there
    /// or not. RocketMQ clients do not retry it.
    FlushDiskTimeout,
    MessageIllegal(IllegalReason),
    /// Encoded properties over 32767 bytes.
    PropertiesSizeExceeded,
    /// The store is shutting down or stopped taking writes after an I/O failure;
    /// nothing was stored (RocketMQ clients retry it).
    ServiceNotAvailable,
    /// A new CommitLog segment could not be created.
    CreateMappedFileFailed,
    /// The file system holding the store is too full (`disk_full_ratio`,
    /// `disk_min_free_bytes`); puts resume once space is freed. Nothing was stored.
    DiskFull,
    /// RocketMQ's `OS_PAGE_CACHE_BUSY`: the put found no room within
    /// `sync_flush_timeout` (the write buffers full or dispatch too far behind, as
    /// when the disk stalls) and gave up. Nothing was stored; retrying, here or on
    /// another broker, duplicates nothing. The node answers `SYSTEM_BUSY`, as
    /// RocketMQ does (RocketMQ 5's Java client retries it).
    OsPageCacheBusy,
    /// SYNC_MASTER: stored, but no slave acknowledged it within `ha.sync_timeout`
    /// (RocketMQ `FLUSH_SLAVE_TIMEOUT`).
    FlushSlaveTimeout,
    /// SYNC_MASTER: stored, but no slave is connected or the slave is more than
    /// `ha.max_gap_not_in_sync` behind, so nothing was waited for (RocketMQ 4.x
    /// `SLAVE_NOT_AVAILABLE`, returned at once after storing the message locally).
    SlaveNotAvailable,
    /// This store is a slave: it takes no puts (RocketMQ `SERVICE_NOT_AVAILABLE`,
    /// "slave mode"). Nothing was stored.
    SlaveMode,
}

impl PutStatus {
    /// Whether the message was stored (RocketMQ's "OK-ish" statuses).
    pub fn is_stored(&self) -> bool {
        matches!(
            self,
            PutStatus::PutOk
                | PutStatus::FlushDiskTimeout
                | PutStatus::FlushSlaveTimeout
                | PutStatus::SlaveNotAvailable
        )
    }
}

#[derive(Debug, Clone)]
pub struct PutResult {
    pub status: PutStatus,
    /// Commit-log offset of the (first) record; meaningful when stored.
    pub log_offset: LogOffset,
    /// Bytes written (all records of a batch).
    pub wrote_bytes: u32,
    /// Queue offset of the (first) message.
    pub queue_offset: QueueOffset,
    /// Offset message id of each stored record.
    pub msg_ids: MessageIds,
    pub store_timestamp_ms: i64,
}

impl PutResult {
    pub(crate) fn refused(status: PutStatus) -> PutResult {
        PutResult {
            status,
            log_offset: 0,
            wrote_bytes: 0,
            queue_offset: 0,
            msg_ids: MessageIds::new(),
            store_timestamp_ms: 0,
        }
    }
}

/// RocketMQ's `GetMessageStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetStatus {
    Found,
    NoMatchedMessage,
    MessageWasRemoving,
    OffsetFoundNull,
    OffsetOverflowBadly,
    OffsetOverflowOne,
    OffsetTooSmall,
    NoMatchedLogicQueue,
    NoMessageInQueue,
}

#[derive(Debug, Clone)]
pub struct GetResult {
    pub status: GetStatus,
    pub next_begin_offset: QueueOffset,
    pub min_offset: QueueOffset,
    pub max_offset: QueueOffset,
    /// Raw records, exactly as stored (RocketMQ ships these bytes to clients).
    pub records: Vec<Bytes>,
}

/// A stored message decoded from its record.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub topic: String,
    pub queue_id: i32,
    pub flag: i32,
    pub queue_offset: QueueOffset,
    pub log_offset: LogOffset,
    pub size: u32,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_timestamp_ms: i64,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: Bytes,
    pub properties: Vec<(String, String)>,
    pub msg_id: Option<MessageId>,
}

impl StoredMessage {
    /// Decodes a raw record (as returned by `get`), verifying its checksums.
    pub fn decode(raw: &Bytes) -> Result<StoredMessage, crate::format::Corruption> {
        use crate::format::record::{Decoded, Verify, decode};
        let verify = Verify {
            crc: true,
            at_offset: None,
            max_total_size: raw.len(),
            require_record_crc: false,
        };
        let Decoded::Record(r) = decode(raw, verify)? else {
            return Err(crate::format::Corruption::BadMagic(
                crate::format::record::BLANK_MAGIC,
            ));
        };
        let body_start = r.body.as_ptr() as usize - raw.as_ptr() as usize;
        let msg_id = match r.store_host {
            SocketAddr::V4(h) => Some(MessageId {
                store_host: h,
                offset: r.phys_offset as u64,
            }),
            SocketAddr::V6(_) => None,
        };
        Ok(StoredMessage {
            topic: r.topic.to_string(),
            queue_id: r.queue_id,
            flag: r.flag,
            queue_offset: r.queue_offset as u64,
            log_offset: r.phys_offset as u64,
            size: r.total_size,
            sys_flag: r.sys_flag,
            born_timestamp_ms: r.born_timestamp,
            born_host: r.born_host,
            store_timestamp_ms: r.store_timestamp,
            store_host: r.store_host,
            reconsume_times: r.reconsume_times,
            prepared_transaction_offset: r.prepared_transaction_offset,
            body: raw.slice(body_start..body_start + r.body.len()),
            properties: properties::iter(r.properties)
                .filter(|(n, _)| *n != properties::CRC32)
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            msg_id,
        })
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}
