use std::{
    fmt, io,
    marker::PhantomData,
    mem::MaybeUninit,
    ptr::{self, NonNull},
};

use super::{resultify, CQEs, CQEsBlocking, IoUring, CQE};
use crate::uring_sys;

/// The queue of completed IO events.
///
/// Each element is a [`CQE`](crate::cqe::CQE).
///
/// Completion does not imply success. Completed events may be
/// [timeouts](crate::cqe::CQE::is_iou_timeout).
pub struct CompletionQueue<'ring> {
    pub(crate) ring: NonNull<uring_sys::io_uring>,
    _marker: PhantomData<&'ring mut IoUring>,
}

impl<'ring> CompletionQueue<'ring> {
    pub(crate) fn new(ring: &'ring IoUring) -> CompletionQueue<'ring> {
        CompletionQueue {
            ring: NonNull::from(&ring.ring),
            _marker: PhantomData,
        }
    }

    /// Returns the next CQE if any are available.
    pub fn peek_for_cqe(&mut self) -> Option<CQE> {
        unsafe {
            let mut cqe = MaybeUninit::uninit();
            uring_sys::io_uring_peek_cqe(self.ring.as_ptr(), cqe.as_mut_ptr());
            let cqe = cqe.assume_init();
            if !cqe.is_null() {
                Some(CQE::new(self.ring, &mut *cqe))
            } else {
                None
            }
        }
    }

    /// Returns the next CQE, blocking the thread until one is ready if
    /// necessary.
    pub fn wait_for_cqe(&mut self) -> io::Result<CQE> {
        self.wait_for_cqes(1)
    }

    #[inline(always)]
    pub(crate) fn wait_for_cqes(&mut self, count: u32) -> io::Result<CQE> {
        let ring = self.ring;
        self.wait_inner(count).map(|cqe| CQE::new(ring, cqe))
    }

    /// Block the thread until at least `count` CQEs are ready.
    ///
    /// These CQEs can be processed using `peek_for_cqe` or the `cqes` iterator.
    pub fn wait(&mut self, count: u32) -> io::Result<()> {
        self.wait_inner(count).map(|_| ())
    }

    // coremq patch: `wait` that returns `ETIME` once `timeout` has passed, for the
    // bounded park (`MAX_PARK` in sys/uring.rs). With IORING_FEAT_EXT_ARG (Linux 5.11+)
    // liburing passes the timeout to io_uring_enter itself; before that it queues a
    // timeout SQE whose CQE its peek skips. Consumes no CQE, like `wait`.
    pub fn wait_with_timeout(
        &mut self,
        count: u32,
        timeout: std::time::Duration,
    ) -> io::Result<()> {
        let ts = uring_sys::__kernel_timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        unsafe {
            let mut cqe = MaybeUninit::uninit();
            resultify(uring_sys::io_uring_wait_cqes(
                self.ring.as_ptr(),
                cqe.as_mut_ptr(),
                count as _,
                &ts,
                ptr::null(),
            ))?;
        }
        Ok(())
    }

    // coremq patch u: submits the prepared SQEs and waits for `count` completions or
    // `timeout` in one `io_uring_enter` (`IORING_ENTER_EXT_ARG`, Linux 5.11+), what
    // `SubmissionQueue::submit` then `wait_with_timeout` did in two. `None` when the
    // kernel lacks EXT_ARG (the caller makes the two calls). `Ok(n)`: `n` SQEs were
    // submitted; the kernel waits only once all of them were, and reports a wait's end
    // (a completion, the timeout, a signal) as that count.
    pub fn submit_and_wait_ext(
        &mut self,
        count: u32,
        timeout: std::time::Duration,
    ) -> Option<io::Result<u32>> {
        const IORING_FEAT_EXT_ARG: libc::c_uint = 1 << 8;
        const IORING_ENTER_EXT_ARG: libc::c_uint = 1 << 3;
        // `struct io_uring_getevents_arg` of linux/io_uring.h.
        #[repr(C)]
        struct GetEventsArg {
            sigmask: u64,
            sigmask_sz: u32,
            pad: u32,
            ts: u64,
        }
        let ring = self.ring.as_ptr();
        // SAFETY: `ring` is this queue's live ring; `ts` and `arg` outlive the call.
        unsafe {
            if (*ring).features & IORING_FEAT_EXT_ARG == 0 {
                return None;
            }
            let submit = uring_sys::__io_uring_flush_sq(ring);
            let ts = uring_sys::__kernel_timespec {
                tv_sec: timeout.as_secs() as _,
                tv_nsec: timeout.subsec_nanos() as _,
            };
            let arg = GetEventsArg {
                sigmask: 0,
                sigmask_sz: 8,
                pad: 0,
                ts: &ts as *const _ as u64,
            };
            let ret = libc::syscall(
                libc::SYS_io_uring_enter,
                (*ring).ring_fd,
                submit as libc::c_uint,
                count as libc::c_uint,
                uring_sys::IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                &arg as *const GetEventsArg,
                std::mem::size_of::<GetEventsArg>(),
            );
            Some(if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(ret as u32)
            })
        }
    }

    #[inline(always)]
    fn wait_inner(&mut self, count: u32) -> io::Result<&mut uring_sys::io_uring_cqe> {
        unsafe {
            let mut cqe = MaybeUninit::uninit();

            resultify(uring_sys::io_uring_wait_cqes(
                self.ring.as_ptr(),
                cqe.as_mut_ptr(),
                count as _,
                ptr::null(),
                ptr::null(),
            ))?;

            Ok(&mut *cqe.assume_init())
        }
    }

    /// Returns an iterator of ready CQEs.
    ///
    /// When there are no CQEs ready to process, the iterator will end. It will
    /// never block the thread to wait for CQEs to be completed.
    pub fn cqes(&mut self) -> CQEs<'_> {
        CQEs::new(self.ring)
    }

    /// Returns an iterator of ready CQEs, blocking when there are none ready.
    ///
    /// This iterator never ends. Whenever there are no CQEs ready, it will
    /// block the thread until at least `wait_for` CQEs are ready.
    pub fn cqes_blocking(&mut self, wait_for: u32) -> CQEsBlocking<'_> {
        CQEsBlocking::new(self.ring, wait_for)
    }

    pub fn ready(&self) -> u32 {
        unsafe { uring_sys::io_uring_cq_ready(self.ring.as_ptr()) }
    }

    pub fn eventfd_enabled(&self) -> bool {
        unsafe { uring_sys::io_uring_cq_eventfd_enabled(self.ring.as_ptr()) }
    }

    pub fn eventfd_toggle(&mut self, enabled: bool) -> io::Result<()> {
        resultify(unsafe { uring_sys::io_uring_cq_eventfd_toggle(self.ring.as_ptr(), enabled) })?;
        Ok(())
    }
}

impl fmt::Debug for CompletionQueue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fd = unsafe { self.ring.as_ref().ring_fd };
        f.debug_struct(std::any::type_name::<Self>())
            .field("fd", &fd)
            .finish()
    }
}

unsafe impl<'ring> Send for CompletionQueue<'ring> {}
unsafe impl<'ring> Sync for CompletionQueue<'ring> {}
