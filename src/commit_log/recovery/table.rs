//! Recovery's decisions for the log, as one table: what is found at the first damaged
//! position ([`Finding`]) decides whether recovery cuts the log there, cuts it and keeps
//! the cut bytes in `lost+found/`, or refuses to open ([`decide`]). README's "Recovery"
//! section states the same rules in prose; each arm of [`decide`] quotes the rule it is.
//!
//! The inputs are the facts the scan can establish about the damage, each cheap to
//! name and some costly to learn (a read past the damage, a look for data beyond a
//! pool, a read of the damaged bytes). The scan learns them in order (position, line,
//! what follows, reach, damage) and stops as soon as the facts known settle the action
//! ([`Known::settled`]), so changing a row also changes what the scan reads, with no
//! second copy of the rules.
//!
//! The refuse line is the durable flushed offset: the higher of the checkpoint's and
//! the flush mark's (`commit_log/flush_mark.rs`), which is recorded as flushes happen.
//! With a mark, nothing above the line was acknowledged as durable (async mode: exact;
//! sync mode: but for the mark's lag, about `flush_mark_interval`), so damage above it
//! is a torn tail whatever follows. Without one (a RocketMQ store root, an older
//! coremq store, a lost or damaged mark), the checkpoint's line may lie up to a second
//! behind acknowledged sync puts, and only a hole whose data ends within one write pool
//! is taken as torn ([`Reach`]): an acknowledged record's durable write covered every
//! byte before it, and a sync round covers at most the pool.

/// Where the damaged record lies relative to the refuse line
/// (`RecoverPlan::durable_below`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// It ends at or below the line: durable bytes, acknowledged data. (A damaged
    /// record starting below the line counts as ending below it unless its own,
    /// mutually consistent length fields say it reaches past the line: a line from a
    /// build whose rounds could end inside a record, with that record's tail torn.)
    BelowFlushed,
    /// It starts at the line or reaches past it.
    AtOrAboveFlushed,
}

/// What the refuse line is known from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line {
    /// The shard's flush mark: nothing above the line was acknowledged as durable (in
    /// sync mode, but for the mark's lag).
    Marked,
    /// The checkpoint alone (or nothing: 0): acknowledged sync puts may lie above it,
    /// within one pool of the log's end.
    CheckpointOnly,
}

/// What lies after the damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// No valid record (checksums and self-offset) anywhere after it: only zeros or
    /// junk.
    NothingValid,
    /// A valid record.
    ValidRecord,
}

/// How far the log's data (its non-zero bytes, and the valid record found) reaches past
/// the damage, against one write pool (`write_buffer_bytes * write_buffer_count`): the
/// most one sync round can leave unsynced, since an acknowledged record's fdatasync
/// covered every byte before it. Only asked when the line is the checkpoint's alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Every byte after the damage lies within one pool of it.
    WithinOnePool,
    /// Some byte lies a pool or more past it.
    BeyondOnePool,
}

/// What the damaged bytes look like: from the damage up to the valid record after it
/// (or to the end of the data after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damage {
    /// Some 512-byte sector's part in them (at least 8 bytes) is all zeros: a sector
    /// that kept its old contents in a torn write. A bit flip cannot zero a run of
    /// bytes.
    ZeroedSector,
    /// Every sector holds data, yet it fails its checks: a fully written record whose
    /// checksum fails, a bad magic or length, a blank before its segment's end.
    FullyWritten,
}

/// Everything the table looks at about one damaged position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Finding {
    pub position: Position,
    pub line: Line,
    pub after: After,
    pub reach: Reach,
    pub damage: Damage,
}

/// What recovery does at the damaged position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// The log ends at the damage: the bytes from it on are zeroed.
    Cut,
    /// As `Cut`, after copying the cut bytes to `<root>/lost+found/commitlog-<offset>`.
    CutKeepInLostFound,
    /// Open fails with `Error::Corrupt` naming the file and offset; nothing is changed.
    Refuse,
}

/// The table. Each arm quotes the README rule it implements; the arms do not overlap
/// (the tests check that every finding matches exactly one).
pub(crate) fn decide(f: Finding) -> Action {
    use Action::*;
    use After::*;
    use Damage::*;
    use Line::*;
    use Position::*;
    use Reach::*;
    match (f.position, f.line, f.after, f.reach, f.damage) {
        // "refuses with `Error::Corrupt` (naming file and offset) when a damaged record
        // lies below the durable flushed offset"
        (BelowFlushed, _, _, _, _) => Refuse,
        // "cuts a torn tail (erasing the junk after it)": nothing valid follows.
        (AtOrAboveFlushed, _, NothingValid, _, _) => Cut,
        // "With a flush mark, damage above the line followed by valid records is a
        // torn tail too: it is cut and the cut bytes are kept in
        // `<root>/lost+found/commitlog-<offset>`."
        (AtOrAboveFlushed, Marked, ValidRecord, _, _) => CutKeepInLostFound,
        // "Without a mark, such a hole (a damaged record with a zeroed 512-byte sector
        // part) followed by valid records is a torn tail when every byte after it lies
        // within one write pool of it [...]; it is cut and kept the same way."
        (AtOrAboveFlushed, CheckpointOnly, ValidRecord, WithinOnePool, ZeroedSector) => {
            CutKeepInLostFound
        }
        // "or, without a mark, is a fully written record that fails its checksum with
        // valid records after it: RocketMQ would silently truncate acknowledged data
        // there."
        (AtOrAboveFlushed, CheckpointOnly, ValidRecord, _, FullyWritten) => Refuse,
        // A hole whose data reaches a pool or more past it is not that torn tail: a
        // record after it was acknowledged, and its fdatasync covered the hole.
        (AtOrAboveFlushed, CheckpointOnly, ValidRecord, BeyondOnePool, ZeroedSector) => Refuse,
    }
}

impl Finding {
    /// Every finding there can be.
    pub(crate) fn all() -> impl Iterator<Item = Finding> {
        let positions = [Position::BelowFlushed, Position::AtOrAboveFlushed];
        let lines = [Line::Marked, Line::CheckpointOnly];
        let afters = [After::NothingValid, After::ValidRecord];
        let reaches = [Reach::WithinOnePool, Reach::BeyondOnePool];
        let damages = [Damage::ZeroedSector, Damage::FullyWritten];
        positions.into_iter().flat_map(move |position| {
            lines.into_iter().flat_map(move |line| {
                afters.into_iter().flat_map(move |after| {
                    reaches.into_iter().flat_map(move |reach| {
                        damages.into_iter().map(move |damage| Finding {
                            position,
                            line,
                            after,
                            reach,
                            damage,
                        })
                    })
                })
            })
        })
    }
}

/// The facts learnt so far about a damaged position (`None`: not learnt yet).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Known {
    pub position: Option<Position>,
    pub line: Option<Line>,
    pub after: Option<After>,
    pub reach: Option<Reach>,
    pub damage: Option<Damage>,
}

impl Known {
    /// The action, once [`decide`] gives the same one for every finding that agrees
    /// with what is known: the facts still unknown cannot change it.
    pub(crate) fn settled(&self) -> Option<Action> {
        let mut actions = Finding::all().filter(|f| self.admits(f)).map(decide);
        let first = actions.next()?;
        actions.all(|a| a == first).then_some(first)
    }

    fn admits(&self, f: &Finding) -> bool {
        self.position.is_none_or(|v| v == f.position)
            && self.line.is_none_or(|v| v == f.line)
            && self.after.is_none_or(|v| v == f.after)
            && self.reach.is_none_or(|v| v == f.reach)
            && self.damage.is_none_or(|v| v == f.damage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;
    use After::*;
    use Damage::*;
    use Line::*;
    use Position::*;
    use Reach::*;

    type Rule = fn(&Finding) -> bool;

    /// README's rules, written as predicates independently of `decide`'s patterns: one
    /// per row, with the action the README promises.
    const ROWS: [(&str, Rule, Action); 6] = [
        ("damage below the durable flushed offset", below, Refuse),
        ("torn tail: nothing valid after it", torn_tail, Cut),
        (
            "marked line: damage above it with valid records after",
            marked_tear,
            CutKeepInLostFound,
        ),
        (
            "checkpoint only: hole within one pool with valid records after",
            torn_hole,
            CutKeepInLostFound,
        ),
        (
            "checkpoint only: fully written damage with valid records after",
            written,
            Refuse,
        ),
        (
            "checkpoint only: hole with data beyond one pool",
            hole_beyond_pool,
            Refuse,
        ),
    ];

    fn below(f: &Finding) -> bool {
        f.position == BelowFlushed
    }
    fn torn_tail(f: &Finding) -> bool {
        f.position == AtOrAboveFlushed && f.after == NothingValid
    }
    fn marked_tear(f: &Finding) -> bool {
        f.position == AtOrAboveFlushed && f.line == Marked && f.after == ValidRecord
    }
    fn torn_hole(f: &Finding) -> bool {
        f.position == AtOrAboveFlushed
            && f.line == CheckpointOnly
            && f.after == ValidRecord
            && f.reach == WithinOnePool
            && f.damage == ZeroedSector
    }
    fn written(f: &Finding) -> bool {
        f.position == AtOrAboveFlushed
            && f.line == CheckpointOnly
            && f.after == ValidRecord
            && f.damage == FullyWritten
    }
    fn hole_beyond_pool(f: &Finding) -> bool {
        f.position == AtOrAboveFlushed
            && f.line == CheckpointOnly
            && f.after == ValidRecord
            && f.reach == BeyondOnePool
            && f.damage == ZeroedSector
    }

    /// Checks one row: it covers exactly `count` findings, each decided as promised.
    fn check_row(row: usize, count: usize) {
        let (name, rule, action) = ROWS[row];
        let covered: Vec<Finding> = Finding::all().filter(rule).collect();
        assert_eq!(covered.len(), count, "{name}: findings covered");
        for f in covered {
            assert_eq!(decide(f), action, "{name}: {f:?}");
        }
    }

    #[test]
    fn damage_below_the_flushed_offset_is_refused_whatever_follows() {
        check_row(0, 16);
    }

    #[test]
    fn damage_with_nothing_valid_after_it_is_cut() {
        check_row(1, 8);
    }

    #[test]
    fn with_a_mark_damage_above_the_line_before_valid_records_is_cut_and_kept() {
        check_row(2, 4);
    }

    #[test]
    fn without_a_mark_a_hole_within_one_pool_of_the_end_is_cut_and_kept() {
        check_row(3, 1);
    }

    #[test]
    fn without_a_mark_fully_written_damage_with_valid_records_after_is_refused() {
        check_row(4, 2);
    }

    #[test]
    fn without_a_mark_a_hole_with_data_beyond_one_pool_is_refused() {
        check_row(5, 1);
    }

    #[test]
    fn every_finding_matches_exactly_one_row() {
        assert_eq!(Finding::all().count(), 32);
        for f in Finding::all() {
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

    /// The scan learns facts in order and stops once settled: damage below the line
    /// needs no read past it, a tail with nothing valid after it no look beyond a
    /// pool, a marked line no reach and no read of the damaged bytes, and only a hole
    /// within one pool under a checkpoint-only line needs its bytes read.
    #[test]
    fn the_scan_learns_only_what_the_table_needs() {
        let mut k = Known::default();
        assert_eq!(k.settled(), None);
        k.position = Some(BelowFlushed);
        assert_eq!(k.settled(), Some(Refuse));
        k.position = Some(AtOrAboveFlushed);
        assert_eq!(k.settled(), None);
        for line in [Marked, CheckpointOnly] {
            k.line = Some(line);
            assert_eq!(k.settled(), None, "{line:?}");
            k.after = Some(NothingValid);
            assert_eq!(k.settled(), Some(Cut), "{line:?}");
            k.after = Some(ValidRecord);
            if line == Marked {
                assert_eq!(k.settled(), Some(CutKeepInLostFound));
                k.after = None;
                continue;
            }
            assert_eq!(k.settled(), None);
            k.reach = Some(BeyondOnePool);
            assert_eq!(k.settled(), Some(Refuse));
            k.reach = Some(WithinOnePool);
            assert_eq!(k.settled(), None);
            k.damage = Some(ZeroedSector);
            assert_eq!(k.settled(), Some(CutKeepInLostFound));
            k.damage = Some(FullyWritten);
            assert_eq!(k.settled(), Some(Refuse));
        }
    }
}
