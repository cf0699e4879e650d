//! Regression tests for the liveness fixes in our vendored glommio 0.9.0
//! (`vendor/glommio/COREMQ-PATCHES.md`). Both fail on the published 0.9.0.
//!
//! * Parking with runnable tasks: 0.9.0's executor loop treated "preempted before any
//!   task queue ran" like "no task queue is active" and parked in `io_uring_enter`
//!   with the tasks still queued. Nothing but I/O, a timer or a wake from another
//!   thread ended that sleep, and tasks that only yield have none of these. A 1 ns
//!   preemption timer makes the preempt flag set by the time the task queues are
//!   looked at, as a thread descheduled for longer than its timer does.
//! * Waker reference count: 0.9.0 counted a task's references in an `i16`, and every
//!   wake from another thread holds one until the task's own executor processes it:
//!   32,768 such wakes of a task that does not run in between panicked the waking
//!   thread ("Waker invariant broken").
//!
//! Each runs on its own thread under a watchdog, so a hang fails the test rather than
//! hanging it.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::task::Poll;
use std::time::{Duration, Instant};

/// No progress for this long: the executor went to sleep with runnable tasks.
const STALL: Duration = Duration::from_secs(5);

/// Runs `body` on a new thread; it reports progress through the sender it gets, and
/// the test fails (instead of hanging) if no report comes for `STALL`. Returns the
/// number of reports.
fn watched(name: &str, body: impl FnOnce(mpsc::Sender<()>) + Send + 'static) -> u64 {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || body(tx))
        .expect("spawn the executor thread");
    let mut reports = 0;
    loop {
        match rx.recv_timeout(STALL) {
            Ok(()) => reports += 1,
            Err(RecvTimeoutError::Disconnected) => break,
            // The worker is left behind, asleep in io_uring_enter: the test process
            // ends without it.
            Err(RecvTimeoutError::Timeout) => panic!(
                "{name}: no progress for {STALL:?} after {reports} reports: the executor \
                 parked with runnable tasks (or spun without running them)"
            ),
        }
    }
    if let Err(e) = worker.join() {
        std::panic::resume_unwind(e);
    }
    reports
}

/// Times the calling thread gave up its CPU (slept): each park of an executor is one.
fn voluntary_switches() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .expect("read /proc/thread-self/status")
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
}

/// `(a)`: tasks that only yield, no I/O or timers behind them, with the preempt flag
/// set before the task queues run. 0.9.0 parks for good in its first run (10 of 10
/// runs of this test). Fixing only where it parks is not enough: with a 1 ns timer
/// the flag is set again every loop before any queue runs, and the executor spins
/// without running a task (the patch also gives every active queue one task a loop).
#[test]
fn executor_does_not_park_with_runnable_tasks() {
    const RUNS: u64 = 300;
    const TASKS: usize = 4;
    const YIELDS: usize = 8;
    let start = Instant::now();
    let runs = watched("park-test", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .preempt_timer(Duration::from_nanos(1))
            .make()
            .expect("make executor");
        let switches = voluntary_switches();
        for _ in 0..RUNS {
            ex.run(async {
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        glommio::spawn_local(async {
                            for _ in 0..YIELDS {
                                futures_lite::future::yield_now().await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await;
                }
                // A yield of the main task too, and one through glommio's own check.
                futures_lite::future::yield_now().await;
                glommio::yield_if_needed().await;
            });
            progress.send(()).expect("watchdog gone");
        }
        let parks = voluntary_switches() - switches;
        // The tasks never wait for anything: an executor that slept meanwhile parked
        // with runnable tasks, its bounded park (10 ms) hiding the hang. Patched, it
        // does not sleep at all (0 in every run seen); a few are let through for
        // noise (a page fault's I/O, a contended lock in the allocator).
        assert!(
            parks <= RUNS / 10,
            "the executor slept {parks} times in {RUNS} runs of tasks that never wait"
        );
    });
    assert_eq!(runs, RUNS);
    eprintln!("{RUNS} runs in {:?}", start.elapsed());
}

/// `(b)`: a task woken from another thread far more than 2^16 times while its
/// executor does not run; then its executor processes all those wakes.
#[test]
fn many_foreign_wakes_of_a_task_that_does_not_run() {
    const WAKES: u32 = 100_000;
    watched("waker-test", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let outcome = ex.run(async {
            let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
            let waking = std::thread::spawn(move || {
                // Not dropped while unwinding from 0.9.0's panic: its reference count
                // has wrapped by then, and the drop would panic again (an abort).
                let waker = std::mem::ManuallyDrop::new(waker);
                for _ in 0..WAKES {
                    waker.wake_by_ref();
                }
                drop(std::mem::ManuallyDrop::into_inner(waker));
            });
            // Blocks this executor thread, so none of the wakes is processed before
            // all were made: each holds a reference to this task meanwhile.
            let outcome = waking.join();
            if outcome.is_ok() {
                // Let the executor process the queued wakes (and drop their
                // references) before the task ends.
                glommio::timer::sleep(Duration::from_millis(5)).await;
                futures_lite::future::yield_now().await;
            }
            outcome
        });
        progress.send(()).expect("watchdog gone");
        if let Err(e) = outcome {
            let msg = e
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| e.downcast_ref::<&str>().copied())
                .unwrap_or("?");
            panic!("{WAKES} wakes from another thread panicked the waking thread: {msg}");
        }
    });
}

/// `(g)`: an executor told to `stay_awake_until` a deadline does not sleep while it
/// waits for a wake from another thread before then; without the deadline it does.
/// (Without the patch's check in `run`'s spin loop the first phase sleeps once per
/// wait: the assertion below fails.)
#[test]
fn stay_awake_until_keeps_the_executor_from_sleeping() {
    const WAITS: u64 = 20;
    watched("awake-test", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let (tx, rx) = flume::bounded::<u64>(1);
        let sender = std::thread::spawn(move || {
            for i in 0..2 * WAITS {
                std::thread::sleep(Duration::from_millis(2));
                tx.send(i).expect("executor gone");
            }
        });
        let (awake, parked) = ex.run(async {
            let mut phases = [0u64; 2];
            for (phase, slept) in phases.iter_mut().enumerate() {
                if phase == 1 {
                    // Past the last deadline of phase 0.
                    glommio::timer::sleep(Duration::from_millis(30)).await;
                }
                let before = voluntary_switches();
                for _ in 0..WAITS {
                    if phase == 0 {
                        glommio::executor()
                            .stay_awake_until(Instant::now() + Duration::from_millis(20));
                    }
                    rx.recv_async().await.expect("sender gone");
                }
                *slept = voluntary_switches() - before;
            }
            (phases[0], phases[1])
        });
        sender.join().expect("sender");
        progress.send(()).expect("watchdog gone");
        // Awake: no sleep at all is expected; a few for noise (a page fault's I/O).
        assert!(
            awake <= WAITS / 4,
            "slept {awake} times in {WAITS} waits while told to stay awake"
        );
        assert!(
            parked >= WAITS / 2,
            "slept only {parked} times in {WAITS} 2 ms waits without a deadline"
        );
    });
}

/// `(ac)`: `wake_after_next_park` wakes its waker once the executor returns from a
/// park, not while it runs tasks without sleeping, and a later call replaces the
/// waker. (Without the patch's lines after the park in `run`, nothing wakes it: the
/// second assertion fails.)
#[test]
fn wake_after_next_park_wakes_once_the_executor_slept() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    struct Count(AtomicU32);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    watched("after-park-test", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let (replaced, busy, slept, again) = ex.run(async {
            let first = Arc::new(Count(AtomicU32::new(0)));
            let second = Arc::new(Count(AtomicU32::new(0)));
            glommio::executor().wake_after_next_park(first.clone().into());
            glommio::executor().wake_after_next_park(second.clone().into());
            // Busy without a park: tasks that yield.
            for _ in 0..1000 {
                futures_lite::future::yield_now().await;
            }
            let busy = second.0.load(Ordering::Relaxed);
            // Nothing else to run: the executor parks until the timer.
            glommio::timer::sleep(Duration::from_millis(20)).await;
            let slept = second.0.load(Ordering::Relaxed);
            // Once: the next park's end does not wake it again.
            glommio::timer::sleep(Duration::from_millis(20)).await;
            let again = second.0.load(Ordering::Relaxed);
            (first.0.load(Ordering::Relaxed), busy, slept, again)
        });
        progress.send(()).expect("watchdog gone");
        assert_eq!(
            busy, 0,
            "woken while the executor ran tasks without sleeping"
        );
        assert_eq!(slept, 1, "woken when the park for the timer ended");
        assert_eq!(again, 1, "woken once only");
        assert_eq!(replaced, 0, "the replaced waker is not woken");
    });
}

/// `(q)`: `spin_for_timers_within` keeps an executor whose next timer is due within
/// the spin from sleeping until it, and a timer further away than the spin is slept
/// for as before. Each phase waits for 20 timers of 1 ms; told to spin for timers
/// within 5 ms, the thread must not sleep for them (a few switches for noise);
/// within 100 us (less than the 1 ms gap), it must sleep for most of them.
#[test]
fn spin_for_timers_within_keeps_the_executor_awake_for_a_near_timer() {
    const WAITS: u64 = 20;
    watched("timer-spin-test", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let (near, far) = ex.run(async {
            let mut phases = [0u64; 2];
            for (phase, slept) in phases.iter_mut().enumerate() {
                let within = if phase == 0 {
                    Duration::from_millis(5)
                } else {
                    Duration::from_micros(100)
                };
                glommio::executor().spin_for_timers_within(within);
                let before = voluntary_switches();
                for _ in 0..WAITS {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                *slept = voluntary_switches() - before;
            }
            (phases[0], phases[1])
        });
        progress.send(()).expect("watchdog gone");
        assert!(
            near <= WAITS / 4,
            "slept {near} times for {WAITS} timers 1 ms away, told to spin for 5 ms"
        );
        assert!(
            far >= WAITS / 2,
            "slept only {far} times for {WAITS} timers 1 ms away, told to spin for 100 us"
        );
    });
}

/// `(k, p)`: the preempt time still preempts. Since patch p it is a deadline
/// `need_preempt()` compares with the clock (k submitted a timer per loop); a
/// deadline never set or never read would leave a busy task that yields only when
/// `yield_if_needed` says so running for ever, and the other queue's task never
/// running. Each round: queue A's task spins until queue B's task
/// has run; B's task must get the CPU through A's preemption alone (no I/O, no
/// timers). Preempt times from 1 ns (due at once) to 2 ms.
#[test]
fn a_busy_task_queue_is_preempted_by_its_timer() {
    use std::cell::Cell;
    use std::rc::Rc;
    const ROUNDS: u64 = 50;
    for preempt in [
        Duration::from_nanos(1),
        Duration::from_micros(20),
        Duration::from_micros(200),
        Duration::from_millis(2),
    ] {
        let rounds = watched("preempt-test", move |progress| {
            let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .preempt_timer(preempt)
                .make()
                .expect("make executor");
            ex.run(async move {
                let ex = glommio::executor();
                let shares = glommio::Shares::Static(1000);
                let a = ex.create_task_queue(shares.clone(), glommio::Latency::NotImportant, "a");
                let b = ex.create_task_queue(shares, glommio::Latency::NotImportant, "b");
                for _ in 0..ROUNDS {
                    let b_ran = Rc::new(Cell::new(false));
                    let seen = b_ran.clone();
                    let started = Rc::new(Cell::new(false));
                    let a_started = started.clone();
                    let busy = glommio::spawn_local_into(
                        async move {
                            a_started.set(true);
                            let mut yields = 0u64;
                            while !seen.get() {
                                // Some work, then the cooperative check a busy task makes.
                                std::hint::black_box((0..200u64).sum::<u64>());
                                // The flag stays set until the executor's next sweep,
                                // so `yield_if_needed` yields exactly when it is seen here.
                                if glommio::executor().need_preempt() {
                                    yields += 1;
                                    glommio::yield_if_needed().await;
                                }
                            }
                            yields
                        },
                        a,
                    )
                    .expect("spawn on a");
                    // Queue a's task gets the CPU first and keeps it until preempted:
                    // only then does this (default-queue) task go on to start b's.
                    while !started.get() {
                        futures_lite::future::yield_now().await;
                    }
                    let other = glommio::spawn_local_into(async move { b_ran.set(true) }, b)
                        .expect("spawn on b");
                    other.await;
                    let yields = busy.await;
                    assert!(yields >= 1, "queue b ran without queue a being preempted");
                    progress.send(()).expect("watchdog gone");
                }
            });
        });
        assert_eq!(rounds, ROUNDS, "preempt timer {preempt:?}");
    }
}

/// `(l)`: a task queue whose turns are bounded (`bound_task_queue_turns`) gives the
/// executor back at its yields once a turn has lasted the bound, and the executor
/// then polls its timers: a 1 ms timer fires while a background task keeps yielding,
/// with a preempt timer (60 s) that never fires meanwhile. Both ways a busy task
/// yields are covered: unconditionally (`yield_now`) and when asked
/// (`yield_if_needed`, whose `need_preempt` now answers "the turn is over"). Without
/// the bound the timer does not fire before the task gives up after 20 s, and the
/// watchdog fails the test after 5 s (checked).
#[test]
fn a_bounded_task_queue_lets_timers_fire_between_its_turns() {
    use std::cell::Cell;
    use std::rc::Rc;
    for unconditional in [true, false] {
        let rounds = watched("bounded-turns", move |progress| {
            let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .preempt_timer(Duration::from_secs(60))
                .make()
                .expect("make executor");
            ex.run(async move {
                let ex = glommio::executor();
                let shares = glommio::Shares::Static(100);
                let bg = ex.create_task_queue(shares, glommio::Latency::NotImportant, "bg");
                ex.bound_task_queue_turns(bg, Some(Duration::from_micros(200)))
                    .expect("bound the queue's turns");
                for _ in 0..3 {
                    let fired = Rc::new(Cell::new(false));
                    let seen = fired.clone();
                    let busy = glommio::spawn_local_into(
                        async move {
                            let start = Instant::now();
                            while !seen.get() && start.elapsed() < Duration::from_secs(20) {
                                std::hint::black_box((0..200u64).sum::<u64>());
                                if unconditional {
                                    futures_lite::future::yield_now().await;
                                } else {
                                    glommio::yield_if_needed().await;
                                }
                            }
                            seen.get()
                        },
                        bg,
                    )
                    .expect("spawn on bg");
                    let timer = glommio::spawn_local(async move {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                        fired.set(true);
                    });
                    assert!(
                        busy.await,
                        "the timer did not fire while the bounded queue ran"
                    );
                    timer.await;
                    progress.send(()).expect("watchdog gone");
                }
            });
        });
        assert_eq!(rounds, 3, "unconditional yields: {unconditional}");
    }
}

/// `(n)`: a task's header takes its executor's sleep notifier from a per-thread cache of
/// the last lookup. Executors made one after another on one thread each get their own:
/// a task of each, parked on a wake from another thread, is woken through it (a task
/// given a dead executor's notifier would never be woken: the watchdog fails the test;
/// one given none panics at spawn).
#[test]
fn executors_in_turn_on_one_thread_each_get_their_own_notifier() {
    watched("notifier-test", |progress| {
        for round in 0..5 {
            let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .make()
                .expect("make executor");
            ex.run(async move {
                for _ in 0..3 {
                    let (tx, rx) = flume::bounded::<u32>(1);
                    let sender = std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(2));
                        tx.send(round).expect("receiver alive");
                    });
                    let got = glommio::spawn_local(async move { rx.recv_async().await })
                        .await
                        .expect("sender alive");
                    assert_eq!(got, round);
                    sender.join().expect("sender thread");
                }
            });
            progress.send(()).expect("watchdog gone");
        }
    });
}

/// Events of a kernel tracepoint (`syscalls/sys_enter_io_uring_enter`: the
/// `io_uring_enter` calls) caused by the calling thread from now on, counted by the
/// kernel (a tracepoint counter through `perf_event_open`); `None` where tracefs or
/// perf events are not available.
struct TraceCounter(std::os::fd::OwnedFd);

impl TraceCounter {
    fn start(event: &str) -> Option<TraceCounter> {
        use std::os::fd::FromRawFd;
        let id: u64 = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .find_map(|root| std::fs::read_to_string(format!("{root}/events/{event}/id")).ok())?
            .trim()
            .parse()
            .ok()?;
        // `perf_event_attr` as of PERF_ATTR_SIZE_VER0 (64 bytes); all flags clear:
        // enabled at once, this thread only, user and kernel.
        #[repr(C)]
        struct Attr {
            kind: u32,
            size: u32,
            config: u64,
            sample_period: u64,
            sample_type: u64,
            read_format: u64,
            flags: u64,
            wakeup_events: u32,
            bp_type: u32,
            config1: u64,
        }
        let attr = Attr {
            kind: 2, // PERF_TYPE_TRACEPOINT
            size: std::mem::size_of::<Attr>() as u32,
            config: id,
            sample_period: 0,
            sample_type: 0,
            read_format: 0,
            flags: 0,
            wakeup_events: 0,
            bp_type: 0,
            config1: 0,
        };
        // SAFETY: a valid attribute struct of the size it states; pid 0 and cpu -1
        // count this thread on any CPU; no group, no flags.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const Attr,
                0,
                -1,
                -1,
                0,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a file descriptor just returned to us and owned by nothing else.
        Some(TraceCounter(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(fd as i32)
        }))
    }

    fn count(&self) -> u64 {
        use std::io::Read;
        let mut buf = [0u8; 8];
        std::fs::File::from(self.0.try_clone().expect("dup counter"))
            .read_exact(&mut buf)
            .expect("read counter");
        u64::from_ne_bytes(buf)
    }
}

/// The `io_uring_enter` calls a thread makes ([`TraceCounter`]'s event).
const ENTERS: &str = "syscalls/sys_enter_io_uring_enter";

/// Events of the tracepoint `event` caused by the calling thread while `body` runs, and
/// its parks (voluntary context switches); `None` where they cannot be counted.
async fn count_events(
    event: &str,
    body: impl std::future::Future<Output = ()>,
) -> Option<(u64, u64)> {
    let counter = TraceCounter::start(event)?;
    let parks_before = voluntary_switches();
    body.await;
    Some((counter.count(), voluntary_switches() - parks_before))
}

/// [`count_events`]'s result, checked: printed and `None` where nothing was counted;
/// the executor must have parked in at least half of the `waits` 1 ms waits.
fn parked(counted: Option<(u64, u64)>, waits: u64) -> Option<(u64, u64)> {
    let Some((enters, parks)) = counted else {
        eprintln!("not countable here (no tracefs or perf events)");
        return None;
    };
    assert!(
        parks >= waits / 2,
        "only {parks} parks in {waits} 1 ms waits"
    );
    Some((enters, parks))
}

/// Prints `count` events over `per` units (rounds, parks) and asserts fewer than
/// `limit` a unit.
fn rate_below(count: u64, per: u64, what: &str, unit: &str, limit: f64) {
    let rate = count as f64 / per as f64;
    eprintln!("{count} {what} in {per} {unit}s: {rate:.2} a {unit}");
    assert!(
        rate < limit,
        "{rate:.2} {what} per {unit} ({count} in {per})"
    );
}

/// An executor answering a socket one request at a time (a coremq node at one send in
/// flight): a client thread sends 8 bytes 1 ms after each answer and reads them back;
/// with `channel`, it also sends on a channel 1 ms after that, which the executor waits
/// for after each answer (a second park a round). Ten rounds settle, `ROUNDS` are counted
/// by [`count_events`] (`event`, with a user `timer` pending when given), ten more
/// follow; `check` gets the count and the parks.
fn socket_rounds(
    name: &str,
    event: &'static str,
    channel: bool,
    timer: Option<Duration>,
    check: impl FnOnce(Option<(u64, u64)>) + Send + 'static,
) {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use std::io::{Read, Write};
    watched(name, move |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let (tx, rx) = flume::bounded::<u64>(1);
        let (tx, rx) = (channel.then_some(tx), channel.then_some(rx));
        let addr = listener.local_addr().expect("addr");
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_nodelay(true).expect("nodelay");
            let mut b = [0u8; 8];
            for i in 0..ROUNDS + 20 {
                // The executor parks before each request arrives.
                std::thread::sleep(Duration::from_millis(1));
                if s.write_all(&i.to_le_bytes()).is_err() || s.read_exact(&mut b).is_err() {
                    return;
                }
                if let Some(tx) = &tx {
                    std::thread::sleep(Duration::from_millis(1));
                    if tx.send(i).is_err() {
                        return;
                    }
                }
            }
        });
        let counted = ex.run(async move {
            let (stream, _) = listener.accept().expect("accept");
            use std::os::fd::{FromRawFd, IntoRawFd};
            // SAFETY: the descriptor is the accepted stream's, given up by it.
            let mut stream = unsafe { glommio::net::TcpStream::from_raw_fd(stream.into_raw_fd()) };
            let mut b = [0u8; 8];
            let mut answer = async |stream: &mut glommio::net::TcpStream| {
                stream.read_exact(&mut b).await.expect("read");
                stream.write_all(&b).await.expect("write");
                if let Some(rx) = &rx {
                    rx.recv_async().await.expect("client gone");
                }
            };
            for _ in 0..10 {
                answer(&mut stream).await;
            }
            let timer = timer.map(|t| glommio::spawn_local(glommio::timer::sleep(t)));
            let counted = count_events(event, async {
                for _ in 0..ROUNDS {
                    answer(&mut stream).await;
                }
            })
            .await;
            if let Some(timer) = timer {
                timer.await;
            }
            for _ in 0..10 {
                answer(&mut stream).await;
            }
            counted
        });
        client.join().expect("client");
        progress.send(()).expect("watchdog gone");
        check(counted);
    });
}

/// Rounds [`socket_rounds`] counts.
const ROUNDS: u64 = 100;

/// Patches s, u, w and x together: an executor serving a socket one request at a
/// time (a coremq node at one send in flight), with a channel wait after each request
/// and a user timer nearer than `MAX_PARK` pending (90 ms). Each of the 100 rounds
/// parks twice (for the socket, for the channel). With x the socket's poll is
/// submitted by the park's own `io_uring_enter`: 311 `io_uring_enter` for 100 rounds
/// (five runs), 410-417 without x (a poll's enter to submit it first). This test did
/// not reproduce the clock jitter w is about (the node did: COREMQ-PATCHES.md, w).
#[test]
fn an_executor_serving_a_socket_parks_with_two_enters() {
    let timer = Some(Duration::from_millis(90));
    socket_rounds("enter-count-timer", ENTERS, true, timer, |counted| {
        let Some((enters, _)) = parked(counted, ROUNDS) else {
            return;
        };
        let what = "io_uring_enter (a timer pending)";
        rate_below(enters, ROUNDS, what, "round", 3.6);
    });
}

/// Patches s and y: a parking executor keeps its sleep's latency-ring timeout armed from
/// one park to the next instead of arming one before each sleep and cancelling it after
/// (a `TIMEOUT` and a `TIMEOUT_REMOVE`, each its own `io_uring_enter`: 3 per park without
/// s), and its eventfd watch stays armed across foreign wakes (a multishot poll, where
/// 0.9.0 re-armed a one-shot read of it with an `io_uring_enter` after each: 2 per park
/// without y). Each of these waits parks the executor and is ended by another thread's
/// wake; with both, the park's own `io_uring_enter` is the only one.
#[test]
fn a_parking_executor_keeps_its_sleep_timeout_armed() {
    const WAITS: u64 = 100;
    watched("enter-count", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let (tx, rx) = flume::bounded::<u64>(1);
        let sender = std::thread::spawn(move || {
            for i in 0..WAITS + 10 {
                std::thread::sleep(Duration::from_millis(1));
                if tx.send(i).is_err() {
                    return;
                }
            }
        });
        let counted = ex.run(async {
            // Settle first: the executor's first loops set up its rings.
            for _ in 0..10 {
                rx.recv_async().await.expect("sender gone");
            }
            count_events(ENTERS, async {
                for _ in 0..WAITS {
                    rx.recv_async().await.expect("sender gone");
                }
            })
            .await
        });
        drop(rx);
        sender.join().expect("sender");
        progress.send(()).expect("watchdog gone");
        let Some((enters, parks)) = parked(counted, WAITS) else {
            return;
        };
        rate_below(enters, parks, "io_uring_enter", "park", 1.5);
    });
}

/// Patches aa and ab: an executor woken only by a socket (a client one request at a
/// time, a coremq node's shard at one send in flight) submits nothing per request. 0.9.0
/// submitted two `POLL_ADD`s a park: a new poll linking its rings (aa: the last one is
/// still armed, and 0.9.0's piled up in the kernel) and the socket's one-shot read poll
/// (ab: one multishot poll watches it). Counted by the kernel's `io_uring_submit_req`
/// tracepoint, SQEs submitted per round: 0.02 with both, 1.11-1.12 without ab, 1.14
/// without aa, 2.22-2.25 without either (checked).
#[test]
fn a_socket_served_one_request_at_a_time_submits_nothing_per_request() {
    let submits = "io_uring/io_uring_submit_req";
    socket_rounds("link-count", submits, false, None, |counted| {
        let Some((submitted, _)) = parked(counted, ROUNDS) else {
            return;
        };
        rate_below(submitted, ROUNDS, "SQEs submitted", "round", 0.5);
    });
}

/// Patch ab's reads as 0.9.0's: a reader that takes a few bytes at a time gets
/// everything the peer sent in one write (filled reads retry the socket without a
/// poll), waits for data sent later (a short read waits for the poll), and sees the end
/// as 0 bytes, again at every read after it (the end raises no new readiness); a
/// stream dropped while its poll is armed does not disturb the next one.
#[test]
fn a_stream_reads_what_arrives_and_the_end_again_and_again() {
    use futures_lite::AsyncReadExt;
    use std::io::Write;
    watched("multishot-read", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("make executor");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (go, wait) = mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            for round in 0..2u8 {
                let mut s = std::net::TcpStream::connect(addr).expect("connect");
                s.write_all(&[round; 10]).expect("write");
                // The reader has drained the first ten bytes and waits.
                wait.recv().expect("reader gone");
                std::thread::sleep(Duration::from_millis(20));
                s.write_all(&[round + 10; 3]).expect("write");
                wait.recv().expect("reader gone");
                std::thread::sleep(Duration::from_millis(20));
                // Dropped: the end.
            }
        });
        ex.run(async move {
            for round in 0..2u8 {
                let (stream, _) = listener.accept().expect("accept");
                use std::os::fd::{FromRawFd, IntoRawFd};
                // SAFETY: the descriptor is the accepted stream's, given up by it.
                let mut stream =
                    unsafe { glommio::net::TcpStream::from_raw_fd(stream.into_raw_fd()) };
                let mut got = Vec::new();
                let mut b = [0u8; 4];
                while got.len() < 10 {
                    let n = stream.read(&mut b).await.expect("read");
                    assert!(n > 0, "end before the first write was read");
                    got.extend_from_slice(&b[..n]);
                }
                assert_eq!(got, [round; 10]);
                go.send(()).expect("client gone");
                let n = stream.read(&mut b).await.expect("read the later write");
                assert_eq!(&b[..n], &[round + 10; 3]);
                go.send(()).expect("client gone");
                for _ in 0..3 {
                    assert_eq!(stream.read(&mut b).await.expect("read at the end"), 0);
                }
            }
        });
        client.join().expect("client");
        progress.send(()).expect("watchdog gone");
    });
}

/// Patch y keeps what 0.9.0's eventfd read gave a busy executor: a wake from another
/// thread of a task whose queue is `Latency::Matters` writes the eventfd even while the
/// executor is awake, the completion lands in the latency ring, and the running queue is
/// preempted at its next `need_preempt` check. Queue A's task spins (yielding only when
/// asked) with a preempt timer of 60 s that never fires here; queue B's task waits for a
/// value another thread sends 20 ms later, and must run long before A gives up (3 s).
/// With B's queue `Latency::NotImportant` (no forced write) A gives up first (checked).
#[test]
fn a_forced_foreign_wake_preempts_a_busy_task_queue() {
    use std::cell::Cell;
    use std::rc::Rc;
    const GIVE_UP: Duration = Duration::from_secs(3);
    watched("forced-wake", |progress| {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .preempt_timer(Duration::from_secs(60))
            .make()
            .expect("make executor");
        let waited = ex.run(async move {
            let ex = glommio::executor();
            let a = ex.create_task_queue(
                glommio::Shares::Static(1000),
                glommio::Latency::NotImportant,
                "a",
            );
            let b = ex.create_task_queue(
                glommio::Shares::Static(1000),
                glommio::Latency::Matters(Duration::from_millis(1)),
                "b",
            );
            let (tx, rx) = flume::bounded::<Instant>(1);
            let b_ran = Rc::new(Cell::new(false));
            let seen = b_ran.clone();
            let waiter = glommio::spawn_local_into(
                async move {
                    let sent = rx.recv_async().await.expect("sender gone");
                    b_ran.set(true);
                    sent.elapsed()
                },
                b,
            )
            .expect("spawn on b");
            // B's task runs first and waits on the channel; then A's spins.
            futures_lite::future::yield_now().await;
            let busy = glommio::spawn_local_into(
                async move {
                    let start = Instant::now();
                    while !seen.get() && start.elapsed() < GIVE_UP {
                        std::hint::black_box((0..200u64).sum::<u64>());
                        if glommio::executor().need_preempt() {
                            glommio::yield_if_needed().await;
                        }
                    }
                },
                a,
            )
            .expect("spawn on a");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let _ = tx.send(Instant::now());
            });
            busy.await;
            let ran = waiter.await;
            progress.send(()).expect("watchdog gone");
            ran
        });
        assert!(
            waited < Duration::from_secs(1),
            "the forced wake's task ran {waited:?} after its value was sent"
        );
    });
}
