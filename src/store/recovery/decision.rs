//! The queue- and index-side decision table of recovery (RocketMQ spreads these
//! decisions over `recoverConsumeQueue`, `truncateDirtyLogicFiles` and
//! `IndexService.load`; here they are one table): for the
//! ConsumeQueues and the key index against the checkpoint and the recovered CommitLog,
//! what recovery does. Before the scan it picks where the queues resume; after the scan
//! and the cut, which second pass (if any) the structures need.
//!
//! The table is one `match` ([`decide`]); every input matches exactly one row, which a
//! test checks over every input (a `match` alone would silently take the first row).

/// The queues as loaded, against the checkpoint and its manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QueueFiles {
    /// A queue's files were damaged (a file missing between others): it was discarded.
    Damaged,
    /// Fewer queues hold entries than the checkpoint counted.
    Missing,
    /// A queue holds fewer entries than the checkpoint's manifest says.
    ShortOfManifest,
    /// As the checkpoint left them (or longer).
    AsCheckpointed,
}

/// Where the queues that reached past the recovered log end stand after the cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PastEnd {
    /// No queue reached past the end.
    Within,
    /// Some did and were cut back to it, with the lengths they were loaded with.
    CutBack,
    /// One of them had taken records from the scan all the same.
    TookRecords,
}

/// What recovery knows about the queues and the key index when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Facts {
    /// Before the scan (phase 2): the queues as loaded.
    Loaded {
        /// A valid checkpoint was read.
        checkpoint: bool,
        queues: QueueFiles,
    },
    /// After the scan and the cut (phase 4).
    Scanned(AfterScan),
}

/// The queues and the key index against the recovered log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AfterScan {
    /// The queues resumed at the log's first record (phase 2 chose to rebuild them, or
    /// the checkpoint's dispatch point lay there).
    pub from_log_start: bool,
    /// A queue refused an entry during the scan: it disagrees with the log.
    pub queue_disagreed: bool,
    /// The scan met an undecodable record below its verified part, where it only
    /// replays (the checkpoint's dispatch point was no record boundary, or the log is
    /// damaged there): the structures got nothing from there on.
    pub replay_undecodable: bool,
    pub queues_past_end: PastEnd,
    /// The key index named records past the recovered end and was cut back to it.
    pub index_past_end: bool,
}

/// What recovery does about the queues and the key index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Before the scan: the queues resume at the checkpoint's dispatch point (no lower
    /// than the log's first record).
    ResumeAtCheckpoint,
    /// Every queue is rebuilt from the log's first record (an empty queue may start at
    /// a later offset): by the scan when decided before it, by a second pass after it.
    RebuildQueues,
    /// After the scan: the key index re-takes the records after its new end (a short
    /// second pass; the queues skip what they hold).
    ReindexTail,
    /// After the scan: nothing more; the structures agree with the log.
    Keep,
    /// After the scan: the open fails with the queue's error (a rebuild from the log's
    /// first record is what just disagreed; nothing else to try).
    Refuse,
}

/// Writes the decision table once, as the `match` of [`decide`]; for the tests also as
/// the rows an input matches, each row's pattern tried alone, so a test can check that
/// every input matches exactly one row (a `match` alone takes the first).
macro_rules! decision_table {
    ($( $(#[doc = $doc:literal])* $row:pat => $action:expr, )+) => {
        /// The decision table (module docs): what recovery does about what it found.
        pub(super) fn decide(facts: Facts) -> Action {
            match facts {
                $( $row => $action, )+
            }
        }

        /// The rows (by position) whose pattern `facts` matches.
        #[cfg(test)]
        fn rows_matching(facts: Facts) -> Vec<usize> {
            let rows: &[fn(Facts) -> bool] = &[$( |f| matches!(f, $row), )+];
            (0..rows.len()).filter(|&i| rows[i](facts)).collect()
        }
    };
}

decision_table! {
    /// No valid checkpoint: nothing says where the queues stand; rebuild them.
    Facts::Loaded { checkpoint: false, .. } => Action::RebuildQueues,
    /// A queue file was damaged and discarded at load: rebuild.
    Facts::Loaded { checkpoint: true, queues: QueueFiles::Damaged } => Action::RebuildQueues,
    /// A queue is missing (fewer than the checkpoint counted): rebuild.
    Facts::Loaded { checkpoint: true, queues: QueueFiles::Missing } => Action::RebuildQueues,
    /// A queue lost entries the checkpoint's manifest says it had: rebuild.
    Facts::Loaded {
        checkpoint: true,
        queues: QueueFiles::ShortOfManifest,
    } => Action::RebuildQueues,
    /// The queues hold what the checkpoint says: resume at its dispatch point.
    Facts::Loaded {
        checkpoint: true,
        queues: QueueFiles::AsCheckpointed,
    } => Action::ResumeAtCheckpoint,
    /// A queue disagrees with the log although the queues were rebuilt from its start.
    Facts::Scanned(AfterScan {
        queue_disagreed: true,
        from_log_start: true,
        ..
    }) => Action::Refuse,
    /// A queue disagrees with the log after resuming at the checkpoint: rebuild all.
    Facts::Scanned(AfterScan {
        queue_disagreed: true,
        from_log_start: false,
        ..
    }) => Action::RebuildQueues,
    /// The replay met an undecodable record: the structures missed records; rebuild.
    Facts::Scanned(AfterScan {
        queue_disagreed: false,
        replay_undecodable: true,
        ..
    }) => Action::RebuildQueues,
    /// A queue past the log end took records too: it was not what it claimed; rebuild.
    Facts::Scanned(AfterScan {
        queue_disagreed: false,
        replay_undecodable: false,
        queues_past_end: PastEnd::TookRecords,
        ..
    }) => Action::RebuildQueues,
    /// The key index was cut back to the log end: it re-takes the records after it.
    Facts::Scanned(AfterScan {
        queue_disagreed: false,
        replay_undecodable: false,
        queues_past_end: PastEnd::Within | PastEnd::CutBack,
        index_past_end: true,
        ..
    }) => Action::ReindexTail,
    /// Queues past the log end were cut back to it, the index is within: the cut is all.
    Facts::Scanned(AfterScan {
        queue_disagreed: false,
        replay_undecodable: false,
        queues_past_end: PastEnd::CutBack,
        index_past_end: false,
        ..
    }) => Action::Keep,
    /// Everything lies within the recovered log and agrees with it.
    Facts::Scanned(AfterScan {
        queue_disagreed: false,
        replay_undecodable: false,
        queues_past_end: PastEnd::Within,
        index_past_end: false,
        ..
    }) => Action::Keep,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every input the table can be given.
    fn every_input() -> Vec<Facts> {
        use QueueFiles::*;
        let mut all = Vec::new();
        for checkpoint in [false, true] {
            for queues in [Damaged, Missing, ShortOfManifest, AsCheckpointed] {
                all.push(Facts::Loaded { checkpoint, queues });
            }
        }
        for bits in 0..16u8 {
            let bit = |i: u8| bits & (1 << i) != 0;
            for queues_past_end in [PastEnd::Within, PastEnd::CutBack, PastEnd::TookRecords] {
                all.push(Facts::Scanned(AfterScan {
                    from_log_start: bit(0),
                    queue_disagreed: bit(1),
                    replay_undecodable: bit(2),
                    queues_past_end,
                    index_past_end: bit(3),
                }));
            }
        }
        all
    }

    #[test]
    fn every_input_matches_exactly_one_row_and_every_row_is_used() {
        let inputs = every_input();
        assert_eq!(inputs.len(), 8 + 16 * 3);
        let mut used = std::collections::BTreeSet::new();
        for f in inputs {
            let rows = rows_matching(f);
            assert_eq!(rows.len(), 1, "{f:?} matches rows {rows:?}");
            used.extend(rows);
        }
        assert_eq!(used.len(), 12, "a row no input reaches: {used:?}");
    }

    #[test]
    fn only_decisions_before_the_scan_pick_the_queues_resume_point() {
        for f in every_input() {
            let a = decide(f);
            match f {
                Facts::Loaded { .. } => {
                    assert!(matches!(
                        a,
                        Action::ResumeAtCheckpoint | Action::RebuildQueues
                    ))
                }
                Facts::Scanned(_) => assert_ne!(a, Action::ResumeAtCheckpoint, "{f:?}"),
            }
        }
    }

    fn loaded(checkpoint: bool, queues: QueueFiles) -> Action {
        decide(Facts::Loaded { checkpoint, queues })
    }

    /// Everything fine after the scan; each test changes what its row is about.
    const FINE: AfterScan = AfterScan {
        from_log_start: false,
        queue_disagreed: false,
        replay_undecodable: false,
        queues_past_end: PastEnd::Within,
        index_past_end: false,
    };

    fn scanned(facts: AfterScan) -> Action {
        decide(Facts::Scanned(facts))
    }

    #[test]
    fn no_checkpoint_rebuilds_the_queues() {
        assert_eq!(
            loaded(false, QueueFiles::AsCheckpointed),
            Action::RebuildQueues
        );
        assert_eq!(loaded(false, QueueFiles::Damaged), Action::RebuildQueues);
    }

    #[test]
    fn a_damaged_queue_file_rebuilds_the_queues() {
        assert_eq!(loaded(true, QueueFiles::Damaged), Action::RebuildQueues);
    }

    #[test]
    fn a_missing_queue_rebuilds_the_queues() {
        assert_eq!(loaded(true, QueueFiles::Missing), Action::RebuildQueues);
    }

    #[test]
    fn a_queue_shorter_than_the_manifest_rebuilds_the_queues() {
        assert_eq!(
            loaded(true, QueueFiles::ShortOfManifest),
            Action::RebuildQueues
        );
    }

    #[test]
    fn queues_as_checkpointed_resume_at_its_dispatch_point() {
        assert_eq!(
            loaded(true, QueueFiles::AsCheckpointed),
            Action::ResumeAtCheckpoint
        );
    }

    #[test]
    fn a_queue_disagreeing_during_a_rebuild_refuses_the_open() {
        let f = AfterScan {
            from_log_start: true,
            queue_disagreed: true,
            replay_undecodable: true,
            ..FINE
        };
        assert_eq!(scanned(f), Action::Refuse);
    }

    #[test]
    fn a_queue_disagreeing_after_resuming_at_the_checkpoint_rebuilds() {
        let f = AfterScan {
            queue_disagreed: true,
            ..FINE
        };
        assert_eq!(scanned(f), Action::RebuildQueues);
    }

    #[test]
    fn an_undecodable_replay_rebuilds_even_from_the_log_start() {
        let f = AfterScan {
            from_log_start: true,
            replay_undecodable: true,
            ..FINE
        };
        assert_eq!(scanned(f), Action::RebuildQueues);
    }

    #[test]
    fn a_queue_past_the_end_that_took_records_rebuilds() {
        let f = AfterScan {
            queues_past_end: PastEnd::TookRecords,
            index_past_end: true,
            ..FINE
        };
        assert_eq!(scanned(f), Action::RebuildQueues);
    }

    #[test]
    fn an_index_past_the_end_reindexes_its_tail() {
        for queues_past_end in [PastEnd::Within, PastEnd::CutBack] {
            let f = AfterScan {
                queues_past_end,
                index_past_end: true,
                ..FINE
            };
            assert_eq!(scanned(f), Action::ReindexTail);
        }
    }

    #[test]
    fn a_queue_cut_back_to_the_end_needs_nothing_more() {
        let f = AfterScan {
            queues_past_end: PastEnd::CutBack,
            ..FINE
        };
        assert_eq!(scanned(f), Action::Keep);
    }

    #[test]
    fn structures_within_the_log_need_nothing_more() {
        assert_eq!(scanned(FINE), Action::Keep);
        let f = AfterScan {
            from_log_start: true,
            ..FINE
        };
        assert_eq!(scanned(f), Action::Keep);
    }
}
