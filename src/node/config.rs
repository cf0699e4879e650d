//! The node's settings, RocketMQ's `BrokerConfig` and `NettyServerConfig` in one:
//! defaults that work on a laptop, every one overridable by a TOML file (`coremq serve
//! --config coremq.toml`), and the address flags override the file. See `coremq.toml`
//! at the repository root for a documented example. Unknown keys are refused, so a
//! typo cannot pass silently; [`NodeConfig::validate`] runs before anything is bound.

use crate::config::{EmptySlaveStart, FlushMode, HaConfig, HaRole, ScheduleConfig, StoreConfig};
use crate::error::{Error, Result};
use crate::shard::ShardedConfig;
use serde::Deserialize;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// On the shard executors, with glommio (io_uring) sockets (the default).
    Shards,
    /// One OS thread per connection with blocking sockets (the simple fallback).
    Threads,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where connections are served: "shards" or "threads".
    pub network: Network,
    /// Where the store and `config/` (topics, consumer offsets) live.
    pub data_dir: PathBuf,
    /// The broker port (RocketMQ: 10911).
    pub listen: SocketAddr,
    /// The name-server port (RocketMQ: 9876); empty string or absent in TOML keeps
    /// the default, `namesrv_enable = false` turns it off.
    pub namesrv_listen: SocketAddr,
    pub namesrv_enable: bool,
    /// Prometheus metrics over HTTP (`/metrics`).
    pub metrics_listen: SocketAddr,
    pub metrics_enable: bool,
    /// The broker address put in routes, message ids and records. Defaults to the
    /// bound broker address (127.0.0.1 when bound to 0.0.0.0).
    pub advertised_addr: Option<SocketAddrV4>,
    pub broker_name: String,
    pub cluster_name: String,
    /// Shards (executors); 0 = one per CPU. Fixed when the store is created.
    pub shards: usize,
    /// A shard stays awake (polling, not parked) this long after requests that came
    /// closer together than that (`ShardedConfig::awake_window`; 0: parks at once);
    /// absent: the store's default.
    pub awake_window_us: Option<u64>,
    /// A shard waiting for another shard's reply spins this long before parking when
    /// replies have lately come within it (`ShardedConfig::reply_spin`; 0: never);
    /// absent: the store's default.
    pub reply_spin_us: Option<u64>,
    /// A shard with nothing to run spins rather than parks while its next timer is
    /// due within this (`ShardedConfig::timer_spin`; 0: never); absent: the store's
    /// default.
    pub timer_spin_us: Option<u64>,
    /// With `network = "shards"`: a single send whose queue another shard owns is
    /// answered by that shard on the client's connection (one hop; less CPU per send), not handed back to the
    /// connection's shard to answer (`node::shared_out`; docs/performance/node.md has
    /// both measured: with a client on the same machine the handed-back answer can
    /// come sooner).
    pub owner_answers_routed_sends: bool,
    /// With `network = "shards"`: shard `i` also listens on this address's port + `i`
    /// (port 0: a free port each) as a broker of its own, `<broker_name>-<i>`, holding
    /// the queues it owns; routes then name these shard brokers, so clients send each
    /// message straight to its queue's shard (`node::shard_view`). Absent: off.
    pub shard_listen: Option<SocketAddr>,
    /// Pin each shard to a CPU: shard `i` to `cpus[i]` when `cpus` is given, else to
    /// the CPUs this process may use, in order (`ShardedConfig::pin`).
    pub pin: bool,
    /// With `pin`: a shard mostly idle lets the kernel place its thread, pinned again
    /// once busy (`ShardedConfig::unpin_when_idle`; default true).
    pub unpin_when_idle: bool,
    /// With `pin`: the CPU of each shard, e.g. `[2, 3]` (`ShardedConfig::cpus`); every
    /// one must be a CPU this process may use. Absent: chosen as the store chooses.
    pub cpus: Option<Vec<usize>>,
    /// The CPUs each shard's io_uring workers (its file writes and fdatasyncs) may run
    /// on (`ShardedConfig::io_worker_cpus`). Absent: with `pin`, the CPUs this process
    /// may use that hold no shard, when there are any; `[]`: the kernel's default (the
    /// shard's own CPU).
    pub io_worker_cpus: Option<Vec<usize>>,
    /// "async" (RocketMQ's ASYNC_FLUSH, the default) or "sync".
    pub flush: String,
    /// Build the key index that query-by-key answers from (RocketMQ
    /// `messageIndexEnable`, on): `StoreConfig::index_enable`.
    pub message_index_enable: bool,
    /// Hash slots per key-index file (RocketMQ `maxHashSlotNum`, 5,000,000):
    /// `StoreConfig::index_hash_slots`. With `max_index_num`, the index files' size: fixed
    /// once a store has index files (a store whose files have another size is refused
    /// at open, `BadLayout`).
    pub max_hash_slot_num: u32,
    /// Entries per key-index file (RocketMQ `maxIndexNum`, 20,000,000):
    /// `StoreConfig::index_max_entries`.
    pub max_index_num: u32,
    /// Memory per shard for the key index's pages being changed (the current file's
    /// slot table and newest entries): `StoreConfig::index_max_dirty_bytes`.
    pub index_max_dirty_bytes: usize,
    /// Memory per shard for clean key-index pages kept for queries:
    /// `StoreConfig::index_cache_bytes`; 0: none.
    pub index_cache_bytes: usize,
    /// A checkpoint round flushes the key index once this many of its pages changed...
    /// (`StoreConfig::index_flush_least_pages`; 0: every round).
    pub index_flush_least_pages: usize,
    /// ... or once this long passed since its last flush
    /// (`StoreConfig::index_flush_thorough_interval`).
    pub index_flush_thorough_interval_ms: u64,
    /// Queues given to a topic created on first use (RocketMQ `defaultTopicQueueNums`).
    pub default_queue_nums: i32,
    /// Create topics on first send or route lookup (RocketMQ `autoCreateTopicEnable`).
    pub auto_create_topic: bool,
    /// Largest frame accepted (RocketMQ: 16 MiB); a larger one closes the connection.
    pub max_frame_bytes: usize,
    /// Connections served at once (both ports); more are closed on accept.
    pub max_connections: usize,
    /// A connection silent this long is closed (RocketMQ: 120 s).
    pub idle_timeout_ms: u64,
    /// Hold pulls that find nothing until a message arrives (RocketMQ long polling).
    pub long_polling: bool,
    /// Longest a pull is held, whatever the client asks.
    pub max_suspend_ms: u64,
    /// Most pulls held at once (each is a task, or a thread with `network = "threads"`);
    /// beyond it a pull that finds nothing is answered at once.
    pub max_held_pulls: usize,
    /// Most bytes of records in one pull response.
    pub pull_max_bytes: usize,
    /// Consumer offsets are written to disk this often (RocketMQ: 5 s).
    pub offset_flush_interval_ms: u64,
    /// A client not heard from (heartbeat) this long leaves its groups (RocketMQ: 120 s).
    pub client_expiry_ms: u64,
    /// Name servers (host:port) of an existing RocketMQ cluster to register with
    /// (REGISTER_BROKER), every `register_interval_ms`.
    pub namesrv_addr: Vec<String>,
    /// How often to register with `namesrv_addr` (RocketMQ: 30 s).
    pub register_interval_ms: u64,
    /// `tracing` filter (RUST_LOG wins when set), e.g. "info" or "coremq=debug".
    pub log_level: String,
    /// Tests only, off by default: answer the fault-injection request codes
    /// (`codes::TEST_PANIC_IN_HANDLER`, `TEST_PANIC_IN_STORE`) by panicking on purpose.
    pub test_hooks: bool,
    /// Replication role (RocketMQ `brokerRole`): "async_master" (or "master", the
    /// default), "sync_master", "slave"; RocketMQ's upper-case names too.
    pub role: String,
    /// The HA port slaves connect to (RocketMQ `haListenPort`); absent: the broker
    /// address with its port plus one (10912 by default, as RocketMQ 5 derives it), or
    /// a free port when the broker port is 0.
    pub ha_listen: Option<SocketAddr>,
    /// Listen on `ha_listen` (a master, or a slave others may follow).
    pub ha_enable: bool,
    /// A slave's master HA address (RocketMQ `haMasterAddress`).
    pub ha_master_address: Option<SocketAddr>,
    /// A slave's master broker address, for copying its topics and consumer offsets
    /// every `slave_sync_interval_ms` (default: the HA address's port minus one,
    /// RocketMQ's convention).
    pub ha_master_broker_address: Option<SocketAddr>,
    /// SYNC_MASTER: a put not acknowledged by a slave within this gets
    /// FLUSH_SLAVE_TIMEOUT (RocketMQ `slaveTimeout`: 3000).
    pub ha_sync_timeout_ms: u64,
    /// SYNC_MASTER: a slave this many bytes behind is not in sync: SLAVE_NOT_AVAILABLE.
    pub ha_max_gap_not_in_sync: u64,
    /// Largest HA frame body (RocketMQ 32 KiB; 1 MiB here, see `coremq::ha`).
    pub ha_max_frame_bytes: usize,
    pub ha_heartbeat_interval_ms: u64,
    /// An HA connection silent this long is closed (RocketMQ: 20 s).
    pub ha_housekeeping_interval_ms: u64,
    pub ha_reconnect_interval_ms: u64,
    /// Where an empty slave starts: "last" (the master's last segment, RocketMQ) or
    /// "first" (a whole copy).
    pub ha_empty_slave_start: String,
    /// A slave copies its master's topics and consumer offsets this often
    /// (RocketMQ's `SlaveSynchronize`: 10 s).
    pub slave_sync_interval_ms: u64,
    /// Retention (see `coremq::clean`): a log segment whose newest record is older
    /// than this many hours is deleted at a `delete_when` hour (RocketMQ
    /// `fileReservedTime`: 72).
    pub file_reserved_hours: u64,
    /// Local hours at which expired segments go, `;`-separated (RocketMQ
    /// `deleteWhen`: "04"); empty: never by the clock.
    pub delete_when: String,
    /// Above this share of the disk in use expired segments go at any hour (RocketMQ
    /// `diskMaxUsedSpaceRatio`: 0.75).
    pub disk_max_used_space_ratio: f64,
    /// Above this share the oldest segments go even if not expired, when
    /// `clean_file_forcibly` (RocketMQ `diskSpaceCleanForciblyRatio`: 0.85).
    pub disk_clean_forcibly_ratio: f64,
    pub clean_file_forcibly: bool,
    /// At or above this share puts are refused (RocketMQ's 0.90).
    pub disk_full_ratio: f64,
    /// Most segments one cleaning pass deletes (RocketMQ `deleteFileBatchMax`: 10).
    pub delete_file_batch_max: usize,
    /// How often the cleaner looks (RocketMQ `cleanResourceInterval`: 10 s).
    pub clean_interval_ms: u64,
    /// Commit-log segment size (RocketMQ `mappedFileSizeCommitLog`: 1 GiB); fixed
    /// when the store is created.
    pub segment_bytes: u64,
    /// Retired segments kept zero-filled for reuse as the next ones
    /// (`StoreConfig::commit_log_spare_segments`; 0: deleted).
    pub spare_segments: usize,
    /// Delay levels (RocketMQ `messageDelayLevel`): `ScheduleConfig::message_delay_level`.
    pub message_delay_level: String,
    /// Accept and deliver timed messages (RocketMQ 5 `timerWheelEnable`, on):
    /// `ScheduleConfig::timer_enable`.
    pub timer_enable: bool,
    /// Timed messages kept in memory per shard; the rest wait in sorted runs on disk
    /// (`ScheduleConfig::timer_memory_entries`: 262,144, 24 bytes each).
    pub timer_memory_entries: usize,
    /// Furthest delivery time of a timed message, in seconds (RocketMQ 5
    /// `timerMaxDelaySec`: 3 days).
    pub timer_max_delay_sec: u64,
    /// Refuse transactional (half) sends with NO_PERMISSION (RocketMQ
    /// `rejectTransactionMessage`, off).
    pub reject_transaction_message: bool,
    /// A half message undecided this long after it was stored is checked back
    /// (RocketMQ `transactionTimeOut`: 6 s).
    pub transaction_timeout_ms: u64,
    /// Check-backs before an undecided half message is discarded to
    /// `TRANS_CHECK_MAX_TIME_TOPIC` (RocketMQ `transactionCheckMax`: 15).
    pub transaction_check_max: u32,
    /// How often the half queue is checked (RocketMQ `transactionCheckInterval`: 60 s).
    pub transaction_check_interval_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        let store = StoreConfig::new(PathBuf::new());
        NodeConfig {
            network: Network::Shards,
            data_dir: PathBuf::from("./coremq-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 10911)),
            namesrv_listen: SocketAddr::from(([127, 0, 0, 1], 9876)),
            namesrv_enable: true,
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9100)),
            metrics_enable: true,
            advertised_addr: None,
            broker_name: "coremq-broker-a".into(),
            cluster_name: "DefaultCluster".into(),
            shards: 0,
            awake_window_us: None,
            reply_spin_us: None,
            timer_spin_us: None,
            owner_answers_routed_sends: true,
            shard_listen: None,
            pin: true,
            unpin_when_idle: true,
            cpus: None,
            io_worker_cpus: None,
            flush: "async".into(),
            message_index_enable: true,
            max_hash_slot_num: store.index_hash_slots,
            max_index_num: store.index_max_entries,
            index_max_dirty_bytes: store.index_max_dirty_bytes,
            index_cache_bytes: store.index_cache_bytes,
            index_flush_least_pages: store.index_flush_least_pages,
            index_flush_thorough_interval_ms: store.index_flush_thorough_interval.as_millis()
                as u64,
            default_queue_nums: 4,
            auto_create_topic: true,
            max_frame_bytes: 16 << 20,
            max_connections: 1024,
            idle_timeout_ms: 120_000,
            long_polling: true,
            max_suspend_ms: 30_000,
            max_held_pulls: 10_000,
            pull_max_bytes: 8 << 20,
            offset_flush_interval_ms: 5_000,
            client_expiry_ms: 120_000,
            namesrv_addr: Vec::new(),
            register_interval_ms: 30_000,
            log_level: "info".into(),
            test_hooks: false,
            role: "async_master".into(),
            ha_listen: None,
            ha_enable: true,
            ha_master_address: None,
            ha_master_broker_address: None,
            ha_sync_timeout_ms: 3000,
            ha_max_gap_not_in_sync: 256 << 20,
            ha_max_frame_bytes: 1 << 20,
            ha_heartbeat_interval_ms: 5000,
            ha_housekeeping_interval_ms: 20_000,
            ha_reconnect_interval_ms: 5000,
            ha_empty_slave_start: "last".into(),
            slave_sync_interval_ms: 10_000,
            file_reserved_hours: 72,
            delete_when: "04".into(),
            disk_max_used_space_ratio: 0.75,
            disk_clean_forcibly_ratio: 0.85,
            clean_file_forcibly: true,
            disk_full_ratio: 0.90,
            delete_file_batch_max: 10,
            clean_interval_ms: 10_000,
            segment_bytes: 1 << 30,
            spare_segments: 0,
            message_delay_level: crate::format::schedule::DEFAULT_DELAY_LEVELS.into(),
            timer_enable: true,
            timer_memory_entries: 262_144,
            timer_max_delay_sec: 3 * 86_400,
            reject_transaction_message: false,
            transaction_timeout_ms: 6000,
            transaction_check_max: 15,
            transaction_check_interval_ms: 60_000,
        }
    }
}

/// Most queues a topic may have.
pub const MAX_QUEUE_NUMS: i32 = 1024;

/// Longest interval or timeout a setting may name (a week): deadlines are computed
/// as `now + setting`, which must not overflow.
pub const MAX_INTERVAL_MS: u64 = 7 * 24 * 3600 * 1000;

impl NodeConfig {
    /// Reads a TOML file; unknown keys are refused (a typo must not pass silently).
    pub fn from_file(path: &Path) -> Result<NodeConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("read", path, 0, e))?;
        toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Config(why));
        if !(1..=MAX_QUEUE_NUMS).contains(&self.default_queue_nums) {
            return bad(format!(
                "default_queue_nums must be within 1..={MAX_QUEUE_NUMS}"
            ));
        }
        for (name, us) in [
            ("awake_window_us", self.awake_window_us),
            ("reply_spin_us", self.reply_spin_us),
            ("timer_spin_us", self.timer_spin_us),
        ] {
            if us.is_some_and(|us| us > 1_000_000) {
                return bad(format!("{name} must be at most 1000000 (a second)"));
            }
        }
        if self.shard_listen.is_some() && self.network != Network::Shards {
            return bad("shard_listen needs network = \"shards\"".into());
        }
        if self.max_frame_bytes < 1024 {
            return bad("max_frame_bytes must be at least 1024".into());
        }
        if self.max_connections == 0 {
            return bad("max_connections must be positive".into());
        }
        if self.flush_mode().is_none() {
            return bad(format!(
                "flush must be \"async\" or \"sync\", not {:?}",
                self.flush
            ));
        }
        if self.broker_name.is_empty() || self.cluster_name.is_empty() {
            return bad("broker_name and cluster_name must not be empty".into());
        }
        let intervals = [
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("max_suspend_ms", self.max_suspend_ms),
            ("offset_flush_interval_ms", self.offset_flush_interval_ms),
            ("client_expiry_ms", self.client_expiry_ms),
            ("register_interval_ms", self.register_interval_ms),
            ("clean_interval_ms", self.clean_interval_ms),
            (
                "index_flush_thorough_interval_ms",
                self.index_flush_thorough_interval_ms,
            ),
            ("transaction_timeout_ms", self.transaction_timeout_ms),
            (
                "transaction_check_interval_ms",
                self.transaction_check_interval_ms,
            ),
        ];
        for (name, ms) in intervals {
            if ms > MAX_INTERVAL_MS {
                return bad(format!(
                    "{name} must be at most {MAX_INTERVAL_MS} (a week), not {ms}"
                ));
            }
        }
        if self.transaction_timeout_ms == 0 || self.transaction_check_interval_ms < 10 {
            return bad(
                "transaction_timeout_ms must be positive and transaction_check_interval_ms \
                 at least 10"
                    .into(),
            );
        }
        if self.ha_role().is_none() {
            return bad(format!(
                "role must be \"async_master\" (or \"master\"), \"sync_master\" or \"slave\", not {:?}",
                self.role
            ));
        }
        if !matches!(self.ha_empty_slave_start.as_str(), "last" | "first") {
            return bad(format!(
                "ha_empty_slave_start must be \"last\" or \"first\", not {:?}",
                self.ha_empty_slave_start
            ));
        }
        // Everything the store checks at open (index sizes, retention, delays, HA),
        // refused here before anything is bound.
        self.sharded_config().store.validate()
    }

    /// The replication role `role` names.
    pub fn ha_role(&self) -> Option<HaRole> {
        match self.role.to_ascii_lowercase().as_str() {
            "master" | "async_master" => Some(HaRole::AsyncMaster),
            "sync_master" => Some(HaRole::SyncMaster),
            "slave" => Some(HaRole::Slave),
            _ => None,
        }
    }

    /// Where a slave copies topics and consumer offsets from.
    pub fn master_broker_address(&self) -> Option<SocketAddr> {
        self.ha_master_broker_address.or_else(|| {
            self.ha_master_address.map(|mut a| {
                a.set_port(a.port().saturating_sub(1));
                a
            })
        })
    }

    pub fn flush_mode(&self) -> Option<FlushMode> {
        match self.flush.as_str() {
            "async" => Some(FlushMode::Async),
            "sync" => Some(FlushMode::Sync),
            _ => None,
        }
    }

    /// The store settings this node opens with (store host set later, once bound).
    pub fn sharded_config(&self) -> ShardedConfig {
        let mut s = ShardedConfig::new(&self.data_dir);
        if self.shards > 0 {
            s.shards = self.shards;
        }
        s.pin = self.pin;
        s.unpin_when_idle = self.unpin_when_idle;
        s.cpus = self.cpus.clone();
        s.io_worker_cpus = self.io_worker_cpus.clone();
        if let Some(us) = self.awake_window_us {
            s.awake_window = Duration::from_micros(us);
        }
        if let Some(us) = self.reply_spin_us {
            s.reply_spin = Duration::from_micros(us);
        }
        if let Some(us) = self.timer_spin_us {
            s.timer_spin = Duration::from_micros(us);
        }
        s.store.flush_mode = self.flush_mode().unwrap_or(FlushMode::Async);
        s.store.index_enable = self.message_index_enable;
        s.store.index_hash_slots = self.max_hash_slot_num;
        s.store.index_max_entries = self.max_index_num;
        s.store.index_max_dirty_bytes = self.index_max_dirty_bytes;
        s.store.index_cache_bytes = self.index_cache_bytes;
        s.store.index_flush_least_pages = self.index_flush_least_pages;
        s.store.index_flush_thorough_interval =
            Duration::from_millis(self.index_flush_thorough_interval_ms);
        s.store.ha = self.ha_config();
        s.store.commit_log_segment_bytes = self.segment_bytes;
        s.store.commit_log_spare_segments = self.spare_segments;
        s.store.disk_full_ratio = self.disk_full_ratio;
        let r = &mut s.store.retention;
        r.file_reserved_time = Duration::from_secs(self.file_reserved_hours.saturating_mul(3600));
        r.delete_when = self.delete_when.clone();
        r.disk_max_used_space_ratio = self.disk_max_used_space_ratio;
        r.disk_clean_forcibly_ratio = self.disk_clean_forcibly_ratio;
        r.clean_file_forcibly = self.clean_file_forcibly;
        r.delete_file_batch_max = self.delete_file_batch_max;
        r.clean_interval = Duration::from_millis(self.clean_interval_ms.max(1));
        s.store.schedule = self.schedule_config();
        s
    }

    /// The store's delay and timer settings from `message_delay_level` and `timer_*`.
    pub fn schedule_config(&self) -> ScheduleConfig {
        ScheduleConfig {
            message_delay_level: self.message_delay_level.clone(),
            timer_enable: self.timer_enable,
            timer_memory_entries: self.timer_memory_entries,
            timer_max_delay: Duration::from_secs(self.timer_max_delay_sec),
            ..ScheduleConfig::default()
        }
    }

    /// The HA port's address (see `ha_listen`).
    pub fn ha_listen_addr(&self) -> SocketAddr {
        self.ha_listen.unwrap_or_else(|| {
            let mut a = self.listen;
            if a.port() != 0 {
                a.set_port(a.port().saturating_add(1));
            }
            a
        })
    }

    /// The store's replication settings from `role` and the `ha_*` keys.
    pub fn ha_config(&self) -> HaConfig {
        let ms = Duration::from_millis;
        HaConfig {
            role: self.ha_role().unwrap_or(HaRole::AsyncMaster),
            listen: self.ha_enable.then(|| self.ha_listen_addr()),
            master_address: self.ha_master_address,
            sync_timeout: ms(self.ha_sync_timeout_ms),
            max_gap_not_in_sync: self.ha_max_gap_not_in_sync,
            max_frame_bytes: self.ha_max_frame_bytes,
            heartbeat_interval: ms(self.ha_heartbeat_interval_ms),
            housekeeping_interval: ms(self.ha_housekeeping_interval_ms),
            reconnect_interval: ms(self.ha_reconnect_interval_ms),
            empty_slave_start: match self.ha_empty_slave_start.as_str() {
                "first" => EmptySlaveStart::FirstSegment,
                _ => EmptySlaveStart::LastSegment,
            },
        }
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.max(1))
    }
}
