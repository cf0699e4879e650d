//! An idle store lets its executor sleep (issue 22): no task of the store wakes it on
//! a short period while nothing happens. Counted in wake-ups (the executor thread's
//! voluntary context switches), not time, so the machine's load does not matter.

mod common;

use coremq::{FlushMode, Message, PutStatus, Store, StoreConfig};
use std::time::Duration;

/// The executor thread's voluntary context switches so far (each a sleep it woke from).
fn voluntary_switches() -> u64 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc status")
}

fn idle_wakeups_per_second(mode: FlushMode) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (tx, rx) = std::sync::mpsc::channel();
    common::run(move || async move {
        let mut cfg = StoreConfig::new(&root);
        cfg.flush_mode = mode;
        let store = Store::open(cfg).await.unwrap();
        for i in 0..100u32 {
            let r = store
                .put(Message::new("Idle", (i % 4) as i32, vec![7u8; 512]))
                .await;
            assert_eq!(r.status, PutStatus::PutOk);
        }
        store.wait_dispatched().await;
        // Whatever the puts set going (flushes, checkpoints) settles first.
        glommio::timer::sleep(Duration::from_secs(2)).await;
        let window = Duration::from_secs(3);
        let before = voluntary_switches();
        // The test's own sleep: one wake-up.
        glommio::timer::sleep(window).await;
        let wakes = voluntary_switches() - before;
        tx.send(wakes as f64 / window.as_secs_f64()).unwrap();
        store.shutdown().await.unwrap();
    });
    rx.recv().unwrap()
}

/// The put-deadline ticker used to tick every 20 ms forever (50 wake-ups a second);
/// it now sleeps while no put waits. What remains: glommio's bounded park (10 a
/// second), the store's periodic work (flush and checkpoint intervals).
#[test]
fn an_idle_store_wakes_its_executor_rarely() {
    for mode in [FlushMode::Sync, FlushMode::Async] {
        let rate = idle_wakeups_per_second(mode);
        eprintln!("{mode:?}: an idle store woke its executor {rate:.1} times a second");
        assert!(
            rate < 30.0,
            "{mode:?}: an idle store woke its executor {rate:.1} times a second"
        );
    }
}
