//! One shard per core: a store split over N glommio executors, each owning a disjoint
//! set of topic-queues through its own [`Store`](crate::Store).
//!
//! RocketMQ has no sharding: a broker runs one `DefaultMessageStore`. The sharded store
//! is coremq's, and each shard is one `DefaultMessageStore` (a `Store` under
//! `<root>/shard-<i>/`, laid out as a RocketMQ store root).
//!
//! * `ownership`: which shard owns a queue (`(crc32(topic) + queue) % shards`, by the rule `store.meta` records) and
//!   which shard a commit-log offset or message id names (`offset >> 56`).
//! * `meta`: `<root>/store.meta`, the format version and the shard count, fixed at
//!   creation.
//! * `sharded_store`: [`ShardedStore`] and [`ShardedConfig`], the executor threads,
//!   open and shutdown, and how a dead shard is noticed.
//! * `placement`: which CPU each shard runs on by default (the data disk's interrupt
//!   CPUs first when there are CPUs to spare).
//! * `idle_unpin`: a pinned shard that is mostly idle lets the kernel place it
//!   (`unpin_when_idle`).
//! * `ops`: [`Route`] (run work on a shard's store) and [`StoreOps`], every operation
//!   written once over any `Route`.
//! * `handle`: [`Handle`], the `Send + Sync + Clone` route from any thread, and the
//!   transport under it.
//! * `reply`: the one-shot slot a request's reply comes back in.
//! * `rings`: the request rings a shard drains, one per calling thread.
//! * `wait`: who spins and who parks on each side of a hop (the awake window, the
//!   reply spin, [`block_on`]).
//! * `turns`: background task queues whose turns are bounded, so timers and I/O
//!   completions are polled between their pieces.
//! * `tick`: the shared tick an idle shard's periodic timers end on.
//! * `context`: [`ShardContext`], the route of code running on a shard
//!   ([`Handle::run_on`]): the local store in place, other shards through the handle.
//!
//! What each path costs, measured: docs/performance/shard.md.

mod context;
mod handle;
mod idle_unpin;
mod io_workers;
mod meta;
mod ops;
mod ownership;
mod placement;
mod reply;
mod rings;
mod sharded_store;
pub mod stall;
pub(crate) mod tick;
pub(crate) mod turns;
pub(crate) mod wait;

pub use context::ShardContext;
pub use handle::Handle;
pub use meta::META_FORMAT_VERSION;
pub use ops::{Route, ShardStatus, StatsReport, StoreOps};
pub use ownership::{MAX_SHARDS, Ownership, SHARD_SHIFT, shard_of, shard_of_offset};
pub use sharded_store::{
    DEFAULT_AWAKE_WINDOW, DEFAULT_PREEMPT_TIMER, DEFAULT_REPLY_SPIN, ShardedConfig, ShardedStore,
};
pub use wait::block_on;
