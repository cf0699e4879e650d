//! The node's settings, RocketMQ's `BrokerConfig` and `NettyServerConfig` in one:
//! defaults that work on a laptop, every one overridable by a TOML file (`coremq serve
//! --config coremq.toml`), and the address flags override the file. See `coremq.toml`
//! at the repository root for a documented example. Unknown keys are refused, so a
//! typo cannot pass silently; [`NodeConfig::validate`] runs before anything is bound.

use crate::config::FlushMode;
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
    /// Pin shard `i` to CPU `i`.
    pub pin: bool,
    /// "async" (RocketMQ's ASYNC_FLUSH, the default) or "sync".
    pub flush: String,
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
}

impl Default for NodeConfig {
    fn default() -> Self {
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
            pin: true,
            flush: "async".into(),
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
        ];
        for (name, ms) in intervals {
            if ms > MAX_INTERVAL_MS {
                return bad(format!(
                    "{name} must be at most {MAX_INTERVAL_MS} (a week), not {ms}"
                ));
            }
        }
        Ok(())
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
        s.store.flush_mode = self.flush_mode().unwrap_or(FlushMode::Async);
        s
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.max(1))
    }
}
