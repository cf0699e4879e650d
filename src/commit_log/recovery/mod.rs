//! Recovery of the log: RocketMQ's `CommitLog.recoverNormally` (after a clean shutdown)
//! and `recoverAbnormally` (when `abort` exists), with one difference that matters:
//! RocketMQ truncates everything after the first bad record, acknowledged data
//! included; this refuses to open instead, unless the damage is a torn tail.
//!
//! [`CommitLog::recover`] verifies (checksums, self-offsets) every record from the
//! checkpoint's safe point, and at least from the start of the segment holding the
//! last flushed byte (RocketMQ re-checks its last files too), then judges the first
//! damaged position by the decision table in [`table`]: cut it, cut it and keep the
//! bytes in `lost+found/`, or refuse. The refuse line is the durable flushed offset:
//! the higher of the checkpoint's and the flush mark's (`flush_mark.rs`), which the
//! writer keeps as it flushes; recovery leaves the mark at the end it keeps. The
//! records go, as they are verified, to a
//! [`RecordSink`] (the store's queues and key index: each record dispatched once, from
//! each structure's own resume point), from the caller's `replay_from`, which may lie
//! below the verified part (records there are decoded, not checksummed: the checkpoint
//! vouched for them). Reads go through a [`LogReader`] (8 reads of 1 MiB in flight).
//!
//! Invariants: nothing on disk changes before the judgement (a refusal leaves the
//! store as it found it); what recovery keeps is fdatasynced before the flush mark,
//! and then the caller's checkpoint, say so; cut bytes kept in `lost+found/` never
//! overwrite an earlier file there (a crash while zeroing and a second recovery
//! would keep less); the positions (`written`, `committed`, `flushed`) all
//! start at the end kept, and segments past it are removed.

mod table;

use super::{CommitLog, LogReader};
use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::record::{self, Decoded, RecordView, Verify};
use crate::io::{self, align_down, align_up};
use std::future::Future;
use std::path::PathBuf;
use table::{Action, After, Damage, Known, Line, Position, Reach};

/// The unit a torn write leaves old or new: a device's logical sector.
const SECTOR: u64 = 512;

/// What recovery found at the end of the log.
#[derive(Debug, Clone, Default)]
pub struct ScanReport {
    pub records: u64,
    pub end: u64,
    /// Set when a torn tail was cut: (offset, what was wrong there, bytes zeroed).
    pub truncated: Option<(u64, Corruption, u64)>,
    /// Set when a record below the verified part could not be decoded (the replay
    /// start was not a record boundary, or the log is damaged there): the sink got
    /// nothing from there on, and the caller must rebuild from the log's start.
    pub replay_failed: Option<(u64, Corruption)>,
}

/// Where [`CommitLog::recover`] starts and what it may trust.
#[derive(Debug, Clone, Copy)]
pub struct RecoverPlan {
    /// Verify (checksums, self-offsets) from here: the checkpoint's safe point.
    pub scan_from: u64,
    /// Records below this were durable: damage there is refused. The higher of the
    /// checkpoint's flushed offset and the flush mark's.
    pub durable_below: u64,
    /// `durable_below` is backed by a flush mark: nothing above it was acknowledged
    /// as durable (sync mode: but for the mark's lag). Without one (a RocketMQ store,
    /// an older coremq store, a lost mark) a hole is taken as torn only within one
    /// pool of the data's end (the table's `Reach`).
    pub marked: bool,
    /// The checkpoint of a clean shutdown: never-written bytes exactly at
    /// `durable_below` are the normal end of the log.
    pub trust_end: bool,
    /// Hand records to the sink from here (a record boundary; may lie below
    /// `scan_from`, where the structures being rebuilt resume).
    pub replay_from: u64,
}

/// Takes the records recovery reads, in log order, while the scan reads them (so a
/// rebuild costs no second pass over the log).
pub trait RecordSink {
    /// The record at log offset `pos` (`r.phys_offset == pos`).
    fn record(&mut self, pos: u64, r: &RecordView<'_>) -> impl Future<Output = Result<()>>;
}

/// The first damaged position of the verified part, and what the plan says about it.
#[derive(Debug, Clone, Copy)]
struct Damaged {
    at: u64,
    /// What the decoder said (for the report and the error).
    kind: Corruption,
    /// Where the damaged record ends by its own length fields, when they agree with
    /// each other (its framing decodes; only its checksums fail).
    framed_end: Option<u64>,
    durable_below: u64,
    marked: bool,
    trust_end: bool,
}

impl Damaged {
    /// The table's [`Position`]: a record starting below the line counts as below it
    /// (a durable, acknowledged record) unless its consistent length says it reaches
    /// past the line, which then lies inside it: its tail was never durable.
    fn position(&self) -> Position {
        let ends_below = self.framed_end.is_none_or(|end| end <= self.durable_below);
        if self.at < self.durable_below && ends_below {
            Position::BelowFlushed
        } else {
            Position::AtOrAboveFlushed
        }
    }
}

/// What the look past a damaged position found.
#[derive(Debug, Clone, Copy)]
struct Look {
    /// The first valid record after the damage.
    valid_at: Option<u64>,
    /// The last non-zero byte seen after the damage (up to the read holding the valid
    /// record, when one was found).
    last_nonzero: Option<u64>,
}

impl Look {
    /// Where the data after the damage ends: past its last non-zero byte, and past
    /// the valid record's first byte.
    fn data_end(&self) -> Option<u64> {
        let past_nonzero = self.last_nonzero.map(|l| l + 1);
        past_nonzero.max(self.valid_at.map(|v| v + 1))
    }
}

impl CommitLog {
    /// Recovery: scans from `plan.scan_from` (and at least the segment holding the
    /// last flushed byte) to find the end of valid data, cuts a torn tail or refuses
    /// damage (module docs), and hands every record from `plan.replay_from` to `sink`
    /// as the scan reads it, so whatever the caller rebuilds from the log (queues, key
    /// index) costs no second read. Only records before the end that recovery keeps
    /// reach the sink; an error from the sink ends the scan with it.
    pub async fn recover<S: RecordSink>(
        &self,
        plan: RecoverPlan,
        sink: &mut S,
    ) -> Result<ScanReport> {
        // Re-verify at least the segment holding the last flushed byte on every open
        // (RocketMQ re-checks its last files too): damage there is refused, not served.
        let min_offset = self.min_offset();
        let verify_from = self
            .segment_start(plan.durable_below.saturating_sub(1))
            .max(min_offset);
        let scan_from = plan.scan_from.max(min_offset).min(verify_from);
        let replay_from = plan.replay_from.max(min_offset);
        let mut report = ScanReport::default();
        if let Some((at, kind, framed_end)) =
            self.walk(scan_from, replay_from, sink, &mut report).await?
        {
            let damaged = Damaged {
                at,
                kind,
                framed_end,
                durable_below: plan.durable_below,
                marked: plan.marked,
                trust_end: plan.trust_end,
            };
            self.judge(damaged, &mut report).await?;
        }
        self.set_end(report.end).await?;
        // What recovery kept may not have been fdatasync'ed before the crash; make it
        // durable before the flush mark and the checkpoint say it is.
        let mut seg = self.segment_start(scan_from);
        while seg <= self.segment_start(report.end) {
            if let Some(f) = self.segment_file(seg) {
                f.sync().await?;
            }
            seg += self.seg_bytes;
        }
        if !self.mark.says(report.end) {
            self.write_flush_mark(report.end).await?;
        }
        Ok(report)
    }

    /// Walks the records from `min(from, replay_from)`, verifying those at or after
    /// `from` and handing those at or after `replay_from` to `sink`; sets `report.end`
    /// to where valid data ends and returns the damage found there, if any (`None`:
    /// the log ends at a missing segment), with where the damaged record ends by its
    /// framing when that decodes.
    async fn walk<S: RecordSink>(
        &self,
        from: u64,
        replay_from: u64,
        sink: &mut S,
        report: &mut ScanReport,
    ) -> Result<Option<(u64, Corruption, Option<u64>)>> {
        let max_total = self.cfg.max_record_bytes();
        let start = replay_from.min(from);
        let mut pos = start;
        let limit = self.last_segment().map_or(start, |s| s + self.seg_bytes);
        let mut reader = LogReader::new(self, start, limit);
        let walked = async {
            loop {
                let seg = self.segment_start(pos);
                // Below `from` the records are only replayed for the sink.
                let verified = pos >= from;
                let feed = pos >= replay_from && report.replay_failed.is_none();
                let bad = if self.segment_file(seg).is_none() {
                    if verified {
                        return Ok(None);
                    }
                    Some((pos, Corruption::Truncated, None))
                } else {
                    let seg_end = seg + self.seg_bytes;
                    let room = (seg_end - pos) as usize;
                    let buf = reader.record(pos, room, max_total).await?;
                    let verify = if verified {
                        Verify::checksums(pos, max_total, self.requires_crc(pos))
                    } else {
                        Verify::framing(pos, max_total)
                    };
                    match record::decode(buf, verify) {
                        Ok(Decoded::Record(r)) => {
                            if verified {
                                if r.record_crc_verified == Some(true)
                                    && self.crc_required_from.get() == u64::MAX
                                {
                                    // Without a checkpoint, learn from the log: once a
                                    // record carries the record-CRC property, all later
                                    // ones must.
                                    self.crc_required_from.set(pos);
                                }
                                report.records += 1;
                            }
                            self.last_put_ts.set(r.store_timestamp);
                            if feed {
                                sink.record(pos, &r).await?;
                            }
                            pos += r.total_size as u64;
                            // RocketMQ never writes a record this close to the end.
                            (pos + record::END_FILE_MIN_BLANK_LENGTH as u64 > seg_end).then_some((
                                pos,
                                Corruption::BadLength(r.total_size as i64),
                                None,
                            ))
                        }
                        Ok(Decoded::Blank(n)) if pos + n as u64 == seg_end => {
                            pos = seg_end;
                            None
                        }
                        Ok(Decoded::Blank(n)) => Some((pos, Corruption::BadLength(n as i64), None)),
                        Err(e) => {
                            // Where the record ends by its own, consistent lengths.
                            let framed_end =
                                match record::decode(buf, Verify::framing(pos, max_total)) {
                                    Ok(Decoded::Record(r)) if verified => {
                                        Some(pos + r.total_size as u64)
                                    }
                                    _ => None,
                                };
                            Some((pos, e, framed_end))
                        }
                    }
                };
                let Some((at, kind, framed_end)) = bad else {
                    continue;
                };
                if at >= from {
                    return Ok(Some((at, kind, framed_end)));
                }
                // Below the verified part: the replay start was no record boundary or
                // the log is damaged where the checkpoint vouched for it. Not this
                // scan's to judge: verify from `from` as without a replay; the caller
                // rebuilds from the log's first record (which refuses real damage).
                tracing::warn!(
                    offset = at, %kind, verified_from = from,
                    "recovery replay met an undecodable record below the verified part; \
                     the rebuild falls back to the whole log"
                );
                report.replay_failed = Some((at, kind));
                pos = from;
            }
        }
        .await;
        reader.finish().await;
        report.end = pos;
        walked
    }

    /// Judges the first damaged position by the table: learns the facts it needs, in
    /// order and only until they settle the action, then cuts (zeroing the bytes from
    /// the damage to the end of the data after it, and keeping them first when the
    /// table says so) or refuses.
    async fn judge(&self, d: Damaged, report: &mut ScanReport) -> Result<()> {
        let mut known = Known {
            position: Some(d.position()),
            line: Some(if d.marked {
                Line::Marked
            } else {
                Line::CheckpointOnly
            }),
            ..Known::default()
        };
        let mut look = None;
        if known.settled().is_none() {
            let l = self.look_past(d, &mut look).await?;
            known.after = Some(match l.valid_at {
                Some(_) => After::ValidRecord,
                None => After::NothingValid,
            });
        }
        if known.settled().is_none() {
            let l = self.look_past(d, &mut look).await?;
            known.reach = Some(self.reach(d.at, l).await?);
        }
        if known.settled().is_none() {
            let l = self.look_past(d, &mut look).await?;
            known.damage = Some(self.damage(d.at, l).await?);
        }
        let action = known
            .settled()
            .expect("every fact learnt settles the table");
        if action == Action::Refuse {
            return Err(self.refusal(d, look));
        }
        let l = self.look_past(d, &mut look).await?;
        if l.data_end().is_none() {
            // Only zeros after the damage: the log simply ends there.
            return Ok(());
        }
        let seg_end = self.segment_start(d.at) + self.seg_bytes;
        let kept = match action {
            Action::CutKeepInLostFound => {
                // Everything after the damage, later segments included (in async mode
                // a flush interval of data: streamed, not held in memory).
                let all = self.last_data(d.at, u64::MAX).await?.unwrap_or(d.at + 1);
                Some(self.quarantine(d.at, all).await?)
            }
            _ => None,
        };
        // Later segments go first, then the damaged one's tail is zeroed: a crash in
        // between leaves less after the damage, never more (the next recovery's look
        // past it can only find fewer valid records, and no data farther away).
        self.remove_segments_past(d.at)?;
        let zeroed = match self.last_data(d.at, seg_end).await? {
            Some(end) => self.zero_range(d.at, end).await?,
            None => 0,
        };
        report.truncated = Some((d.at, d.kind, zeroed));
        match kept {
            Some(kept) => tracing::error!(
                offset = d.at, kind = %d.kind, valid_at = ?l.valid_at, zeroed, kept = %kept.display(),
                "commit log: cut a torn tail that had valid records after the damage (unsynced \
                 writes torn by a power loss, above the durable line); the cut bytes are kept"
            ),
            None => {
                tracing::warn!(offset = d.at, kind = %d.kind, zeroed, "commit log: cut a torn tail")
            }
        }
        Ok(())
    }

    /// The error that refuses to open at the damage (nothing was changed).
    fn refusal(&self, d: Damaged, look: Option<Look>) -> Error {
        let at = d.at;
        let line = if d.marked {
            "durable flushed offset (flush mark)"
        } else {
            "checkpointed flushed offset"
        };
        let detail = if d.position() == Position::BelowFlushed {
            format!(
                "commit-log offset {at} is below the {line} {}: \
                 acknowledged data is damaged; refusing to truncate it",
                d.durable_below
            )
        } else if let Some(valid_at) = look.and_then(|l| l.valid_at) {
            format!(
                "commit-log offset {at} is damaged but a valid record follows at {valid_at}: \
                 interior corruption; refusing to truncate acknowledged data"
            )
        } else {
            format!("commit-log offset {at} is damaged; refusing to truncate it")
        };
        let seg = self.segment_start(at);
        Error::Corrupt {
            path: self.segment_path(seg),
            offset: at - seg,
            kind: d.kind,
            detail: Some(detail),
        }
    }

    /// Looks past the damage for a valid record and the last non-zero byte, once (the
    /// result is kept in `look`). Never-written bytes exactly where a clean shutdown's
    /// checkpoint says the log ends are the normal end: only later segments need a
    /// look (cheap: holes are skipped). Anything else gets the full look from the byte
    /// after the damage.
    async fn look_past(&self, d: Damaged, look: &mut Option<Look>) -> Result<Look> {
        if let Some(l) = *look {
            return Ok(l);
        }
        let clean_end = d.kind == Corruption::BadMagic(0) && d.trust_end && d.at == d.durable_below;
        let from = if clean_end {
            self.segment_start(d.at) + self.seg_bytes
        } else {
            d.at + 1
        };
        let (valid_at, last_nonzero) = self.resync_scan(from).await?;
        let l = Look {
            valid_at,
            last_nonzero,
        };
        *look = Some(l);
        Ok(l)
    }

    /// How far the data after the damage at `at` reaches (table's [`Reach`]).
    async fn reach(&self, at: u64, look: Look) -> Result<Reach> {
        let pool = self.buf_bytes * self.cfg.write_buffer_count as u64;
        let near = look.data_end().is_none_or(|end| end - at <= pool);
        Ok(if near && !self.any_data_from(at + pool).await? {
            Reach::WithinOnePool
        } else {
            Reach::BeyondOnePool
        })
    }

    /// What the damaged bytes look like (table's [`Damage`]): `[at, the valid record)`,
    /// or up to the end of the data after it (at least one sector) when none follows.
    async fn damage(&self, at: u64, look: Look) -> Result<Damage> {
        let to = look.valid_at.or(look.data_end()).unwrap_or(at + SECTOR);
        Ok(if self.has_zero_sector(at, to).await? {
            Damage::ZeroedSector
        } else {
            Damage::FullyWritten
        })
    }

    /// Whether some 512-byte sector's part inside `[from, to)` (at least 8 bytes) is
    /// all zeros: the mark of a sector that kept its old contents in a torn write
    /// (a bit flip cannot zero a run of bytes).
    async fn has_zero_sector(&self, from: u64, to: u64) -> Result<bool> {
        let buf = self.read_files(from, (to - from) as usize).await?;
        let mut pos = from;
        while pos < from + buf.len() as u64 {
            let end = ((pos / SECTOR + 1) * SECTOR).min(from + buf.len() as u64);
            let part = &buf[(pos - from) as usize..(end - from) as usize];
            if part.len() >= 8 && part.iter().all(|b| *b == 0) {
                return Ok(true);
            }
            pos = end;
        }
        Ok(false)
    }

    /// Whether any non-zero byte of the log lies at or after `from` (holes skipped).
    async fn any_data_from(&self, from: u64) -> Result<bool> {
        let chunk = 1 << 20;
        let starts: Vec<u64> = self
            .segments
            .borrow()
            .keys()
            .copied()
            .filter(|s| s + self.seg_bytes > from)
            .collect();
        for seg in starts {
            let mut pos = from.max(seg);
            while pos < seg + self.seg_bytes {
                match self
                    .cfg
                    .disk
                    .next_data(&self.segment_path(seg), pos - seg)?
                {
                    None => break,
                    Some(d) => pos = pos.max(seg + d),
                }
                if pos >= seg + self.seg_bytes {
                    break;
                }
                let n = chunk.min((seg + self.seg_bytes - pos) as usize);
                if self.read_files(pos, n).await?.iter().any(|b| *b != 0) {
                    return Ok(true);
                }
                pos += n as u64;
            }
        }
        Ok(false)
    }

    /// Copies `[from, to)` of the log to `<root>/lost+found/commitlog-<from>` (durably)
    /// before recovery erases it, 8 MiB at a time. An earlier file of that name is
    /// kept (a crash while cutting after it was written leaves less to copy the next
    /// time): the copy goes to `commitlog-<from>.<n>`, the first `n` free.
    async fn quarantine(&self, from: u64, to: u64) -> Result<PathBuf> {
        let dir = self.cfg.root.join("lost+found");
        if !self.cfg.disk.exists(&dir) {
            self.cfg.disk.create_dir_all(&dir)?;
            self.cfg.disk.sync_dir(&self.cfg.root)?;
        }
        let name = format!("commitlog-{}", io::offset_name(from));
        let mut path = dir.join(&name);
        let mut n = 0;
        while self.cfg.disk.exists(&path) {
            n += 1;
            path = dir.join(format!("{name}.{n}"));
        }
        let file = self.cfg.disk.open(&path, true).await?;
        let chunk = 8 << 20;
        let mut off = 0;
        while from + off < to {
            let n = chunk.min(to - from - off);
            let mut data = self.read_files(from + off, n as usize).await?;
            // Past a missing segment: zeros (the copy keeps log offsets).
            data.resize(align_up(n) as usize, 0);
            file.write_aligned(off, &data).await?;
            off += n;
        }
        file.truncate(to - from).await?;
        file.sync().await?;
        self.cfg.disk.sync_dir(&dir)?;
        Ok(path)
    }

    /// Where the log's data in `[from, to)` ends: one past its last non-zero byte, or
    /// `None` when it holds only zeros (holes skipped; the last segment with data is
    /// the only one read through).
    async fn last_data(&self, from: u64, to: u64) -> Result<Option<u64>> {
        let chunk = 8 << 20;
        let starts: Vec<u64> = self
            .segments
            .borrow()
            .keys()
            .copied()
            .filter(|s| s + self.seg_bytes > from && *s < to)
            .collect();
        for seg in starts.into_iter().rev() {
            let seg_to = to.min(seg + self.seg_bytes);
            let mut pos = from.max(seg);
            let mut last = None;
            while pos < seg_to {
                match self
                    .cfg
                    .disk
                    .next_data(&self.segment_path(seg), pos - seg)?
                {
                    None => break,
                    Some(d) => pos = pos.max(seg + d),
                }
                if pos >= seg_to {
                    break;
                }
                let n = chunk.min(seg_to - pos);
                let buf = self.read_files(pos, n as usize).await?;
                if let Some(i) = buf.iter().rposition(|b| *b != 0) {
                    last = Some(pos + i as u64 + 1);
                }
                pos += n;
            }
            if last.is_some() {
                return Ok(last);
            }
        }
        Ok(None)
    }

    /// Looks past a bad record for any valid record (which would make the damage
    /// interior) and for the last non-zero byte (junk to erase). Reads the rest of the
    /// bad record's segment and every later segment, skipping holes, and stops at the
    /// first valid record.
    async fn resync_scan(&self, from: u64) -> Result<(Option<u64>, Option<u64>)> {
        let max_total = self.cfg.max_record_bytes();
        let chunk = 8 << 20;
        let end = self.last_segment().unwrap_or(0) + self.seg_bytes;
        let mut pos = from;
        let mut last_nonzero = None;
        let magic_v1 = record::MAGIC_V1.to_be_bytes();
        let magic_v2 = record::MAGIC_V2.to_be_bytes();
        while pos < end {
            let seg = self.segment_start(pos);
            let seg_end = seg + self.seg_bytes;
            if self.segment_file(seg).is_none() {
                pos = seg_end;
                continue;
            }
            // Skip holes: a sparse segment's unwritten part cannot hide a record.
            match self
                .cfg
                .disk
                .next_data(&self.segment_path(seg), pos - seg)?
            {
                None => {
                    pos = seg_end;
                    continue;
                }
                Some(d) => pos = pos.max(seg + d),
            }
            if pos >= seg_end {
                continue;
            }
            let len = ((seg_end - pos) as usize).min(chunk + max_total);
            let buf = self.read_files(pos, len).await?;
            if let Some(i) = buf.iter().rposition(|b| *b != 0) {
                last_nonzero = Some(pos + i as u64);
            }
            let scan_len = buf.len().min(chunk);
            let mut i = 0;
            while i < scan_len {
                let Some(j) = buf[i..scan_len].iter().position(|b| *b == 0xDA) else {
                    break;
                };
                // A record's magic (0xDAA320A7 or 0xDAA320A8) sits 4 bytes in.
                let p = i + j;
                if p >= 4 && (buf[p..].starts_with(&magic_v1) || buf[p..].starts_with(&magic_v2)) {
                    let at = pos + (p - 4) as u64;
                    let verify = Verify::checksums(at, max_total, self.requires_crc(at));
                    if let Ok(Decoded::Record(_)) = record::decode(&buf[p - 4..], verify) {
                        return Ok((Some(at), last_nonzero));
                    }
                }
                i = p + 1;
            }
            pos += scan_len.max(1) as u64;
        }
        Ok((None, last_nonzero))
    }

    /// Overwrites `[from, to)` with zeros on disk, keeping the bytes before `from` in
    /// its page. Returns the bytes zeroed.
    async fn zero_range(&self, from: u64, to: u64) -> Result<u64> {
        let mut pos = align_down(from);
        let head = self.read_files(pos, (from - pos) as usize).await?;
        let mut first = true;
        while pos < to {
            let seg = self.segment_start(pos);
            let seg_end = seg + self.seg_bytes;
            let len = ((align_up(to) - pos) as usize)
                .min(8 << 20)
                .min((seg_end - pos) as usize);
            let Some(file) = self.segment_file(seg) else {
                break;
            };
            let mut data = vec![0u8; len];
            if first {
                data[..head.len()].copy_from_slice(&head);
                first = false;
            }
            file.write_aligned(pos - seg, &data).await?;
            file.sync().await?;
            pos += len as u64;
        }
        Ok(to - from)
    }

    /// Sets every position to `end` after recovery, drops segments past it, and loads
    /// the write buffer holding `end` so the next commit can rewrite its partial page.
    async fn set_end(&self, end: u64) -> Result<()> {
        self.remove_segments_past(end)?;
        self.written.set(end);
        self.committed.set(end);
        self.flushed.set(end);
        let win_start = end / self.buf_bytes * self.buf_bytes;
        let prefix = self
            .read_files(win_start, (end - win_start) as usize)
            .await?;
        self.pool
            .borrow_mut()
            .start_at(self.cfg.write_buffer_count, end, &prefix);
        Ok(())
    }
}
