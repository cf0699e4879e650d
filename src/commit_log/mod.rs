//! The CommitLog of one shard: RocketMQ's `CommitLog`. Every record of the shard's
//! queues goes to one log of fixed-size segment files, written with direct I/O through
//! a pool of in-memory write buffers (RocketMQ's `TransientStorePool` path, the only
//! one here: there is no mmap and no page cache under the log).
//!
//! # Positions
//!
//! Three per log, always `flushed <= committed <= written`:
//! * **written**: puts encode records into the open write buffer (memory only);
//! * **committed**: `[align_down(committed), written)` is written to the segment files at
//!   aligned offsets; the partial last page goes padded with zeros and is rewritten (same
//!   prefix) by the next commit;
//! * **flushed**: an fdatasync (or a `RWF_DSYNC` write) covered every byte below it.
//!
//! `committed` and `flushed` are `OffsetWatch`es: puts, the dispatcher and the buffer
//! pool wait on them. All three only grow while the log is open; recovery sets them once,
//! to the end it keeps. A write buffer is recycled only once wholly committed, so a byte
//! that is not resident is in its segment file; bytes below the page of `committed` never
//! change while the store is open. `flushed` is always a record boundary (dispatch and the
//! checkpoint take it as one). After a write or sync error the log takes no more writes
//! until reopened (fail-stop: `failure()` says why) and the watches are closed.
//!
//! # Flush modes
//!
//! **Async** (RocketMQ's default: `CommitRealTimeService` + `FlushRealTimeService`): `PutOk`
//! means the record is in a write buffer. A sealed buffer is committed at once and the open
//! one within `commit_interval` (200 ms), so a killed process keeps the record once
//! committed; `flush_interval` (500 ms) fdatasyncs what is committed, so a power loss keeps
//! it once flushed. Neither is waited for by the put.
//!
//! **Sync** (RocketMQ's `GroupCommitService`): `PutOk` only after a durable write covering
//! the record returned; one round acknowledges every put it covers, and the next round
//! starts at once with whatever arrived meanwhile. A put not durable within
//! `sync_flush_timeout` gets `FlushDiskTimeout`, never `PutOk`, and consumers only see
//! durable records (dispatch stops at `flushed`). A kill or a power loss keeps every
//! acknowledged record.
//!
//! # Files
//!
//! | file | RocketMQ | what |
//! |---|---|---|
//! | `segments.rs` | `MappedFileQueue`, `MappedFile` | segment files: open, locate, create |
//! | `transient_store_pool.rs` | `TransientStorePool` | write buffers: reserve, append |
//! | `commit.rs` | `CommitRealTimeService` | write buffers to files (`committed`) |
//! | `flush.rs` | `FlushRealTimeService` | the writer task; fdatasync (`flushed`) |
//! | `group_commit.rs` | `GroupCommitService` | sync flush: durable rounds |
//! | `flush_mark.rs` | (none) | the durable position, kept for recovery's refuse line |
//! | `prewrite.rs` | (`warmMappedFile`) | zero-fill ahead of the write position |
//! | `spare.rs` | (`AllocateMappedFileService`) | retired segments recycled as the next ones |
//! | `reader.rs` | `getData`, `selectMappedBuffer` | reads: buffers, files, read-ahead |
//! | `read_cache.rs` | (the OS page cache) | cached blocks for catch-up reads |
//! | `recovery/` | `recoverNormally`, `recoverAbnormally` | the scan and its decision table |
//! | `replica.rs` | `appendToCommitLog`, `getData` for HA | replicated bytes in, committed bytes out |
//!
//! Measurements behind these designs: `docs/performance/commit_log.md`.

mod commit;
mod flush;
mod flush_mark;
pub mod group_commit;
mod prewrite;
pub mod read_cache;
mod read_plan;
mod reader;
mod recovery;
mod replica;
mod retire;
mod segments;
mod spare;
mod transient_store_pool;

pub use reader::{LogReader, READ_AHEAD_BYTES, READ_AHEAD_DEPTH};
pub use recovery::{RecordSink, RecoverPlan, ScanReport};
pub use replica::ReplicaAppend;

use crate::commit_log::flush_mark::FlushMarkFile;
use crate::commit_log::group_commit::GroupCommit;
use crate::commit_log::transient_store_pool::WriteBufferPool;
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::format::record;
use crate::io::{AlignedBuf, File};
use crate::wake::{Notify, OffsetWatch};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub struct CommitLog {
    dir: PathBuf,
    cfg: Rc<StoreConfig>,
    seg_bytes: u64,
    /// Size of one write buffer (`write_buffer_bytes`); buffers are aligned to it.
    buf_bytes: u64,
    segments: RefCell<BTreeMap<u64, Rc<File>>>,
    min_offset: Cell<u64>,
    written: Cell<u64>,
    /// Store timestamp of the last record appended, and the one captured with the
    /// last commit (for the checkpoint's physicMsgTimestamp).
    last_put_ts: Cell<i64>,
    committed_ts: Cell<i64>,
    flushed_ts: Cell<i64>,
    pub committed: OffsetWatch,
    pub flushed: OffsetWatch,
    pool: RefCell<WriteBufferPool>,
    writer_wake: Notify,
    /// The async writer has nothing to commit and waits for its next flush, if any, or
    /// for the next append, which wakes it (`flush.rs`).
    writer_idle: Cell<bool>,
    /// Turns of the writer's loop (`StoreStats::writer_turns`).
    writer_turns: Cell<u64>,
    /// Set after a write/sync failure: no more writes until reopened (fail-stop).
    failed: RefCell<Option<String>>,
    stopping: Cell<bool>,
    flush_now: Cell<bool>,
    /// Commit the open buffer now, without a flush (a SYNC_MASTER put waits for its
    /// bytes to reach a slave, and a master sends only committed bytes).
    commit_now: Cell<bool>,
    /// Records at or after this offset must carry the record-CRC property.
    crc_required_from: Cell<u64>,
    /// Buffers of finished writer-task sync rounds, reused by the next ones.
    round_bufs: RefCell<Vec<AlignedBuf>>,
    /// The group-commit thread (sync flush with `DsyncWrite` on the real disk).
    group_commit: RefCell<Option<Rc<GroupCommit>>>,
    /// Start of the last segment registered with the group-commit thread.
    group_commit_segs: Cell<Option<u64>>,
    /// The range the prewriter is zero-filling right now: commits must not write
    /// there until it is done (two in-flight writes of a page land in any order).
    prewrite_inflight: Cell<Option<(u64, u64)>>,
    /// Notified when a prewrite chunk finished.
    prewrite_idle: Notify,
    /// Notified after each commit round (the prewriter follows the write position).
    prewrite_wake: Notify,
    /// The flush mark (`flushmark`): recovery's refuse line, kept as flushes happen.
    mark: FlushMarkFile,
    /// Set by the sync-flush mark task when a mark write failed: the writer takes it
    /// and stops the log (fail-stop, as for any write error).
    mark_failed: RefCell<Option<Error>>,
    /// Wakes the mark task (the writer ended).
    mark_wake: Notify,
    /// Set once the writer's loop ended (the mark task writes once more, then ends).
    writer_done: Cell<bool>,
    /// Set when retiring a segment failed: no more are retired in this run
    /// (`retire.rs`).
    retire_failed: RefCell<Option<String>>,
    /// Retired segments kept for reuse (`spare.rs`).
    spares: spare::Spares,
}

/// Where a blob of records goes: `start`, after an optional blank at `blank_at`.
pub struct Placement {
    pub start: u64,
    pub blank_at: Option<u64>,
}

impl Drop for CommitLog {
    /// Stops and joins the group-commit thread before the write buffers it reads are
    /// freed (fields drop in declaration order, `pool` first). Normally the writer has
    /// done this already; not when its task was dropped unfinished (an executor that
    /// ended without a shutdown).
    fn drop(&mut self) {
        self.group_commit.get_mut().take();
    }
}

impl CommitLog {
    /// Opens the segments in `dir` (creating the directory) and validates their names
    /// and sizes, reading nothing: [`CommitLog::recover`] then finds the end of valid
    /// data (the log takes no puts before it has).
    pub async fn open_files(cfg: Rc<StoreConfig>, crc_required_from: u64) -> Result<Rc<CommitLog>> {
        let dir = cfg.root.join("commitlog");
        let segments = segments::open_segments(&cfg, &dir).await?;
        let min_offset = segments
            .keys()
            .next()
            .copied()
            .unwrap_or(cfg.log_base_offset);
        let buf_bytes = cfg.write_buffer_bytes as u64;
        let mark = FlushMarkFile::read(&cfg.disk, &cfg.root)?;
        let spares = spare::Spares::open(&cfg)?;
        Ok(Rc::new(CommitLog {
            dir,
            seg_bytes: cfg.commit_log_segment_bytes,
            buf_bytes,
            segments: RefCell::new(segments),
            min_offset: Cell::new(min_offset),
            written: Cell::new(min_offset),
            last_put_ts: Cell::new(0),
            committed_ts: Cell::new(0),
            flushed_ts: Cell::new(0),
            committed: OffsetWatch::new(min_offset),
            flushed: OffsetWatch::new(min_offset),
            pool: RefCell::new(WriteBufferPool::new(buf_bytes)),
            writer_wake: Notify::default(),
            writer_idle: Cell::new(false),
            writer_turns: Cell::new(0),
            failed: RefCell::new(None),
            stopping: Cell::new(false),
            flush_now: Cell::new(false),
            commit_now: Cell::new(false),
            crc_required_from: Cell::new(crc_required_from),
            round_bufs: RefCell::new(Vec::new()),
            group_commit: RefCell::new(None),
            group_commit_segs: Cell::new(None),
            prewrite_inflight: Cell::new(None),
            prewrite_idle: Notify::default(),
            prewrite_wake: Notify::default(),
            mark,
            mark_failed: RefCell::new(None),
            mark_wake: Notify::default(),
            writer_done: Cell::new(false),
            retire_failed: RefCell::new(None),
            spares,
            cfg,
        }))
    }

    /// Whether the record at `offset` must carry the record-CRC property.
    pub fn requires_crc(&self, offset: u64) -> bool {
        self.cfg.record_crc && offset >= self.crc_required_from.get()
    }

    /// Called once recovery knows where records with the CRC property begin.
    pub fn set_crc_required_from(&self, offset: u64) {
        self.crc_required_from.set(offset);
    }

    pub fn crc_required_from(&self) -> u64 {
        self.crc_required_from.get()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn min_offset(&self) -> u64 {
        self.min_offset.get()
    }
    pub fn written(&self) -> u64 {
        self.written.get()
    }
    pub fn segment_bytes(&self) -> u64 {
        self.seg_bytes
    }
    pub fn flushed_timestamp(&self) -> i64 {
        self.flushed_ts.get()
    }
    pub fn failure(&self) -> Option<String> {
        self.failed.borrow().clone()
    }

    /// Where a blob of `len` bytes would go now: at `written`, or at the next segment
    /// after a blank when fewer than `len + 8` bytes remain in this one.
    pub fn placement(&self, len: u64) -> Placement {
        let w = self.written.get();
        let seg_end = self.segment_start(w) + self.seg_bytes;
        if w + len + record::END_FILE_MIN_BLANK_LENGTH as u64 > seg_end {
            Placement {
                start: seg_end,
                blank_at: Some(w),
            }
        } else {
            Placement {
                start: w,
                blank_at: None,
            }
        }
    }

    /// Moves `committed` to `target`, and `flushed` with it when the bytes are durable,
    /// stamped with the store timestamp `ts` of the record ending there (waking the
    /// puts and tasks waiting for them); the prewriter follows.
    fn advance(&self, target: u64, ts: i64, durable: bool) {
        self.committed_ts.set(ts);
        self.committed.set(target);
        if durable {
            self.flushed_ts.set(ts);
            self.flushed.set(target);
        }
        self.prewrite_wake.notify();
    }

    /// Turns of the writer's loop since the log was opened (`StoreStats::writer_turns`).
    pub fn writer_turns(&self) -> u64 {
        self.writer_turns.get()
    }

    /// Asks the writer to commit and flush everything now.
    pub fn request_flush(&self) {
        self.flush_now.set(true);
        self.writer_wake.notify();
    }

    /// Asks the writer to commit everything written now (no fdatasync).
    pub fn request_commit(&self) {
        if !self.commit_now.replace(true) {
            self.writer_wake.notify();
        }
    }

    /// Asks the writer to write and flush everything and then exit.
    pub fn stop_writer(&self) {
        self.stopping.set(true);
        self.writer_wake.notify();
    }
}
