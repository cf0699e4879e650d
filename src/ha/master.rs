//! The master's end of one slave connection: RocketMQ's `HAConnection`, its
//! `ReadSocketService` (reports in) and `WriteSocketService` (frames out), as two
//! glommio tasks on the shard whose log the slave follows.
//!
//! * **Start.** The first report is the slave's end. Past the master's end: one empty
//!   frame at the master's end tells the slave, then the connection closes (module
//!   docs of `ha`). Exactly the shard's base from an empty slave: from
//!   `ha.empty_slave_start`. Below the master's first byte: refused.
//! * **Frames** carry up to `ha.max_frame_bytes` of committed bytes from the slave's
//!   position, never across a segment's end; an empty frame after
//!   `ha.heartbeat_interval` without one.
//! * **Reports** after the first acknowledge every byte below them (the store's group
//!   transfer); one past the master's end closes the connection.
//! * **Housekeeping.** No report for `ha.housekeeping_interval` (20 s), a write that
//!   cannot finish within it, the store stopping or the service stopping: the
//!   connection closes.

use super::ShardLink;
use crate::config::EmptySlaveStart;
use crate::error::{Error, Result};
use crate::format::ha::{self as wire, FrameHeader};
use crate::store::Store;
use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How often a waiting writer looks at the stop signals.
const POLL: Duration = Duration::from_millis(100);

/// Serves one slave connection on the current shard until it ends (module docs).
/// `first_report` is the slave's end, already read from the socket.
pub async fn serve_slave(
    store: Store,
    stream: glommio::net::TcpStream,
    peer: SocketAddr,
    first_report: u64,
    link: ShardLink,
) -> Result<()> {
    let cfg = &link.cfg;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(cfg.housekeeping_interval));
    let _ = stream.set_write_timeout(Some(cfg.housekeeping_interval));
    let (rd, mut wr) = futures_lite::io::split(stream);
    let err = |op, e| Error::io(op, format!("HA connection to slave {peer}"), 0, e);
    let log = store.commit_log();
    let end = log.written();
    if first_report > end {
        tracing::error!(
            %peer, slave_end = first_report, master_end = end,
            "the slave's log runs past this master's end; telling it and closing"
        );
        let hb = FrameHeader {
            offset: end,
            size: 0,
        };
        wr.write_all(&hb.encode())
            .await
            .map_err(|e| err("write", e))?;
        let _ = wr.close().await;
        return Ok(());
    }
    let base = store.config().log_base_offset;
    let mut next = if first_report == base {
        match cfg.empty_slave_start {
            EmptySlaveStart::LastSegment => end / log.segment_bytes() * log.segment_bytes(),
            EmptySlaveStart::FirstSegment => log.min_offset(),
        }
        .max(log.min_offset())
    } else {
        first_report
    };
    if next < log.min_offset() {
        return Err(Error::BadRequest(format!(
            "slave {peer} asks from offset {next}, below this master's first byte {}",
            log.min_offset()
        )));
    }
    // Counted while connected; its reports also tell retention what it still needs.
    let slave = Rc::new(store.slave_connected(first_report.max(base)));
    let closed = Rc::new(Cell::new(false));
    let reader = glommio::spawn_local(read_reports(
        store.clone(),
        slave.clone(),
        rd,
        peer,
        closed.clone(),
    ));
    tracing::info!(%peer, from = next, "sending to the slave");
    let result = async {
        let mut last_sent = Instant::now();
        let mut frame = Vec::with_capacity(wire::FRAME_HEADER_LEN + cfg.max_frame_bytes);
        while !closed.get() && !link.stopped() && store.is_running() {
            if let Some(body) = log.read_committed(next, cfg.max_frame_bytes).await? {
                let h = FrameHeader {
                    offset: next,
                    size: body.len() as u32,
                };
                frame.clear();
                frame.extend_from_slice(&h.encode());
                frame.extend_from_slice(&body);
                wr.write_all(&frame).await.map_err(|e| err("write", e))?;
                next = h.end();
                last_sent = Instant::now();
                continue;
            }
            let beat_in = cfg.heartbeat_interval.saturating_sub(last_sent.elapsed());
            if beat_in.is_zero() {
                let hb = FrameHeader {
                    offset: next,
                    size: 0,
                };
                wr.write_all(&hb.encode())
                    .await
                    .map_err(|e| err("write", e))?;
                last_sent = Instant::now();
                continue;
            }
            futures_lite::future::or(
                async {
                    log.committed.wait_for(next + 1).await;
                },
                glommio::timer::sleep(beat_in.min(POLL)),
            )
            .await;
        }
        Ok(())
    }
    .await;
    closed.set(true);
    let _ = wr.close().await;
    drop(wr);
    // The reader ends at its next read (the socket is shut) or its timeout.
    reader.cancel().await;

    tracing::info!(%peer, sent_to = next, "slave connection closed");
    result
}

/// RocketMQ's `ReadSocketService`: every whole report acknowledges the bytes below it
/// (the newest of a read counts); a bad or impossible report, EOF or silence for
/// `housekeeping_interval` (the socket's read timeout) ends the connection.
async fn read_reports<R: futures_lite::AsyncRead + Unpin>(
    store: Store,
    slave: Rc<crate::store::SlaveGuard>,
    mut rd: R,
    peer: SocketAddr,
    closed: Rc<Cell<bool>>,
) {
    let mut buf = vec![0u8; 64 * wire::REPORT_LEN];
    let mut have = 0usize;
    while !closed.get() {
        let n = match rd.read(&mut buf[have..]).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                tracing::info!(%peer, error = %e, "slave connection: read failed or went silent");
                break;
            }
        };
        have += n;
        let (last, used) = wire::last_report(&buf[..have]);
        buf.copy_within(used..have, 0);
        have -= used;
        match last {
            None => {}
            Some(Ok(offset)) if offset <= store.commit_log().written() => {
                slave.report(offset);
            }
            Some(Ok(offset)) => {
                tracing::error!(
                    %peer, offset, master_end = store.commit_log().written(),
                    "slave reported an offset past this master's end; closing"
                );
                break;
            }
            Some(Err(kind)) => {
                tracing::error!(%peer, %kind, "slave sent a bad report; closing");
                break;
            }
        }
    }
    closed.set(true);
}
