//! Which shard owns a queue, and which shard a commit-log offset belongs to.
//!
//! RocketMQ has no shards (a broker is one `DefaultMessageStore`), so this rule is
//! coremq's own. Both halves are part of the on-disk contract: changing either moves
//! queues away from their data, so the rule a store was created with is recorded in its
//! `store.meta` ([`super::meta`]) and kept for its life.
//!
//! * [`Ownership::TopicPlusQueue`] (stores created now, `store.meta` format 2):
//!   `(topic, queue_id)` belongs to shard `(crc32(topic) + queue_id) % shards`. A topic's
//!   queues go round robin over the shards from a start its name picks, so every topic is
//!   spread as evenly as its queue count allows (RocketMQ's default 4 or 8 queues over 2
//!   shards: 2 + 2 or 4 + 4), and different topics start on different shards. CRC-32 is
//!   fixed by its standard, so the mapping is the same across versions, platforms and
//!   restarts; ahash is seeded per process and only fit for in-memory maps.
//! * [`Ownership::QueueCrc32`] (format 1, stores created before): `crc32(topic, 0x00,
//!   queue_id as BE i32) % shards`. CRC-32 is linear, so its low bits barely depend on
//!   the low bits of the queue id: with 2 shards queues 0-3 of every topic land on one
//!   shard (and 4-7 on the other), so a 4-queue topic used one core. Kept only to open
//!   those stores where their data is.
//! * Shard `i`'s CommitLog starts at `i << SHARD_SHIFT`, so a commit-log offset, and the
//!   RocketMQ offset message id built from it (store host, port, offset), names its
//!   shard with no extra field, and the ids clients compute from pulled records are the
//!   ids the store hands out. Shard 0 starts at 0, so a RocketMQ store root is a
//!   one-shard store.

use crate::message::LogOffset;

/// Bits of a commit-log offset below the shard number: 2^56 bytes (64 PiB) per shard.
pub const SHARD_SHIFT: u32 = crate::config::LOG_SHARD_SHIFT;
/// Most shards a store can have (offsets stay below 2^63: RocketMQ's offsets are Java `long`s).
pub const MAX_SHARDS: usize = 1 << (63 - SHARD_SHIFT);

/// How a store maps queues to shards (module docs), as its `store.meta` records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// `crc32(topic, 0x00, queue_id) % shards` (`store.meta` format 1).
    QueueCrc32,
    /// `(crc32(topic) + queue_id) % shards` (format 2, what new stores use).
    TopicPlusQueue,
}

impl Ownership {
    /// The rule a store created now gets.
    pub const CURRENT: Ownership = Ownership::TopicPlusQueue;

    /// The shard that owns `(topic, queue_id)` among `shards`.
    pub fn shard_of(self, topic: &str, queue_id: i32, shards: usize) -> usize {
        match self {
            Ownership::QueueCrc32 => {
                let mut h = crc32fast::Hasher::new();
                h.update(topic.as_bytes());
                h.update(&[0]);
                h.update(&queue_id.to_be_bytes());
                (h.finalize() as usize) % shards
            }
            Ownership::TopicPlusQueue => {
                // Queue ids are checked to be non-negative before a put; a negative one
                // (a bad request) still maps somewhere, by its two's-complement bits.
                let spread = crc32fast::hash(topic.as_bytes()) as u64 + queue_id as u32 as u64;
                (spread % shards as u64) as usize
            }
        }
    }
}

/// The shard that owns `(topic, queue_id)` among `shards` in a store created now
/// ([`Ownership::CURRENT`]); a store's own rule is [`Handle::shard_of`](super::Handle::shard_of).
pub fn shard_of(topic: &str, queue_id: i32, shards: usize) -> usize {
    Ownership::CURRENT.shard_of(topic, queue_id, shards)
}

/// The shard a commit-log offset belongs to.
pub fn shard_of_offset(offset: LogOffset) -> usize {
    (offset >> SHARD_SHIFT) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_topic_spreads_its_queues_evenly() {
        for topic in ["TopicA", "BenchTopic0", "orders", "T", "%RETRY%group"] {
            for shards in 1..=8 {
                for queues in [4, 8, 16] {
                    let mut n = vec![0; shards];
                    for q in 0..queues {
                        n[shard_of(topic, q, shards)] += 1;
                    }
                    let (lo, hi) = (n.iter().min().unwrap(), n.iter().max().unwrap());
                    assert!(hi - lo <= 1, "{topic}, {queues} queues on {shards}: {n:?}");
                }
            }
        }
    }

    #[test]
    fn the_rules_are_fixed() {
        // Pinned values: a change here moves queues away from their data.
        assert_eq!(Ownership::QueueCrc32.shard_of("TopicA", 0, 2), 1);
        assert_eq!(
            (0..4)
                .map(|q| Ownership::QueueCrc32.shard_of("TopicA", q, 2))
                .collect::<Vec<_>>(),
            [1, 1, 1, 1],
            "the old rule's flaw this module documents"
        );
        let t = crc32fast::hash(b"TopicA") as usize;
        for q in 0..8 {
            assert_eq!(
                Ownership::TopicPlusQueue.shard_of("TopicA", q, 3),
                (t + q as usize) % 3
            );
        }
    }
}
