//! The timer's pending set: coremq's stand-in for RocketMQ 5's `TimerWheel` (a slot per
//! second holding the chain heads of `TimerLog`). It answers one question, "which timed
//! message is due first", in memory bounded by configuration:
//! * up to `cap` entries in a min-heap in memory (`ScheduleConfig::timer_memory_entries`,
//!   24 bytes each);
//! * when the heap is full, its later-due half is written as a sorted run
//!   (`runs.rs`) and leaves memory, so the near future stays in memory;
//! * more than [`MAX_RUNS`] runs are merged into one (sequential reads and writes).
//!
//! Memory: `cap` x 24 bytes + [`MAX_RUNS`] x [`READ_CHUNK`] (64 KiB) at most, whatever
//! the number pending (the default 262,144 entries: 6 MiB + 1 MiB).
//!
//! Only [`Pending::save`] changes what is on disk beyond new run files: it writes the
//! manifest, then removes the files of runs it no longer lists. The caller makes every
//! delivery so far durable before it saves (an entry leaves the manifest's cover only
//! when the log says it was delivered: `mod.rs`).

use super::runs::{Entry, Manifest, READ_CHUNK, Run, RunWriter, run_path};
use crate::error::{Error, Result};
use crate::io::Disk;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;

/// Runs kept before they are merged into one.
pub(crate) const MAX_RUNS: usize = 16;

pub(crate) struct Pending {
    disk: Disk,
    dir: PathBuf,
    cap: usize,
    memory: BinaryHeap<Reverse<Entry>>,
    runs: Vec<Run>,
    next_id: u64,
    /// Runs gone (finished or merged) whose files the next save removes.
    dropped: Vec<u64>,
    /// The run list changed since the last save.
    dirty: bool,
    /// What the last saved manifest said.
    saved: Manifest,
}

impl Pending {
    /// Opens the pending set in `dir`: the runs its manifest lists (other files there are
    /// left from a crash and removed). Returns it with the manifest's scan offset (0 when
    /// there is none): the caller reads the timer queue again from there.
    pub(crate) async fn open(disk: &Disk, dir: PathBuf, cap: usize) -> Result<(Pending, u64)> {
        disk.create_dir_all(&dir)?;
        let path = dir.join("manifest");
        let manifest = match disk.read_file(&path)? {
            None => Manifest::default(),
            Some(bytes) => Manifest::decode(&String::from_utf8_lossy(&bytes)).map_err(|why| {
                Error::BadLayout {
                    path: path.clone(),
                    why: format!("the timer manifest does not parse: {why}"),
                }
            })?,
        };
        let mut runs = Vec::new();
        for &(id, count) in &manifest.runs {
            let r = Run::open(disk, &dir, id, count).await?;
            if !r.finished() {
                runs.push(r);
            }
        }
        let mut next_id = manifest
            .runs
            .iter()
            .map(|(id, _)| id + 1)
            .max()
            .unwrap_or(0);
        for e in disk.list_dir(&dir)? {
            let Some(id) = e
                .name
                .strip_prefix("run-")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            next_id = next_id.max(id + 1);
            if !manifest.runs.iter().any(|(r, _)| *r == id) {
                tracing::info!(file = %e.name, "timer: removing a run left unlisted by a crash");
                disk.remove_file(&dir.join(&e.name))?;
            }
        }
        let scan = manifest.scan;
        let p = Pending {
            disk: disk.clone(),
            dir,
            cap: cap.max(2),
            memory: BinaryHeap::new(),
            runs,
            next_id,
            dropped: Vec::new(),
            dirty: false,
            saved: manifest,
        };
        Ok((p, scan))
    }

    /// Entries pending (in memory and in runs; a run may still hold delivered ones
    /// until it is read past them).
    pub(crate) fn len(&self) -> u64 {
        self.memory.len() as u64 + self.runs.iter().map(Run::remaining).sum::<u64>()
    }

    pub(crate) fn in_memory(&self) -> usize {
        self.memory.len()
    }

    pub(crate) fn runs(&self) -> usize {
        self.runs.len()
    }

    /// The first entry due.
    pub(crate) fn peek(&self) -> Option<Entry> {
        let mem = self.memory.peek().map(|r| r.0);
        self.runs.iter().filter_map(Run::head).chain(mem).min()
    }

    /// Takes the first entry due.
    pub(crate) async fn pop(&mut self) -> Result<Option<Entry>> {
        let Some(first) = self.peek() else {
            return Ok(None);
        };
        if self.memory.peek().map(|r| r.0) == Some(first) {
            return Ok(self.memory.pop().map(|r| r.0));
        }
        let i = self
            .runs
            .iter()
            .position(|r| r.head() == Some(first))
            .expect("the first entry is in a run");
        let e = self.runs[i].pop().await?;
        if self.runs[i].finished() {
            let r = self.runs.remove(i);
            self.dropped.push(r.id);
            self.dirty = true;
        }
        Ok(e)
    }

    /// Adds an entry; a full memory spills its later half to a new run (not listed in the
    /// manifest until the next save, which the caller makes after this returns `true`).
    pub(crate) async fn insert(&mut self, e: Entry) -> Result<bool> {
        self.memory.push(Reverse(e));
        if self.memory.len() < self.cap {
            return Ok(false);
        }
        let mut all: Vec<Entry> = std::mem::take(&mut self.memory)
            .into_iter()
            .map(|r| r.0)
            .collect();
        all.sort_unstable();
        let keep = all.len() / 2;
        let mut w = self.writer().await?;
        for e in &all[keep..] {
            w.push(*e).await?;
        }
        all.truncate(keep);
        self.memory = all.into_iter().map(Reverse).collect();
        self.add_run(w).await?;
        if self.runs.len() > MAX_RUNS {
            self.merge().await?;
        }
        Ok(true)
    }

    async fn writer(&mut self) -> Result<RunWriter> {
        let id = self.next_id;
        self.next_id += 1;
        RunWriter::create(&self.disk, &self.dir, id).await
    }

    async fn add_run(&mut self, w: RunWriter) -> Result<()> {
        let (id, count) = w.finish().await?;
        self.runs
            .push(Run::open(&self.disk, &self.dir, id, count).await?);
        self.dirty = true;
        Ok(())
    }

    /// Merges every run into one (what is left of each).
    async fn merge(&mut self) -> Result<()> {
        let mut w = self.writer().await?;
        let mut old = std::mem::take(&mut self.runs);
        tracing::debug!(runs = old.len(), "timer: merging runs");
        while let Some((i, _)) = old
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.head().map(|h| (i, h)))
            .min_by_key(|(_, h)| *h)
        {
            let e = old[i].pop().await?.expect("a head");
            w.push(e).await?;
        }
        self.dropped.extend(old.iter().map(|r| r.id));
        self.add_run(w).await
    }

    /// The smallest timer-queue offset held in memory.
    pub(crate) fn memory_min_offset(&self) -> Option<u64> {
        self.memory.iter().map(|r| r.0.offset).min()
    }

    /// Forgets every entry (runs go at the next save).
    pub(crate) fn clear(&mut self) {
        self.memory.clear();
        self.dropped.extend(self.runs.drain(..).map(|r| r.id));
        self.dirty = true;
    }

    /// Whether a save would write something new for `scan`.
    pub(crate) fn needs_save(&self, scan: u64) -> bool {
        self.dirty || scan != self.saved.scan
    }

    /// Writes the manifest (scan offset `scan`: the caller's, lowered to what memory
    /// holds) and removes dropped runs' files. The caller has made every delivery so far
    /// durable (module docs).
    pub(crate) async fn save(&mut self, scan: u64) -> Result<()> {
        let m = Manifest {
            scan,
            runs: self.runs.iter().map(|r| (r.id, r.count)).collect(),
        };
        if m == self.saved && self.dropped.is_empty() {
            return Ok(());
        }
        let dir = self.dir.clone();
        let text = m.encode();
        let dropped = std::mem::take(&mut self.dropped);
        self.disk
            .off_executor(move |d| {
                d.replace_file(&dir.join("manifest"), text.as_bytes())?;
                for id in dropped {
                    d.remove_file(&run_path(&dir, id))?;
                }
                d.sync_dir(&dir)
            })
            .await?;
        self.saved = m;
        self.dirty = false;
        Ok(())
    }
}

/// The bound on one shard's timer memory in bytes with `cap` entries in memory
/// (module docs): for logs and benches.
pub fn memory_bound(cap: usize) -> usize {
    cap * std::mem::size_of::<Entry>() + MAX_RUNS * READ_CHUNK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(due: i64, offset: u64) -> Entry {
        Entry {
            due,
            offset,
            phys: offset * 10,
        }
    }

    #[test]
    fn spills_and_merges_keep_key_order_and_survive_reopen() {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async {
                let dir = tempfile::tempdir().unwrap();
                let d = dir.path().join("t");
                let disk = Disk::Real;
                // glommio's iopoll probe needs a written block read back first (`io`).
                disk.prime_executor(dir.path()).await.unwrap();
                let (mut p, scan) = Pending::open(&disk, d.clone(), 8).await.unwrap();
                assert_eq!(scan, 0);
                // Enough inserts for MAX_RUNS + 1 spills: a merge happens.
                let n = 8 / 2 * (MAX_RUNS as u64 + 3) + 5;
                let mut rng = 7u64;
                let mut want = Vec::new();
                for i in 0..n {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let x = e((rng >> 40) as i64 % 1000, i);
                    want.push(x);
                    p.insert(x).await.unwrap();
                    assert!(p.in_memory() < 8);
                    assert!(p.runs() <= MAX_RUNS);
                }
                assert_eq!(p.len(), n);
                want.sort();
                // Take a third, save (scan = everything read), reopen: the runs come
                // back; memory does not (the caller reads the queue again from `scan`).
                let mut got = Vec::new();
                for _ in 0..n / 3 {
                    got.push(p.pop().await.unwrap().unwrap());
                }
                assert_eq!(got, want[..got.len()]);
                let scan = p.memory_min_offset().unwrap_or(n).min(n);
                p.save(scan).await.unwrap();
                let in_memory: Vec<Entry> = p.memory.iter().map(|r| r.0).collect();
                drop(p);
                std::fs::write(d.join("run-999"), b"left by a crash").unwrap();
                let (mut p, scan2) = Pending::open(&disk, d.clone(), 8).await.unwrap();
                assert_eq!(scan2, scan);
                assert!(!d.join("run-999").exists(), "an unlisted run is removed");
                for x in in_memory {
                    p.insert(x).await.unwrap();
                }
                let mut rest = Vec::new();
                while let Some(x) = p.pop().await.unwrap() {
                    rest.push(x);
                }
                // Runs are read from their start again: entries taken before the save
                // come back, and the caller skips them (keys at or below its last).
                let last = *got.last().unwrap();
                rest.retain(|x| *x > last);
                assert_eq!(rest, want[got.len()..]);
                p.save(n).await.unwrap();
                let files = std::fs::read_dir(&d).unwrap().count();
                assert_eq!(files, 1, "only the manifest is left");
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
