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
use std::sync::Arc;

pub mod sim;

pub use sim::{SimDisk, SimOp};

pub const PAGE: usize = 4096;

pub fn align_down(v: u64) -> u64 {
    v & !(PAGE as u64 - 1)
}
pub fn align_up(v: u64) -> u64 {
    align_down(v + PAGE as u64 - 1)
}

/// Where a store keeps its files: the real file system (O_DIRECT through glommio) or
/// a [`SimDisk`] for crash and fault tests. Every file and directory operation of the
/// store goes through this, so the same code runs on both.
#[derive(Clone, Default)]
pub enum Disk {
    #[default]
    Real,
    Sim(Arc<SimDisk>),
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Disk::Real => f.write_str("Real"),
            Disk::Sim(_) => f.write_str("Sim"),
        }
    }
}

/// The exclusive hold on a store root; released when dropped.
pub enum RootLock {
    Real(std::fs::File),
    Sim(Arc<SimDisk>, PathBuf),
}

impl Drop for RootLock {
    fn drop(&mut self) {
        if let RootLock::Sim(d, p) = self {
            d.unlock(p);
        }
    }
}

/// One entry of a directory listing.
pub struct DirEntry {
    pub name: String,
    pub path: PathBuf,
    pub is_dir: bool,
}

impl Disk {
    pub fn is_sim(&self) -> bool {
        matches!(self, Disk::Sim(_))
    }

    /// Makes glommio's per-thread iopoll probe see real data (see module docs).
    pub async fn prime_executor(&self, dir: &Path) -> Result<()> {
        match self {
            Disk::Real => prime_executor(dir).await,
            Disk::Sim(_) => Ok(()),
        }
    }

    pub fn create_dir_all(&self, dir: &Path) -> Result<()> {
        match self {
            Disk::Real => std::fs::create_dir_all(dir),
            Disk::Sim(d) => d.create_dir_all(dir),
        }
        .map_err(|e| Error::io("create dir", dir, 0, e))
    }

    pub fn exists(&self, path: &Path) -> bool {
        match self {
            Disk::Real => path.exists(),
            Disk::Sim(d) => d.exists(path),
        }
    }

    /// A whole small file, or `None` when it does not exist.
    pub fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>> {
        let r = match self {
            Disk::Real => std::fs::read(path),
            Disk::Sim(d) => d
                .open(path, false)
                .and_then(|ino| Ok((ino, d.len(ino)?)))
                .and_then(|(ino, len)| d.read(ino, 0, len as usize)),
        };
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("read", path, 0, e)),
        }
    }

    /// Writes a small file and makes it and its name durable (buffered I/O: for the
    /// abort marker and other small metadata).
    pub fn write_file_durable(&self, path: &Path, data: &[u8]) -> Result<()> {
        let r = match self {
            Disk::Real => {
                std::fs::write(path, data).and_then(|_| std::fs::File::open(path)?.sync_all())
            }
            Disk::Sim(d) => d.open(path, true).and_then(|ino| {
                d.truncate(ino, 0)?;
                d.write(ino, 0, data)?;
                d.sync(ino)
            }),
        };
        r.map_err(|e| Error::io("write", path, 0, e))?;
        self.sync_dir(path.parent().unwrap_or(Path::new(".")))
    }

    /// Replaces `path` atomically: writes `path.tmp`, syncs it, renames it over `path`
    /// and syncs the directory.
    pub fn replace_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let r = match self {
            Disk::Real => std::fs::write(&tmp, data)
                .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
                .and_then(|_| std::fs::rename(&tmp, path)),
            Disk::Sim(d) => d
                .open(&tmp, true)
                .and_then(|ino| {
                    d.truncate(ino, 0)?;
                    d.write(ino, 0, data)?;
                    d.sync(ino)
                })
                .and_then(|_| d.rename(&tmp, path)),
        };
        r.map_err(|e| Error::io("replace", path, 0, e))?;
        self.sync_dir(path.parent().unwrap_or(Path::new(".")))
    }

    pub fn remove_file(&self, path: &Path) -> Result<()> {
        match self {
            Disk::Real => std::fs::remove_file(path),
            Disk::Sim(d) => d.remove_file(path),
        }
        .map_err(|e| Error::io("remove", path, 0, e))
    }

    pub fn remove_dir_all(&self, path: &Path) -> Result<()> {
        match self {
            Disk::Real => std::fs::remove_dir_all(path),
            Disk::Sim(d) => d.remove_dir_all(path),
        }
        .map_err(|e| Error::io("remove dir", path, 0, e))
    }

    /// fsyncs a directory so that created, renamed and removed entries are durable.
    pub fn sync_dir(&self, dir: &Path) -> Result<()> {
        match self {
            Disk::Real => sync_dir(dir),
            Disk::Sim(d) => d
                .sync_dir(dir)
                .map_err(|e| Error::io("fsync dir", dir, 0, e)),
        }
    }

    /// Length of the file at `path`.
    pub fn file_len(&self, path: &Path) -> Result<u64> {
        match self {
            Disk::Real => std::fs::metadata(path).map(|m| m.len()),
            Disk::Sim(d) => d.path_len(path),
        }
        .map_err(|e| Error::io("stat", path, 0, e))
    }

    /// A directory's entries (empty when it does not exist), sorted by name.
    pub fn list_dir(&self, dir: &Path) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        match self {
            Disk::Real => {
                let rd = match std::fs::read_dir(dir) {
                    Ok(rd) => rd,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                    Err(e) => return Err(Error::io("list", dir, 0, e)),
                };
                for entry in rd {
                    let entry = entry.map_err(|e| Error::io("list", dir, 0, e))?;
                    let path = entry.path();
                    out.push(DirEntry {
                        name: entry.file_name().to_string_lossy().into_owned(),
                        is_dir: path.is_dir(),
                        path,
                    });
                }
            }
            Disk::Sim(d) => {
                let list = d.list(dir).map_err(|e| Error::io("list", dir, 0, e))?;
                for (name, path, is_dir) in list.unwrap_or_default() {
                    out.push(DirEntry { name, path, is_dir });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Lists `dir`'s files named by 20-digit offsets, sorted; other regular files are
    /// returned separately so callers can refuse or ignore them.
    pub fn list_offset_files(&self, dir: &Path) -> Result<OffsetListing> {
        let mut named = Vec::new();
        let mut other = Vec::new();
        for e in self.list_dir(dir)? {
            match parse_offset_name(&e.name) {
                Some(off) if !e.is_dir => named.push((off, e.path)),
                _ if !e.is_dir => other.push(e.path),
                _ => {}
            }
        }
        named.sort();
        Ok((named, other))
    }

    /// The first offset at or after `from` holding data (not a hole) in the file at
    /// `path`, or `None` when only holes follow (`lseek(SEEK_DATA)`). Lets recovery
    /// skip the unwritten, sparse part of a preallocated segment without reading it.
    pub fn next_data(&self, path: &Path, from: u64) -> Result<Option<u64>> {
        match self {
            Disk::Real => next_data(path, from),
            Disk::Sim(d) => d
                .next_data(path, from)
                .map_err(|e| Error::io("seek data", path, from, e)),
        }
    }

    /// Takes the exclusive lock on `<root>/lock` (RocketMQ's "MQ already started" guard).
    pub fn lock_root(&self, root: &Path) -> Result<RootLock> {
        match self {
            Disk::Real => lock_root(root).map(RootLock::Real),
            Disk::Sim(d) => {
                if d.try_lock(root) {
                    Ok(RootLock::Sim(d.clone(), root.to_path_buf()))
                } else {
                    Err(Error::Locked(root.to_path_buf()))
                }
            }
        }
    }

    /// (total, available) bytes of the file system holding `path`.
    pub fn space(&self, path: &Path) -> Result<Option<(u64, u64)>> {
        match self {
            Disk::Real => {
                use std::os::unix::ffi::OsStrExt;
                let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
                    Error::BadRequest(format!("path {} has a NUL byte", path.display()))
                })?;
                // SAFETY: statvfs writes into the zeroed struct we pass; the path is a
                // valid NUL-terminated string that outlives the call.
                let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
                let r = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
                if r != 0 {
                    return Err(Error::io(
                        "statvfs",
                        path,
                        0,
                        std::io::Error::last_os_error(),
                    ));
                }
                let frsize = s.f_frsize as u64;
                Ok(Some((
                    s.f_blocks as u64 * frsize,
                    s.f_bavail as u64 * frsize,
                )))
            }
            Disk::Sim(d) => Ok(d.space()),
        }
    }

    /// Opens (creating if asked) read-write: O_DIRECT on the real disk.
    pub async fn open(&self, path: &Path, create: bool) -> Result<Rc<File>> {
        let backing = match self {
            Disk::Real => Backing::Dma(ManuallyDrop::new(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .dma_open(path)
                    .await
                    .map_err(|e| Error::glommio("open", path, 0, e))?,
            )),
            Disk::Sim(d) => Backing::Sim(
                d.clone(),
                d.open(path, create)
                    .map_err(|e| Error::io("open", path, 0, e))?,
            ),
        };
        Ok(Rc::new(File {
            path: path.to_path_buf(),
            backing,
            dup: Default::default(),
        }))
    }

    /// Creates a file of exactly `len` bytes (sparse) and makes it and its name durable.
    pub async fn create_sized(&self, path: &Path, len: u64) -> Result<Rc<File>> {
        let f = self.open(path, true).await?;
        f.truncate(len).await?;
        f.sync().await?;
        self.sync_dir(path.parent().unwrap_or(Path::new(".")))?;
        Ok(f)
    }
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

/// Takes the exclusive lock on `<root>/lock` of a real directory.
pub(crate) fn lock_root(root: &Path) -> Result<std::fs::File> {
    let path = root.join("lock");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::io("open", &path, 0, e))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Locked(root.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", &path, 0, e)),
    }
    use std::io::Write;
    (&f).write_all(b"lock")
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io("write", &path, 0, e))?;
    Ok(f)
}

enum Backing {
    /// Taken only by `File::drop`.
    Dma(ManuallyDrop<DmaFile>),
    Sim(Arc<SimDisk>, u64),
}

/// Bytes read from a file: glommio's buffer on the real disk, a vector on the
/// simulated one.
pub enum ReadBuf {
    Dma(glommio::io::ReadResult),
    Mem(Vec<u8>),
}

impl std::ops::Deref for ReadBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBuf::Dma(r) => r,
            ReadBuf::Mem(v) => v,
        }
    }
}

/// A page-aligned heap buffer that can move to another thread (glommio's
/// `DmaBuffer` cannot): the data of a durable write done on the sync-write thread.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its allocation exclusively; nothing else points into it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `cap` bytes (rounded up to a page), `len` 0.
    pub fn new(cap: usize) -> AlignedBuf {
        let cap = align_up(cap.max(1) as u64) as usize;
        let layout = std::alloc::Layout::from_size_align(cap, PAGE).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len: 0, cap }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length (at most the capacity); bytes keep their contents.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap);
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialised (zeroed at allocation) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.cap, PAGE).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// `pwritev2(RWF_DSYNC)` of all of `data` at `pos`: the bytes are durable when it
/// returns (the kernel writes and then flushes the device cache, or uses FUA). Falls
/// back to `pwrite` + `fdatasync` where the flag is not supported.
fn pwrite_dsync(fd: std::os::fd::RawFd, pos: u64, data: &[u8]) -> std::io::Result<()> {
    pwritev_dsync(fd, pos, &mut [data])
}

/// [`pwrite_dsync`] of several buffers written back to back from `pos` (one
/// `pwritev2` while nothing is short). With direct I/O every buffer's address and
/// length must be aligned. `parts` is consumed (advanced) as bytes are written.
pub(crate) fn pwritev_dsync(
    fd: std::os::fd::RawFd,
    mut pos: u64,
    mut parts: &mut [&[u8]],
) -> std::io::Result<()> {
    let mut dsync = true;
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(parts.len());
    loop {
        while parts.first().is_some_and(|p| p.is_empty()) {
            parts = &mut parts[1..];
        }
        if parts.is_empty() {
            break;
        }
        iov.clear();
        iov.extend(parts.iter().map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        }));
        let flags = if dsync { libc::RWF_DSYNC } else { 0 };
        // SAFETY: every iovec points into a slice of `parts`, alive for the call.
        let n = unsafe {
            libc::pwritev2(
                fd,
                iov.as_ptr(),
                iov.len() as libc::c_int,
                pos as libc::off_t,
                flags,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) if dsync => {
                    dsync = false;
                    continue;
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write at {pos}"),
            ));
        }
        pos += n as u64;
        let mut n = n as usize;
        while n > 0 {
            let k = n.min(parts[0].len());
            parts[0] = &parts[0][k..];
            n -= k;
            if parts[0].is_empty() {
                parts = &mut parts[1..];
            }
        }
    }
    if !dsync {
        // SAFETY: fdatasync on a descriptor we hold open.
        if unsafe { libc::fdatasync(fd) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A store file with its path kept for error messages.
pub struct File {
    pub path: PathBuf,
    backing: Backing,
    /// A duplicate of the descriptor for writes done on the blocking thread: it stays
    /// open while such a write runs even if this `File` is dropped meanwhile.
    dup: std::cell::OnceCell<Arc<std::os::fd::OwnedFd>>,
}

impl Drop for File {
    /// Closes the descriptor now. glommio's own drop only queues an asynchronous
    /// close for the executor's next I/O cycle, which never comes when the executor
    /// ends first: a store shut down at the end of its executor (every shard of a
    /// `ShardedStore`) leaked every file it had open, so a process that reopens
    /// stores ran out of descriptors (found by tests/crash_loop.rs: "Too many open
    /// files" after 140 reopen cycles).
    fn drop(&mut self) {
        if let Backing::Dma(dma) = &mut self.backing {
            // SAFETY: `dma` is not used after this (we are being dropped).
            let dma = unsafe { ManuallyDrop::take(dma) };
            drop(glommio::io::OwnedDmaFile::from(dma));
        }
    }
}

impl File {
    /// Writes `data` at `pos`; both must be aligned and `data.len()` a page multiple.
    pub async fn write_aligned(&self, pos: u64, data: &[u8]) -> Result<()> {
        debug_assert!(pos.is_multiple_of(PAGE as u64) && data.len().is_multiple_of(PAGE));
        match &self.backing {
            Backing::Dma(dma) => {
                let mut buf = dma.alloc_dma_buffer(data.len());
                buf.as_bytes_mut().copy_from_slice(data);
                self.write_buf(pos, buf).await
            }
            Backing::Sim(d, ino) => d
                .write(*ino, pos, data)
                .map_err(|e| Error::io("write", &self.path, pos, e)),
        }
    }

    pub async fn write_buf(&self, pos: u64, buf: glommio::io::DmaBuffer) -> Result<()> {
        let len = buf.len();
        match &self.backing {
            Backing::Dma(dma) => {
                let n = dma.write_at(buf, pos).await;
                self.written(pos, len, n)
            }
            Backing::Sim(d, ino) => d
                .write(*ino, pos, buf.as_bytes())
                .map_err(|e| Error::io("write", &self.path, pos, e)),
        }
    }

    /// Writes a shared buffer (kept alive by the caller too) at aligned `pos`.
    pub async fn write_rc(&self, pos: u64, buf: Rc<glommio::io::DmaBuffer>) -> Result<()> {
        let len = buf.len();
        match &self.backing {
            Backing::Dma(dma) => {
                let n = dma.write_rc_at(buf, pos).await;
                self.written(pos, len, n)
            }
            Backing::Sim(d, ino) => d
                .write(*ino, pos, buf.as_bytes())
                .map_err(|e| Error::io("write", &self.path, pos, e)),
        }
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

    /// A duplicate of this file's descriptor for writes on another thread (it stays
    /// open while such a write runs even if this `File` is dropped meanwhile); `None`
    /// on the simulated disk.
    pub fn shared_fd(&self) -> Result<Option<Arc<std::os::fd::OwnedFd>>> {
        use std::os::fd::{AsRawFd, BorrowedFd};
        let Backing::Dma(dma) = &self.backing else {
            return Ok(None);
        };
        if let Some(fd) = self.dup.get() {
            return Ok(Some(fd.clone()));
        }
        // SAFETY: the descriptor is open for as long as `dma` is.
        let owned = unsafe { BorrowedFd::borrow_raw(dma.as_raw_fd()) }
            .try_clone_to_owned()
            .map_err(|e| Error::io("dup", &self.path, 0, e))?;
        Ok(Some(self.dup.get_or_init(|| Arc::new(owned)).clone()))
    }

    /// Writes `buf` at aligned `pos` and makes it durable in one step: one
    /// `pwritev2(RWF_DSYNC)` on the executor thread's sync-write thread (submitted at
    /// once, unlike a ring request, which waits for the executor's next I/O poll; the
    /// caller's task queue should be `Latency::Matters` so that the completion, a
    /// foreign wake, preempts other task queues).
    /// Hands the buffer back for reuse. On the simulated disk: a write, then a sync.
    pub async fn write_durable(&self, pos: u64, buf: AlignedBuf) -> Result<AlignedBuf> {
        debug_assert!(pos.is_multiple_of(PAGE as u64) && buf.as_slice().len().is_multiple_of(PAGE));
        match &self.backing {
            Backing::Dma(_) => {
                let fd = self.shared_fd()?.expect("a real file has a descriptor");
                let (r, buf) = syncer::write_dsync(fd, pos, buf).await;
                r.map_err(|e| Error::io("write+fdatasync", &self.path, pos, e))?;
                Ok(buf)
            }
            Backing::Sim(d, ino) => {
                d.write(*ino, pos, buf.as_slice())
                    .map_err(|e| Error::io("write", &self.path, pos, e))?;
                d.sync(*ino)
                    .map_err(|e| Error::io("fdatasync", &self.path, 0, e))?;
                Ok(buf)
            }
        }
    }

    /// Reads up to `len` bytes at any offset (short at end of file).
    pub async fn read(&self, pos: u64, len: usize) -> Result<ReadBuf> {
        match &self.backing {
            Backing::Dma(dma) => dma
                .read_at(pos, len)
                .await
                .map(ReadBuf::Dma)
                .map_err(|e| Error::glommio("read", &self.path, pos, e)),
            Backing::Sim(d, ino) => d
                .read(*ino, pos, len)
                .map(ReadBuf::Mem)
                .map_err(|e| Error::io("read", &self.path, pos, e)),
        }
    }

    pub async fn sync(&self) -> Result<()> {
        match &self.backing {
            Backing::Dma(dma) => dma
                .fdatasync()
                .await
                .map_err(|e| Error::glommio("fdatasync", &self.path, 0, e)),
            Backing::Sim(d, ino) => d
                .sync(*ino)
                .map_err(|e| Error::io("fdatasync", &self.path, 0, e)),
        }
    }

    pub async fn truncate(&self, len: u64) -> Result<()> {
        match &self.backing {
            Backing::Dma(dma) => dma
                .truncate(len)
                .await
                .map_err(|e| Error::glommio("truncate", &self.path, len, e)),
            Backing::Sim(d, ino) => d
                .truncate(*ino, len)
                .map_err(|e| Error::io("truncate", &self.path, len, e)),
        }
    }

    pub async fn size(&self) -> Result<u64> {
        match &self.backing {
            Backing::Dma(dma) => dma
                .file_size()
                .await
                .map_err(|e| Error::glommio("stat", &self.path, 0, e)),
            Backing::Sim(d, ino) => d.len(*ino).map_err(|e| Error::io("stat", &self.path, 0, e)),
        }
    }
}

/// fsyncs a real directory so that created, renamed and removed entries are durable.
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

/// Files named by offset, sorted, and the other entries of a directory.
pub type OffsetListing = (Vec<(u64, PathBuf)>, Vec<PathBuf>);

/// [`Disk::list_offset_files`] on the real file system.
pub fn list_offset_files(dir: &Path) -> Result<OffsetListing> {
    Disk::Real.list_offset_files(dir)
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

/// The thread that runs durable writes for one shard (see [`File::write_durable`]):
/// created on first use by each executor thread, unpinned (it mostly waits for the
/// device), and ended when that thread ends. Jobs run one at a time, in order.
mod syncer {
    use super::{AlignedBuf, pwrite_dsync};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::{Arc, Mutex};
    use std::task::{Poll, Waker};

    type Outcome = (std::io::Result<()>, AlignedBuf);

    #[derive(Default)]
    struct Slot {
        done: Option<Outcome>,
        waker: Option<Waker>,
    }

    struct Job {
        fd: Arc<OwnedFd>,
        pos: u64,
        buf: AlignedBuf,
        slot: Arc<Mutex<Slot>>,
    }

    thread_local! {
        static TX: std::cell::OnceCell<flume::Sender<Job>> = const { std::cell::OnceCell::new() };
    }

    fn spawn() -> flume::Sender<Job> {
        let (tx, rx) = flume::unbounded::<Job>();
        std::thread::Builder::new()
            .name("coremq-sync".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let r = pwrite_dsync(job.fd.as_raw_fd(), job.pos, job.buf.as_slice());
                    let mut slot = job.slot.lock().unwrap_or_else(|p| p.into_inner());
                    slot.done = Some((r, job.buf));
                    if let Some(w) = slot.waker.take() {
                        w.wake();
                    }
                }
            })
            .expect("spawn the sync-write thread");
        tx
    }

    pub(super) async fn write_dsync(fd: Arc<OwnedFd>, pos: u64, buf: AlignedBuf) -> Outcome {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let job = Job {
            fd,
            pos,
            buf,
            slot: slot.clone(),
        };
        TX.with(|tx| tx.get_or_init(spawn).send(job))
            .expect("the sync-write thread runs while its executor does");
        std::future::poll_fn(|cx| {
            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
            match s.done.take() {
                Some(o) => Poll::Ready(o),
                None => {
                    s.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}
