//! A shard's io_uring workers (the threads `iou-wrk-<shard tid>` that do its file writes)
//! run on the CPUs that hold no shard, unless `ShardedConfig::io_worker_cpus` says
//! otherwise; read from the workers' own `Cpus_allowed_list` while the store runs.
mod common;
use common::body;
use coremq::{Handle, Message, PutStatus, ShardedConfig, ShardedStore, StoreConfig, StoreOps};
use futures_lite::future::block_on;
use std::time::{Duration, Instant};

#[path = "common/cpus.rs"]
mod cpus;
use cpus::of as cpus_allowed;

/// The CPU masks of the io_uring workers of thread `tid`, one per worker.
fn worker_masks(tid: i32) -> Vec<Vec<usize>> {
    let name = format!("iou-wrk-{tid}");
    let mut masks = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = e.path().join("status");
            // A worker that exited between the listing and now has no status.
            if std::fs::metadata(&status).is_ok() {
                masks.push(cpus_allowed(status.to_str().unwrap()));
            }
        }
    }
    masks
}

/// Opens a one-shard store pinned to `shard_cpu`, puts until its shard has io_uring
/// workers, and returns their CPU masks.
fn masks_of_a_running_shard(
    shard_cpu: usize,
    io_worker_cpus: Option<Vec<usize>>,
) -> Vec<Vec<usize>> {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ShardedConfig::new(dir.path());
    cfg.shards = 1;
    cfg.cpus = Some(vec![shard_cpu]);
    cfg.io_worker_cpus = io_worker_cpus;
    cfg.store = StoreConfig::small_for_tests(dir.path());
    let store = ShardedStore::open(cfg).unwrap();
    let h = store.handle();
    let tid = cpus::shard0_tid(&h);
    let masks = masks_after_puts(&h, tid, "Workers");
    store.shutdown().unwrap();
    masks
}

/// Puts to `topic` through `h` until shard 0 (thread `tid`) has io_uring workers;
/// their CPU masks.
fn masks_after_puts(h: &Handle, tid: i32, topic: &str) -> Vec<Vec<usize>> {
    let started = Instant::now();
    let mut i = 0;
    loop {
        for _ in 0..50 {
            let m = Message::new(topic, 0, body(topic, 0, i));
            assert_eq!(block_on(h.put(m)).status, PutStatus::PutOk);
            i += 1;
        }
        let masks = worker_masks(tid);
        if !masks.is_empty() {
            return masks;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no io_uring worker of the shard appeared after {i} puts"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_shards_io_workers_run_on_the_cpus_without_a_shard() {
    let Some(allowed) = cpus::two_or_more() else {
        return;
    };
    let shard_cpu = allowed[0];
    let others: Vec<usize> = allowed[1..].to_vec();

    // The default: every worker on the CPUs without the shard.
    let masks = masks_of_a_running_shard(shard_cpu, None);
    assert!(
        masks.iter().all(|m| *m == others),
        "workers' CPUs {masks:?}, expected {others:?}"
    );

    // Kept at the kernel's default: the workers inherit the pinned shard's CPU. (This
    // is what the default changes; it also shows the check above can fail.)
    let masks = masks_of_a_running_shard(shard_cpu, Some(Vec::new()));
    assert!(
        masks.iter().all(|m| *m == vec![shard_cpu]),
        "workers' CPUs {masks:?}, expected the shard's {shard_cpu}"
    );

    // Named CPUs.
    let named = vec![*allowed.last().unwrap()];
    let masks = masks_of_a_running_shard(shard_cpu, Some(named.clone()));
    assert!(
        masks.iter().all(|m| *m == named),
        "workers' CPUs {masks:?}, expected {named:?}"
    );
}

#[test]
fn a_cpu_the_process_may_not_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ShardedConfig::new(dir.path());
    cfg.shards = 1;
    cfg.store = StoreConfig::small_for_tests(dir.path());
    cfg.io_worker_cpus = Some(vec![100_000]);
    refused(ShardedStore::open(cfg), "io_worker_cpus");
}

/// `opened` failed with a configuration error naming `setting`.
fn refused<T>(opened: coremq::Result<T>, setting: &str) {
    match opened {
        Err(coremq::Error::Config(why)) => assert!(why.contains(setting), "{why}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a CPU beyond the machine was accepted"),
    }
}

/// `coremq serve`'s `cpus`, `io_worker_cpus` and `unpin_when_idle` (TOML) reach the
/// store: the shard runs on the CPU named, and stays there while idle, its io_uring
/// workers on the ones named for them; a CPU the process may not use stops the node
/// before it serves.
#[cfg(feature = "node")]
#[test]
fn a_nodes_cpus_and_io_worker_cpus_come_from_its_config() {
    use coremq::node::{Node, NodeConfig};
    let Some(allowed) = cpus::two_or_more() else {
        return;
    };
    // The shard on the last CPU (not the default's first), its workers on the first.
    let (shard_cpu, worker_cpu) = (*allowed.last().unwrap(), allowed[0]);
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\nnamesrv_enable = false\n\
         metrics_enable = false\nha_enable = false\nshards = 1\n\
         cpus = [{shard_cpu}]\nio_worker_cpus = [{worker_cpu}]\nunpin_when_idle = false\n",
        dir.path().join("data")
    );
    let path = dir.path().join("coremq.toml");
    std::fs::write(&path, toml).unwrap();
    let cfg = NodeConfig::from_file(&path).unwrap();
    let node = Node::start(cfg.clone()).unwrap();
    let h = node.handle();
    let tid = cpus::shard0_tid(&h);
    // Idle for more than two of `idle_unpin`'s windows: pinned all the same.
    std::thread::sleep(Duration::from_millis(700));
    let shard = cpus_allowed(&format!("/proc/self/task/{tid}/status"));
    assert_eq!(shard, vec![shard_cpu], "the shard's CPUs");
    let masks = masks_after_puts(&h, tid, "NodeWorkers");
    node.shutdown().unwrap();
    assert!(
        masks.iter().all(|m| *m == vec![worker_cpu]),
        "workers' CPUs {masks:?}, expected [{worker_cpu}]"
    );

    let mut bad = cfg;
    bad.data_dir = dir.path().join("other");
    bad.cpus = Some(vec![100_000]);
    refused(Node::start(bad), "cpus");
}
