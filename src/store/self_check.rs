//! The periodic self-check: RocketMQ's `DefaultMessageStore.checkSelf`
//! (`MappedFileQueue.checkSelf` on the CommitLog, every ConsumeQueue and the index),
//! which logs when a queue's mapped files are not contiguous. Here, for the log, every
//! queue and the index, what the store holds is compared with itself and with the
//! directory:
//! * the log's segments follow each other from the minimum with no gap, the last
//!   holds the write position, and each is on disk at the segment size;
//! * each queue's files follow each other from its minimum, its bounds lie within
//!   them, and each is on disk at the file size;
//! * each index file held is on disk;
//! * a file on disk in those directories below what is held (left behind by a
//!   deletion) is reported too. Files past the last one held are not: the writer
//!   and the flushers create them ahead.
//!
//! It never changes anything: each problem is logged at warn and counted
//! (`StoreStats::self_check_problems`, `/metrics`). It runs in the cleaner's task,
//! under its pass lock (no deletion runs meanwhile), every
//! `RetentionConfig::self_check_interval` (60 s), and on request
//! ([`Store::self_check`]). Directory listings and sizes are read off the executor.

use super::{Inner, Store};
use crate::error::Result;
use crate::io::offset_name;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What a self-check found: one line per problem (empty: all is well).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelfCheckReport {
    pub problems: Vec<String>,
    /// Files looked at (held, or on disk).
    pub files: usize,
}

/// One directory to compare: the file names held, in order, and the size each must
/// have (`None`: any).
struct Dir {
    what: String,
    dir: PathBuf,
    held: Vec<String>,
    size: Option<u64>,
}

/// Reads each directory's names and the held files' sizes, off the executor.
/// A directory's names, and the sizes of the files held in it.
type Listing = (BTreeSet<String>, Vec<Option<u64>>);

fn list(disk: &crate::io::Disk, dirs: &[Dir]) -> Result<Vec<Listing>> {
    let mut out = Vec::new();
    for d in dirs {
        let names: BTreeSet<String> = if disk.exists(&d.dir) {
            disk.list_dir(&d.dir)?
                .into_iter()
                .filter(|e| !e.is_dir)
                .map(|e| e.name)
                .collect()
        } else {
            BTreeSet::new()
        };
        let sizes = d
            .held
            .iter()
            .map(|n| disk.file_len(&d.dir.join(n)).ok())
            .collect();
        out.push((names, sizes));
    }
    Ok(out)
}

impl Inner {
    /// The checks (module docs); the caller holds the cleaner's pass lock.
    pub(crate) async fn self_check(&self) -> Result<SelfCheckReport> {
        let mut problems = Vec::new();
        let mut dirs = Vec::new();
        // The log.
        let log = &self.log;
        let seg = log.segment_bytes();
        let starts = log.segment_starts();
        let (min, written) = (log.min_offset(), log.written());
        if let Some(&first) = starts.first() {
            if first != min / seg * seg {
                problems.push(format!(
                    "commit log: first segment {first} is not the one holding the minimum {min}"
                ));
            }
            for w in starts.windows(2) {
                if w[1] != w[0] + seg {
                    problems.push(format!(
                        "commit log: gap between segments {} and {}",
                        w[0], w[1]
                    ));
                }
            }
            let last = *starts.last().unwrap_or(&first);
            if written > last + seg {
                problems.push(format!(
                    "commit log: write position {written} is past the last segment {last}"
                ));
            }
        } else if written > min {
            problems.push(format!(
                "commit log: no segment, but data from {min} to {written}"
            ));
        }
        dirs.push(Dir {
            what: "commit log".into(),
            dir: log.dir().to_path_buf(),
            held: starts.iter().map(|s| offset_name(*s)).collect(),
            size: Some(seg),
        });
        // The queues.
        for q in self.queues.all() {
            let l = q.cq.layout();
            let what = format!("consume queue {}/{}", q.cq.topic, q.cq.queue_id);
            for w in l.file_starts.windows(2) {
                if w[1] != w[0] + l.entries_per_file {
                    problems.push(format!(
                        "{what}: gap between files at entries {} and {}",
                        w[0], w[1]
                    ));
                }
            }
            if let (Some(&first), Some(&last)) = (l.file_starts.first(), l.file_starts.last())
                && (l.min < first || l.max > last + l.entries_per_file || l.min > l.max)
            {
                problems.push(format!(
                    "{what}: offsets {}..{} do not lie within its files {first}..{}",
                    l.min,
                    l.max,
                    last + l.entries_per_file
                ));
            }
            let held = l
                .file_starts
                .iter()
                .map(|s| offset_name(s * crate::format::consume_queue::ENTRY_LEN as u64))
                .collect();
            dirs.push(Dir {
                what,
                dir: l.dir,
                held,
                size: Some(l.file_bytes),
            });
        }
        // The index.
        if let Some(ix) = &self.index {
            let (dir, names) = ix.layout();
            dirs.push(Dir {
                what: "index".into(),
                dir,
                held: names,
                size: None,
            });
        }
        let files: usize = dirs.iter().map(|d| d.held.len()).sum();
        let shared: Vec<(String, PathBuf, Vec<String>, Option<u64>)> = dirs
            .iter()
            .map(|d| (d.what.clone(), d.dir.clone(), d.held.clone(), d.size))
            .collect();
        let listed = self
            .cfg
            .disk
            .off_executor(move |disk| {
                let dirs: Vec<Dir> = shared
                    .into_iter()
                    .map(|(what, dir, held, size)| Dir {
                        what,
                        dir,
                        held,
                        size,
                    })
                    .collect();
                list(disk, &dirs)
            })
            .await?;
        for (d, (on_disk, sizes)) in dirs.iter().zip(listed) {
            compare(d, &on_disk, &sizes, &mut problems);
        }
        for p in &problems {
            tracing::warn!(problem = %p, root = %self.cfg.root.display(), "self-check");
        }
        Ok(SelfCheckReport { problems, files })
    }
}

/// Held files missing or of the wrong size; files on disk below the first held.
fn compare(d: &Dir, on_disk: &BTreeSet<String>, sizes: &[Option<u64>], problems: &mut Vec<String>) {
    for (name, size) in d.held.iter().zip(sizes) {
        let path = d.dir.join(name);
        if !on_disk.contains(name) {
            problems.push(format!(
                "{}: {} is held but not on disk",
                d.what,
                show(&path)
            ));
        } else if let (Some(want), Some(have)) = (d.size, size)
            && want != *have
        {
            problems.push(format!(
                "{}: {} is {have} bytes, not {want}",
                d.what,
                show(&path)
            ));
        }
    }
    // Names sort by offset (20 digits) or by time (the index's): a file before the
    // first held is left over.
    if let Some(first) = d.held.first() {
        for name in on_disk.iter().filter(|n| *n < first) {
            problems.push(format!(
                "{}: {} is on disk below the first file held",
                d.what,
                show(&d.dir.join(name))
            ));
        }
    }
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

impl Store {
    /// Runs the self-check now (module docs), waiting for a retention pass to end
    /// first; the problems are also logged and counted.
    pub async fn self_check(&self) -> Result<SelfCheckReport> {
        crate::clean::self_check(&*self.inner).await
    }
}
