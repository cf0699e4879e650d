//! A shard seen by clients as a broker of its own (`shard_listen`, issues 20 and 22).
//!
//! RocketMQ has no shards; its clients scale over brokers: the route names each
//! broker's address and queue counts, and a client sends each queue's messages to the
//! broker that holds it. With `shard_listen` set, each shard of the node also listens
//! on a port of its own and the node's route names every shard as a broker
//! (`<broker_name>-<shard>`) holding the queues that shard owns. A client then sends
//! each message on a connection to its queue's owner, so no request is handed between
//! shards. Deciding figure (2-shard node, `coremq bench --target`, interleaved with a
//! 1-shard node on this 2-CPU machine): a 1-shard node took 3.7 us of CPU per send
//! under 4 x 64 single sends and 12-19 ticks per 3,000 paced sends against 5.5-6.4 us and
//! 26-33 ticks for 2 shards, whose connections hand half their sends to the other shard.
//!
//! Queue ids on a shard's port are the shard-broker's own, `0..count`, as RocketMQ
//! numbers every broker's queues: local id `i` of shard `s` is the `i`-th of the
//! topic's queues that `s` owns, in ascending order. Under the store's ownership rule
//! ([`Ownership::TopicPlusQueue`]: queue `q` belongs to shard `(crc32(topic) + q) %
//! shards`) the queues of shard `s` are `r, r + shards, r + 2 * shards, ...` with `r =
//! (s - crc32(topic)) mod shards`, so both directions are arithmetic. Stores created
//! under the old rule ([`Ownership::QueueCrc32`]) cannot use shard ports (refused at
//! start).
//!
//! Invariants:
//! * `global(local(q)) == q` for every queue `q` the shard owns, and `local` refuses
//!   a queue it does not own.
//! * The counts of all shards add up to the topic's count.
//! * Stored records, consumer offsets and the node's own port keep the global ids.

use crate::shard::Ownership;

/// One shard's view of the node's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardView {
    pub shard: usize,
    pub shards: usize,
}

impl ShardView {
    /// The view of `shard` among `shards`; `None` unless the store's queues are spread
    /// by [`Ownership::TopicPlusQueue`].
    pub fn new(shard: usize, shards: usize, ownership: Ownership) -> Option<ShardView> {
        (ownership == Ownership::TopicPlusQueue && shard < shards)
            .then_some(ShardView { shard, shards })
    }

    /// `topic`'s queues as this shard numbers them (the topic's hash taken once: a
    /// send asks for the count, the node's id and back).
    pub fn topic(&self, topic: &str) -> TopicQueues {
        let s = self.shards as u64;
        let start = crc32fast::hash(topic.as_bytes()) as u64 % s;
        TopicQueues {
            first: (self.shard as u64 + s - start) % s,
            step: s,
        }
    }

    /// The global queue id of this shard's local queue `local` (not checked against
    /// a count); `None` for a negative id or one past `i32`.
    pub fn global(&self, topic: &str, local: i32) -> Option<i32> {
        self.topic(topic).global(local)
    }

    /// The broker name this shard answers to: `<node broker name>-<shard>`.
    pub fn broker_name(node_broker: &str, shard: usize) -> String {
        format!("{node_broker}-{shard}")
    }
}

/// One topic's queues as one shard numbers them: the node's ids `first, first + step,
/// first + 2 * step, ...` are the shard's `0, 1, 2, ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicQueues {
    first: u64,
    step: u64,
}

impl TopicQueues {
    /// How many of the topic's first `total` queues the shard owns.
    pub fn count(&self, total: i32) -> i32 {
        let total = total.max(0) as u64;
        if self.first >= total {
            0
        } else {
            (total - self.first).div_ceil(self.step) as i32
        }
    }

    /// The node's id of the shard's queue `local` (not checked against a count);
    /// `None` for a negative id or one past `i32`.
    pub fn global(&self, local: i32) -> Option<i32> {
        let local = u64::try_from(local).ok()?;
        i32::try_from(local * self.step + self.first).ok()
    }

    /// The shard's id of the node's queue `global`; `None` when another shard owns it.
    pub fn local(&self, global: i32) -> Option<i32> {
        let g = u64::try_from(global).ok()?;
        (g >= self.first && (g - self.first).is_multiple_of(self.step))
            .then(|| ((g - self.first) / self.step) as i32)
    }
}

/// A topic's (read, write) queue counts as the broker a connection talks to (the
/// node, or with `view` one shard broker) has them.
pub(crate) fn queue_counts(
    view: Option<ShardView>,
    topic: &str,
    read: i32,
    write: i32,
) -> (i32, i32) {
    match view.map(|v| v.topic(topic)) {
        Some(q) => (q.count(read), q.count(write)),
        None => (read, write),
    }
}

/// The brokers the node answers as (routes, cluster info, registration): itself, or
/// with shard ports each shard, as (name, address, view).
pub(crate) fn brokers(
    st: &crate::node::NodeState,
) -> Vec<(String, std::net::SocketAddrV4, Option<ShardView>)> {
    if st.shard_addrs.is_empty() {
        return vec![(st.cfg.broker_name.clone(), st.broker_addr, None)];
    }
    let shards = st.handle.shards();
    st.shard_addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let view = ShardView::new(i, shards, st.handle.ownership());
            (ShardView::broker_name(&st.cfg.broker_name, i), *a, view)
        })
        .collect()
}

/// Queues `0..total` of `topic` as the broker a connection talks to lists them (the
/// node, or with `view` one shard broker): that broker's name, and per queue the id it
/// shows and the node's id.
pub(crate) fn listed(
    view: Option<ShardView>,
    node_broker: &str,
    topic: &str,
    total: i32,
) -> (String, Vec<(i32, i32)>) {
    match view {
        None => (
            node_broker.to_string(),
            (0..total.max(0)).map(|q| (q, q)).collect(),
        ),
        Some(v) => {
            let q = v.topic(topic);
            (
                ShardView::broker_name(node_broker, v.shard),
                (0..q.count(total))
                    .filter_map(|i| Some((i, q.global(i)?)))
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::shard_of;

    #[test]
    fn local_ids_number_each_shards_own_queues_in_order() {
        for topic in ["TopicA", "BenchTopic0", "orders", "%RETRY%g", "T"] {
            for shards in 1..=5 {
                for total in [0, 1, 3, 4, 8, 17] {
                    let mut sum = 0;
                    for s in 0..shards {
                        let v = ShardView::new(s, shards, Ownership::TopicPlusQueue).unwrap();
                        let q = v.topic(topic);
                        let owned: Vec<i32> = (0..total)
                            .filter(|&q| shard_of(topic, q, shards) == s)
                            .collect();
                        assert_eq!(q.count(total), owned.len() as i32, "{topic} {s}/{shards}");
                        for (i, &g) in owned.iter().enumerate() {
                            assert_eq!(v.global(topic, i as i32), Some(g));
                            assert_eq!(q.local(g), Some(i as i32));
                        }
                        for g in 0..total {
                            if shard_of(topic, g, shards) != s {
                                assert_eq!(q.local(g), None, "{topic} q{g} not on {s}");
                            }
                        }
                        sum += q.count(total);
                    }
                    assert_eq!(sum, total);
                }
            }
        }
    }

    #[test]
    fn bad_ids_and_old_stores_are_refused() {
        let v = ShardView::new(1, 2, Ownership::TopicPlusQueue).unwrap();
        assert_eq!(v.global("T", -1), None);
        assert_eq!(v.topic("T").local(-3), None);
        assert_eq!(v.global("T", i32::MAX), None);
        assert!(ShardView::new(0, 2, Ownership::QueueCrc32).is_none());
        assert!(ShardView::new(2, 2, Ownership::TopicPlusQueue).is_none());
    }
}
