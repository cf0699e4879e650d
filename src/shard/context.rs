//! [`ShardContext`]: what code running on a shard's executor gets, through
//! [`Handle::run_on`]: the shard's own [`Store`] and a handle to every shard.
//!
//! coremq's own (RocketMQ has no shards: each shard's store is one
//! `DefaultMessageStore`). The same [`StoreOps`](super::StoreOps) as the handle, with
//! the hop taken out where it can be: an operation on a queue this shard owns calls
//! the local store in place (no box, no channel, no task, its arguments borrowed), so
//! it costs what a direct `Store` call costs plus the ownership hash; any other goes
//! through the handle. A `ShardContext` is `!Send` (it holds the shard's `Store`) and
//! lives on its shard's thread.

use super::handle::Handle;
use super::ops::Route;
use crate::error::Result;
use crate::store::Store;
use std::future::Future;

/// What a task running on a shard gets: the local store and a way to everything else.
#[derive(Clone)]
pub struct ShardContext {
    pub shard: usize,
    pub store: Store,
    pub handle: Handle,
}

impl ShardContext {
    /// Whether this shard owns `(topic, queue_id)`.
    pub fn owns(&self, topic: &str, queue_id: i32) -> bool {
        self.handle.shard_of(topic, queue_id) == self.shard
    }
}

impl Route for ShardContext {
    fn shards(&self) -> usize {
        self.handle.shards()
    }

    fn owner(&self, topic: &str, queue_id: i32) -> usize {
        self.handle.shard_of(topic, queue_id)
    }

    async fn run_at<A, T, F>(&self, shard: usize, args: &A, f: F) -> Result<T>
    where
        A: ?Sized + ToOwned,
        A::Owned: Send + 'static,
        T: Send + 'static,
        F: AsyncFnOnce(&Store, &A) -> T + Send + 'static,
    {
        if shard == self.shard {
            Ok(f(&self.store, args).await)
        } else {
            self.handle.run_at(shard, args, f).await
        }
    }
}

impl Handle {
    /// Runs `f` on `shard`'s executor with that shard's [`ShardContext`] and returns
    /// its result. The future `f` builds may be `!Send`: it never leaves that thread.
    pub async fn run_on<T, F, Fut>(&self, shard: usize, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(ShardContext) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let handle = self.clone();
        let with_context = async move |store: &Store, _: &()| {
            let store = store.clone();
            f(ShardContext {
                shard,
                store,
                handle,
            })
            .await
        };
        self.run_at(shard, &(), with_context).await
    }
}

#[cfg(test)]
mod tests {
    use crate::prelude::*;
    use futures_lite::future::{block_on, poll_once};

    /// Work for the context's own shard runs in place (done within one poll, no hop);
    /// work for another shard goes through the handle. The operations answer alike.
    #[test]
    fn own_shard_in_place_other_shards_routed() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ShardedConfig::new(dir.path());
        cfg.shards = 2;
        cfg.store = StoreConfig::small_for_tests(dir.path());
        let store = ShardedStore::open(cfg).unwrap();
        let h = store.handle();
        let job = h.run_on(0, |ctx| async move {
            let own = poll_once(ctx.run_at(0, &(), async |_, _| 7)).await;
            assert!(matches!(own, Some(Ok(7))), "in place");
            let other = poll_once(ctx.run_at(1, &(), async |_, _| 7)).await;
            assert!(other.is_none(), "a hop cannot answer within one poll");
            let mut owned = 0;
            for q in 0..8 {
                owned += ctx.owns("T", q) as usize;
                let r = ctx.put(Message::new("T", q, "x")).await;
                assert_eq!(r.status, PutStatus::PutOk);
            }
            assert!(
                owned > 0 && owned < 8,
                "both paths taken: {owned} of 8 local"
            );
            ctx.wait_dispatched().await.unwrap();
            for q in 0..8 {
                let got = ctx.get("T", q, 0, 8, 1 << 20).await.unwrap();
                assert_eq!(got.records.len(), 1, "queue {q}");
                assert_eq!(ctx.queue_offsets("T", q).await.unwrap(), (0, 1));
            }
        });
        block_on(job).unwrap();
        store.shutdown().unwrap();
    }
}
