//! What a delivery service needs from the store around it: its own shard's [`Store`]
//! and a way to put into, and flush, any shard. [`ShardContext`] is the host of a
//! sharded store's shard; [`Solo`] makes a single [`Store`] (one shard, on the
//! caller's executor) a host.

use crate::error::Result;
use crate::format::delay_offset::{Key, Lane};
use crate::format::schedule::Position;
use crate::message::{Message, PutResult, PutStatus};
use crate::shard::{Route, ShardContext};
use crate::store::Store;
use std::future::Future;

/// The store a delivery service runs beside (module docs).
pub trait Host: Clone + 'static {
    /// The service's own shard's store (where its schedule queues are).
    fn store(&self) -> &Store;
    fn shard(&self) -> usize;
    fn shards(&self) -> usize;
    /// The shard owning `(topic, queue_id)`.
    fn owner(&self, topic: &str, queue_id: i32) -> usize;
    /// Stores a delivered message on `shard` with its position.
    fn put_delivery(
        &self,
        shard: usize,
        msg: Message,
        pos: Position,
    ) -> impl Future<Output = PutResult>;
    /// Makes everything `shard` holds durable.
    fn flush(&self, shard: usize) -> impl Future<Output = Result<()>>;
    /// The newest delivery of `lane` held by `shard`'s log.
    fn newest_delivery(
        &self,
        shard: usize,
        lane: Lane,
    ) -> impl Future<Output = Result<Option<Key>>>;
}

impl Host for ShardContext {
    fn store(&self) -> &Store {
        &self.store
    }

    fn shard(&self) -> usize {
        self.shard
    }

    fn shards(&self) -> usize {
        Route::shards(self)
    }

    fn owner(&self, topic: &str, queue_id: i32) -> usize {
        Route::owner(self, topic, queue_id)
    }

    async fn put_delivery(&self, shard: usize, msg: Message, pos: Position) -> PutResult {
        self.run_at(shard, &(), async move |s, _| {
            s.put_delivery(&msg, pos).await
        })
        .await
        .unwrap_or_else(|_| PutResult::refused(PutStatus::ServiceNotAvailable))
    }

    async fn flush(&self, shard: usize) -> Result<()> {
        self.run_at(shard, &(), async |s, _| s.flush().await.map(|_| ()))
            .await?
    }

    async fn newest_delivery(&self, shard: usize, lane: Lane) -> Result<Option<Key>> {
        self.run_at(shard, &(), async move |s, _| s.newest_delivery(lane))
            .await
    }
}

/// A single [`Store`] as a host: every queue is its own.
#[derive(Clone)]
pub struct Solo(pub Store);

impl Host for Solo {
    fn store(&self) -> &Store {
        &self.0
    }

    fn shard(&self) -> usize {
        self.0.shard_index() as usize
    }

    fn shards(&self) -> usize {
        1
    }

    fn owner(&self, _topic: &str, _queue_id: i32) -> usize {
        self.shard()
    }

    async fn put_delivery(&self, _shard: usize, msg: Message, pos: Position) -> PutResult {
        self.0.put_delivery(&msg, pos).await
    }

    async fn flush(&self, _shard: usize) -> Result<()> {
        self.0.flush().await.map(|_| ())
    }

    async fn newest_delivery(&self, _shard: usize, lane: Lane) -> Result<Option<Key>> {
        Ok(self.0.newest_delivery(lane))
    }
}
