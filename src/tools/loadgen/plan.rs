//! Who puts what where: the queues each shard owns, the producers and their queues,
//! and the counters every thread of a run shares.
//!
//! A queue belongs to the shard [`shard_of`] names, the rule `ShardedStore` routes by,
//! so each producer's puts land where a `Handle::put` of the same message would. The
//! layout is a pure function of the configuration and the shard count: the key-query
//! mode rebuilds it to know which queue each key went to.

use super::config::{LoadConfig, Via};
use crate::shard::Ownership;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One queue of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QueueRef {
    pub topic: String,
    pub id: i32,
    /// The shard owning it.
    pub shard: usize,
}

/// One producer: where it runs and the queues it cycles through.
pub(super) struct ProducerPlan {
    /// The shard it runs on (`--via local`); `None`: an outside thread (`--via handle`).
    pub shard: Option<usize>,
    pub queues: Arc<Vec<QueueRef>>,
    /// Where in `queues` it starts, so producers sharing queues spread over them.
    pub first: usize,
}

/// Counters a shard's work updates and the progress line reads (one cache line each).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct ShardCounters {
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    pub consumed: AtomicU64,
    pub errors: AtomicU64,
    /// The store's log positions, published by the shard's monitor task for the stall
    /// report and `--kill-after-flush`: written, committed, flushed, dispatched.
    pub log: [AtomicU64; 4],
    /// Every producer putting to this shard is done.
    pub produced: AtomicBool,
    /// The shard's task waiting for `produced` ([`Plan::produced`]).
    produced_waker: std::sync::Mutex<Option<std::task::Waker>>,
    /// Rounds of the monitor task: whether the shard's executor still runs tasks.
    pub heartbeat: AtomicU64,
    /// Largest written - dispatched the monitor saw: records not yet visible to gets.
    pub max_dispatch_lag: AtomicU64,
}

/// What every thread of a run shares, read-only but for the counters.
pub(super) struct Plan {
    pub cfg: LoadConfig,
    pub shards: usize,
    /// The queues of each shard, in topic then queue-id order.
    pub owned: Vec<Arc<Vec<QueueRef>>>,
    pub producers: Vec<ProducerPlan>,
    /// Random bytes the bodies are copied from (empty when nothing is put).
    pub pattern: Vec<u8>,
    pub counters: Vec<ShardCounters>,
    /// Shard jobs whose consumers are in place (outside producers start after all).
    pub ready: AtomicUsize,
    /// Outside producer threads still putting.
    pub outside_left: AtomicUsize,
}

impl Plan {
    pub fn new(
        cfg: &LoadConfig,
        ownership: Ownership,
        shards: usize,
        pattern: Vec<u8>,
    ) -> Result<Plan, String> {
        let all = queue_layout(cfg, ownership, shards)?;
        let owned: Vec<Arc<Vec<QueueRef>>> = (0..shards)
            .map(|s| Arc::new(all.iter().filter(|q| q.shard == s).cloned().collect()))
            .collect();
        let producers: Vec<ProducerPlan> = match cfg.via {
            Via::Local => owned
                .iter()
                .enumerate()
                .filter(|(_, queues)| !queues.is_empty())
                .flat_map(|(s, queues)| {
                    (0..cfg.producers as usize).map(move |p| ProducerPlan {
                        shard: Some(s),
                        queues: queues.clone(),
                        first: p,
                    })
                })
                .collect(),
            Via::Handle => {
                let all = Arc::new(all);
                (0..cfg.producers as usize)
                    .map(|p| ProducerPlan {
                        shard: None,
                        queues: all.clone(),
                        first: p,
                    })
                    .collect()
            }
        };
        let outside = producers.iter().filter(|p| p.shard.is_none()).count();
        Ok(Plan {
            cfg: cfg.clone(),
            shards,
            owned,
            producers,
            pattern,
            counters: (0..shards).map(|_| ShardCounters::default()).collect(),
            ready: AtomicUsize::new(0),
            outside_left: AtomicUsize::new(outside),
        })
    }

    /// Messages producer `g` puts, in message-count mode.
    pub fn quota(&self, g: usize) -> Option<u64> {
        let total = self.cfg.messages?;
        let n = self.producers.len() as u64;
        Some(total / n + u64::from((g as u64) < total % n))
    }

    /// Messages per second of one producer, under `--rate`.
    pub fn producer_rate(&self) -> Option<f64> {
        self.cfg.rate.map(|r| r / self.producers.len() as f64)
    }

    /// The queue message `seq` of producer `g` goes to (a batch goes to one queue).
    pub fn queue_of(&self, g: usize, seq: u64) -> &QueueRef {
        &self.producers[g].queues[self.slot_of(g, seq)]
    }

    /// Where that queue stands in producer `g`'s queue list; for a producer on a
    /// shard (`--via local`) the list is the shard's `owned` list.
    pub fn slot_of(&self, g: usize, seq: u64) -> usize {
        let p = &self.producers[g];
        let turn = (seq / self.cfg.batch as u64) as usize;
        (p.first + turn) % p.queues.len()
    }

    /// The producers running on shard `s`, by global index.
    pub fn producers_on(&self, s: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.producers.len()).filter(move |&g| self.producers[g].shard == Some(s))
    }

    /// How many queues each shard owns.
    pub fn queue_counts(&self) -> Vec<usize> {
        self.owned.iter().map(|q| q.len()).collect()
    }

    /// Every producer putting to shard `s` is done.
    pub fn mark_produced(&self, s: usize) {
        let c = &self.counters[s];
        c.produced.store(true, Ordering::Release);
        if let Some(w) = c.produced_waker.lock().expect("waker lock").take() {
            w.wake();
        }
    }

    /// Every producer putting to shard `s` is done: woken by [`Plan::mark_produced`]
    /// rather than looked at on a timer (a 1 ms look woke each shard 1,000 times a
    /// second while outside producers ran, the handle path's CPU at low rates).
    pub async fn produced(&self, s: usize) {
        let c = &self.counters[s];
        std::future::poll_fn(|cx| {
            if c.produced.load(Ordering::Acquire) {
                return std::task::Poll::Ready(());
            }
            *c.produced_waker.lock().expect("waker lock") = Some(cx.waker().clone());
            // Marked between the look and the waker's store: seen now.
            if c.produced.load(Ordering::Acquire) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }

    pub fn all_produced(&self) -> bool {
        self.counters
            .iter()
            .all(|c| c.produced.load(Ordering::Relaxed))
    }
}

/// The queues of the run in topic then queue-id order, each with its shard: topic
/// `BenchTopic<t>`'s ids `0..--queues`, or with `--queues-per-shard N` the first N ids
/// each shard owns.
fn queue_layout(
    cfg: &LoadConfig,
    ownership: Ownership,
    shards: usize,
) -> Result<Vec<QueueRef>, String> {
    let mut all = Vec::new();
    for t in 0..cfg.topics {
        let topic = format!("BenchTopic{t}");
        let Some(per_shard) = cfg.queues_per_shard else {
            all.extend((0..cfg.queues as i32).map(|id| QueueRef {
                shard: ownership.shard_of(&topic, id, shards),
                topic: topic.clone(),
                id,
            }));
            continue;
        };
        let mut have = vec![0; shards];
        let mut id = 0;
        while have.iter().any(|n| *n < per_shard) {
            // The store's default `max_queue_id_exclusive`.
            if id == 65_536 {
                return Err(format!(
                    "no {per_shard} queue ids below 65536 for each of {shards} shards"
                ));
            }
            let shard = ownership.shard_of(&topic, id, shards);
            if have[shard] < per_shard {
                have[shard] += 1;
                all.push(QueueRef {
                    topic: topic.clone(),
                    id,
                    shard,
                });
            }
            id += 1;
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(shards: u32) -> LoadConfig {
        LoadConfig {
            shards: Some(shards),
            ..LoadConfig::default()
        }
    }

    #[test]
    fn queues_belong_to_the_shard_the_store_routes_to() {
        let plan = Plan::new(&cfg(3), Ownership::CURRENT, 3, Vec::new()).unwrap();
        for (s, queues) in plan.owned.iter().enumerate() {
            assert!(
                queues
                    .iter()
                    .all(|q| crate::shard::shard_of(&q.topic, q.id, 3) == s)
            );
        }
        assert_eq!(plan.queue_counts().iter().sum::<usize>(), 64);
        // Producers run on the shard owning their queues, and their queue list is
        // that shard's (a slot names the same queue in both: `slot_of`).
        for (g, p) in plan.producers.iter().enumerate() {
            let s = p.shard.unwrap();
            assert!(plan.queue_of(g, 0).shard == s);
            assert!(Arc::ptr_eq(&p.queues, &plan.owned[s]));
        }
    }

    /// A shard waiting for outside producers sleeps until the last one marks it
    /// produced: its wait is polled when it starts and when it is woken, not on a
    /// timer (which woke each shard 1,000 times a second).
    #[test]
    fn a_shard_waits_for_the_outside_producers_without_polling() {
        let plan = Arc::new(Plan::new(&cfg(2), Ownership::CURRENT, 2, Vec::new()).unwrap());
        let p = plan.clone();
        let ex = glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let mut polls = 0u32;
                let mut wait = std::pin::pin!(p.produced(1));
                std::future::poll_fn(|cx| {
                    polls += 1;
                    wait.as_mut().poll(cx)
                })
                .await;
                polls
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        // Another shard's mark does not end it.
        plan.mark_produced(0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        plan.mark_produced(1);
        let polled = ex.join().unwrap();
        assert!(
            polled <= 3,
            "the wait was polled {polled} times in 120 ms before it was marked"
        );
        assert!(plan.all_produced());
    }

    #[test]
    fn queues_per_shard_gives_every_shard_as_many() {
        let c = LoadConfig {
            queues_per_shard: Some(2),
            topics: 2,
            ..cfg(4)
        };
        let plan = Plan::new(&c, Ownership::CURRENT, 4, Vec::new()).unwrap();
        assert_eq!(plan.queue_counts(), vec![4, 4, 4, 4]);
        assert_eq!(plan.producers.len(), 4);
    }

    #[test]
    fn producers_split_the_messages_exactly() {
        for via in [Via::Local, Via::Handle] {
            let c = LoadConfig {
                producers: 2,
                messages: Some(1001),
                via,
                ..cfg(3)
            };
            let plan = Plan::new(&c, Ownership::CURRENT, 3, Vec::new()).unwrap();
            let n = plan.producers.len();
            assert_eq!(n, if via == Via::Local { 6 } else { 2 });
            let sum: u64 = (0..n).map(|g| plan.quota(g).unwrap()).sum();
            assert_eq!(sum, 1001);
        }
    }

    #[test]
    fn shards_without_queues_run_no_producers() {
        // One queue: one shard of two owns it, the other owns none.
        let c = LoadConfig {
            queues: 1,
            ..cfg(2)
        };
        let plan = Plan::new(&c, Ownership::CURRENT, 2, Vec::new()).unwrap();
        let owner = crate::shard::shard_of("BenchTopic0", 0, 2);
        let mut counts = vec![0, 0];
        counts[owner] = 1;
        assert_eq!(plan.queue_counts(), counts);
        assert_eq!(plan.producers_on(1 - owner).count(), 0);
        assert_eq!(plan.producers.len(), 1);
    }
}
