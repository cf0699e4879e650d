//! Scenario 8, replication (issue 17): a slave store in the same process, following
//! the store under test over loopback through the HA protocol (`crate::ha`).
//!
//! * `--slave` (produce mode): the store is a SYNC_MASTER and a slave follows it from
//!   the start, so every put's latency includes the slave's acknowledgement (a frame
//!   out, the slave's checked append, a report back).
//! * `--mode replicate`: a kept store opened as a master, a new empty slave receiving
//!   all of it (`EmptySlaveStart::FirstSegment`); the catch-up's log bytes per second,
//!   from the slave's open to its last shard reaching the master's end.
//!
//! The slave runs unpinned in a directory beside the store's (`<dir>-slave`), removed
//! at the end; both processes' shards share the CPUs, as two brokers on one machine do.

use super::config::LoadConfig;
use super::{TempDir, open_store};
use crate::{EmptySlaveStart, HaRole, ShardedConfig, ShardedStore, StoreOps};
use futures_lite::future::block_on;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A slave following `master`, and the directory it lives in (removed on drop).
pub(super) struct Slave {
    pub store: ShardedStore,
    _dir: TempDir,
}

fn slave_dir(master_dir: &Path) -> PathBuf {
    let mut name = master_dir.as_os_str().to_owned();
    name.push("-slave");
    PathBuf::from(name)
}

/// Opens an empty slave of `master` (which must listen) and waits until every shard's
/// client is connected.
pub(super) fn start_slave(
    cfg: &LoadConfig,
    master: &ShardedStore,
    master_dir: &Path,
) -> Result<Slave, String> {
    let addr = master
        .ha()
        .and_then(|h| h.listen_addr)
        .ok_or("the master has no HA port")?;
    let dir = slave_dir(master_dir);
    let _ = std::fs::remove_dir_all(&dir);
    let guard = TempDir(Some(dir.clone()));
    let mut sc = ShardedConfig::new(&dir);
    sc.shards = master.handle().shards();
    sc.pin = false;
    sc.store = cfg.store_template(&dir);
    sc.store.ha.role = HaRole::Slave;
    sc.store.ha.listen = None;
    sc.store.ha.master_address = Some(addr);
    sc.store.ha.reconnect_interval = Duration::from_millis(100);
    let store = ShardedStore::open(sc)
        .map_err(|e| format!("cannot open the slave in {}: {e}", dir.display()))?;
    let status = store
        .ha()
        .ok_or("the slave has no HA client")?
        .status()
        .clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(0..store.handle().shards()).all(|s| status.connected(s)) {
        if Instant::now() > deadline {
            return Err("the slave did not connect to the master within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Slave { store, _dir: guard })
}

/// Every shard's log end.
fn ends(store: &ShardedStore) -> Result<Vec<u64>, String> {
    let h = store.handle();
    (0..h.shards())
        .map(|s| {
            block_on(h.shard_status(s))
                .map(|st| st.max_log_offset)
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// `--mode replicate`: a kept store's whole log replicated to a new slave, timed.
pub(super) fn run(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
) -> Result<(Value, String, Option<String>), String> {
    let mut template = cfg.store_template(dir);
    template.ha.role = HaRole::AsyncMaster;
    template.ha.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    template.ha.empty_slave_start = EmptySlaveStart::FirstSegment;
    let master = open_store(cfg, dir, shards, template)?;
    let want = ends(&master)?;
    let mins: Vec<u64> = (0..shards)
        .map(|s| block_on(master.handle().shard_status(s)).map_or(0, |st| st.min_log_offset))
        .collect();
    let bytes: u64 = want.iter().zip(&mins).map(|(e, m)| e - m).sum();
    let started = Instant::now();
    let slave = start_slave(cfg, &master, dir)?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut last_print = Instant::now();
    loop {
        let got = ends(&slave.store)?;
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the slave did not catch up: {got:?} of {want:?}"));
        }
        if !cfg.quiet && last_print.elapsed() >= Duration::from_secs(1) {
            let done: u64 = got
                .iter()
                .zip(&mins)
                .map(|(g, m)| g.saturating_sub(*m))
                .sum();
            eprintln!(
                "replicated {:.0} of {:.0} MB",
                done as f64 / 1e6,
                bytes as f64 / 1e6
            );
            last_print = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = started.elapsed().as_secs_f64();
    let shut = slave.store.shutdown().map_err(|e| e.to_string());
    drop(slave._dir);
    master.shutdown().map_err(|e| e.to_string())?;
    shut?;
    let mb_per_sec = bytes as f64 / 1e6 / secs.max(1e-9);
    let report = json!({
        "ok": true,
        "log_bytes": bytes,
        "seconds": secs,
        "log_mb_per_sec": mb_per_sec,
        "max_frame_bytes": cfg.store_template(dir).ha.max_frame_bytes,
    });
    let text = format!(
        "  replicated  {:.1} MB of log to an empty slave in {secs:.2} s: {mb_per_sec:.1} MB/s\n",
        bytes as f64 / 1e6
    );
    Ok((report, text, None))
}
