//! `coremq bench --no-pin` leaves the store's shard threads to the kernel; by default
//! each is pinned to one CPU. Read from the shard threads' own `Cpus_allowed_list`
//! while a run goes on. One test in its own binary: no other test's shards are alive
//! beside it to be mistaken for this run's.
use coremq::tools::loadgen;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[path = "common/cpus.rs"]
mod cpus;
use cpus::in_status as cpus_allowed;

/// The CPU masks of the threads alive now whose name starts `coremq-shard-`: the shard
/// executors (`coremq-shard-<i>-<id>`) and the helper threads they start, which take
/// their name and are never pinned.
fn shard_masks() -> Vec<Vec<usize>> {
    let mut masks = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.starts_with("coremq-shard-") {
            // A thread that ended between the listing and now has no status.
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            if let Some(m) = cpus_allowed(&status) {
                masks.push(m);
            }
        }
    }
    masks
}

/// Runs a small paced bench and returns every shard mask seen while it ran.
fn masks_during_a_run(no_pin: bool) -> Vec<Vec<usize>> {
    let dir = tempfile::tempdir().unwrap();
    let cfg = loadgen::LoadConfig {
        label: "pin".into(),
        data_dir: Some(dir.path().join("store")),
        shards: Some(2),
        queues: 8,
        messages: Some(2_000),
        rate: Some(4_000.0),
        outstanding: 4,
        quiet: true,
        no_pin,
        // Pinned throughout (an idle shard would let go of its CPU: `idle_unpin`).
        always_pin: !no_pin,
        ..loadgen::LoadConfig::default()
    };
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !done.load(Ordering::Acquire) {
                seen.extend(shard_masks());
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            seen
        })
    };
    let report = loadgen::run(&cfg).expect("bench runs");
    done.store(true, Ordering::Release);
    let seen = watcher.join().unwrap();
    assert!(report.ok(), "{}", report.summary());
    assert_eq!(
        report.to_json()["config"]["pin"].as_bool(),
        Some(!no_pin),
        "the report says how the shards were placed"
    );
    assert!(!seen.is_empty(), "the run's shard threads were seen");
    seen
}

#[test]
fn no_pin_leaves_the_shards_to_the_kernel() {
    let allowed = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap())
        .expect("the process's mask");
    let pinned = masks_during_a_run(false);
    assert!(
        pinned.iter().any(|m| m.len() == 1),
        "pinned by default: the executors on one CPU each, saw {pinned:?}"
    );
    if allowed.len() > 1 {
        for mask in masks_during_a_run(true) {
            assert_eq!(
                mask, allowed,
                "--no-pin: every shard thread on the process's CPUs"
            );
        }
    }
}
