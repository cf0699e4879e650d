//! Blocking disk calls, run off the executor: a directory fsync, a small file written
//! and fsynced, a rename or a removal (`std::fs`, no io_uring) can wait as long as the
//! device does, and on the shard's thread that wait would freeze every task of the
//! shard: no put would answer, not even with a timeout. [`Disk::off_executor`] runs
//! such a call on glommio's blocking thread and awaits it, so the shard keeps serving
//! (and timing puts out) while the device stalls.
//!
//! Decisions:
//! * glommio's blocking pool (`spawn_blocking`), not the sync-write thread of
//!   `dsync.rs` nor a new one: it already runs glommio's own truncates and renames, and
//!   its completion wakes the executor through the ring. One thread per executor, so
//!   the calls of a shard run one at a time, in order; a stalled call delays only the
//!   calls queued behind it, which would wait for the device anyway.
//! * Used wherever such a call can happen while the store runs: checkpoint rounds
//!   (manifest replace), new queue directories, new segment, queue and index files
//!   (their directory sync), shutdown. Open and recovery call the blocking forms
//!   directly: nothing else runs on the shard yet, and they must finish first anyway.
//! * Nothing measured: these calls come a few times a second at most (the checkpoint
//!   round, `consume_queue_flush_interval`, 1 s), never per put.
//! * On the simulated disk the call runs inline unless `SimDisk::set_offload` is on:
//!   a hop to another thread makes runs no longer replay exactly, which the crash
//!   sweeps need; the stall tests turn it on.

use super::Disk;

impl Disk {
    /// Runs `f` (one or more blocking calls on this disk) on the executor's blocking
    /// thread and awaits its result (module docs). Must run on a glommio executor.
    pub async fn off_executor<R, F>(&self, f: F) -> R
    where
        F: FnOnce(&Disk) -> R + Send + 'static,
        R: Send + 'static,
    {
        if let Disk::Sim(d) = self
            && !d.offload()
        {
            return f(self);
        }
        let disk = self.clone();
        glommio::executor().spawn_blocking(move || f(&disk)).await
    }
}
