//! The CommitLog of one shard: fixed-size segments written with direct I/O through
//! a pool of in-memory write windows (coremq's TransientStorePool).
//!
//! Three positions, per log, always `flushed <= committed <= written`:
//! * **written**: puts encode records into the current window (memory only);
//! * **committed**: the writer task copies `[align_down(committed), written)` into
//!   aligned DMA buffers and writes them at aligned file offsets; the partial last
//!   page is written padded with zeros and rewritten (same prefix) by the next commit;
//! * **flushed**: the writer fdatasyncs the segments that hold committed bytes.
//!
//! Windows are `write_buffer_bytes` long and aligned to their own size, so a window
//! never spans two segments. The newest windows stay resident and serve reads of
//! recent data; a window is recycled only once it is fully committed, so any byte not
//! resident is in its segment file. Puts never touch a file: segment files are
//! created by the writer (one segment ahead), so no put waits for file creation.
//!
//! Windows are glommio `DmaBuffer`s allocated once at open. Only the newest window is
//! open for appends; once full it is sealed (`Rc<DmaBuffer>`, immutable) and the
//! writer hands it to `write_rc_at` whole, with no copy. Partial commits (the open
//! window, or a sealed window whose head was already committed) copy just their range
//! into a fresh DMA buffer, because puts keep appending to the open window while the
//! write is in flight. Measured with `coremq run --body-bytes 16384`: copying every
//! commit through freshly allocated 1 MiB DMA buffers spent most of its time in page
//! faults and memmove (411 MB/s); sealing full windows removes that copy.
//!
//! Async mode commits only sealed windows until `commit_interval` passes (or a flush
//! is due), so a busy log is written in whole 4 MiB windows rather than re-writing
//! the partial page of the open window every few KiB (RocketMQ's "commit least
//! pages" rule, which the full-window rule replaces).
//!
//! # Recovery
//!
//! `open` verifies (checksums, self-offsets) every record from the checkpoint's safe
//! point, and at least from the start of the segment holding the last flushed byte
//! (RocketMQ re-checks its last files too), then cuts a torn tail or refuses damage
//! (rules at [`CommitLog::recover`] and in the README). The scan reads through a
//! [`LogReader`]: `READ_AHEAD_DEPTH` (8) reads of `READ_AHEAD_BYTES` (1 MiB) in flight,
//! as fio reads in scripts/bench.sh, records decoded and verified in the read buffers;
//! only a record spanning two reads is copied. The records go, as they are verified, to
//! a [`RecordSink`] (the store's queues and key index: one pass, see `store.rs`), from
//! the caller's `replay_from`, which may lie below the verified part (records there
//! are decoded, not checksummed: the checkpoint vouched for them).
//!
//! Measured (scenario 7 by hand: `coremq bench --messages 300000 --body 1024 --queues 64
//! --kill-after-flush`, then `--mode recover`; 2 shards, 176 MB of log each; fio
//! 770-1230 MB/s in the same minute; the machine shared with builds, so noisy):
//! before, the open took 2.7-2.9 s: the scan read 8 MiB at a time, one read in flight,
//! and copied every read into a fresh `Vec` (page faults and zeroing of new memory were
//! ~30% of the profile), 0.54-0.84 s per shard; re-dispatch at open read 1 MiB at a
//! time (0.33 s); the key-index flush at the end of the open took 1.4 s. Then 1.05-1.34
//! s: scan 0.26-0.43 s per shard, and the key index is flushed by the first background
//! round instead. With 1,000,000 messages (1.17 GB of log, fio 1076 MB/s, so 1.09 s):
//! open 2.17 s (2.0x fio) against 10.16 s before; the scans alone read the two shards'
//! 587 MB each in 0.83-0.89 s (faster than fio's single job); re-dispatch was a second
//! pass over the same bytes (0.84-1.08 s per shard with key-index inserts). With the
//! sink (one pass) that pass is gone: 0.83-0.97 s against 2.06-2.20 s, fio 1.22-1.39 s
//! (`store.rs` has the table).
//!
//! # Sync flush (group commit)
//!
//! A round takes everything appended since the last one (from the page of
//! `committed`, whose partial page is rewritten) and makes it durable; every put it
//! covers is acknowledged when it completes, and the next round starts at once with
//! whatever arrived meanwhile. Rounds do not overlap: a round rewrites the previous
//! round's last page, and two in-flight writes of a page may land in either order.
//!
//! With [`SyncFlushIo::DsyncWrite`] (the default) on the real disk the rounds belong
//! to the shard's group-commit thread ([`crate::flusher`]): it writes each round with
//! one `pwritev2(RWF_DSYNC)` straight from the write windows and starts the next one
//! itself; puts publish `written` to it and read `flushed` back (in
//! [`CommitLog::wake_sync_writer`]), and the writer task only keeps segments open
//! ahead of it and turns its progress into `committed`/`flushed` when the shard is
//! idle. On the simulated disk (and before that design) the writer task runs each
//! round itself ([`CommitLog::sync_round`]: copy the bytes, one durable write on the
//! shard's sync-write thread via [`File::write_durable`], wait for it); the
//! group-commit thread's module docs say what that cost.
//!
//! Why not the ring: glommio queues an io_uring request and submits it only at the
//! executor's next I/O poll, which comes when every task queue has run out of work
//! or the preempt timer fires. Under load the producers' puts fill that time, so with
//! `RingWriteFdatasync` each of the round's two steps (write, then fdatasync) first
//! waits for a whole burst of puts to be encoded, and rounds went lock-step with the
//! CPU instead of overlapping it.
//!
//! Prewrite: a background task zero-fills the log from one chunk (16 MiB) to
//! `prewrite_bytes()` ahead of the write position, a whole chunk at a time, one 1 MiB
//! write in flight, and fdatasyncs each chunk, so round writes land in blocks already
//! written. On this ext4 (no journal) a direct write into a sparse block dirties the
//! inode, so its `RWF_DSYNC` also writes the inode (a second, serial device write;
//! block traces show one inode-table write after every round), and concurrent
//! allocating writes serialise: 128 KiB `RWF_DSYNC` writes, one thread, 3,832/s into
//! written blocks against 2,785/s into sparse ones; four threads 7,005/s against
//! 2,020/s. The chunk rules come from block traces of the first version: it refilled
//! exactly up to `prewrite_bytes()` after every round, so it wrote a ~300 KB piece
//! plus an fdatasync per round and kept the inode dirty (every round paid the inode
//! write anyway), and its 16 MiB chunks went out as four 4 MiB writes at once, which a
//! round's write then queued behind (round p99 14 ms). Recovery needs nothing new: a
//! zero-filled tail reads as never-written bytes (`BadMagic(0)`), which end the log;
//! the resync scan reads at most `prewrite_bytes()` of zeros more than before (64 MiB
//! by default).
//!
//! Little's law bounds what any flush design can give: with N puts outstanding per
//! shard, mean latency = N / throughput. At 256 outstanding per shard and a CPU cost
//! of about 5 us per put (load generator included) one core does at most ~200,000
//! puts/s, so the mean latency cannot drop below ~1.3 ms whatever the disk does; the
//! latency target (p99 within 2x fio's write+fdatasync) is only reachable at lower
//! outstanding counts, where the round is disk-bound.
//!
//! ## Measured (2026-12-02, 22:00-22:57 UTC)
//!
//! `coremq bench --flush sync --duration 5 --body 1024 --queues 64 --outstanding N
//! [--shards 1]`, each run right after fio's 4 KiB write + fdatasync (`--ioengine=sync
//! --fdatasync=1 --direct=1` on a pre-written 256 MiB file, 3 s), variants interleaved.
//! The machine was heavily shared (load average 7-8 on 2 CPUs, other helpers building
//! and benchmarking): fio's write+fdatasync p50 swung between 0.1 and 4 ms from one
//! minute to the next (145 us when quiet), so fio ratios from this hour mean little;
//! compare the variants. Round figures come from temporary per-round instrumentation.
//!
//! | 1 shard, 256 outstanding | msg/s | put p50 | put p99 | round I/O avg | gap between rounds |
//! |---|---|---|---|---|---|
//! | before (ring write, ring fdatasync, sparse segments) | 54,000 | 3.3 ms | 15.1 ms | 3.5 ms | 955 us |
//! | ring, writer queue `Latency::Matters` | 38,000 | 5.0 ms | 22.4 ms | 3.4 ms | 3 us |
//! | dsync thread, writer `NotImportant` | 94,000 | 1.6 ms | 16.9 ms | 1.5 ms | 983 us |
//! | dsync thread + `Matters` | 105,000 | 1.46 ms | 8.0 ms | 1.2 ms | 197 us |
//! | + prewrite (this code), two runs | 125,000-130,000 | 1.34-1.45 ms | 7.1-7.6 ms | 0.94-1.0 ms | 200 us |
//! | same minute without prewrite, two runs | 50,000-88,000 | 1.6-1.7 ms | 9.5-62 ms | 1.4-2.5 ms | 60-170 us |
//!
//! Prewrite cut the round's p90 from 2.7-3.9 ms to 1.3 ms. Interleaved with the old
//! binary at 22:54 (1 shard, 256): before 85,391 msg/s, p50 1.71 ms, p99 12.8 ms; now
//! 120,702 msg/s, p50 1.43 ms, p99 7.8 ms (fio write+fdatasync p99 that minute: 13 ms).
//!
//! Two shards (N per shard), interleaved at 22:53-22:55 with the disk saturated (the
//! `RWF_DSYNC` syscall of a 150 KB round took 1.25 ms at p50, and the device was the
//! limit):
//!
//! | outstanding | before: msg/s, p50, p99 | now: msg/s, p50, p99 |
//! |---|---|---|
//! | 256 | 203,064, 1.79 ms, 11.6 ms | 162,600, 2.41 ms, 6.9 ms |
//! | 128 | 149,522, 1.22 ms, 6.7 ms | 126,656, 1.60 ms, 4.5 ms |
//! | 32 | 74,666, 0.53 ms, 5.5 ms | 57,410, 0.94 ms, 3.2 ms |
//!
//! and at 22:56 (256): now 147,683 msg/s (p99 11.6 ms); without prewrite 118,974 (p99
//! 20.9 ms); ring + `Matters` + prewrite 128,152 (9.4 ms); ring + prewrite 157,937
//! (10.5 ms); before 160,858 (10.3 ms). On two shards with a saturated disk the
//! throughput differences are within the run-to-run noise, the p99 is lower in most
//! runs; on one shard the new path is clearly ahead. Not reached: 300,000 msg/s at 256
//! outstanding and p99 within 2x fio. The next step (the group-commit thread,
//! 2026-12-03) is measured in `flusher.rs`.

pub mod group_commit;
pub mod read_cache;
mod read_plan;

use crate::commit_log::group_commit::{Flusher, Layout};
use crate::config::{FlushMode, StoreConfig, SyncFlushIo};
use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::record::{self, Decoded, RecordView, Verify};
use crate::io::{self, AlignedBuf, File, PAGE, align_down, align_up};
use crate::wake::{Notify, OffsetWatch, join_all};
use bytes::Bytes;
use glommio::allocate_dma_buffer;
use glommio::io::DmaBuffer;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Size of one prewrite write (see `run_prewriter`).
const PREWRITE_UNIT: u64 = 1 << 20;

/// One write of a commit round.
enum CommitJob {
    Copy(DmaBuffer),
    Whole(Rc<DmaBuffer>),
}

/// A write window: the last one is open for appends, the others sealed.
enum Win {
    Open(DmaBuffer),
    Sealed(Rc<DmaBuffer>),
}

impl Win {
    fn bytes(&self) -> &[u8] {
        match self {
            Win::Open(b) => b.as_bytes(),
            Win::Sealed(b) => b.as_bytes(),
        }
    }

    fn ptr(&self) -> *const u8 {
        match self {
            Win::Open(b) => b.as_ptr(),
            Win::Sealed(b) => b.as_ptr(),
        }
    }
}

struct Windows {
    /// Window index of `resident[0]`.
    first: u64,
    resident: VecDeque<Win>,
    /// Zeroed buffers ready for use.
    free: Vec<DmaBuffer>,
}

impl Windows {
    /// Seals the open window and opens a free one after it.
    fn push_new(&mut self) {
        if let Some(Win::Open(_)) = self.resident.back() {
            let Some(Win::Open(b)) = self.resident.pop_back() else {
                unreachable!()
            };
            self.resident.push_back(Win::Sealed(Rc::new(b)));
        }
        let buf = self.free.pop().expect("reserve() made room");
        self.resident.push_back(Win::Open(buf));
    }
}

pub struct CommitLog {
    dir: PathBuf,
    cfg: Rc<StoreConfig>,
    seg_bytes: u64,
    win_bytes: u64,
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
    windows: RefCell<Windows>,
    writer_wake: Notify,
    /// Set after a write/sync failure: no more writes until reopened (fail-stop).
    failed: RefCell<Option<String>>,
    stopping: Cell<bool>,
    flush_now: Cell<bool>,
    /// Records at or after this offset must carry the record-CRC property.
    crc_required_from: Cell<u64>,
    /// Buffers of finished sync rounds, reused by the next ones.
    round_bufs: RefCell<Vec<AlignedBuf>>,
    /// The group-commit thread (sync flush with `DsyncWrite` on the real disk).
    flusher: RefCell<Option<Rc<Flusher>>>,
    /// Start of the last segment registered with the flusher.
    flusher_segs: Cell<Option<u64>>,
    /// When sync puts' deadlines were last checked ([`CommitLog::expire_sync_waits`]).
    last_expiry: Cell<Instant>,
    /// The range the prewriter is zero-filling right now: commits must not write
    /// there until it is done (two in-flight writes of a page land in any order).
    prewrite_inflight: Cell<Option<(u64, u64)>>,
    /// Notified when a prewrite chunk finished.
    prewrite_idle: Notify,
    /// Notified after each commit round (the prewriter follows the write position).
    prewrite_wake: Notify,
}

/// Where a blob of records goes: `start`, after an optional blank at `blank_at`.
pub struct Placement {
    pub start: u64,
    pub blank_at: Option<u64>,
}

/// What recovery found at the end of the log.
#[derive(Debug, Clone, Default)]
pub struct ScanReport {
    pub records: u64,
    pub end: u64,
    /// Set when a torn tail was cut: (offset, what was wrong there, bytes zeroed).
    pub truncated: Option<(u64, Corruption, u64)>,
    /// Set when a record below the verified part could not be decoded (the replay
    /// start was not a record boundary, or the log is damaged there): the sink got
    /// nothing from there on, and the caller must rebuild from the log's start.
    pub replay_failed: Option<(u64, Corruption)>,
}

/// Where [`CommitLog::recover`] starts and what it may trust.
#[derive(Debug, Clone, Copy)]
pub struct RecoverPlan {
    /// Verify (checksums, self-offsets) from here: the checkpoint's safe point.
    pub scan_from: u64,
    /// Records below this were acknowledged durable: damage there is refused.
    pub durable_below: u64,
    /// The checkpoint of a clean shutdown: never-written bytes exactly at
    /// `durable_below` are the normal end of the log.
    pub trust_end: bool,
    /// Hand records to the sink from here (a record boundary; may lie below
    /// `scan_from`, where the structures being rebuilt resume).
    pub replay_from: u64,
}

/// Takes the records recovery reads, in log order, while the scan reads them (so a
/// rebuild costs no second pass over the log).
pub trait RecordSink {
    /// The record at log offset `pos` (`r.phys_offset == pos`).
    fn record(&mut self, pos: u64, r: &RecordView<'_>) -> impl Future<Output = Result<()>>;
}

impl Drop for CommitLog {
    /// Stops and joins the group-commit thread before the windows it reads are freed
    /// (fields drop in declaration order, `windows` first). Normally the writer has
    /// done this already; not when its task was dropped unfinished (an executor that
    /// ended without a shutdown).
    fn drop(&mut self) {
        self.flusher.get_mut().take();
    }
}

impl CommitLog {
    /// Opens the segments in `dir` (creating the directory) and validates their names
    /// and sizes, reading nothing: [`CommitLog::recover`] then finds the end of valid
    /// data (the log takes no puts before it has).
    pub async fn open_files(cfg: Rc<StoreConfig>, crc_required_from: u64) -> Result<Rc<CommitLog>> {
        let dir = cfg.root.join("commitlog");
        cfg.disk.create_dir_all(&dir)?;
        let seg_bytes = cfg.commit_log_segment_bytes;
        let (files, other) = cfg.disk.list_offset_files(&dir)?;
        if let Some(p) = other.first() {
            return Err(Error::BadLayout {
                path: p.clone(),
                why: "unexpected file in commitlog/ (segments are named by 20-digit offsets)"
                    .into(),
            });
        }
        let mut segments = BTreeMap::new();
        let mut expected: Option<u64> = None;
        let count = files.len();
        for (i, (start, path)) in files.into_iter().enumerate() {
            let len = cfg.disk.file_len(&path)?;
            if len == 0 && i + 1 == count {
                // A segment created but never sized (crash during creation).
                cfg.disk.remove_file(&path)?;
                continue;
            }
            if start % seg_bytes != 0 || len != seg_bytes {
                return Err(Error::BadLayout {
                    path,
                    why: format!(
                        "segment is {len} bytes at offset {start}; this store uses {seg_bytes}-byte \
                         segments (set commit_log_segment_bytes to the size the store was created with)"
                    ),
                });
            }
            if let Some(exp) = expected.filter(|exp| *exp != start) {
                return Err(Error::BadLayout {
                    path,
                    why: format!("gap in the commit log: expected a segment at {exp}"),
                });
            }
            expected = Some(start + seg_bytes);
            segments.insert(start, cfg.disk.open(&path, false).await?);
        }
        let min_offset = segments
            .keys()
            .next()
            .copied()
            .unwrap_or(cfg.log_base_offset);
        let win_bytes = cfg.write_buffer_bytes as u64;
        let log = Rc::new(CommitLog {
            dir,
            seg_bytes,
            win_bytes,
            segments: RefCell::new(segments),
            min_offset: Cell::new(min_offset),
            written: Cell::new(min_offset),
            last_put_ts: Cell::new(0),
            committed_ts: Cell::new(0),
            flushed_ts: Cell::new(0),
            committed: OffsetWatch::new(min_offset),
            flushed: OffsetWatch::new(min_offset),
            windows: RefCell::new(Windows {
                first: 0,
                resident: VecDeque::new(),
                free: Vec::new(),
            }),
            writer_wake: Notify::default(),
            failed: RefCell::new(None),
            stopping: Cell::new(false),
            flush_now: Cell::new(false),
            crc_required_from: Cell::new(crc_required_from),
            round_bufs: RefCell::new(Vec::new()),
            flusher: RefCell::new(None),
            flusher_segs: Cell::new(None),
            last_expiry: Cell::new(Instant::now()),
            prewrite_inflight: Cell::new(None),
            prewrite_idle: Notify::default(),
            prewrite_wake: Notify::default(),
            cfg,
        });
        Ok(log)
    }

    /// Recovery: scans from `plan.scan_from` (and at least the segment holding the
    /// last flushed byte) to find the end of valid data, cuts a torn tail or refuses
    /// damage (records below `plan.durable_below` must be valid), and hands every
    /// record from `plan.replay_from` to `sink` as the scan reads it, so whatever the
    /// caller rebuilds from the log (queues, key index) costs no second read. Records
    /// below the scan's start (when `replay_from` is lower) are decoded, not
    /// checksummed: the checkpoint vouched for them. Only records before the end that
    /// recovery keeps reach the sink; an error from the sink ends the scan with it.
    pub async fn recover<S: RecordSink>(
        &self,
        plan: RecoverPlan,
        sink: &mut S,
    ) -> Result<ScanReport> {
        // Re-verify at least the segment holding the last flushed byte on every open
        // (RocketMQ re-checks its last files too): damage there is refused, not served.
        let min_offset = self.min_offset();
        let verify_from = self
            .segment_start(plan.durable_below.saturating_sub(1))
            .max(min_offset);
        let scan_from = plan.scan_from.max(min_offset).min(verify_from);
        let replay_from = plan.replay_from.max(min_offset);
        let report = self
            .scan(
                scan_from,
                replay_from,
                plan.durable_below,
                plan.trust_end,
                sink,
            )
            .await?;
        self.set_end(report.end).await?;
        // What recovery kept may not have been fdatasync'ed before the crash; make it
        // durable before the checkpoint says it is.
        let mut seg = self.segment_start(scan_from);
        while seg <= self.segment_start(report.end) {
            if let Some(f) = self.segment_file(seg) {
                f.sync().await?;
            }
            seg += self.seg_bytes;
        }
        Ok(report)
    }

    fn segment_start(&self, off: u64) -> u64 {
        off / self.seg_bytes * self.seg_bytes
    }

    /// The segment file and the position in it of commit-log offset `off`.
    pub fn locate(&self, off: u64) -> (PathBuf, u64) {
        let seg = self.segment_start(off);
        (self.segment_path(seg), off - seg)
    }

    fn segment_path(&self, start: u64) -> PathBuf {
        self.dir.join(io::offset_name(start))
    }

    /// The segment file holding commit-log offset `off` and the position in it (for
    /// the read cache, which reads whole committed blocks itself).
    pub(crate) fn file_at(&self, off: u64) -> Option<(Rc<File>, u64)> {
        let seg = self.segment_start(off);
        self.segment_file(seg).map(|f| (f, off - seg))
    }

    fn segment_file(&self, start: u64) -> Option<Rc<File>> {
        self.segments.borrow().get(&start).cloned()
    }

    /// The segment file starting at `start`, created (sized, sparse) if missing.
    async fn ensure_segment(&self, start: u64) -> Result<Rc<File>> {
        if let Some(f) = self.segment_file(start) {
            return Ok(f);
        }
        let path = self.segment_path(start);
        let f = self.cfg.disk.create_sized(&path, self.seg_bytes).await?;
        tracing::debug!(path = %path.display(), "created commit-log segment");
        Ok(self.segments.borrow_mut().entry(start).or_insert(f).clone())
    }

    /// Reads `len` bytes at `off` straight from the segment files (no windows).
    async fn read_files(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        let mut pos = off;
        while out.len() < len {
            let seg = self.segment_start(pos);
            let Some(file) = self.segment_file(seg) else {
                break;
            };
            let want = (len - out.len()).min((seg + self.seg_bytes - pos) as usize);
            let r = file.read(pos - seg, want).await?;
            out.extend_from_slice(&r[..]);
            if r.len() < want {
                break;
            }
            pos += want as u64;
        }
        Ok(out)
    }

    /// Recovery scan: validates records from `from` and returns where valid data ends,
    /// handing every record from `replay_from` to `sink` (see [`CommitLog::recover`]).
    /// Reads go through a [`LogReader`] (several large reads in flight, records
    /// verified in the read buffers, no copy but for records spanning two reads).
    async fn scan<S: RecordSink>(
        &self,
        from: u64,
        replay_from: u64,
        durable_below: u64,
        trust_end: bool,
        sink: &mut S,
    ) -> Result<ScanReport> {
        let max_total = self.cfg.max_record_bytes();
        let mut report = ScanReport::default();
        let start = replay_from.min(from);
        let mut pos = start;
        let limit = self
            .segments
            .borrow()
            .keys()
            .next_back()
            .map_or(start, |s| s + self.seg_bytes);
        let mut reader = LogReader::new(self, start, limit);
        let walked = async {
            loop {
                let seg = self.segment_start(pos);
                // Below `from` the records are only replayed for the sink.
                let verified = pos >= from;
                let feed = pos >= replay_from && report.replay_failed.is_none();
                let bad = if self.segment_file(seg).is_none() {
                    if verified {
                        return Ok(None);
                    }
                    Some((pos, Corruption::Truncated))
                } else {
                    let seg_end = seg + self.seg_bytes;
                    let room = (seg_end - pos) as usize;
                    let buf = reader.record(pos, room, max_total).await?;
                    let verify = Verify {
                        crc: verified,
                        at_offset: Some(pos as i64),
                        max_total_size: max_total,
                        require_record_crc: verified && self.requires_crc(pos),
                    };
                    match record::decode(buf, verify) {
                        Ok(Decoded::Record(r)) => {
                            if verified {
                                if r.record_crc_verified == Some(true)
                                    && self.crc_required_from.get() == u64::MAX
                                {
                                    // Without a checkpoint, learn from the log: once a
                                    // record carries the record-CRC property, all later
                                    // ones must.
                                    self.crc_required_from.set(pos);
                                }
                                report.records += 1;
                            }
                            self.last_put_ts.set(r.store_timestamp);
                            if feed {
                                sink.record(pos, &r).await?;
                            }
                            pos += r.total_size as u64;
                            // RocketMQ never writes a record this close to the end.
                            (pos + record::END_FILE_MIN_BLANK_LENGTH as u64 > seg_end)
                                .then_some((pos, Corruption::BadLength(r.total_size as i64)))
                        }
                        Ok(Decoded::Blank(n)) if pos + n as u64 == seg_end => {
                            pos = seg_end;
                            None
                        }
                        Ok(Decoded::Blank(n)) => Some((pos, Corruption::BadLength(n as i64))),
                        Err(e) => Some((pos, e)),
                    }
                };
                let Some((at, kind)) = bad else {
                    continue;
                };
                if at >= from {
                    return Ok(Some((at, kind)));
                }
                // Below the verified part: the replay start was no record boundary or
                // the log is damaged where the checkpoint vouched for it. Not this
                // scan's to judge: verify from `from` as without a replay; the caller
                // rebuilds from the log's first record (which refuses real damage).
                tracing::warn!(
                    offset = at, %kind, verified_from = from,
                    "recovery replay met an undecodable record below the verified part; \
                     the rebuild falls back to the whole log"
                );
                report.replay_failed = Some((at, kind));
                pos = from;
            }
        }
        .await;
        reader.finish().await;
        let bad = walked?;
        report.end = pos;
        let Some((bad_at, kind)) = bad else {
            return Ok(report);
        };
        let path = self.segment_path(self.segment_start(bad_at));
        if bad_at < durable_below {
            return Err(Error::Corrupt {
                path,
                offset: bad_at - self.segment_start(bad_at),
                kind,
                detail: Some(format!(
                    "commit-log offset {bad_at} is below the checkpointed flushed offset \
                     {durable_below}: acknowledged data is damaged; refusing to truncate it"
                )),
            });
        }
        // Never-written bytes exactly where a clean shutdown's checkpoint says the log
        // ends are the normal end: only later segments need a look (cheap: holes are
        // skipped). Anything else gets the full look past the bad record.
        let is_end_of_data =
            kind == Corruption::BadMagic(0) && trust_end && bad_at == durable_below;
        let look_from = if is_end_of_data {
            self.segment_start(bad_at) + self.seg_bytes
        } else {
            bad_at + 1
        };
        let (found, last_nonzero) = self.resync_scan(look_from).await?;
        if let Some(valid_at) = found {
            // A power loss tears the writes of the last unsynced round: sectors that
            // never reached the disk read as their old contents (zeros, or the page's
            // earlier version, which is zeros where the new records went), while later
            // sectors of the same round may have landed. So a bad record with a sector
            // whose part in it is all zeros, with all data after it ending within one write pool
            // (the most a round leaves unsynced), is a torn tail: nothing after it
            // was acknowledged. The cut bytes are kept in lost+found/ all the same.
            // A fully written record that fails its checksum is damage: refused.
            let window = self.win_bytes * self.cfg.write_buffer_count as u64;
            let end = last_nonzero.map_or(valid_at, |l| l + 1).max(valid_at + 1);
            if end - bad_at <= window
                && !self.any_data_from(bad_at + window).await?
                && self.has_zero_sector(bad_at, valid_at).await?
            {
                let kept = self.quarantine(bad_at, end).await?;
                let zeroed = self.zero_range(bad_at, end).await?;
                report.truncated = Some((bad_at, kind, zeroed));
                tracing::error!(
                    offset = bad_at, %kind, valid_at, zeroed, kept = %kept.display(),
                    "commit log: cut a torn tail that had valid records after a hole (unsynced writes \
                     torn by a power loss); the cut bytes are kept"
                );
                return Ok(report);
            }
            return Err(Error::Corrupt {
                path,
                offset: bad_at - self.segment_start(bad_at),
                kind,
                detail: Some(format!(
                    "commit-log offset {bad_at} is damaged but a valid record follows at {valid_at}: \
                     interior corruption; refusing to truncate acknowledged data"
                )),
            });
        }
        if let Some(last) = last_nonzero {
            let zeroed = self.zero_range(bad_at, last + 1).await?;
            report.truncated = Some((bad_at, kind, zeroed));
            tracing::warn!(offset = bad_at, %kind, zeroed, "commit log: cut a torn tail");
        }
        Ok(report)
    }

    /// Whether some 512-byte sector's part inside `[from, to)` (at least 8 bytes) is
    /// all zeros: the mark of a sector that kept its old contents in a torn write
    /// (a bit flip cannot zero a run of bytes).
    async fn has_zero_sector(&self, from: u64, to: u64) -> Result<bool> {
        const SECTOR: u64 = 512;
        let buf = self.read_files(from, (to - from) as usize).await?;
        let mut pos = from;
        while pos < from + buf.len() as u64 {
            let end = ((pos / SECTOR + 1) * SECTOR).min(from + buf.len() as u64);
            let part = &buf[(pos - from) as usize..(end - from) as usize];
            if part.len() >= 8 && part.iter().all(|b| *b == 0) {
                return Ok(true);
            }
            pos = end;
        }
        Ok(false)
    }

    /// Whether any non-zero byte of the log lies at or after `from` (holes skipped).
    async fn any_data_from(&self, from: u64) -> Result<bool> {
        let chunk = 1 << 20;
        let starts: Vec<u64> = self
            .segments
            .borrow()
            .keys()
            .copied()
            .filter(|s| s + self.seg_bytes > from)
            .collect();
        for seg in starts {
            let mut pos = from.max(seg);
            while pos < seg + self.seg_bytes {
                match self
                    .cfg
                    .disk
                    .next_data(&self.segment_path(seg), pos - seg)?
                {
                    None => break,
                    Some(d) => pos = pos.max(seg + d),
                }
                if pos >= seg + self.seg_bytes {
                    break;
                }
                let n = chunk.min((seg + self.seg_bytes - pos) as usize);
                if self.read_files(pos, n).await?.iter().any(|b| *b != 0) {
                    return Ok(true);
                }
                pos += n as u64;
            }
        }
        Ok(false)
    }

    /// Copies `[from, to)` of the log to `<root>/lost+found/commitlog-<from>` (durably)
    /// before recovery erases it.
    async fn quarantine(&self, from: u64, to: u64) -> Result<PathBuf> {
        let data = self.read_files(from, (to - from) as usize).await?;
        let dir = self.cfg.root.join("lost+found");
        self.cfg.disk.create_dir_all(&dir)?;
        let path = dir.join(format!("commitlog-{}", io::offset_name(from)));
        self.cfg.disk.write_file_durable(&path, &data)?;
        Ok(path)
    }

    /// Looks past a bad record for any valid record (which would make the damage
    /// interior) and for the last non-zero byte (junk to erase). Reads the rest of the
    /// bad record's segment and every later segment.
    async fn resync_scan(&self, from: u64) -> Result<(Option<u64>, Option<u64>)> {
        let max_total = self.cfg.max_record_bytes();
        let chunk = 8 << 20;
        let last_seg = *self.segments.borrow().keys().next_back().unwrap_or(&0);
        let end = last_seg + self.seg_bytes;
        let mut pos = from;
        let mut last_nonzero = None;
        let magic_v1 = record::MAGIC_V1.to_be_bytes();
        let magic_v2 = record::MAGIC_V2.to_be_bytes();
        while pos < end {
            let seg = self.segment_start(pos);
            let seg_end = seg + self.seg_bytes;
            if self.segment_file(seg).is_none() {
                pos = seg_end;
                continue;
            }
            // Skip holes: a sparse segment's unwritten part cannot hide a record.
            match self
                .cfg
                .disk
                .next_data(&self.segment_path(seg), pos - seg)?
            {
                None => {
                    pos = seg_end;
                    continue;
                }
                Some(d) => pos = pos.max(seg + d),
            }
            if pos >= seg_end {
                continue;
            }
            let len = ((seg_end - pos) as usize).min(chunk + max_total);
            let buf = self.read_files(pos, len).await?;
            if let Some(i) = buf.iter().rposition(|b| *b != 0) {
                last_nonzero = Some(pos + i as u64);
            }
            let scan_len = buf.len().min(chunk);
            let mut i = 0;
            while i < scan_len {
                let Some(j) = buf[i..scan_len].iter().position(|b| *b == 0xDA) else {
                    break;
                };
                let p = i + j;
                if p >= 4 && (buf[p..].starts_with(&magic_v1) || buf[p..].starts_with(&magic_v2)) {
                    let start = p - 4;
                    let at = pos + start as u64;
                    let verify = Verify {
                        crc: true,
                        at_offset: Some(at as i64),
                        max_total_size: max_total,
                        require_record_crc: self.requires_crc(at),
                    };
                    if let Ok(Decoded::Record(_)) = record::decode(&buf[start..], verify) {
                        return Ok((Some(at), last_nonzero));
                    }
                }
                i = p + 1;
            }
            pos += scan_len.max(1) as u64;
        }
        Ok((None, last_nonzero))
    }

    /// Overwrites `[from, to)` with zeros on disk, keeping the bytes before `from` in
    /// its page. Returns the bytes zeroed.
    async fn zero_range(&self, from: u64, to: u64) -> Result<u64> {
        let mut pos = align_down(from);
        let head = self.read_files(pos, (from - pos) as usize).await?;
        let mut first = true;
        while pos < to {
            let seg = self.segment_start(pos);
            let seg_end = seg + self.seg_bytes;
            let len = ((align_up(to) - pos) as usize)
                .min(8 << 20)
                .min((seg_end - pos) as usize);
            let Some(file) = self.segment_file(seg) else {
                break;
            };
            let mut data = vec![0u8; len];
            if first {
                data[..head.len()].copy_from_slice(&head);
                first = false;
            }
            file.write_aligned(pos - seg, &data).await?;
            file.sync().await?;
            pos += len as u64;
        }
        Ok(to - from)
    }

    /// Sets every position to `end` after recovery, drops segments past it, and loads
    /// the window holding `end` so the next commit can rewrite its partial page.
    async fn set_end(&self, end: u64) -> Result<()> {
        let keep_until = self.segment_start(end);
        let doomed: Vec<u64> = self
            .segments
            .borrow()
            .range(keep_until + 1..)
            .map(|(s, _)| *s)
            .collect();
        for s in doomed {
            let f = self.segments.borrow_mut().remove(&s).unwrap();
            self.cfg.disk.remove_file(&f.path)?;
            tracing::warn!(path = %f.path.display(), "removed commit-log segment past the recovered end");
        }
        self.cfg.disk.sync_dir(&self.dir)?;
        self.written.set(end);
        self.committed.set(end);
        self.flushed.set(end);
        let win_start = end / self.win_bytes * self.win_bytes;
        let prefix = self
            .read_files(win_start, (end - win_start) as usize)
            .await?;
        let mut w = self.windows.borrow_mut();
        for _ in 0..self.cfg.write_buffer_count {
            let mut b = allocate_dma_buffer(self.win_bytes as usize);
            b.as_bytes_mut().fill(0);
            w.free.push(b);
        }
        w.first = win_start / self.win_bytes;
        w.push_new();
        if let Some(Win::Open(b)) = w.resident.back_mut() {
            b.as_bytes_mut()[..prefix.len()].copy_from_slice(&prefix);
        }
        Ok(())
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

    /// Makes room in the window pool for `len` more bytes, waiting for the writer to
    /// commit older windows when the pool is exhausted. Call right before appending.
    pub async fn reserve(&self, len: u64) -> Result<()> {
        loop {
            if let Some(f) = self.failure() {
                return Err(Error::Failed(f));
            }
            if self.stopping.get() {
                return Err(Error::ShutDown);
            }
            let end = self.placement(len).start + len;
            if self.try_make_room(end) {
                return Ok(());
            }
            let oldest_end = (self.windows.borrow().first + 1) * self.win_bytes;
            self.writer_wake.notify();
            if self.committed.get() >= oldest_end {
                // Committed, but its buffer is not free yet (a finished write still
                // holds it): let other tasks run rather than spin.
                futures_lite::future::yield_now().await;
            } else {
                self.committed.wait_for(oldest_end).await;
            }
        }
    }

    /// Recycles fully committed windows until the pool can hold bytes up to `end`.
    fn try_make_room(&self, end: u64) -> bool {
        let mut w = self.windows.borrow_mut();
        let last_idx = w.first + w.resident.len() as u64 - 1;
        let need_idx = (end.max(1) - 1) / self.win_bytes;
        let needed = need_idx.saturating_sub(last_idx) as usize;
        let committed = self.committed.get();
        while w.free.len() < needed
            && w.resident.len() > 1
            && (w.first + 1) * self.win_bytes <= committed
        {
            let Some(Win::Sealed(rc)) = w.resident.pop_front() else {
                unreachable!("only the last window is open")
            };
            match Rc::try_unwrap(rc) {
                Ok(buf) => {
                    // Not zeroed: every byte of a window is written before it is read
                    // or committed, except the padding of a partial last page (zeroed
                    // in the commit's copy) and a segment's blank tail (zeroed by
                    // `append_blank`). Zeroing 4 MiB per window was 5% of the CPU of
                    // 1 KiB puts (perf, `coremq bench --body 1024`, key index off).
                    w.free.push(buf);
                    w.first += 1;
                }
                Err(rc) => {
                    // Still referenced by a write that has not been dropped yet.
                    w.resident.push_front(Win::Sealed(rc));
                    break;
                }
            }
        }
        w.free.len() >= needed
    }

    /// Copies `bytes` into the windows at `written` (which must equal `at`). The caller
    /// reserved room and encoded `bytes` for this exact offset.
    pub fn append(&self, at: u64, bytes: &[u8], store_ts: i64) {
        assert_eq!(
            at,
            self.written.get(),
            "append must continue at the written position"
        );
        let mut w = self.windows.borrow_mut();
        let mut pos = at;
        let mut src = bytes;
        while !src.is_empty() {
            let idx = pos / self.win_bytes;
            while w.first + w.resident.len() as u64 <= idx {
                w.push_new();
                // A window was sealed: there is a whole window to commit.
                self.writer_wake.notify();
            }
            let off = (pos % self.win_bytes) as usize;
            let n = src.len().min(self.win_bytes as usize - off);
            let Some(Win::Open(buf)) = w.resident.back_mut() else {
                unreachable!()
            };
            buf.as_bytes_mut()[off..off + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            pos += n as u64;
        }
        drop(w);
        self.written.set(pos);
        self.last_put_ts.set(store_ts);
    }

    /// Appends `len` bytes at `at` (the written position) that `fill` writes: straight
    /// into the open window when they fit in it, else through a buffer and
    /// [`CommitLog::append`]. `fill` gets exactly `len` bytes (not zeroed).
    pub fn append_with(&self, at: u64, len: usize, store_ts: i64, fill: impl FnOnce(&mut [u8])) {
        assert_eq!(
            at,
            self.written.get(),
            "append must continue at the written position"
        );
        let idx = at / self.win_bytes;
        let off = (at % self.win_bytes) as usize;
        if off + len > self.win_bytes as usize {
            let mut buf = vec![0u8; len];
            fill(&mut buf);
            self.append(at, &buf, store_ts);
            return;
        }
        let mut w = self.windows.borrow_mut();
        while w.first + w.resident.len() as u64 <= idx {
            w.push_new();
            // A window was sealed: there is a whole window to commit.
            self.writer_wake.notify();
        }
        let Some(Win::Open(buf)) = w.resident.back_mut() else {
            unreachable!()
        };
        fill(&mut buf.as_bytes_mut()[off..off + len]);
        drop(w);
        self.written.set(at + len as u64);
        self.last_put_ts.set(store_ts);
    }

    /// Writes the blank record that ends the current segment and moves `written` to
    /// the next segment's start. Windows for the skipped bytes are zero-filled.
    pub fn append_blank(&self, at: u64) {
        let seg_end = self.segment_start(at) + self.seg_bytes;
        let remaining = seg_end - at;
        assert!(remaining >= record::END_FILE_MIN_BLANK_LENGTH as u64);
        let blank = record::encode_blank(remaining as u32);
        self.append(at, &blank, self.last_put_ts.get());
        // The rest of the segment is zeros on disk: recycled windows are not zeroed
        // (see `try_make_room`), so write the zeros here, once per segment.
        let mut w = self.windows.borrow_mut();
        let mut from = at + blank.len() as u64;
        loop {
            let idx = w.first + w.resident.len() as u64 - 1;
            let win_start = idx * self.win_bytes;
            let to = seg_end.min(win_start + self.win_bytes);
            let Some(Win::Open(b)) = w.resident.back_mut() else {
                unreachable!("the last window is open")
            };
            b.as_bytes_mut()[(from - win_start) as usize..(to - win_start) as usize].fill(0);
            if to >= seg_end {
                break;
            }
            w.push_new();
            from = to;
        }
        drop(w);
        self.written.set(seg_end);
    }

    /// A sync put was appended: hands it to the group-commit thread, or wakes the
    /// writer that runs the rounds itself.
    pub fn wake_sync_writer(&self) {
        if let Some(fl) = &*self.flusher.borrow() {
            self.publish(fl);
            // The writer only keeps segments ahead for the thread.
            let seg = self.segment_start(self.written.get());
            if self.flusher_segs.get().is_none_or(|s| s <= seg) {
                self.writer_wake.notify();
            }
            return;
        }
        self.writer_wake.notify();
    }

    /// Hands `written` and the windows below it to the group-commit thread, and
    /// takes in the rounds it finished meanwhile: while puts keep the shard busy,
    /// this is where their acknowledgements come from. (The writer task is woken by
    /// the thread too, but a foreign wake only runs once the busy task queue yields:
    /// measured, it processed finished rounds ~760 us apart while rounds took ~330
    /// us, and the puts waited for that.)
    fn publish(&self, fl: &Flusher) {
        let (flushed, ts) = {
            let w = self.windows.borrow();
            fl.publish(self.written.get(), self.last_put_ts.get(), |idx| {
                w.resident[(idx - w.first) as usize].ptr()
            })
        };
        self.absorb_flushed(flushed, ts);
    }

    /// Wakes sync puts whose `sync_flush_timeout` passed (they report
    /// `FlushDiskTimeout`): checked by the writer at most every eighth of the timeout
    /// (1-100 ms), instead of a timer per put. With the group-commit thread the writer
    /// never waits for the disk, so a hung device still times puts out; on the
    /// writer-task paths (simulated disk, `RingWriteFdatasync`) it checks between
    /// rounds.
    fn expire_sync_waits(&self) {
        let tick = (self.cfg.sync_flush_timeout / 8)
            .clamp(Duration::from_millis(1), Duration::from_millis(100));
        let now = Instant::now();
        if now - self.last_expiry.get() >= tick {
            self.last_expiry.set(now);
            self.flushed.expire(now);
        }
    }

    /// Moves `committed` and `flushed` to a position the group-commit thread made
    /// durable (waking the puts waiting for it).
    fn absorb_flushed(&self, flushed: u64, ts: i64) {
        if flushed > self.flushed.get() {
            self.committed_ts.set(ts);
            self.committed.set(flushed);
            self.flushed_ts.set(ts);
            self.flushed.set(flushed);
            self.prewrite_wake.notify();
        }
    }

    /// Asks the writer to commit and flush everything now.
    pub fn request_flush(&self) {
        self.flush_now.set(true);
        self.writer_wake.notify();
    }

    /// Whether `off` lies in a window held in memory (a read there copies, no I/O).
    pub fn is_resident(&self, off: u64) -> bool {
        let w = self.windows.borrow();
        let idx = off / self.win_bytes;
        idx >= w.first && idx < w.first + w.resident.len() as u64
    }

    /// Reads `[off, off+len)`: resident windows from memory, the rest from files.
    pub async fn read(&self, off: u64, len: usize) -> Result<Bytes> {
        let mut out = Vec::with_capacity(len);
        self.read_into(off, len, &mut out).await?;
        Ok(Bytes::from(out))
    }

    /// [`CommitLog::read`] into `out` (cleared first), so a caller that reads again
    /// and again (the dispatcher) reuses one buffer instead of allocating 1 MiB each
    /// time.
    pub async fn read_into(&self, off: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let end = off + len as u64;
        if end > self.written.get() || off < self.min_offset.get() {
            return Err(Error::Corrupt {
                path: self.dir.clone(),
                offset: off,
                kind: Corruption::Truncated,
                detail: Some(format!(
                    "read [{off}, {end}) outside the log [{}, {})",
                    self.min_offset.get(),
                    self.written.get()
                )),
            });
        }
        let mut pos = off;
        while pos < end {
            let idx = pos / self.win_bytes;
            let piece_end = end.min((idx + 1) * self.win_bytes);
            let n = (piece_end - pos) as usize;
            let resident = {
                let w = self.windows.borrow();
                if idx >= w.first && idx < w.first + w.resident.len() as u64 {
                    let b = w.resident[(idx - w.first) as usize].bytes();
                    let o = (pos % self.win_bytes) as usize;
                    out.extend_from_slice(&b[o..o + n]);
                    true
                } else {
                    false
                }
            };
            if !resident {
                debug_assert!(piece_end <= self.committed.get());
                let seg = self.segment_start(pos);
                let file = self.segment_file(seg).ok_or_else(|| Error::Corrupt {
                    path: self.segment_path(seg),
                    offset: pos - seg,
                    kind: Corruption::Truncated,
                    detail: Some("segment file missing".into()),
                })?;
                let r = file.read(pos - seg, n).await?;
                if r.len() < n {
                    return Err(Error::Corrupt {
                        path: file.path.clone(),
                        offset: pos - seg,
                        kind: Corruption::Truncated,
                        detail: Some("short read inside the log".into()),
                    });
                }
                out.extend_from_slice(&r[..n]);
            }
            pos = piece_end;
        }
        Ok(())
    }

    /// Runs `f` on the bytes `[off, off + len)` cut at the end of their window, when
    /// that window is resident and the bytes are written; `None` otherwise. The
    /// dispatcher decodes records in place this way instead of copying them out
    /// ([`CommitLog::read_into`]): that copy was ~4.5% of the CPU per 1 KiB put.
    pub fn with_resident<R>(&self, off: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let end = (off + len as u64).min(self.written.get());
        if off >= end || off < self.min_offset.get() {
            return None;
        }
        let idx = off / self.win_bytes;
        let w = self.windows.borrow();
        if idx < w.first || idx >= w.first + w.resident.len() as u64 {
            return None;
        }
        let b = w.resident[(idx - w.first) as usize].bytes();
        let o = (off % self.win_bytes) as usize;
        let n = (end.min((idx + 1) * self.win_bytes) - off) as usize;
        Some(f(&b[o..o + n]))
    }

    /// Start of the open window: every byte below it sits in a sealed window.
    fn sealed_end(&self) -> u64 {
        let w = self.windows.borrow();
        (w.first + w.resident.len() as u64 - 1) * self.win_bytes
    }

    /// One commit round: writes `[align_down(committed), target)` to the files, where
    /// `target` is `written` if `partial`, else the end of the sealed windows.
    /// Returns whether anything was written.
    async fn commit_once(&self, partial: bool) -> Result<bool> {
        let start = self.committed.get();
        let limit = |log: &CommitLog| {
            if partial {
                log.written.get()
            } else {
                log.written.get().min(log.sealed_end())
            }
        };
        let target = limit(self);
        if target <= start {
            return Ok(false);
        }
        let last_seg = self.segment_start(target - 1);
        self.ensure_segments(start, last_seg).await?;
        let target = limit(self).min(last_seg + self.seg_bytes);
        self.wait_prewrite_clear(target).await;
        let ts = self.last_put_ts.get();
        let writes = self.plan_commit(start, target);
        let inflight = self.cfg.commit_max_inflight;
        let mut writes = writes.into_iter();
        loop {
            let batch: Vec<Pin<Box<dyn Future<Output = Result<()>>>>> = writes
                .by_ref()
                .take(inflight)
                .map(|(file, at, job)| {
                    Box::pin(async move {
                        match job {
                            CommitJob::Copy(buf) => file.write_buf(at, buf).await,
                            CommitJob::Whole(rc) => file.write_rc(at, rc).await,
                        }
                    }) as Pin<Box<dyn Future<Output = Result<()>>>>
                })
                .collect();
            if batch.is_empty() {
                break;
            }
            for r in join_all(batch).await {
                r?;
            }
        }
        self.committed_ts.set(ts);
        self.committed.set(target);
        self.prewrite_wake.notify();
        // Keep one segment ahead so the commit path rarely creates files.
        self.ensure_segment(last_seg + self.seg_bytes).await?;
        Ok(true)
    }

    /// The writes that move `[align_down(start), target)` to the files: sealed windows
    /// not yet touched go whole and uncopied; other ranges are copied page-aligned.
    fn plan_commit(&self, start: u64, target: u64) -> Vec<(Rc<File>, u64, CommitJob)> {
        let chunk = self.cfg.commit_chunk_bytes as u64;
        let w = self.windows.borrow();
        let mut writes = Vec::new();
        let mut pos = align_down(start);
        while pos < target {
            let idx = pos / self.win_bytes;
            let win_start = idx * self.win_bytes;
            let win_end = win_start + self.win_bytes;
            let seg = self.segment_start(pos);
            let file = self
                .segment_file(seg)
                .expect("segments ensured before planning");
            let win = &w.resident[(idx - w.first) as usize];
            if let (Win::Sealed(rc), true) = (win, pos == win_start && target >= win_end) {
                writes.push((file, pos - seg, CommitJob::Whole(rc.clone())));
                pos = win_end;
                continue;
            }
            let end = target.min(win_end).min(pos + chunk);
            let len = align_up(end - pos) as usize;
            let off = (pos - win_start) as usize;
            let mut buf = allocate_dma_buffer(len);
            let data = (end - pos) as usize;
            let bytes = buf.as_bytes_mut();
            bytes[..data].copy_from_slice(&win.bytes()[off..off + data]);
            // The padding of a partial last page: zeros, whatever the (recycled)
            // window holds there; the next commit rewrites the page.
            bytes[data..].fill(0);
            writes.push((file, pos - seg, CommitJob::Copy(buf)));
            pos = end;
        }
        writes
    }

    /// Ensures the segments from the one holding `start` through `last_seg` exist.
    async fn ensure_segments(&self, start: u64, last_seg: u64) -> Result<()> {
        let mut s = self.segment_start(start);
        while s <= last_seg {
            self.ensure_segment(s).await?;
            s += self.seg_bytes;
        }
        Ok(())
    }

    /// One sync-flush round ([`SyncFlushIo::DsyncWrite`]): copies
    /// `[align_down(committed), written)` (at most `commit_chunk_bytes *
    /// commit_max_inflight`) out of the windows and makes it durable with one
    /// `pwritev2(RWF_DSYNC)` per segment touched; then committed and flushed move
    /// together. Returns whether anything was written.
    async fn sync_round(&self) -> Result<bool> {
        let start = self.committed.get();
        debug_assert_eq!(start, self.flushed.get());
        let max = (self.cfg.commit_chunk_bytes * self.cfg.commit_max_inflight) as u64;
        let target = self.written.get().min(align_down(start) + max);
        if target <= start {
            return Ok(false);
        }
        let last_seg = self.segment_start(target - 1);
        self.ensure_segments(start, last_seg).await?;
        // Puts may have appended while a segment was created: take them too.
        let target = self
            .written
            .get()
            .min(align_down(start) + max)
            .min(last_seg + self.seg_bytes);
        self.wait_prewrite_clear(target).await;
        let ts = self.last_put_ts.get();
        let mut writes = Vec::new();
        let mut pos = align_down(start);
        while pos < target {
            let seg = self.segment_start(pos);
            let end = target.min(seg + self.seg_bytes);
            let len = align_up(end - pos) as usize;
            let mut buf = self.take_round_buf(len);
            let data = (end - pos) as usize;
            let bytes = buf.as_mut_slice();
            self.copy_from_windows(pos, &mut bytes[..data]);
            // The padding of a partial last page: zeros, whatever the (recycled)
            // window holds there; the next round rewrites the page.
            bytes[data..].fill(0);
            let file = self
                .segment_file(seg)
                .expect("segments ensured before planning");
            writes.push(async move { file.write_durable(pos - seg, buf).await });
            pos = end;
        }
        for r in join_all(writes).await {
            self.round_bufs.borrow_mut().push(r?);
        }
        self.committed_ts.set(ts);
        self.committed.set(target);
        self.flushed_ts.set(ts);
        self.flushed.set(target);
        self.prewrite_wake.notify();
        // Keep one segment ahead so rounds rarely create files.
        self.ensure_segment(last_seg + self.seg_bytes).await?;
        Ok(true)
    }

    /// Records the range the prewriter is zero-filling (or none), for the rounds of
    /// the writer task and of the group-commit thread alike.
    fn set_prewrite_inflight(&self, range: Option<(u64, u64)>) {
        self.prewrite_inflight.set(range);
        if let Some(fl) = &*self.flusher.borrow() {
            fl.set_prewrite(range);
        }
    }

    /// Waits until no prewrite in flight overlaps a commit of bytes below `target`.
    async fn wait_prewrite_clear(&self, target: u64) {
        while let Some((from, _)) = self.prewrite_inflight.get() {
            if from >= align_up(target) {
                return;
            }
            self.prewrite_idle.wait().await;
        }
    }

    /// The prewriter: keeps `[written + chunk, written + ahead)` zero-filled with large
    /// writes, each chunk fdatasynced (so the block allocation is journaled here, not
    /// by a sync round's flush). It only writes at or past the page of `written`,
    /// where no commit has written yet, and a commit that would reach a chunk in
    /// flight waits for it ([`Self::wait_prewrite_clear`]). Errors are logged and
    /// end prewriting (it is an optimisation; the log is correct without it).
    async fn run_prewriter(self: Rc<Self>) {
        let ahead = self.cfg.prewrite_bytes();
        let unit = self.win_bytes.min(PREWRITE_UNIT);
        let chunk = (4 * self.win_bytes)
            .min(align_down(ahead / 2))
            .max(PAGE as u64);
        let mut zeros = allocate_dma_buffer(unit as usize);
        zeros.as_bytes_mut().fill(0);
        let zeros = Rc::new(zeros);
        let mut done = 0;
        loop {
            if self.stopping.get() || self.failure().is_some() {
                return;
            }
            let w = align_up(self.written.get());
            let from = done.max(w + chunk);
            let seg = self.segment_start(from);
            let to = (from + chunk).min(seg + self.seg_bytes);
            let file = self.segment_file(seg);
            let (Some(file), true) = (file, to <= w + ahead) else {
                // No timer: woken by the next commit or the stop (deterministic on
                // the simulated disk).
                self.prewrite_wake.wait().await;
                continue;
            };
            self.set_prewrite_inflight(Some((from, to)));
            // One write at a time: a round's write queues behind at most one unit
            // in the device, not the whole chunk.
            let mut result = Ok(());
            let mut pos = from;
            while pos < to && result.is_ok() {
                let end = ((pos / unit + 1) * unit).min(to);
                let at = pos - seg;
                result = if end - pos == unit {
                    file.write_rc(at, zeros.clone()).await
                } else {
                    let mut b = allocate_dma_buffer((end - pos) as usize);
                    b.as_bytes_mut().fill(0);
                    file.write_buf(at, b).await
                };
                pos = end;
            }
            if result.is_ok() {
                result = file.sync().await;
            }
            self.set_prewrite_inflight(None);
            self.prewrite_idle.notify();
            if let Err(e) = result {
                tracing::warn!(error = %e, "commit-log prewrite failed; prewriting stops");
                return;
            }
            done = to;
        }
    }

    /// A reused round buffer of exactly `len` bytes (the caller zeroes its tail past
    /// the written position: the partial last page is written padded).
    fn take_round_buf(&self, len: usize) -> AlignedBuf {
        let mut bufs = self.round_bufs.borrow_mut();
        let mut buf = match bufs.iter().position(|b| b.capacity() >= len) {
            Some(i) => bufs.swap_remove(i),
            None => AlignedBuf::new(len.max(256 << 10)),
        };
        buf.set_len(len);
        buf
    }

    /// Copies the window bytes at `[pos, pos + dst.len())` into `dst` (callers copy
    /// only up to `written`: recycled windows are not zeroed).
    fn copy_from_windows(&self, pos: u64, dst: &mut [u8]) {
        let w = self.windows.borrow();
        let mut at = pos;
        let mut out = 0;
        while out < dst.len() {
            let idx = at / self.win_bytes;
            let off = (at % self.win_bytes) as usize;
            let n = (dst.len() - out).min(self.win_bytes as usize - off);
            if idx >= w.first + w.resident.len() as u64 {
                // Past the open window: nothing written there yet.
                dst[out..].fill(0);
                return;
            }
            let win = &w.resident[(idx - w.first) as usize];
            dst[out..out + n].copy_from_slice(&win.bytes()[off..off + n]);
            out += n;
            at += n as u64;
        }
    }

    /// One flush round: fdatasync every segment holding committed, unflushed bytes.
    async fn flush_once(&self) -> Result<()> {
        let start = self.flushed.get();
        let target = self.committed.get();
        if target == start {
            return Ok(());
        }
        let ts = self.committed_ts.get();
        let mut s = self.segment_start(start);
        while s < target {
            if let Some(f) = self.segment_file(s) {
                f.sync().await?;
            }
            s += self.seg_bytes;
        }
        self.flushed_ts.set(ts);
        self.flushed.set(target);
        Ok(())
    }

    /// The writer task: commits and flushes by the flush mode's rules until stopped.
    pub async fn run_writer(self: Rc<Self>) {
        let prewriter = if self.cfg.prewrite_bytes() > 0 {
            use glommio::{Latency, Shares, executor};
            let tq = executor().create_task_queue(
                Shares::Static(100),
                Latency::NotImportant,
                "commit-log-prewrite",
            );
            glommio::spawn_local_into(self.clone().run_prewriter(), tq).ok()
        } else {
            None
        };
        let threaded = self.cfg.flush_mode == FlushMode::Sync
            && self.cfg.sync_flush_io == SyncFlushIo::DsyncWrite
            && matches!(self.cfg.disk, io::Disk::Real);
        let result = if threaded {
            self.flusher_loop().await
        } else {
            self.writer_loop().await
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "commit log writer failed; the shard stops taking writes");
            *self.failed.borrow_mut() = Some(e.to_string());
            self.committed.close();
            self.flushed.close();
        }
        self.stopping.set(true);
        self.prewrite_wake.notify();
        if let Some(p) = prewriter {
            p.await;
        }
    }

    async fn writer_loop(&self) -> Result<()> {
        let cfg = self.cfg.clone();
        let page = PAGE as u64;
        let mut last_commit = Instant::now();
        let mut last_flush = Instant::now();
        let mut last_thorough = Instant::now();
        loop {
            let stopping = self.stopping.get();
            let flush_now = self.flush_now.replace(false);
            let sync = cfg.flush_mode == FlushMode::Sync;
            if sync {
                self.expire_sync_waits();
            }
            let now = Instant::now();
            // Sealed windows are committed at once; the open window's partial
            // content when a sync put waits, on the commit interval, or for a flush.
            let flush_time = now - last_flush >= cfg.flush_interval;
            let partial = sync
                || stopping
                || flush_now
                || flush_time
                || now - last_commit >= cfg.commit_interval;
            if sync && cfg.sync_flush_io == SyncFlushIo::DsyncWrite {
                // Group commit: one durable write per round, the next round at once
                // with everything appended meanwhile.
                if self.sync_round().await? {
                    continue;
                }
                if stopping && self.flushed.get() == self.written.get() {
                    return Ok(());
                }
                futures_lite::future::or(
                    self.writer_wake.wait(),
                    glommio::timer::sleep(Duration::from_millis(10)),
                )
                .await;
                continue;
            }
            let commit_due = self.commit_once(partial).await?;
            if commit_due {
                last_commit = Instant::now();
            }
            let unflushed = self.committed.get() - self.flushed.get();
            let thorough = now - last_thorough >= cfg.flush_thorough_interval;
            let flush_due = unflushed > 0
                && (sync
                    || stopping
                    || flush_now
                    || (flush_time && (unflushed >= cfg.flush_least_pages * page || thorough)));
            if flush_due {
                self.flush_once().await?;
                last_flush = Instant::now();
                if thorough {
                    last_thorough = last_flush;
                }
            }
            if stopping && self.flushed.get() == self.written.get() {
                return Ok(());
            }
            if !commit_due && !flush_due {
                let wait = if sync {
                    Duration::from_millis(10)
                } else {
                    cfg.commit_interval.min(cfg.flush_interval)
                };
                futures_lite::future::or(self.writer_wake.wait(), glommio::timer::sleep(wait))
                    .await;
            }
        }
    }

    /// The writer with a group-commit thread ([`crate::flusher`]): it keeps the
    /// segments the thread writes open and one ahead, and turns the thread's
    /// progress into `committed`/`flushed` (waking the puts that wait for them).
    async fn flusher_loop(&self) -> Result<()> {
        let layout = Layout {
            seg_bytes: self.seg_bytes,
            win_bytes: self.win_bytes,
        };
        debug_assert_eq!(self.committed.get(), self.flushed.get());
        let fl = Flusher::start(layout, self.flushed.get(), self.flushed_ts.get())
            .map(Rc::new)
            .map_err(|e| Error::io("start the group-commit thread", &self.dir, 0, e))?;
        *self.flusher.borrow_mut() = Some(fl.clone());
        // A prewrite chunk may already be in flight (the prewriter starts first).
        fl.set_prewrite(self.prewrite_inflight.get());
        let result = self.follow_flusher(&fl).await;
        // Stops and joins the thread (after its round in flight) before the windows
        // can go away.
        self.flusher.borrow_mut().take();
        drop(fl);
        result
    }

    async fn follow_flusher(&self, fl: &Flusher) -> Result<()> {
        loop {
            self.expire_sync_waits();
            // Segments: the one being written and the next, so rounds never wait
            // for a file to be created.
            let first = self.segment_start(self.flushed.get());
            let last = self.segment_start(self.written.get()) + self.seg_bytes;
            let mut s = match self.flusher_segs.get() {
                Some(done) => first.max(done + self.seg_bytes),
                None => first,
            };
            while s <= last {
                let file = self.ensure_segment(s).await?;
                let fd = file
                    .shared_fd()?
                    .expect("the group-commit thread runs on real files");
                fl.add_segment(s, fd);
                self.flusher_segs.set(Some(s));
                s += self.seg_bytes;
            }
            self.publish(fl);
            if let Some((pos, e)) = fl.take_error() {
                let seg = self.segment_start(self.flushed.get());
                return Err(Error::io("write+fdatasync", self.segment_path(seg), pos, e));
            }
            if self.stopping.get() && self.flushed.get() == self.written.get() {
                return Ok(());
            }
            let seen = self.flushed.get();
            futures_lite::future::or(
                futures_lite::future::or(self.writer_wake.wait(), fl.progress(seen)),
                glommio::timer::sleep(Duration::from_millis(10)),
            )
            .await;
        }
    }

    /// Asks the writer to write and flush everything and then exit.
    pub fn stop_writer(&self) {
        self.stopping.set(true);
        self.writer_wake.notify();
    }
}

/// Size of one recovery read, and how many are kept in flight: what `fio` needs to
/// reach the disk's sequential read rate here (scripts/bench.sh reads with 1 MiB
/// requests at iodepth 8).
pub const READ_AHEAD_BYTES: u64 = 1 << 20;
pub const READ_AHEAD_DEPTH: usize = 8;

type PendingRead = Pin<Box<dyn Future<Output = Result<io::ReadBuf>>>>;

/// A read of the read-ahead pipeline: submitted (glommio queues the request when the
/// future is first polled), or already finished.
enum Slot {
    Pending(PendingRead),
    Ready(Result<io::ReadBuf>),
}

/// Reads the log sequentially from `from` up to `limit` (or the first missing
/// segment) for recovery: `READ_AHEAD_DEPTH` reads of `READ_AHEAD_BYTES` in flight,
/// records handed out as slices of the read buffers. Only a record that spans two
/// reads is copied (into `stitch`). Reads never cross a segment's end.
pub struct LogReader {
    segments: BTreeMap<u64, Rc<File>>,
    seg_bytes: u64,
    /// Next log offset to request, and where requests stop.
    next: u64,
    limit: u64,
    inflight: VecDeque<(u64, Slot)>,
    /// The read holding the current position: (log offset of its first byte, bytes).
    cur: Option<(u64, io::ReadBuf)>,
    /// A record that spans reads, copied together: it starts at log offset
    /// `stitch_at`; `copied_to` is the log offset of the next byte to copy into it.
    stitch: Vec<u8>,
    stitch_at: u64,
    copied_to: u64,
}

impl LogReader {
    pub fn new(log: &CommitLog, from: u64, limit: u64) -> LogReader {
        LogReader {
            segments: log.segments.borrow().clone(),
            seg_bytes: log.seg_bytes,
            next: align_down(from),
            limit,
            inflight: VecDeque::new(),
            cur: None,
            stitch: Vec::new(),
            stitch_at: 0,
            copied_to: 0,
        }
    }

    /// Issues reads until `READ_AHEAD_DEPTH` are in flight.
    async fn refill(&mut self) {
        while self.inflight.len() < READ_AHEAD_DEPTH && self.next < self.limit {
            let seg = self.next / self.seg_bytes * self.seg_bytes;
            let Some(file) = self.segments.get(&seg).cloned() else {
                self.limit = self.next;
                break;
            };
            let seg_end = seg + self.seg_bytes;
            let end = (self.next / READ_AHEAD_BYTES + 1)
                .saturating_mul(READ_AHEAD_BYTES)
                .min(seg_end)
                .min(align_up(self.limit));
            let (pos, len) = (self.next - seg, (end - self.next) as usize);
            let mut fut: PendingRead = Box::pin(async move { file.read(pos, len).await });
            let slot = match futures_lite::future::poll_once(&mut fut).await {
                Some(r) => Slot::Ready(r),
                None => Slot::Pending(fut),
            };
            self.inflight.push_back((self.next, slot));
            self.next = end;
        }
    }

    /// Waits for the reads still in flight (their results are not needed).
    pub async fn finish(mut self) {
        while let Some((_, slot)) = self.inflight.pop_front() {
            if let Slot::Pending(f) = slot {
                let _ = f.await;
            }
        }
    }

    /// Makes the next read current; `false` when there is none (the end of `limit`,
    /// or a missing segment).
    async fn advance(&mut self) -> Result<bool> {
        self.refill().await;
        let Some((at, slot)) = self.inflight.pop_front() else {
            self.cur = None;
            return Ok(false);
        };
        self.refill().await;
        let buf = match slot {
            Slot::Ready(r) => r?,
            Slot::Pending(f) => f.await?,
        };
        self.cur = Some((at, buf));
        Ok(true)
    }

    /// The bytes of the record at `pos`, at most `room` of them (the rest of its
    /// segment or range): as many as its header says when that is a record's size
    /// (`MIN_RECORD_LEN..=max_total`), else the 8 header bytes (a blank, or junk for
    /// `record::decode` to name).
    pub async fn record(&mut self, pos: u64, room: usize, max_total: usize) -> Result<&[u8]> {
        let want = match record::peek_header(self.bytes(pos, 8.min(room)).await?) {
            Ok((size, magic))
                if (magic == record::MAGIC_V1 || magic == record::MAGIC_V2)
                    && size as usize >= record::MIN_RECORD_LEN
                    && size as usize <= max_total =>
            {
                (size as usize).min(room)
            }
            _ => 8.min(room),
        };
        let buf = self.bytes(pos, want).await?;
        Ok(&buf[..buf.len().min(room)])
    }

    /// The bytes at `pos`: at least `want` of them when the log holds them (fewer at
    /// the end of what can be read), more when the current read has them. Positions
    /// must not go backwards between calls (asking again at the same position for
    /// more bytes is fine).
    pub async fn bytes(&mut self, pos: u64, want: usize) -> Result<&[u8]> {
        let stitch_end = self.stitch_at + self.stitch.len() as u64;
        if self.stitch.is_empty() || pos < self.stitch_at || pos >= stitch_end {
            self.stitch.clear();
            loop {
                if let Some((at, b)) = &self.cur {
                    if pos < *at || b.is_empty() {
                        return Ok(&[]);
                    }
                    if pos < at + b.len() as u64 {
                        break;
                    }
                }
                if !self.advance().await? {
                    return Ok(&[]);
                }
            }
            let (at, len) = match &self.cur {
                Some((at, b)) => (*at, b.len()),
                None => unreachable!("positioned on a read"),
            };
            let off = (pos - at) as usize;
            if len - off >= want {
                let Some((_, b)) = &self.cur else {
                    unreachable!()
                };
                return Ok(&b[off..]);
            }
            // The record spans reads: copy it together (the last read stays current).
            if let Some((_, b)) = &self.cur {
                self.stitch.extend_from_slice(&b[off..]);
            }
            self.stitch_at = pos;
            self.copied_to = at + len as u64;
        } else {
            self.stitch.drain(..(pos - self.stitch_at) as usize);
            self.stitch_at = pos;
            if self.stitch.len() >= want {
                return Ok(&self.stitch);
            }
        }
        loop {
            if let Some((at, b)) = &self.cur {
                let end = at + b.len() as u64;
                if (*at..end).contains(&self.copied_to) {
                    let from = (self.copied_to - at) as usize;
                    let n = (want - self.stitch.len()).min(b.len() - from);
                    self.stitch.extend_from_slice(&b[from..from + n]);
                    self.copied_to += n as u64;
                }
            }
            if self.stitch.len() >= want || !self.advance().await? {
                break;
            }
            match &self.cur {
                // Not contiguous (a segment boundary) or nothing read: stop here.
                Some((at, b)) if *at == self.copied_to && !b.is_empty() => {}
                _ => break,
            }
        }
        Ok(&self.stitch)
    }
}
