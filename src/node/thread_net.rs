//! Connections served by blocking OS threads (`network = "threads"`, the fallback
//! front end): one thread per connection with `std::net` sockets, a held pull on a
//! short-lived thread of its own. RocketMQ's `NettyRemotingServer`, as `shard_net.rs`
//! is for the default front end; both run the same processors.
//!
//! * Responses go through one write lock per connection, so a held pull answered later
//!   never interleaves with another response.
//! * Every connection and held-pull thread counts itself in `NodeState::active`
//!   ([`ActiveGuard`]) so shutdown can wait for them, and every connection keeps a clone
//!   of its socket in `NodeState::conns` so shutdown can close its read side.

use super::NodeState;
use super::processor::{self, Outcome, Reply, ReplyTo};
use super::remoting::{self, FrameError, RemotingCommand};
use super::state::lock;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counts a running thread in `active` for as long as it lives.
struct ActiveGuard(Arc<NodeState>);

impl ActiveGuard {
    fn new(st: &Arc<NodeState>) -> ActiveGuard {
        st.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(st.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(super) fn accept_loop(st: Arc<NodeState>, listener: TcpListener) {
    for conn in listener.incoming() {
        if st.shutting.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if !st.try_open_connection() {
            continue;
        }
        let id = st.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            st.open.fetch_sub(1, Ordering::SeqCst);
            continue;
        };
        lock(&st.conns).insert(id, clone);
        let guard = ActiveGuard::new(&st);
        let st2 = st.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("coremq-conn-{id}"))
            .spawn(move || {
                let _guard = guard;
                serve_connection(&st2, id, stream);
                lock(&st2.conns).remove(&id);
                let left = st2.clients.connection_closed(id);
                super::broker2client::consumer_ids_changed(&st2, &left, "a connection closed");
                st2.client_conns.closed(id);
                st2.producers.connection_closed(id);
                st2.open.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a connection thread");
            lock(&st.conns).remove(&id);
            st.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
fn read_frame(
    r: &mut impl Read,
    max: usize,
) -> std::result::Result<Option<RemotingCommand>, ReadError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let len = remoting::check_length(prefix, max).map_err(ReadError::Frame)?;
    // Memory grows with the bytes that arrive, not with the length a peer declares.
    let mut payload = Vec::with_capacity(len.min(remoting::INITIAL_FRAME_BUFFER));
    r.take(len as u64)
        .read_to_end(&mut payload)
        .map_err(ReadError::Io)?;
    if payload.len() != len {
        return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    remoting::decode_payload(payload.into())
        .map(Some)
        .map_err(ReadError::Frame)
}

enum ReadError {
    Io(std::io::Error),
    Frame(FrameError),
}

type Writer = Arc<Mutex<TcpStream>>;

fn send_response(w: &Writer, resp: Reply, to: ReplyTo) {
    let bytes = resp.into_command(to).encode();
    let _ = lock(w).write_all(&bytes);
}

fn serve_connection(st: &Arc<NodeState>, id: u64, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(st.cfg.idle_timeout()));
    let Ok(w) = stream.try_clone() else {
        return;
    };
    let writer: Writer = Arc::new(Mutex::new(w));
    // Requests the broker starts (check-backs): a small thread writes them, ending
    // when the outbox closes.
    let outbox = st.outboxes.open(id);
    let w2 = writer.clone();
    let forwarder = std::thread::Builder::new()
        .name(format!("coremq-out-{id}"))
        .spawn(move || {
            for frame in outbox.iter() {
                if lock(&w2).write_all(&frame).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = forwarder {
        tracing::error!(error = %e, "cannot start a connection's outbox thread");
    }
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    tracing::debug!(%peer, conn = id, "connection open");
    loop {
        let req = match read_frame(&mut reader, st.cfg.max_frame_bytes) {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(ReadError::Io(e)) => {
                tracing::debug!(%peer, conn = id, error = %e, "connection closed");
                break;
            }
            Err(ReadError::Frame(e)) => {
                st.metrics.bad_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, conn = id, error = %e, "malformed frame; closing the connection");
                let _ = lock(&writer).shutdown(Shutdown::Both);
                break;
            }
        };
        if req.is_response() {
            continue; // Answers to check-backs (sent one-way) carry nothing.
        }
        let to = ReplyTo::of(&req);
        match futures_lite::future::block_on(processor::process(st, req, id, peer)) {
            Outcome::Reply(resp) => send_response(&writer, resp, to),
            Outcome::NoReply => {}
            Outcome::Hold(hold) => {
                let guard = ActiveGuard::new(st);
                let (st2, w2) = (st.clone(), writer.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("coremq-hold-{id}"))
                    .spawn(move || {
                        let _guard = guard;
                        let resp = futures_lite::future::block_on(processor::serve_hold(
                            &st2,
                            hold,
                            processor::Waiting::Blocking,
                        ));
                        send_response(&w2, resp, to);
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot start a pull-hold thread");
                }
            }
        }
    }
    st.outboxes.close(id);
    // The socket closes when the last clone goes: held pulls of this connection still
    // answer (at shutdown the read side is closed first, then the holds reply).
}
