//! What a hop between threads costs: round trips of a request that does no I/O
//! (queue offsets), from an outside thread through the `Handle`, from one shard to
//! another, and on the shard itself; then 1 KiB async puts made shard-locally, routed
//! from the other shard, and from an outside thread. Each with and without glommio's
//! `spin_before_park`.
//!
//! Each run starts with the baselines of the same run: bare cross-thread round trips
//! (two plain threads through `thread::park`/`unpark`, i.e. a futex; two threads
//! spinning on a flag; a plain thread and a glommio executor on CPU 0 and on CPU 1
//! through flume channels, i.e. glommio's foreign wake), so that figures from a noisy
//! machine are read as ratios to them (docs/performance/shard.md).
//!
//! `cargo bench --bench routing` for full counts; `cargo test --benches` runs it tiny.

// The load generator's baseline too (`coremq bench --via handle`); included by path so
// this bench needs no feature.
#[path = "../src/tools/loadgen/bare.rs"]
mod bare;

use coremq::block_on;
use coremq::{Message, ShardedConfig, ShardedStore, StoreConfig, StoreOps};
use std::time::{Duration, Instant};

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    let n = samples.len();
    let p50 = percentile(&mut samples, 0.50);
    let p99 = percentile(&mut samples, 0.99);
    println!(
        "{name:<56} n={n:<7} p50={:>7.1}us p99={:>7.1}us",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}

/// Round trips from this thread to a task on a glommio executor pinned to `cpu`,
/// through flume channels (a parked executor is woken by glommio's foreign wake).
fn bare_glommio(rounds: usize, cpu: usize) -> Vec<Duration> {
    let (to_tx, to_rx) = flume::bounded::<u64>(1);
    let (back_tx, back_rx) = flume::bounded::<u64>(1);
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(cpu))
        .spawn(move || async move {
            while let Ok(v) = to_rx.recv_async().await {
                if back_tx.send_async(v).await.is_err() {
                    break;
                }
            }
        })
        .unwrap();
    let v = (0..rounds as u64)
        .map(|i| {
            let t = Instant::now();
            to_tx.send(i).unwrap();
            assert_eq!(futures_lite::future::block_on(back_rx.recv_async()), Ok(i));
            t.elapsed()
        })
        .collect();
    drop(to_tx);
    ex.join().unwrap();
    v
}

fn baselines(rounds: usize) {
    report(
        "bare: thread park/unpark round trip",
        bare::thread_round_trips(rounds, false),
    );
    report(
        "bare: two spinning threads round trip",
        bare::thread_round_trips(rounds, true),
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for cpu in 0..cpus.min(2) {
        report(
            &format!("bare: glommio executor on CPU {cpu} round trip"),
            bare_glommio(rounds, cpu),
        );
    }
}

/// CPU time of this process so far (user + system), from `getrusage`.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the calling thread so far.
fn thread_cpu() -> Duration {
    // SAFETY: clock_gettime writes one timespec.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts
    };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Sends `rate` requests a second for `secs` to an echo over flume channels, each
/// awaited before the next; returns the CPU per request of the threads other than
/// this one (the process's CPU less this thread's).
fn paced_echo(
    rate: u64,
    secs: u64,
    to_tx: &flume::Sender<u64>,
    back_rx: &flume::Receiver<u64>,
) -> Duration {
    std::thread::sleep(Duration::from_millis(200));
    let n = rate * secs;
    let (c0, m0, t0) = (process_cpu(), thread_cpu(), Instant::now());
    for i in 0..n {
        let due = t0 + Duration::from_nanos(i * 1_000_000_000 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        to_tx.send(i).unwrap();
        assert_eq!(block_on(back_rx.recv_async()), Ok(i));
    }
    ((process_cpu() - c0) - (thread_cpu() - m0)) / n as u32
}

/// The floor under a put through the handle at a low rate: a bare glommio executor
/// (pinned to `cpu`, or unpinned) echoing one value per request through flume
/// channels, paced at `rate` from this thread; returns the executor's CPU per request.
fn bare_glommio_paced(rate: u64, secs: u64, cpu: Option<usize>) -> Duration {
    let (to_tx, to_rx) = flume::bounded::<u64>(1);
    let (back_tx, back_rx) = flume::bounded::<u64>(1);
    let placement = cpu.map_or(glommio::Placement::Unbound, glommio::Placement::Fixed);
    let ex = glommio::LocalExecutorBuilder::new(placement)
        .spawn(move || async move {
            while let Ok(v) = to_rx.recv_async().await {
                if back_tx.send_async(v).await.is_err() {
                    break;
                }
            }
        })
        .unwrap();
    let per = paced_echo(rate, secs, &to_tx, &back_rx);
    drop(to_tx);
    ex.join().unwrap();
    per
}

/// The same echo on a plain thread blocking in flume's `recv` (a futex): what waking
/// a thread costs here without io_uring.
fn bare_thread_paced(rate: u64, secs: u64) -> Duration {
    let (to_tx, to_rx) = flume::bounded::<u64>(1);
    let (back_tx, back_rx) = flume::bounded::<u64>(1);
    let t = std::thread::spawn(move || {
        while let Ok(v) = to_rx.recv() {
            if back_tx.send(v).is_err() {
                break;
            }
        }
    });
    let per = paced_echo(rate, secs, &to_tx, &back_rx);
    drop(to_tx);
    t.join().unwrap();
    per
}

/// What an idle two-shard store costs (share of one core over `secs`), then the
/// store's CPU per put (and the caller's inside `put`) at fixed low rates from one
/// outside thread, one at a time, next to a bare executor's at the same rate.
fn cpu_at_low_load(secs: u64, rates: &[u64]) {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut cfg = ShardedConfig::new(dir.path());
    cfg.shards = 2;
    cfg.store = StoreConfig::new(dir.path());
    cfg.store.commit_log_segment_bytes = 256 << 20;
    let store = ShardedStore::open(cfg).unwrap();
    let h = store.handle();
    std::thread::sleep(Duration::from_millis(500));
    let (c0, t0) = (process_cpu(), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = (process_cpu() - c0).as_secs_f64() / t0.elapsed().as_secs_f64();
    println!(
        "{:<56} {:>7.2}% of a core over {secs} s",
        "idle store (2 shards)",
        cpu * 100.0
    );
    let body = bytes::Bytes::from(vec![7u8; 1024]);
    for &rate in rates {
        println!(
            "{:<56} {:>6.1} us CPU per request",
            format!("bare thread (futex) echoing at {rate}/s"),
            bare_thread_paced(rate, secs).as_secs_f64() * 1e6
        );
        for (what, cpu) in [("pinned to CPU 0", Some(0)), ("unpinned", None)] {
            let per = bare_glommio_paced(rate, secs, cpu);
            println!(
                "{:<56} {:>6.1} us CPU per request",
                format!("bare executor ({what}) echoing at {rate}/s"),
                per.as_secs_f64() * 1e6
            );
        }
        let n = rate * secs;
        let (c0, m0, t0) = (process_cpu(), thread_cpu(), Instant::now());
        let mut in_put = Duration::ZERO;
        for i in 0..n {
            let due = t0 + Duration::from_nanos(i * 1_000_000_000 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let p = thread_cpu();
            let r = block_on(h.put(Message::new("R", (i % 8) as i32, body.clone())));
            in_put += thread_cpu() - p;
            assert!(r.status.is_stored());
        }
        let wall = t0.elapsed().as_secs_f64();
        // The store's threads: the process less this thread (whose pacing sleeps are
        // the bench's, not the store's); the caller's share: its CPU inside `put`.
        let store_cpu = ((process_cpu() - c0) - (thread_cpu() - m0)).as_secs_f64();
        let caller = in_put.as_secs_f64();
        println!(
            "{:<56} store {:>6.2}% of a core, {:>6.1} us CPU per put (+ caller {:>5.1} us)",
            format!("outside thread puts at {rate}/s ({n} puts)"),
            store_cpu / wall * 100.0,
            store_cpu / n as f64 * 1e6,
            caller / n as f64 * 1e6
        );
    }
    store.shutdown().unwrap();
}

fn run(spin: Option<Duration>, rounds: usize, puts: usize) {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut cfg = ShardedConfig::new(dir.path());
    cfg.shards = 2;
    cfg.spin_before_park = spin;
    cfg.store = StoreConfig::new(dir.path());
    cfg.store.commit_log_segment_bytes = 256 << 20;
    let store = ShardedStore::open(cfg).unwrap();
    let h = store.handle();
    let label = if spin.is_some() {
        "spin 50us"
    } else {
        "no spin"
    };
    let q0 = (0..64).find(|q| h.shard_of("R", *q) == 0).unwrap();
    let q1 = (0..64).find(|q| h.shard_of("R", *q) == 1).unwrap();

    let samples = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            block_on(h.queue_offsets("R", q1)).unwrap();
            t.elapsed()
        })
        .collect();
    report(
        &format!("outside thread -> shard round trip ({label})"),
        samples,
    );

    let samples = block_on(h.run_on(0, move |ctx| async move {
        let mut v = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            ctx.handle.queue_offsets("R", q1).await.unwrap();
            v.push(t.elapsed());
        }
        v
    }))
    .unwrap();
    report(&format!("shard 0 -> shard 1 round trip ({label})"), samples);

    let body = bytes::Bytes::from(vec![7u8; 1024]);
    for (what, q) in [("shard-local put", q0), ("put routed shard 0 -> 1", q1)] {
        let b = body.clone();
        let secs = block_on(h.run_on(0, move |ctx| async move {
            let t = Instant::now();
            for _ in 0..puts {
                let r = ctx.put(Message::new("R", q, b.clone())).await;
                assert!(r.status.is_stored());
            }
            t.elapsed().as_secs_f64()
        }))
        .unwrap();
        println!(
            "{:<56} {:>10.0} puts/s (one task, 1 KiB, async)",
            format!("{what} ({label})"),
            puts as f64 / secs
        );
    }
    for (shard, q) in [(0, q0), (1, q1)] {
        for (how, plain) in [("", false), (", futures_lite block_on", true)] {
            let mut lat = Vec::with_capacity(puts);
            let t = Instant::now();
            for _ in 0..puts {
                let p = Instant::now();
                let put = h.put(Message::new("R", q, body.clone()));
                let r = if plain {
                    futures_lite::future::block_on(put)
                } else {
                    block_on(put)
                };
                assert!(r.status.is_stored());
                lat.push(p.elapsed());
            }
            let rate = puts as f64 / t.elapsed().as_secs_f64();
            report(
                &format!("outside thread put to shard {shard} ({label}{how})"),
                lat,
            );
            println!("{:<56} {rate:>10.0} puts/s (one thread, 1 KiB, async)", "");
        }
    }
    let samples = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            block_on(h.queue_offsets("R", q0)).unwrap();
            t.elapsed()
        })
        .collect();
    report(
        &format!("outside thread -> shard 0 round trip ({label})"),
        samples,
    );
    store.shutdown().unwrap();
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, puts) = if full { (20_000, 100_000) } else { (200, 500) };
    baselines(rounds);
    if full {
        cpu_at_low_load(10, &[1_000, 10_000]);
    } else {
        cpu_at_low_load(1, &[1_000]);
    }
    run(None, rounds, puts);
    run(Some(Duration::from_micros(50)), rounds, puts);
}
