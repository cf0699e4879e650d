//! A connection's pending output (issue 20): response frames encoded back to back into
//! one buffer, with large bodies (pulled records, straight from the store's buffers)
//! queued beside them as `Bytes` instead of copied, and written with vectored
//! `sendmsg` calls (as many iovecs as the queue holds, up to [`MAX_IOVECS`] a call).
//!
//! The buffer and the segment list keep their capacity when cleared, so a busy
//! connection allocates nothing once warm.

use bytes::Bytes;
use std::os::fd::RawFd;

/// Bodies shorter than this are copied into the buffer (an iovec costs more).
pub const COPY_BELOW: usize = 512;

/// Most iovecs one `sendmsg` call takes (Linux's `UIO_MAXIOV` is 1024).
pub const MAX_IOVECS: usize = 256;

#[derive(Debug)]
enum Seg {
    /// `buf[start..end]`.
    Buf(usize, usize),
    Body(Bytes),
}

/// Bytes waiting to be written, in order.
#[derive(Debug, Default)]
pub struct OutQueue {
    buf: Vec<u8>,
    segs: Vec<Seg>,
    /// Bytes queued and not yet written.
    pending: usize,
    /// Bytes of the first segment already written.
    head_done: usize,
    /// Index of the first segment not fully written.
    head: usize,
}

impl OutQueue {
    /// Bytes waiting.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Appends bytes written by `f` into the buffer (it may only append).
    pub fn inline<R>(&mut self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let start = self.buf.len();
        let r = f(&mut self.buf);
        let end = self.buf.len();
        assert!(end >= start, "OutQueue::inline may only append");
        if end > start {
            match self.segs.last_mut() {
                Some(Seg::Buf(_, e)) if *e == start => *e = end,
                _ => self.segs.push(Seg::Buf(start, end)),
            }
            self.pending += end - start;
        }
        r
    }

    /// Appends a body: copied when short, else queued as it is.
    pub fn push_body(&mut self, body: Bytes) {
        if body.len() < COPY_BELOW {
            self.inline(|b| b.extend_from_slice(&body));
        } else {
            self.pending += body.len();
            self.segs.push(Seg::Body(body));
        }
    }

    /// Forgets everything (keeps the capacity).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.segs.clear();
        self.pending = 0;
        self.head = 0;
        self.head_done = 0;
    }

    /// The unwritten bytes of the first segment.
    pub fn first_slice(&self) -> &[u8] {
        match self.segs.get(self.head) {
            Some(Seg::Buf(s, e)) => &self.buf[s + self.head_done..*e],
            Some(Seg::Body(b)) => &b[self.head_done..],
            None => &[],
        }
    }

    /// Marks `n` more bytes written.
    pub fn advance(&mut self, mut n: usize) {
        assert!(n <= self.pending, "advanced past the queued bytes");
        self.pending -= n;
        while n > 0 {
            let left = self.first_slice().len();
            if n < left {
                self.head_done += n;
                return;
            }
            n -= left;
            self.head += 1;
            self.head_done = 0;
        }
        if self.pending == 0 {
            self.clear();
        }
    }

    /// One non-blocking vectored write of what waits (`MSG_DONTWAIT`, no SIGPIPE).
    /// `Ok(n)`: `n` bytes written (the queue advanced); `Err(WouldBlock)` when the
    /// socket has no room.
    pub fn write_to(&mut self, fd: RawFd) -> std::io::Result<usize> {
        if self.pending == 0 {
            return Ok(0);
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOVECS];
        let mut n = 0;
        for (i, seg) in self.segs[self.head..].iter().enumerate() {
            if n == MAX_IOVECS {
                break;
            }
            let skip = if i == 0 { self.head_done } else { 0 };
            let s: &[u8] = match seg {
                Seg::Buf(a, b) => &self.buf[a + skip..*b],
                Seg::Body(b) => &b[skip..],
            };
            if s.is_empty() {
                continue;
            }
            iov[n] = libc::iovec {
                iov_base: s.as_ptr() as *mut libc::c_void,
                iov_len: s.len(),
            };
            n += 1;
        }
        // SAFETY: a zeroed msghdr is valid; `iov[..n]` point into buffers this queue
        // owns, which outlive the call.
        let wrote = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n as _;
            libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if wrote < 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.advance(wrote as usize);
        Ok(wrote as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut OutQueue, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while !q.is_empty() {
            let s = q.first_slice();
            let n = s.len().min(step);
            out.extend_from_slice(&s[..n]);
            q.advance(n);
        }
        out
    }

    #[test]
    fn segments_come_out_in_order_whatever_the_write_sizes() {
        for step in [1, 3, 7, 600, 10_000] {
            let mut q = OutQueue::default();
            let mut want = Vec::new();
            q.inline(|b| b.extend_from_slice(b"head1"));
            want.extend_from_slice(b"head1");
            let big = Bytes::from(vec![7u8; 1000]);
            q.push_body(big.clone());
            want.extend_from_slice(&big);
            q.push_body(Bytes::from_static(b"short"));
            want.extend_from_slice(b"short");
            q.inline(|b| b.extend_from_slice(b"head2"));
            want.extend_from_slice(b"head2");
            q.push_body(Bytes::new());
            assert_eq!(q.pending(), want.len());
            assert_eq!(drain(&mut q, step), want);
            assert!(q.is_empty() && q.buf.is_empty() && q.segs.is_empty());
        }
    }

    #[test]
    fn writes_to_a_socket_vectored() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut q = OutQueue::default();
        q.inline(|v| v.extend_from_slice(b"abc"));
        q.push_body(Bytes::from(vec![1u8; 4000]));
        q.inline(|v| v.extend_from_slice(b"xyz"));
        use std::os::fd::AsRawFd;
        let mut total = 0;
        while !q.is_empty() {
            total += q.write_to(a.as_raw_fd()).unwrap();
        }
        assert_eq!(total, 4006);
        let mut got = vec![0u8; 4006];
        use std::io::Read;
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(&got[..3], b"abc");
        assert_eq!(&got[4003..], b"xyz");
    }
}
