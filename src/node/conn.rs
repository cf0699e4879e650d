//! One connection served on its shard (`network = "shards"`), RocketMQ's
//! `NettyRemotingServer` channel pipeline with the protocol path's CPU cut down
//! (issue 20).
//!
//! * **Reading.** Each receive takes whatever the socket holds, up to the read
//!   buffer's room ([`READ_BUF`]); every whole frame in it is split off as `Bytes` of
//!   that buffer (a send's body reaches the store without a copy) and served; a frame
//!   not yet whole waits for the next receive. The buffer grows with the bytes that
//!   arrive, never with the length a peer declares (the length is checked against
//!   `max_frame_bytes` first).
//! * **Decoding.** The hot codes' headers (send 10, 310, 320; pull 11, 361) are read in
//!   place (`remoting::scan`, `remoting::headers`): no JSON value tree, no map of owned
//!   strings. Every other header, and any the in-place reader declines, goes through
//!   the general decoder into a `RemotingCommand` and `processor::process`, as before;
//!   a frame the general decoder refuses closes the connection, as before.
//! * **Serving.** The reader polls each request once itself; one that has to wait (a
//!   put routed to another shard, a held pull, a sync flush) goes on as its own task,
//!   so the requests of one connection are served concurrently and answered by opaque,
//!   as RocketMQ's processor pools do; at most [`MAX_IN_FLIGHT`] at once (held pulls
//!   not counted). Most sends end in that first poll: spawning a task for each (a
//!   2.6 KB future copied into its box, two allocations) was ~7.5% of the node's
//!   samples under single sends, ~4.5% with the first poll here.
//! * **Writing.** Answers are encoded straight into the connection's [`OutQueue`]
//!   (pulled records queued as the store's own buffers, never copied into one body),
//!   shared with the other shards as a `SharedOut` (`shared_out.rs`). One writer task
//!   sends everything queued with vectored `sendmsg` calls, so the answers to a burst
//!   of requests leave in one system call, and a held pull answered later never
//!   interleaves with another answer. The answer to a request the reader serves in
//!   its first poll, when nothing else is buffered (a lone request: light load, one in
//!   flight), is written by the reader at once if nothing is queued or being sent and
//!   no routed send is unanswered: no writer task runs per send (at 1,000 sends a
//!   second three task runs per send became two, shard CPU 69.5 -> 63.1 us per send
//!   on the means of seven interleaved pairs). A single send whose queue another
//!   shard owns is put and answered by that shard (one hop, no reply back to this
//!   shard): on the socket at once when it is the connection's only routed send in
//!   flight and nothing is queued or being sent, else queued for the writer. While
//!   more than [`OUT_HIGH_WATER`] bytes wait (a peer that does not read), the reader
//!   takes no new request: a slow peer stalls its own requests, not the node's memory.
//! * **Broker requests.** Check-backs (`state::Outboxes`) are queued as whole frames
//!   between answers by a forwarder task, until the reader stops.
//! * **Closing.** At the peer's end of stream, a read error or timeout
//!   (`idle_timeout_ms`), a malformed frame or the shard's stop, the reader stops
//!   taking requests; the writer sends what the requests still in flight (held pulls
//!   too) answer, then shuts the socket's write side.

use super::NodeState;
use super::out_queue::OutQueue;
use super::processor::There;
use super::processor::{self, Outcome, Reply, ReplyTo, Waiting};
use super::remoting::headers::{
    PULL_FIELD_COUNT, PullHeader, SEND_FIELD_COUNT, SendHeader, Spans, Typed, typed_for_code,
};
use super::remoting::scan::HeaderView;
use super::remoting::{self, FrameError, HEADER_WORD, LENGTH_PREFIX, RemotingCommand};
use super::shard_net::LocalStop;
use super::shard_view::ShardView;
use super::shared_out::SharedOut;
use bytes::{Bytes, BytesMut};
use futures_lite::AsyncWrite;
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};

/// Requests of one connection processed at once (held pulls not counted).
pub const MAX_IN_FLIGHT: u64 = 1024;

/// The read buffer's size: what one receive may take.
pub const READ_BUF: usize = 256 << 10;

/// Least free room a receive is offered (the buffer is renewed below it).
const MIN_ROOM: usize = 16 << 10;

/// Answers waiting for the peer beyond which the connection takes no new request.
pub const OUT_HIGH_WATER: usize = 4 << 20;

/// What the connection's reader, writer and request tasks share.
struct Shared {
    st: Arc<NodeState>,
    conn: u64,
    peer: SocketAddr,
    /// The output, shared with the shards that answer routed sends (`shared_out`).
    there: There,
    /// The reader, when it waits for room (in-flight requests, queued answers).
    reader: Cell<Option<Waker>>,
    /// Requests being processed (held pulls not counted).
    in_flight: Cell<u64>,
    /// Request tasks alive (held pulls counted).
    tasks: Cell<u64>,
    /// The request the reader is polling is the last its receive brought (nothing
    /// else buffered): its answer is written at once when nothing waits before it.
    lone: Cell<bool>,
    /// The reader has stopped taking requests.
    reader_done: Cell<bool>,
}

impl Shared {
    fn wake(slot: &Cell<Option<Waker>>) {
        if let Some(w) = slot.take() {
            w.wake();
        }
    }

    /// Parks `cx`'s task in `slot` (keeping the waker already there when it is the same).
    fn park(slot: &Cell<Option<Waker>>, waker: &Waker) {
        match slot.take() {
            Some(w) if w.will_wake(waker) => slot.set(Some(w)),
            _ => slot.set(Some(waker.clone())),
        }
    }

    /// Queues an answer for the writer, or writes it at once when it answers a lone
    /// request ([`Shared::lone`]) and nothing waits before it.
    fn respond(&self, reply: &Reply, to: ReplyTo) {
        if self.lone.get() {
            self.there.out.answer_here(|q| reply.encode_into(to, q));
        } else {
            self.there.out.queue(|q| reply.encode_into(to, q));
        }
    }

    fn room_for_requests(&self) -> bool {
        self.in_flight.get() < MAX_IN_FLIGHT && self.there.out.pending() < OUT_HIGH_WATER
    }
}

/// Counts a request task in [`Shared`] while it lives, and its in-flight slot until
/// released (a held pull releases it while it waits).
struct TaskGuard {
    sh: Rc<Shared>,
    slot: bool,
}

impl TaskGuard {
    fn new(sh: &Rc<Shared>) -> TaskGuard {
        sh.in_flight.set(sh.in_flight.get() + 1);
        sh.tasks.set(sh.tasks.get() + 1);
        TaskGuard {
            sh: sh.clone(),
            slot: true,
        }
    }

    fn release_slot(&mut self) {
        if self.slot {
            self.slot = false;
            self.sh.in_flight.set(self.sh.in_flight.get() - 1);
            Shared::wake(&self.sh.reader);
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.release_slot();
        self.sh.tasks.set(self.sh.tasks.get() - 1);
        // The writer ends once the reader is done and no task can answer any more; while
        // the reader runs, a task's end changes nothing for it (an answer wakes it).
        if self.sh.reader_done.get() {
            self.sh.there.out.wake_writer();
        }
    }
}

/// A request, as the reader hands it to its task.
enum Request {
    /// A send or pull whose header was read in place: the whole frame, where its
    /// header lies in it, and the header's field texts as offsets into the header.
    Send(InPlace, Spans<SEND_FIELD_COUNT>),
    Pull(InPlace, Spans<PULL_FIELD_COUNT>),
    /// Any other request, through the general decoder.
    General(RemotingCommand),
}

struct InPlace {
    frame: Bytes,
    header_len: usize,
    code: i32,
    oneway: bool,
    to: ReplyTo,
}

/// Where a frame's header starts (after the length prefix and the header word).
const HEADER_AT: usize = LENGTH_PREFIX + HEADER_WORD;

impl InPlace {
    fn header(&self) -> &[u8] {
        self.frame
            .get(HEADER_AT..HEADER_AT + self.header_len)
            .unwrap_or(&[])
    }

    fn body(&self) -> Bytes {
        self.frame
            .slice((HEADER_AT + self.header_len).min(self.frame.len())..)
    }
}

/// What a whole frame is: a request, nothing to serve (a response), or malformed.
fn classify(frame: Bytes) -> Result<Option<Request>, FrameError> {
    let word = frame
        .get(LENGTH_PREFIX..HEADER_AT)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    if let Some(word) = word {
        let header_len = (word & 0x00FF_FFFF) as usize;
        let header = frame.get(HEADER_AT..HEADER_AT + header_len);
        let kind = (word >> 24) as u8;
        let parsed = header.map(|h| HeaderView::parse_typed(kind, h, typed_for_code));
        if let Some(Ok((view, typed))) = parsed {
            if view.is_response() {
                return Ok(None);
            }
            let (code, oneway) = (view.code, view.is_oneway());
            let to = ReplyTo {
                opaque: view.opaque,
                serialize_type: view.serialize_type,
            };
            let at = |frame| InPlace {
                frame,
                header_len,
                code,
                oneway,
                to,
            };
            match typed {
                Typed::Send(spans) => return Ok(Some(Request::Send(at(frame), spans))),
                Typed::Pull(spans) => return Ok(Some(Request::Pull(at(frame), spans))),
                Typed::Other => {}
            }
        }
    }
    let cmd = remoting::decode_payload(frame.slice(LENGTH_PREFIX..))?;
    if cmd.is_response() {
        return Ok(None);
    }
    Ok(Some(Request::General(cmd)))
}

/// Serves one request and queues its answer.
async fn serve_request(sh: Rc<Shared>, req: Request) {
    let mut guard = TaskGuard::new(&sh);
    let st = &sh.st;
    let (outcome, to) = match req {
        Request::Send(at, spans) => {
            let mut scratch = processor::PooledString::take();
            let header = SendHeader::resolve(&spans, at.header(), scratch.get());
            let body = at.body();
            let outcome =
                processor::process_send(st, at.code, at.oneway, at.to, &header, &body, &sh.there)
                    .await;
            (outcome, at.to)
        }
        // Every arm but the send is boxed: a task's future is as large as its largest
        // arm, and spawning copies it whole (the send is the per-message path).
        Request::Pull(at, spans) => {
            let outcome = Box::pin(async {
                let mut scratch = processor::PooledString::take();
                let header = PullHeader::resolve(&spans, at.header(), scratch.get());
                processor::process_pull(st, at.code, at.oneway, at.to, &header, sh.there.view).await
            })
            .await;
            (outcome, at.to)
        }
        Request::General(cmd) => {
            let to = ReplyTo::of(&cmd);
            let outcome = Box::pin(processor::process_in_view(
                st,
                cmd,
                sh.conn,
                sh.peer,
                sh.there.view,
            ))
            .await;
            (outcome, to)
        }
    };
    match outcome {
        Outcome::Reply(reply) => sh.respond(&reply, to),
        Outcome::NoReply => {}
        Outcome::Hold(hold) => {
            guard.release_slot();
            let reply = Box::pin(processor::serve_hold(st, hold, Waiting::Glommio)).await;
            sh.respond(&reply, to);
        }
    }
}

/// The read buffer: `buf` holds received bytes not yet taken as frames; its spare
/// capacity is the room for the next receive, read into uninitialized (glommio patch
/// m): the buffer was zero-filled before every receive, 3.2% of a node's samples under
/// single sends.
struct ReadBuf {
    buf: BytesMut,
}

impl ReadBuf {
    fn new() -> ReadBuf {
        ReadBuf {
            buf: BytesMut::new(),
        }
    }

    /// Room for the next receive, at least `want` bytes (and [`MIN_ROOM`]). When the
    /// buffer is renewed, its unread bytes move to a new one (or to the front of this
    /// one when no frame taken from it is still alive).
    fn room(&mut self, want: usize) -> &mut [MaybeUninit<u8>] {
        let want = want.max(MIN_ROOM);
        if self.buf.capacity() - self.buf.len() < want {
            self.buf.reserve(want.max(READ_BUF));
        }
        self.buf.spare_capacity_mut()
    }

    /// No bytes wait to be taken as frames.
    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The last receive wrote the first `n` bytes of [`Self::room`].
    fn received(&mut self, n: usize) {
        let spare = self.buf.capacity() - self.buf.len();
        assert!(n <= spare, "received {n} bytes into {spare} bytes of room");
        // SAFETY: the receive wrote (initialized) the first `n` bytes of the spare
        // capacity `room` returned, and nothing touched the buffer in between.
        unsafe { self.buf.set_len(self.buf.len() + n) };
    }

    /// The next whole frame (length prefix included), or `None` while it is not whole;
    /// the second value is how many more bytes that frame needs.
    fn next_frame(&mut self, max_frame: usize) -> Result<(Option<Bytes>, usize), FrameError> {
        let filled = &self.buf[..];
        let Some(prefix) = filled.first_chunk::<4>() else {
            return Ok((None, LENGTH_PREFIX - filled.len()));
        };
        let whole = LENGTH_PREFIX + remoting::check_length(*prefix, max_frame)?;
        if filled.len() < whole {
            return Ok((None, whole - filled.len()));
        }
        Ok((Some(self.buf.split_to(whole).freeze()), 0))
    }
}

/// Serves one accepted connection until it closes or the shard stops.
pub(super) async fn serve(
    st: &Arc<NodeState>,
    conn: u64,
    stream: TcpStream,
    view: Option<ShardView>,
    stop: &LocalStop,
) {
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(st.cfg.idle_timeout()));
    let out = match SharedOut::new(stream.as_raw_fd()) {
        Ok(out) => Arc::new(out),
        Err(e) => {
            tracing::warn!(%peer, conn, error = %e, "cannot serve a connection: dup of its socket failed");
            return;
        }
    };
    let stream = Rc::new(RefCell::new(stream));
    let sh = Rc::new(Shared {
        st: st.clone(),
        conn,
        peer,
        there: There {
            out,
            st: st.clone(),
            peer,
            owner_answers: st.cfg.owner_answers_routed_sends,
            view,
        },
        reader: Cell::new(None),
        in_flight: Cell::new(0),
        tasks: Cell::new(0),
        lone: Cell::new(false),
        reader_done: Cell::new(false),
    });
    let writer = glommio::spawn_local(write_loop(sh.clone(), stream.clone()));
    // Requests the broker starts (CHECK_TRANSACTION_STATE) join the answers in the
    // output queue, whole frames between answers; the forwarder ends when the outbox
    // closes.
    let outbox = st.outboxes.open(conn);
    let fwd = sh.clone();
    glommio::spawn_local(async move {
        while let Ok(frame) = outbox.recv_async().await {
            if fwd.there.out.is_broken() {
                break;
            }
            fwd.there
                .out
                .queue(|q| q.inline(|b| b.extend_from_slice(&frame)));
        }
    })
    .detach();
    tracing::debug!(%peer, conn, "connection open");
    read_loop(&sh, &stream, stop).await;
    st.outboxes.close(conn);
    sh.reader_done.set(true);
    sh.there.out.close_reading();
    sh.there.out.wake_writer();
    drop(stream);
    writer.await;
}

/// Takes requests until the connection ends (see the module docs).
async fn read_loop(sh: &Rc<Shared>, stream: &Rc<RefCell<TcpStream>>, stop: &LocalStop) {
    let st = &sh.st;
    let mut rb = ReadBuf::new();
    // The box of the last request served in its first poll, for the next one: one
    // allocation for a connection's run of such requests instead of one each.
    let mut spare = None;
    loop {
        let need;
        loop {
            let (frame, more) = match rb.next_frame(st.cfg.max_frame_bytes) {
                Ok(f) => f,
                Err(e) => return malformed(sh, e),
            };
            let Some(frame) = frame else {
                need = more;
                break;
            };
            let req = match classify(frame) {
                Ok(Some(req)) => req,
                Ok(None) => continue,
                Err(e) => return malformed(sh, e),
            };
            // Room for one more request (in flight, answers queued).
            futures_lite::future::poll_fn(|cx| {
                if sh.room_for_requests() {
                    Poll::Ready(())
                } else {
                    Shared::park(&sh.reader, cx.waker());
                    Poll::Pending
                }
            })
            .await;
            // Served here first: most sends end in their first poll (a put on this
            // shard copies into a write window), with no task spawned for them. A
            // request that waits (a routed put, a held pull) goes on as a task; its
            // future was boxed first so it never moves once polled.
            let mut serving = boxed_in(&mut spare, || serve_request(sh.clone(), req));
            // Nothing more buffered: no answer of this receive can join this one's.
            sh.lone.set(rb.is_empty());
            let first = futures_lite::future::poll_once(serving.as_mut()).await;
            sh.lone.set(false);
            if first.is_none() {
                glommio::spawn_local(serving).detach();
            } else {
                spare = Some(serving);
            }
        }
        let room = rb.room(need.min(READ_BUF));
        let read =
            futures_lite::future::poll_fn(|cx| stream.borrow_mut().poll_read_uninit(cx, room));
        let got = futures_lite::future::or(async { Some(read.await) }, async {
            stop.wait(sh.conn).await;
            None
        })
        .await;
        match got {
            Some(Ok(n)) if n > 0 => rb.received(n),
            Some(Ok(_)) | None => return,
            Some(Err(e)) => {
                tracing::debug!(peer = %sh.peer, conn = sh.conn, error = %e, "connection closed");
                return;
            }
        }
    }
}

/// `make()`'s future in a box: `spare`'s when there is one (a finished future's,
/// never polled again), else a new one.
fn boxed_in<F: Future>(spare: &mut Option<Pin<Box<F>>>, make: impl FnOnce() -> F) -> Pin<Box<F>> {
    match spare.take() {
        Some(mut boxed) => {
            // SAFETY: the finished future is dropped in place and the new one written
            // over it, then stays pinned there (what `Pin::set` does, written so that the
            // future is built in the box rather than built aside and copied in: the copy
            // was ~2% of a node's samples under single sends).
            // A panic between the drop and the write would leave the box to drop a
            // dropped value: the process aborts instead.
            struct AbortOnUnwind;
            impl Drop for AbortOnUnwind {
                fn drop(&mut self) {
                    std::process::abort();
                }
            }
            let armed = AbortOnUnwind;
            unsafe {
                let slot: *mut F = Pin::get_unchecked_mut(boxed.as_mut());
                std::ptr::drop_in_place(slot);
                std::ptr::write(slot, make());
            }
            std::mem::forget(armed);
            boxed
        }
        None => Box::pin(make()),
    }
}

fn malformed(sh: &Shared, e: FrameError) {
    sh.st.metrics.bad_frames.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(peer = %sh.peer, conn = sh.conn, error = %e, "malformed frame; closing the connection");
}

/// Sends queued answers until the reader is done and every request task and routed
/// send has answered.
async fn write_loop(sh: Rc<Shared>, stream: Rc<RefCell<TcpStream>>) {
    let out = sh.there.out.clone();
    let mut sending = OutQueue::default();
    loop {
        let more = futures_lite::future::poll_fn(|cx| {
            // Takes the waker first, so an answer or the last routed send's end
            // after the checks below wakes this task.
            if out.take_batch(&mut sending, cx.waker()).is_some() {
                Poll::Ready(true)
            } else if out.is_broken()
                || (sh.reader_done.get() && sh.tasks.get() == 0 && out.remote() == 0)
            {
                Poll::Ready(false)
            } else {
                Poll::Pending
            }
        })
        .await;
        if !more {
            break;
        }
        let sent = send_all(&mut sending, &stream, out.raw_fd()).await;
        sending.clear();
        out.sent(sent.is_err());
        Shared::wake(&sh.reader);
        if let Err(e) = sent {
            tracing::debug!(peer = %sh.peer, conn = sh.conn, error = %e, "write failed");
            break;
        }
    }
    let _ = futures_lite::future::poll_fn(|cx| Pin::new(&mut *stream.borrow_mut()).poll_close(cx))
        .await;
}

/// Writes all of `q`: vectored, non-blocking; when the socket is full, glommio's write
/// of the first pending slice waits for room.
async fn send_all(q: &mut OutQueue, stream: &RefCell<TcpStream>, fd: RawFd) -> std::io::Result<()> {
    while !q.is_empty() {
        match q.write_to(fd) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let n = futures_lite::future::poll_fn(|cx| {
                    Pin::new(&mut *stream.borrow_mut()).poll_write(cx, q.first_slice())
                })
                .await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                q.advance(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_whole_and_wait_for_the_rest() {
        let a = RemotingCommand::request(10, 1, vec![("b".into(), "T".into())]).encode();
        let b = RemotingCommand::request(11, 2, Vec::new())
            .with_body(vec![9u8; 3000])
            .encode();
        let mut wire = a.clone();
        wire.extend_from_slice(&b);
        for cut in [0, 3, a.len(), a.len() + 7, wire.len() - 1, wire.len()] {
            let mut rb = ReadBuf::new();
            let mut got = Vec::new();
            for part in [&wire[..cut], &wire[cut..]] {
                let room = rb.room(part.len());
                for (r, b) in room.iter_mut().zip(part.iter()) {
                    r.write(*b);
                }
                rb.received(part.len());
                while let (Some(f), _) = rb.next_frame(1 << 20).unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(&got[0][..], &a[..]);
            assert_eq!(&got[1][..], &b[..]);
        }
    }

    #[test]
    fn a_declared_length_beyond_the_limit_is_malformed() {
        let mut rb = ReadBuf::new();
        let room = rb.room(8);
        for (r, b) in room.iter_mut().zip((64u32 << 20).to_be_bytes()) {
            r.write(b);
        }
        rb.received(4);
        assert!(rb.next_frame(1 << 20).is_err());
    }

    #[test]
    fn hot_codes_are_read_in_place_others_generally() {
        let send = RemotingCommand::request(310, 1, vec![("b".into(), "T".into())]);
        let pull = RemotingCommand::request(11, 2, vec![("topic".into(), "T".into())]);
        let other = RemotingCommand::request(105, 3, Vec::new());
        let mut resp = RemotingCommand::request(10, 4, Vec::new());
        resp.flag = remoting::FLAG_RESPONSE;
        let kind = |c: &RemotingCommand| match classify(Bytes::from(c.encode())) {
            Ok(Some(Request::Send(..))) => "send",
            Ok(Some(Request::Pull(..))) => "pull",
            Ok(Some(Request::General(_))) => "general",
            Ok(None) => "none",
            Err(_) => "malformed",
        };
        assert_eq!(kind(&send), "send");
        assert_eq!(kind(&pull), "pull");
        assert_eq!(kind(&other), "general");
        assert_eq!(kind(&resp), "none");
        // A header the in-place reader declines still goes through the general path.
        let header = br#"{"code":10,"extFields":{"b":"T"},"x":[1]}"#;
        let mut wire = ((4 + header.len()) as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&(header.len() as u32).to_be_bytes());
        wire.extend_from_slice(header);
        assert!(matches!(
            classify(Bytes::from(wire)),
            Ok(Some(Request::General(_)))
        ));
    }
}
