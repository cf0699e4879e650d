//! coremq replication against rocketmq-rust's store (`rocketmq-store` 1.0.0 from
//! crates.io, the classic HA service and client), both directions, in one process:
//!
//! 1. **coremq master -> RocketMQ slave.** A one-shard coremq store (the HA port on a
//!    free loopback port) takes N messages; a `LocalFileMessageStore` with role SLAVE
//!    and `haMasterAddress` pointing at it follows. Checks: the slave's max physical
//!    offset reaches the master's end, the slave's commit-log bytes equal coremq's up
//!    to the end, and the slave's own dispatch serves every message by queue.
//! 2. **RocketMQ master -> coremq slave.** A `LocalFileMessageStore` (ASYNC_MASTER,
//!    `haListenPort` free) takes N messages; a one-shard coremq store with role slave
//!    (record_crc off: RocketMQ writes no record-CRC property) follows. Checks: the same
//!    three, through coremq's get.
//!
//! Both sides use 1 MiB commit-log segments. Prints PASS/FAIL lines; exit 0 when all
//! pass.

use bytes::Bytes;
use cheetah_string::CheetahString;
use coremq::{HaRole, Message, ShardedConfig, ShardedStore, StoreConfig, StoreOps};
use dashmap::DashMap;
use futures_lite::future::block_on;
use rocketmq_model::common::broker::broker_role::BrokerRole;
use rocketmq_model::common::config::TopicConfig;
use rocketmq_model::common::message::MessageConst;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::common::message::message_ext_broker_inner::MessageExtBrokerInner;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use rocketmq_store::{
    BrokerReadStore, BrokerReplicationStore, BrokerStorePort, BrokerWriteStore, FlushDiskType,
    LocalFileMessageStore, MessageStoreConfig, PutMessageStatus, StoreRuntimeConfig,
};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const SEG: u64 = 1 << 20;
const TOPIC: &str = "HaInterop";
const QUEUES: i32 = 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn service_context() -> rocketmq_runtime::ChildServiceContext {
    static OWNER: OnceLock<RuntimeOwner> = OnceLock::new();
    OWNER
        .get_or_init(|| {
            RuntimeOwner::plan(RuntimeConfig::server_default("coremq-interop-ha"))
                .expect("runtime plan")
                .build()
                .expect("runtime")
        })
        .root_context()
        .component("interop-store")
}

fn rocketmq_store(
    root: &Path,
    role: BrokerRole,
    ha_port: u16,
    master: Option<SocketAddr>,
) -> LocalFileMessageStore {
    let config = MessageStoreConfig {
        store_path_root_dir: root.to_string_lossy().to_string().into(),
        flush_disk_type: FlushDiskType::AsyncFlush,
        mapped_file_size_commit_log: SEG as usize,
        broker_role: role,
        ha_listen_port: ha_port as usize,
        ha_master_address: master.map(|m| m.to_string()),
        timer_wheel_enable: false,
        ..MessageStoreConfig::default()
    };
    let topics: Arc<DashMap<CheetahString, Arc<TopicConfig>>> = Arc::new(DashMap::new());
    topics.insert(TOPIC.into(), Arc::new(TopicConfig::new(TOPIC)));
    let mut store = LocalFileMessageStore::new(
        Arc::new(config),
        rocketmq_store_local::commit_log::append::micro_batch::MicroBatchPolicy::disabled(1)
            .expect("policy"),
        Arc::new(StoreRuntimeConfig::default()),
        topics,
        None,
        false,
        service_context(),
    )
    .expect("create the RocketMQ store")
    .expect("valid timer config");
    store.wire_owned_root_dependencies().expect("wire");
    store
}

fn coremq_config(root: &Path, role: HaRole) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = 1;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(root);
    cfg.store.commit_log_segment_bytes = SEG;
    cfg.store.ha.role = role;
    cfg.store.ha.heartbeat_interval = Duration::from_millis(500);
    cfg.store.ha.reconnect_interval = Duration::from_millis(200);
    cfg
}

fn body(i: u64) -> Vec<u8> {
    let mut b = format!("interop-{i}:").into_bytes();
    b.resize(100 + (i as usize * 7919) % 1500, b'a' + (i % 26) as u8);
    b
}

/// The first `len` bytes of a store root's commit log from `from`.
fn log_bytes(root: &Path, from: u64, to: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let start = pos / SEG * SEG;
        let path = root.join("commitlog").join(format!("{start:020}"));
        let data = std::fs::read(&path).unwrap_or_default();
        let end = to.min(start + SEG);
        let (a, b) = ((pos - start) as usize, (end - start) as usize);
        if data.len() < b {
            out.extend_from_slice(&data[a.min(data.len())..]);
            break;
        }
        out.extend_from_slice(&data[a..b]);
        pos = end;
    }
    out
}

fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        if Instant::now() > deadline {
            println!("FAIL timed out: {what}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn wait_quiet(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn check(ok: bool, what: &str) -> bool {
    println!("{} {what}", if ok { "PASS" } else { "FAIL" });
    ok
}

/// 1. coremq master, RocketMQ slave; `whole`: the master sends an empty slave
/// everything (`EmptySlaveStart::FirstSegment`), else its last segment onward
/// (RocketMQ's rule).
async fn coremq_to_rocketmq(n: u64, whole: bool) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (
        dir.path().join("coremq-master"),
        dir.path().join("rocketmq-slave"),
    );
    let port = free_port();
    let mut cfg = coremq_config(&mroot, HaRole::AsyncMaster);
    cfg.store.ha.listen = Some(SocketAddr::from(([127, 0, 0, 1], port)));
    if whole {
        cfg.store.ha.empty_slave_start = coremq::EmptySlaveStart::FirstSegment;
    }
    let master = ShardedStore::open(cfg).expect("coremq master");
    let h = master.handle();
    for i in 0..n {
        let m = Message::new(TOPIC, (i % QUEUES as u64) as i32, body(i)).with_keys(format!("k{i}"));
        assert!(block_on(h.put(m)).status.is_stored());
    }
    block_on(h.flush()).unwrap();
    let end = block_on(h.shard_status(0)).unwrap().max_log_offset;
    let mut slave = rocketmq_store(
        &sroot,
        BrokerRole::Slave,
        free_port(),
        Some(SocketAddr::from(([127, 0, 0, 1], port))),
    );
    slave.init().await.expect("init");
    assert!(slave.load().await, "load");
    slave.start().await.expect("start");
    slave
        .update_ha_master_address(&format!("127.0.0.1:{port}"))
        .await;
    let mut ok = wait(
        "the RocketMQ slave to reach the coremq master's end",
        60,
        || slave.get_max_phy_offset() as u64 >= end,
    );
    ok &= check(
        slave.get_max_phy_offset() as u64 == end,
        &format!(
            "RocketMQ slave end {} == coremq master end {end}",
            slave.get_max_phy_offset()
        ),
    );
    let from = if whole { 0 } else { end / SEG * SEG };
    let (a, b) = (
        log_bytes(&mroot.join("shard-0"), from, end),
        log_bytes(&sroot, from, end),
    );
    ok &= check(
        a.len() as u64 == end - from && a == b,
        &format!("commit-log bytes [{from}, {end}) identical (coremq master, RocketMQ slave)"),
    );
    if !whole {
        // rocketmq-store 1.0.0's slave starts its reput at 0 while its log begins at
        // the master's last segment: it dispatches nothing there (its quirk).
        slave.shutdown().await;
        master.shutdown().unwrap();
        return ok;
    }
    let topic: CheetahString = TOPIC.into();
    let mut count = 0;
    let dispatched = |s: &LocalFileMessageStore| {
        (0..QUEUES)
            .map(|q| s.get_max_offset_in_queue(&topic, q))
            .sum::<i64>() as u64
    };
    let live = wait_quiet(10, || dispatched(&slave) == n);
    let mut slave = if live {
        slave
    } else {
        // rocketmq-store 1.0.0's slave did not dispatch the replicated bytes while
        // running; reopened, its recovery builds the queues from the same bytes.
        println!(
            "NOTE the RocketMQ slave dispatched {} of {n} while running; reopening it",
            dispatched(&slave)
        );
        slave.shutdown().await;
        drop(slave);
        std::thread::sleep(Duration::from_millis(500));
        let mut again = rocketmq_store(&sroot, BrokerRole::Slave, free_port(), None);
        again.init().await.expect("init");
        assert!(again.load().await, "load");
        again.start().await.expect("start");
        wait("the reopened RocketMQ slave's dispatch", 40, || {
            dispatched(&again) == n
        });
        again
    };
    for q in 0..QUEUES {
        count += slave.get_max_offset_in_queue(&topic, q);
        let got = slave.get_message(&"g".into(), &topic, q, 0, 32, None).await;
        ok &= check(
            got.is_some_and(|g| g.message_count() > 0),
            &format!("RocketMQ slave serves queue {q}"),
        );
    }
    ok &= check(
        count as u64 == n,
        &format!("RocketMQ slave dispatched {count} of {n} messages"),
    );
    slave.shutdown().await;
    master.shutdown().unwrap();
    ok
}

/// 2. RocketMQ master, coremq slave.
async fn rocketmq_to_coremq(n: u64) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let (mroot, sroot) = (
        dir.path().join("rocketmq-master"),
        dir.path().join("coremq-slave"),
    );
    let port = free_port();
    let mut master = rocketmq_store(&mroot, BrokerRole::AsyncMaster, port, None);
    master.init().await.expect("init");
    assert!(master.load().await, "load");
    master.start().await.expect("start");
    let topic: CheetahString = TOPIC.into();
    for i in 0..n {
        let mut m = MessageExtBrokerInner::default();
        m.set_topic(topic.clone());
        m.message_ext_inner.set_queue_id((i % QUEUES as u64) as i32);
        m.set_body(Bytes::from(body(i)));
        m.put_property(
            CheetahString::from_static_str(MessageConst::PROPERTY_KEYS),
            CheetahString::from_string(format!("k{i}")),
        );
        let r = master.put_message(m).await;
        assert_eq!(r.put_message_status(), PutMessageStatus::PutOk);
    }
    let end = master.get_max_phy_offset() as u64;
    let mut cfg = coremq_config(&sroot, HaRole::Slave);
    cfg.store.record_crc = false;
    cfg.store.ha.master_address = Some(SocketAddr::from(([127, 0, 0, 1], port)));
    let slave = ShardedStore::open(cfg).expect("coremq slave");
    let h = slave.handle();
    let mut ok = wait(
        "the coremq slave to reach the RocketMQ master's end",
        60,
        || block_on(h.shard_status(0)).unwrap().max_log_offset >= end,
    );
    let got_end = block_on(h.shard_status(0)).unwrap().max_log_offset;
    ok &= check(
        got_end == end,
        &format!("coremq slave end {got_end} == RocketMQ master end {end}"),
    );
    block_on(h.flush()).unwrap();
    // A RocketMQ master sends an empty slave its last segment onward.
    let from = end / SEG * SEG;
    let start = block_on(h.shard_status(0)).unwrap().min_log_offset;
    ok &= check(
        start == from,
        &format!("coremq slave's log begins at the master's last segment {from} ({start})"),
    );
    let (a, b) = (
        log_bytes(&mroot, from, end),
        log_bytes(&sroot.join("shard-0"), from, end),
    );
    ok &= check(
        a.len() as u64 == end - from && a == b,
        &format!("commit-log bytes [{from}, {end}) identical (RocketMQ master, coremq slave)"),
    );
    block_on(h.wait_dispatched()).unwrap();
    let mut good = true;
    let mut count = 0;
    for q in 0..QUEUES {
        let (min, max) = block_on(h.queue_offsets(TOPIC, q)).unwrap();
        good &= max == n / QUEUES as u64;
        for off in min..max {
            let g = block_on(h.get(TOPIC, q, off, 1, 1 << 20)).unwrap();
            let m = g
                .records
                .first()
                .and_then(|r| coremq::StoredMessage::decode(r).ok());
            good &= m.is_some_and(|m| m.body[..] == body(q as u64 + off * QUEUES as u64)[..]);
            count += 1;
        }
    }
    ok &= check(
        good && count > 0,
        &format!("coremq slave serves the {count} replicated messages by queue, bodies intact"),
    );
    let last = n - 1;
    let hits = block_on(h.query_by_key(TOPIC, &format!("k{last}"), 4, 0, i64::MAX)).unwrap();
    ok &= check(
        hits.iter().any(|m| m.body[..] == body(last)[..]),
        "coremq slave finds a RocketMQ message by key",
    );
    slave.shutdown().unwrap();
    master.shutdown().await;
    ok
}

/// Control: RocketMQ master, RocketMQ slave. Whether rocketmq-store 1.0.0's slave
/// dispatches replicated bytes while running, with no coremq involved.
async fn rocketmq_to_rocketmq(n: u64) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut master = rocketmq_store(&dir.path().join("m"), BrokerRole::AsyncMaster, port, None);
    master.init().await.expect("init");
    assert!(master.load().await);
    master.start().await.expect("start");
    let topic: CheetahString = TOPIC.into();
    for i in 0..n {
        let mut m = MessageExtBrokerInner::default();
        m.set_topic(topic.clone());
        m.message_ext_inner.set_queue_id((i % QUEUES as u64) as i32);
        m.set_body(Bytes::from(body(i)));
        assert_eq!(
            master.put_message(m).await.put_message_status(),
            PutMessageStatus::PutOk
        );
    }
    let end = master.get_max_phy_offset();
    let mut slave = rocketmq_store(&dir.path().join("s"), BrokerRole::Slave, free_port(), None);
    slave.init().await.expect("init");
    assert!(slave.load().await);
    slave.start().await.expect("start");
    slave
        .update_ha_master_address(&format!("127.0.0.1:{port}"))
        .await;
    let caught = wait_quiet(60, || slave.get_max_phy_offset() >= end);
    let live = wait_quiet(10, || {
        (0..QUEUES)
            .map(|q| slave.get_max_offset_in_queue(&topic, q))
            .sum::<i64>()
            > 0
    });
    println!(
        "NOTE control (rocketmq-store master and slave, no coremq): slave caught up {caught}, dispatched while running {live}"
    );
    slave.shutdown().await;
    master.shutdown().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let a = coremq_to_rocketmq(n, true).await;
    let b = coremq_to_rocketmq(n, false).await;
    let c = rocketmq_to_coremq(n).await;
    rocketmq_to_rocketmq(n).await;
    std::process::exit(if a && b && c { 0 } else { 1 });
}
