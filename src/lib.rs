//! coremq: Apache RocketMQ's broker message store (`DefaultMessageStore`) rebuilt as an
//! io_uring, thread-per-core engine on glommio.
//!
//! This crate holds one shard's store ([`Store`]): a CommitLog of fixed-size segments
//! written with direct I/O through a pool of aligned write windows, ConsumeQueues
//! built by a dispatch task, a key index (IndexFiles, see [`index`]), a checkpoint,
//! and recovery. Files are laid out exactly as a RocketMQ store root, with RocketMQ's
//! byte layouts (see [`format`]).
//!
//! See `store` for the durability contract of each flush mode, and [`ha`] for
//! master/slave replication (RocketMQ's classic HA protocol, per shard).
//!
//! Cargo features: `node` (`coremq::node`, the RocketMQ remoting server), `tools`
//! (`coremq::tools`: inspect, the load generator; implies `node`) and `cli` (the `coremq`
//! binary; implies both), all on by default. With `default-features = false` the crate
//! is the store alone and pulls none of their dependencies.

pub mod clean;
pub mod commit_log;
pub mod config;
pub mod consume_queue;
pub mod error;
pub mod format;
pub mod ha;
pub mod index;
pub mod io;
pub mod message;
#[cfg(feature = "node")]
pub mod node;
pub mod schedule;
pub mod shard;
pub mod stats;
pub mod store;
pub mod timer;
#[cfg(feature = "tools")]
pub mod tools;
pub mod transaction;
mod wake;

pub use config::{
    EmptySlaveStart, FlushMode, HaConfig, HaRole, RetentionConfig, ScheduleConfig, StoreConfig,
    SyncFlushIo,
};
pub use error::{Error, Result};
pub use message::{
    GetResult, GetStatus, IllegalReason, LogOffset, Message, PutResult, PutStatus, QueueOffset,
    StoredMessage,
};
pub use shard::{
    Handle, Route, ShardContext, ShardStatus, ShardedConfig, ShardedStore, StatsReport, StoreOps,
    block_on,
};
pub use stats::StoreStats;
pub use store::{OpenReport, Store};

/// What a host embedding the sharded store needs in scope: `use coremq::prelude::*;`.
/// It brings [`StoreOps`], the trait whose methods are the operations of a [`Handle`]
/// and a [`ShardContext`].
pub mod prelude {
    pub use crate::{
        Error, FlushMode, GetResult, GetStatus, Handle, LogOffset, Message, PutResult, PutStatus,
        QueueOffset, Result, Route, ShardContext, ShardStatus, ShardedConfig, ShardedStore, Store,
        StoreConfig, StoreOps, StoredMessage,
    };
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
