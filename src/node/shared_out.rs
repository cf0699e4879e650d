//! A connection's output as every shard sees it (issue 22): its [`OutQueue`] behind a
//! lock, and its socket, so that the shard owning a routed send's queue answers the
//! client itself instead of handing the result back to the connection's shard.
//!
//! * **Why.** A send whose queue another shard owns used to cost the connection's
//!   shard a second wake-up (or a spin) for the owner's reply, then the encoding and
//!   the `sendmsg`; with one send in flight (every message parks the shards) a node of
//!   two shards spent 82-93 us of CPU per send against 49-61 us for one shard
//!   (docs/performance/node.md, "Routed sends answered by their owner").
//! * **Order on the wire.** Frames never interleave: every write, from either
//!   thread, happens under the lock, and a thread writes only when nothing is queued
//!   before it and the connection's writer is not sending a batch it took out of the
//!   queue (`writing`); otherwise its frame is queued behind the others and the writer
//!   sends it. Answers of different requests may leave in any order, as RocketMQ's
//!   processor pools answer them (clients match them by opaque).
//! * **The socket outlives every answerer.** Writes go to a duplicate of the socket's
//!   descriptor owned here: a connection closed meanwhile cannot have its descriptor
//!   number reused under an answer in flight. The connection's writer closes only once
//!   no routed send is unanswered ([`SharedOut::remote`]).
//! * **Only non-blocking writes off the connection's thread.** An answering shard
//!   sends what the socket takes at once; what it does not take stays queued and the
//!   connection's writer (woken through its waker) waits for room.

use super::out_queue::OutQueue;
use crate::message::Message;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::Waker;

/// The connection's output, shared with the shards answering its routed sends.
pub(crate) struct SharedOut {
    /// A duplicate of the connection's socket (module docs).
    fd: OwnedFd,
    state: Mutex<OutState>,
    /// Routed sends handed to their owner and not answered yet.
    remote: AtomicU64,
    /// The connection's reader has stopped: its writer waits for `remote` to reach 0.
    closing: AtomicBool,
    /// Messages of answered routed sends, back for the connection's thread to reuse
    /// (`processor::pool`; freed on the owner's thread, their strings took the
    /// allocating thread's glibc arena lock, see `StoreOps::put_and_return`).
    returned: Mutex<Vec<Message>>,
    returned_n: AtomicUsize,
}

/// Most messages waiting in [`SharedOut::give_back`]; beyond, they are freed.
const RETURNED_MAX: usize = 256;

#[derive(Default)]
struct OutState {
    out: OutQueue,
    /// The connection's writer is sending a batch it took out of `out`.
    writing: bool,
    /// A write failed: answers are dropped.
    broken: bool,
    /// The connection's writer, when it waits for answers.
    writer: Option<Waker>,
}

impl SharedOut {
    /// For the connection on socket `fd` (duplicated here).
    pub fn new(fd: RawFd) -> std::io::Result<SharedOut> {
        // SAFETY: duplicates a descriptor the caller holds open; the result is owned
        // by the `OwnedFd` alone.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedOut {
            // SAFETY: `dup` is a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(dup) },
            state: Mutex::new(OutState::default()),
            remote: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            returned: Mutex::new(Vec::new()),
            returned_n: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutState> {
        // A panic while holding it left at worst a half-queued frame's bytes: the
        // connection is marked broken rather than risk a corrupt stream.
        self.state.lock().unwrap_or_else(|poisoned| {
            let mut s = poisoned.into_inner();
            s.broken = true;
            s
        })
    }

    /// Queues bytes for the connection's writer (the connection's own answers and
    /// requests: written in batches by its writer) and wakes it.
    pub fn queue(&self, f: impl FnOnce(&mut OutQueue)) {
        let mut s = self.lock();
        if s.broken {
            return;
        }
        f(&mut s.out);
        let w = s.writer.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Wakes the connection's writer to look again (a task ended, the reader stopped).
    pub fn wake_writer(&self) {
        let w = self.lock().writer.take();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Answers from another shard (module docs): writes `f`'s frame at once when
    /// nothing waits before it and no other routed send of the connection is
    /// unanswered, else queues it for the connection's writer (which sends the answers
    /// of a busy connection in batches, one `sendmsg` for many).
    pub fn answer(&self, f: impl FnOnce(&mut OutQueue)) {
        self.write_or_queue(1, f)
    }

    /// A lone request's answer on the connection's own shard (`conn.rs`): written at
    /// once, as [`SharedOut::answer`] does, when nothing waits before it and no routed
    /// send is unanswered; the writer task is then not woken for it.
    pub fn answer_here(&self, f: impl FnOnce(&mut OutQueue)) {
        self.write_or_queue(0, f)
    }

    /// Writes `f`'s frame at once when nothing is queued or being written and at most
    /// `routed` routed sends are unanswered (the one answering counts), else queues it.
    fn write_or_queue(&self, routed: u64, f: impl FnOnce(&mut OutQueue)) {
        let mut s = self.lock();
        if s.broken {
            return;
        }
        let direct =
            !s.writing && s.out.is_empty() && self.remote.load(Ordering::Acquire) <= routed;
        f(&mut s.out);
        if direct {
            loop {
                match s.out.write_to(self.fd.as_raw_fd()) {
                    Ok(_) if s.out.is_empty() => {
                        s.out.clear();
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // The socket is full: the writer waits for room.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "answer written at once failed");
                        s.broken = true;
                        s.out.clear();
                        break;
                    }
                }
            }
        }
        let w = s.writer.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Bytes queued and not yet written.
    pub fn pending(&self) -> usize {
        self.lock().out.pending()
    }

    pub fn is_broken(&self) -> bool {
        self.lock().broken
    }

    /// The writer's turn: everything queued moves into `into` (which must be empty)
    /// and `writing` is set until [`Self::sent`]; `None` (the waker kept) when nothing
    /// is queued.
    pub fn take_batch(&self, into: &mut OutQueue, waker: &Waker) -> Option<()> {
        let mut s = self.lock();
        if s.out.is_empty() {
            match &s.writer {
                Some(w) if w.will_wake(waker) => {}
                _ => s.writer = Some(waker.clone()),
            }
            return None;
        }
        std::mem::swap(into, &mut s.out);
        s.writing = true;
        Some(())
    }

    /// The writer sent its batch (`Err`: the write failed, answers are dropped).
    pub fn sent(&self, failed: bool) {
        let mut s = self.lock();
        s.writing = false;
        if failed {
            s.broken = true;
            s.out.clear();
        }
    }

    /// The socket (the duplicate) for the writer's own sends.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A routed send was handed to its owner; [`Self::remote_done`] when answered.
    pub fn remote_started(&self) {
        self.remote.fetch_add(1, Ordering::AcqRel);
    }

    /// A routed send was answered (or its answer dropped): wakes the writer when it
    /// waits for the last one to close the connection.
    pub fn remote_done(&self) {
        let left = self.remote.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 && self.closing.load(Ordering::Acquire) {
            self.wake_writer();
        }
    }

    /// Routed sends not answered yet.
    pub fn remote(&self) -> u64 {
        self.remote.load(Ordering::Acquire)
    }

    /// A routed send's message, back for the connection's thread (see `returned`).
    pub fn give_back(&self, m: Message) {
        if self.returned_n.load(Ordering::Relaxed) < RETURNED_MAX {
            let mut r = self.returned.lock().unwrap_or_else(|p| p.into_inner());
            r.push(m);
            self.returned_n.store(r.len(), Ordering::Relaxed);
        }
    }

    /// Hands every message given back to `f` (on the connection's thread).
    pub fn take_returned(&self, mut f: impl FnMut(Message)) {
        if self.returned_n.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut r = self.returned.lock().unwrap_or_else(|p| p.into_inner());
        self.returned_n.store(0, Ordering::Relaxed);
        r.drain(..).for_each(&mut f);
    }

    /// The reader stopped (see `remote_done`).
    pub fn close_reading(&self) {
        self.closing.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A connected pair of Unix stream sockets: (the connection's end, the peer's).
    fn pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
        assert_eq!(r, 0);
        // SAFETY: both are fresh descriptors owned by nothing else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    /// What the peer can read right now (non-blocking).
    fn readable(peer: &OwnedFd) -> Vec<u8> {
        let mut buf = vec![0u8; 1 << 16];
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::recv(
                peer.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        buf.truncate(n.max(0) as usize);
        buf
    }

    fn frame(q: &mut OutQueue, text: &[u8]) {
        q.inline(|b| b.extend_from_slice(text));
    }

    /// The connection's writer, by hand: takes a batch out of the queue, sends it.
    struct Writer {
        batch: OutQueue,
        waker: Waker,
    }

    impl Writer {
        fn new() -> Writer {
            let waker = futures_lite::future::block_on(futures_lite::future::poll_fn(|cx| {
                std::task::Poll::Ready(cx.waker().clone())
            }));
            Writer {
                batch: OutQueue::default(),
                waker,
            }
        }

        /// Takes what is queued (there must be something).
        fn take(&mut self, out: &SharedOut) {
            self.batch.clear();
            assert!(out.take_batch(&mut self.batch, &self.waker).is_some());
        }

        /// Sends the batch taken.
        fn send(&mut self, out: &SharedOut) {
            self.batch.write_to(out.raw_fd()).unwrap();
            out.sent(false);
        }
    }

    /// An owner's answer goes straight to the socket only when nothing is queued
    /// before it, the connection's writer is not sending a batch, and no other routed
    /// send of the connection is unanswered; otherwise it waits its turn in the queue.
    /// (Written at once in the middle of a writer's batch, it could land inside a
    /// frame the batch had only half sent.)
    #[test]
    fn an_answer_never_overtakes_what_is_queued_or_being_written() {
        let (conn, peer) = pair();
        let out = SharedOut::new(conn.as_raw_fd()).unwrap();
        let mut writer = Writer::new();

        // Alone: written at once.
        out.remote_started();
        out.answer(|q| frame(q, b"A1"));
        out.remote_done();
        assert_eq!(readable(&peer), b"A1");
        assert_eq!(out.pending(), 0);

        // The writer took a batch and is sending it: an answer waits behind it.
        out.queue(|q| frame(q, b"C1"));
        writer.take(&out);
        out.remote_started();
        out.answer(|q| frame(q, b"A2"));
        out.remote_done();
        assert_eq!(readable(&peer), b"", "written during the writer's batch");
        assert_eq!(out.pending(), 2);
        writer.send(&out);
        assert_eq!(readable(&peer), b"C1");
        // The writer's next turn takes the answer.
        writer.take(&out);
        writer.send(&out);
        assert_eq!(readable(&peer), b"A2");

        // Something queued (not yet taken by the writer): the answer goes behind it.
        out.queue(|q| frame(q, b"C2"));
        out.remote_started();
        out.answer(|q| frame(q, b"A3"));
        out.remote_done();
        assert_eq!(readable(&peer), b"");
        writer.take(&out);
        writer.send(&out);
        assert_eq!(readable(&peer), b"C2A3");

        // Other routed sends unanswered: queued for the writer's batched send.
        out.remote_started();
        out.remote_started();
        out.answer(|q| frame(q, b"A4"));
        out.remote_done();
        assert_eq!(readable(&peer), b"");
        assert_eq!(out.remote(), 1);
        out.remote_done();
    }

    /// A lone request's answer on the connection's own shard (`answer_here`): written at
    /// once only when nothing is queued or being written and no routed send is
    /// unanswered (a routed send's answer may be written at once by its owner, so one
    /// written here meanwhile could land inside it); otherwise queued for the writer.
    #[test]
    fn an_answer_here_waits_for_any_routed_send_and_for_the_queue() {
        let (conn, peer) = pair();
        let out = SharedOut::new(conn.as_raw_fd()).unwrap();
        let mut writer = Writer::new();

        // Alone: written at once, nothing left for the writer.
        out.answer_here(|q| frame(q, b"L1"));
        assert_eq!(readable(&peer), b"L1");
        assert_eq!(out.pending(), 0);

        // A routed send unanswered: queued.
        out.remote_started();
        out.answer_here(|q| frame(q, b"L2"));
        assert_eq!(
            readable(&peer),
            b"",
            "written while a routed send was unanswered"
        );
        assert_eq!(out.pending(), 2);
        out.remote_done();

        // Something queued before it: behind it, in the writer's batch.
        out.answer_here(|q| frame(q, b"L3"));
        assert_eq!(readable(&peer), b"");
        writer.take(&out);
        // The writer is sending its batch: a lone answer waits behind it.
        out.answer_here(|q| frame(q, b"L4"));
        assert_eq!(readable(&peer), b"", "written during the writer's batch");
        writer.send(&out);
        assert_eq!(readable(&peer), b"L2L3");
        writer.take(&out);
        writer.send(&out);
        assert_eq!(readable(&peer), b"L4");
    }

    /// A socket that takes nothing more: the answer stays queued whole (for the writer,
    /// which waits for room), and is sent in order once room comes.
    #[test]
    fn an_answer_to_a_full_socket_waits_for_the_writer() {
        let (conn, peer) = pair();
        let out = SharedOut::new(conn.as_raw_fd()).unwrap();
        // Fill the socket.
        let chunk = vec![7u8; 1 << 16];
        let mut filled = 0;
        loop {
            // SAFETY: writes from `chunk`, which outlives the call.
            let n = unsafe {
                libc::send(
                    out.raw_fd(),
                    chunk.as_ptr().cast(),
                    chunk.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                break;
            }
            filled += n as usize;
        }
        out.remote_started();
        out.answer(|q| frame(q, b"late answer"));
        out.remote_done();
        assert_eq!(out.pending(), b"late answer".len());
        assert!(!out.is_broken());
        // The peer drains; the writer's turn sends the answer after the filler.
        let mut got = 0;
        while got < filled {
            let r = readable(&peer);
            assert!(!r.is_empty(), "the filler is there to read");
            got += r.len();
        }
        let mut writer = Writer::new();
        writer.take(&out);
        writer.send(&out);
        assert_eq!(readable(&peer), b"late answer");
    }
}
