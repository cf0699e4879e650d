//! The store's statistics (`crate::stats`): the recorder's counters and rates plus
//! the positions of this moment.

use super::Store;
use crate::stats::StoreStats;

impl Store {
    /// This store's statistics now (`crate::stats` says what each one counts).
    pub fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        let mut s = inner.stats.snapshot();
        let (written, committed, flushed) = (
            self.max_log_offset(),
            self.committed_log_offset(),
            self.flushed_log_offset(),
        );
        s.dispatch_lag = written.saturating_sub(self.dispatched_log_offset());
        s.commit_lag = written.saturating_sub(committed);
        s.flush_lag = written.saturating_sub(flushed);
        s.pool_bytes = inner.cfg.write_buffer_bytes as u64 * inner.cfg.write_buffer_count as u64;
        s.pool_used = s.flush_lag.min(s.pool_bytes);
        s.log_min = self.min_log_offset();
        s.log_max = written;
        let (created, reused) = inner.log.segment_counts();
        s.segments_created = created;
        s.segments_reused = reused;
        let (ready, pending) = inner.log.spare_segments();
        s.spare_segments_ready = ready as u64;
        s.spare_segments_pending = pending as u64;
        s.sync_rounds_led = inner.log.sync_rounds_led();
        s.writer_turns = inner.log.writer_turns();
        if let Some(ix) = &inner.index {
            (s.index_flushes, s.index_flush_writes) = ix.flush_counts();
        }
        // Counted on this thread: the shard's executor when the store runs sharded.
        s.stalls = crate::shard::stall::stalls_here();
        s.last_stall = crate::shard::stall::last_stall_here();
        let clean = inner.clean.stats();
        s.self_checks = clean.self_checks;
        s.self_check_problems = clean.self_check_problems;
        s
    }
}
