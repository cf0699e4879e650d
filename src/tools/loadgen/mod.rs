//! The load generator behind `coremq bench` and `benches/loadgen.rs`.
//!
//! # What runs
//!
//! The store runs sharded by core: shard `i` is a glommio executor pinned to one CPU,
//! owning its own [`Store`] on `<data-dir>/shard-<i>` ([`spawn_shards`], the one piece
//! to swap for the real sharded store). Queue `q` of every topic belongs to shard
//! `q % shards`, and each shard drives only its own queues:
//!
//! * **producers** (`--producers` per shard): each keeps `--outstanding` puts in flight
//!   (one task per outstanding put, a "lane"), cycling through the shard's queues; a
//!   put is `Store::put`, or `Store::put_batch` of `--batch` messages to one queue.
//!   Unlimited (closed loop) by default; with `--rate` (messages/s, all shards together)
//!   every send has an intended time and producers pace themselves to it (open loop);
//! * **tailing consumers** (`--consumers`): one per queue, starting at the queue's end,
//!   reading with `Store::get` as soon as a record is dispatched.
//!
//! With `--data-dir` the store is kept, and `--mode` works on it afterwards
//! ([`run_mode`], scenarios 5-7 of `scripts/bench.sh`):
//!
//! * `catch-up`: one reader per queue, all at once, reads every queue from its first
//!   offset with `Store::get` of `--pull-batch` messages; MB/s, msg/s, get latency;
//! * `key-queries`: `--queries` random `Store::query_by_key` calls, one at a time per
//!   shard, for keys the `--messages` run put (the same `--shards`, `--producers`,
//!   `--topics`, `--queues` and `--batch` say which), one in 100 for a key never put;
//! * `recover`: times the open of every shard's store (in parallel), recovery
//!   included, then shuts down; `--kill-after-flush` makes a produce run SIGKILL
//!   itself once its log is flushed, leaving the abort files as `kill -9` does.
//!
//! # What is measured
//!
//! * throughput: messages and body bytes put per second over the producing window
//!   (first put of any shard to the last acknowledgement), and CommitLog bytes per
//!   second (records with headers and properties: what the disk really takes);
//! * put latency: from the send time to the put's return, where the send time is the
//!   intended one under `--rate`, so a put that starts late because every lane was busy
//!   is charged the wait (no coordinated omission);
//! * end-to-end latency: from that same send time, carried in the first 8 bytes of the
//!   body as nanoseconds of a process-wide monotonic clock ([`now_ns`]), to the moment a
//!   consumer's `get` returns the record;
//! * CPU time per message (`getrusage(RUSAGE_SELF)`, user + system, of the whole process
//!   from all stores open to all stores shut down, so the final flush is included) and
//!   peak RSS.
//!
//! Latencies go to HDR histograms (nanosecond resolution, 3 significant digits) and are
//! reported in microseconds as p50/p90/p99/p99.9/p99.99/max. The report prints as text,
//! and optionally as JSON ([`Report::to_json`]) and as an SVG picture of the percentile
//! curves ([`Report::svg`]). A progress line goes to stderr every second; when nothing
//! moved for a second it also shows each producing shard's log positions (written,
//! committed, flushed, dispatched) and whether its executor still runs tasks.
//!
//! # Reading the numbers
//!
//! * The load generator runs on the shards it measures (as the broker's request
//!   handlers will): building messages is part of the CPU per message. Bodies are cut
//!   from shared 256 KiB chunks, as a broker cuts them from its network buffers.
//! * Every lane yields after each put, so outstanding puts take turns like separate
//!   requests. Without it one lane ran until the window pool was full, and since the
//!   puts waiting for room are not woken in order (see below) a put waited up to 4.9 s.
//! * Under `--rate`, latencies include how late the executor wakes a paced send: about
//!   0.1 ms at p50, and up to [`PREEMPT_TIMER`] when another task queue (the
//!   dispatcher, the consumers) holds the CPU.
//! * At low rates the CPU per message is dominated by glommio parking the idle
//!   executor: every park issues a `membarrier` (an IPI to every CPU) and arms an
//!   io_uring timeout, tens of microseconds of CPU on this VM.
//! * The machine is shared: the JSON report records the load average before the run.
//!
//! # What the profile says (async flush, 1 KiB, 2 shards, commit 079c6ad)
//!
//! `perf record --call-graph dwarf` over 6 s of a 12 s run at 0.87 M msg/s. The report
//! splits CPU per message into the producing window (2.1 us) and what follows it
//! (another 2.3 us, 4.4 us in all), because the dispatcher does not keep up: it lagged
//! up to 1.5 GB behind the puts and caught up during shutdown (12 s of producing, 24 s
//! more to shut down). Nothing slows puts down when dispatch lags.
//!
//! While producing (store and load generator together):
//!
//! * **put path, ~48%** (~1.0 us per message): allocation in `put_many` (per-put `Vec`s
//!   for lengths, encoded properties and message ids: ~11% in malloc/free);
//!   `record::encode` ~13%, a quarter of it `crc32fast::Hasher::combine` (combining the
//!   body CRC into the record CRC with GF(2) matrix products costs more than hashing
//!   1 KiB again); zero-filling every recycled 4 MiB window in
//!   `CommitLog::try_make_room` ~7% (a second pass over every byte written); the copy
//!   into the window ~3%; properties ~3%.
//! * **load generator, ~41%**: building messages (body copy, `Message::new` allocating
//!   the topic `String` and reading the wall clock, TAGS and KEYS `String` pairs), two
//!   clock reads, the histogram, yielding; dropping messages ~6%.
//! * glommio scheduling and I/O ~7%; dispatch ~1.5% (it hardly runs); the CommitLog
//!   writer ~0.2% (whole-window writes).
//!
//! After the producers stop (dispatch catching up, ~35% of both CPUs busy, so it is
//! bound by I/O rather than CPU): the key index ~41% of the samples (slot and entry
//! updates, big-endian conversions, UTF-8 checks of topic and keys), glommio's I/O
//! submission and completion with virtio notifications ~37% (the index reads and
//! writes 4 KiB pages of its 20 MB slot table at random), ConsumeQueue entries ~6%,
//! copying log ranges out of the window to parse them ~5%.
//!
//! So per message the key index's dispatch costs more than the put path, and of the
//! put path the three biggest items (per-put allocations, the CRC combine, the window
//! zero-fill) are each fixable without format changes.
//!
//! # Store problems the load generator found
//!
//! * **Panic under paced load.** `--rate 300000` (150 k puts/s per shard) panics both
//!   shards within seconds: glommio's "Waker invariant broken" (a task's 16-bit waker
//!   count overflowed). The dispatcher waits on `flushed.wait_for(to + 1)` after every
//!   wake-up, and `OffsetWatch` keeps the waker of every dropped `WaitFor` until the
//!   offset passes it; in async mode `flushed` moves every 500 ms, so more than 32767
//!   wake-ups in between overflow the dispatcher task's count.
//! * **Puts waiting for window room are not served in order** (`OffsetWatch::set`
//!   wakes by `swap_remove`, newcomers take room first): with producers that do not
//!   yield, one put waited 4.9 s.
//! * **Dispatch lag has no bound** (above): records stay invisible to consumers for
//!   seconds under closed-loop producers, and shutdown pays for the backlog.
//! * **Tailing reads copy spans**: `Store::get` reads a queue's records through one span
//!   per nearby group (up to 4x the bytes needed, at least 256 KiB) and copies that span
//!   even from a resident window. With 32 interleaved queues per shard that is ~30 bytes
//!   copied per byte delivered; consumers that fall behind read ~0.1 M msg/s against
//!   0.8 M msg/s put and never catch up.

//! # Profile: async 1 KiB puts, scenario 1 (2026-12-03, branch `put`)
//!
//! `perf record -g --call-graph dwarf` of `coremq bench --flush async --body 1024
//! --queues 64 --duration 6` (2 shards, key index on, one key per message), folded
//! with /work/bw/fold.py; 2.4-2.6 us of CPU per message before. Shares of all
//! samples, store and load generator together:
//!
//! * **dispatch ~29%**: key-index insert 17.6% (of which the cache miss on the
//!   random slot, `PageSet::read_i32`, 7.6%), copying log ranges out to parse them
//!   (`CommitLog::read_into`) 4.6%, ConsumeQueue entries 4.1%, record parsing 1.9%.
//!   The dispatcher trailed the puts by up to `max_dispatch_lag_bytes` (256 MiB per
//!   shard), past the 64 MiB of resident write windows, so it read nearly every
//!   record back from disk and copied it.
//! * **put path ~30%**: `record::encode` 9.5% (CRC combine 2.3%, encoding into a
//!   scratch `Vec` 1.2% and copying that into the window 1.3%), the free-space check
//!   1.8% (an `Instant::now` per put), the store timestamp 1.5%, the queue lookup
//!   1.4%, properties 1.5%.
//! * **load generator ~19%**: building messages 11.6% (five small allocations per
//!   message: topic, properties `Vec`, TAGS and KEYS names and values; the body cut
//!   from a shared chunk; key formatting), three clock reads per put 2.4%.
//! * **key-index flush ~4%**: with one key per message nearly every 4 KiB slot page
//!   is dirty at every 1 s flush (20 MB per shard per second), copied twice (a
//!   `Vec`, then a DMA buffer in `File::write_aligned`).
//! * kernel and glommio ~12%: virtio notifications (`iowrite16`) 3.3%, task switches
//!   and membarrier IPIs of parks ~3%, page faults ~2%.
//!
//! What changed (each one removes work, nothing changes on disk):
//!
//! * the dispatcher decodes records where they lie in a resident window
//!   (`CommitLog::with_resident`, `Inner::dispatch_in_place`) and adds their keys
//!   with `IndexService::add_now` (no await; a record whose index pages are missing
//!   finishes through a copy and `add_from`); and the default
//!   `max_dispatch_lag_bytes` is 48 MiB, 3/4 of the write pool, so the records still
//!   to dispatch stay resident (no disk reads, no copy). Decoding in the buffers of
//!   disk reads as well was tried and dropped: dispatch then ran at about half the
//!   rate (230k against 370-450k msg/s with `--no-index`, same minute; cause not
//!   found).
//! * records are encoded straight into the write window (`CommitLog::append_with`,
//!   `record::encode_to`), and bodies up to 16 KiB are hashed twice for the record
//!   CRC instead of `Hasher::combine`;
//! * the free-space check reads `CLOCK_MONOTONIC_COARSE`; the load generator reads
//!   the clock twice per put instead of three times;
//! * the key-index flush copies dirty pages once, straight into the DMA buffers it
//!   writes (`write_rc`).
//!
//! A software prefetch of the next record's slot (decode one record ahead, prefetch,
//! then insert the current one) was tried and dropped: the prefetch instruction
//! itself took the miss (5.5% of the samples) and the slot write another 4.5%,
//! more than the 7.6% it was to hide (the slot table's 4 KiB pages miss the TLB too).
//!
//! Measured, old (66a38a8) and new binaries interleaved, `--duration 10`, CPU per
//! message (whole run, final flush included) and msg/s:
//!
//! | minute (UTC), fio seq write | old | new |
//! |---|---|---|
//! | 03:52, quieter (load 2-3) | 2.30, 2.17 us; 450k, 482k | 2.16, 2.14 us; 482k, 481k (256 MiB lag) |
//! | 03:53, both `--max-dispatch-lag-mib 48` | 2.20 us; 478k | 1.75 us; 552k |
//! | 04:16-04:18, load 7-9, fio 1144-1158 MB/s | 3.16, 2.59, 2.95 us; 129k, 93k, 109k | 2.24, 2.33, 2.06 us; 145k, 113k, 224k |
//! | 04:30-04:32, load 2-4, fio 2042 then 1447 MB/s (commit 00ae163) | 2.07, 3.04, 2.57 us; 342k, 239k, 293k | 1.55, 2.15, 1.84 us; 545k, 376k, 436k |
//! | 04:32, `--no-index` | 2.90 us; 259k | 2.21 us; 377k |
//!
//! So about -25% CPU per message with the new defaults (mean 1.85 us against 2.56 us
//! in the last three pairs) and about +50% msg/s (452k against 291k; body MB/s 0.27
//! and 0.31 of fio's write MB/s next to it, against 0.17 and 0.21); msg/s follows the CPU left to the run on this
//! shared machine (in the loaded minute the runs got 3-5 CPU-seconds of the 20
//! available). The 1 M msg/s target (<= ~2 us all in, with the CPU to run it) is
//! not reached: 1.55 us in the best run, at 545k msg/s. Left, biggest first
//! (from the profiles): the key index's slot miss (~0.2 us per key: a smaller slot
//! table per file, or huge pages for it); the load generator's message building
//! (~0.25 us: `Message` owns `String`s; a borrowed or shared topic and property
//! names would save four allocations); ConsumeQueue appends and the queue lookup per
//! record (a `(topic, queue)` hash per put and per dispatch); the clock reads for
//! born and store timestamps (~20 ns each); virtio notifications per write. Seen
//! once in ~15 runs of the new binary: a run whose shard never finished (executor
//! parked in `io_cqring_wait`, no CPU, killed after 10 minutes), the same symptom
//! as the hang noted below; not reproduced in the next 10 runs.
//!
//! Later (2026-12-03), the load generator's message building: each lane refills the
//! same `Message`s put after put (`Producer::fill`; `Store::put` takes a reference),
//! so topic, property names and values keep their allocations, and the born
//! timestamp comes from the send time already read instead of another clock read.
//! Old and new binaries interleaved, `--duration 4`, means of 5-6 pairs: async 1 KiB
//! 2.00 -> 1.61 us CPU per message (905 k -> 951 k msg/s: the disk's write rate is
//! near), sync 256 outstanding 5.06 -> 4.25 us (297 k -> 318 k msg/s).
//!
//! # Profile notes: catch-up, key queries, recovery (scenarios 5-7)
//!
//! `scripts/bench.sh --quick` on this 2-CPU VM (fio: 853-1087 MB/s sequential
//! O_DIRECT reads), commit 52aba96, plus `perf record -g` of the modes alone. The full
//! run of 5-7 (`scripts/bench.sh --only 5,6,7`, fio 918 MB/s): 5a 1027 MB/s (1.11:
//! two shards read in parallel, fio is one job) over a 2.5 GB log, RSS 167 MiB; 5b
//! 45 MB/s (0.04), RSS 2.7 GiB; 6 over 10 M keys p50 544 us, p99 4.9 ms, p99.9
//! 11.5 ms, RSS 168 MiB; 7 open 13.2 s for 2.9 GB of log against fio's 3.2 s (4.1x).
//!
//! * **Catch-up, one queue per shard (5a): 755-1076 MB/s, 0.69-0.99 of fio**, peak RSS
//!   167 MiB: each reader's records are contiguous, gets of 256 read ~1 MB spans.
//! * **Catch-up, 64 queues (5b): 37-49 MB/s, 0.03 of fio, peak RSS 2.5 GiB**, get p99
//!   2.3 s. `Store::get` reads a span from a queue's first record to its last within a
//!   budget of 4x the bytes wanted and everything in between: with 32 queues
//!   interleaved per shard each reader reads ~32 bytes per byte it keeps, so the disk
//!   runs at full speed on bytes thrown away, and 64 readers x ~34 MB spans per get of
//!   256 are in memory at once (memory follows readers x batch x interleaving, not the
//!   configuration; `--pull-batch 32`: 49 MB/s, 405 MiB). What I would change in
//!   `store.rs`: coalesce two records into one read only when the gap between them is
//!   small (a few KiB), otherwise read each record (4 KiB-aligned) on its own, with
//!   several reads in flight; better, a bounded cache of recently read log extents
//!   shared by a shard's readers, so readers catching up together share one
//!   sequential pass (what RocketMQ gets from the page cache).
//! * **Key queries (6): 200 k keys, hits p50 575-673 us, p99 2.0-4.2 ms; misses p50
//!   150 us, p99 0.7-1.5 ms.** I/O latency bound: coremq's own code is under 2% of the
//!   samples; the rest is the kernel submitting reads (virtio notification
//!   `iowrite16` 13%), switching away while the executor parks between dependent
//!   reads (`finish_task_switch` 20%) and glommio's membarrier IPI on every park
//!   (~15%). A hit is a chain of dependent 4 KiB O_DIRECT reads: slot page, entry
//!   page(s), then the record, each a disk round trip (~150-250 us here; fio's 4 KiB
//!   write p50 is 231 us). What I would change in `index.rs`: read the whole slot
//!   table (20 MB, it fits the 32 MiB page budget) sequentially at open instead of
//!   page by page on demand, which takes one round trip off every query and makes
//!   misses memory-only; keep entry pages of the newest file cached.
//! * **Recovery (7): 352 MB log, open 2.7-4.9 s against fio's 0.32 s (9-15x).** Every
//!   record is scanned and re-dispatched from offset 0 although the checkpoint is
//!   valid: the key index file written before the kill was never flushed ("removing
//!   an index file that was never written"), so its durable end is 0 and open
//!   re-dispatches the whole log to rebuild the index. Profile: ~45% kernel (read
//!   submission, parks, membarrier IPIs: one read in flight at a time), memmove 8%
//!   (copying log ranges to parse them), index slot updates 3%, dispatch 3%, CRC 2.6%,
//!   UTF-8 checks 2.3%, property parsing 1.3%; 2.7 CPU-seconds in 3.5 s on 2 shards,
//!   so it waits on the disk more than it computes. What I would change: flush the key
//!   index with every checkpoint round so its durable end follows the checkpoint
//!   (recovery then re-dispatches only the tail), and keep several large reads in
//!   flight in the recovery scan and in `dispatch_range` (fio reads at depth 8).
//!
//! Store problems these runs found (not fixed here: core files):
//!
//! * **Reopen after a clean shutdown rebuilds every queue**: "dispatch from the
//!   checkpoint failed; rebuilding queues from the whole log: bad magic code at offset
//!   27688614", on a log whose last record starts at 27688613 (277-byte records, end
//!   27688890): the dispatch start taken from the checkpoint (or the index's durable
//!   end) is one byte past a record start. Seen on every reopen of the 200 k-key
//!   store, on both shards.
//! * **An open hung once**: in key-queries mode one shard's `Store::open` never
//!   returned (its executor parked in `io_cqring_wait`, nothing moving for 12
//!   minutes), right after the warning above on the other shard; not reproduced in
//!   two more runs. `bench.sh` now SIGKILLs a run after a time limit and reports it.

pub mod remote;

use crate::config::SyncFlushIo;
use crate::format::properties;
use crate::format::record::{self, Decoded, Verify};
use crate::{FlushMode, GetStatus, Message, Store, StoreConfig};
use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------
// configuration

/// Body sizes: one size, or a uniform range `min..max` (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodySize {
    pub min: usize,
    pub max: usize,
}

impl BodySize {
    /// Smallest body: the send time takes the first 8 bytes.
    pub const MIN: usize = 8;

    pub fn fixed(n: usize) -> BodySize {
        BodySize { min: n, max: n }
    }
}

impl std::str::FromStr for BodySize {
    type Err = String;

    fn from_str(s: &str) -> Result<BodySize, String> {
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| format!("{v:?} is not a byte count"))
        };
        let size = match s.split_once("..") {
            Some((a, b)) => BodySize {
                min: num(a)?,
                max: num(b.trim_start_matches('='))?,
            },
            None => BodySize::fixed(num(s)?),
        };
        if size.min > size.max {
            return Err(format!("empty range {s}"));
        }
        if size.min < BodySize::MIN {
            return Err(format!(
                "bodies must be at least {} bytes (they carry the send time)",
                BodySize::MIN
            ));
        }
        Ok(size)
    }
}

impl std::fmt::Display for BodySize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}..{}", self.min, self.max)
        }
    }
}

/// The flush mode, as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flush {
    Async,
    Sync,
}

impl Flush {
    pub fn mode(self) -> FlushMode {
        match self {
            Flush::Async => FlushMode::Async,
            Flush::Sync => FlushMode::Sync,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Flush::Async => "async",
            Flush::Sync => "sync",
        }
    }
}

/// What `coremq bench` does with the store in `--data-dir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// Put messages (and tail them with --consumers): scenarios 1-4
    #[default]
    Produce,
    /// Read every queue of a kept store from its first offset as fast as possible
    /// (scenario 5)
    CatchUp,
    /// Random key queries on a store kept by a --messages run with the same --shards,
    /// --producers, --topics, --queues and --batch (scenario 6)
    KeyQueries,
    /// Open a kept store (recovering it), report the open's time, shut down
    /// (scenario 7)
    Recover,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::CatchUp => "catch-up",
            Mode::KeyQueries => "key-queries",
            Mode::Recover => "recover",
        }
    }
}

/// Everything a load-generator run can vary (also the `coremq bench` arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct LoadConfig {
    /// Shards: pinned executors, each with its own store [default: the CPUs available]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: Option<u32>,
    /// Topics (BenchTopic0, BenchTopic1, ...)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub topics: u32,
    /// Queues per topic; queue q belongs to shard q % shards
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub queues: u32,
    /// Body bytes: a size (1024) or a uniform range (512..4096); at least 8
    #[arg(long, default_value = "1024")]
    pub body: BodySize,
    /// Keys per message (RocketMQ's KEYS property)
    #[arg(long, default_value_t = 1)]
    pub keys: u32,
    /// Messages per put: 1 uses Store::put, more uses Store::put_batch
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch: u32,
    /// Puts each producer keeps in flight
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub outstanding: u32,
    /// Producers per shard
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,
    /// Run a tailing consumer per queue and measure end-to-end latency
    #[arg(long)]
    pub consumers: bool,
    /// Flush mode of the stores
    #[arg(long, value_enum, default_value_t = Flush::Async)]
    pub flush: Flush,
    /// Seconds to produce (unless --messages is given)
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Messages to put in total, instead of a duration
    #[arg(long, conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// Target rate in messages/s over all producers (open loop); default: unlimited
    #[arg(long)]
    pub rate: Option<f64>,
    /// Run in DIR and keep the store there [default: a temporary directory under the
    /// current one, removed at the end]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Write the report as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the latency percentile curves as SVG to FILE
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// A name for this run in the reports
    #[arg(long, default_value = "coremq bench")]
    pub label: String,
    /// No progress line on stderr
    #[arg(long)]
    pub quiet: bool,
    /// Seconds consumers may take to catch up once the producers are done; then they
    /// stop and the unread messages are reported as a problem
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Drive a running node at HOST:PORT (its broker port) through RocketMQ's protocol
    /// instead of an embedded store (see `coremq::node::bench`); uses --topics,
    /// --queues, --body, --producers (connections), --outstanding, --duration or
    /// --messages, --consumers (read back), --json, --label
    #[arg(long, value_name = "HOST:PORT")]
    pub target: Option<String>,
    /// What to do: produce, or work on the store a produce run kept in --data-dir
    #[arg(long, value_enum, default_value_t = Mode::Produce)]
    pub mode: Mode,
    /// Messages per get in catch-up mode (the store caps gets at 1024)
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub pull_batch: u32,
    /// Key queries in key-queries mode, all shards together; one in 100 asks for a
    /// key that was never written
    #[arg(long, default_value_t = 100_000)]
    pub queries: u64,
    /// Once the producers are done and the log is flushed, SIGKILL this process: no
    /// shutdown, the stores' abort files stay (the writer of scenario 7). The JSON
    /// report is written first, with what was put
    #[arg(long)]
    pub kill_after_flush: bool,
    /// Run the stores without the key index (to see what indexing costs)
    #[arg(long)]
    pub no_index: bool,
    /// The stores' `max_dispatch_lag_bytes` in MiB (0: puts never wait for dispatch);
    /// default: the store's default
    #[arg(long, value_name = "MIB")]
    pub max_dispatch_lag_mib: Option<u64>,
    /// Memory of each shard's CommitLog read cache in MiB (the store's
    /// `read_cache_bytes`; 0 turns it off); the store's default when not given
    #[arg(long, value_name = "MIB")]
    pub read_cache_mib: Option<u64>,
    /// How sync-flush rounds reach the disk (the store's `sync_flush_io`)
    #[arg(long, value_enum, default_value_t = SyncIo::Dsync)]
    pub sync_io: SyncIo,
    /// Zero-fill the commit log this many MiB ahead of the write position (the store's
    /// `commit_log_prewrite_bytes`); default: the store's default (the write pool in
    /// sync mode, off in async mode)
    #[arg(long, value_name = "MIB")]
    pub prewrite_mib: Option<u64>,
    /// Let every shard's executor spin this long for I/O before parking (glommio's
    /// `spin_before_park`; burns CPU, shortens wake-ups); default: no spinning
    #[arg(long, value_name = "US")]
    pub spin_us: Option<u64>,
}

/// The store's [`SyncFlushIo`], as a command-line value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncIo {
    /// One pwritev2(RWF_DSYNC) per round on the shard's sync-write thread
    Dsync,
    /// An io_uring write, then an io_uring fdatasync
    Ring,
}

impl LoadConfig {
    fn spin(&self) -> Option<Duration> {
        self.spin_us.map(Duration::from_micros)
    }

    /// The store settings every shard of this run opens with (root set per shard).
    pub fn store_template(&self, root: &Path) -> StoreConfig {
        let mut c = StoreConfig::new(root);
        c.flush_mode = self.flush.mode();
        c.index_enable = !self.no_index;
        if let Some(mib) = self.max_dispatch_lag_mib {
            c.max_dispatch_lag_bytes = mib << 20;
        }
        if let Some(mib) = self.read_cache_mib {
            c.read_cache_bytes = (mib << 20) as usize;
        }
        c.sync_flush_io = match self.sync_io {
            SyncIo::Dsync => SyncFlushIo::DsyncWrite,
            SyncIo::Ring => SyncFlushIo::RingWriteFdatasync,
        };
        if let Some(mib) = self.prewrite_mib {
            c.commit_log_prewrite_bytes = Some(mib << 20);
        }
        c
    }
}

#[derive(clap::Parser)]
struct DefaultArgs {
    #[command(flatten)]
    cfg: LoadConfig,
}

impl Default for LoadConfig {
    /// The command line's defaults.
    fn default() -> LoadConfig {
        use clap::Parser;
        DefaultArgs::parse_from(["bench"]).cfg
    }
}

impl LoadConfig {
    /// A run of a second or two that still goes through every part: one shard, two
    /// queues, 2000 messages.
    pub fn tiny() -> LoadConfig {
        LoadConfig {
            shards: Some(1),
            queues: 2,
            messages: Some(2000),
            outstanding: 16,
            label: "tiny".into(),
            ..LoadConfig::default()
        }
    }

    /// Shards that own at least one queue.
    pub fn effective_shards(&self) -> usize {
        let want = self
            .shards
            .map(|s| s as usize)
            .unwrap_or_else(|| allowed_cpus().len().max(1));
        want.min(self.queues as usize).max(1)
    }

    fn validate(&self) -> Result<(), String> {
        if !(self.duration > 0.0 && self.duration.is_finite()) && self.messages.is_none() {
            return Err("--duration must be a positive number of seconds".into());
        }
        if let Some(r) = self.rate
            && !(r > 0.0 && r.is_finite())
        {
            return Err("--rate must be a positive number of messages per second".into());
        }
        if !(self.drain_timeout >= 0.0 && self.drain_timeout.is_finite()) {
            return Err("--drain-timeout must be a number of seconds".into());
        }
        if self.body.min < BodySize::MIN {
            return Err(format!("bodies must be at least {} bytes", BodySize::MIN));
        }
        Ok(())
    }

    fn to_json(&self) -> Value {
        json!({
            "shards": self.effective_shards(),
            "topics": self.topics,
            "queues": self.queues,
            "body_bytes": self.body.to_string(),
            "keys": self.keys,
            "batch": self.batch,
            "outstanding": self.outstanding,
            "producers": self.producers,
            "consumers": self.consumers,
            "flush": self.flush.name(),
            "duration_s": if self.messages.is_some() { None } else { Some(self.duration) },
            "messages": self.messages,
            "rate": self.rate,
            "drain_timeout_s": self.drain_timeout,
            "key_index": !self.no_index,
            "max_dispatch_lag_mib": self.max_dispatch_lag_mib,
            "read_cache_mib": self.read_cache_mib,
            "sync_io": match self.sync_io { SyncIo::Dsync => "dsync", SyncIo::Ring => "ring" },
            "prewrite_mib": self.prewrite_mib,
            "spin_us": self.spin_us,
        })
    }
}

// ---------------------------------------------------------------------------------
// clock, CPU and memory

/// The monotonic clock's zero, and the wall clock (ms since the epoch) then.
static CLOCK_BASE: OnceLock<(Instant, i64)> = OnceLock::new();

fn clock_base() -> &'static (Instant, i64) {
    CLOCK_BASE.get_or_init(|| (Instant::now(), crate::now_ms()))
}

/// Nanoseconds of a monotonic clock shared by every thread of the process (since its
/// first use), so a time taken on one shard can be compared on another.
pub fn now_ns() -> u64 {
    clock_base().0.elapsed().as_nanos() as u64
}

/// Wall-clock milliseconds at `now_ns() == ns` (a message's born timestamp without
/// another clock read).
fn wall_ms(ns: u64) -> i64 {
    clock_base().1 + (ns / 1_000_000) as i64
}

/// The process's CPU time (user + system) in seconds and its peak RSS in bytes.
fn process_usage() -> (f64, u64) {
    // SAFETY: getrusage only writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return (0.0, 0);
        }
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        secs(ru.ru_utime) + secs(ru.ru_stime),
        ru.ru_maxrss as u64 * 1024,
    )
}

/// The CPUs this process may run on, ascending.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into `set`.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            Vec::new()
        } else {
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    };
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    } else {
        cpus
    }
}

// ---------------------------------------------------------------------------------
// the shard runtime

/// Makes shard threads start their work together once every store is open, or not
/// at all if one failed.
struct StartGate {
    state: Mutex<(usize, bool)>,
    cv: Condvar,
    parties: usize,
}

impl StartGate {
    fn new(parties: usize) -> StartGate {
        StartGate {
            state: Mutex::new((0, false)),
            cv: Condvar::new(),
            parties,
        }
    }

    /// Arrives (`ok`: this party is ready) and waits for the others; true when all
    /// arrived ready.
    fn arrive(&self, ok: bool) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1;
        s.1 |= !ok;
        self.cv.notify_all();
        while s.0 < self.parties && !s.1 {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        !s.1
    }

    /// Waits without arriving (the caller watching the shards).
    fn watch(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while s.0 < self.parties && !s.1 {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        !s.1
    }

    fn fail(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 = true;
        self.cv.notify_all();
    }
}

/// Marks the gate failed if a shard thread ends (fails, panics) before arriving.
struct ArriveGuard {
    gate: Arc<StartGate>,
    arrived: Rc<Cell<bool>>,
}

impl Drop for ArriveGuard {
    fn drop(&mut self) {
        if !self.arrived.get() {
            self.gate.fail();
        }
    }
}

/// Counts a shard thread as finished however it ends (a panic included), so the
/// caller never waits for a thread that is gone. It lives on the thread's stack, not in
/// the shard's future: glommio does not drop a task's future when the task panics.
struct FinishGuard(Arc<AtomicUsize>);

impl Drop for FinishGuard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Running shards started by [`spawn_shards`].
pub struct ShardSet<T: Send + 'static> {
    handles: Vec<std::thread::JoinHandle<Result<T, String>>>,
    finished: Arc<AtomicUsize>,
}

impl<T: Send + 'static> ShardSet<T> {
    /// Whether every shard has finished its work and shut its store down.
    pub fn all_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire) >= self.handles.len()
    }

    /// Each shard's result, in shard order; the first failure if any shard failed.
    pub fn join(self) -> Result<Vec<T>, String> {
        let mut out = Vec::with_capacity(self.handles.len());
        let mut first_err = None;
        for (i, h) in self.handles.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(v)) => out.push(v),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(panic) => {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    first_err.get_or_insert(format!("shard {i} panicked: {why}"));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// How long a task queue may run while another one waits (glommio's default is
/// 100 ms). With 100 ms the producers kept the CommitLog writer off the CPU for tens of
/// milliseconds at a time and put latency's tail was 60-90 ms; 5 ms measured best (1 ms
/// cost throughput and raised p99.9).
pub const PREEMPT_TIMER: Duration = Duration::from_millis(5);

/// Starts `shards` executors, shard `i` pinned to the `i`-th allowed CPU (wrapping)
/// and owning a [`Store`] opened on `root/shard-<i>` with `template`'s settings. Once
/// every store is open (this call returns then), each shard runs `job(i, store)` and
/// shuts its store down cleanly. `spin`: glommio's `spin_before_park`.
///
/// This is the load generator's whole view of the store runtime: a real multi-shard
/// store replaces this function.
pub fn spawn_shards<T, J, Fut>(
    root: &Path,
    shards: usize,
    template: &StoreConfig,
    spin: Option<Duration>,
    job: J,
) -> Result<ShardSet<T>, String>
where
    J: FnOnce(usize, Store) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let cpus = allowed_cpus();
    let gate = Arc::new(StartGate::new(shards));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(shards);
    for i in 0..shards {
        let mut cfg = template.clone();
        cfg.root = root.join(format!("shard-{i}"));
        let (gate2, finished2, job) = (gate.clone(), finished.clone(), job.clone());
        let mut builder =
            glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(cpus[i % cpus.len()]))
                .name(&format!("shard-{i}"))
                .io_memory(64 << 20)
                .preempt_timer(PREEMPT_TIMER);
        if let Some(spin) = spin {
            builder = builder.spin_before_park(spin);
        }
        let spawned = std::thread::Builder::new()
            .name(format!("shard-{i}"))
            .spawn(move || {
                let _finished = FinishGuard(finished2);
                let arrived = Rc::new(Cell::new(false));
                let _arrival = ArriveGuard {
                    gate: gate2.clone(),
                    arrived: arrived.clone(),
                };
                let executor = builder
                    .make()
                    .map_err(|e| format!("shard {i}: cannot start its executor: {e}"))?;
                executor.run(shard_main(i, cfg, &gate2, &arrived, job))
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                gate.fail();
                // The shards already started see the failure, close and exit.
                for h in handles {
                    let _ = h.join();
                }
                return Err(format!("cannot start shard {i}: {e}"));
            }
        }
    }
    let set = ShardSet { handles, finished };
    if !gate.watch() {
        return match set.join() {
            Err(e) => Err(e),
            Ok(_) => Err("a shard failed to start".into()),
        };
    }
    Ok(set)
}

async fn shard_main<T, J, Fut>(
    i: usize,
    cfg: StoreConfig,
    gate: &StartGate,
    arrived: &Cell<bool>,
    job: J,
) -> Result<T, String>
where
    J: FnOnce(usize, Store) -> Fut,
    Fut: Future<Output = T>,
{
    let root = cfg.root.clone();
    let opened = Store::open(cfg).await;
    // Blocking here is fine: nothing else of this shard has started yet.
    let all_ready = gate.arrive(opened.is_ok());
    arrived.set(true);
    let store = opened.map_err(|e| format!("shard {i}: cannot open {}: {e}", root.display()))?;
    if !all_ready {
        let _ = store.shutdown().await;
        return Err(format!("shard {i}: another shard failed to start"));
    }
    let out = job(i, store.clone()).await;
    store
        .shutdown()
        .await
        .map_err(|e| format!("shard {i}: shutdown failed: {e}"))?;
    Ok(out)
}

// ---------------------------------------------------------------------------------
// one shard's load

/// Counters a shard updates and the progress line reads (one cache line each).
#[repr(align(128))]
#[derive(Default)]
struct ShardCounters {
    messages: AtomicU64,
    bytes: AtomicU64,
    consumed: AtomicU64,
    errors: AtomicU64,
    /// The store's log positions, published every [`MONITOR_INTERVAL`] for the stall
    /// report: written, committed, flushed, dispatched.
    log: [AtomicU64; 4],
    /// The shard's producers are done.
    produced: AtomicBool,
    /// Rounds of the monitor task: whether the shard's executor still runs tasks.
    heartbeat: AtomicU64,
    /// Largest written - dispatched the monitor saw: records not yet visible to gets.
    max_dispatch_lag: AtomicU64,
}

const MONITOR_INTERVAL: Duration = Duration::from_millis(100);

/// What every shard shares, read-only.
struct Plan {
    cfg: LoadConfig,
    shards: usize,
    topics: Vec<String>,
    /// Random bytes the bodies are copied from.
    pattern: Vec<u8>,
    counters: Vec<ShardCounters>,
}

impl Plan {
    fn producers_total(&self) -> u64 {
        self.shards as u64 * self.cfg.producers as u64
    }

    /// Messages producer `g` (global index) puts, in message-count mode.
    fn quota(&self, g: u64) -> Option<u64> {
        let total = self.cfg.messages?;
        let n = self.producers_total();
        Some(total / n + u64::from(g < total % n))
    }

    /// Messages per second of one producer, under `--rate`.
    fn producer_rate(&self) -> Option<f64> {
        self.cfg.rate.map(|r| r / self.producers_total() as f64)
    }

    /// The queues shard `s` owns.
    fn queues_of(&self, s: usize) -> Vec<(String, i32)> {
        let mut v = Vec::new();
        for t in &self.topics {
            for q in (s..self.cfg.queues as usize).step_by(self.shards) {
                v.push((t.clone(), q as i32));
            }
        }
        v
    }
}

/// A one-shard broadcast: every waiter wakes on the next `notify`.
#[derive(Default)]
struct Signal {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Signal {
    fn notify(&self) {
        self.generation.set(self.generation.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }

    /// Resolves at the first `notify` after this call.
    fn changed(&self) -> impl Future<Output = ()> + '_ {
        let seen = self.generation.get();
        std::future::poll_fn(move |cx| {
            if self.generation.get() != seen {
                Poll::Ready(())
            } else {
                self.wakers.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns to 1 hour at 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// One shard's state, shared by its tasks.
struct Shard {
    index: usize,
    store: Store,
    plan: Arc<Plan>,
    put_latency: RefCell<Histogram<u64>>,
    e2e_latency: RefCell<Histogram<u64>>,
    first_error: RefCell<Option<String>>,
    /// Producers notify after every put, for the dispatch watcher.
    arrival: Signal,
    /// New records are visible to `get`.
    visible: Signal,
    producing: Cell<bool>,
    /// Everything put is visible: consumers may stop once they have read it.
    drained: Cell<bool>,
    /// The drain timeout passed: consumers stop where they are.
    stop_consumers: Cell<bool>,
}

impl Shard {
    fn counters(&self) -> &ShardCounters {
        &self.plan.counters[self.index]
    }

    fn error(&self, what: String) {
        self.first_error.borrow_mut().get_or_insert(what);
    }
}

/// What one shard measured.
struct ShardResult {
    start_ns: u64,
    /// When the last put of this shard returned.
    produced_ns: u64,
    /// Messages consumed by then.
    consumed_while_producing: u64,
    messages: u64,
    bytes: u64,
    log_bytes: u64,
    consumed: u64,
    errors: u64,
    first_error: Option<String>,
    put_latency: Histogram<u64>,
    e2e_latency: Histogram<u64>,
}

async fn shard_job(index: usize, store: Store, plan: Arc<Plan>) -> ShardResult {
    use glommio::{Latency, Shares, executor, spawn_local_into};
    let queues = Rc::new(plan.queues_of(index));
    let shard = Rc::new(Shard {
        index,
        store: store.clone(),
        plan: plan.clone(),
        put_latency: RefCell::new(new_histogram()),
        e2e_latency: RefCell::new(new_histogram()),
        first_error: RefCell::new(None),
        arrival: Signal::default(),
        visible: Signal::default(),
        producing: Cell::new(true),
        drained: Cell::new(false),
        stop_consumers: Cell::new(false),
    });
    let log_start = store.max_log_offset();
    let start_ns = now_ns();

    let mut consumers = Vec::new();
    if plan.cfg.consumers {
        let tq =
            executor().create_task_queue(Shares::Static(1000), Latency::NotImportant, "consumers");
        for (topic, q) in queues.iter() {
            // Start at the end: only this run's messages are read.
            let from = store.max_queue_offset(topic, *q);
            let fut = consume(shard.clone(), topic.clone(), *q, from);
            consumers.push(spawn_local_into(fut, tq).expect("spawn consumer"));
        }
        consumers.push(spawn_local_into(watch_dispatch(shard.clone()), tq).expect("spawn watcher"));
    }

    // Detached: it keeps reporting while the store shuts down, until the executor ends.
    spawn_local_into(
        monitor(store.clone(), plan.clone(), index),
        executor().current_task_queue(),
    )
    .expect("spawn monitor")
    .detach();

    let tq = executor().create_task_queue(Shares::Static(1000), Latency::NotImportant, "producers");
    let mut lanes = Vec::new();
    for p in 0..plan.cfg.producers {
        let producer = Rc::new(Producer {
            shard: shard.clone(),
            global: (index * plan.cfg.producers as usize + p as usize) as u64,
            index: p as usize,
            queues: queues.clone(),
            next: Cell::new(0),
            quota: plan.quota((index * plan.cfg.producers as usize + p as usize) as u64),
            rate: plan.producer_rate(),
            start_ns,
            deadline_ns: match plan.cfg.messages {
                Some(_) => None,
                None => Some(start_ns + (plan.cfg.duration * 1e9) as u64),
            },
            chunk: RefCell::new(BytesMut::new()),
        });
        for l in 0..plan.cfg.outstanding {
            let fut = lane(producer.clone(), l as u64);
            lanes.push(spawn_local_into(fut, tq).expect("spawn producer"));
        }
    }
    let mut produced_ns = start_ns;
    for lane in lanes {
        produced_ns = produced_ns.max(lane.await);
    }
    shard.producing.set(false);
    shard.counters().produced.store(true, Ordering::Relaxed);
    let consumed_while_producing = shard.counters().consumed.load(Ordering::Relaxed);
    shard.arrival.notify();
    let deadline = now_ns() + (plan.cfg.drain_timeout.max(0.0) * 1e9) as u64;
    let mut timed_out = false;
    for mut c in consumers {
        if !timed_out {
            let left = Duration::from_nanos(deadline.saturating_sub(now_ns()));
            let finished = futures_lite::future::or(
                async {
                    (&mut c).await;
                    true
                },
                async {
                    glommio::timer::sleep(left).await;
                    false
                },
            )
            .await;
            if finished {
                continue;
            }
            timed_out = true;
            shard.stop_consumers.set(true);
            shard.visible.notify();
        }
        c.await;
    }
    if timed_out {
        let c = shard.counters();
        shard.error(format!(
            "shard {index}: consumers were {} messages behind after the {} s drain timeout",
            c.messages
                .load(Ordering::Relaxed)
                .saturating_sub(c.consumed.load(Ordering::Relaxed)),
            plan.cfg.drain_timeout
        ));
    }
    shard.drained.set(true);
    if plan.cfg.kill_after_flush {
        // The main thread SIGKILLs the process once every shard's log is flushed: a
        // shard done early must not shut down cleanly before then (scenario 7 then
        // timed one clean and one abnormal open).
        std::future::pending::<()>().await;
    }
    let c = shard.counters();
    ShardResult {
        start_ns,
        produced_ns,
        consumed_while_producing,
        messages: c.messages.load(Ordering::Relaxed),
        bytes: c.bytes.load(Ordering::Relaxed),
        log_bytes: store.max_log_offset() - log_start,
        consumed: c.consumed.load(Ordering::Relaxed),
        errors: c.errors.load(Ordering::Relaxed),
        first_error: shard.first_error.borrow_mut().take(),
        put_latency: shard.put_latency.replace(new_histogram()),
        e2e_latency: shard.e2e_latency.replace(new_histogram()),
    }
}

/// One producer: its lanes share the message sequence.
struct Producer {
    shard: Rc<Shard>,
    /// Index among all producers of all shards.
    global: u64,
    /// Index within the shard.
    index: usize,
    queues: Rc<Vec<(String, i32)>>,
    /// Next message number of this producer.
    next: Cell<u64>,
    quota: Option<u64>,
    /// Messages/s under `--rate`.
    rate: Option<f64>,
    start_ns: u64,
    deadline_ns: Option<u64>,
    /// What bodies are cut from.
    chunk: RefCell<BytesMut>,
}

/// Sends closer than this to their intended time go at once: timers are not finer.
const PACE_SLACK_NS: u64 = 20_000;

/// One outstanding put of a producer, repeated. Returns when its last put returned.
async fn lane(p: Rc<Producer>, lane_id: u64) -> u64 {
    let shard = &p.shard;
    let cfg = &shard.plan.cfg;
    let batch = cfg.batch as u64;
    let mut rng = Rng::new((p.global << 32) | lane_id);
    let mut last_done = p.start_ns;
    let mut msgs = Vec::with_capacity(batch as usize);
    loop {
        let k = p.next.get();
        let n = match p.quota {
            Some(quota) if k >= quota => break,
            Some(quota) => batch.min(quota - k),
            None => batch,
        };
        let intended = p.rate.map(|r| p.start_ns + (k as f64 * 1e9 / r) as u64);
        // One clock read serves the deadline check and, unless the send is paced and
        // sleeps, the start time: clock reads were ~5% of the CPU per message.
        let mut now = now_ns();
        if let Some(deadline) = p.deadline_ns
            && intended.unwrap_or(now) >= deadline
        {
            break;
        }
        p.next.set(k + n);
        if let Some(at) = intended
            && at > now + PACE_SLACK_NS
        {
            glommio::timer::sleep(Duration::from_nanos(at - now)).await;
            now = now_ns();
        }
        let started = now;
        // A send that starts late is charged from its intended time; one that starts
        // a little early (within the timer slack) from when it really started.
        let sent = intended.map_or(started, |at| at.min(started));
        let (topic, q) = &p.queues[(p.index + (k / batch) as usize) % p.queues.len()];
        let mut bytes = 0;
        for i in 0..n {
            let len = rng.between(cfg.body.min, cfg.body.max);
            bytes += len as u64;
            if msgs.len() <= i as usize {
                msgs.push(Message::new(topic.as_str(), *q, Bytes::new()));
            }
            p.fill(&mut msgs[i as usize], topic, *q, k + i, len, sent);
        }
        msgs.truncate(n as usize);
        let status = if batch == 1 {
            shard.store.put(&msgs[0]).await.status
        } else {
            shard.store.put_batch(&msgs).await.status
        };
        let done = now_ns();
        last_done = done;
        let c = shard.counters();
        if status.is_stored() {
            shard
                .put_latency
                .borrow_mut()
                .saturating_record(done.saturating_sub(sent));
            c.messages.fetch_add(n, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(n, Ordering::Relaxed);
            shard.error(format!("put to {topic}/{q}: {status:?}"));
        }
        if cfg.consumers {
            shard.arrival.notify();
        }
        // Every outstanding put is its own request: take turns, as a broker serving
        // requests would, rather than let one lane run until the pool is full.
        futures_lite::future::yield_now().await;
    }
    last_done
}

/// Bodies are cut from chunks of this size, as a broker cuts them from its network
/// read buffers: one allocation serves many messages.
const BODY_CHUNK: usize = 256 << 10;

impl Producer {
    /// Makes `m` message `seq` of this producer: `len` body bytes starting with the
    /// send time. A lane refills the same messages put after put: their strings keep
    /// their allocations (six allocations and frees per message were ~7% of the CPU
    /// per async 1 KiB put, perf 2026-12-03).
    fn fill(&self, m: &mut Message, topic: &str, q: i32, seq: u64, len: usize, sent: u64) {
        let plan = &self.shard.plan;
        m.body = {
            let mut chunk = self.chunk.borrow_mut();
            if chunk.capacity() < len {
                *chunk = BytesMut::with_capacity(BODY_CHUNK.max(len));
            }
            chunk.extend_from_slice(&sent.to_le_bytes());
            let from = (seq as usize * 64) % (plan.pattern.len() - plan.cfg.body.max + 1);
            chunk.extend_from_slice(&plan.pattern[from..from + len - 8]);
            chunk.split().freeze()
        };
        if m.topic != topic {
            m.topic.clear();
            m.topic.push_str(topic);
        }
        m.queue_id = q;
        m.born_timestamp_ms = wall_ms(sent);
        if m.properties.is_empty() {
            m.properties.push((properties::TAGS.into(), "bench".into()));
            if plan.cfg.keys > 0 {
                m.properties.push((properties::KEYS.into(), String::new()));
            }
        }
        if plan.cfg.keys > 0 {
            let keys = &mut m.properties[1].1;
            keys.clear();
            for j in 0..plan.cfg.keys {
                if j > 0 {
                    keys.push(' ');
                }
                keys.push('k');
                push_decimal(keys, self.global);
                keys.push('-');
                push_decimal(keys, seq);
                keys.push('-');
                push_decimal(keys, j as u64);
            }
        }
    }
}

/// Appends `n` in decimal: `write!` was a visible share of the producer's CPU.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[i..]).expect("ASCII digits"));
}

/// Wakes the consumers whenever newly written records have been dispatched (what a
/// broker's long-polling "message arriving" hook does), and marks the shard drained
/// once the producers are done and everything is visible.
async fn watch_dispatch(shard: Rc<Shard>) {
    let store = &shard.store;
    let mut announced = store.dispatched_log_offset();
    loop {
        if let Some(f) = store.failure() {
            shard.error(format!("store failed: {f}"));
            break;
        }
        // The dispatcher may have run before this task: announce whatever it
        // dispatched since the last round, waited for or not.
        let dispatched = store.dispatched_log_offset();
        if dispatched > announced {
            announced = dispatched;
            shard.visible.notify();
        }
        if dispatched < store.max_log_offset() {
            store.wait_dispatched().await;
            continue;
        }
        if !shard.producing.get() || shard.stop_consumers.get() {
            break;
        }
        shard.arrival.changed().await;
    }
    shard.drained.set(true);
    shard.visible.notify();
}

/// Publishes the store's log positions for the progress thread, until the executor
/// ends (after the store's shutdown).
async fn monitor(store: Store, plan: Arc<Plan>, index: usize) {
    loop {
        let positions = [
            store.max_log_offset(),
            store.committed_log_offset(),
            store.flushed_log_offset(),
            store.dispatched_log_offset(),
        ];
        let c = &plan.counters[index];
        for (a, v) in c.log.iter().zip(positions) {
            a.store(v, Ordering::Relaxed);
        }
        c.heartbeat.fetch_add(1, Ordering::Relaxed);
        c.max_dispatch_lag
            .fetch_max(positions[0] - positions[3], Ordering::Relaxed);
        glommio::timer::sleep(MONITOR_INTERVAL).await;
    }
}

/// Records a consumer asks for per `get` (RocketMQ's default pull batch).
const PULL_BATCH: usize = 32;

/// A tailing consumer of one queue: reads every record from `from` on as soon as it
/// is visible and records its end-to-end latency.
async fn consume(shard: Rc<Shard>, topic: String, q: i32, from: u64) {
    let store = &shard.store;
    let mut offset = from;
    let verify = Verify {
        crc: false,
        at_offset: None,
        max_total_size: usize::MAX,
        require_record_crc: false,
    };
    loop {
        if shard.stop_consumers.get() {
            return;
        }
        if offset >= store.max_queue_offset(&topic, q) {
            if shard.drained.get() {
                return;
            }
            shard.visible.changed().await;
            continue;
        }
        let got = match store.get(&topic, q, offset, PULL_BATCH, 1 << 20).await {
            Ok(got) => got,
            Err(e) => {
                shard.error(format!("get {topic}/{q} at {offset}: {e}"));
                return;
            }
        };
        if got.status != GetStatus::Found {
            shard.error(format!(
                "get {topic}/{q} at {offset}: {:?} (queue {}..{})",
                got.status, got.min_offset, got.max_offset
            ));
            return;
        }
        let seen = now_ns();
        {
            let mut hist = shard.e2e_latency.borrow_mut();
            for raw in &got.records {
                let sent = match record::decode(raw, verify) {
                    Ok(Decoded::Record(r)) if r.body.len() >= 8 => {
                        u64::from_le_bytes(r.body[..8].try_into().expect("8 bytes"))
                    }
                    _ => {
                        shard.error(format!("{topic}/{q}: a record does not decode"));
                        continue;
                    }
                };
                hist.saturating_record(seen.saturating_sub(sent));
            }
        }
        shard
            .counters()
            .consumed
            .fetch_add(got.records.len() as u64, Ordering::Relaxed);
        offset = got.next_begin_offset;
        glommio::yield_if_needed().await;
    }
}

/// xorshift64*: body sizes and the body pattern, cheaply.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, min: usize, max: usize) -> usize {
        if min == max {
            min
        } else {
            min + (self.next() % (max - min + 1) as u64) as usize
        }
    }
}

// ---------------------------------------------------------------------------------
// running and reporting

/// What a run measured.
pub struct Report {
    pub config: LoadConfig,
    pub shards: usize,
    pub data_dir: PathBuf,
    /// Whether the store was kept (`--data-dir`).
    pub kept: bool,
    pub messages: u64,
    /// Body bytes put.
    pub bytes: u64,
    /// CommitLog bytes written (records with headers and properties).
    pub log_bytes: u64,
    /// The producing window: first put to last acknowledgement.
    pub seconds: f64,
    /// From all stores open to all stores shut down (drain and final flush included).
    pub total_seconds: f64,
    pub consumed: u64,
    /// Messages consumed by the time the producers were done: with consumers that keep
    /// up, all but the last moment's.
    pub consumed_while_producing: u64,
    /// Puts refused or failed, and consumer problems.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Nanoseconds.
    pub put_latency: Histogram<u64>,
    /// Nanoseconds; empty without consumers.
    pub e2e_latency: Histogram<u64>,
    pub cpu_seconds: f64,
    /// CPU time until every producer was done (what remains after it is the drain,
    /// dispatch catching up and the final flush).
    pub producing_cpu_seconds: f64,
    /// The most any shard's dispatch lagged behind its puts (sampled every 100 ms).
    pub max_dispatch_lag_bytes: u64,
    pub peak_rss_bytes: u64,
    /// `/proc/loadavg` before the run: other load on the machine skews the numbers.
    pub load_before: String,
}

/// The percentiles reported, with their JSON names.
pub const PERCENTILES: [(f64, &str); 5] = [
    (50.0, "p50"),
    (90.0, "p90"),
    (99.0, "p99"),
    (99.9, "p99_9"),
    (99.99, "p99_99"),
];

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl Report {
    fn per_second(&self, v: f64) -> f64 {
        if self.seconds > 0.0 {
            v / self.seconds
        } else {
            0.0
        }
    }

    pub fn messages_per_sec(&self) -> f64 {
        self.per_second(self.messages as f64)
    }

    /// Body megabytes (10^6 bytes) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.per_second(self.bytes as f64 / 1e6)
    }

    /// CommitLog megabytes (10^6 bytes) per second.
    pub fn log_mb_per_sec(&self) -> f64 {
        self.per_second(self.log_bytes as f64 / 1e6)
    }

    pub fn cpu_us_per_message(&self) -> f64 {
        self.per_message_us(self.cpu_seconds)
    }

    /// CPU per message counting only the producing window.
    pub fn producing_cpu_us_per_message(&self) -> f64 {
        self.per_message_us(self.producing_cpu_seconds)
    }

    fn per_message_us(&self, cpu_seconds: f64) -> f64 {
        if self.messages == 0 {
            0.0
        } else {
            cpu_seconds * 1e6 / self.messages as f64
        }
    }

    /// Whether every put was stored and (with consumers) every message read back.
    pub fn ok(&self) -> bool {
        self.errors == 0
            && self.first_error.is_none()
            && (!self.config.consumers || self.consumed == self.messages)
    }

    /// Latency at a percentile, in microseconds.
    pub fn percentile_us(hist: &Histogram<u64>, p: f64) -> f64 {
        us(hist.value_at_quantile(p / 100.0))
    }

    fn latency_json(hist: &Histogram<u64>) -> Value {
        if hist.is_empty() {
            return Value::Null;
        }
        let mut m = serde_json::Map::new();
        for (p, name) in PERCENTILES {
            m.insert(name.into(), json!(Report::percentile_us(hist, p)));
        }
        m.insert("max".into(), json!(us(hist.max())));
        m.insert("mean".into(), json!(hist.mean() / 1e3));
        m.insert("count".into(), json!(hist.len()));
        Value::Object(m)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "label": self.config.label,
            "config": self.config.to_json(),
            "machine": {
                "cpus": allowed_cpus().len(),
                "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                "loadavg_before": self.load_before,
            },
            "ok": self.ok(),
            "messages": self.messages,
            "bytes": self.bytes,
            "log_bytes": self.log_bytes,
            "seconds": self.seconds,
            "total_seconds": self.total_seconds,
            "messages_per_sec": self.messages_per_sec(),
            "mb_per_sec": self.mb_per_sec(),
            "log_mb_per_sec": self.log_mb_per_sec(),
            "consumed": self.consumed,
            "consumed_while_producing": self.consumed_while_producing,
            "errors": self.errors,
            "first_error": self.first_error,
            "put_latency_us": Report::latency_json(&self.put_latency),
            "e2e_latency_us": Report::latency_json(&self.e2e_latency),
            "cpu_seconds": self.cpu_seconds,
            "cpu_us_per_message": self.cpu_us_per_message(),
            "producing_cpu_seconds": self.producing_cpu_seconds,
            "producing_cpu_us_per_message": self.producing_cpu_us_per_message(),
            "max_dispatch_lag_bytes": self.max_dispatch_lag_bytes,
            "cpu_utilisation": if self.total_seconds > 0.0 {
                self.cpu_seconds / (self.total_seconds * self.shards as f64)
            } else {
                0.0
            },
            "peak_rss_bytes": self.peak_rss_bytes,
            "data_dir": self.data_dir.display().to_string(),
            "kept": self.kept,
        })
    }

    /// The report as text, for people.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: {} shards, {} topics x {} queues, body {} B, batch {}, {} outstanding x {} \
             producers/shard, flush {}, {}{}",
            c.label,
            self.shards,
            c.topics,
            c.queues,
            c.body,
            c.batch,
            c.outstanding,
            c.producers,
            c.flush.name(),
            c.rate.map_or("unlimited rate".to_string(), |r| format!(
                "{r:.0} msg/s target"
            )),
            if c.consumers {
                ", tailing consumers"
            } else {
                ""
            },
        );
        let _ = writeln!(
            s,
            "  throughput  {:>12.0} msg/s  {:>9.1} MB/s body  {:>9.1} MB/s log  \
             ({} messages in {:.2} s)",
            self.messages_per_sec(),
            self.mb_per_sec(),
            self.log_mb_per_sec(),
            self.messages,
            self.seconds
        );
        let mut latency = |name: &str, h: &Histogram<u64>| {
            if h.is_empty() {
                return;
            }
            let _ = write!(s, "  {name:<11} us");
            for (p, _) in PERCENTILES {
                let _ = write!(s, "  p{p}={:.1}", Report::percentile_us(h, p));
            }
            let _ = writeln!(s, "  max={:.1}", us(h.max()));
        };
        latency("put", &self.put_latency);
        latency("end-to-end", &self.e2e_latency);
        let _ = writeln!(
            s,
            "  cpu         {:.3} us/message ({:.3} while producing; {:.2} s cpu over {:.2} s \
             with {} shards)  peak RSS {:.1} MiB",
            self.cpu_us_per_message(),
            self.producing_cpu_us_per_message(),
            self.cpu_seconds,
            self.total_seconds,
            self.shards,
            self.peak_rss_bytes as f64 / (1 << 20) as f64
        );
        let _ = writeln!(
            s,
            "  dispatch    lagged up to {:.1} MB behind puts (records not yet visible to gets)",
            self.max_dispatch_lag_bytes as f64 / 1e6
        );
        if c.consumers {
            let _ = writeln!(
                s,
                "  consumed    {} of {} ({} while producing)",
                self.consumed, self.messages, self.consumed_while_producing
            );
        }
        if self.errors > 0 || self.first_error.is_some() {
            let _ = writeln!(
                s,
                "  ERRORS      {} failed puts; first problem: {}",
                self.errors,
                self.first_error.as_deref().unwrap_or("-")
            );
        }
        let _ = writeln!(
            s,
            "  data        {} ({})",
            self.data_dir.display(),
            if self.kept { "kept" } else { "removed" }
        );
        s
    }

    /// The latency percentile curves as an SVG picture: x is the percentile on a log
    /// scale (0 to 99.999), y the latency on a log scale.
    pub fn svg(&self) -> String {
        let curves: Vec<(&str, &str, &Histogram<u64>)> = [
            ("put", "#1f77b4", &self.put_latency),
            ("end-to-end", "#d62728", &self.e2e_latency),
        ]
        .into_iter()
        .filter(|(_, _, h)| !h.is_empty())
        .collect();
        let subtitle = format!(
            "{:.0} msg/s, {:.1} MB/s; {} B bodies, flush {}, {} shards, {}",
            self.messages_per_sec(),
            self.mb_per_sec(),
            self.config.body,
            self.config.flush.name(),
            self.shards,
            self.config
                .rate
                .map_or("unlimited rate".to_string(), |r| format!(
                    "{r:.0} msg/s offered"
                ))
        );
        latency_svg(&self.config.label, &subtitle, &curves)
    }
}

/// Decades of "nines" on the x axis: x = -log10(1 - p/100), 0 (p0) to 5 (p99.999).
const SVG_NINES: f64 = 5.0;

fn escape_xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Draws percentile curves of latency histograms (nanoseconds) by hand.
fn latency_svg(title: &str, subtitle: &str, curves: &[(&str, &str, &Histogram<u64>)]) -> String {
    let (w, h) = (900.0, 540.0);
    let (left, right, top, bottom) = (80.0, 170.0, 64.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    // y range: whole decades of microseconds around every curve.
    let lo_ns = curves
        .iter()
        .map(|(_, _, h)| h.value_at_quantile(0.0).max(1))
        .min()
        .unwrap_or(1_000);
    let hi_ns = curves
        .iter()
        .map(|(_, _, h)| h.max().max(1))
        .max()
        .unwrap_or(1_000_000);
    let y_lo = (us(lo_ns).max(0.1)).log10().floor();
    let y_hi = (us(hi_ns).max(1.0)).log10().ceil().max(y_lo + 1.0);
    let x_of = |nines: f64| left + nines / SVG_NINES * pw;
    let y_of = |v_us: f64| top + ph - (v_us.max(1e-3).log10() - y_lo) / (y_hi - y_lo) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{x}" y="24" text-anchor="middle" font-size="15">{}</text><text x="{x}" y="44" text-anchor="middle">{}</text>"#,
        escape_xml(title),
        escape_xml(subtitle),
        x = left + pw / 2.0,
    );
    // x grid: 0, 90, 99, 99.9, ...
    for (i, label) in ["0", "90", "99", "99.9", "99.99", "99.999"]
        .iter()
        .enumerate()
    {
        let x = x_of(i as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            top + ph,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text>"#,
        left + pw / 2.0,
        h - 15.0
    );
    // y grid: decades of microseconds.
    let mut d = y_lo;
    while d <= y_hi + 1e-9 {
        let v = 10f64.powf(d);
        let y = y_of(v);
        let label = if v >= 1e6 {
            format!("{} s", v / 1e6)
        } else if v >= 1e3 {
            format!("{} ms", v / 1e3)
        } else {
            format!("{v} µs")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">latency</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    let _ = writeln!(
        s,
        r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    for (i, (name, color, hist)) in curves.iter().enumerate() {
        let steps = 500;
        let mut points = String::new();
        for k in 0..=steps {
            let nines = SVG_NINES * k as f64 / steps as f64;
            let q = 1.0 - 10f64.powf(-nines);
            let v = us(hist.value_at_quantile(q));
            let _ = write!(points, "{:.1},{:.1} ", x_of(nines), y_of(v));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.trim_end()
        );
        let ly = top + 20.0 + 36.0 * i as f64;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{:.1}">{name}</text><text x="{}" y="{:.1}" font-size="10">p99 {:.0} µs, max {:.0} µs</text>"#,
            lx + 25.0,
            lx + 32.0,
            ly + 4.0,
            lx,
            ly + 18.0,
            Report::percentile_us(hist, 99.0),
            us(hist.max())
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Removes a temporary data directory when the run ends, however it ends.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            eprintln!("coremq bench: cannot remove {}: {e}", dir.display());
        }
    }
}

/// Runs the load described by `cfg` and returns what it measured. Prints a progress
/// line on stderr once a second unless `cfg.quiet`.
pub fn run(cfg: &LoadConfig) -> Result<Report, String> {
    cfg.validate()?;
    let shards = cfg.effective_shards();
    if let Some(s) = cfg.shards
        && s as usize > shards
    {
        eprintln!(
            "coremq bench: {s} shards but {} queues: running {shards} shards",
            cfg.queues
        );
    }
    let _ = now_ns(); // start the shared clock before any shard reads it
    let load_before = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let (data_dir, kept) = match &cfg.data_dir {
        Some(d) => (d.clone(), true),
        None => {
            let d = std::env::current_dir()
                .map_err(|e| format!("current directory: {e}"))?
                .join(format!(
                    "coremq-bench-{}-{}",
                    std::process::id(),
                    crate::now_ms()
                ));
            (d, false)
        }
    };
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let _cleanup = TempDir((!kept).then(|| data_dir.clone()));

    let mut rng = Rng::new(0xC0FF_EE00);
    let pattern_len = cfg.body.max.max(4096) + 64 * 1024;
    let plan = Arc::new(Plan {
        cfg: cfg.clone(),
        shards,
        topics: (0..cfg.topics).map(|t| format!("BenchTopic{t}")).collect(),
        pattern: (0..pattern_len).map(|_| rng.next() as u8).collect(),
        counters: (0..shards).map(|_| ShardCounters::default()).collect(),
    });
    let store_cfg = cfg.store_template(&data_dir);

    let job_plan = plan.clone();
    let set = spawn_shards(
        &data_dir,
        shards,
        &store_cfg,
        cfg.spin(),
        move |i, store| shard_job(i, store, job_plan),
    )?;
    let (cpu_start, _) = process_usage();
    let started = Instant::now();
    let progress = Progress::new(&plan, started, !cfg.quiet);
    let stop = AtomicBool::new(false);
    let all_produced = || {
        plan.counters
            .iter()
            .all(|c| c.produced.load(Ordering::Relaxed))
    };
    let mut cpu_produced = None;
    std::thread::scope(|s| {
        s.spawn(|| progress.run(&stop));
        while !set.all_finished() {
            if cpu_produced.is_none() && all_produced() {
                cpu_produced = Some(process_usage().0);
                if cfg.kill_after_flush {
                    kill_when_flushed(&plan, started);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let results = set.join()?;
    let total_seconds = started.elapsed().as_secs_f64();
    let (cpu_end, peak_rss_bytes) = process_usage();

    let mut report = Report {
        config: cfg.clone(),
        shards,
        data_dir: data_dir.clone(),
        kept,
        messages: 0,
        bytes: 0,
        log_bytes: 0,
        seconds: 0.0,
        total_seconds,
        consumed: 0,
        consumed_while_producing: 0,
        errors: 0,
        first_error: None,
        put_latency: new_histogram(),
        e2e_latency: new_histogram(),
        cpu_seconds: cpu_end - cpu_start,
        producing_cpu_seconds: cpu_produced.unwrap_or(cpu_end) - cpu_start,
        max_dispatch_lag_bytes: plan
            .counters
            .iter()
            .map(|c| c.max_dispatch_lag.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0),
        peak_rss_bytes,
        load_before,
    };
    let start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = results.iter().map(|r| r.produced_ns).max().unwrap_or(0);
    report.seconds = end.saturating_sub(start) as f64 / 1e9;
    for r in results {
        report.messages += r.messages;
        report.bytes += r.bytes;
        report.log_bytes += r.log_bytes;
        report.consumed += r.consumed;
        report.consumed_while_producing += r.consumed_while_producing;
        report.errors += r.errors;
        if report.first_error.is_none() {
            report.first_error = r.first_error;
        }
        report
            .put_latency
            .add(&r.put_latency)
            .map_err(|e| format!("merging histograms: {e}"))?;
        report
            .e2e_latency
            .add(&r.e2e_latency)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    if cfg.consumers && report.consumed != report.messages && report.first_error.is_none() {
        report.first_error = Some(format!(
            "consumers read {} of {} messages",
            report.consumed, report.messages
        ));
    }
    Ok(report)
}

/// `--kill-after-flush`: waits (up to a minute) until every shard's log is flushed as
/// far as it is written, writes the JSON report of what was put, and SIGKILLs the
/// process, as `kill -9` would: no shutdown, the abort files stay, dispatch (queues and
/// key index) stops wherever it was.
fn kill_when_flushed(plan: &Plan, started: Instant) -> ! {
    let flushed = || {
        plan.counters.iter().all(|c| {
            let written = c.log[0].load(Ordering::Relaxed);
            written > 0 && c.log[2].load(Ordering::Relaxed) >= written
        })
    };
    let give_up = Instant::now() + Duration::from_secs(60);
    // Twice in a row, a monitor round apart: the positions are sampled every 100 ms.
    let mut seen = 0;
    while seen < 2 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(150));
        seen = if flushed() { seen + 1 } else { 0 };
    }
    let shards: Vec<Value> = plan
        .counters
        .iter()
        .map(|c| {
            let [w, cm, f, d] = c.log.each_ref().map(|a| a.load(Ordering::Relaxed));
            json!({"written": w, "committed": cm, "flushed": f, "dispatched": d})
        })
        .collect();
    let sum = |f: fn(&ShardCounters) -> &AtomicU64| -> u64 {
        plan.counters
            .iter()
            .map(|c| f(c).load(Ordering::Relaxed))
            .sum()
    };
    let report = json!({
        "label": plan.cfg.label,
        "config": plan.cfg.to_json(),
        "ok": seen >= 2,
        "killed": true,
        "first_error": if seen >= 2 { None } else { Some("the log was not flushed within 60 s") },
        "messages": sum(|c| &c.messages),
        "bytes": sum(|c| &c.bytes),
        "errors": sum(|c| &c.errors),
        "seconds_until_kill": started.elapsed().as_secs_f64(),
        "peak_rss_bytes": process_usage().1,
        "shards": shards,
    });
    eprintln!("coremq bench: log flushed; killing the process (SIGKILL): {report}");
    if let Some(path) = &plan.cfg.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON of numbers");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("coremq bench: cannot write {}: {e}", path.display());
        }
    }
    // SAFETY: kill on our own pid; SIGKILL cannot be caught, the process ends here.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// Runs, prints the summary on stdout and writes the JSON and SVG files asked for.
pub fn run_and_report(cfg: &LoadConfig) -> Result<Report, String> {
    let report = run(cfg)?;
    print!("{}", report.summary());
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report.to_json()).expect("JSON of numbers");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &cfg.svg {
        std::fs::write(path, report.svg())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(report)
}

/// The once-a-second progress line.
struct Progress<'a> {
    plan: &'a Plan,
    started: Instant,
    enabled: bool,
}

impl<'a> Progress<'a> {
    fn new(plan: &'a Plan, started: Instant, enabled: bool) -> Progress<'a> {
        Progress {
            plan,
            started,
            enabled,
        }
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for c in &self.plan.counters {
            t.0 += c.messages.load(Ordering::Relaxed);
            t.1 += c.bytes.load(Ordering::Relaxed);
            t.2 += c.consumed.load(Ordering::Relaxed);
            t.3 += c.errors.load(Ordering::Relaxed);
        }
        t
    }

    fn run(&self, stop: &AtomicBool) {
        if !self.enabled {
            return;
        }
        let mut last = (0, 0, 0, 0);
        let mut beats = vec![0; self.plan.counters.len()];
        let mut last_at = self.started;
        let mut next = self.started + Duration::from_secs(1);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            let t = self.totals();
            let dt = now.duration_since(last_at).as_secs_f64();
            let dispatch_lag: u64 = self
                .plan
                .counters
                .iter()
                .map(|c| {
                    let written = c.log[0].load(Ordering::Relaxed);
                    written.saturating_sub(c.log[3].load(Ordering::Relaxed))
                })
                .sum();
            let mut line = format!(
                "[{:>6.1}s] put {:>10.0} msg/s {:>8.1} MB/s  total {:>11}  dispatch lag {:>7.1} MB",
                now.duration_since(self.started).as_secs_f64(),
                (t.0 - last.0) as f64 / dt,
                (t.1 - last.1) as f64 / dt / 1e6,
                t.0,
                dispatch_lag as f64 / 1e6
            );
            if self.plan.cfg.consumers {
                let _ = write!(
                    line,
                    "  consumed {:>10.0} msg/s  lag {:>9}",
                    (t.2 - last.2) as f64 / dt,
                    t.0.saturating_sub(t.2)
                );
            }
            if t.3 > 0 {
                let _ = write!(line, "  errors {}", t.3);
            }
            let produced = self
                .plan
                .counters
                .iter()
                .all(|c| c.produced.load(Ordering::Relaxed));
            if produced {
                line.push_str(if self.plan.cfg.consumers {
                    "  (producers done: draining, then shutting down)"
                } else {
                    "  (producers done: shutting down)"
                });
            }
            eprintln!("{line}");
            if t.0 == last.0 && t.2 == last.2 {
                // Nothing moved for a second: show where each store stands.
                for (i, c) in self.plan.counters.iter().enumerate() {
                    if c.produced.load(Ordering::Relaxed) {
                        continue;
                    }
                    let [w, cm, f, d] = c.log.each_ref().map(|a| a.load(Ordering::Relaxed));
                    let beat = c.heartbeat.load(Ordering::Relaxed);
                    let idle = if beat == beats[i] {
                        "; its executor ran no task for a second (a 100 ms timer did not fire)"
                    } else {
                        ""
                    };
                    eprintln!(
                        "           shard {i}: no progress; log written {w} committed {cm} \
                         flushed {f} dispatched {d}{idle}"
                    );
                }
            }
            for (b, c) in beats.iter_mut().zip(&self.plan.counters) {
                *b = c.heartbeat.load(Ordering::Relaxed);
            }
            last = t;
            last_at = now;
            next += Duration::from_secs(1);
        }
    }
}

// ---------------------------------------------------------------------------------
// modes on a kept store: catch-up reads, key queries, recovery (scenarios 5-7)

/// Runs what `cfg.mode` says, prints the summary on stdout and writes the JSON (and
/// SVG) files asked for. Whether the run found no problem.
pub fn run_mode(cfg: &LoadConfig) -> Result<bool, String> {
    if cfg.mode == Mode::Produce {
        return run_and_report(cfg).map(|r| r.ok());
    }
    let dir = cfg
        .data_dir
        .clone()
        .ok_or_else(|| format!("--mode {} needs --data-dir", cfg.mode.name()))?;
    let shards = kept_shards(&dir)?;
    if let Some(s) = cfg.shards
        && s as usize != shards
    {
        return Err(format!("{} holds {shards} shards, not {s}", dir.display()));
    }
    let _ = now_ns();
    let load_before = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let template = cfg.store_template(&dir);
    let (mut report, text, svg) = match cfg.mode {
        Mode::Produce => unreachable!("handled above"),
        Mode::CatchUp => catch_up(cfg, &dir, shards, &template)?,
        Mode::KeyQueries => key_queries(cfg, &dir, shards, &template)?,
        Mode::Recover => recover(cfg, &dir, shards, &template)?,
    };
    let ok = report["ok"].as_bool().unwrap_or(false);
    if let Value::Object(m) = &mut report {
        m.insert("label".into(), json!(cfg.label));
        m.insert("mode".into(), json!(cfg.mode.name()));
        m.insert("shards".into(), json!(shards));
        m.insert(
            "machine".into(),
            json!({
                "cpus": allowed_cpus().len(),
                "loadavg_before": load_before,
            }),
        );
        m.insert("peak_rss_bytes".into(), json!(process_usage().1));
        m.insert("data_dir".into(), json!(dir.display().to_string()));
    }
    print!(
        "{}: {} mode, {shards} shards\n{text}",
        cfg.label,
        cfg.mode.name()
    );
    println!(
        "  memory      peak RSS {:.1} MiB",
        process_usage().1 as f64 / (1 << 20) as f64
    );
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON of numbers");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let (Some(path), Some(svg)) = (&cfg.svg, svg) {
        std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(ok)
}

/// The number of `shard-<i>` stores under `dir` (they must be `shard-0..n`).
fn kept_shards(dir: &Path) -> Result<usize, String> {
    let mut n = 0;
    while dir.join(format!("shard-{n}")).is_dir() {
        n += 1;
    }
    if n == 0 {
        return Err(format!(
            "{} holds no shard-0 store (write one with `coremq bench --data-dir`)",
            dir.display()
        ));
    }
    Ok(n)
}

/// A once-a-second line on stderr with what `done` (messages, bytes) counts, until
/// `stop`.
fn simple_progress(what: &str, done: &[AtomicU64; 2], stop: &AtomicBool) {
    let started = Instant::now();
    let mut last = (0, 0);
    let mut next = started + Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        let t = (
            done[0].load(Ordering::Relaxed),
            done[1].load(Ordering::Relaxed),
        );
        eprintln!(
            "[{:>6.1}s] {what} {:>10.0} /s {:>8.1} MB/s  total {:>11}",
            now.duration_since(started).as_secs_f64(),
            (t.0 - last.0) as f64,
            (t.1 - last.1) as f64 / 1e6,
            t.0
        );
        last = t;
        next += Duration::from_secs(1);
    }
}

/// Waits for the shards of `set` while a progress line runs; their results.
fn join_with_progress<T: Send + 'static>(
    set: ShardSet<T>,
    what: &str,
    done: &[AtomicU64; 2],
    quiet: bool,
) -> Result<Vec<T>, String> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        if !quiet {
            s.spawn(|| simple_progress(what, done, &stop));
        }
        while !set.all_finished() {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    set.join()
}

/// What one shard read in catch-up mode.
struct ReadResult {
    start_ns: u64,
    end_ns: u64,
    /// Entries in the shard's queues when it started: what it should read.
    expected: u64,
    queues: u64,
    messages: u64,
    body_bytes: u64,
    log_bytes: u64,
    log_size: u64,
    gets: u64,
    first_error: Option<String>,
    get_latency: Histogram<u64>,
    /// The shard's read-cache counters at the end (zeros when it is off).
    cache: crate::commit_log::read_cache::ReadCacheStats,
}

/// One shard's readers' shared tallies.
#[derive(Default)]
struct ReadTally {
    messages: Cell<u64>,
    body_bytes: Cell<u64>,
    log_bytes: Cell<u64>,
    gets: Cell<u64>,
    first_error: RefCell<Option<String>>,
}

/// Scenario 5: every queue of every shard read from its first offset by one reader
/// per queue, all at once, `--pull-batch` messages per get.
fn catch_up(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
    template: &StoreConfig,
) -> Result<(Value, String, Option<String>), String> {
    let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let batch = cfg.pull_batch as usize;
    let done2 = done.clone();
    let set = spawn_shards(dir, shards, template, cfg.spin(), move |_, store| {
        catch_up_job(store, batch, done2)
    })?;
    let (cpu_start, _) = process_usage();
    let results = join_with_progress(set, "read msg", &done, cfg.quiet)?;
    let (cpu_end, _) = process_usage();
    let start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let secs = end.saturating_sub(start) as f64 / 1e9;
    let sum = |f: fn(&ReadResult) -> u64| results.iter().map(f).sum::<u64>();
    let (messages, expected) = (sum(|r| r.messages), sum(|r| r.expected));
    let (body, log, size) = (
        sum(|r| r.body_bytes),
        sum(|r| r.log_bytes),
        sum(|r| r.log_size),
    );
    let mut hist = new_histogram();
    for r in &results {
        hist.add(&r.get_latency)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    let mut first_error = results.iter().find_map(|r| r.first_error.clone());
    if first_error.is_none() && messages != expected {
        first_error = Some(format!("read {messages} of {expected} messages"));
    }
    let rate = |v: f64| if secs > 0.0 { v / secs } else { 0.0 };
    let report = json!({
        "ok": first_error.is_none(),
        "first_error": first_error,
        "pull_batch": batch,
        "queues": sum(|r| r.queues),
        "messages": messages,
        "expected": expected,
        "bytes": body,
        "log_bytes_read": log,
        "log_size_bytes": size,
        "gets": sum(|r| r.gets),
        "read_cache": {
            "block_reads": sum(|r| r.cache.reads),
            "read_ahead": sum(|r| r.cache.read_ahead),
            "bytes_read": sum(|r| r.cache.bytes_read),
            "hits": sum(|r| r.cache.hits),
            "shared": sum(|r| r.cache.shared),
            "misses": sum(|r| r.cache.misses),
            "evictions": sum(|r| r.cache.evictions),
            "failed": sum(|r| r.cache.failed),
        },
        "seconds": secs,
        "messages_per_sec": rate(messages as f64),
        "mb_per_sec": rate(body as f64 / 1e6),
        "log_mb_per_sec": rate(log as f64 / 1e6),
        "get_latency_us": Report::latency_json(&hist),
        "cpu_seconds": cpu_end - cpu_start,
        "cpu_us_per_message": if messages > 0 {
            (cpu_end - cpu_start) * 1e6 / messages as f64
        } else {
            0.0
        },
    });
    let mut text = format!(
        "  read        {:>12.0} msg/s  {:>9.1} MB/s body  {:>9.1} MB/s log  ({messages} of \
         {expected} messages, {:.1} MB of records, in {secs:.2} s; log {:.1} MB)\n",
        rate(messages as f64),
        rate(body as f64 / 1e6),
        rate(log as f64 / 1e6),
        log as f64 / 1e6,
        size as f64 / 1e6,
    );
    let _ = write!(text, "  get         us");
    for (p, _) in PERCENTILES {
        let _ = write!(text, "  p{p}={:.1}", Report::percentile_us(&hist, p));
    }
    let _ = writeln!(
        text,
        "  max={:.1}  ({} gets of up to {batch})",
        us(hist.max()),
        hist.len()
    );
    let _ = writeln!(text, "  cpu         {:.2} s", cpu_end - cpu_start);
    let _ = writeln!(
        text,
        "  read cache  {:.1} MB read in {} block reads ({} ahead); lookups: {} hits, {} \
         shared reads, {} misses; {} evictions",
        sum(|r| r.cache.bytes_read) as f64 / 1e6,
        sum(|r| r.cache.reads),
        sum(|r| r.cache.read_ahead),
        sum(|r| r.cache.hits),
        sum(|r| r.cache.shared),
        sum(|r| r.cache.misses),
        sum(|r| r.cache.evictions),
    );
    if let Some(e) = report["first_error"].as_str() {
        let _ = writeln!(text, "  ERRORS      {e}");
    }
    let svg = latency_svg(
        &cfg.label,
        &format!("catch-up gets of up to {batch} messages"),
        &[("get", "#1f77b4", &hist)],
    );
    Ok((report, text, Some(svg)))
}

async fn catch_up_job(store: Store, batch: usize, done: Arc<[AtomicU64; 2]>) -> ReadResult {
    let tally = Rc::new(ReadTally::default());
    let hist = Rc::new(RefCell::new(new_histogram()));
    let queues = store.queues();
    let queue_count = queues.len() as u64;
    let expected = queues
        .iter()
        .map(|(t, q)| store.max_queue_offset(t, *q) - store.min_queue_offset(t, *q))
        .sum();
    let start_ns = now_ns();
    let mut readers = Vec::new();
    for (topic, q) in queues {
        let (store, tally, hist, done) = (store.clone(), tally.clone(), hist.clone(), done.clone());
        readers.push(glommio::spawn_local(async move {
            read_queue_from_start(&store, &topic, q, batch, &tally, &hist, &done).await;
        }));
    }
    for r in readers {
        r.await;
    }
    let end_ns = now_ns();
    ReadResult {
        start_ns,
        end_ns,
        expected,
        queues: queue_count,
        messages: tally.messages.get(),
        body_bytes: tally.body_bytes.get(),
        log_bytes: tally.log_bytes.get(),
        log_size: store.max_log_offset() - store.min_log_offset(),
        gets: tally.gets.get(),
        first_error: tally.first_error.borrow_mut().take(),
        get_latency: hist.replace(new_histogram()),
        cache: store.read_cache_stats().unwrap_or_default(),
    }
}

async fn read_queue_from_start(
    store: &Store,
    topic: &str,
    q: i32,
    batch: usize,
    tally: &ReadTally,
    hist: &RefCell<Histogram<u64>>,
    done: &[AtomicU64; 2],
) {
    let verify = Verify {
        crc: false,
        at_offset: None,
        max_total_size: usize::MAX,
        require_record_crc: false,
    };
    let fail = |why: String| {
        tally.first_error.borrow_mut().get_or_insert(why);
    };
    let mut offset = store.min_queue_offset(topic, q);
    loop {
        let asked = now_ns();
        let got = match store.get(topic, q, offset, batch, 64 << 20).await {
            Ok(got) => got,
            Err(e) => return fail(format!("get {topic}/{q} at {offset}: {e}")),
        };
        hist.borrow_mut()
            .saturating_record(now_ns().saturating_sub(asked));
        tally.gets.set(tally.gets.get() + 1);
        match got.status {
            GetStatus::Found => {}
            GetStatus::OffsetOverflowOne | GetStatus::NoMessageInQueue => return,
            GetStatus::OffsetFoundNull => {
                offset = got.next_begin_offset;
                continue;
            }
            other => {
                return fail(format!(
                    "get {topic}/{q} at {offset}: {other:?} (queue {}..{})",
                    got.min_offset, got.max_offset
                ));
            }
        }
        let (mut body, mut log) = (0, 0);
        for raw in &got.records {
            log += raw.len() as u64;
            match record::decode(raw, verify) {
                Ok(Decoded::Record(r)) => body += r.body.len() as u64,
                _ => fail(format!("{topic}/{q}: a record does not decode")),
            }
        }
        let n = got.records.len() as u64;
        tally.messages.set(tally.messages.get() + n);
        tally.body_bytes.set(tally.body_bytes.get() + body);
        tally.log_bytes.set(tally.log_bytes.get() + log);
        done[0].fetch_add(n, Ordering::Relaxed);
        done[1].fetch_add(body, Ordering::Relaxed);
        offset = got.next_begin_offset;
        glommio::yield_if_needed().await;
    }
}

/// What one shard's key queries measured.
struct QueryResult {
    hits: Histogram<u64>,
    misses: Histogram<u64>,
    /// Existing keys the query did not find.
    not_found: u64,
    /// Keys never written that the query found.
    false_hits: u64,
    first_error: Option<String>,
    start_ns: u64,
    end_ns: u64,
}

/// Scenario 6: `--queries` random key queries, one at a time on every shard, each for
/// a key the shard's producers put (one in 100 for a key never put).
fn key_queries(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
    template: &StoreConfig,
) -> Result<(Value, String, Option<String>), String> {
    let written = cfg
        .messages
        .ok_or("--mode key-queries needs --messages: the count the store was written with")?;
    if cfg.keys == 0 {
        return Err("--mode key-queries needs --keys 1 or more".into());
    }
    if cfg.effective_shards() != shards {
        return Err(format!(
            "{} holds {shards} shards but --queues {} gives {}",
            dir.display(),
            cfg.queues,
            cfg.effective_shards()
        ));
    }
    let plan = Arc::new(Plan {
        cfg: cfg.clone(),
        shards,
        topics: (0..cfg.topics).map(|t| format!("BenchTopic{t}")).collect(),
        pattern: Vec::new(),
        counters: (0..shards).map(|_| ShardCounters::default()).collect(),
    });
    let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let (plan2, done2) = (plan.clone(), done.clone());
    let set = spawn_shards(dir, shards, template, cfg.spin(), move |i, store| {
        key_query_job(i, store, plan2, done2)
    })?;
    let results = join_with_progress(set, "queries", &done, cfg.quiet)?;
    let (mut hits, mut misses) = (new_histogram(), new_histogram());
    for r in &results {
        hits.add(&r.hits)
            .map_err(|e| format!("merging histograms: {e}"))?;
        misses
            .add(&r.misses)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    let not_found: u64 = results.iter().map(|r| r.not_found).sum();
    let false_hits: u64 = results.iter().map(|r| r.false_hits).sum();
    let mut first_error = results.iter().find_map(|r| r.first_error.clone());
    if first_error.is_none() && not_found + false_hits > 0 {
        first_error = Some(format!(
            "{not_found} written keys not found, {false_hits} unwritten keys found"
        ));
    }
    let start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let secs = end.saturating_sub(start) as f64 / 1e9;
    let queries = hits.len() + misses.len();
    let report = json!({
        "ok": first_error.is_none(),
        "first_error": first_error,
        "keys": written * cfg.keys as u64,
        "queries": queries,
        "hit_queries": hits.len(),
        "miss_queries": misses.len(),
        "not_found": not_found,
        "false_hits": false_hits,
        "seconds": secs,
        "queries_per_sec": if secs > 0.0 { queries as f64 / secs } else { 0.0 },
        "query_latency_us": Report::latency_json(&hits),
        "miss_latency_us": Report::latency_json(&misses),
    });
    let mut text = format!(
        "  keys        {} written ({written} messages x {} keys); {queries} queries, one at \
         a time per shard, in {secs:.2} s\n",
        written * cfg.keys as u64,
        cfg.keys
    );
    for (name, h) in [("hit", &hits), ("miss", &misses)] {
        if h.is_empty() {
            continue;
        }
        let _ = write!(text, "  {name:<11} us");
        for (p, _) in PERCENTILES {
            let _ = write!(text, "  p{p}={:.1}", Report::percentile_us(h, p));
        }
        let _ = writeln!(text, "  max={:.1}", us(h.max()));
    }
    if let Some(e) = report["first_error"].as_str() {
        let _ = writeln!(text, "  ERRORS      {e}");
    }
    let svg = latency_svg(
        &cfg.label,
        &format!("key queries over {} keys", written * cfg.keys as u64),
        &[("hit", "#1f77b4", &hits), ("miss", "#d62728", &misses)],
    );
    Ok((report, text, Some(svg)))
}

async fn key_query_job(
    index: usize,
    store: Store,
    plan: Arc<Plan>,
    done: Arc<[AtomicU64; 2]>,
) -> QueryResult {
    let cfg = &plan.cfg;
    let queues = plan.queues_of(index);
    let producers = cfg.producers as u64;
    let batch = cfg.batch as u64;
    let first = index as u64 * producers;
    let share = cfg.queries / plan.shards as u64
        + u64::from((index as u64) < cfg.queries % plan.shards as u64);
    let mut rng = Rng::new(0x6B65_7973 + index as u64);
    let mut out = QueryResult {
        hits: new_histogram(),
        misses: new_histogram(),
        not_found: 0,
        false_hits: 0,
        first_error: None,
        start_ns: now_ns(),
        end_ns: 0,
    };
    let mut key = String::with_capacity(48);
    for i in 0..share {
        let p = rng.next() % producers;
        let g = first + p;
        let quota = plan.quota(g).unwrap_or(0);
        let miss = i % 100 == 99 || quota == 0;
        let seq = if miss {
            quota + rng.next() % 1_000_000
        } else {
            rng.next() % quota
        };
        let j = rng.next() % cfg.keys as u64;
        key.clear();
        let _ = write!(key, "k{g}-{seq}-{j}");
        let (topic, q) = &queues[(p as usize + (seq / batch) as usize) % queues.len()];
        let asked = now_ns();
        let found = store.query_by_key(topic, &key, 32, 0, i64::MAX).await;
        let took = now_ns().saturating_sub(asked);
        match found {
            Ok(msgs) => {
                let right = msgs.iter().any(|m| m.queue_id == *q && &m.topic == topic);
                if miss {
                    out.misses.saturating_record(took);
                    if !msgs.is_empty() {
                        out.false_hits += 1;
                    }
                } else {
                    out.hits.saturating_record(took);
                    if !right {
                        out.not_found += 1;
                        out.first_error.get_or_insert(format!(
                            "key {key} of {topic}/{q}: {} results, none in that queue",
                            msgs.len()
                        ));
                    }
                }
            }
            Err(e) => {
                out.first_error
                    .get_or_insert(format!("query {topic} {key}: {e}"));
                break;
            }
        }
        done[0].fetch_add(1, Ordering::Relaxed);
        glommio::yield_if_needed().await;
    }
    out.end_ns = now_ns();
    out
}

/// Scenario 7: the time to open every shard's store (recovery included; shards open in
/// parallel, each on its own CPU), then a clean shutdown, timed apart.
fn recover(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
    template: &StoreConfig,
) -> Result<(Value, String, Option<String>), String> {
    let abnormal: Vec<bool> = (0..shards)
        .map(|i| dir.join(format!("shard-{i}")).join("abort").exists())
        .collect();
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let started = Instant::now();
    let set = spawn_shards(dir, shards, template, cfg.spin(), |_, store| async move {
        let r = (*store.report).clone();
        (r, store.min_log_offset(), store.max_log_offset())
    })?;
    let open_secs = started.elapsed().as_secs_f64();
    let results = join_with_progress(set, "", &done, true)?;
    let total_secs = started.elapsed().as_secs_f64();
    let log_bytes: u64 = results.iter().map(|(_, min, max)| max - min).sum();
    let per_shard: Vec<Value> = results
        .iter()
        .zip(&abnormal)
        .map(|((r, min, max), abort)| {
            json!({
                "abort_file_found": abort,
                "clean_shutdown": r.clean_shutdown,
                "checkpoint_valid": r.checkpoint_valid,
                "records_scanned": r.records_scanned,
                "log_bytes": max - min,
                "log_end": r.log_end,
                "truncated": r.truncated,
                "dispatched_from": r.dispatched_from,
                "entries_rebuilt": r.entries_rebuilt,
                "queues": r.queues,
                "open_phases_seconds": r.phases.iter().map(|(n, s)| json!([n, s])).collect::<Vec<_>>(),
            })
        })
        .collect();
    let all_abnormal = abnormal.iter().all(|a| *a);
    let report = json!({
        "ok": true,
        "first_error": None::<String>,
        "abnormal": all_abnormal,
        "open_seconds": open_secs,
        "shutdown_seconds": total_secs - open_secs,
        "log_bytes": log_bytes,
        "records_scanned": results.iter().map(|(r, _, _)| r.records_scanned).sum::<u64>(),
        "entries_rebuilt": results.iter().map(|(r, _, _)| r.entries_rebuilt).sum::<u64>(),
        "per_shard": per_shard,
    });
    let mut text = format!(
        "  recovery    open {open_secs:.3} s ({} after a {}) of {:.1} MB of log; shutdown {:.3} s\n",
        if all_abnormal { "abnormal" } else { "normal" },
        if all_abnormal {
            "crash: abort files found"
        } else {
            "clean shutdown"
        },
        log_bytes as f64 / 1e6,
        total_secs - open_secs
    );
    for (i, (r, _, _)) in results.iter().enumerate() {
        let _ = writeln!(
            text,
            "  shard {i}     scanned {} records, rebuilt {} queue entries from {}, log end {}{}\n              open steps: {}",
            r.records_scanned,
            r.entries_rebuilt,
            r.dispatched_from,
            r.log_end,
            r.truncated
                .map_or(String::new(), |(at, n)| format!(", cut {n} bytes at {at}")),
            r.phases
                .iter()
                .map(|(n, s)| format!("{n} {s:.3} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok((report, text, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_match_display() {
        for n in [0u64, 7, 10, 99, 12345, u32::MAX as u64, u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    #[test]
    fn body_sizes_parse() {
        assert_eq!("1024".parse::<BodySize>(), Ok(BodySize::fixed(1024)));
        assert_eq!(
            "512..4096".parse::<BodySize>(),
            Ok(BodySize {
                min: 512,
                max: 4096
            })
        );
        assert_eq!(
            "16..=32".parse::<BodySize>(),
            Ok(BodySize { min: 16, max: 32 })
        );
        assert!("4".parse::<BodySize>().is_err());
        assert!("9..8".parse::<BodySize>().is_err());
        assert!("x".parse::<BodySize>().is_err());
        assert_eq!(BodySize { min: 8, max: 9 }.to_string(), "8..9");
    }

    #[test]
    fn producers_split_the_messages_exactly() {
        let cfg = LoadConfig {
            shards: Some(3),
            producers: 2,
            messages: Some(1001),
            ..LoadConfig::default()
        };
        let plan = Plan {
            shards: cfg.effective_shards(),
            cfg,
            topics: vec!["T".into()],
            pattern: Vec::new(),
            counters: Vec::new(),
        };
        let sum: u64 = (0..6).map(|g| plan.quota(g).unwrap()).sum();
        assert_eq!(sum, 1001);
        // Queue q belongs to shard q % shards.
        assert!(plan.queues_of(1).iter().all(|(_, q)| q % 3 == 1));
        let all: usize = (0..3).map(|s| plan.queues_of(s).len()).sum();
        assert_eq!(all, 64);
    }

    #[test]
    fn shards_never_exceed_queues() {
        let cfg = LoadConfig {
            shards: Some(8),
            queues: 2,
            ..LoadConfig::default()
        };
        assert_eq!(cfg.effective_shards(), 2);
    }

    #[test]
    fn svg_has_one_curve_per_histogram() {
        let mut h = new_histogram();
        for v in 1..10_000u64 {
            h.record(v * 1000).unwrap();
        }
        let svg = latency_svg("t <&>", "s", &[("put", "#000", &h), ("e2e", "#f00", &h)]);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
