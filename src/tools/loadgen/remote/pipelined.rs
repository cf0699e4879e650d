//! Producers with more than one request in flight: each producer has its own
//! connection to each broker (one broker, or one per shard with `--follow-route`), and
//! a few threads (one per CPU this process may use, `--client-threads`) drive all the
//! connections on non-blocking sockets, waiting in `ppoll(2)` for answers, room to
//! write, or the next paced send. The connections are dealt to the threads by broker
//! ([`deal`]): a thread serves as few brokers as it can.
//!
//! Why: the client shares the machine's two cores with the node it measures, and each
//! of its threads competes with the shards for them and is woken by the node's answers,
//! a wake that the node's `sendmsg` pays for (on this nested VM a wake across CPUs is
//! the dearest part of it). Under 4 x 64 single sends with `--follow-route`, interleaved
//! pairs on one node binary (the node's `/proc` CPU over 6 s):
//! * a writer and a reader thread per connection (16) -> a thread per producer over its
//!   connections (4): 15-27% more sends a second (binary 697-711 k against 561-602 k) and
//!   a third less client CPU a send, the node's CPU a send the same;
//! * -> two threads, each a broker's connections: the node 1.89-2.02 -> 1.65-1.71 us a
//!   binary send (2.28-2.48 -> 2.02-2.09 JSON), its system time 0.55-0.60 -> 0.24-0.29
//!   us, 13-20% more sends a second, the client's CPU a send 25-30% lower (three pairs).
//!   A thread woken by one shard only is woken where that shard runs (pinning the threads
//!   to the shards' CPUs as well changed nothing); dealt by producer instead (each thread
//!   both brokers' connections), the node 2.31-2.37 us a JSON send.

use super::{Encoder, MAX_BURST, Next, Responses, Shared, code_and_opaque, encoder, settle};
use crate::tools::loadgen::LoadConfig;
use crate::tools::loadgen::remote::route::Broker;
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long the producer waits for the answers still in flight after its last send.
const DRAIN: Duration = Duration::from_secs(30);

/// The longest single wait in `ppoll` (the run's deadline and the drain are checked
/// between waits).
const MAX_WAIT: Duration = Duration::from_millis(100);

/// One connection of a producer: its encoder (whose buffer holds the burst being
/// written), its responses, and its requests in flight.
struct Conn {
    s: TcpStream,
    enc: Encoder,
    responses: Responses,
    /// opaque -> (sent at, messages).
    sent: HashMap<i32, (Instant, u64)>,
    /// Most requests in flight on this connection.
    window: usize,
    /// Bytes of `enc.out` written so far.
    written: usize,
    open: bool,
}

impl Conn {
    /// Writes what is left of the burst until the socket is full.
    fn flush(&mut self) -> std::io::Result<()> {
        while self.written < self.enc.out.len() {
            match self.s.write(&self.enc.out[self.written..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The connection ended or failed: what it had in flight counts as failed.
    fn close(&mut self, sh: &Shared) {
        let lost: u64 = self.sent.drain().map(|(_, (_, n))| n).sum();
        sh.failed.fetch_add(lost, Ordering::Relaxed);
        self.open = false;
        let _ = self.s.shutdown(std::net::Shutdown::Both);
    }
}

/// The connections of `producers` producers to each of `brokers` brokers dealt over
/// `threads` threads: for each thread, the broker of each of its connections. Dealt in
/// broker order, in runs as even as they go, so a thread serves as few brokers as it
/// can (one each when there are as many brokers as threads).
pub(super) fn deal(brokers: usize, producers: usize, threads: usize) -> Vec<Vec<usize>> {
    let total = brokers * producers;
    let threads = threads.clamp(1, total.max(1));
    (0..threads)
        .map(|t| (t * total / threads..(t + 1) * total / threads).map(|i| i / producers))
        .map(|run| run.collect())
        .collect()
}

/// Runs one connection to each of `brokers` (its producers' connections, from
/// [`deal`]; `window` (at least 1) requests in flight on each) on this thread, until
/// the run ends and their answers are in.
pub(super) fn connections(
    cfg: &LoadConfig,
    brokers: &[&Broker],
    window: usize,
    sh: &Shared,
) -> Result<(), String> {
    let mut conns = Vec::with_capacity(brokers.len());
    for b in brokers {
        let s = super::connect(&b.addr)?;
        s.set_nonblocking(true)
            .map_err(|e| format!("{}: non-blocking: {e}", b.addr))?;
        conns.push(Conn {
            s,
            enc: encoder(cfg, &b.dests),
            responses: Responses::new(),
            sent: HashMap::with_capacity(window * 2),
            window,
            written: 0,
            open: true,
        });
    }
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut seq: i32 = 0;
    let mut done = false;
    let mut drain_until = None;
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns.len());
    loop {
        // Fill every connection that has written its last burst and has free slots.
        let mut wake_at: Option<Instant> = None;
        for c in conns.iter_mut().filter(|c| c.open) {
            if c.written == c.enc.out.len() && !done {
                c.enc.out.clear();
                c.written = 0;
                let mut bytes = 0;
                let mut burst = 0;
                while c.sent.len() < c.window && burst < MAX_BURST {
                    match sh.take_due(c.enc.batch) {
                        Next::Send(first, n) => {
                            seq = seq.wrapping_add(1) & i32::MAX;
                            bytes += c.enc.push(cfg, seq, first, n);
                            c.sent.insert(seq, (Instant::now(), n));
                            burst += 1;
                        }
                        Next::At(due) => {
                            wake_at = Some(wake_at.map_or(due, |w| w.min(due)));
                            break;
                        }
                        Next::Done => {
                            done = true;
                            break;
                        }
                    }
                }
                sh.bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            if c.written < c.enc.out.len() && c.flush().is_err() {
                c.close(sh);
            }
        }
        if done {
            if conns.iter().all(|c| !c.open || c.sent.is_empty()) {
                break;
            }
            let until = *drain_until.get_or_insert_with(|| Instant::now() + DRAIN);
            if Instant::now() >= until {
                break;
            }
            wake_at = Some(until);
        }
        if conns.iter().all(|c| !c.open) {
            break;
        }
        // Wait for answers, room to write, or the next due send.
        fds.clear();
        for c in &conns {
            let mut events = 0;
            if c.open {
                events = libc::POLLIN;
                if c.written < c.enc.out.len() {
                    events |= libc::POLLOUT;
                }
            }
            // A closed connection's entry is ignored (negative fd).
            let fd = if c.open { c.s.as_raw_fd() } else { -1 };
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
        let wait = wake_at
            .map_or(MAX_WAIT, |t| t.saturating_duration_since(Instant::now()))
            .min(MAX_WAIT);
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` is a live, initialised array of `fds.len()` pollfds, `ts` a
        // valid timespec, and a null signal mask leaves the mask alone.
        let ready = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("ppoll: {e}"));
        }
        for (c, fd) in conns.iter_mut().zip(&fds) {
            if !c.open || fd.revents == 0 {
                continue;
            }
            if fd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                read_answers(c, sh, &mut hist);
            }
        }
    }
    for c in conns.iter_mut().filter(|c| c.open) {
        // Answers that never came (the drain ran out) count as failed.
        c.close(sh);
    }
    let _ = sh.hist.lock().expect("histogram").add(&hist);
    Ok(())
}

/// One read of what a connection's socket holds, and every whole answer in it settled.
fn read_answers(c: &mut Conn, sh: &Shared, hist: &mut Histogram<u64>) {
    match c.responses.fill(&mut c.s) {
        Ok(0) => return c.close(sh),
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return,
        Err(_) => return c.close(sh),
    }
    loop {
        match c.responses.frame() {
            Ok(Some(frame)) => {
                let Some((code, opaque)) = code_and_opaque(frame) else {
                    return c.close(sh);
                };
                settle(&mut c.sent, sh, hist, code, opaque);
            }
            Ok(None) => return,
            Err(()) => return c.close(sh),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::deal;

    #[test]
    fn connections_are_dealt_by_broker() {
        // Two shard brokers, four producers, two threads: a broker each.
        assert_eq!(deal(2, 4, 2), vec![vec![0; 4], vec![1; 4]]);
        // One broker, five producers over two threads: two and three.
        assert_eq!(deal(1, 5, 2), vec![vec![0; 2], vec![0; 3]]);
        // More threads than connections: one connection each.
        assert_eq!(deal(2, 1, 4), vec![vec![0], vec![1]]);
        // Three brokers over two threads: one thread serves two of them.
        assert_eq!(deal(3, 2, 2), vec![vec![0, 0, 1], vec![1, 2, 2]]);
        // Every connection dealt once.
        for (b, p, t) in [(1, 1, 1), (2, 3, 2), (4, 5, 3), (2, 64, 2), (3, 7, 5)] {
            let d = deal(b, p, t);
            let mut all: Vec<usize> = d.into_iter().flatten().collect();
            all.sort();
            let want: Vec<usize> = (0..b).flat_map(|k| std::iter::repeat_n(k, p)).collect();
            assert_eq!(all, want, "{b} brokers, {p} producers, {t} threads");
        }
    }
}
