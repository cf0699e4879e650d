//! Every size, limit and interval of a store, validated once at open.
//!
//! Defaults follow RocketMQ's `MessageStoreConfig` where the concept is the same
//! (segment sizes, flush intervals, timeouts, message limits); the write-buffer pool
//! differs on purpose: RocketMQ lends a whole 1 GiB buffer per segment (5 GiB of
//! locked memory), coremq uses a pool of small aligned windows (64 MiB by default).

use crate::error::{Error, Result};
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

/// When a put counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// A put returns once its record is in the write buffer; a background task writes
    /// it out and fdatasyncs every `flush_interval` (and sooner after
    /// `flush_least_pages` pages). A crash can lose the last interval's puts. A put
    /// that finds no free buffer within `sync_flush_timeout` (a stalled disk) gets
    /// `OsPageCacheBusy` and stored nothing.
    Async,
    /// A put returns `PutOk` only after an fdatasync covered it (group commit: one
    /// fdatasync acknowledges every put it covers), or `FlushDiskTimeout` after
    /// `sync_flush_timeout`. Consumers only see records that are durable.
    Sync,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The store root (one shard's directory, laid out as a RocketMQ store root).
    pub root: PathBuf,
    /// CommitLog segment size; a multiple of `write_buffer_bytes`.
    pub commit_log_segment_bytes: u64,
    /// ConsumeQueue entries per file (RocketMQ: 300,000).
    pub consume_queue_entries_per_file: u64,
    /// Largest accepted body (RocketMQ `maxMessageSize`, 4 MiB).
    pub max_message_bytes: usize,
    /// Longest accepted topic (RocketMQ: 127; retry topics up to 255).
    pub max_topic_len: usize,
    /// Queue ids accepted are `0..max_queue_id_exclusive`.
    pub max_queue_id_exclusive: i32,
    pub flush_mode: FlushMode,
    /// Async flush interval (RocketMQ `flushIntervalCommitLog`, 500 ms).
    pub flush_interval: Duration,
    /// Async flush happens early once this many 4 KiB pages are unflushed (RocketMQ: 4).
    pub flush_least_pages: u64,
    /// Async flush of everything at least this often (RocketMQ: 10 s).
    pub flush_thorough_interval: Duration,
    /// How long a put may take, in both flush modes (RocketMQ: 5 s, for sync flush):
    /// a sync put not durable within this gets `FlushDiskTimeout` (stored); a put that
    /// waited this long for room (a free write buffer, or dispatch within
    /// `max_dispatch_lag_bytes`) gets `OsPageCacheBusy` (nothing stored). Counted from
    /// the put's start; a put answers at most an eighth of it (at most 20 ms) late.
    pub sync_flush_timeout: Duration,
    /// Sync flush: the flush mark (`<shard>/flushmark`, recovery's refuse line) is
    /// brought up to the durable position at most this often, off the put path (100 ms;
    /// async flush writes it with every flush instead). Each mark write is a durable
    /// write of its own beside the rounds (`commit_log::flush_mark`'s docs).
    /// Acknowledged records within this lag that a media error damages are cut and kept
    /// in `lost+found/` rather than refused (README "Recovery"). Zero: after every round
    /// (deterministic simulation tests).
    pub flush_mark_interval: Duration,
    /// Commit (write buffer -> file) when at least this many pages are pending (RocketMQ: 4).
    pub commit_least_pages: u64,
    /// Commit at least this often (RocketMQ `commitIntervalCommitLog`, 200 ms).
    pub commit_interval: Duration,
    /// Largest single write the commit task submits.
    pub commit_chunk_bytes: usize,
    /// How many commit writes may be in flight at once.
    pub commit_max_inflight: usize,
    /// Size of one write-buffer window; a multiple of 4096 dividing the segment size.
    pub write_buffer_bytes: usize,
    /// Number of windows in the pool: bounds the memory of the write path and the
    /// in-memory tail that serves recent reads.
    pub write_buffer_count: usize,
    /// ConsumeQueue flush interval (RocketMQ `flushIntervalConsumeQueue`, 1 s); the
    /// checkpoint is written after each.
    pub consume_queue_flush_interval: Duration,
    /// Add RocketMQ's record-CRC property so every byte of a record is checksummed.
    pub record_crc: bool,
    /// Store host written into records and message ids.
    pub store_host: SocketAddrV4,
    /// Largest batch (messages) accepted by `put_batch`.
    pub max_batch_messages: usize,
    /// Largest `max_count` honoured by `get` (RocketMQ caps pulls at 32 by default).
    pub max_get_count: usize,
    /// Commit-log offset of an empty log's first record. A sharded store gives shard
    /// `i` the base `i << 56`, so a commit-log offset (and a message id) names its
    /// shard; a single store, like RocketMQ, starts at 0.
    pub log_base_offset: u64,
    /// Build the key index (RocketMQ `messageIndexEnable`, on by default).
    pub index_enable: bool,
    /// Hash slots per index file (RocketMQ `maxHashSlotNum`, 5,000,000).
    pub index_hash_slots: u32,
    /// Entries per index file (RocketMQ `maxIndexNum`, 20,000,000).
    pub index_max_entries: u32,
    /// Memory for index pages (dirty and cached, 4 KiB each); bounds the index's
    /// memory whatever the number of keys (a flush briefly copies the dirty pages).
    /// The default (32 MiB) holds the default 20 MB slot table.
    pub index_max_dirty_bytes: usize,
    /// A checkpoint round flushes the key index only once it has at least this many
    /// changed 4 KiB pages (capped at a quarter of the page set), or once
    /// `index_flush_thorough_interval` has passed since its last flush (the idea of
    /// RocketMQ's `flushConsumeQueueLeastPages` and `...ThoroughInterval`). A flush
    /// writes the changed slot pages, which keys scatter over the whole table: at 1,000
    /// puts a second a flush every second made ~160 small writes per shard. 0: every round.
    pub index_flush_least_pages: usize,
    /// Longest time between two flushes of a key index that changed; bounds what is
    /// re-indexed after a crash at light load.
    pub index_flush_thorough_interval: Duration,
    /// Results of a key query when the caller does not say (RocketMQ: 32); for
    /// front ends (the store's own calls always pass `max`).
    pub query_default_max: usize,
    /// Most results a key query returns (RocketMQ `maxMsgsNumBatch`, 64).
    pub query_max: usize,
    /// Where the files live: the real file system, or a simulated disk for tests.
    pub disk: crate::io::Disk,
    /// Puts wait while the dispatcher (consume queues, key index) is more than this
    /// many log bytes behind (0: never): bounds how stale consumers and key queries
    /// can be and how long a shutdown takes. RocketMQ has no such bound. The default
    /// (48 MiB, 3/4 of the default write pool) keeps the records still to dispatch in
    /// resident write windows, where the dispatcher decodes them in place: with 256
    /// MiB it trailed beyond the pool and read every record back from disk and
    /// copied it (scenario 1: 2.2 us of CPU per message against 1.75 us at 48 MiB,
    /// and 478k against 552k msg/s; see `docs/performance/store.md`).
    pub max_dispatch_lag_bytes: u64,
    /// Check free space before puts (the two watermarks below). Off only for tests of
    /// what a real write error does.
    pub disk_space_check: bool,
    /// Refuse puts (`DiskFull`) once the file system holding the store is this full
    /// (RocketMQ `diskSpaceWarningLevelRatio`, 0.90); they resume when it is not.
    pub disk_full_ratio: f64,
    /// Refuse puts that would leave less than this free, so the next segment, the
    /// consume queues and the index always have room and a write never hits ENOSPC.
    /// `None`: one segment plus the write pool.
    pub disk_min_free_bytes: Option<u64>,
    /// How often the free space is re-read while it is plentiful (between reads the
    /// bytes written since are subtracted; near the limit it is read on every put).
    pub disk_check_interval: Duration,
    /// Memory for clean key-index pages kept for queries (entry pages, and slot pages
    /// of full files), besides `index_max_dirty_bytes`; filled at open with the newest
    /// entries. 0: none (every query reads its chain from disk). The default (128
    /// MiB) holds 6.7 million entries.
    pub index_cache_bytes: usize,
    /// Memory of the per-shard CommitLog read cache (`crate::read_cache`): large
    /// blocks read with O_DIRECT and shared by every `get` that misses the write
    /// windows, so consumers catching up on interleaved queues read the log once, in
    /// large reads. 0 disables it (every record is then read from the file on its own).
    pub read_cache_bytes: usize,
    /// Size of one read-cache block (a power of two, at least 4096); a block never
    /// spans two segments (it shrinks to the largest power of two dividing the
    /// segment size when needed).
    pub read_cache_block_bytes: usize,
    /// Block reads the read cache keeps in flight at once per shard.
    pub read_cache_inflight: usize,
    /// Blocks read ahead of a reader: the next blocks a `get` needs, and the blocks
    /// after one read sequentially.
    pub read_cache_readahead_blocks: usize,
    /// How a sync-flush round reaches the disk (see [`SyncFlushIo`]).
    pub sync_flush_io: SyncFlushIo,
    /// With [`SyncFlushIo::DsyncWrite`]: a sync put that finds the group-commit
    /// thread waiting for work and nothing else ready to run on its shard writes the
    /// round itself, on the shard's thread, instead of handing it to the thread and
    /// back (one shard, 16 sync puts outstanding: 90-96 k against 55-59 k msg/s at
    /// half the CPU per put; module docs of `commit_log::group_commit`). The shard is
    /// then blocked for that write and fdatasync: work that arrives meanwhile (a read,
    /// a timer, the next put from another thread) waits up to one round, and a disk
    /// that stalls during it stops the shard until it completes (gets served from
    /// memory and the `FlushDiskTimeout` answers of README's durability contract wait
    /// for it too). It pays when the puts come from tasks on the shard; puts from an
    /// outside thread through the handle, 4 outstanding, did 10.0-10.9 k against
    /// 11.3-12.4 k msg/s with it (they cannot be taken in while the shard writes).
    /// Off by default: the thread writes every round.
    pub sync_flush_lead_when_idle: bool,
    /// The longest turn a background task queue of the shard (dispatch, the queue and
    /// index flusher, the clean service, the async-mode writer, delivery of delayed
    /// messages) takes on its executor while it keeps finding work: then the executor
    /// polls I/O and timers and runs the other queues first. `Duration::ZERO`: no
    /// bound (a turn lasts until the executor's preempt timer, 5 ms by default). See
    /// `crate::shard::turns`.
    pub background_turn: Duration,
    /// Zero-fill the commit log this far ahead of the write position, in the
    /// background (RocketMQ's `warmMapedFileEnable`), so sync-flush writes land in
    /// blocks already written: a write into a sparse or preallocated block makes its
    /// fdatasync write metadata too (the journal on a journaled ext4; the inode block on
    /// this project's ext4 without one: a 128 KiB `RWF_DSYNC` write p50 348 us against
    /// 244 us into written blocks). Written a whole chunk (16 MiB) at a time, one 1 MiB
    /// write in flight (see `commit_log`'s module docs). `None`: the write
    /// pool's size (`write_buffer_bytes * write_buffer_count`) in sync mode, 0 (off) in
    /// async mode, where whole-window writes and 500 ms flushes amortise allocation.
    pub commit_log_prewrite_bytes: Option<u64>,
    /// Segment recycling: how many retired commit-log segments are kept, zero-filled,
    /// in `spare/` and renamed into place as the next segments instead of creating new
    /// files (see `commit_log`'s `spare.rs`), so sync-flush writes land in blocks
    /// already written without the prewriter writing ahead. 0 (the default): retired
    /// segments are deleted. Segments retired because the disk is over
    /// `retention.disk_max_used_space_ratio` are always deleted.
    pub commit_log_spare_segments: usize,
    /// Replication: this store's role and the HA protocol's limits (see `crate::ha`).
    pub ha: HaConfig,
    /// Retention: when segments, queue files and index files are deleted (see
    /// `crate::clean`).
    pub retention: RetentionConfig,
    /// Delayed and timed messages (see [`ScheduleConfig`]).
    pub schedule: ScheduleConfig,
    /// Called with (topic, queue id) when dispatch gives a queue new entries, at most
    /// once per queue per dispatch pass, on the shard's thread (RocketMQ's
    /// `MessageArrivingListener`): every record that gets a ConsumeQueue entry counts
    /// (puts from anywhere, delayed and timed deliveries, transaction commits, a
    /// slave's replicated records), the schedule and timer queues aside. The node wakes
    /// the pulls held on that queue. Keep it short; it must not block.
    pub on_arrival: Option<ArrivalHook>,
}

/// Delayed delivery (RocketMQ's `ScheduleMessageService`) and timed messages (RocketMQ
/// 5's timer): see `crate::schedule` and `crate::timer`.
#[derive(Debug, Clone)]
pub struct ScheduleConfig {
    /// RocketMQ's `messageDelayLevel`: the delay of each level, space-separated, units
    /// `s`, `m`, `h`, `d` (and `ms`, coremq's). Default: `1s 5s 10s 30s 1m 2m 3m 4m 5m
    /// 6m 7m 8m 9m 10m 20m 30m 1h 2h`.
    pub message_delay_level: String,
    /// Run the delivery tasks (the sharded store starts them on every master shard).
    /// Off: delayed and timed messages are stored and wait.
    pub deliver: bool,
    /// Accept and deliver timed messages (RocketMQ 5 `timerWheelEnable`, on by
    /// default). Off: a timed message is refused (`IllegalReason::TimerDisabled`). A
    /// time at or before now is an ordinary message either way.
    pub timer_enable: bool,
    /// Timed messages the timer keeps in memory per shard (24 bytes each); the rest wait
    /// in sorted runs on disk (`crate::timer`). Memory per shard stays under this x 24
    /// bytes + 1 MiB however many are pending. Default 262,144 (about 7 MiB).
    pub timer_memory_entries: usize,
    /// How often the timer saves its manifest while something changed (each save
    /// flushes the shard's log first): how much of the timer queue a restart reads
    /// again. Default 10 s.
    pub timer_save_interval: Duration,
    /// Furthest delivery time accepted (RocketMQ 5 `timerMaxDelaySec`: 3 days).
    pub timer_max_delay: Duration,
}

/// The function an [`ArrivalHook`] calls with (topic, queue id).
pub type ArrivalFn = dyn Fn(&str, i32) + Send + Sync;

/// A [`StoreConfig::on_arrival`] callback.
#[derive(Clone)]
pub struct ArrivalHook(pub std::sync::Arc<ArrivalFn>);

impl std::fmt::Debug for ArrivalHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArrivalHook")
    }
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            message_delay_level: crate::format::schedule::DEFAULT_DELAY_LEVELS.to_string(),
            deliver: true,
            timer_enable: true,
            timer_max_delay: Duration::from_secs(3 * 86_400),
            timer_memory_entries: 262_144,
            timer_save_interval: Duration::from_secs(10),
        }
    }
}

impl ScheduleConfig {
    /// The parsed delay levels.
    pub fn levels(&self) -> Result<crate::format::schedule::DelayLevels> {
        crate::format::schedule::DelayLevels::parse(&self.message_delay_level)
            .map_err(|e| Error::Config(format!("message_delay_level: {e}")))
    }

    pub fn validate(&self) -> Result<()> {
        self.levels()?;
        if self.timer_save_interval.is_zero() {
            return Err(Error::Config("timer_save_interval must be positive".into()));
        }
        if !(2..=1 << 28).contains(&self.timer_memory_entries) {
            return Err(Error::Config(format!(
                "timer_memory_entries {} must be within [2, 2^28]",
                self.timer_memory_entries
            )));
        }
        if self.timer_max_delay.is_zero()
            || self.timer_max_delay > Duration::from_secs(365 * 86_400)
        {
            return Err(Error::Config(format!(
                "timer_max_delay {:?} must be within (0, 365 days]",
                self.timer_max_delay
            )));
        }
        Ok(())
    }
}

/// Retention (RocketMQ's `CleanCommitLogService` and `CleanConsumeQueueService`
/// settings; see `crate::clean` for what each rule does). The disk-full level that
/// refuses puts is `StoreConfig::disk_full_ratio`.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// A segment whose newest record is older than this is expired (RocketMQ
    /// `fileReservedTime`: 72 h).
    pub file_reserved_time: Duration,
    /// Local hours at which expired segments are deleted, `;`-separated (RocketMQ
    /// `deleteWhen`: "04"). Empty: never by the clock (space and manual deletion
    /// still apply).
    pub delete_when: String,
    /// Most segments one pass deletes (RocketMQ `deleteFileBatchMax`: 10).
    pub delete_file_batch_max: usize,
    /// Above this share of the disk in use, expired segments are deleted whatever the
    /// hour (RocketMQ `diskMaxUsedSpaceRatio`: 75%).
    pub disk_max_used_space_ratio: f64,
    /// Above this share, the oldest segments are deleted even if not expired, when
    /// `clean_file_forcibly` (RocketMQ `diskSpaceCleanForciblyRatio`: 85%).
    pub disk_clean_forcibly_ratio: f64,
    /// RocketMQ `cleanFileForciblyEnable` (true).
    pub clean_file_forcibly: bool,
    /// How often the cleaner looks (RocketMQ `cleanResourceInterval`: 10 s); a put
    /// refused for a full disk wakes it at once.
    pub clean_interval: Duration,
    /// Pause between two deleted segments of a pass (RocketMQ
    /// `deleteCommitLogFilesInterval`: 100 ms).
    pub delete_interval: Duration,
    /// Never delete log bytes a connected HA slave has not reported yet (the lowest
    /// report among the connected slaves of the shard). RocketMQ has no such rule.
    pub keep_for_slaves: bool,
    /// How often the cleaner's task runs the store's self-check (RocketMQ's
    /// `checkSelf`, `store/self_check.rs`); zero: never. 60 s.
    pub self_check_interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            file_reserved_time: Duration::from_secs(72 * 3600),
            delete_when: "04".into(),
            delete_file_batch_max: 10,
            disk_max_used_space_ratio: 0.75,
            disk_clean_forcibly_ratio: 0.85,
            clean_file_forcibly: true,
            clean_interval: Duration::from_secs(10),
            delete_interval: Duration::from_millis(100),
            keep_for_slaves: true,
            self_check_interval: Duration::from_secs(60),
        }
    }
}

impl RetentionConfig {
    /// The hours `delete_when` names (each within 0..=23).
    pub fn delete_hours(&self) -> Result<Vec<u8>> {
        let mut hours = Vec::new();
        for part in self.delete_when.split(';') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            match part.parse::<u8>() {
                Ok(h) if h < 24 => hours.push(h),
                _ => {
                    return Err(Error::Config(format!(
                        "delete_when {:?}: {part:?} is not an hour within 00..23 (hours are \
                         separated by ';', as RocketMQ's deleteWhen)",
                        self.delete_when
                    )));
                }
            }
        }
        Ok(hours)
    }

    pub fn validate(&self, disk_full_ratio: f64) -> Result<()> {
        let bad = |why: String| Err(Error::Config(why));
        self.delete_hours()?;
        let (used, force) = (
            self.disk_max_used_space_ratio,
            self.disk_clean_forcibly_ratio,
        );
        if !(used > 0.0 && used <= force && force <= disk_full_ratio) {
            return bad(format!(
                "retention ratios must satisfy 0 < disk_max_used_space_ratio ({used}) <= \
                 disk_clean_forcibly_ratio ({force}) <= disk_full_ratio ({disk_full_ratio})"
            ));
        }
        if self.delete_file_batch_max == 0 {
            return bad("delete_file_batch_max must be positive".into());
        }
        if self.clean_interval.is_zero() {
            return bad("retention clean_interval must be positive".into());
        }
        Ok(())
    }
}

/// A store's part in replication (RocketMQ's `brokerRole`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaRole {
    /// Puts never wait for a slave (RocketMQ's default).
    AsyncMaster,
    /// A put returns `PutOk` only once an in-sync slave acknowledged it
    /// (`FlushSlaveTimeout` after `HaConfig::sync_timeout`, `SlaveNotAvailable` at
    /// once when no slave is in sync).
    SyncMaster,
    /// Refuses puts (`PutStatus::SlaveMode`); its log grows only by replication.
    Slave,
}

/// Where a master starts an empty slave (one that reports exactly its shard's base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptySlaveStart {
    /// At the start of the master's last segment, as RocketMQ does: a new slave does
    /// not copy history it may never serve.
    LastSegment,
    /// At the master's first byte: a whole copy.
    FirstSegment,
}

/// Replication settings (RocketMQ's `haListenPort`, `haMasterAddress`, `slaveTimeout`,
/// `haMaxGapNotInSync`, `haSendHeartbeatInterval`, `haHousekeepingInterval`,
/// `haTransferBatchSize`). The listener and the slave's client are started by
/// `ShardedStore::open` (see `crate::ha`).
#[derive(Debug, Clone)]
pub struct HaConfig {
    pub role: HaRole,
    /// The HA port slaves connect to (RocketMQ: 10912); `None`: no listener (the
    /// library's default; the node's is 127.0.0.1:10912).
    pub listen: Option<SocketAddr>,
    /// A slave's master HA address; `None`: a slave that follows nobody (yet).
    pub master_address: Option<SocketAddr>,
    /// SYNC_MASTER: a put not acknowledged by a slave within this gets
    /// `FlushSlaveTimeout` (RocketMQ 4.9.8 and 5.x `slaveTimeout`: 3 s).
    pub sync_timeout: Duration,
    /// SYNC_MASTER: a slave more than this many bytes behind is not in sync, and puts
    /// get `SlaveNotAvailable` at once (RocketMQ `haMaxGapNotInSync`: 256 MiB).
    pub max_gap_not_in_sync: u64,
    /// Largest frame body a master sends and a slave accepts (RocketMQ: 32 KiB; see
    /// `crate::ha` for why 1 MiB here).
    pub max_frame_bytes: usize,
    /// A slave reports, and a master sends an empty frame, after this much silence
    /// (RocketMQ `haSendHeartbeatInterval`: 5 s).
    pub heartbeat_interval: Duration,
    /// A connection that read nothing for this long is closed, on either side
    /// (RocketMQ `haHousekeepingInterval`: 20 s).
    pub housekeeping_interval: Duration,
    /// A slave waits this long before connecting again (RocketMQ: 5 s).
    pub reconnect_interval: Duration,
    pub empty_slave_start: EmptySlaveStart,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            role: HaRole::AsyncMaster,
            listen: None,
            master_address: None,
            sync_timeout: Duration::from_secs(3),
            max_gap_not_in_sync: 256 << 20,
            max_frame_bytes: 1 << 20,
            heartbeat_interval: Duration::from_secs(5),
            housekeeping_interval: Duration::from_secs(20),
            reconnect_interval: Duration::from_secs(5),
            empty_slave_start: EmptySlaveStart::LastSegment,
        }
    }
}

impl HaConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Config(why));
        if !(4096..=64 << 20).contains(&self.max_frame_bytes) {
            return bad(format!(
                "ha max_frame_bytes {} must be within 4096..=67108864",
                self.max_frame_bytes
            ));
        }
        let zero = Duration::ZERO;
        if [
            self.sync_timeout,
            self.heartbeat_interval,
            self.housekeeping_interval,
            self.reconnect_interval,
        ]
        .contains(&zero)
        {
            return bad("ha timeouts and intervals must be positive".into());
        }
        if self.housekeeping_interval <= self.heartbeat_interval {
            return bad(format!(
                "ha housekeeping_interval {:?} must exceed heartbeat_interval {:?}, or idle \
                 connections are closed between heartbeats",
                self.housekeeping_interval, self.heartbeat_interval
            ));
        }
        if self.role != HaRole::Slave && self.master_address.is_some() {
            return bad("ha master_address is only for a slave (role = slave)".into());
        }
        Ok(())
    }
}

/// How the writer makes a sync-flush round durable (measurements in the module docs
/// of `commit_log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncFlushIo {
    /// One `pwritev2(RWF_DSYNC)` per round, written by the shard's group-commit
    /// thread straight from the write windows; the thread starts the next round
    /// itself the moment one ends (`crate::flusher`). On the simulated disk the
    /// writer task runs the rounds, each through a helper thread.
    DsyncWrite,
    /// An io_uring write, then an io_uring fdatasync (the async mode's path): each is
    /// submitted only at the executor's next I/O poll.
    RingWriteFdatasync,
}

pub const PAGE: u64 = 4096;

/// Bits of a commit-log offset below the shard number: shard `i`'s log starts at
/// `i << 56` (`crate::shard::SHARD_SHIFT`).
pub const LOG_SHARD_SHIFT: u32 = 56;

/// The smallest key-index page set allowed (`index_max_dirty_bytes / 4096`).
pub const INDEX_MIN_PAGES: usize = 16;

impl StoreConfig {
    pub fn new(root: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            root: root.into(),
            commit_log_segment_bytes: 1 << 30,
            consume_queue_entries_per_file: 300_000,
            max_message_bytes: 4 * 1024 * 1024,
            max_topic_len: 127,
            max_queue_id_exclusive: 65_536,
            flush_mode: FlushMode::Async,
            flush_interval: Duration::from_millis(500),
            flush_least_pages: 4,
            flush_thorough_interval: Duration::from_secs(10),
            sync_flush_timeout: Duration::from_secs(5),
            flush_mark_interval: Duration::from_millis(100),
            commit_least_pages: 4,
            commit_interval: Duration::from_millis(200),
            commit_chunk_bytes: 1 << 20,
            commit_max_inflight: 8,
            write_buffer_bytes: 4 << 20,
            write_buffer_count: 16,
            consume_queue_flush_interval: Duration::from_secs(1),
            record_crc: true,
            store_host: SocketAddrV4::new([127, 0, 0, 1].into(), 10911),
            max_batch_messages: 4096,
            max_get_count: 1024,
            log_base_offset: 0,
            index_enable: true,
            index_hash_slots: crate::format::index_file::DEFAULT_SLOTS,
            index_max_entries: crate::format::index_file::DEFAULT_ENTRIES,
            index_max_dirty_bytes: 32 << 20,
            index_flush_least_pages: 2048,
            index_flush_thorough_interval: Duration::from_secs(10),
            query_default_max: 32,
            query_max: 64,
            disk: crate::io::Disk::Real,
            max_dispatch_lag_bytes: 48 << 20,
            disk_space_check: true,
            disk_full_ratio: 0.90,
            disk_min_free_bytes: None,
            disk_check_interval: Duration::from_secs(1),
            index_cache_bytes: 128 << 20,
            read_cache_bytes: 64 << 20,
            read_cache_block_bytes: 1 << 20,
            read_cache_inflight: 8,
            read_cache_readahead_blocks: 16,
            sync_flush_io: SyncFlushIo::DsyncWrite,
            sync_flush_lead_when_idle: false,
            background_turn: crate::shard::turns::DEFAULT_BACKGROUND_TURN,
            commit_log_prewrite_bytes: None,
            commit_log_spare_segments: 0,
            ha: HaConfig::default(),
            retention: RetentionConfig::default(),
            schedule: ScheduleConfig::default(),
            on_arrival: None,
        }
    }

    /// Small sizes for tests: 1 MiB segments, 64 KiB windows, 1000-entry CQ files.
    pub fn small_for_tests(root: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            commit_log_segment_bytes: 1 << 20,
            write_buffer_bytes: 64 << 10,
            write_buffer_count: 8,
            consume_queue_entries_per_file: 1000,
            max_message_bytes: 128 << 10,
            commit_chunk_bytes: 64 << 10,
            index_hash_slots: 1024,
            index_max_entries: 4000,
            index_max_dirty_bytes: 256 << 10,
            ..StoreConfig::new(root)
        }
    }

    /// The shard this store is (its log base names it; 0 for a single store).
    pub fn shard_index(&self) -> u32 {
        (self.log_base_offset >> LOG_SHARD_SHIFT) as u32
    }

    pub fn consume_queue_file_bytes(&self) -> u64 {
        self.consume_queue_entries_per_file * crate::format::consume_queue::ENTRY_LEN as u64
    }

    /// Largest total record size: body limit plus 64 KiB for headers, topic and
    /// properties (RocketMQ's rule).
    pub fn max_record_bytes(&self) -> usize {
        self.max_message_bytes + 64 * 1024 + crate::format::record::MAX_PROPERTIES_LEN
    }

    /// How far ahead of the write position the commit log is zero-filled (see
    /// `commit_log_prewrite_bytes`), in whole pages.
    pub fn prewrite_bytes(&self) -> u64 {
        let b = self
            .commit_log_prewrite_bytes
            .unwrap_or(match self.flush_mode {
                FlushMode::Sync => self.write_buffer_bytes as u64 * self.write_buffer_count as u64,
                FlushMode::Async => 0,
            });
        b / PAGE * PAGE
    }

    /// Free bytes below which puts are refused (see `disk_min_free_bytes`).
    pub fn disk_reserve_bytes(&self) -> u64 {
        self.disk_min_free_bytes.unwrap_or(
            self.commit_log_segment_bytes
                + self.write_buffer_bytes as u64 * self.write_buffer_count as u64,
        )
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Config(why));
        if !(self.disk_full_ratio > 0.0 && self.disk_full_ratio <= 1.0) {
            return bad(format!(
                "disk_full_ratio {} must be in (0, 1]",
                self.disk_full_ratio
            ));
        }
        let seg = self.commit_log_segment_bytes;
        let win = self.write_buffer_bytes as u64;
        if win == 0 || !win.is_multiple_of(PAGE) {
            return bad(format!(
                "write_buffer_bytes {win} must be a positive multiple of 4096"
            ));
        }
        if seg < win || !seg.is_multiple_of(win) {
            return bad(format!(
                "commit_log_segment_bytes {seg} must be a multiple of write_buffer_bytes {win}"
            ));
        }
        if self.write_buffer_count < 3 {
            return bad("write_buffer_count must be at least 3".into());
        }
        if (self.max_record_bytes() as u64) + 8 > seg {
            return bad(format!(
                "commit_log_segment_bytes {seg} cannot hold the largest record ({} bytes); \
                 raise it or lower max_message_bytes",
                self.max_record_bytes()
            ));
        }
        if self.max_record_bytes() as u64 > win * (self.write_buffer_count as u64 - 2) {
            return bad("write-buffer pool is too small for the largest record".into());
        }
        if self.consume_queue_entries_per_file == 0 {
            return bad("consume_queue_entries_per_file must be positive".into());
        }
        if self.commit_chunk_bytes == 0 || !(self.commit_chunk_bytes as u64).is_multiple_of(PAGE) {
            return bad("commit_chunk_bytes must be a positive multiple of 4096".into());
        }
        if self.commit_max_inflight == 0 || self.max_get_count == 0 || self.max_batch_messages == 0
        {
            return bad(
                "commit_max_inflight, max_get_count, max_batch_messages must be positive".into(),
            );
        }
        if self.max_topic_len == 0 || self.max_topic_len > 255 {
            return bad("max_topic_len must be within 1..=255".into());
        }
        if !self.log_base_offset.is_multiple_of(seg) || self.log_base_offset >= 1 << 63 {
            return bad(format!(
                "log_base_offset {} must be a multiple of the segment size below 2^63",
                self.log_base_offset
            ));
        }
        if self.max_queue_id_exclusive <= 0 {
            return bad("max_queue_id_exclusive must be positive".into());
        }
        if self.index_hash_slots == 0 || self.index_hash_slots > i32::MAX as u32 / 4 {
            return bad(format!(
                "index_hash_slots (a node's max_hash_slot_num) {} must be within 1..=536870911",
                self.index_hash_slots
            ));
        }
        if self.index_max_entries < 2 || self.index_max_entries > i32::MAX as u32 {
            return bad(format!(
                "index_max_entries (a node's max_index_num) {} must be within 2..=2147483647 \
                 (entry 0 is never used)",
                self.index_max_entries
            ));
        }
        if self.index_max_dirty_bytes < INDEX_MIN_PAGES * PAGE as usize {
            return bad(format!(
                "index_max_dirty_bytes {} must be at least {}",
                self.index_max_dirty_bytes,
                INDEX_MIN_PAGES * PAGE as usize
            ));
        }
        let rb = self.read_cache_block_bytes;
        if rb < PAGE as usize || !rb.is_power_of_two() {
            return bad(format!(
                "read_cache_block_bytes {rb} must be a power of two, at least 4096"
            ));
        }
        if self.read_cache_bytes != 0
            && (self.read_cache_bytes < rb || self.read_cache_inflight == 0)
        {
            return bad(format!(
                "read_cache_bytes {} must be 0 (off) or at least read_cache_block_bytes {rb}, \
                 with read_cache_inflight positive",
                self.read_cache_bytes
            ));
        }
        if self.query_max == 0
            || self.query_default_max == 0
            || self.query_default_max > self.query_max
        {
            return bad("query_default_max and query_max must be positive, default <= max".into());
        }
        self.retention.validate(self.disk_full_ratio)?;
        self.schedule.validate()?;
        self.ha.validate()
    }
}
