//! Producers with more than one request in flight: a thread drives the connections of
//! a share of the producers (each producer its own connection to each broker, one per
//! broker with `--follow-route`) on non-blocking sockets, waiting in `ppoll(2)` for
//! answers, room to write, or the next paced send. Threads: one per CPU this process
//! may use (`--client-threads`), as a RocketMQ client's one Netty event loop serves all
//! its producers' connections.
//!
//! Why so few threads: the client shares the machine's two cores with the node it
//! measures, and each of its threads competes with the shards for them and wakes
//! through a socket. Under 4 x 64 single sends with `--follow-route`: a writer and a
//! reader thread per connection (16) -> one thread per producer (4) gave 15-27% more
//! sends a second (binary headers 697-711 k against 561-602 k, three pairs) and a third
//! less client CPU per send, the node's CPU per send the same; 4 -> 2 threads, 4-7% more
//! sends a second and 3-6% less node CPU per send (binary 1.97-2.08 -> 1.86-1.95 us,
//! JSON 2.43-2.47 -> 2.31-2.37, three pairs each): fewer of the node's answers find a
//! client thread asleep.

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

/// Runs `producers` producers over `brokers` (each its own connection to each broker,
/// `window` (at least 1) requests in flight on each) on this thread, until the run
/// ends and their answers are in.
pub(super) fn producers(
    cfg: &LoadConfig,
    brokers: &[Broker],
    producers: usize,
    window: usize,
    sh: &Shared,
) -> Result<(), String> {
    let mut conns = Vec::with_capacity(producers * brokers.len());
    for b in (0..producers).flat_map(|_| brokers) {
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
