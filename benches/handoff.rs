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
//! The hand-off's CPU per message less the copy's is what any hop of this kind costs
//! (the channel's lock and wakes, the threads' switches, the body crossing caches)
//! before the store does anything: the store's own put costs ~1.4 us of CPU per
//! message (scenario 1), so a hand-off costing `h` us caps 1b near `1.4 / (1.4 + h)`
//! of scenario 1.
//!
//! `cargo bench --bench handoff -- --bench` (three rounds of 4 s per side); `cargo test
//! --benches` runs it tiny.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
        println!(
            "round {round}: no hand-off {:>10.0} msg/s {l_cpu:5.2} us CPU/msg | hand-off {:>9.0} msg/s {h_cpu:5.2} us CPU/msg | the hand-off's own {:5.2} us/msg",
            l_rate,
            h_rate,
            h_cpu - l_cpu
        );
    }
}
