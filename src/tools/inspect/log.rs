//! The CommitLog as the inspector reads it (RocketMQ's `CommitLog` and
//! `MappedFileQueue` files): segments listed and sized from the files themselves, and
//! [`walk_log`], a verifying walk over every record in log order.
//!
//! The walk verifies each record (body CRC, record CRC when present, PHYSICALOFFSET
//! equal to where it was read, lengths). A blank record jumps to the next segment; the
//! first header with magic 0 is the end of the log (never-written bytes); any other
//! failure is a [`Problem`] and ends the walk, as recovery would stop there.

use super::{offset_files, read_full_at};
use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::record::{self, Decoded, RecordView, Records, Verify};
use std::cell::RefCell;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Bytes read from a segment at a time while walking the log.
const READ_CHUNK: u64 = 4 << 20;

/// Something wrong at a commit-log offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub offset: u64,
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "commitlog offset {}: {}", self.offset, self.reason)
    }
}

/// The segments of a CommitLog, read with positioned reads.
pub struct LogFiles {
    dir: PathBuf,
    seg_bytes: u64,
    /// (start offset, path), sorted; a zero-length last file is left out.
    segments: Vec<(u64, PathBuf)>,
    /// Segments whose name or size break the layout rules.
    pub layout_problems: Vec<String>,
    open: RefCell<Option<(u64, File)>>,
}

impl LogFiles {
    /// Lists `root/commitlog/` and detects the segment size from the files.
    pub fn open(root: &Path) -> Result<LogFiles> {
        let dir = root.join("commitlog");
        let mut named = offset_files(&dir)?;
        let mut lens = Vec::with_capacity(named.len());
        for (_, path) in &named {
            lens.push(
                std::fs::metadata(path)
                    .map_err(|e| Error::io("stat", path, 0, e))?
                    .len(),
            );
        }
        if lens.last() == Some(&0) {
            // A segment created but never sized; RocketMQ deletes it at load.
            named.pop();
            lens.pop();
        }
        let seg_bytes = lens.first().copied().unwrap_or(0);
        let mut log = LogFiles {
            dir,
            seg_bytes,
            segments: named,
            layout_problems: Vec::new(),
            open: RefCell::new(None),
        };
        log.check_layout(&lens);
        Ok(log)
    }

    fn check_layout(&mut self, lens: &[u64]) {
        for ((start, path), len) in self.segments.iter().zip(lens) {
            if *len != self.seg_bytes || *len == 0 {
                self.layout_problems.push(format!(
                    "segment {} is {len} bytes; the first segment is {}",
                    path.display(),
                    self.seg_bytes
                ));
            } else if start.checked_rem(self.seg_bytes) != Some(0) {
                self.layout_problems.push(format!(
                    "segment {} starts at {start}, not a multiple of {len}",
                    path.display()
                ));
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Detected segment size (0 when there are no segments).
    pub fn segment_bytes(&self) -> u64 {
        self.seg_bytes
    }
    /// Start of the first segment (0 when there are none).
    pub fn min_offset(&self) -> u64 {
        self.segments.first().map(|s| s.0).unwrap_or(0)
    }
    pub fn segments(&self) -> &[(u64, PathBuf)] {
        &self.segments
    }

    /// Reads up to `len` bytes at log offset `off`, never past the end of the segment
    /// holding `off` (empty if no segment holds it).
    pub fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let Some((start, path)) = self.segment_of(off) else {
            return Ok(Vec::new());
        };
        let len = len.min((start + self.seg_bytes - off) as usize);
        let mut open = self.open.borrow_mut();
        if open.as_ref().map(|(s, _)| *s) != Some(start) {
            let file = File::open(&path).map_err(|e| Error::io("open", &path, 0, e))?;
            *open = Some((start, file));
        }
        let (_, file) = open.as_ref().expect("just opened");
        read_full_at(file, off - start, len).map_err(|e| Error::io("read", &path, off - start, e))
    }

    fn segment_of(&self, off: u64) -> Option<(u64, PathBuf)> {
        let i = self
            .segments
            .partition_point(|(s, _)| *s <= off)
            .checked_sub(1)?;
        let (start, path) = &self.segments[i];
        (off < start + self.seg_bytes).then(|| (*start, path.clone()))
    }

    /// Framing and, with `crc`, checksums of the record at `at`. Offline tools read
    /// any store, RocketMQ's without the record-CRC property included.
    pub(super) fn verify(&self, at: u64, crc: bool) -> Verify {
        let max = self.seg_bytes as usize;
        if crc {
            Verify::checksums(at, max, false)
        } else {
            Verify::framing(at, max)
        }
    }

    /// The verified bytes of the record at `at`, or why there is none.
    pub(super) fn read_record(&self, at: u64) -> std::result::Result<Vec<u8>, String> {
        let head = self.read_at(at, 8).map_err(|e| e.to_string())?;
        let (size, magic) =
            record::peek_header(&head).map_err(|_| "beyond the commit log".to_string())?;
        if magic != record::MAGIC_V1 && magic != record::MAGIC_V2 {
            return Err(format!("no record starts there (magic {magic:#010x})"));
        }
        if size <= 0 || size as u64 > self.seg_bytes {
            return Err(format!("record length {size} out of range"));
        }
        let raw = self.read_at(at, size as usize).map_err(|e| e.to_string())?;
        match record::decode(&raw, self.verify(at, true)) {
            Ok(Decoded::Record(_)) => Ok(raw),
            Ok(Decoded::Blank(_)) => Err("a blank record".into()),
            Err(e) => Err(format!("invalid record: {e}")),
        }
    }
}

/// A read-ahead window over one segment.
struct SegReader {
    file: File,
    path: PathBuf,
    start: u64,
    end: u64,
    buf: Vec<u8>,
    buf_at: u64,
}

impl SegReader {
    fn open(start: u64, path: &Path, seg_bytes: u64) -> Result<SegReader> {
        let file = File::open(path).map_err(|e| Error::io("open", path, 0, e))?;
        Ok(SegReader {
            file,
            path: path.to_path_buf(),
            start,
            end: start + seg_bytes,
            buf: Vec::new(),
            buf_at: start,
        })
    }

    /// `want` bytes at log offset `pos` (fewer only if the file is short).
    fn bytes(&mut self, pos: u64, want: u64) -> Result<&[u8]> {
        let want = want.min(self.end - pos);
        if pos < self.buf_at || pos + want > self.buf_at + self.buf.len() as u64 {
            let len = want.max(READ_CHUNK).min(self.end - pos) as usize;
            let at = pos - self.start;
            self.buf = read_full_at(&self.file, at, len)
                .map_err(|e| Error::io("read", &self.path, at, e))?;
            self.buf_at = pos;
        }
        let from = (pos - self.buf_at) as usize;
        let to = (from + want as usize).min(self.buf.len());
        Ok(&self.buf[from..to])
    }
}

/// Where a log walk ended and why.
#[derive(Debug, Clone, Default)]
pub struct LogWalk {
    pub log_min: u64,
    /// End of the valid records: the next byte a writer would use.
    pub log_end: u64,
    pub records: u64,
    /// At most one problem ends the walk; blank-size mismatches do not.
    pub problems: Vec<Problem>,
}

/// What the walk passes for each record: its offset, the decoded record and, for a
/// record whose checksum failed (the last one the walk reports), the failure.
pub type RecordVisit<'a, 'b> = (u64, &'a RecordView<'b>, Option<Corruption>);

impl LogWalk {
    fn problem(&mut self, offset: u64, reason: impl Into<String>) {
        let reason = reason.into();
        self.problems.push(Problem { offset, reason });
    }
}

/// Walks every record of the log in order, calling `visit` for each (see module docs).
pub fn walk_log(log: &LogFiles, mut visit: impl FnMut(RecordVisit<'_, '_>)) -> Result<LogWalk> {
    let min = log.min_offset();
    let mut w = LogWalk {
        log_min: min,
        log_end: min,
        ..Default::default()
    };
    for (start, path) in &log.segments {
        if *start != w.log_end {
            let why = format!(
                "segment {} is missing (the next one starts at {start})",
                w.log_end
            );
            w.problem(w.log_end, why);
            break;
        }
        if !walk_segment(log, *start, path, &mut w, &mut visit)? {
            break;
        }
    }
    Ok(w)
}

/// How a run of records read in one piece ended.
enum Step {
    /// The piece ended (or cut a record): read on from `w.log_end`.
    More,
    /// The segment's closing blank: go on in the next segment.
    Blank,
    /// The end of the log (never-written bytes) or a problem.
    End,
}

/// Walks one segment a piece at a time; `true` if the walk goes on into the next one.
fn walk_segment(
    log: &LogFiles,
    start: u64,
    path: &Path,
    w: &mut LogWalk,
    visit: &mut impl FnMut(RecordVisit<'_, '_>),
) -> Result<bool> {
    let mut rd = SegReader::open(start, path, log.seg_bytes)?;
    let seg_end = start + log.seg_bytes;
    w.log_end = start;
    loop {
        let pos = w.log_end;
        if pos == seg_end {
            return Ok(true);
        }
        // A piece holds at least the next record, however long it claims to be (a
        // length beyond the segment is cut to it and fails to decode).
        let head = rd.bytes(pos, record::END_FILE_MIN_BLANK_LENGTH as u64)?;
        let want = match record::peek_header(head) {
            Ok((size, _)) if size > 0 => READ_CHUNK.max(size as u64),
            _ => READ_CHUNK,
        };
        let piece = rd.bytes(pos, want)?;
        match walk_piece(log, piece, pos, seg_end, w, visit) {
            Step::More if w.log_end == pos => {
                // Not even the first record fits in what the segment holds.
                w.problem(pos, Corruption::Truncated.to_string());
                return Ok(false);
            }
            Step::More => {}
            Step::Blank => return Ok(true),
            Step::End => return Ok(false),
        }
    }
}

/// Visits the records back to back in `piece` (which starts at log offset `pos`),
/// advancing `w.log_end` past each.
fn walk_piece(
    log: &LogFiles,
    piece: &[u8],
    pos: u64,
    seg_end: u64,
    w: &mut LogWalk,
    visit: &mut impl FnMut(RecordVisit<'_, '_>),
) -> Step {
    for (at, decoded) in Records::new(piece, pos, log.verify(pos, true)) {
        let here = pos + at as u64;
        if seg_end - here < record::END_FILE_MIN_BLANK_LENGTH as u64 {
            w.problem(
                here,
                "a record ends fewer than 8 bytes before the segment end",
            );
            return Step::End;
        }
        match decoded {
            Ok(Decoded::Record(r)) => {
                visit((here, &r, None));
                w.records += 1;
                w.log_end = here + r.total_size as u64;
            }
            Ok(Decoded::Blank(n)) => {
                let left = seg_end - here;
                if n as u64 != left {
                    w.problem(
                        here,
                        format!("blank record claims {n} bytes but {left} remain in the segment"),
                    );
                }
                w.log_end = seg_end;
                return Step::Blank;
            }
            // Never-written bytes: the end of the log.
            Err(Corruption::BadMagic(0)) => return Step::End,
            // Cut by the end of the piece: read on from this record.
            Err(Corruption::Truncated) if here > pos => return Step::More,
            Err(e @ (Corruption::BodyCrc { .. } | Corruption::RecordCrc { .. })) => {
                let bytes = &piece[at..];
                if let Ok(Decoded::Record(r)) = record::decode(bytes, log.verify(here, false)) {
                    visit((here, &r, Some(e)));
                }
                w.problem(here, e.to_string());
                return Step::End;
            }
            Err(e) => {
                w.problem(here, e.to_string());
                return Step::End;
            }
        }
    }
    Step::More
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{RecordFields, encode};

    /// Records that straddle the walk's 4 MiB pieces, and one longer than a piece,
    /// are all visited; the zeros after them end the log without a problem.
    #[test]
    fn records_across_and_beyond_read_pieces_are_walked() {
        const SEGMENT: usize = 16 << 20;
        let host = "127.0.0.1:10911".parse().unwrap();
        let mut seg = Vec::with_capacity(SEGMENT);
        let mut sizes = Vec::new();
        for i in 0..2400u32 {
            let body = vec![
                i as u8;
                if i == 1000 {
                    4 << 20
                } else {
                    3000 + i as usize % 7
                }
            ];
            let f = RecordFields {
                topic: "T",
                queue_id: 0,
                flag: 0,
                queue_offset: i as i64,
                phys_offset: seg.len() as i64,
                sys_flag: 0,
                born_timestamp: 1,
                born_host: host,
                store_timestamp: 2,
                store_host: host,
                reconsume_times: 0,
                prepared_transaction_offset: 0,
                body: &body,
                properties: b"",
                record_crc: true,
            };
            let before = seg.len();
            encode(&f, &mut seg);
            sizes.push((before as u64, (seg.len() - before) as u32));
        }
        let end = seg.len() as u64;
        assert!(end > 2 * READ_CHUNK && end < SEGMENT as u64);
        seg.resize(SEGMENT, 0);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("commitlog")).unwrap();
        std::fs::write(
            dir.path().join("commitlog").join(format!("{:020}", 0)),
            &seg,
        )
        .unwrap();

        let log = LogFiles::open(dir.path()).unwrap();
        let mut seen = Vec::new();
        let walk = walk_log(&log, |(off, r, c)| {
            assert!(c.is_none());
            seen.push((off, r.total_size));
        })
        .unwrap();
        assert_eq!(walk.problems, Vec::new());
        assert_eq!(walk.log_end, end);
        assert_eq!(seen, sizes);
    }
}
