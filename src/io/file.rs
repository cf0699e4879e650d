//! A store file ([`File`]): positioned DMA reads and writes, durable writes, fdatasync,
//! truncate and size, on the real disk (a glommio `DmaFile`, O_DIRECT) or the simulated
//! one. Every error names the operation, the path and the offset. Writes take aligned
//! offsets and page-multiple lengths; reads may be short only at the end of the file.

use super::dsync::write_dsync;
use super::{AlignedBuf, PAGE, ReadBuf, SimDisk};
use crate::error::{Error, Result};
use glommio::io::DmaFile;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

/// What a [`File`] is open on.
pub(super) enum Backing {
    /// Taken only by `File::drop`.
    Dma(ManuallyDrop<DmaFile>),
    Sim(Arc<SimDisk>, u64),
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
    pub(super) fn new(path: &Path, backing: Backing) -> Rc<File> {
        Rc::new(File {
            path: path.to_path_buf(),
            backing,
            dup: Default::default(),
        })
    }

    /// Writes `data` at `pos`; both must be aligned and `data.len()` a page multiple.
    pub async fn write_aligned(&self, pos: u64, data: &[u8]) -> Result<()> {
        debug_assert!(pos.is_multiple_of(PAGE as u64) && data.len().is_multiple_of(PAGE));
        match &self.backing {
            Backing::Dma(dma) => {
                let mut buf = dma.alloc_dma_buffer(data.len());
                buf.as_bytes_mut().copy_from_slice(data);
                self.write_buf(pos, buf).await
            }
            Backing::Sim(d, ino) => self.write_sim(d, *ino, pos, data).await,
        }
    }

    pub async fn write_buf(&self, pos: u64, buf: glommio::io::DmaBuffer) -> Result<()> {
        match &self.backing {
            Backing::Dma(dma) => {
                let len = buf.len();
                let n = dma.write_at(buf, pos).await;
                self.written(pos, len, n)
            }
            Backing::Sim(d, ino) => self.write_sim(d, *ino, pos, buf.as_bytes()).await,
        }
    }

    /// Writes a shared buffer (kept alive by the caller too) at aligned `pos`.
    pub async fn write_rc(&self, pos: u64, buf: Rc<glommio::io::DmaBuffer>) -> Result<()> {
        match &self.backing {
            Backing::Dma(dma) => {
                let len = buf.len();
                let n = dma.write_rc_at(buf, pos).await;
                self.written(pos, len, n)
            }
            Backing::Sim(d, ino) => self.write_sim(d, *ino, pos, buf.as_bytes()).await,
        }
    }

    /// A write to the simulated disk; it waits (without blocking the thread, as an
    /// io_uring write does) while the disk is stalled.
    async fn write_sim(&self, d: &SimDisk, ino: u64, pos: u64, data: &[u8]) -> Result<()> {
        d.unstalled().await;
        d.write(ino, pos, data)
            .map_err(|e| Error::io("write", &self.path, pos, e))
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
                let (r, buf) = write_dsync(fd, pos, buf).await;
                r.map_err(|e| Error::io("write+fdatasync", &self.path, pos, e))?;
                Ok(buf)
            }
            Backing::Sim(d, ino) => {
                d.unstalled().await;
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
            Backing::Sim(d, ino) => {
                d.unstalled().await;
                d.sync(*ino)
                    .map_err(|e| Error::io("fdatasync", &self.path, 0, e))
            }
        }
    }

    pub async fn truncate(&self, len: u64) -> Result<()> {
        match &self.backing {
            Backing::Dma(dma) => dma
                .truncate(len)
                .await
                .map_err(|e| Error::glommio("truncate", &self.path, len, e)),
            Backing::Sim(d, ino) => {
                d.unstalled().await;
                d.truncate(*ino, len)
                    .map_err(|e| Error::io("truncate", &self.path, len, e))
            }
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
