//! A store kept by `coremq bench --data-dir` is the store users run: it opens with
//! `ShardedStore::open` (same shard count; another is refused by `store.meta`), every
//! message put by shard-local producers and by threads through the handle reads back
//! from the shard `shard_of` names, at that shard's offsets, and `coremq inspect
//! check` finds it clean.

use coremq::StoreOps;
use coremq::shard::{SHARD_SHIFT, shard_of, shard_of_offset};
use coremq::tools::{inspect, loadgen};
use coremq::{GetStatus, ShardedConfig, ShardedStore, StoredMessage};
use futures_lite::future::block_on;

const SHARDS: usize = 2;
const QUEUES: i32 = 8;
const PER_RUN: u64 = 400;

fn bench(dir: &std::path::Path, via: loadgen::Via) {
    let cfg = loadgen::LoadConfig {
        label: format!("bench_store {via:?}"),
        data_dir: Some(dir.to_path_buf()),
        shards: Some(SHARDS as u32),
        queues: QUEUES as u32,
        messages: Some(PER_RUN),
        outstanding: 8,
        producers: 2,
        via,
        quiet: true,
        ..loadgen::LoadConfig::default()
    };
    let report = loadgen::run(&cfg).expect("bench runs");
    assert!(report.ok(), "{}", report.summary());
    assert_eq!(report.messages, PER_RUN);
    assert_eq!(report.shard_queues.iter().sum::<usize>(), QUEUES as usize);
}

fn config(dir: &std::path::Path, shards: usize) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(dir);
    cfg.shards = shards;
    cfg.pin = false;
    cfg
}

#[test]
fn kept_bench_store_opens_sharded_and_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    bench(dir.path(), loadgen::Via::Local);
    bench(dir.path(), loadgen::Via::Handle);

    let refused = ShardedStore::open(config(dir.path(), SHARDS + 1));
    assert!(
        refused.is_err(),
        "store.meta must refuse another shard count"
    );

    let store = ShardedStore::open(config(dir.path(), SHARDS)).unwrap();
    let h = store.handle();
    let mut read = 0;
    for q in 0..QUEUES {
        let topic = "BenchTopic0";
        let owner = shard_of(topic, q, SHARDS);
        let got = block_on(h.get(topic, q, 0, 1024, 64 << 20)).unwrap();
        if got.status == GetStatus::NoMessageInQueue {
            continue;
        }
        assert_eq!(got.status, GetStatus::Found, "{topic}/{q}");
        for raw in &got.records {
            let m = StoredMessage::decode(raw).unwrap();
            assert_eq!((m.topic.as_str(), m.queue_id), (topic, q));
            assert_eq!(shard_of_offset(m.log_offset), owner, "{topic}/{q}");
            assert!(m.property("KEYS").is_some_and(|k| k.starts_with('k')));
            read += 1;
        }
    }
    assert_eq!(read, 2 * PER_RUN, "every message put reads back");
    store.shutdown().unwrap();

    assert_eq!(inspect::SHARD_SHIFT, SHARD_SHIFT);
    let mut out = Vec::new();
    let clean = inspect::print_check(dir.path(), &mut out).unwrap();
    let lines = String::from_utf8(out).unwrap();
    assert!(clean, "inspect check: {lines}");
    assert_eq!(lines.lines().count(), SHARDS);
}
