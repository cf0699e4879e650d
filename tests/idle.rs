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

/// A store at `root` in `mode` holding `n` small puts, all dispatched.
async fn store_with_puts(root: &std::path::Path, mode: FlushMode, n: u32) -> Store {
    let mut cfg = StoreConfig::new(root);
    cfg.flush_mode = mode;
    let store = Store::open(cfg).await.unwrap();
    for i in 0..n {
        let r = store
            .put(Message::new("Idle", (i % 4) as i32, vec![7u8; 512]))
            .await;
        assert_eq!(r.status, PutStatus::PutOk);
    }
    store.wait_dispatched().await;
    store
}

fn idle_wakeups_per_second(mode: FlushMode) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (tx, rx) = std::sync::mpsc::channel();
    common::run(move || async move {
        let store = store_with_puts(&root, mode, 100).await;
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

/// When `path` was last modified, and what it holds.
fn stamp(path: &std::path::Path) -> (std::time::SystemTime, Vec<u8>) {
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    (modified, std::fs::read(path).unwrap())
}

/// An idle store writes nothing: its checkpoint rounds (every
/// `consume_queue_flush_interval`, 50 ms here) find the checkpoint page, the queue
/// manifest and the consume queues' last pages as they last wrote them and leave the
/// files alone (each idle round rewrote and synced all of them). A put moves them,
/// and the next rounds write them.
#[test]
fn an_idle_store_leaves_its_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    common::run(move || async move {
        let mut cfg = StoreConfig::new(&root);
        cfg.consume_queue_flush_interval = Duration::from_millis(50);
        cfg.flush_interval = Duration::from_millis(50);
        let store = Store::open(cfg).await.unwrap();
        let put = |i: i32| Message::new("Idle", i % 4, vec![7u8; 512]);
        for i in 0..10 {
            assert_eq!(store.put(put(i)).await.status, PutStatus::PutOk);
        }
        store.wait_dispatched().await;
        // Flushed, dispatched, and the rounds after it written.
        glommio::timer::sleep(Duration::from_millis(400)).await;
        let checkpoint = root.join("checkpoint");
        let manifest = root.join("config").join("cq-manifest");
        // Queue 2 of the topic: the put below goes to queue 10 % 4.
        let queue = root
            .join("consumequeue")
            .join("Idle")
            .join("2")
            .join("00000000000000000000");
        let (cp0, m0, q0) = (stamp(&checkpoint), stamp(&manifest), stamp(&queue));
        // Ten rounds with nothing new.
        glommio::timer::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            stamp(&checkpoint).0,
            cp0.0,
            "an idle round rewrote the checkpoint"
        );
        assert_eq!(
            stamp(&manifest).0,
            m0.0,
            "an idle round rewrote the manifest"
        );
        assert_eq!(
            stamp(&queue).0,
            q0.0,
            "an idle round rewrote a consume queue"
        );
        assert_eq!(store.put(put(10)).await.status, PutStatus::PutOk);
        store.wait_dispatched().await;
        glommio::timer::sleep(Duration::from_millis(400)).await;
        let (cp1, m1, q1) = (stamp(&checkpoint), stamp(&manifest), stamp(&queue));
        assert!(
            cp1.0 > cp0.0 && cp1.1 != cp0.1,
            "the checkpoint was not written after a put"
        );
        assert!(
            m1.0 > m0.0 && m1.1 != m0.1,
            "the manifest was not written after a put"
        );
        assert!(
            q1.0 > q0.0 && q1.1 != q0.1,
            "the consume queue was not written after a put"
        );
        store.shutdown().await.unwrap();
    });
}

/// Polls (every 5 ms, up to `within`) until the store's log is flushed to `end`.
async fn flushed_within(store: &Store, end: u64, within: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if store.flushed_log_offset() >= end {
            return true;
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// An async store's writer waits without a timer while everything written is flushed
/// (it woke every commit interval to find nothing); a put after such a spell still
/// reaches the disk on the flush interval, with no flush asked for: the first byte
/// written since the last flush wakes the writer.
#[test]
fn a_put_after_an_idle_spell_is_flushed_on_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    common::run(move || async move {
        let mut cfg = StoreConfig::new(&root);
        cfg.flush_mode = FlushMode::Async;
        cfg.commit_interval = Duration::from_millis(20);
        cfg.flush_interval = Duration::from_millis(50);
        // A lone small put is flushed on the interval, not only past a page count.
        cfg.flush_thorough_interval = Duration::from_millis(100);
        let store = Store::open(cfg).await.unwrap();
        for round in 0..3 {
            let r = store.put(Message::new("Idle", 0, vec![7u8; 100])).await;
            assert_eq!(r.status, PutStatus::PutOk);
            let end = r.log_offset + r.wrote_bytes as u64;
            assert!(
                flushed_within(&store, end, Duration::from_secs(3)).await,
                "round {round}: the put was not flushed within 3 s (flushed {}, end {end})",
                store.flushed_log_offset()
            );
            // Idle: everything written is flushed; the writer waits for the next byte.
            glommio::timer::sleep(Duration::from_millis(300)).await;
        }
        store.shutdown().await.unwrap();
    });
}

/// An async store whose last put is committed but not flushed (fewer bytes than
/// `flush_least_pages` pages, `flush_thorough_interval` not yet passed) has nothing to
/// do until that interval: its writer sleeps until the flush is due or the next put,
/// instead of turning every commit interval (5 times a second) to find nothing to
/// commit. The small put is still flushed by the thorough interval.
#[test]
fn a_committed_put_waits_for_its_flush_without_turning_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    common::run(move || async move {
        let mut cfg = StoreConfig::new(&root);
        cfg.flush_mode = FlushMode::Async;
        cfg.flush_thorough_interval = Duration::from_secs(4);
        let store = Store::open(cfg).await.unwrap();
        let r = store.put(Message::new("Idle", 0, vec![7u8; 100])).await;
        assert_eq!(r.status, PutStatus::PutOk);
        let end = r.log_offset + r.wrote_bytes as u64;
        // Committed within the commit interval (200 ms); then nothing is due but the
        // thorough flush.
        glommio::timer::sleep(Duration::from_millis(500)).await;
        assert!(
            store.flushed_log_offset() < end,
            "flushed before the thorough interval"
        );
        let before = store.stats().writer_turns;
        glommio::timer::sleep(Duration::from_secs(2)).await;
        let turns = store.stats().writer_turns - before;
        assert!(
            turns <= 1,
            "the writer turned {turns} times in 2 s with nothing to commit"
        );
        assert!(
            flushed_within(&store, end, Duration::from_secs(4)).await,
            "the small put was not flushed by the thorough interval"
        );
        store.shutdown().await.unwrap();
    });
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut ru), 0);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// A timer with a message pending far ahead, and a manifest already saved, sleeps
/// until that message or a new one: it does not wake at every save interval to find
/// nothing to save (it once spun there, its wait computed from another scan offset
/// than its save).
#[test]
fn a_timer_with_a_far_message_pending_stays_asleep() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    common::run(move || async move {
        let mut cfg = StoreConfig::new(&root);
        cfg.schedule.timer_save_interval = Duration::from_millis(20);
        let store = Store::open(cfg).await.unwrap();
        coremq::schedule::start(coremq::schedule::Solo(store.clone())).unwrap();
        let m = Message::new("Idle", 0, vec![7u8; 64]).with_property("TIMER_DELAY_SEC", "5");
        assert_eq!(store.put(m).await.status, PutStatus::PutOk);
        // The timer reads it and saves its manifest (every 20 ms here) first.
        glommio::timer::sleep(Duration::from_secs(1)).await;
        let window = Duration::from_secs(2);
        let before = thread_cpu_seconds();
        let wakes_before = voluntary_switches();
        glommio::timer::sleep(window).await;
        let cpu = thread_cpu_seconds() - before;
        let wakes = voluntary_switches() - wakes_before;
        tx.send((
            cpu / window.as_secs_f64(),
            wakes as f64 / window.as_secs_f64(),
        ))
        .unwrap();
        store.shutdown().await.unwrap();
    });
    // The executor's thread ends with the store. (Before the fix it lived on until the
    // message's due time, 5 s: 7 s in all against 3 s.)
    let took = started.elapsed();
    let (share, wakes) = rx.recv().unwrap();
    assert!(
        took < Duration::from_millis(4500),
        "the executor thread ended after {took:?}"
    );
    eprintln!(
        "a timer with a far message pending: {:.1}% of a core, {wakes:.1} wakes/s",
        share * 100.0
    );
    assert!(
        share < 0.05,
        "the executor used {:.1}% of a core",
        share * 100.0
    );
    assert!(wakes < 30.0, "the executor woke {wakes:.1} times a second");
}

/// A stopping dispatcher used to wait for the log to be flushed past its written end,
/// which a stop never does, so an async store's shutdown waited for the dispatcher's
/// safety wake-up: up to 100 ms, and up to 1.6 s once an idle dispatcher had backed
/// off (1.7 s idle here: a shutdown then waited ~1.4 s for it).
#[test]
fn an_idle_store_shuts_down_without_waiting_for_a_safety_wake() {
    for mode in [FlushMode::Async, FlushMode::Sync] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let (tx, rx) = std::sync::mpsc::channel();
        common::run(move || async move {
            let store = store_with_puts(&root, mode, 10).await;
            glommio::timer::sleep(Duration::from_millis(1700)).await;
            let start = std::time::Instant::now();
            store.shutdown().await.unwrap();
            tx.send(start.elapsed()).unwrap();
        });
        let took = rx.recv().unwrap();
        eprintln!("{mode:?}: shutdown took {took:?}");
        assert!(
            took < Duration::from_millis(600),
            "{mode:?}: shutdown of an idle store took {took:?}"
        );
    }
}

/// A reader tailing the log waits for dispatch to pass what it has seen
/// (`Store::wait_dispatched_past`): polled when it starts and when woken, not on a
/// timer; a put ends the wait with its record visible; a shutdown ends it with `false`.
#[test]
fn a_tailing_reader_waits_for_dispatch_without_polling() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (tx, rx) = std::sync::mpsc::channel();
    let (tx2, rx2) = std::sync::mpsc::channel();
    common::run(move || async move {
        let store = store_with_puts(&root, FlushMode::Async, 10).await;
        let seen = store.dispatched_log_offset();
        let waiter = {
            let store = store.clone();
            glommio::spawn_local(async move {
                let mut polls = 0u32;
                let mut wait = std::pin::pin!(store.wait_dispatched_past(seen));
                let passed = std::future::poll_fn(|cx| {
                    polls += 1;
                    wait.as_mut().poll(cx)
                })
                .await;
                (passed, polls, store.dispatched_log_offset())
            })
        };
        glommio::timer::sleep(Duration::from_millis(200)).await;
        let r = store.put(Message::new("Idle", 1, vec![9u8; 100])).await;
        assert_eq!(r.status, PutStatus::PutOk);
        let (passed, polls, visible) = waiter.await;
        tx.send((passed, polls, visible > seen)).unwrap();
        // Nothing more comes: the store's shutdown ends the next wait.
        let last = store.dispatched_log_offset();
        let again = glommio::spawn_local({
            let store = store.clone();
            async move { store.wait_dispatched_past(last).await }
        });
        glommio::timer::sleep(Duration::from_millis(20)).await;
        store.shutdown().await.unwrap();
        let ended = futures_lite::future::or(async { Some(again.await) }, async {
            glommio::timer::sleep(Duration::from_secs(5)).await;
            None
        })
        .await;
        tx2.send(ended).unwrap();
    });
    let (passed, polls, visible) = rx.recv().unwrap();
    assert!(
        passed && visible,
        "the put's record is visible when the wait ends"
    );
    assert!(
        polls <= 3,
        "the wait was polled {polls} times in 200 ms of nothing"
    );
    let ended = rx2.recv().unwrap();
    assert_eq!(ended, Some(false), "a shutdown ends the wait (with false)");
}
