//! The timer's sorted runs and their manifest: coremq's stand-in for RocketMQ 5's
//! `TimerLog` (an append-only file of 52-byte records, each chained to the previous
//! record of the same one-second slot).
//!
//! A run is a file of [`Entry`]s sorted by key, written once, read once from the start
//! (each run's reader holds one [`READ_CHUNK`]), and removed when every entry has gone.
//! Why sorted runs rather than RocketMQ's chains: a chain is walked one dependent random
//! read per message, which under direct I/O (no page cache) costs a device read each
//! (about 100 us here, 10,000 messages a second at best); a run is read sequentially.
//!
//! Files in `<shard root>/coremq_timer/` (not RocketMQ's `timerlog/`, so a RocketMQ
//! store's timer files are never touched):
//! * `run-<id>`: entries, 24 bytes each (due ms i64, timer-queue offset u64, log
//!   offset u64, little-endian), zero-padded to a page;
//! * `manifest`: text, replaced atomically: `coremq-timer 1`, `scan <offset>`, then
//!   `run <id> <entries>` per live run. Invariant: every timer-queue entry below
//!   `scan` that is not yet delivered is in a listed run. A run file is listed only
//!   once written and synced; a file not listed is left from a crash and removed at
//!   open.

use crate::error::{Error, Result};
use crate::io::{Disk, File, PAGE, align_up};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Bytes of one entry on disk.
pub(crate) const ENTRY: usize = 24;
/// Bytes a run's reader reads at a time (2,730 entries; the memory a run costs).
pub(crate) const READ_CHUNK: usize = 64 * 1024;
/// Bytes a run's writer gathers before a write.
const WRITE_CHUNK: usize = 1 << 20;
const MAGIC: &str = "coremq-timer 1";

/// One timed message: due at `due` (ms), entry `offset` of the timer queue, its record at
/// log offset `phys`. Ordered by (due, offset): the timer's delivery order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Entry {
    pub due: i64,
    pub offset: u64,
    pub phys: u64,
}

impl Entry {
    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.due.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.phys.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Entry {
        let word = |i: usize| <[u8; 8]>::try_from(&b[i..i + 8]).expect("8 bytes");
        Entry {
            due: i64::from_le_bytes(word(0)),
            offset: u64::from_le_bytes(word(8)),
            phys: u64::from_le_bytes(word(16)),
        }
    }
}

pub(crate) fn run_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("run-{id}"))
}

/// Writes one run, entries in key order.
pub(crate) struct RunWriter {
    file: Rc<File>,
    id: u64,
    buf: Vec<u8>,
    pos: u64,
    count: u64,
    last: Option<Entry>,
}

impl RunWriter {
    pub(crate) async fn create(disk: &Disk, dir: &Path, id: u64) -> Result<RunWriter> {
        let path = run_path(dir, id);
        let file = disk.open(&path, true).await?;
        file.truncate(0).await?;
        Ok(RunWriter {
            file,
            id,
            buf: Vec::with_capacity(WRITE_CHUNK),
            pos: 0,
            count: 0,
            last: None,
        })
    }

    pub(crate) async fn push(&mut self, e: Entry) -> Result<()> {
        debug_assert!(self.last.is_none_or(|l| l <= e), "a run is sorted");
        self.last = Some(e);
        let at = self.buf.len();
        self.buf.resize(at + ENTRY, 0);
        e.encode(&mut self.buf[at..]);
        self.count += 1;
        if self.buf.len() + ENTRY > WRITE_CHUNK {
            let whole = self.buf.len() / PAGE * PAGE;
            self.file
                .write_aligned(self.pos, &self.buf[..whole])
                .await?;
            self.pos += whole as u64;
            self.buf.drain(..whole);
        }
        Ok(())
    }

    /// Writes the rest and syncs: the run may now be listed in the manifest.
    pub(crate) async fn finish(mut self) -> Result<(u64, u64)> {
        if !self.buf.is_empty() {
            self.buf.resize(align_up(self.buf.len() as u64) as usize, 0);
            self.file.write_aligned(self.pos, &self.buf).await?;
        }
        self.file.sync().await?;
        Ok((self.id, self.count))
    }
}

/// Reads one run from its start, a chunk at a time. Invariant (outside `fill`): an
/// unfinished run has its next entry in `buf`.
pub(crate) struct Run {
    pub id: u64,
    pub count: u64,
    file: Rc<File>,
    /// Entries read from the file so far.
    read: u64,
    buf: VecDeque<Entry>,
}

impl Run {
    pub(crate) async fn open(disk: &Disk, dir: &Path, id: u64, count: u64) -> Result<Run> {
        let file = disk.open(&run_path(dir, id), false).await?;
        let mut r = Run {
            id,
            count,
            file,
            read: 0,
            buf: VecDeque::new(),
        };
        r.fill().await?;
        Ok(r)
    }

    async fn fill(&mut self) -> Result<()> {
        if !self.buf.is_empty() || self.read == self.count {
            return Ok(());
        }
        let n = ((READ_CHUNK / ENTRY) as u64).min(self.count - self.read) as usize;
        let at = self.read * ENTRY as u64;
        let data = self.file.read(at, n * ENTRY).await?;
        let bytes: &[u8] = &data;
        if bytes.len() < n * ENTRY {
            return Err(Error::BadLayout {
                path: self.file.path.clone(),
                why: format!(
                    "timer run {} is short: the manifest lists {} entries, the file ends \
                     before entry {} (byte {at})",
                    self.id,
                    self.count,
                    self.read + (bytes.len() / ENTRY) as u64
                ),
            });
        }
        self.buf
            .extend(bytes[..n * ENTRY].chunks_exact(ENTRY).map(Entry::decode));
        self.read += n as u64;
        Ok(())
    }

    pub(crate) fn head(&self) -> Option<Entry> {
        self.buf.front().copied()
    }

    /// Takes the head; reads the next chunk when the buffer runs dry.
    pub(crate) async fn pop(&mut self) -> Result<Option<Entry>> {
        let e = self.buf.pop_front();
        self.fill().await?;
        Ok(e)
    }

    pub(crate) fn finished(&self) -> bool {
        self.buf.is_empty() && self.read == self.count
    }

    /// Entries not taken yet.
    pub(crate) fn remaining(&self) -> u64 {
        self.count - self.read + self.buf.len() as u64
    }
}

/// What the manifest says (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub scan: u64,
    /// (id, entries) per live run.
    pub runs: Vec<(u64, u64)>,
}

impl Manifest {
    pub(crate) fn encode(&self) -> String {
        let mut s = format!("{MAGIC}\nscan {}\n", self.scan);
        for (id, n) in &self.runs {
            s.push_str(&format!("run {id} {n}\n"));
        }
        s
    }

    pub(crate) fn decode(text: &str) -> std::result::Result<Manifest, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("the first line is not {MAGIC:?}"));
        }
        let mut m = Manifest::default();
        let mut scan = None;
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            let num = |s: &str| {
                s.parse::<u64>()
                    .map_err(|_| format!("{s:?} is not a number in line {line:?}"))
            };
            match words.as_slice() {
                ["scan", n] => scan = Some(num(n)?),
                ["run", id, n] => m.runs.push((num(id)?, num(n)?)),
                [] => {}
                _ => return Err(format!("line {line:?} is not understood")),
            }
        }
        m.scan = scan.ok_or("no scan line")?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_manifests_round_trip() {
        let e = Entry {
            due: -5,
            offset: u64::MAX - 1,
            phys: 1 << 60,
        };
        let mut b = [0u8; ENTRY];
        e.encode(&mut b);
        assert_eq!(Entry::decode(&b), e);
        let m = Manifest {
            scan: 77,
            runs: vec![(3, 10), (9, 65_536)],
        };
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        assert!(
            Manifest::decode("coremq-timer 1\nrun 1 2\n").is_err(),
            "no scan"
        );
        assert!(Manifest::decode("something else\nscan 1\n").is_err());
        assert!(Manifest::decode("coremq-timer 1\nscan x\n").is_err());
    }

    #[test]
    fn a_run_reads_back_in_order_across_chunks() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let dir = tempfile::tempdir().unwrap();
                let disk = Disk::Real;
                // glommio's iopoll probe needs a written block read back first (`io`).
                disk.prime_executor(dir.path()).await.unwrap();
                let n = (READ_CHUNK / ENTRY) as u64 * 2 + 17;
                let mut w = RunWriter::create(&disk, dir.path(), 4).await.unwrap();
                for i in 0..n {
                    w.push(Entry {
                        due: i as i64 * 3,
                        offset: i,
                        phys: i * 100,
                    })
                    .await
                    .unwrap();
                }
                assert_eq!(w.finish().await.unwrap(), (4, n));
                let mut r = Run::open(&disk, dir.path(), 4, n).await.unwrap();
                for i in 0..n {
                    assert_eq!(r.remaining(), n - i);
                    let e = r.pop().await.unwrap().unwrap();
                    assert_eq!((e.due, e.offset, e.phys), (i as i64 * 3, i, i * 100));
                }
                assert!(r.finished());
                // A run listed longer than its file is an error naming it.
                let err = match Run::open(&disk, dir.path(), 4, n + 10_000).await {
                    Ok(mut r) => loop {
                        match r.pop().await {
                            Err(e) => break e,
                            Ok(None) => panic!("read past the file's end"),
                            Ok(Some(_)) => {}
                        }
                    },
                    Err(e) => e,
                };
                assert!(err.to_string().contains("run-4"), "{err}");
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
