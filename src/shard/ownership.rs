//! Which shard owns a queue, and which shard a commit-log offset belongs to.
//!
//! RocketMQ has no shards (a broker is one `DefaultMessageStore`), so this rule is
//! coremq's own. Both halves are part of the on-disk contract: changing either moves
//! queues away from their data.
//!
//! * `(topic, queue_id)` belongs to shard `crc32(topic, 0x00, queue_id as BE i32) %
//!   shards`. CRC-32 is fixed by its standard, so the mapping is the same across
//!   versions, platforms and restarts; ahash is seeded per process and only fit for
//!   in-memory maps.
//! * Shard `i`'s CommitLog starts at `i << SHARD_SHIFT`, so a commit-log offset, and the
//!   RocketMQ offset message id built from it (store host, port, offset), names its
//!   shard with no extra field, and the ids clients compute from pulled records are the
//!   ids the store hands out. Shard 0 starts at 0, so a RocketMQ store root is a
//!   one-shard store.

use crate::message::LogOffset;

/// Bits of a commit-log offset below the shard number: 2^56 bytes (64 PiB) per shard.
pub const SHARD_SHIFT: u32 = 56;
/// Most shards a store can have (offsets stay below 2^63: RocketMQ's offsets are Java `long`s).
pub const MAX_SHARDS: usize = 1 << (63 - SHARD_SHIFT);

/// The shard that owns `(topic, queue_id)` among `shards`.
pub fn shard_of(topic: &str, queue_id: i32, shards: usize) -> usize {
    let mut h = crc32fast::Hasher::new();
    h.update(topic.as_bytes());
    h.update(&[0]);
    h.update(&queue_id.to_be_bytes());
    (h.finalize() as usize) % shards
}

/// The shard a commit-log offset belongs to.
pub fn shard_of_offset(offset: LogOffset) -> usize {
    (offset >> SHARD_SHIFT) as usize
}
