//! Liveness of `Store::open` when the executor thread is descheduled at unlucky
//! moments, as it is on a loaded machine (load 7-13 on 2 CPUs hung about 3 in 20
//! `coremq bench --mode catch-up` opens with the published glommio 0.9.0).
//!
//! glommio 0.9.0 arms its preemption timer just before it runs the task queues; when
//! the thread lost the CPU for longer than that timer right there, the executor found
//! itself "preempted" before running any task and went to sleep with those tasks still
//! runnable. Only an I/O completion, a timer or a wake from another thread got it
//! going again. An open has none of these pending between two of its steps, so it hung
//! for good. Our vendored glommio parks only when no task queue is active (and bounds
//! every park to 10 ms): `vendor/glommio/COREMQ-PATCHES.md`; `tests/glommio_park.rs`
//! checks that fix on a bare executor.
//!
//! The test makes such descheduling happen on purpose: the executor runs pinned to one
//! CPU with a 1 ms preemption timer (what a sync-flush store sets), and a real-time
//! (SCHED_FIFO) thread pinned to the same CPU takes it for 3 ms at random moments,
//! each shortly after the executor used some CPU. That is what a loaded machine does,
//! without signals (whose EINTRs glommio does not always survive). The bursts stop as
//! soon as the executor stops using CPU, so an executor that went to sleep with
//! runnable tasks gets no help from them. On glommio 0.9.0 (without the store's former
//! heartbeat thread) the first open or shutdown hung in 6 of 6 runs, after 88-411
//! bursts; patched, 10 of 10 runs did their 30 open/shutdown cycles (and 4 of 4 more
//! with two CPU hogs). Needs permission for SCHED_FIFO (root); prints SKIPPED without
//! it.

use coremq::{Message, PutStatus, Store, StoreConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// How long a burst keeps the executor thread off its CPU.
const BURST: Duration = Duration::from_millis(3);
/// The executor's preemption timer: shorter than `BURST`.
const PREEMPT: Duration = Duration::from_millis(1);
/// CPU the executor must use between two bursts, so that bursts stop when it sleeps.
const RUN_BETWEEN_BURSTS_NS: u64 = 300_000;
/// No CPU used for this long while opens remain: the executor sleeps for good.
const HUNG: Duration = Duration::from_secs(20);
/// No open cycle finished for this long (one takes well under a second alone).
const STUCK: Duration = Duration::from_secs(90);

/// CPU time the thread `tid` of this process has used, in nanoseconds.
fn cpu_ns(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, passed by pointer with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pin to CPU {cpu}"
        );
    }
}

/// Makes the calling thread SCHED_FIFO; false when not permitted.
fn make_realtime() -> bool {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: plain syscall on the calling thread with a valid parameter.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
}

/// The first CPU this process may run on.
fn first_cpu() -> usize {
    // SAFETY: sched_getaffinity fills the zeroed set we pass with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("some CPU")
    }
}

fn msg(q: i32, i: u64) -> Message {
    Message::new("Live", q, format!("body {q}/{i} ").repeat(8)).with_keys(format!("k{i}"))
}

#[test]
fn store_open_survives_descheduling_at_unlucky_moments() {
    let cpu = first_cpu();
    // The thread that takes the executor's CPU away, on request.
    let stop = Arc::new(AtomicBool::new(false));
    let bursts_done = Arc::new(AtomicU64::new(0));
    let (rt_tx, rt_rx) = std::sync::mpsc::channel();
    let (stop2, done2) = (stop.clone(), bursts_done.clone());
    let hog = std::thread::spawn(move || {
        pin_to(cpu);
        let ok = make_realtime();
        rt_tx.send(ok).unwrap();
        if !ok {
            return;
        }
        while !stop2.load(SeqCst) {
            std::thread::park();
            let t = Instant::now();
            while t.elapsed() < BURST {
                std::hint::spin_loop();
            }
            done2.fetch_add(1, SeqCst);
        }
    });
    if !rt_rx.recv().unwrap() {
        eprintln!("SKIPPED: SCHED_FIFO not permitted (needs root)");
        hog.join().unwrap();
        return;
    }

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let tid = Arc::new(AtomicI32::new(0));
    let cycles = Arc::new(AtomicU64::new(0));
    const QUEUES: i32 = 48;
    const CYCLES: u64 = 30;
    let (tid2, cycles2) = (tid.clone(), cycles.clone());
    let executor = std::thread::spawn(move || {
        pin_to(cpu);
        // SAFETY: gettid has no preconditions.
        tid2.store(unsafe { libc::gettid() }, SeqCst);
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .preempt_timer(PREEMPT)
            .make()
            .expect("make executor");
        ex.run(async move {
            let store = Store::open(StoreConfig::new(&root)).await.expect("open");
            let mut i = 0;
            for q in 0..QUEUES {
                for _ in 0..20 {
                    assert_eq!(store.put(msg(q, i)).await.status, PutStatus::PutOk);
                    i += 1;
                }
            }
            store.shutdown().await.expect("shutdown");
            for _ in 0..CYCLES {
                let store = Store::open(StoreConfig::new(&root)).await.expect("reopen");
                assert_eq!(store.report.queues, QUEUES as usize);
                store.shutdown().await.expect("shutdown");
                cycles2.fetch_add(1, SeqCst);
            }
        });
    });

    while tid.load(SeqCst) == 0 {
        std::thread::yield_now();
    }
    let tid = tid.load(SeqCst);
    let start = Instant::now();
    let mut bursts = 0u64;
    let mut seen = cpu_ns(tid);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut idle_since = Instant::now();
    let mut hung = None;
    let (mut last_cycles, mut cycle_at) = (0, Instant::now());
    while !executor.is_finished() {
        let done = cycles.load(SeqCst);
        if done != last_cycles {
            (last_cycles, cycle_at) = (done, Instant::now());
        }
        if cycle_at.elapsed() > STUCK {
            hung = Some(format!("no open cycle finished for {STUCK:?}"));
            break;
        }
        if cpu_ns(tid) < seen + RUN_BETWEEN_BURSTS_NS {
            // The executor is waiting (for I/O, or forever): no burst until it runs.
            if idle_since.elapsed() > HUNG {
                hung = Some(format!(
                    "the executor has used no CPU for {HUNG:?}: it went to sleep with \
                     runnable tasks"
                ));
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
            continue;
        }
        idle_since = Instant::now();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let spin = Duration::from_micros(seed % 150);
        let t = Instant::now();
        while t.elapsed() < spin {
            std::hint::spin_loop();
        }
        hog.thread().unpark();
        bursts += 1;
        while bursts_done.load(SeqCst) < bursts {
            std::thread::sleep(Duration::from_micros(100));
        }
        seen = cpu_ns(tid);
    }
    stop.store(true, SeqCst);
    hog.thread().unpark();
    hog.join().unwrap();
    if let Some(why) = hung {
        panic!(
            "{why} ({bursts} bursts, {} of {CYCLES} open cycles done)",
            cycles.load(SeqCst)
        );
    }
    executor.join().expect("executor thread panicked");
    assert_eq!(cycles.load(SeqCst), CYCLES);
    eprintln!(
        "{CYCLES} open cycles under {bursts} bursts in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}
