//! Segment recycling: retired commit-log segments kept as zero-filled spares and
//! renamed into place as the next segments. It stands in for RocketMQ's
//! `AllocateMappedFileService` (which creates and warms the next mapped file ahead of
//! the writer), fed by deleted segments instead of new files; RocketMQ itself deletes
//! them (`MappedFile.destroy`).
//!
//! Why: a write into blocks the file system has not allocated yet makes its fdatasync
//! journal the allocation too (4 KiB write + fdatasync here: ~130 us into written
//! blocks, 210-300 us when it allocates). The prewriter (`prewrite.rs`) zero-fills a
//! fresh sparse segment ahead of the writer for that reason, with allocating writes and
//! an fdatasync per chunk beside the rounds; a recycled segment's blocks are already
//! allocated and written, so it needs neither. Off by default
//! (`commit_log_spare_segments` = 0); `scripts/bench.sh` scenario 3c compares the two.
//!
//! Layout: `<shard>/spare/<20-digit start it had>.dirty` (retired, old records inside)
//! and `.ready` (zero-filled and synced). RocketMQ never looks in `spare/`, and a spare
//! enters `commitlog/` only zero-filled: to RocketMQ (and to recovery, whose rule is
//! that never-written bytes read as zeros) it is a fresh, warmed file.
//!
//! Steps, each durable before the next:
//! 1. Retire: rename `commitlog/<seg>` to `spare/<seg>.dirty`, sync both directories.
//!    Only while fewer than `commit_log_spare_segments` spares exist and the disk is
//!    below `disk_max_used_space_ratio` (space pressure deletes, and drops spares).
//! 2. Zero (a background task, one 1 MiB write in flight): overwrite the whole file
//!    with zeros, fdatasync, rename to `.ready`, sync the directory.
//! 3. Reuse: rename `spare/<x>.ready` to `commitlog/<start>`, sync both directories,
//!    then write to it.
//!
//! Invariant: a spare has exactly one name. A crash between a rename and both directory
//! syncs can leave a file under its old and its new name (the simulated disk keeps each
//! entry old or new independently); at open, a spare with more than one link loses its
//! spare name (the other name is a live segment, or another name of the same spare),
//! as does a spare of the wrong size or an unknown name. So the zeroer never writes a
//! file that is also a segment, and a segment is never handed out twice.

use super::CommitLog;
use crate::config::StoreConfig;
use crate::error::Result;
use crate::io::{self, File};
use std::cell::RefCell;
use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Size of one zero-fill write.
const ZERO_UNIT: u64 = 1 << 20;

/// The spare segments of one log (module docs).
pub(super) struct Spares {
    dir: PathBuf,
    max: usize,
    /// Zero-filled, synced, ready to be renamed into place.
    ready: RefCell<Vec<PathBuf>>,
    /// Retired, still holding old records.
    dirty: RefCell<VecDeque<PathBuf>>,
    /// The spare the zeroer is writing (counted against `max`).
    zeroing: RefCell<Option<PathBuf>>,
    wake: crate::wake::Notify,
    /// Segments taken from `ready` in this run: zero-filled already, the prewriter
    /// skips them.
    taken: RefCell<BTreeSet<u64>>,
    /// Segments created as new files, and taken from the spares, in this run.
    pub(super) created: std::cell::Cell<u64>,
    reused: std::cell::Cell<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Dirty,
    Ready,
}

fn parse_name(name: &str) -> Option<State> {
    let (num, ext) = name.split_once('.')?;
    if num.len() != 20 || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match ext {
        "dirty" => Some(State::Dirty),
        "ready" => Some(State::Ready),
        _ => None,
    }
}

impl Spares {
    /// Lists and checks `<root>/spare` (module docs: the one-name rule); removes every
    /// spare when recycling is off. Runs at open, before anything else writes.
    pub(super) fn open(cfg: &StoreConfig) -> Result<Spares> {
        let dir = cfg.root.join("spare");
        let max = cfg.commit_log_spare_segments;
        let mut ready = Vec::new();
        let mut dirty = VecDeque::new();
        let mut removed = 0;
        for e in cfg.disk.list_dir(&dir)? {
            let why = if e.is_dir {
                Some("a directory")
            } else {
                match parse_name(&e.name) {
                    None => Some("not a spare's name"),
                    Some(_) if cfg.disk.link_count(&e.path)? > 1 => {
                        Some("it has another name (a rename cut by a crash)")
                    }
                    Some(_) if cfg.disk.file_len(&e.path)? != cfg.commit_log_segment_bytes => {
                        Some("not of the segment size")
                    }
                    Some(_) if ready.len() + dirty.len() >= max => Some("over the spare limit"),
                    Some(State::Ready) => {
                        ready.push(e.path.clone());
                        None
                    }
                    Some(State::Dirty) => {
                        dirty.push_back(e.path.clone());
                        None
                    }
                }
            };
            if let Some(why) = why {
                tracing::info!(path = %e.path.display(), why, "removing a spare segment");
                if e.is_dir {
                    cfg.disk.remove_dir_all(&e.path)?;
                } else {
                    cfg.disk.remove_file(&e.path)?;
                }
                removed += 1;
            }
        }
        if removed > 0 {
            cfg.disk.sync_dir(&dir)?;
        }
        if max > 0 {
            cfg.disk.create_dir_all(&dir)?;
        }
        Ok(Spares {
            dir,
            max,
            ready: RefCell::new(ready),
            dirty: RefCell::new(dirty),
            zeroing: RefCell::new(None),
            wake: Default::default(),
            taken: RefCell::new(BTreeSet::new()),
            created: Default::default(),
            reused: Default::default(),
        })
    }

    fn count(&self) -> usize {
        self.ready.borrow().len()
            + self.dirty.borrow().len()
            + usize::from(self.zeroing.borrow().is_some())
    }

    /// (ready, being zeroed or waiting for it).
    pub(super) fn counts(&self) -> (usize, usize) {
        let ready = self.ready.borrow().len();
        (ready, self.count() - ready)
    }
}

impl CommitLog {
    /// Whether the segment at `start` was zero-filled when it was taken (the prewriter
    /// has nothing to do there).
    pub(super) fn segment_prezeroed(&self, start: u64) -> bool {
        self.spares.taken.borrow().contains(&start)
    }

    /// Segments (created as new files, taken from the spares) since the log opened.
    pub fn segment_counts(&self) -> (u64, u64) {
        (self.spares.created.get(), self.spares.reused.get())
    }

    /// Spare segments: (zero-filled and ready, still to be zero-filled).
    pub fn spare_segments(&self) -> (usize, usize) {
        self.spares.counts()
    }

    /// Whether a segment retired now would be kept as a spare (`space_pressure`: the
    /// disk is over `disk_max_used_space_ratio`, so it goes).
    pub(super) fn keeps_spare(&self, space_pressure: bool) -> bool {
        !space_pressure && self.spares.count() < self.spares.max
    }

    /// Step 1 (module docs), off the executor: moves the retired segment file to
    /// `spare/` and syncs both directories; the zeroer takes it from there.
    pub(super) async fn retire_to_spare(&self, seg: u64, path: PathBuf) -> Result<()> {
        let to = self
            .spares
            .dir
            .join(format!("{}.dirty", io::offset_name(seg)));
        let (dir, spare_dir, to2) = (self.dir.clone(), self.spares.dir.clone(), to.clone());
        self.cfg
            .disk
            .off_executor(move |d| {
                d.rename(&path, &to2)?;
                d.sync_dir(&spare_dir)?;
                d.sync_dir(&dir)
            })
            .await?;
        self.spares.dirty.borrow_mut().push_back(to);
        self.spares.taken.borrow_mut().remove(&seg);
        self.spares.wake.notify();
        Ok(())
    }

    /// Step 3 (module docs): a ready spare renamed to the segment at `start` and
    /// opened, or `None` when there is none (or the rename failed: the caller creates
    /// a new file, which a spare left there by a half-done rename also satisfies).
    pub(super) async fn take_spare(&self, start: u64) -> Option<Rc<File>> {
        let from = self.spares.ready.borrow_mut().pop()?;
        let to = self.segment_path(start);
        let (dir, spare_dir, from2, to2) = (
            self.dir.clone(),
            self.spares.dir.clone(),
            from.clone(),
            to.clone(),
        );
        let moved = self
            .cfg
            .disk
            .off_executor(move |d| {
                d.rename(&from2, &to2)?;
                d.sync_dir(&dir)?;
                d.sync_dir(&spare_dir)
            })
            .await;
        let opened = match moved {
            Ok(()) => self.cfg.disk.open(&to, false).await,
            Err(e) => Err(e),
        };
        match opened {
            Ok(f) => {
                self.spares.taken.borrow_mut().insert(start);
                self.spares.reused.set(self.spares.reused.get() + 1);
                tracing::debug!(from = %from.display(), to = %to.display(), "reused a spare segment");
                Some(f)
            }
            Err(e) => {
                tracing::warn!(from = %from.display(), to = %to.display(), error = %e,
                    "could not reuse a spare segment; creating a new one");
                None
            }
        }
    }

    /// Wakes the zeroer (to see that the log stops).
    pub(super) fn wake_spare_zeroer(&self) {
        self.spares.wake.notify();
    }

    /// Deletes every spare not being zeroed (the disk is short of space).
    pub async fn drop_spares(&self) -> Result<usize> {
        let mut doomed: Vec<PathBuf> = self.spares.ready.borrow_mut().drain(..).collect();
        doomed.extend(self.spares.dirty.borrow_mut().drain(..));
        if doomed.is_empty() {
            return Ok(0);
        }
        let n = doomed.len();
        let dir = self.spares.dir.clone();
        self.cfg
            .disk
            .off_executor(move |d| {
                for p in &doomed {
                    d.remove_file(p)?;
                }
                d.sync_dir(&dir)
            })
            .await?;
        tracing::info!(
            spares = n,
            "deleted spare segments: the disk is short of space"
        );
        Ok(n)
    }

    /// Step 2 (module docs): the zeroer task, until the log stops. A spare it cannot
    /// zero is deleted (the log is correct without spares).
    pub(super) async fn run_spare_zeroer(self: Rc<Self>) {
        let mut zeros = glommio::allocate_dma_buffer(ZERO_UNIT as usize);
        zeros.as_bytes_mut().fill(0);
        let zeros = Rc::new(zeros);
        loop {
            if self.stopping.get() {
                return;
            }
            let Some(path) = self.spares.dirty.borrow_mut().pop_front() else {
                self.spares.wake.wait().await;
                continue;
            };
            *self.spares.zeroing.borrow_mut() = Some(path.clone());
            let result = self.zero_spare(&path, &zeros).await;
            self.spares.zeroing.borrow_mut().take();
            match result {
                Ok(Some(ready)) => self.spares.ready.borrow_mut().push(ready),
                // Stopped midway: the next open resumes it.
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e,
                        "zero-filling a spare segment failed; deleting it");
                    let dir = self.spares.dir.clone();
                    let _ = self
                        .cfg
                        .disk
                        .off_executor(move |d| {
                            d.remove_file(&path)?;
                            d.sync_dir(&dir)
                        })
                        .await;
                }
            }
        }
    }

    /// Zero-fills the spare at `path`, syncs it and renames it `.ready`; `None` when
    /// the log stopped first.
    async fn zero_spare(
        &self,
        path: &Path,
        zeros: &Rc<glommio::io::DmaBuffer>,
    ) -> Result<Option<PathBuf>> {
        let file = self.cfg.disk.open(path, false).await?;
        let mut pos = 0;
        while pos < self.seg_bytes {
            if self.stopping.get() {
                return Ok(None);
            }
            let n = ZERO_UNIT.min(self.seg_bytes - pos);
            if n == ZERO_UNIT {
                file.write_rc(pos, zeros.clone()).await?;
            } else {
                let mut b = glommio::allocate_dma_buffer(n as usize);
                b.as_bytes_mut().fill(0);
                file.write_buf(pos, b).await?;
            }
            pos += n;
        }
        file.sync().await?;
        drop(file);
        let ready = path.with_extension("ready");
        let (from, to, dir) = (path.to_path_buf(), ready.clone(), self.spares.dir.clone());
        self.cfg
            .disk
            .off_executor(move |d| {
                d.rename(&from, &to)?;
                d.sync_dir(&dir)
            })
            .await?;
        tracing::debug!(path = %ready.display(), "spare segment zero-filled");
        Ok(Some(ready))
    }
}
