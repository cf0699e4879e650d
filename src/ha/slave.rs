//! The slave's client for one shard: RocketMQ's `HAClient`, as glommio tasks on the
//! shard whose log it fills.
//!
//! * **Connect** to `ha.master_address` and report the shard's end at once (an empty
//!   shard reports its base `i << 56`: that names the shard to the master).
//! * **Frames.** Each frame must start exactly at the slave's end (what it appended
//!   plus the cut record it keeps), with one exception: an empty log accepts a first
//!   frame at a later segment start and begins there. A frame below the end, first on
//!   a connection, is the master telling its end: the slave's log runs past it, so the
//!   client refuses to follow, names both offsets ([`super::Divergence`]) and stops
//!   (`coremq ha truncate` is the way back). Any other mismatch, a frame across the
//!   slave's segment end, or bytes the checked append refuses close the connection
//!   (nothing of the bad record or after it is written) and the client connects again
//!   after `ha.reconnect_interval`.
//! * **Reports** go out after each frame that appended something and every
//!   `ha.heartbeat_interval`; a writer task sends them, so a slow read never delays a
//!   heartbeat. No frame (heartbeats included) for `ha.housekeeping_interval`: the
//!   connection closes.

use super::{Divergence, ShardLink};
use crate::error::{Error, Result};
use crate::format::ha::{self as wire, FrameHeader};
use crate::store::Store;
use crate::wake::Notify;
use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often a waiting task looks at the stop signals.
const POLL: Duration = Duration::from_millis(100);

/// Why a connection ended.
enum Ended {
    /// Closed, refused or broken: connect again.
    Retry(String),
    /// The slave's log runs past the master's: stop following.
    Diverged(Divergence),
    /// The store or the service stopped.
    Stopped,
}

/// Follows the master for one shard until the store or the service stops, or the
/// logs diverge (module docs).
pub async fn run_client(store: Store, link: ShardLink) {
    let Some(master) = link.cfg.master_address else {
        return;
    };
    let shard = link.shard;
    loop {
        if link.stopped() || !store.is_running() {
            return;
        }
        link.me().connects.fetch_add(1, Ordering::SeqCst);
        let ended = follow(&store, &link, master).await;
        link.me().connected.store(false, Ordering::SeqCst);
        match ended {
            Ended::Stopped => return,
            Ended::Diverged(d) => {
                tracing::error!(
                    shard,
                    slave_end = d.slave_end,
                    master_end = d.master_end,
                    "this slave's commit log runs past its master's end (the master lost \
                     bytes it had sent); refusing to follow. Stop this node and run \
                     `coremq ha truncate --data-dir <dir> --to {}` to cut the slave back \
                     (the cut bytes are kept in lost+found)",
                    d.master_end
                );
                *link.me().diverged.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
                return;
            }
            Ended::Retry(why) => {
                tracing::warn!(shard, %master, why, "HA connection to the master ended; reconnecting");
            }
        }
        let mut waited = Duration::ZERO;
        while waited < link.cfg.reconnect_interval {
            if link.stopped() || !store.is_running() {
                return;
            }
            glommio::timer::sleep(POLL).await;
            waited += POLL;
        }
    }
}

/// One connection: report, then take frames until it ends.
async fn follow(store: &Store, link: &ShardLink, master: SocketAddr) -> Ended {
    let cfg = &link.cfg;
    let stream = match futures_lite::future::or(
        async { Some(glommio::net::TcpStream::connect(master).await) },
        async {
            glommio::timer::sleep(cfg.housekeeping_interval).await;
            None
        },
    )
    .await
    {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Ended::Retry(format!("connect: {e}")),
        None => return Ended::Retry("connect timed out".into()),
    };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(cfg.housekeeping_interval));
    let _ = stream.set_write_timeout(Some(cfg.housekeeping_interval));
    let (mut rd, wr) = futures_lite::io::split(stream);
    link.me().connected.store(true, Ordering::SeqCst);
    let ended = Rc::new(Cell::new(false));
    let reported = Rc::new(Notify::default());
    let reporter = glommio::spawn_local(send_reports(
        store.clone(),
        wr,
        link.clone(),
        ended.clone(),
        reported.clone(),
    ));
    tracing::info!(shard = link.shard, %master, end = store.log_end(), "connected to the master");
    let result = take_frames(store, link, &mut rd, &reported).await;
    ended.set(true);
    reported.notify();
    let _ = reporter.await;
    match result {
        Ok(e) => e,
        Err(e) => {
            link.me().refused.fetch_add(1, Ordering::SeqCst);
            Ended::Retry(e.to_string())
        }
    }
}

/// RocketMQ's `HAClient.reportSlaveMaxOffset`: the end at once, then after each
/// append (`reported` is notified) and every heartbeat interval.
async fn send_reports<W: futures_lite::AsyncWrite + Unpin>(
    store: Store,
    mut wr: W,
    link: ShardLink,
    ended: Rc<Cell<bool>>,
    reported: Rc<Notify>,
) {
    let mut last = None;
    let mut since = Duration::ZERO;
    while !ended.get() {
        let end = store.log_end();
        if last != Some(end) || since >= link.cfg.heartbeat_interval {
            if let Err(e) = wr.write_all(&wire::encode_report(end)).await {
                tracing::info!(shard = link.shard, error = %e, "cannot report to the master");
                break;
            }
            last = Some(end);
            since = Duration::ZERO;
        }
        let wait = link.cfg.heartbeat_interval.min(POLL);
        futures_lite::future::or(reported.wait(), glommio::timer::sleep(wait)).await;
        since += wait;
    }
    ended.set(true);
    let _ = wr.close().await;
}

/// Reads frames and appends their bytes until the connection ends.
async fn take_frames<R: futures_lite::AsyncRead + Unpin>(
    store: &Store,
    link: &ShardLink,
    rd: &mut R,
    reported: &Notify,
) -> Result<Ended> {
    let cfg = &link.cfg;
    let log_err = |op, e| {
        Error::io(
            op,
            format!("HA connection to {:?}", cfg.master_address),
            0,
            e,
        )
    };
    let max_cut = store.config().max_record_bytes() + 8;
    let seg_bytes = store.config().commit_log_segment_bytes;
    // Bytes received past the log's end: the start of a cut record.
    let mut cut: Vec<u8> = Vec::new();
    let mut body = vec![0u8; cfg.max_frame_bytes];
    let mut first = true;
    loop {
        if link.stopped() || !store.is_running() {
            return Ok(Ended::Stopped);
        }
        let mut head = [0u8; wire::FRAME_HEADER_LEN];
        match rd.read_exact(&mut head).await {
            Ok(()) => {}
            Err(e) => return Ok(Ended::Retry(format!("read: {e}"))),
        }
        let h = FrameHeader::decode(&head, cfg.max_frame_bytes).map_err(|kind| Error::Corrupt {
            path: format!("HA frame from {:?}", cfg.master_address).into(),
            offset: 0,
            kind,
            detail: Some("bad frame header".into()),
        })?;
        let n = h.size as usize;
        rd.read_exact(&mut body[..n])
            .await
            .map_err(|e| log_err("read a frame", e))?;
        let end = store.log_end() + cut.len() as u64;
        if h.offset < end && first {
            return Ok(Ended::Diverged(Divergence {
                shard: link.shard,
                slave_end: end,
                master_end: h.offset,
            }));
        }
        first = false;
        if h.offset != end {
            let empty = store.log_is_empty() && cut.is_empty();
            if !(empty && h.offset > end && h.offset.is_multiple_of(seg_bytes)) {
                return Err(Error::BadRequest(format!(
                    "the master sent a frame at offset {} but this slave's end is {end} \
                     (an empty slave starts only at a segment start: are the masters's \
                     segments {seg_bytes} bytes?)",
                    h.offset
                )));
            }
            store.restart_empty_log_at(h.offset)?;
        }
        if n == 0 {
            continue;
        }
        let seg_end = h.offset / seg_bytes * seg_bytes + seg_bytes;
        if h.end() > seg_end {
            return Err(Error::BadRequest(format!(
                "the master sent [{}, {}) across this slave's segment end {seg_end}: its \
                 commit-log segments are not {seg_bytes} bytes (commit_log_segment_bytes \
                 must be the same on both)",
                h.offset,
                h.end()
            )));
        }
        cut.extend_from_slice(&body[..n]);
        let done = store.append_replica(&cut).await?;
        cut.drain(..done.consumed);
        if cut.len() > max_cut {
            return Err(Error::BadRequest(format!(
                "{} bytes after offset {} make no whole record",
                cut.len(),
                store.log_end()
            )));
        }
        if done.consumed > 0 {
            reported.notify();
        }
    }
}
