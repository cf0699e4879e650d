//! The floor under scenario 1b (issue 21): what handing 1 KiB messages between plain
//! threads costs on this machine with nothing of the store in the way.
//!
//! Two "producer" threads keep 256 messages each in flight to two "shard" threads (each
//! message to the shards in turn) through bounded flume channels, the channel the
//! handle's inboxes use; a shard copies the body into its own 64 MiB window, as a put
//! copies it into the write buffer, and sends the message back to its producer, who
//! stamps it and sends it again. Against it: the same stamp and copy with no hand-off
//! (two threads each producing into its own window). Four busy threads on the
//! machine's CPUs, as in 1b; CPU per message from `/proc/self/stat`.
//!
//! The same again through lock-free rings instead of flume (`hand_off_rings`): one ring
//! per producer and shard each way, a wake only for a thread that parked, and a woken
//! thread takes everything queued: the transport issue 21 suggests for the handle.
//!
//! The hand-off's CPU per message less the copy's is what a hop of that kind costs (the
//! channel's lock and wakes, the threads' switches, the body crossing caches) before
//! the store does anything: the store's own put costs ~1.4 us of CPU per message
//! (scenario 1), so a hand-off costing `h` us caps 1b near `1.4 / (1.4 + h)` of
//! scenario 1.
//!
//! `cargo bench --bench handoff -- --bench` (three rounds of 4 s per side); `cargo test
//! --benches` runs it tiny.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BODY: usize = 1024;
const WINDOW: usize = 64 << 20;
const IN_FLIGHT: usize = 256;

/// This process's user + system CPU, in seconds.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = stat.rsplit(')').next().expect("stat fields");
    let f: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| f[i].parse::<f64>().expect("ticks");
    (ticks(11) + ticks(12)) / 100.0
}

/// Messages a second and microseconds of CPU per message over `run`.
fn measure(run: Duration, start: impl FnOnce(&Arc<AtomicBool>, &Arc<AtomicU64>)) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    start(&stop, &count);
    // Let the threads reach their steady state first.
    std::thread::sleep(run / 8);
    let (n0, c0, t0) = (count.load(Ordering::Relaxed), cpu_secs(), Instant::now());
    std::thread::sleep(run);
    let n = (count.load(Ordering::Relaxed) - n0) as f64;
    let (cpu, secs) = (cpu_secs() - c0, t0.elapsed().as_secs_f64());
    stop.store(true, Ordering::Relaxed);
    (n / secs, cpu * 1e6 / n.max(1.0))
}

/// Two threads each stamping and copying its own messages: no hand-off.
fn local(stop: &Arc<AtomicBool>, count: &Arc<AtomicU64>) {
    for _ in 0..2 {
        let (stop, count) = (stop.clone(), count.clone());
        std::thread::spawn(move || {
            let mut window = vec![0u8; WINDOW];
            let mut body = vec![0u8; BODY];
            let (mut at, mut n) = (0, 0u64);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..IN_FLIGHT {
                    body[..8].copy_from_slice(&n.to_le_bytes());
                    if at + BODY > WINDOW {
                        at = 0;
                    }
                    window[at..at + BODY].copy_from_slice(&body);
                    at += BODY;
                    n += 1;
                }
                count.fetch_add(IN_FLIGHT as u64, Ordering::Relaxed);
                std::hint::black_box(&window);
            }
        });
    }
}

type Inbox = flume::Sender<(Box<[u8]>, flume::Sender<Box<[u8]>>)>;

/// Two producers handing messages to two shard threads and getting them back. The
/// threads end when `stop` is set (the shards when every producer has gone).
fn hand_off(stop: &Arc<AtomicBool>, count: &Arc<AtomicU64>) {
    let mut inboxes: Vec<Inbox> = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = flume::bounded::<(Box<[u8]>, flume::Sender<Box<[u8]>>)>(4096);
        inboxes.push(tx);
        let count = count.clone();
        std::thread::spawn(move || {
            let mut window = vec![0u8; WINDOW];
            let mut at = 0;
            while let Ok((body, back)) = rx.recv() {
                if at + BODY > WINDOW {
                    at = 0;
                }
                window[at..at + BODY].copy_from_slice(&body);
                at += BODY;
                count.fetch_add(1, Ordering::Relaxed);
                let _ = back.send(body);
            }
            std::hint::black_box(&window);
        });
    }
    for p in 0..2 {
        let (stop, inboxes) = (stop.clone(), inboxes.clone());
        std::thread::spawn(move || {
            let (back, returned) = flume::unbounded::<Box<[u8]>>();
            for i in 0..IN_FLIGHT {
                let body = vec![0u8; BODY].into_boxed_slice();
                let _ = inboxes[(i + p) % 2].send((body, back.clone()));
            }
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut body) = returned.recv() else {
                    return;
                };
                body[..8].copy_from_slice(&n.to_le_bytes());
                n += 1;
                if inboxes[n as usize % 2].send((body, back.clone())).is_err() {
                    return;
                }
            }
        });
    }
}

/// A single-producer single-consumer ring of boxed messages: a fixed array of slots and
/// two counters, no lock. `push` fails when full, `pop` when empty.
struct Ring {
    slots: Box<[AtomicUsize]>,
    head: AtomicUsize,
    tail: AtomicUsize,
}

impl Ring {
    fn new(capacity: usize) -> Ring {
        Ring {
            slots: (0..capacity).map(|_| AtomicUsize::new(0)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    /// The producer's end.
    fn push(&self, body: Box<[u8]>) -> Result<(), Box<[u8]>> {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail - self.head.load(Ordering::Acquire) == self.slots.len() {
            return Err(body);
        }
        let raw = Box::into_raw(body);
        // The slot holds the box's data pointer; its length is always `BODY`.
        self.slots[tail % self.slots.len()].store(raw as *mut u8 as usize, Ordering::Relaxed);
        self.tail.store(tail + 1, Ordering::Release);
        Ok(())
    }

    /// The consumer's end.
    fn pop(&self) -> Option<Box<[u8]>> {
        let head = self.head.load(Ordering::Relaxed);
        if head == self.tail.load(Ordering::Acquire) {
            return None;
        }
        let ptr = self.slots[head % self.slots.len()].load(Ordering::Relaxed) as *mut u8;
        self.head.store(head + 1, Ordering::Release);
        // SAFETY: `push` stored a pointer from `Box::into_raw` of a `BODY`-byte boxed
        // slice, read once here (the counters hand each slot to one side at a time).
        Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, BODY)) })
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

/// A thread that parks when it finds no work, and its wakers' way to tell: `parked` is
/// set (SeqCst) before a last look and the park, so a waker that pushed first and then
/// saw it unset knows the thread will find its push.
struct Sleeper {
    thread: std::thread::Thread,
    parked: AtomicBool,
}

impl Sleeper {
    fn wake(&self) {
        if self.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
    }

    /// Parks unless `more()` finds work after the flag is up.
    fn sleep(&self, more: impl Fn() -> bool) {
        self.parked.store(true, Ordering::SeqCst);
        if !more() {
            std::thread::park_timeout(Duration::from_millis(10));
        }
        self.parked.store(false, Ordering::SeqCst);
    }
}

/// As [`hand_off`], through a lock-free ring per producer and shard each way (what
/// issue 21 suggests for the handle): no lock, a wake only for a parked thread, and a
/// parked thread takes everything queued when it wakes.
fn hand_off_rings(stop: &Arc<AtomicBool>, count: &Arc<AtomicU64>) {
    type Pair = (Vec<Arc<Ring>>, Vec<Arc<Ring>>);
    // to_shard[p][s], back[p][s]
    let (to_shard, back): Pair = (
        (0..4).map(|_| Arc::new(Ring::new(2 * IN_FLIGHT))).collect(),
        (0..4).map(|_| Arc::new(Ring::new(2 * IN_FLIGHT))).collect(),
    );
    let (tx, rx) = std::sync::mpsc::channel::<Arc<Sleeper>>();
    let mut shards = Vec::new();
    for s in 0..2 {
        let (stop, count, tx) = (stop.clone(), count.clone(), tx.clone());
        let inbox: Vec<Arc<Ring>> = (0..2).map(|p| to_shard[p * 2 + s].clone()).collect();
        let outbox: Vec<Arc<Ring>> = (0..2).map(|p| back[p * 2 + s].clone()).collect();
        let (producers_tx, producers_rx) = std::sync::mpsc::channel::<Vec<Arc<Sleeper>>>();
        shards.push(producers_tx);
        std::thread::spawn(move || {
            let me = Arc::new(Sleeper {
                thread: std::thread::current(),
                parked: AtomicBool::new(false),
            });
            tx.send(me.clone()).expect("main waits");
            let producers = producers_rx.recv().expect("the producers' sleepers");
            let mut window = vec![0u8; WINDOW];
            let mut at = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut took = 0;
                for (p, ring) in inbox.iter().enumerate() {
                    let mut answered = false;
                    while let Some(body) = ring.pop() {
                        if at + BODY > WINDOW {
                            at = 0;
                        }
                        window[at..at + BODY].copy_from_slice(&body);
                        at += BODY;
                        took += 1;
                        let mut body = body;
                        while let Err(b) = outbox[p].push(body) {
                            body = b;
                            std::thread::yield_now();
                        }
                        answered = true;
                    }
                    if answered {
                        producers[p].wake();
                    }
                }
                count.fetch_add(took, Ordering::Relaxed);
                if took == 0 {
                    me.sleep(|| {
                        inbox
                            .iter()
                            .any(|r| r.head.load(Ordering::SeqCst) != r.tail.load(Ordering::SeqCst))
                    });
                }
            }
            std::hint::black_box(&window);
        });
    }
    let shard_sleepers: Vec<Arc<Sleeper>> = (0..2).map(|_| rx.recv().expect("shard up")).collect();
    let mut producer_sleepers = Vec::new();
    let (ptx, prx) = std::sync::mpsc::channel::<Arc<Sleeper>>();
    for p in 0..2 {
        let (stop, ptx) = (stop.clone(), ptx.clone());
        let outs: Vec<Arc<Ring>> = (0..2).map(|s| to_shard[p * 2 + s].clone()).collect();
        let ins: Vec<Arc<Ring>> = (0..2).map(|s| back[p * 2 + s].clone()).collect();
        let shards = shard_sleepers.clone();
        std::thread::spawn(move || {
            let me = Arc::new(Sleeper {
                thread: std::thread::current(),
                parked: AtomicBool::new(false),
            });
            ptx.send(me.clone()).expect("main waits");
            for i in 0..IN_FLIGHT {
                let s = (i + p) % 2;
                let _ = outs[s].push(vec![0u8; BODY].into_boxed_slice());
            }
            shards.iter().for_each(|s| s.wake());
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut got = 0;
                let mut sent = [false; 2];
                for ring in &ins {
                    while let Some(mut body) = ring.pop() {
                        body[..8].copy_from_slice(&n.to_le_bytes());
                        n += 1;
                        let s = n as usize % 2;
                        while let Err(b) = outs[s].push(body) {
                            body = b;
                            std::thread::yield_now();
                        }
                        sent[s] = true;
                        got += 1;
                    }
                }
                for s in 0..2 {
                    if sent[s] {
                        shards[s].wake();
                    }
                }
                if got == 0 {
                    me.sleep(|| {
                        ins.iter()
                            .any(|r| r.head.load(Ordering::SeqCst) != r.tail.load(Ordering::SeqCst))
                    });
                }
            }
        });
    }
    for _ in 0..2 {
        producer_sleepers.push(prx.recv().expect("producer up"));
    }
    for s in shards {
        let _ = s.send(producer_sleepers.clone());
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, run) = if full {
        (3, Duration::from_secs(4))
    } else {
        (1, Duration::from_millis(200))
    };
    for round in 1..=rounds {
        let (l_rate, l_cpu) = measure(run, local);
        // Let the last side's threads finish their round before the next starts.
        std::thread::sleep(Duration::from_millis(100));
        let (h_rate, h_cpu) = measure(run, hand_off);
        std::thread::sleep(Duration::from_millis(100));
        let (r_rate, r_cpu) = measure(run, hand_off_rings);
        std::thread::sleep(Duration::from_millis(100));
        println!(
            "round {round}: no hand-off {:>10.0} msg/s {l_cpu:5.2} us CPU/msg | flume {:>9.0} msg/s {h_cpu:5.2} us CPU/msg, its own {:5.2} | rings {:>9.0} msg/s {r_cpu:5.2} us CPU/msg, its own {:5.2}",
            l_rate,
            h_rate,
            h_cpu - l_cpu,
            r_rate,
            r_cpu - l_cpu
        );
    }
}
