//! The store's side of replication: RocketMQ's `GroupTransferService` (a SYNC_MASTER
//! put waits for a slave's acknowledgement) and `DefaultMessageStore.appendToCommitLog`
//! (a slave appends its master's bytes). The protocol, the connections and the slave's
//! client live in `crate::ha`; this file is what they call on a shard's [`Store`].
//!
//! * **Group transfer.** Every report a slave sends acknowledges every byte below it,
//!   so one report releases every put it covers: `acked` is an [`OffsetWatch`] of the
//!   highest report of any slave (RocketMQ's `push2SlaveMaxOffset`), waited on like
//!   `flushed` by sync-flush puts, with the deadlines expired in batches by one ticker
//!   task (no timer per put).
//! * **In sync** (RocketMQ 4.x `isSlaveOK`): at least one slave connected and less than
//!   `ha.max_gap_not_in_sync` behind the log's end. Otherwise a SYNC_MASTER put gets
//!   `SlaveNotAvailable` at once, after storing the message, as RocketMQ 4.x does (5.x
//!   dropped the status and, with default settings, silently stops waiting: not copied).
//! * A SYNC_MASTER put in async-flush mode asks the writer to commit at once: a master
//!   sends only committed bytes, and the commit interval (200 ms) would be its latency.
//! * **Slave.** Puts are refused (`SlaveMode`); replicated bytes go through
//!   [`Store::append_replica`], which checks and appends them (see
//!   `commit_log/replica.rs`) and wakes the writer and the dispatcher as a put does.

use super::{Inner, State, Store};
use crate::commit_log::ReplicaAppend;
use crate::config::{FlushMode, HaRole};
use crate::error::{Error, Result};
use crate::message::{LogOffset, PutStatus};
use crate::wake::OffsetWatch;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A shard's acknowledgements from its slaves.
#[derive(Default)]
pub(super) struct GroupTransfer {
    /// The highest offset any slave reported (never moves back).
    acked: OffsetWatch,
    /// Slave connections open now.
    slaves: Cell<usize>,
    /// Each open connection's latest report (retention keeps what the lowest one
    /// still needs, with `keep_for_slaves`).
    reports: std::cell::RefCell<Vec<std::rc::Weak<Cell<u64>>>>,
}

impl GroupTransfer {
    /// The lowest offset a connected slave reported (what it still needs from), or
    /// `None` with no slave connected.
    pub(super) fn lowest_report(&self) -> Option<u64> {
        let mut reports = self.reports.borrow_mut();
        reports.retain(|w| w.strong_count() > 0);
        reports
            .iter()
            .filter_map(|w| w.upgrade())
            .map(|c| c.get())
            .min()
    }
}

/// Counts a slave connection while it lives ([`Store::slave_connected`]) and holds its
/// latest report.
pub struct SlaveGuard {
    inner: Rc<Inner>,
    report: Rc<Cell<u64>>,
}

impl SlaveGuard {
    /// This slave reported `offset`: every byte below it is on the slave (and
    /// acknowledges the puts it covers, as [`Store::slave_acked`]).
    pub fn report(&self, offset: LogOffset) {
        if offset > self.report.get() {
            self.report.set(offset);
        }
        Store::ack(&self.inner, offset);
    }
}

impl Drop for SlaveGuard {
    fn drop(&mut self) {
        let t = &self.inner.transfer;
        t.slaves.set(t.slaves.get() - 1);
        // Puts waiting for a slave that is gone time out at their deadline.
    }
}

impl Store {
    /// This store's replication role.
    pub fn ha_role(&self) -> HaRole {
        self.inner.cfg.ha.role
    }

    /// Whether the store still runs (not shut down or shutting down, not failed).
    pub fn is_running(&self) -> bool {
        self.inner.state.get() == State::Running && self.failure().is_none()
    }

    /// A slave connection opened, whose log ends at `first_report`; it counts until
    /// the guard drops, and its reports go through the guard.
    pub fn slave_connected(&self, first_report: LogOffset) -> SlaveGuard {
        let t = &self.inner.transfer;
        t.slaves.set(t.slaves.get() + 1);
        let report = Rc::new(Cell::new(first_report));
        t.reports.borrow_mut().push(Rc::downgrade(&report));
        Store::ack(&self.inner, first_report);
        SlaveGuard {
            inner: self.inner.clone(),
            report,
        }
    }

    /// A slave reported `offset`: every byte below it is on that slave.
    pub fn slave_acked(&self, offset: LogOffset) {
        Store::ack(&self.inner, offset);
    }

    fn ack(inner: &Inner, offset: LogOffset) {
        let acked = &inner.transfer.acked;
        if offset > acked.get() {
            acked.set(offset);
        }
    }

    /// The lowest offset a connected slave reported (`None`: no slave connected).
    pub fn lowest_slave_report(&self) -> Option<LogOffset> {
        self.inner.transfer.lowest_report()
    }

    /// The highest offset any slave acknowledged, and the slaves connected now.
    pub fn slave_ack_state(&self) -> (LogOffset, usize) {
        let t = &self.inner.transfer;
        (t.acked.get(), t.slaves.get())
    }

    /// The committed end (what a master sends; see `CommitLog::read_committed`).
    pub fn committed_watch(&self) -> &OffsetWatch {
        &self.inner.log.committed
    }

    /// The log, for the HA connections.
    pub(crate) fn commit_log(&self) -> &crate::commit_log::CommitLog {
        &self.inner.log
    }

    /// Appends replicated bytes at the log's end (a slave's only way to write): the
    /// whole records at the start of `bytes` are checked and appended, the rest is left
    /// for the caller to complete. Wakes the writer and the dispatcher.
    pub async fn append_replica(&self, bytes: &[u8]) -> Result<ReplicaAppend> {
        let inner = &self.inner;
        if inner.state.get() != State::Running {
            return Err(Error::ShutDown);
        }
        if let Some(f) = inner.failed.borrow().clone() {
            return Err(Error::Failed(f));
        }
        // The puts' bound on dispatch lag holds for replicated bytes too: a catch-up
        // does not leave the dispatcher reading its records back from disk.
        let max_lag = inner.cfg.max_dispatch_lag_bytes;
        let written = inner.log.written();
        if max_lag > 0 && written.saturating_sub(inner.dispatched.get()) > max_lag {
            inner.dispatch_wake.notify();
            if !inner.dispatched.wait_for(written - max_lag / 2).await {
                return Err(Error::Failed(
                    inner.failed.borrow().clone().unwrap_or_default(),
                ));
            }
        }
        let done = inner.log.append_replica(bytes).await?;
        if done.consumed > 0 {
            if done.last_store_ts > 0 {
                let ts = done.last_store_ts.max(inner.last_store_ts.get());
                inner.last_store_ts.set(ts);
            }
            match inner.cfg.flush_mode {
                FlushMode::Sync => inner.log.wake_sync_writer(),
                FlushMode::Async => {}
            }
            inner.dispatch_wake.notify();
        }
        Ok(done)
    }

    /// Makes an empty log begin at `start` (a new slave receives its master's last
    /// segment onward); queues and the key index are empty too, and dispatch resumes
    /// there.
    pub fn restart_empty_log_at(&self, start: LogOffset) -> Result<()> {
        let inner = &self.inner;
        if inner.queues.count() > 0 {
            return Err(Error::BadRequest(format!(
                "cannot move the start of {}: it holds queues",
                inner.cfg.root.display()
            )));
        }
        inner.log.restart_empty_at(start)?;
        if start > inner.dispatched.get() {
            inner.dispatched.set(start);
        }
        Ok(())
    }

    /// The end of the log: what a slave reports.
    pub fn log_end(&self) -> LogOffset {
        self.inner.log.written()
    }

    /// Whether the log holds nothing yet.
    pub fn log_is_empty(&self) -> bool {
        self.inner.log.is_empty()
    }
}

impl Inner {
    /// SYNC_MASTER's wait for a slave to acknowledge `[.., end)` (module docs):
    /// `PutOk`, `FlushSlaveTimeout` or `SlaveNotAvailable`.
    pub(super) async fn wait_for_slave(&self, end: u64) -> PutStatus {
        let t = &self.transfer;
        let gap = self.log.written().saturating_sub(t.acked.get());
        if t.slaves.get() == 0 || gap >= self.cfg.ha.max_gap_not_in_sync {
            return PutStatus::SlaveNotAvailable;
        }
        if self.cfg.flush_mode == FlushMode::Async {
            self.log.request_commit();
        }
        let deadline = Instant::now() + self.cfg.ha.sync_timeout;
        match t.acked.wait_until(end, deadline).await {
            Some(true) => PutStatus::PutOk,
            Some(false) => PutStatus::ServiceNotAvailable,
            None => PutStatus::FlushSlaveTimeout,
        }
    }

    /// SYNC_MASTER: wakes the puts whose slave deadline passed, every eighth of the
    /// timeout (1-100 ms), until the store stops (module docs).
    pub(super) async fn run_transfer_expiry(self: Rc<Self>) {
        let tick = (self.cfg.ha.sync_timeout / 8)
            .clamp(Duration::from_millis(1), Duration::from_millis(100));
        while self.state.get() == State::Running {
            glommio::timer::sleep(tick).await;
            self.transfer.acked.expire(Instant::now());
        }
        self.transfer.acked.close();
    }
}
