//! Connections served on the shards (the default, `network = "shards"`), RocketMQ's
//! `NettyRemotingServer` rebuilt thread-per-core: every shard executor accepts on its
//! own broker and name-server sockets (`SO_REUSEPORT`: the kernel spreads new
//! connections over the shards' sockets, see `listen.rs`) and serves its connections
//! as glommio tasks with `glommio::net` (io_uring) I/O.
//!
//! Per connection (`conn.rs`): a reader takes every whole frame a receive brings and
//! spawns a task per request (at most 1024 in flight per connection); the hot codes'
//! headers are read in place. A request for a queue this shard owns calls the local
//! store directly; one for another shard's queue travels there through the store's
//! `Handle`, as the library routes. A writer task sends the encoded answers with
//! vectored writes, so a held pull answered later (its own task) never interleaves
//! with another response, and a peer that stops reading stalls only its own requests.
//!
//! Shutdown: the node sends each shard a stop; the shard stops accepting, tells every
//! reader to stop at its next frame boundary, and waits (up to 10 s) until the
//! connections' requests and held pulls have answered.

use super::NodeState;
use super::processor;
use super::shard_view::ShardView;
use crate::shard::ShardContext;
use glommio::net::TcpListener;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The shard front end: one thread per shard waits for its shard's serving job.
pub(crate) struct ShardNet {
    stops: Vec<flume::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl ShardNet {
    /// Starts serving on every shard: `groups` holds, per port, one listening socket
    /// per shard (`SO_REUSEPORT`); shard `i` accepts on socket `i` of each.
    pub(crate) fn start(
        st: &Arc<NodeState>,
        groups: Vec<Vec<std::net::TcpListener>>,
        shard_ports: Vec<std::net::TcpListener>,
    ) -> crate::Result<ShardNet> {
        let shards = st.handle.shards();
        // Per shard: (listening socket, the shard's own port?).
        let mut per_shard: Vec<Vec<(RawFd, bool)>> = vec![Vec::new(); shards];
        if !shard_ports.is_empty() && shard_ports.len() != shards {
            return Err(crate::Error::Config(format!(
                "{} shard ports for {shards} shards",
                shard_ports.len()
            )));
        }
        for (i, l) in shard_ports.into_iter().enumerate() {
            per_shard[i].push((l.into_raw_fd(), true));
        }
        for group in groups {
            if group.len() != shards {
                return Err(crate::Error::Config(format!(
                    "{} listening sockets for {shards} shards",
                    group.len()
                )));
            }
            for (i, l) in group.into_iter().enumerate() {
                per_shard[i].push((l.into_raw_fd(), false));
            }
        }
        let mut net = ShardNet {
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for (shard, fds) in per_shard.into_iter().enumerate() {
            let (stop_tx, stop_rx) = flume::bounded(1);
            let st2 = st.clone();
            let t = std::thread::Builder::new()
                .name(format!("coremq-net-{shard}"))
                .spawn(move || {
                    let handle = st2.handle.clone();
                    let job = handle.run_on(shard, move |ctx| serve_shard(ctx, st2, fds, stop_rx));
                    if let Err(e) = futures_lite::future::block_on(job) {
                        tracing::error!(shard, error = %e, "shard front end stopped");
                    }
                })
                .map_err(|e| crate::Error::Config(format!("cannot start a thread: {e}")))?;
            net.stops.push(stop_tx);
            net.threads.push(t);
        }
        Ok(net)
    }

    /// Stops accepting and waits for every shard's connections to finish. A dead
    /// shard's serving job never answers (glommio keeps the tasks of an executor that
    /// died), so its thread is left behind rather than waited for.
    pub(crate) fn stop(&mut self, handle: &crate::shard::Handle) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        for (shard, t) in self.threads.drain(..).enumerate() {
            while !t.is_finished() && handle.is_alive(shard) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::error!(
                    shard,
                    "shard {shard} is dead; its connections are abandoned"
                );
            }
        }
    }
}

/// A shard-local stop signal with one waker per waiting task.
#[derive(Default)]
pub(super) struct LocalStop {
    stopped: Cell<bool>,
    wakers: RefCell<HashMap<u64, Waker>>,
}

impl LocalStop {
    fn trigger(&self) {
        self.stopped.set(true);
        let wakers: Vec<Waker> = self.wakers.borrow_mut().drain().map(|(_, w)| w).collect();
        for w in wakers {
            w.wake();
        }
    }

    /// Resolves once stopped; `id` names the waiting task (one waker kept per task).
    pub(super) fn wait(&self, id: u64) -> impl Future<Output = ()> + '_ {
        futures_lite::future::poll_fn(move |cx| {
            if self.stopped.get() {
                Poll::Ready(())
            } else {
                self.wakers.borrow_mut().insert(id, cx.waker().clone());
                Poll::Pending
            }
        })
    }

    fn forget(&self, id: u64) {
        self.wakers.borrow_mut().remove(&id);
    }
}

/// Ids of accept loops (connections count up from 1).
const ACCEPT_ID_BASE: u64 = u64::MAX - 64;

async fn serve_shard(
    ctx: ShardContext,
    st: Arc<NodeState>,
    fds: Vec<(RawFd, bool)>,
    stop_rx: flume::Receiver<()>,
) {
    let shard = ctx.shard;
    processor::set_local_shard(Some(ctx));
    let stop = Rc::new(LocalStop::default());
    let open = Rc::new(Cell::new(0usize));
    for (k, (fd, own_port)) in fds.into_iter().enumerate() {
        // SAFETY: `fd` is a listening socket handed to this shard alone.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        let (st, stop, open) = (st.clone(), stop.clone(), open.clone());
        let view = if own_port {
            ShardView::new(shard, st.handle.shards(), st.handle.ownership())
        } else {
            None
        };
        glommio::spawn_local(accept_loop(
            st,
            listener,
            view,
            stop,
            open,
            ACCEPT_ID_BASE + k as u64,
        ))
        .detach();
    }
    let _ = stop_rx.recv_async().await;
    stop.trigger();
    let deadline = Instant::now() + Duration::from_secs(10);
    while open.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    processor::set_local_shard(None);
}

async fn accept_loop(
    st: Arc<NodeState>,
    listener: TcpListener,
    view: Option<ShardView>,
    stop: Rc<LocalStop>,
    open: Rc<Cell<usize>>,
    id: u64,
) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            stop.wait(id).await;
            None
        })
        .await;
        let stream = match accepted {
            None => return,
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if !st.try_open_connection() {
            continue;
        }
        let conn = st.next_conn.fetch_add(1, Ordering::Relaxed);
        open.set(open.get() + 1);
        let (st, stop, open) = (st.clone(), stop.clone(), open.clone());
        glommio::spawn_local(async move {
            super::conn::serve(&st, conn, stream, view, &stop).await;
            stop.forget(conn);
            let left = st.clients.connection_closed(conn);
            super::broker2client::consumer_ids_changed(&st, &left, "a connection closed");
            st.client_conns.closed(conn);
            st.producers.connection_closed(conn);
            st.open.fetch_sub(1, Ordering::SeqCst);
            open.set(open.get() - 1);
        })
        .detach();
    }
}
