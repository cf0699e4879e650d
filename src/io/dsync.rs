//! Durable writes off the executor: `pwritev2(RWF_DSYNC)` (the bytes are durable when
//! the call returns: the kernel writes and then flushes the device cache, or uses FUA)
//! and the per-executor sync-write thread that runs them for [`File::write_durable`].
//!
//! Why a thread and not the io_uring ring: glommio submits a ring request only at the
//! executor's next I/O poll, which under load waits for a burst of puts; a blocking
//! call on a thread starts at once. The group-commit thread (`commit_log::group_commit`)
//! calls [`pwritev_dsync`] itself. Where `RWF_DSYNC` is not supported the write falls
//! back to `pwrite` + `fdatasync`.
//!
//! [`File::write_durable`]: super::File::write_durable

use super::AlignedBuf;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

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

// The sync-write thread: one per executor thread, created on first use, unpinned (it
// mostly waits for the device), and ended when that thread ends (its channel closes).
// Jobs run one at a time, in order.

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

/// Runs `pwrite_dsync(fd, pos, buf)` on this executor thread's sync-write thread and
/// hands the buffer back with the outcome.
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
