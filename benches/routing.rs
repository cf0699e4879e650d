//! What a hop between threads costs: round trips of a request that does no I/O
//! (queue offsets), from an outside thread through the `Handle`, from one shard to
//! another, and on the shard itself; then 1 KiB async puts made shard-locally, routed
//! from the other shard, and from an outside thread. Each with and without glommio's
//! `spin_before_park`.
//!
//! `cargo bench --bench routing` for full counts; `cargo test --benches` runs it tiny.

use coremq::{Message, ShardedConfig, ShardedStore, StoreConfig, StoreOps};
use futures_lite::future::block_on;
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
        "{name:<44} n={n:<7} p50={:>7.1}us p99={:>7.1}us",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
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
            "{:<44} {:>10.0} puts/s (one task, 1 KiB, async)",
            format!("{what} ({label})"),
            puts as f64 / secs
        );
    }
    for (shard, q) in [(0, q0), (1, q1)] {
        let t = Instant::now();
        for _ in 0..puts {
            assert!(
                block_on(h.put(Message::new("R", q, body.clone())))
                    .status
                    .is_stored()
            );
        }
        println!(
            "{:<44} {:>10.0} puts/s (one thread, 1 KiB, async)",
            format!("outside thread put to shard {shard} ({label})"),
            puts as f64 / t.elapsed().as_secs_f64()
        );
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
    run(None, rounds, puts);
    run(Some(Duration::from_micros(50)), rounds, puts);
}
