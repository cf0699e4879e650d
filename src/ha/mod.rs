//! Master/slave replication per shard: RocketMQ's classic `DefaultHAService` (the
//! master's `AcceptSocketService` and `HAConnection` with its read and write services)
//! and `HAClient` (the slave's), speaking RocketMQ's protocol byte for byte
//! (`crate::format::ha`), so a one-shard coremq is a RocketMQ master or slave on the
//! wire.
//!
//! | file | RocketMQ | what |
//! |---|---|---|
//! | `mod.rs` | `DefaultHAService`, `AcceptSocketService` | one HA port per store; connections handed to their shard |
//! | `master.rs` | `HAConnection` (`ReadSocketService`, `WriteSocketService`) | reports in, frames of committed bytes out |
//! | `slave.rs` | `HAClient` | one connection per shard: frames in, checked, appended; reports out |
//! | `truncate.rs` | (none: RocketMQ truncates silently) | the operator's cut of a slave that ran past its master |
//!
//! The store's side (SYNC_MASTER's wait, the slave's checked append) is
//! `crate::store` (`group_transfer.rs`) and `crate::commit_log` (`replica.rs`).
//!
//! # Routing and threads
//!
//! Shard `i`'s log lives at `[i << 56, (i+1) << 56)`, so a slave connection's first
//! report (an empty slave shard reports `i << 56`) names its shard: no handshake beyond
//! RocketMQ's. One listener thread per store accepts (`ha.listen`); a short-lived
//! thread per new connection reads its first report (RocketMQ 4.x slaves send it about
//! 5 s after connecting), then hands the socket to its shard, which serves it as glommio
//! tasks over io_uring (a reader of reports, a writer of frames), next to the log it
//! reads, with no cross-thread hop per frame. A slave runs one client task per shard
//! on that shard's executor, each with its own connection to the master.
//!
//! # Decisions
//!
//! * **Frames up to 1 MiB** (`ha.max_frame_bytes`; RocketMQ: 32 KiB). Catch-up speed is
//!   the slave's append rate, and a frame is read, checked and appended as a unit: at 32
//!   KiB a 1 KiB-message catch-up is ~30 frames, wake-ups and reports per MiB; 1 MiB is
//!   the size of the recovery reader's reads, the unit at which this disk reaches its
//!   sequential rate (`commit_log/reader.rs`). A RocketMQ slave reads frames of any size
//!   into a 4 MiB buffer, so it follows a coremq master unchanged.
//! * **A master sends committed bytes only** (RocketMQ's read position with the
//!   TransientStorePool): never what a master `kill -9` would lose, and in sync-flush
//!   mode (`committed == flushed`) never what a power loss would. A slave therefore can
//!   run past its master only after the master lost unflushed bytes to a power loss
//!   (async flush): [`truncate`] is the way back.
//! * **A slave reports what it appended**, whole records only, after each frame and
//!   every `ha.heartbeat_interval` (5 s); a report acknowledges every byte below it
//!   (one report releases every SYNC_MASTER put it covers). The master takes a report
//!   past its own end as a broken slave and closes (RocketMQ 4.9.8 does).
//! * **A slave ahead of its master** (its first report past the master's end) gets
//!   one empty frame at the master's end, then the connection closes; the slave sees a
//!   frame below its own end, refuses to follow and names both offsets
//!   ([`HaStatus::divergence`]). A RocketMQ master cannot tell it: it waits at the
//!   slave's offset.
//! * **An empty slave** starts at the master's last segment, as RocketMQ does
//!   (`ha.empty_slave_start`; or the master's first byte), so the slave's log may begin
//!   past its base; a frame at any other offset than the slave's end closes the
//!   connection, and the slave connects again after `ha.reconnect_interval`.
//! * **Segment sizes must match** (the logs are byte-identical, blanks included).
//!   The classic protocol has no handshake to compare them, so the first frame that
//!   shows a difference is refused, naming both: a frame across the slave's segment
//!   end, a blank not ending at it, an empty slave's start off its segment boundary.

mod master;
mod slave;
pub mod truncate;

use crate::config::{HaConfig, HaRole};
use crate::error::{Error, Result};
use crate::format::ha as wire;
use crate::shard::{Handle, SHARD_SHIFT};
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use master::serve_slave;
pub use slave::run_client;

/// A slave shard that refused to follow its master: its log runs past the master's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    pub shard: usize,
    /// The slave's end.
    pub slave_end: u64,
    /// The master's end (what to truncate the slave to).
    pub master_end: u64,
}

/// What the HA service saw, per shard (shared with every thread).
pub struct HaStatus {
    shards: Vec<ShardHa>,
}

#[derive(Default)]
struct ShardHa {
    /// Slave side: connected to the master now.
    connected: AtomicBool,
    /// Slave side: frames refused (bad offset, bad record, bad framing).
    refused: AtomicU64,
    /// Slave side: connections made.
    connects: AtomicU64,
    diverged: Mutex<Option<Divergence>>,
}

impl HaStatus {
    fn new(shards: usize) -> HaStatus {
        HaStatus {
            shards: (0..shards).map(|_| ShardHa::default()).collect(),
        }
    }

    /// Whether shard `shard`'s client is connected to its master now.
    pub fn connected(&self, shard: usize) -> bool {
        self.shards[shard].connected.load(Ordering::SeqCst)
    }

    /// Frames shard `shard`'s client refused so far.
    pub fn refused(&self, shard: usize) -> u64 {
        self.shards[shard].refused.load(Ordering::SeqCst)
    }

    /// Connections shard `shard`'s client made so far.
    pub fn connects(&self, shard: usize) -> u64 {
        self.shards[shard].connects.load(Ordering::SeqCst)
    }

    /// The first shard that refused to follow its master, if any.
    pub fn divergence(&self) -> Option<Divergence> {
        self.shards
            .iter()
            .find_map(|s| *s.diverged.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What a shard's HA tasks share with the service (and nothing else).
#[derive(Clone)]
pub struct ShardLink {
    pub shard: usize,
    pub cfg: HaConfig,
    status: Arc<HaStatus>,
    stop: Arc<AtomicBool>,
}

impl ShardLink {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn me(&self) -> &ShardHa {
        &self.status.shards[self.shard]
    }

    /// A link for a lone [`crate::Store`] (shard 0) served by the caller's own tasks.
    pub fn standalone(cfg: HaConfig) -> ShardLink {
        ShardLink {
            shard: 0,
            cfg,
            status: Arc::new(HaStatus::new(1)),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// The running HA service of a sharded store: the listener and the slave's clients.
pub struct HaService {
    stop: Arc<AtomicBool>,
    status: Arc<HaStatus>,
    listener: Option<JoinHandle<()>>,
    /// The address the listener bound (useful with port 0).
    pub listen_addr: Option<SocketAddr>,
}

impl HaService {
    /// Starts what `cfg` asks for: the listener when `listen` is set, and on a slave
    /// with a master address, a client on every shard.
    pub fn start(handle: &Handle, cfg: &HaConfig) -> Result<Option<HaService>> {
        let wants_client = cfg.role == HaRole::Slave && cfg.master_address.is_some();
        if cfg.listen.is_none() && !wants_client {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let status = Arc::new(HaStatus::new(handle.shards()));
        let mut svc = HaService {
            stop: stop.clone(),
            status: status.clone(),
            listener: None,
            listen_addr: None,
        };
        let link = |shard| ShardLink {
            shard,
            cfg: cfg.clone(),
            status: status.clone(),
            stop: stop.clone(),
        };
        if let Some(addr) = cfg.listen {
            let l = TcpListener::bind(addr)
                .map_err(|e| Error::Config(format!("cannot bind the HA port {addr}: {e}")))?;
            svc.listen_addr = l.local_addr().ok();
            let (h, links) = (handle.clone(), (0..handle.shards()).map(link).collect());
            let t = std::thread::Builder::new()
                .name("coremq-ha-accept".into())
                .spawn(move || accept_loop(l, h, links))
                .map_err(|e| Error::Config(format!("cannot start the HA listener: {e}")))?;
            svc.listener = Some(t);
            tracing::info!(listen = ?svc.listen_addr, role = ?cfg.role, "HA service listening");
        }
        if wants_client {
            for shard in 0..handle.shards() {
                let l = link(shard);
                let job = handle.run_on(shard, move |ctx| async move {
                    glommio::spawn_local(run_client(ctx.store, l)).detach();
                });
                futures_lite::future::block_on(job)?;
            }
        }
        Ok(Some(svc))
    }

    pub fn status(&self) -> &Arc<HaStatus> {
        &self.status
    }

    /// Stops accepting and tells every HA task to stop (they end within ~100 ms).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.listener.take() {
            // The accept is blocking: a connection wakes it to see the flag.
            if let Some(mut a) = self.listen_addr {
                if a.ip().is_unspecified() {
                    a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                let _ = TcpStream::connect_timeout(&a, Duration::from_secs(1));
            }
            let _ = t.join();
        }
    }
}

impl Drop for HaService {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts slave connections until stopped; each gets a thread that reads its first
/// report and hands it to its shard (module docs).
fn accept_loop(l: TcpListener, handle: Handle, links: Vec<ShardLink>) {
    let stop = links[0].stop.clone();
    loop {
        let accepted = l.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((s, peer)) => {
                let (handle, links) = (handle.clone(), links.clone());
                let spawned = std::thread::Builder::new()
                    .name("coremq-ha-conn".into())
                    .spawn(move || {
                        if let Err(e) = hand_over(s, peer, &handle, &links) {
                            tracing::warn!(%peer, error = %e, "HA connection ended");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!(%peer, error = %e, "cannot start an HA connection thread");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "HA accept failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Reads a new connection's first report and serves the connection on the shard it
/// names, until the connection ends.
fn hand_over(
    mut s: TcpStream,
    peer: SocketAddr,
    handle: &Handle,
    links: &[ShardLink],
) -> Result<()> {
    let io = |op, e| Error::io(op, format!("HA connection from {peer}"), 0, e);
    let housekeeping = links[0].cfg.housekeeping_interval;
    s.set_nonblocking(false)
        .map_err(|e| io("set_nonblocking", e))?;
    s.set_read_timeout(Some(housekeeping))
        .map_err(|e| io("set_read_timeout", e))?;
    let mut first = [0u8; wire::REPORT_LEN];
    s.read_exact(&mut first)
        .map_err(|e| io("read the first report", e))?;
    let report = wire::decode_report(&first).map_err(|kind| Error::Corrupt {
        path: format!("HA connection from {peer}").into(),
        offset: 0,
        kind,
        detail: Some("the first slave report is not an offset".into()),
    })?;
    let shard = (report >> SHARD_SHIFT) as usize;
    let Some(link) = links.get(shard).cloned() else {
        return Err(Error::BadRequest(format!(
            "slave {peer} reported offset {report} of shard {shard}; this store has {} shards",
            links.len()
        )));
    };
    s.set_nonblocking(true)
        .map_err(|e| io("set_nonblocking", e))?;
    s.set_read_timeout(None)
        .map_err(|e| io("set_read_timeout", e))?;
    let fd = s.into_raw_fd();
    tracing::info!(%peer, shard, report, "slave connected");
    let job = handle.run_on(shard, move |ctx| async move {
        // SAFETY: `fd` is a connected socket handed to this shard alone.
        let stream =
            unsafe { <glommio::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        serve_slave(ctx.store, stream, peer, report, link).await
    });
    futures_lite::future::block_on(job)?
}
