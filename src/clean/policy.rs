//! Which segment a cleaning pass deletes, as one table: RocketMQ's
//! `CleanCommitLogService.deleteExpiredFiles` (its triggers: `isTimeToDelete`,
//! `isSpaceToDelete`, `manualDeleteFileSeveralTimes`) and
//! `MappedFileQueue.deleteExpiredFileByTime` (expired, or `cleanImmediately`).
//!
//! The pass looks at the oldest segment only (deletion goes oldest first and stops at
//! the first segment kept: no holes), after the store's own limits passed it (not the
//! segment being written, durable, dispatched and checkpointed, not needed by a
//! connected slave, not failed before). [`decide`] says whether the disk's level, the
//! hour, a manual request and the segment's age make it go.

/// How full the file system holding the store is, against the configured ratios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Below `disk_max_used_space_ratio`.
    Normal,
    /// At or above `disk_max_used_space_ratio` (75%): expired segments go at any hour.
    OverMaxUsed,
    /// At or above `disk_clean_forcibly_ratio` (85%): the oldest segments go even if
    /// not expired (when `clean_file_forcibly`).
    CleanForcibly,
    /// At or above `disk_full_ratio` (90%): puts are refused as well.
    Full,
}

impl Level {
    pub const ALL: [Level; 4] = [
        Level::Normal,
        Level::OverMaxUsed,
        Level::CleanForcibly,
        Level::Full,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Level::Normal => "normal",
            Level::OverMaxUsed => "over_max_used",
            Level::CleanForcibly => "clean_forcibly",
            Level::Full => "full",
        }
    }

    /// The level of a disk `ratio` full (`None`: unknown, taken as normal).
    pub fn of(ratio: Option<f64>, max_used: f64, forcibly: f64, full: f64) -> Level {
        match ratio {
            Some(r) if r >= full => Level::Full,
            Some(r) if r >= forcibly => Level::CleanForcibly,
            Some(r) if r >= max_used => Level::OverMaxUsed,
            _ => Level::Normal,
        }
    }
}

/// Everything [`decide`] looks at for the oldest segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The local hour is one of `delete_when`'s.
    pub hour: bool,
    pub level: Level,
    /// A manual deletion was asked for (`executeDeleteFilesManually`).
    pub manual: bool,
    /// `clean_file_forcibly` is on.
    pub forcibly: bool,
    /// The segment's newest record is older than `file_reserved_time`.
    pub expired: bool,
}

/// What happens to the oldest segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Deleted: it is expired and it is time (the hour, the disk over 75%, or asked).
    DeleteExpired,
    /// Deleted although not expired: the disk is over the force level.
    DeleteForced,
    /// Kept (and so is everything after it in this pass).
    Keep,
}

/// The table (module docs). The arms do not overlap: the tests check every input.
pub fn decide(f: Facts) -> Decision {
    let time_to_delete = f.hour || f.level >= Level::OverMaxUsed || f.manual;
    let force = f.forcibly && f.level >= Level::CleanForcibly;
    match (f.expired, time_to_delete, force) {
        (true, true, _) => Decision::DeleteExpired,
        (_, _, true) => Decision::DeleteForced,
        _ => Decision::Keep,
    }
}

impl Facts {
    /// Every input there can be.
    pub fn all() -> impl Iterator<Item = Facts> {
        let b = [false, true];
        b.into_iter().flat_map(move |hour| {
            Level::ALL.into_iter().flat_map(move |level| {
                b.into_iter().flat_map(move |manual| {
                    b.into_iter().flat_map(move |forcibly| {
                        b.into_iter().map(move |expired| Facts {
                            hour,
                            level,
                            manual,
                            forcibly,
                            expired,
                        })
                    })
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Rule = fn(&Facts) -> bool;

    /// The rules of the issue and RocketMQ, written as predicates apart from
    /// `decide`'s code, each with its promised decision.
    const ROWS: [(&str, Rule, Decision); 5] = [
        (
            "expired at a delete_when hour",
            |f| f.expired && f.hour,
            Decision::DeleteExpired,
        ),
        (
            "expired with the disk over disk_max_used_space_ratio, any hour",
            |f| f.expired && !f.hour && f.level >= Level::OverMaxUsed,
            Decision::DeleteExpired,
        ),
        (
            "expired, manual deletion asked, disk below 75%, not the hour",
            |f| f.expired && !f.hour && f.level == Level::Normal && f.manual,
            Decision::DeleteExpired,
        ),
        (
            "not expired, disk over the force level, forcing on",
            |f| !f.expired && f.forcibly && f.level >= Level::CleanForcibly,
            Decision::DeleteForced,
        ),
        (
            "otherwise kept",
            |f| {
                !(f.expired && (f.hour || f.manual || f.level >= Level::OverMaxUsed))
                    && !(f.forcibly && f.level >= Level::CleanForcibly)
            },
            Decision::Keep,
        ),
    ];

    #[test]
    fn every_input_matches_exactly_one_row() {
        assert_eq!(Facts::all().count(), 2 * 4 * 2 * 2 * 2);
        for f in Facts::all() {
            let rows: Vec<_> = ROWS.iter().filter(|(_, rule, _)| rule(&f)).collect();
            assert_eq!(
                rows.len(),
                1,
                "{f:?} matches {:?}",
                rows.iter().map(|r| r.0).collect::<Vec<_>>()
            );
            assert_eq!(decide(f), rows[0].2, "{f:?} ({})", rows[0].0);
        }
    }

    #[test]
    fn a_young_segment_is_never_deleted_below_the_force_level() {
        for f in Facts::all().filter(|f| !f.expired && f.level < Level::CleanForcibly) {
            assert_eq!(decide(f), Decision::Keep, "{f:?}");
        }
    }

    #[test]
    fn forcing_off_keeps_young_segments_even_when_full() {
        for f in Facts::all().filter(|f| !f.expired && !f.forcibly) {
            assert_eq!(decide(f), Decision::Keep, "{f:?}");
        }
    }

    #[test]
    fn levels_by_ratio() {
        let l = |r| Level::of(r, 0.75, 0.85, 0.90);
        assert_eq!(l(None), Level::Normal);
        assert_eq!(l(Some(0.5)), Level::Normal);
        assert_eq!(l(Some(0.75)), Level::OverMaxUsed);
        assert_eq!(l(Some(0.849)), Level::OverMaxUsed);
        assert_eq!(l(Some(0.85)), Level::CleanForcibly);
        assert_eq!(l(Some(0.9)), Level::Full);
        assert_eq!(l(Some(1.0)), Level::Full);
    }
}
