//! The disk a store runs on ([`Disk`]: real or simulated) and its file-system calls:
//! directories, small durable files, opening and creating store files, `SEEK_DATA`,
//! free space. Every failure becomes an error naming the operation, the path and the
//! offset.
//!
//! A directory entry (a created, renamed or removed file or directory) is durable only
//! once its directory is fsynced. `create_dir_all` syncs every directory it creates
//! and the parent holding the topmost one; `create_sized`, `write_file_durable` and
//! `replace_file` sync the file's directory, `remove_dir_all` its parent; after
//! `open(create)` and `remove_file` the caller syncs the directory (`sync_dir`) before
//! it relies on the change (the simulated disk loses unsynced entries).
//!
//! glommio decides once per executor thread whether a device supports polled I/O by
//! reading the first block of the first `DmaFile` it opens. If that block was never
//! written (empty, sparse or preallocated file) the probe wrongly succeeds and later
//! reads fail with EOPNOTSUPP. [`prime_executor`] opens a small file holding real data
//! and reads it back before the store opens anything else.

use super::file::{Backing, File};
use super::{PAGE, SimDisk};
use crate::error::{Error, Result};
use glommio::io::{DmaFile, OpenOptions};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

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

/// One entry of a directory listing.
pub struct DirEntry {
    pub name: String,
    pub path: PathBuf,
    pub is_dir: bool,
}

impl Disk {
    /// Makes glommio's per-thread iopoll probe see real data (see module docs).
    pub async fn prime_executor(&self, dir: &Path) -> Result<()> {
        match self {
            Disk::Real => prime_executor(dir).await,
            Disk::Sim(_) => Ok(()),
        }
    }

    /// Creates `dir` and any missing parents, and makes them durable: each new
    /// directory is fsynced, and so is the parent of the topmost one, which holds its
    /// entry (a directory entry is durable only once its parent is synced). Nothing is
    /// synced when `dir` exists.
    pub fn create_dir_all(&self, dir: &Path) -> Result<()> {
        let mut new = Vec::new();
        let mut at = Some(dir);
        while let Some(p) = at.filter(|p| !p.as_os_str().is_empty() && !self.exists(p)) {
            new.push(p);
            at = p.parent();
        }
        if new.is_empty() {
            return Ok(());
        }
        match self {
            Disk::Real => std::fs::create_dir_all(dir),
            Disk::Sim(d) => d.create_dir_all(dir),
        }
        .map_err(|e| Error::io("create dir", dir, 0, e))?;
        for p in &new {
            self.sync_dir(p)?;
        }
        match at {
            Some(p) if !p.as_os_str().is_empty() => self.sync_dir(p),
            // A relative path's top: its entry is in the current directory.
            Some(_) if matches!(self, Disk::Real) => self.sync_dir(Path::new(".")),
            _ => Ok(()),
        }
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

    /// Removes a file; durable once the caller syncs the directory (`sync_dir`).
    pub fn remove_file(&self, path: &Path) -> Result<()> {
        match self {
            Disk::Real => std::fs::remove_file(path),
            Disk::Sim(d) => d.remove_file(path),
        }
        .map_err(|e| Error::io("remove", path, 0, e))
    }

    /// Renames `from` to `to` (replacing `to`); durable once the caller syncs both
    /// directories (`sync_dir`): until then a crash may leave either name or both.
    pub fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        match self {
            Disk::Real => std::fs::rename(from, to),
            Disk::Sim(d) => d.rename(from, to),
        }
        .map_err(|e| Error::io("rename", from, 0, e))
    }

    /// How many directory entries name the file at `path` (`st_nlink`): more than one
    /// after a crash in the middle of a rename between two directories.
    pub fn link_count(&self, path: &Path) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        match self {
            Disk::Real => std::fs::metadata(path).map(|m| m.nlink()),
            Disk::Sim(d) => d.link_count(path),
        }
        .map_err(|e| Error::io("stat", path, 0, e))
    }

    /// Removes a directory tree and syncs its parent, so the removal is durable.
    pub fn remove_dir_all(&self, path: &Path) -> Result<()> {
        match self {
            Disk::Real => std::fs::remove_dir_all(path),
            Disk::Sim(d) => d.remove_dir_all(path),
        }
        .map_err(|e| Error::io("remove dir", path, 0, e))?;
        self.sync_dir(path.parent().unwrap_or(Path::new(".")))
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

    /// (total, available) bytes of the file system holding `path`, where total is
    /// what is used plus what is available to the store (blocks reserved for root
    /// left out), so `1 - available / total` is `df`'s Use%.
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
                // Blocks reserved for root are neither: used / total is then `df`'s
                // Use% and RocketMQ's disk ratio (used / (used + usable)).
                let used = (s.f_blocks as u64).saturating_sub(s.f_bfree as u64) * frsize;
                let avail = s.f_bavail as u64 * frsize;
                Ok(Some((used + avail, avail)))
            }
            Disk::Sim(d) => Ok(d.space()),
        }
    }

    /// Opens (creating if asked) read-write: O_DIRECT on the real disk, and
    /// O_NOATIME where the file system lets this process (it owns the file, or has
    /// CAP_FOWNER). A created file's name is durable once the caller syncs its
    /// directory.
    ///
    /// Why O_NOATIME: under `relatime` (ext4's default) every read of a file written
    /// since its last access updates its access time, a journal handle taken by the
    /// reading thread, which for an io_uring read issued inline is the shard's own
    /// executor; while the device stalls, starting a handle can wait for a journal
    /// commit that waits for the device. Nothing in the store reads access times.
    pub async fn open(&self, path: &Path, create: bool) -> Result<Rc<File>> {
        let backing = match self {
            Disk::Real => {
                let mut opts = OpenOptions::new();
                opts.read(true).write(true).create(create);
                let f = match opts.custom_flags(libc::O_NOATIME).dma_open(path).await {
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        opts.custom_flags(0).dma_open(path).await
                    }
                    r => r,
                };
                Backing::Dma(ManuallyDrop::new(
                    f.map_err(|e| Error::glommio("open", path, 0, e))?,
                ))
            }
            Disk::Sim(d) => Backing::Sim(
                d.clone(),
                d.open(path, create)
                    .map_err(|e| Error::io("open", path, 0, e))?,
            ),
        };
        Ok(File::new(path, backing))
    }

    /// Creates a file of exactly `len` bytes (sparse) and makes it and its name durable
    /// (the directory sync off the executor: files are created while the store runs).
    pub async fn create_sized(&self, path: &Path, len: u64) -> Result<Rc<File>> {
        let f = self.open(path, true).await?;
        f.truncate(len).await?;
        f.sync().await?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        self.off_executor(move |d| d.sync_dir(&dir)).await?;
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

/// fsyncs a real directory so that created, renamed and removed entries are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync dir", dir, 0, e))
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
