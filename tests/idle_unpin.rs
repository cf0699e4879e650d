//! `ShardedConfig::unpin_when_idle`: a pinned shard that is mostly idle lets the kernel
//! place its executor thread (its mask becomes the CPUs of all the shards), pins
//! itself to its CPU again while busy, and lets go once idle again. Read from the
//! executor thread's own `Cpus_allowed_list`; without the setting the mask never moves.
use coremq::{ShardedConfig, ShardedStore, StoreConfig};
use futures_lite::future::block_on;
use std::time::{Duration, Instant};

#[path = "common/cpus.rs"]
mod cpus;
use cpus::of as mask_of;

/// Polls `tid`'s mask until it equals `want` or `within` passes; the last mask seen.
fn wait_for_mask(tid: i64, want: &[usize], within: Duration) -> Vec<usize> {
    let path = format!("/proc/self/task/{tid}/status");
    let until = Instant::now() + within;
    loop {
        let m = mask_of(&path);
        if m == want || Instant::now() >= until {
            return m;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn open(dir: &std::path::Path, unpin_when_idle: bool, cpus: Vec<usize>) -> ShardedStore {
    let mut cfg = ShardedConfig::new(dir);
    cfg.shards = 2;
    cfg.cpus = Some(cpus);
    cfg.unpin_when_idle = unpin_when_idle;
    cfg.store = StoreConfig::small_for_tests(dir);
    ShardedStore::open(cfg).unwrap()
}

#[test]
fn an_idle_shard_lets_go_of_its_cpu_and_a_busy_one_takes_it_back() {
    let Some(allowed) = cpus::two_or_more() else {
        return;
    };
    let cpus = vec![allowed[1], allowed[0]];
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true, cpus.clone());
    let h = store.handle();
    let tid = i64::from(cpus::shard0_tid(&h));

    // The shards' CPUs, ascending: where an idle shard may go.
    let mut shards_cpus = cpus.clone();
    shards_cpus.sort_unstable();
    let idle = wait_for_mask(tid, &shards_cpus, Duration::from_secs(5));
    assert_eq!(
        idle, shards_cpus,
        "idle: shard 0 may run on either shard's CPU"
    );

    // Busy: a job that keeps shard 0's executor running (yielding every millisecond)
    // for 1.5 s; meanwhile the shard pins itself to its CPU again.
    let busy = {
        let h = h.clone();
        std::thread::spawn(move || {
            block_on(h.run_on(0, |_| async {
                let end = Instant::now() + Duration::from_millis(1500);
                while Instant::now() < end {
                    let slice = Instant::now() + Duration::from_millis(1);
                    while Instant::now() < slice {
                        std::hint::spin_loop();
                    }
                    futures_lite::future::yield_now().await;
                }
            }))
            .unwrap()
        })
    };
    let pinned = wait_for_mask(tid, &cpus[..1], Duration::from_millis(1400));
    busy.join().unwrap();
    assert_eq!(pinned, cpus[..1], "busy: shard 0 pinned to its CPU again");

    let again = wait_for_mask(tid, &shards_cpus, Duration::from_secs(5));
    assert_eq!(again, shards_cpus, "idle again: let go again");
    store.shutdown().unwrap();

    // Without the setting an idle shard stays on its CPU.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false, cpus.clone());
    let h = store.handle();
    let tid = i64::from(cpus::shard0_tid(&h));
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        mask_of(&format!("/proc/self/task/{tid}/status")),
        cpus[..1],
        "unpin_when_idle off: pinned while idle"
    );
    store.shutdown().unwrap();
}
