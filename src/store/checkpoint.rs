//! Checkpoint rounds: RocketMQ's `FlushConsumeQueueService` (the queue flusher task)
//! and `StoreCheckpoint` (the `checkpoint` file), plus coremq's queue manifest
//! (`config/cq-manifest`, every queue's length at the checkpoint's dispatch point).
//!
//! A round flushes the ConsumeQueues and the key index, then writes the checkpoint
//! that says how far they go, then the manifest that goes with it. Invariants:
//! * The dispatch point and the manifest are read together with no await between, so
//!   the manifest holds exactly the queue lengths at that point; both are taken before
//!   the flush, and the checkpoint is written only after it: a checkpoint never claims
//!   more than the queue files hold.
//! * The log's flushed offset is read before the flush too; the dispatch point is at
//!   most the written end (in sync mode at most the flushed one).
//! * Rounds never overlap (`round_lock`): the background flusher, `Store::checkpoint`
//!   and shutdown take turns. A failed round stops the shard's writes.
//! * The checkpoint is one page written in place and fdatasync'ed; its CRC tells a
//!   torn write, and recovery then scans the whole log. The manifest is replaced
//!   atomically after the checkpoint; a manifest of another dispatch point is ignored.
//! * A round writes the checkpoint page, and the manifest, only when its bytes differ
//!   from the last ones this process wrote and made durable ([`Written`]): an idle
//!   store syncs nothing. (Each idle second every shard rewrote both: a page
//!   fdatasync'ed, a file replaced with two fsyncs and a rename; a 2-shard node idle
//!   spent 5.9-6.4 ms of CPU a second with them, 4.5-4.9 without.) RocketMQ's flusher
//!   writes its checkpoint only at its thorough interval.

use super::{Inner, State, Store};
use crate::consume_queue::manifest_path;
use crate::error::{Error, Result};
use crate::format::checkpoint::{CHECKPOINT_LEN, Checkpoint};
use crate::format::manifest::QueueManifest;
use crate::io;
use std::rc::Rc;

/// The checkpoint page and queue manifest last written and made durable by this
/// process (none yet after an open: its first round writes both).
#[derive(Default)]
pub(super) struct Written {
    checkpoint: Option<Box<[u8; CHECKPOINT_LEN]>>,
    manifest: Option<Vec<u8>>,
}

/// Whether a round flushes the key index whatever it holds, or only when it is due
/// (`StoreConfig::index_flush_least_pages`): the checkpoint claims nothing about the
/// index, which resumes from its own durable point after a crash.
#[derive(Clone, Copy)]
pub(super) enum IndexFlush {
    Now,
    WhenDue,
}

impl Store {
    /// Flushes the consume queues and key index and writes the checkpoint now (when it
    /// changed since the last one), instead of waiting for
    /// `consume_queue_flush_interval` (less to re-dispatch after a crash). A failure
    /// here stops the store taking writes, as in the background.
    pub async fn checkpoint(&self) -> Result<()> {
        if self.inner.state.get() != State::Running {
            return Err(Error::ShutDown);
        }
        let r = self.inner.checkpoint_round(IndexFlush::Now).await;
        if let Err(e) = &r
            && !matches!(e, Error::Failed(_))
        {
            tracing::error!(error = %e, "checkpoint failed; the shard stops taking writes");
            *self.inner.failed.borrow_mut() = Some(e.to_string());
        }
        r
    }
}

impl Inner {
    /// The queue flusher task: a round every `consume_queue_flush_interval` until the
    /// store stops or a round fails.
    pub(super) async fn run_queue_flusher(self: Rc<Self>) {
        loop {
            futures_lite::future::or(
                self.flusher_wake.wait(),
                // On the shard's tick (`crate::shard::tick`): with its other timers.
                glommio::timer::sleep(crate::shard::tick::until(
                    self.cfg.consume_queue_flush_interval,
                )),
            )
            .await;
            if self.state.get() != State::Running {
                return;
            }
            if let Err(e) = self.checkpoint_round(IndexFlush::WhenDue).await {
                tracing::error!(error = %e, "consume-queue flush failed; the shard stops taking writes");
                *self.failed.borrow_mut() = Some(e.to_string());
                return;
            }
        }
    }

    pub(super) async fn round_permit(&self) -> Result<glommio::sync::Permit<'_>> {
        self.round_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))
    }

    /// One round while the store runs.
    async fn checkpoint_round(&self, index: IndexFlush) -> Result<()> {
        let _round = self.round_permit().await?;
        if let Some(f) = self.failed.borrow().clone() {
            return Err(Error::Failed(f));
        }
        let dispatch_safe = self.dispatched.get();
        let log_flushed = self.log.flushed.get();
        let manifest = self.queues.manifest(dispatch_safe);
        self.flush_structures(log_flushed, manifest, index).await
    }

    /// The round of a clean shutdown, once the tasks are gone: everything written up
    /// to `end` is flushed and dispatched.
    pub(super) async fn last_checkpoint_round(&self, end: u64) -> Result<()> {
        let _round = self.round_permit().await?;
        let manifest = self.queues.manifest(end);
        self.flush_structures(end, manifest, IndexFlush::Now).await
    }

    pub(super) async fn flush_structures(
        &self,
        log_flushed: u64,
        manifest: QueueManifest,
        index: IndexFlush,
    ) -> Result<()> {
        self.queues.flush().await?;
        if let Some(ix) = &self.index {
            match index {
                IndexFlush::Now => ix.flush().await?,
                IndexFlush::WhenDue => ix.flush_when_due().await?,
            }
        }
        self.write_checkpoint(log_flushed, manifest).await
    }

    /// Writes the checkpoint, then the queue manifest that goes with it.
    pub(super) async fn write_checkpoint(
        &self,
        log_flushed: u64,
        manifest: QueueManifest,
    ) -> Result<()> {
        let dispatch_safe = manifest.dispatch_safe;
        let queue_count = manifest.queues.len();
        // The delivered positions first, covering everything below where recovery
        // will resume from this checkpoint (`delivered.rs`).
        self.write_delivered(dispatch_safe.min(log_flushed)).await?;
        let cp = Checkpoint {
            queue_count: queue_count as u32,
            crc_required_from: self.log.crc_required_from(),
            physic_msg_timestamp: self.log.flushed_timestamp(),
            logics_msg_timestamp: self.last_dispatched_ts.get(),
            index_msg_timestamp: self.index.as_ref().map_or(0, |ix| ix.full_flushed_end_ts()),
            log_flushed_offset: log_flushed,
            dispatch_safe_offset: dispatch_safe,
        };
        debug_assert!(dispatch_safe <= self.log.written() || dispatch_safe == log_flushed);
        let page = cp.encode();
        if self.written.borrow().checkpoint.as_deref() != Some(&page) {
            self.checkpoint.write_aligned(0, &page).await?;
            self.checkpoint.sync().await?;
            self.written.borrow_mut().checkpoint = Some(Box::new(page));
        }
        // Retention may now delete what this checkpoint no longer needs.
        self.checkpointed.set((dispatch_safe, log_flushed));
        const _: () = assert!(CHECKPOINT_LEN == io::PAGE);
        let bytes = manifest.encode();
        if self.written.borrow().manifest.as_deref() == Some(&bytes[..]) {
            return Ok(());
        }
        // Blocking calls (fsyncs, a rename): off the executor, so a stalled disk
        // does not stop the shard (`io::offload`).
        let path = manifest_path(&self.cfg.root);
        let to_write = bytes.clone();
        self.cfg
            .disk
            .off_executor(move |disk| {
                if let Some(dir) = path.parent() {
                    disk.create_dir_all(dir)?;
                }
                disk.replace_file(&path, &to_write)
            })
            .await?;
        self.written.borrow_mut().manifest = Some(bytes);
        Ok(())
    }
}
