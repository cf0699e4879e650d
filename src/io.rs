//! The storage door: every file the store touches goes through these helpers, which
//! open files O_DIRECT through glommio and turn failures into errors that name the
//! operation, the path and the offset.
//!
//! glommio decides once per executor thread whether a device supports polled I/O by
//! reading the first block of the first `DmaFile` it opens. If that block was never
//! written (empty, sparse or preallocated file) the probe wrongly succeeds and later
//! reads fail with EOPNOTSUPP. [`prime_executor`] opens a small file holding real data
//! and reads it back before the store opens anything else.

use crate::error::{Error, Result};
use glommio::io::{DmaFile, OpenOptions};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub const PAGE: usize = 4096;

pub fn align_down(v: u64) -> u64 {
    v & !(PAGE as u64 - 1)
}
pub fn align_up(v: u64) -> u64 {
    align_down(v + PAGE as u64 - 1)
}

/// Makes glommio's per-thread iopoll probe see real data (see module docs).
pub async fn prime_executor(dir: &Path) -> Result<()> {
    let path = dir.join(".probe");
    std::fs::write(&path, vec![0x5Au8; PAGE]).map_err(|e| Error::io("write probe", &path, 0, e))?;
    std::fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("fsync probe", &path, 0, e))?;
    let f = DmaFile::open(&path)
        .await
        .map_err(|e| Error::glommio("open probe", &path, 0, e))?;
    let r = f
        .read_at_aligned(0, PAGE)
        .await
        .map_err(|e| Error::glommio("read probe", &path, 0, e))?;
    let _ = f.close().await;
    if r.len() != PAGE || r[0] != 0x5A {
        return Err(Error::BadLayout {
            path,
            why: "probe file read back wrong bytes".into(),
        });
    }
    Ok(())
}

/// An O_DIRECT file with its path kept for error messages.
pub struct File {
    pub path: PathBuf,
    /// Taken only by `drop`.
    pub dma: ManuallyDrop<DmaFile>,
}

impl Drop for File {
    /// Closes the descriptor now. glommio's own drop only queues an asynchronous
    /// close for the executor's next I/O cycle, which never comes when the executor
    /// ends first: a store shut down at the end of its executor (every shard of a
    /// `ShardedStore`) leaked every file it had open, so a process that reopens
    /// stores ran out of descriptors (found by tests/crash_loop.rs: "Too many open
    /// files" after 140 reopen cycles).
    fn drop(&mut self) {
        // SAFETY: `dma` is not used after this (we are being dropped).
        let dma = unsafe { ManuallyDrop::take(&mut self.dma) };
        drop(glommio::io::OwnedDmaFile::from(dma));
    }
}

impl File {
    /// Opens (creating if asked) read-write with O_DIRECT.
    pub async fn open(path: &Path, create: bool) -> Result<Rc<File>> {
        let dma = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .dma_open(path)
            .await
            .map_err(|e| Error::glommio("open", path, 0, e))?;
        Ok(Rc::new(File {
            path: path.to_path_buf(),
            dma: ManuallyDrop::new(dma),
        }))
    }

    /// Creates a file of exactly `len` bytes (sparse) and fsyncs its directory entry.
    pub async fn create_sized(path: &Path, len: u64) -> Result<Rc<File>> {
        let f = File::open(path, true).await?;
        f.dma
            .truncate(len)
            .await
            .map_err(|e| Error::glommio("truncate", path, len, e))?;
        f.sync().await?;
        sync_dir(path.parent().unwrap_or(Path::new(".")))?;
        Ok(f)
    }

    /// Writes `data` at `pos`; both must be aligned and `data.len()` a page multiple.
    pub async fn write_aligned(&self, pos: u64, data: &[u8]) -> Result<()> {
        debug_assert!(pos.is_multiple_of(PAGE as u64) && data.len().is_multiple_of(PAGE));
        let mut buf = self.dma.alloc_dma_buffer(data.len());
        buf.as_bytes_mut().copy_from_slice(data);
        self.write_buf(pos, buf).await
    }

    pub async fn write_buf(&self, pos: u64, buf: glommio::io::DmaBuffer) -> Result<()> {
        let len = buf.len();
        let n = self.dma.write_at(buf, pos).await;
        self.written(pos, len, n)
    }

    /// Writes a shared buffer (kept alive by the caller too) at aligned `pos`.
    pub async fn write_rc(&self, pos: u64, buf: Rc<glommio::io::DmaBuffer>) -> Result<()> {
        let len = buf.len();
        let n = self.dma.write_rc_at(buf, pos).await;
        self.written(pos, len, n)
    }

    /// Turns a write's outcome into an error naming the file unless all `len` bytes went.
    fn written(&self, pos: u64, len: usize, n: glommio::Result<usize, ()>) -> Result<()> {
        let n = n.map_err(|e| Error::glommio("write", &self.path, pos, e))?;
        if n != len {
            let short = std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write {n} of {len}"),
            );
            return Err(Error::io("write", &self.path, pos, short));
        }
        Ok(())
    }

    /// Reads up to `len` bytes at any offset (short at end of file).
    pub async fn read(&self, pos: u64, len: usize) -> Result<glommio::io::ReadResult> {
        self.dma
            .read_at(pos, len)
            .await
            .map_err(|e| Error::glommio("read", &self.path, pos, e))
    }

    pub async fn sync(&self) -> Result<()> {
        self.dma
            .fdatasync()
            .await
            .map_err(|e| Error::glommio("fdatasync", &self.path, 0, e))
    }

    pub async fn truncate(&self, len: u64) -> Result<()> {
        self.dma
            .truncate(len)
            .await
            .map_err(|e| Error::glommio("truncate", &self.path, len, e))
    }

    pub async fn size(&self) -> Result<u64> {
        self.dma
            .file_size()
            .await
            .map_err(|e| Error::glommio("stat", &self.path, 0, e))
    }
}

/// fsyncs a directory so that created, renamed and removed entries are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync dir", dir, 0, e))
}

/// A 20-digit zero-padded file name, as RocketMQ names its segments.
pub fn offset_name(offset: u64) -> String {
    format!("{offset:020}")
}

/// Parses a 20-digit file name.
pub fn parse_offset_name(name: &str) -> Option<u64> {
    if name.len() != 20 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// Lists `dir`'s files named by 20-digit offsets, sorted; other names are returned
/// separately so callers can refuse or ignore them.
/// Files named by offset, sorted, and the other entries of a directory.
pub type OffsetListing = (Vec<(u64, PathBuf)>, Vec<PathBuf>);

pub fn list_offset_files(dir: &Path) -> Result<OffsetListing> {
    let mut named = Vec::new();
    let mut other = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((named, other)),
        Err(e) => return Err(Error::io("list", dir, 0, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| Error::io("list", dir, 0, e))?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_offset_name) {
            Some(off) => named.push((off, entry.path())),
            None => other.push(entry.path()),
        }
    }
    named.sort();
    Ok((named, other))
}

/// The first offset at or after `from` holding data (not a hole) in the file at
/// `path`, or `None` when only holes follow (`lseek(SEEK_DATA)`). Lets recovery skip
/// the unwritten, sparse part of a preallocated segment without reading it.
pub fn next_data(path: &Path, from: u64) -> Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| Error::io("open", path, from, e))?;
    // SAFETY: lseek on a file descriptor we own; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), from as libc::off_t, libc::SEEK_DATA) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        // Filesystems without SEEK_DATA: treat everything as data.
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(Some(from)),
        _ => Err(Error::io("seek data", path, from, e)),
    }
}
