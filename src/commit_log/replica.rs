//! The log's two ends of replication: RocketMQ's `CommitLog.appendData` (a slave
//! appending its master's bytes, `DefaultMessageStore.appendToCommitLog`) and
//! `getData` (a master reading what it sends), here over the write buffers.
//!
//! **Out** ([`CommitLog::read_committed`]): a master sends only committed bytes
//! (RocketMQ's read position under the TransientStorePool is the commit position), and
//! never across a segment's end. Committed bytes are in their files, so a master
//! killed with `kill -9` still has every byte any slave received; in sync-flush mode
//! `committed == flushed`, so after a power loss too.
//!
//! **In** ([`CommitLog::append_replica`]): the slave's log must be byte-identical to
//! its master's, blanks and their tails included, so nothing is re-encoded: bytes are
//! appended where they lie, at `written`. Before any byte is accepted, every record is
//! decoded with its checksums (body CRC, and the record-CRC property this log requires
//! at that offset) and its self-offset, as recovery does, and must end at least 8 bytes
//! before its segment's end; a blank must end exactly at its segment's end (a master
//! with another segment size fails here, naming both sizes). Only whole records (and
//! whole blank tails) are appended, so `written` is always a record boundary or a
//! segment's start, as after a put; the caller keeps a cut record until the rest of it
//! arrives. A refusal appends nothing of the bad record or after it.
//!
//! An empty log may start over at a later segment ([`CommitLog::restart_empty_at`]):
//! a new slave receives its master's last segment onward, so its log begins there.

use super::CommitLog;
use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::record::{self, Decoded, Verify};
use bytes::Bytes;

/// What [`CommitLog::append_replica`] took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAppend {
    /// Bytes appended (whole records and blank tails) from the start of the input.
    pub consumed: usize,
    /// Store timestamp of the last record appended (0 when none).
    pub last_store_ts: i64,
}

impl CommitLog {
    /// Up to `max` committed bytes at `from`, cut at the segment's end; `None` when
    /// nothing is committed there yet.
    pub async fn read_committed(&self, from: u64, max: usize) -> Result<Option<Bytes>> {
        let seg_end = self.segment_start(from) + self.seg_bytes;
        let end = self
            .committed
            .get()
            .min(seg_end)
            .min(from.saturating_add(max as u64));
        if end <= from {
            return Ok(None);
        }
        Ok(Some(self.read(from, (end - from) as usize).await?))
    }

    /// Appends the whole records and blank tails at the start of `bytes`, which are the
    /// log's bytes from `written` on (module docs). Returns what was taken; the rest is
    /// a cut record (or blank tail) to complete with later bytes. An error names the
    /// first bad record; nothing from it on was appended.
    pub async fn append_replica(&self, bytes: &[u8]) -> Result<ReplicaAppend> {
        let max_total = self.cfg.max_record_bytes();
        let mut done = ReplicaAppend {
            consumed: 0,
            last_store_ts: 0,
        };
        while done.consumed < bytes.len() {
            let at = self.written.get();
            let rest = &bytes[done.consumed..];
            // Records are batched up to a write buffer's size per reservation.
            let (take, ts) = self.check_replica(at, rest, max_total)?;
            if take == 0 {
                break;
            }
            self.reserve_at_written(take as u64).await?;
            if self.written.get() != at {
                return Err(Error::Failed(format!(
                    "replica append at {at}: the log moved to {} meanwhile",
                    self.written.get()
                )));
            }
            let ts = if ts == 0 { self.last_put_ts.get() } else { ts };
            self.append(at, &rest[..take], ts);
            done.consumed += take;
            if ts != 0 {
                done.last_store_ts = ts;
            }
        }
        Ok(done)
    }

    /// How many leading bytes of `rest` (log offset `at`) are whole, valid records, at
    /// most one write buffer's worth, or one whole blank tail; and the store timestamp
    /// of the last record among them.
    fn check_replica(&self, at: u64, rest: &[u8], max_total: usize) -> Result<(usize, i64)> {
        let seg_end = self.segment_start(at) + self.seg_bytes;
        let mut take = 0usize;
        let mut ts = 0;
        while take < rest.len() {
            let pos = at + take as u64;
            let buf = &rest[take..];
            let Ok((size, magic)) = record::peek_header(buf) else {
                break;
            };
            if magic == record::BLANK_MAGIC {
                if take > 0 {
                    // The blank tail goes alone, after the records before it.
                    break;
                }
                let n = size.max(0) as u64;
                if n < record::END_FILE_MIN_BLANK_LENGTH as u64 || pos + n != seg_end {
                    return Err(self.refused(
                        pos,
                        Corruption::BadLength(size as i64),
                        format!(
                            "a blank record of {size} bytes at {pos} must end at its segment's \
                             end {seg_end}: the master's commit-log segments are not \
                             {} bytes (commit_log_segment_bytes must be the same on both)",
                            self.seg_bytes
                        ),
                    ));
                }
                if n as usize > max_total + record::END_FILE_MIN_BLANK_LENGTH {
                    return Err(self.refused(
                        pos,
                        Corruption::BadLength(size as i64),
                        format!(
                            "a blank tail of {n} bytes is longer than any record this store accepts"
                        ),
                    ));
                }
                if (buf.len() as u64) < n {
                    break;
                }
                return Ok((n as usize, 0));
            }
            let verify = Verify::checksums(pos, max_total, self.requires_crc(pos));
            let r = match record::decode(buf, verify) {
                Ok(Decoded::Record(r)) => r,
                Ok(Decoded::Blank(_)) => unreachable!("blank handled above"),
                // Wait for the rest of a cut record, if the header says it is one.
                Err(Corruption::Truncated)
                    if size as usize >= record::MIN_RECORD_LEN && size as usize <= max_total =>
                {
                    break;
                }
                Err(kind) => {
                    let hint = if kind == Corruption::MissingRecordCrc {
                        "; a slave of a master that does not write the record-CRC property \
                         (RocketMQ's default) needs record_crc = false"
                    } else {
                        ""
                    };
                    return Err(self.refused(
                        pos,
                        kind,
                        format!("replicated record at {pos} fails its checks{hint}"),
                    ));
                }
            };
            let end = pos + r.total_size as u64;
            if end + record::END_FILE_MIN_BLANK_LENGTH as u64 > seg_end {
                return Err(self.refused(
                    pos,
                    Corruption::BadLength(r.total_size as i64),
                    format!(
                        "replicated record at {pos} ends at {end}, too close to its segment's \
                         end {seg_end} (the master's segments are not {} bytes?)",
                        self.seg_bytes
                    ),
                ));
            }
            if take > 0 && take + r.total_size as usize > self.buf_bytes as usize {
                break;
            }
            ts = r.store_timestamp;
            take += r.total_size as usize;
        }
        Ok((take, ts))
    }

    fn refused(&self, at: u64, kind: Corruption, detail: String) -> Error {
        let (path, offset) = self.locate(at);
        Error::Corrupt {
            path,
            offset,
            kind,
            detail: Some(detail),
        }
    }

    /// Whether the log holds no byte (nothing appended since it began).
    pub fn is_empty(&self) -> bool {
        self.written.get() == self.min_offset.get() && self.segments.borrow().is_empty()
    }

    /// Makes an empty log begin at `start`, a segment's first byte past its current
    /// start: a new slave receives its master's last segment onward (module docs).
    pub fn restart_empty_at(&self, start: u64) -> Result<()> {
        let now = self.min_offset.get();
        if !self.is_empty() || start <= now || !start.is_multiple_of(self.seg_bytes) {
            return Err(Error::BadRequest(format!(
                "cannot start the log in {} at {start}: it must be empty (it ends at {}) \
                 and {start} a segment start past {now}",
                self.dir.display(),
                self.written.get()
            )));
        }
        debug_assert!(self.group_commit.borrow().is_none());
        self.min_offset.set(start);
        self.written.set(start);
        self.committed.set(start);
        self.flushed.set(start);
        self.pool.borrow_mut().restart_at(start);
        tracing::info!(dir = %self.dir.display(), start, "empty commit log now starts at its master's segment");
        Ok(())
    }
}
