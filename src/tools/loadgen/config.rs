//! What a load-generator run can vary: [`LoadConfig`] (also the `coremq bench`
//! arguments) and its value types.

use super::measure::allowed_cpus;
use crate::config::SyncFlushIo;
use crate::{FlushMode, StoreConfig};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

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

    pub(super) fn name(self) -> &'static str {
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
    /// Random key queries (through the all-shard query) on a store kept by a
    /// --messages run with the same --producers, --via, --topics, --queues (or
    /// --queues-per-shard) and --batch (scenario 6)
    KeyQueries,
    /// Open a kept store (recovering it), report the open's time, shut down
    /// (scenario 7)
    Recover,
    /// Replicate a kept store to a new, empty slave over loopback and time the
    /// catch-up (scenario 8)
    Replicate,
    /// On a fresh store: plain puts against timed puts, then --timed messages pending
    /// at once (memory), then their delivery's lateness (scenario 9)
    Timer,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::CatchUp => "catch-up",
            Mode::KeyQueries => "key-queries",
            Mode::Recover => "recover",
            Mode::Replicate => "replicate",
            Mode::Timer => "timer",
        }
    }
}

/// Everything a load-generator run can vary (also the `coremq bench` arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct LoadConfig {
    /// Shards of the store: pinned executors, each owning the queues that hash to it
    /// [default: the CPUs available]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub shards: Option<u32>,
    /// Topics (BenchTopic0, BenchTopic1, ...)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub topics: u32,
    /// Queues per topic (0..N); queue q of topic t belongs to the shard the store's ownership rule names ((crc32(t) + q) % shards in a new store)
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub queues: u32,
    /// Instead of --queues: the first N queue ids of each topic that each shard owns,
    /// so every shard has N queues per topic (e.g. 1: one queue per shard)
    #[arg(long, value_name = "N", conflicts_with = "queues",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub queues_per_shard: Option<u32>,
    /// Body bytes: a size (1024) or a uniform range (512..4096); at least 8
    #[arg(long, default_value = "1024")]
    pub body: BodySize,
    /// Keys per message (RocketMQ's KEYS property)
    #[arg(long, default_value_t = 1)]
    pub keys: u32,
    /// Messages per put: 1 uses put, more uses put_batch (to one queue)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch: u32,
    /// Puts each producer keeps in flight
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub outstanding: u32,
    /// Producers: per shard with --via local, OS threads with --via handle; with --target,
    /// each its own connections (see --client-threads)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,
    /// How producers reach the store: on the shards, putting to the owning shard's
    /// store (local), or from outside threads through the Send + Sync handle (handle)
    #[arg(long, value_enum, default_value_t = Via::Local)]
    pub via: Via,
    /// Run a tailing consumer per queue and measure end-to-end latency
    #[arg(long)]
    pub consumers: bool,
    /// Flush mode of the store
    #[arg(long, value_enum, default_value_t = Flush::Async)]
    pub flush: Flush,
    /// Seconds to produce (unless --messages is given)
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Messages to put in total, instead of a duration
    #[arg(long, conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// With --via handle: produce the same load for SECS first, unmeasured (a fresh
    /// store's first use costs extra CPU once: first touches of its memory, its
    /// topic's first files), then the measured run
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub warm_up: f64,
    /// Target rate in messages/s over all producers (open loop); default: unlimited
    #[arg(long)]
    pub rate: Option<f64>,
    /// With --rate: keep the producers' schedule and time it, but put nothing: the
    /// floor the executor and the machine put under a paced put's latency (the
    /// scheduling delay a put of zero cost would see). --via local, no --consumers
    #[arg(long, requires = "rate", conflicts_with_all = ["consumers", "target"])]
    pub pace_only: bool,
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
    /// instead of an embedded store (see `coremq::tools::loadgen::remote`); uses --topics,
    /// --queues, --body, --producers (connections), --outstanding, --duration or
    /// --messages, --consumers (read back), --json, --label
    /// (`echo`: a loopback TCP echo server in this process instead, the floor a node's
    /// round trip is compared with)
    #[arg(long, value_name = "HOST:PORT")]
    pub target: Option<String>,
    /// With --target: the header format of the requests (RocketMQ's `serializeType`;
    /// the node answers in the format asked in)
    #[arg(long, value_enum, default_value_t = HeaderFormat::Json)]
    pub header_format: HeaderFormat,
    /// With --target: what each request is (`send`: a message; `heartbeat`: a client's
    /// `HEART_BEAT`, which the node answers from its client tables without the store: at
    /// a light paced load, the node's cost of any request, the floor under a send's)
    #[arg(long, value_enum, default_value_t = RemoteRequest::Send)]
    pub request: RemoteRequest,
    /// With --target: send as a RocketMQ client does, to the brokers the node's route
    /// names (with the node's `shard_listen`, each shard's own port): each producer
    /// opens a connection per broker and splits --outstanding over them
    #[arg(long)]
    pub follow_route: bool,
    /// With --target and --outstanding above 1: the threads that drive the producers'
    /// connections, dealt to them by broker (as a RocketMQ client's one Netty event
    /// loop serves all its producers); default one per CPU this process may use, at
    /// most one per producer
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub client_threads: Option<u32>,
    /// What to do: produce, work on the store a produce run kept in --data-dir, or
    /// (timer) measure timed messages on a fresh store
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
    /// shutdown, the shards' abort files stay (the writer of scenario 7). The JSON
    /// report is written first, with what was put
    #[arg(long)]
    pub kill_after_flush: bool,
    /// Run the store without the key index (to see what indexing costs)
    #[arg(long)]
    pub no_index: bool,
    /// The store's `max_dispatch_lag_bytes` in MiB (0: puts never wait for dispatch);
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
    /// Whether a sync put that finds the group-commit thread idle and its shard with
    /// nothing else to run writes the round itself (the store's
    /// `sync_flush_lead_when_idle`, off by default)
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub sync_lead: bool,
    /// Zero-fill the commit log this many MiB ahead of the write position (the store's
    /// `commit_log_prewrite_bytes`); default: the store's default (the write pool in
    /// sync mode, off in async mode)
    #[arg(long, value_name = "MIB")]
    pub prewrite_mib: Option<u64>,
    /// Commit-log segment size in MiB (the store's `commit_log_segment_bytes`);
    /// default: the store's (1 GiB)
    #[arg(long, value_name = "MIB")]
    pub segment_mib: Option<u64>,
    /// Retired segments each shard keeps zero-filled for reuse (the store's
    /// `commit_log_spare_segments`; segment recycling); default 0
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub spare_segments: usize,
    /// Before the measured run, each shard writes this many segments of filler and
    /// retires them (kept as spares with --spare-segments, else deleted), so the run
    /// writes into recycled or new segments (scenario 3c)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub fill_segments: u64,
    /// Leave the shards' threads unpinned, for the kernel to place (`ShardedConfig::pin`
    /// false); default: each shard pinned to a CPU
    #[arg(long)]
    pub no_pin: bool,
    /// Keep each shard pinned even while it is mostly idle
    /// (`ShardedConfig::unpin_when_idle` false); default: an idle shard lets the kernel
    /// place its thread and pins itself again once busy
    #[arg(long, conflicts_with = "no_pin")]
    pub always_pin: bool,
    /// Let every shard's executor spin this long for I/O before parking (glommio's
    /// `spin_before_park`; burns CPU, shortens wake-ups); default: no spinning
    #[arg(long, value_name = "US")]
    pub spin_us: Option<u64>,
    /// How long a shard stays awake after requests that came close together
    /// (`ShardedConfig::awake_window`; 0: parks at once); default: the store's
    #[arg(long, value_name = "US")]
    pub awake_window_us: Option<u64>,
    /// How long a caller waiting for a shard's reply may spin before parking, when
    /// replies have lately come that fast (`ShardedConfig::reply_spin`; 0: never
    /// spins); default: the store's
    #[arg(long, value_name = "US")]
    pub reply_spin_us: Option<u64>,
    /// A shard with nothing to run spins rather than parks while its next timer is
    /// due within this (`ShardedConfig::timer_spin`; 0: always parks); default: the
    /// store's
    #[arg(long, value_name = "US")]
    pub timer_spin_us: Option<u64>,
    /// The CPUs the shards' io_uring workers (file writes) may run on, comma separated
    /// (`ShardedConfig::io_worker_cpus`); `shard`: where the kernel puts them, on the
    /// shard's own CPU; default: the CPUs without a shard, when there are any
    #[arg(long, value_name = "LIST")]
    pub io_worker_cpus: Option<String>,
    /// The shards' glommio preempt timer (`ShardedConfig::preempt_timer`): how long a
    /// task queue may keep the CPU while another waits
    #[arg(long, value_name = "US", default_value_t = super::PREEMPT_TIMER.as_micros() as u64)]
    pub preempt_us: u64,
    /// The longest turn of a shard's background task queue (the store's
    /// `background_turn`; 0: unbounded, until the preempt timer); default: the store's
    #[arg(long, value_name = "US")]
    pub background_turn_us: Option<u64>,
    /// The shards' stall detector threshold (`ShardedConfig::stall_threshold`); 0 turns
    /// it off
    #[arg(long, value_name = "MS", default_value_t = 10)]
    pub stall_ms: u64,
    /// Replicate to an in-process slave store (its own directory beside the store's,
    /// removed at the end) over loopback: the store runs as SYNC_MASTER, so every put
    /// waits for the slave's acknowledgement (scenario 8)
    #[arg(long)]
    pub slave: bool,
    /// Timer mode: timed messages put (all pending at once before the first is due)
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timed: u64,
    /// Timer mode: plain messages put first, and as many of the timed ones measured
    /// against them [default: half of --timed]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub plain: Option<u64>,
    /// Timer mode: delivery times spread uniformly at random over this many seconds
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub spread_secs: u64,
    /// Timer mode: seconds from the end of the plain puts to the first delivery time
    /// [default: four times the plain puts' time for --timed messages, plus 2 s]
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub lead_secs: Option<u64>,
    /// The store's `schedule.timer_memory_entries` (timed messages each shard's timer
    /// keeps in memory, 24 bytes each); default: the store's (262,144)
    #[arg(long, value_name = "N")]
    pub timer_memory_entries: Option<usize>,
}

/// How the producers reach the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Via {
    /// On the shards (`Handle::run_on`), each putting to its own shard's `Store`
    #[default]
    Local,
    /// From --producers OS threads through the `Send + Sync` `Handle`
    Handle,
}

impl Via {
    pub(super) fn name(self) -> &'static str {
        match self {
            Via::Local => "local",
            Via::Handle => "handle",
        }
    }
}

/// A remote run's request header format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HeaderFormat {
    /// JSON, what RocketMQ's clients send by default
    #[default]
    Json,
    /// RocketMQ's binary layout (`serializeTypeCurrentRPC = ROCKETMQ`)
    Rocketmq,
}

/// A remote run's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RemoteRequest {
    /// `SEND_MESSAGE_V2` (or `SEND_BATCH_MESSAGE` with --batch)
    #[default]
    Send,
    /// `HEART_BEAT` of one producer group: a request without store work
    Heartbeat,
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
    /// The store settings every shard of this run opens with (root set per shard).
    pub fn store_template(&self, root: &Path) -> StoreConfig {
        let mut c = StoreConfig::new(root);
        c.flush_mode = self.flush.mode();
        c.index_enable = !self.no_index;
        if let Some(us) = self.background_turn_us {
            c.background_turn = Duration::from_micros(us);
        }
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
        c.sync_flush_lead_when_idle = self.sync_lead;
        if let Some(mib) = self.prewrite_mib {
            c.commit_log_prewrite_bytes = Some(mib << 20);
        }
        if let Some(mib) = self.segment_mib {
            c.commit_log_segment_bytes = mib << 20;
        }
        c.commit_log_spare_segments = self.spare_segments;
        if let Some(n) = self.timer_memory_entries {
            c.schedule.timer_memory_entries = n;
        }
        if self.slave {
            c.ha.role = crate::HaRole::SyncMaster;
            c.ha.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
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

    /// Shards of the store: `--shards`, or one per CPU this process may use.
    pub fn shard_count(&self) -> usize {
        self.shards
            .map(|s| s as usize)
            .unwrap_or_else(|| allowed_cpus().len().max(1))
    }

    /// Threads driving a remote run's pipelined producers: `--client-threads`, or one
    /// per CPU this process may use; never more than the producers.
    pub fn client_thread_count(&self) -> usize {
        let producers = self.producers.max(1) as usize;
        self.client_threads
            .map(|t| t as usize)
            .unwrap_or_else(|| allowed_cpus().len().max(1))
            .clamp(1, producers)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if !(self.duration > 0.0 && self.duration.is_finite()) && self.messages.is_none() {
            return Err("--duration must be a positive number of seconds".into());
        }
        if !(self.warm_up >= 0.0 && self.warm_up.is_finite()) {
            return Err("--warm-up must be a number of seconds".into());
        }
        if self.warm_up > 0.0 && (self.via != Via::Handle || self.mode != Mode::Produce) {
            return Err("--warm-up is for produce runs with --via handle".into());
        }
        if let Some(r) = self.rate
            && !(r > 0.0 && r.is_finite())
        {
            return Err("--rate must be a positive number of messages per second".into());
        }
        if !(self.drain_timeout >= 0.0 && self.drain_timeout.is_finite()) {
            return Err("--drain-timeout must be a number of seconds".into());
        }
        if self.pace_only
            && (self.via != Via::Local
                || self.mode != Mode::Produce
                || self.rate.is_none()
                || self.consumers
                || self.target.is_some())
        {
            return Err(
                "--pace-only keeps a --rate schedule on the shards (--via local, \
                        produce mode, no --consumers or --target)"
                    .into(),
            );
        }
        if self.body.min < BodySize::MIN {
            return Err(format!("bodies must be at least {} bytes", BodySize::MIN));
        }
        Ok(())
    }

    pub(super) fn to_json(&self) -> Value {
        json!({
            "shards": self.shard_count(),
            "topics": self.topics,
            "queues": self.queues,
            "queues_per_shard": self.queues_per_shard,
            "via": self.via.name(),
            "body_bytes": self.body.to_string(),
            "keys": self.keys,
            "batch": self.batch,
            "outstanding": self.outstanding,
            "follow_route": self.follow_route,
            "producers": self.producers,
            "consumers": self.consumers,
            "flush": self.flush.name(),
            "duration_s": if self.messages.is_some() { None } else { Some(self.duration) },
            "warm_up_s": self.warm_up,
            "messages": self.messages,
            "rate": self.rate,
            "pace_only": self.pace_only,
            "drain_timeout_s": self.drain_timeout,
            "key_index": !self.no_index,
            "max_dispatch_lag_mib": self.max_dispatch_lag_mib,
            "read_cache_mib": self.read_cache_mib,
            "sync_io": match self.sync_io { SyncIo::Dsync => "dsync", SyncIo::Ring => "ring" },
            "sync_lead": self.sync_lead,
            "prewrite_mib": self.prewrite_mib,
            "segment_mib": self.segment_mib,
            "spare_segments": self.spare_segments,
            "fill_segments": self.fill_segments,
            "pin": !self.no_pin,
            "unpin_when_idle": !self.no_pin && !self.always_pin,
            "spin_us": self.spin_us,
            "awake_window_us": self.awake_window_us,
            "reply_spin_us": self.reply_spin_us,
            "timer_spin_us": self.timer_spin_us,
            "io_worker_cpus": self.io_worker_cpus,
            "preempt_us": self.preempt_us,
            "background_turn_us": self.background_turn_us,
            "stall_ms": self.stall_ms,
            "slave": self.slave,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn queues_per_shard_replaces_queues() {
        use clap::Parser;
        let parse = |args: &[&str]| DefaultArgs::try_parse_from(args).map(|a| a.cfg);
        let c = parse(&["bench", "--queues-per-shard", "1", "--via", "handle"]).unwrap();
        assert_eq!((c.queues_per_shard, c.via), (Some(1), Via::Handle));
        assert!(parse(&["bench", "--queues-per-shard", "1", "--queues", "4"]).is_err());
    }
}
