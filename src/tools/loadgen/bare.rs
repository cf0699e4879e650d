//! A bare cross-thread wake-up: two plain threads handing a turn back and forth through
//! `thread::park`/`unpark` (a futex) or by spinning on a flag. The baseline a hop
//! through the store is read against on a noisy machine (`coremq bench --via handle`,
//! `cargo bench --bench routing`, which includes this file by path). Only `std`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `rounds` round trips between this thread and another: `park`/`unpark` (futex) or
/// spinning; each one's time.
pub fn thread_round_trips(rounds: usize, spin: bool) -> Vec<Duration> {
    let turn = Arc::new(AtomicU64::new(0));
    let main = std::thread::current();
    let t2 = turn.clone();
    let peer = std::thread::spawn(move || {
        for i in 0..rounds as u64 {
            while t2.load(Ordering::Acquire) != 2 * i + 1 {
                if spin {
                    std::hint::spin_loop();
                } else {
                    std::thread::park();
                }
            }
            t2.store(2 * i + 2, Ordering::Release);
            main.unpark();
        }
    });
    let peer_thread = peer.thread().clone();
    let mut v = Vec::with_capacity(rounds);
    for i in 0..rounds as u64 {
        let t = Instant::now();
        turn.store(2 * i + 1, Ordering::Release);
        peer_thread.unpark();
        while turn.load(Ordering::Acquire) != 2 * i + 2 {
            if spin {
                std::hint::spin_loop();
            } else {
                std::thread::park();
            }
        }
        v.push(t.elapsed());
    }
    peer.join().unwrap();
    v
}
