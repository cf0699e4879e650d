//! One ConsumeQueue: RocketMQ's `ConsumeQueue`, the per-(topic, queue) index of the
//! CommitLog in RocketMQ's files under `consumequeue/<topic>/<queueId>/` (20-byte
//! entries, files named by byte position). The shard's queues together are the
//! `QueueTable` (`table.rs`).
//!
//! Entries are appended to an in-memory tail that starts at a page boundary of the
//! current file; a flush writes the tail's pages with direct I/O (the partial last
//! page padded with zeros, rewritten with the same prefix by the next flush) and keeps
//! only the partial last page in memory. A queue with no entry added since its last
//! flush is not written (idle rounds rewrote and synced every queue's last page: after
//! traffic an idle node's shards woke 25 times a second instead of 16, and its io-wq
//! workers spent ~0.7 ms of CPU a second). Reads of entries still in the tail come from
//! memory, older ones from the file. A file's last page may reach past the file's
//! RocketMQ size (6,000,000 is not a page multiple); the file is cut back to its exact
//! size once it is full, and at load.

use crate::error::{Error, Result};
use crate::format::consume_queue::{CqEntry, ENTRY_LEN, PRE_BLANK_SIZE};
use crate::io::{self, Disk, File, PAGE, align_down, align_up};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

mod check;
mod clean;
mod table;

pub use check::QueueLayout;
pub(crate) use table::{QueueTable, manifest_path};

const E: u64 = ENTRY_LEN as u64;

struct Tail {
    /// Byte position in the file of `bytes[0]` (page aligned).
    page_pos: u64,
    bytes: Vec<u8>,
    /// How many of `bytes` are written and synced (the partial last page a flush
    /// keeps): a flush with nothing past it writes nothing (each idle second rewrote
    /// and synced every queue's last page).
    synced: usize,
}

/// What dispatch did with an entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    Appended,
    /// Already present (dispatch is idempotent).
    Duplicate,
    /// The queue is missing entries before this one.
    Gap {
        expected: u64,
    },
}

pub struct ConsumeQueue {
    pub topic: String,
    pub queue_id: i32,
    dir: PathBuf,
    disk: Disk,
    entries_per_file: u64,
    file_bytes: u64,
    files: RefCell<BTreeMap<u64, Rc<File>>>,
    min: Cell<u64>,
    max: Cell<u64>,
    max_phys_end: Cell<u64>,
    tails: RefCell<BTreeMap<u64, Tail>>,
}

impl ConsumeQueue {
    pub fn new(
        root: &std::path::Path,
        topic: &str,
        queue_id: i32,
        entries_per_file: u64,
        disk: Disk,
    ) -> ConsumeQueue {
        ConsumeQueue {
            topic: topic.to_string(),
            queue_id,
            dir: root
                .join("consumequeue")
                .join(topic)
                .join(queue_id.to_string()),
            disk,
            entries_per_file,
            file_bytes: entries_per_file * E,
            files: RefCell::new(BTreeMap::new()),
            min: Cell::new(0),
            max: Cell::new(0),
            max_phys_end: Cell::new(0),
            tails: RefCell::new(BTreeMap::new()),
        }
    }

    pub fn min_offset(&self) -> u64 {
        self.min.get()
    }
    /// The next queue offset to be written.
    pub fn max_offset(&self) -> u64 {
        self.max.get()
    }
    /// End (offset + size) of the last record this queue points at.
    pub fn max_phys_end(&self) -> u64 {
        self.max_phys_end.get()
    }
    /// Entries not yet written and synced.
    pub fn is_dirty(&self) -> bool {
        self.tails
            .borrow()
            .values()
            .any(|t| t.bytes.len() > t.synced)
    }

    fn file_of(&self, q: u64) -> u64 {
        q / self.entries_per_file * self.entries_per_file
    }

    fn file_path(&self, first_entry: u64) -> PathBuf {
        self.dir.join(io::offset_name(first_entry * E))
    }

    /// Loads the queue's files, finds the last valid entry, and drops entries that
    /// point at or past `log_end` (the recovered end of the CommitLog) or below
    /// `log_min`. Dropped entries are erased on disk before this returns.
    pub async fn load(&self, log_min: u64, log_end: u64) -> Result<()> {
        let (named, _) = self.disk.list_offset_files(&self.dir)?;
        let last_pos = named.last().map(|(pos, _)| *pos);
        for (byte_pos, path) in named {
            if byte_pos % self.file_bytes != 0 {
                return Err(Error::BadLayout {
                    path,
                    why: format!(
                        "consume-queue file name is not a multiple of {}",
                        self.file_bytes
                    ),
                });
            }
            let f = self.disk.open(&path, false).await?;
            let size = f.size().await?;
            // Our own flush may leave the last page reaching past the exact size (a
            // crash before the cut), a crash during creation leaves an empty file, and
            // a crash inside a previous `load` (between cutting the last file back
            // after its tail page and extending it again, below) leaves the last file
            // short by whole pages, all its entries still in it: extending it gives
            // the zeros that cut was making. Any other size means the store was
            // written with another file size (a last file alone cannot tell: it is
            // then used at this store's size, its entries where they were).
            let cut_short = Some(byte_pos) == last_pos
                && size < self.file_bytes
                && size.is_multiple_of(PAGE as u64);
            if size == 0
                || cut_short
                || (size > self.file_bytes && size <= align_up(self.file_bytes))
            {
                f.truncate(self.file_bytes).await?;
            } else if size != self.file_bytes {
                return Err(Error::BadLayout {
                    path,
                    why: format!(
                        "consume-queue file is {size} bytes; this store uses {} \
                         (set consume_queue_entries_per_file to the value the store was created with)",
                        self.file_bytes
                    ),
                });
            }
            self.files.borrow_mut().insert(byte_pos / E, f);
        }
        let Some((&last_first, _)) = self.files.borrow().iter().next_back() else {
            return Ok(());
        };
        // Files must follow each other with no gap: a missing file in the middle
        // means lost entries (the store then rebuilds this queue from the log).
        let firsts: Vec<u64> = self.files.borrow().keys().copied().collect();
        if let Some(w) = firsts
            .windows(2)
            .find(|w| w[1] != w[0] + self.entries_per_file)
        {
            return Err(Error::Corrupt {
                path: self.file_path(w[0] + self.entries_per_file),
                offset: 0,
                kind: crate::format::Corruption::Truncated,
                detail: Some("consume-queue file missing between two others".into()),
            });
        }
        // From the last file backwards: the end is in the last file that still holds
        // an entry whose record lies within the recovered log (a lost log tail can
        // take several queue files with it).
        let mut end = None;
        for &first in firsts.iter().rev() {
            let file = self.files.borrow()[&first].clone();
            // Read in pieces and stop at the end: a queue file is mostly unwritten
            // (sparse) and reading all of it (6 MB) cost every queue of every open
            // that much zero-filled memory (recovery, scenario 7).
            const PIECE: u64 = E * PAGE as u64 * 16;
            let mut n = 0u64;
            let mut last_end = 0;
            let mut pos = 0u64;
            'file: while pos < self.file_bytes {
                let len = PIECE.min(self.file_bytes - pos);
                let data = file.read(pos, len as usize).await?;
                for chunk in data.chunks_exact(ENTRY_LEN) {
                    let Some(e) = CqEntry::decode(chunk) else {
                        break 'file;
                    };
                    if !e.is_valid() {
                        break 'file;
                    }
                    if !e.is_pre_blank() {
                        let e_end = e.phys_offset as u64 + e.size as u64;
                        if e_end > log_end {
                            break 'file;
                        }
                        last_end = e_end;
                    }
                    n += 1;
                }
                if (data.len() as u64) < len {
                    break;
                }
                pos += len;
            }
            if n > 0 || first == firsts[0] {
                end = Some((first, n, last_end));
                break;
            }
        }
        let (first, n, last_end) = end.unwrap_or((last_first, 0, 0));
        let end_entry = first + n;
        self.max.set(end_entry);
        self.max_phys_end.set(last_end);
        // Erase whatever follows the end (stale or torn entries) and later files.
        let doomed: Vec<u64> = self
            .files
            .borrow()
            .range(first + 1..)
            .map(|(k, _)| *k)
            .collect();
        let removed = !doomed.is_empty();
        for k in doomed {
            let f = self.files.borrow_mut().remove(&k).unwrap();
            self.disk.remove_file(&f.path)?;
        }
        if removed {
            // A removed file that came back after a crash could hold entries naming
            // records the log holds by then.
            self.disk.sync_dir(&self.dir)?;
        }
        let file = self.files.borrow()[&first].clone();
        let byte_end = n * E;
        let page_pos = align_down(byte_end);
        let prefix = file.read(page_pos, (byte_end - page_pos) as usize).await?;
        let prefix = prefix[..].to_vec();
        if n < self.entries_per_file {
            // Erase whatever follows the last valid entry without ever taking a valid
            // entry off the disk, since a crash may stop this at any step: first
            // rewrite the tail page (its entries, then zeros), then drop the pages
            // after it by cutting the file back to the end of that page and extending
            // it again. A crash between the two leaves the last file short by whole
            // pages, which the next load accepts (see above).
            let mut keep = page_pos;
            if !prefix.is_empty() {
                let mut page = vec![0u8; PAGE];
                page[..prefix.len()].copy_from_slice(&prefix);
                file.write_aligned(page_pos, &page).await?;
                keep = page_pos + PAGE as u64;
            }
            if keep < self.file_bytes {
                file.truncate(keep).await?;
            }
            // Also cuts back a tail page that reached past the file's exact size.
            file.truncate(self.file_bytes).await?;
            file.sync().await?;
            self.tails.borrow_mut().insert(
                first,
                Tail {
                    page_pos,
                    synced: prefix.len(),
                    bytes: prefix,
                },
            );
        }
        // The minimum: first real entry that still points into the log.
        // Found by binary search (`clean.rs`): after retention most of a first file
        // may point below the log, and an entry read each was one read each.
        let first_file = *self.files.borrow().keys().next().unwrap();
        self.min.set(first_file);
        self.correct_min(log_min).await
    }

    /// Places the entry for queue offset `q` (dispatch), idempotently. An empty queue
    /// may start at `q > 0` only if `allow_late_start` (a rebuild from the log's first
    /// record, where earlier records were removed by retention); otherwise a missing
    /// prefix is a gap.
    pub fn put(&self, q: u64, entry: CqEntry, allow_late_start: bool) -> Placed {
        let max = self.max.get();
        if q < max {
            return Placed::Duplicate;
        }
        if q > max {
            if allow_late_start
                && max == 0
                && self.files.borrow().is_empty()
                && self.tails.borrow().is_empty()
            {
                // An empty queue may start anywhere (its earlier files were removed).
                self.min.set(q);
                self.max.set(q);
            } else {
                return Placed::Gap { expected: max };
            }
        }
        let first = self.file_of(q);
        let byte = (q - first) * E;
        let mut tails = self.tails.borrow_mut();
        // A file gets its tail when it is created (or at load, for the last file), so a
        // missing tail means a new file: entries before `byte` (a queue that starts
        // mid-file) are RocketMQ's pre-blank entries.
        let tail = tails.entry(first).or_insert_with(|| {
            let blank = CqEntry {
                phys_offset: 0,
                size: PRE_BLANK_SIZE,
                tags_code: 0,
            }
            .encode();
            let mut bytes = Vec::with_capacity(byte as usize + ENTRY_LEN);
            while (bytes.len() as u64) < byte {
                bytes.extend_from_slice(&blank);
            }
            Tail {
                page_pos: 0,
                bytes,
                synced: 0,
            }
        });
        debug_assert_eq!(tail.page_pos + tail.bytes.len() as u64, byte);
        tail.bytes.extend_from_slice(&entry.encode());
        self.max.set(q + 1);
        self.max_phys_end
            .set(entry.phys_offset as u64 + entry.size as u64);
        Placed::Appended
    }

    /// The entry at queue offset `q`, if it exists.
    pub async fn entry(&self, q: u64) -> Result<Option<CqEntry>> {
        Ok(self.entries(q, 1).await?.into_iter().next())
    }

    /// Up to `count` entries from `q`, never crossing a file boundary.
    pub async fn entries(&self, q: u64, count: usize) -> Result<Vec<CqEntry>> {
        let max = self.max.get();
        if q >= max || count == 0 {
            return Ok(Vec::new());
        }
        let first = self.file_of(q);
        let end = max.min(q + count as u64).min(first + self.entries_per_file);
        let (from_byte, to_byte) = ((q - first) * E, (end - first) * E);
        // The byte stream [from_byte, to_byte): the part before the tail's first page
        // from the file, the rest from memory. An entry may straddle the two.
        let tail_pos = self
            .tails
            .borrow()
            .get(&first)
            .map(|t| t.page_pos)
            .unwrap_or(u64::MAX);
        let mut bytes = Vec::with_capacity((to_byte - from_byte) as usize);
        if from_byte < tail_pos {
            let disk_to = to_byte.min(tail_pos);
            let file = self.files.borrow().get(&first).cloned();
            if let Some(file) = file {
                let data = file.read(from_byte, (disk_to - from_byte) as usize).await?;
                bytes.extend_from_slice(&data[..]);
            }
            if (bytes.len() as u64) < disk_to - from_byte {
                // Short file: return the whole entries we have.
                bytes.truncate(bytes.len() / ENTRY_LEN * ENTRY_LEN);
                return Ok(bytes
                    .chunks_exact(ENTRY_LEN)
                    .filter_map(CqEntry::decode)
                    .collect());
            }
        }
        let tails = self.tails.borrow();
        if let Some(t) = tails.get(&first) {
            let start = from_byte.max(t.page_pos);
            if start < to_byte {
                let a = (start - t.page_pos) as usize;
                let b = (to_byte - t.page_pos) as usize;
                bytes.extend_from_slice(&t.bytes[a..b]);
            }
        }
        Ok(bytes
            .chunks_exact(ENTRY_LEN)
            .filter_map(CqEntry::decode)
            .collect())
    }

    /// Writes the in-memory tail to disk and fdatasyncs it.
    pub async fn flush(&self) -> Result<()> {
        let firsts: Vec<u64> = self
            .tails
            .borrow()
            .iter()
            .filter(|(_, t)| t.bytes.len() > t.synced)
            .map(|(first, _)| *first)
            .collect();
        for first in firsts {
            // The table flushes 16 queues at once (one poll starts them all): a bounded
            // background turn ends here (`crate::shard::turns`).
            glommio::yield_if_needed().await;
            let file = self.file_or_create(first).await?;
            // Entries appended while this flush awaits stay in the tail for the next one.
            let Some((page_pos, copied, buf)) = self.tail_buffer(first) else {
                continue;
            };
            let written_end = page_pos + buf.len() as u64;
            file.write_buf(page_pos, buf).await?;
            let complete = page_pos + copied as u64 == self.file_bytes;
            if written_end > self.file_bytes {
                // The padded last page reached past the file's exact size: cut it back.
                file.truncate(self.file_bytes).await?;
            }
            file.sync().await?;
            let mut tails = self.tails.borrow_mut();
            if complete {
                tails.remove(&first);
            } else if let Some(t) = tails.get_mut(&first) {
                let full_pages = copied / PAGE * PAGE;
                t.bytes.drain(..full_pages);
                t.page_pos += full_pages as u64;
                t.synced = copied - full_pages;
            }
        }
        Ok(())
    }

    /// The tail of file `first` as it is now, copied once into a write's DMA buffer
    /// (the partial last page padded with zeros): its page position, its length and
    /// the buffer. A copy into a `Vec` first, then into the buffer, made the flush's
    /// polls of 150-860 us (58 in a 6 s run at 67,000 msg/s).
    fn tail_buffer(&self, first: u64) -> Option<(u64, usize, glommio::io::DmaBuffer)> {
        let tails = self.tails.borrow();
        let t = tails.get(&first).filter(|t| !t.bytes.is_empty())?;
        let copied = t.bytes.len();
        let mut buf = glommio::allocate_dma_buffer(align_up(copied as u64) as usize);
        let out = buf.as_bytes_mut();
        out[..copied].copy_from_slice(&t.bytes);
        out[copied..].fill(0);
        Some((t.page_pos, copied, buf))
    }

    async fn file_or_create(&self, first: u64) -> Result<Rc<File>> {
        if let Some(f) = self.files.borrow().get(&first) {
            return Ok(f.clone());
        }
        // Off the executor: a new queue's directory is made while the store runs.
        let dir = self.dir.clone();
        self.disk
            .off_executor(move |d| d.create_dir_all(&dir))
            .await?;
        let f = self
            .disk
            .create_sized(&self.file_path(first), self.file_bytes)
            .await?;
        self.files.borrow_mut().insert(first, f.clone());
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> CqEntry {
        CqEntry {
            phys_offset: i as i64 * 100,
            size: 100,
            tags_code: i as i64,
        }
    }

    /// Queue 0 of topic "T", 1000 entries per file, on the real disk.
    fn queue(root: &std::path::Path) -> ConsumeQueue {
        ConsumeQueue::new(root, "T", 0, 1000, Disk::Real)
    }

    /// Runs `test` on a fresh executor, on a temporary root.
    fn on_executor<F, Fut>(test: F)
    where
        F: FnOnce(PathBuf) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                crate::io::prime_executor(&root).await.unwrap();
                test(root).await
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn append_flush_read_reload() {
        on_executor(|root| async move {
            let cq = queue(&root);
            for i in 0..2500u64 {
                assert_eq!(cq.put(i, entry(i), false), Placed::Appended);
                if i % 97 == 0 {
                    cq.flush().await.unwrap();
                }
                if i % 13 == 0 {
                    let back = cq.entries(i.saturating_sub(300), 500).await.unwrap();
                    for (k, e) in back.iter().enumerate() {
                        assert_eq!(*e, entry(i.saturating_sub(300) + k as u64), "at {i}");
                    }
                }
            }
            assert_eq!(cq.put(5, entry(5), false), Placed::Duplicate);
            assert_eq!(
                cq.put(2501, entry(5), false),
                Placed::Gap { expected: 2500 }
            );
            cq.flush().await.unwrap();
            let cq2 = queue(&root);
            cq2.load(0, 2500 * 100).await.unwrap();
            assert_eq!(cq2.max_offset(), 2500);
            // Entries pointing past the log end are dropped at load.
            let cq3 = queue(&root);
            cq3.load(0, 2000 * 100 + 50).await.unwrap();
            assert_eq!(cq3.max_offset(), 2000);
            for q in (0..2000).step_by(111) {
                assert_eq!(cq3.entry(q).await.unwrap(), Some(entry(q)));
            }
            assert_eq!(cq3.put(2000, entry(2000), false), Placed::Appended);
        });
    }

    /// A kill inside `load`, between cutting the last file back after its tail page
    /// and extending it again, leaves the file short by whole pages (found by the
    /// crash loop, tests/crash_loop.rs): the next load must take it, entries intact.
    #[test]
    fn load_accepts_a_last_file_cut_short_by_a_crash() {
        on_executor(|root| async move {
            let cq = queue(&root);
            for i in 0..2500u64 {
                assert_eq!(cq.put(i, entry(i), false), Placed::Appended);
            }
            cq.flush().await.unwrap();
            let qdir = root.join("consumequeue/T/0");
            let last = qdir.join(io::offset_name(2000 * E));
            // 500 entries (10,000 bytes): the tail page is [8192, 12288).
            let set_len = |path: &std::path::Path, len: u64| {
                let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                f.set_len(len).unwrap();
            };
            set_len(&last, 3 * PAGE as u64);
            let cq2 = queue(&root);
            cq2.load(0, u64::MAX).await.unwrap();
            assert_eq!(cq2.max_offset(), 2500);
            assert_eq!(std::fs::metadata(&last).unwrap().len(), 1000 * E);
            for q in (0..2500).step_by(97) {
                assert_eq!(cq2.entry(q).await.unwrap(), Some(entry(q)));
            }
            // A short file that is not the last one is still refused.
            set_len(&qdir.join(io::offset_name(1000 * E)), 2 * PAGE as u64);
            let cq3 = queue(&root);
            assert!(matches!(
                cq3.load(0, u64::MAX).await,
                Err(Error::BadLayout { .. })
            ));
        });
    }
}
