//! The root lock: one process at a time opens a store root (RocketMQ's `lock` file and
//! its "MQ already started" guard). On the real disk an exclusive `flock` on
//! `<root>/lock`, released when the process exits or the [`RootLock`] is dropped; on the
//! simulated disk a name the [`SimDisk`] holds.

use super::{Disk, SimDisk};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

impl Disk {
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
