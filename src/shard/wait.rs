//! How callers and shards wait for each other without paying a wake-up each time
//! (coremq's; RocketMQ calls its store in place). Issue 21 and 22's scheme:
//!
//! * **A wake-up is the expensive part of a hop.** On the machine this was measured on
//!   (2 vCPUs of a nested VM whose idle CPUs halt), a round trip between a plain thread
//!   and a parked glommio executor took 19-47 us at p50, two threads spinning on a flag
//!   0.1-0.4 us (`cargo bench --bench routing`'s baselines, docs/performance/shard.md).
//!   So each side of a hop stays awake while the other side is expected soon, and
//!   parks at once when it is not: a spin is bounded by the budget the wake it
//!   replaces would roughly cost.
//! * **The shard's side** ([`note_arrival`]): when requests arrive closer together than
//!   the shard's awake window (`ShardedConfig::awake_window`), the shard keeps its
//!   executor awake for one window after each ([`glommio`]'s `stay_awake_until`,
//!   coremq's patch: the executor polls I/O and foreign wakes instead of sleeping,
//!   while tasks still run as usual). A request after a longer gap finds it parked
//!   and wakes it as before; an idle or slowly paced store parks at once.
//! * **The caller's side** ([`expect_reply`]): a caller whose replies have been coming
//!   back within its reply-spin budget (`ShardedConfig::reply_spin`) spins for that
//!   long before parking, on its own CPU: a shard thread through `stay_awake_until`,
//!   a plain thread in [`block_on`]. Never on the CPU of the shard that must answer
//!   (that would keep the answer from being computed). How long replies take is
//!   measured from when the shard published them, so a caller that parked still
//!   learns that replies became fast again.
//! * **Timers due soon** (`ShardedConfig::timer_spin`): a shard with nothing to run
//!   whose next timer is due within the timer spin polls until it (glommio patch q,
//!   `spin_for_timers_within`) instead of parking: the park and the timer's wake
//!   cost ~20-25 us of CPU and made the timer ~20 us late (paced puts at 70,000
//!   msg/s: put p50 22 -> 2 us; the CPUs were ~90% busy with the parks and wakes and
//!   are fully busy spinning, 25.5 -> 28.4 us per message; a node at 1,000 sends a
//!   second used less CPU with it). 30 us: at 15 the p50 was 12 us. A gap longer
//!   than the spin parks as before, so an idle shard (its next timer a heartbeat
//!   away) and a node waiting for its network do not spin.
//! * Both sides only spin on their own thread; the one that wakes a parked peer pays
//!   a syscall (an eventfd write to a parked executor, a futex wake to a parked
//!   thread), and nothing when the peer is awake.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Nanoseconds of the process's monotonic clock since its first use here: replies
/// carry the moment they were published in it, readable on any thread.
pub(crate) fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The CPU the calling thread runs on right now (`sched_getcpu`, a vDSO read).
pub(crate) fn current_cpu() -> Option<usize> {
    // SAFETY: no arguments, no memory.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPUs this process may run on, ascending (its affinity mask; all CPUs when it
/// cannot be read).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into `set`.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            Vec::new()
        } else {
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    };
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    } else {
        cpus
    }
}

/// What a caller waiting for a reply should do before parking.
#[derive(Debug, Clone, Copy)]
struct SpinHint {
    /// Spin at most this long.
    budget: Duration,
    /// The CPU of the shard that answers, when known: never spin there.
    answer_cpu: Option<usize>,
}

/// The adaptive part of a caller's spin: how long replies took lately.
#[derive(Default)]
struct ReplyTimes {
    /// Exponentially weighted mean of reply times (from the first pending poll to the
    /// reply's publication), nanoseconds; 0 before the first.
    mean_ns: Cell<u64>,
}

thread_local! {
    /// Set by a reply future that went pending, taken by [`block_on`] before it
    /// parks.
    static HINT: Cell<Option<SpinHint>> = const { Cell::new(None) };
    static REPLY_TIMES: ReplyTimes = ReplyTimes::default();
    /// This thread is shard `i`'s executor (its awake window when it has one).
    static SHARD: Cell<Option<ShardAwake>> = const { Cell::new(None) };
}

/// Records how long a reply took (`since_ns` .. `sent_ns`, [`now_ns`] times).
pub(crate) fn reply_took(since_ns: u64, sent_ns: u64) {
    let took = sent_ns.saturating_sub(since_ns);
    REPLY_TIMES.with(|t| {
        let m = t.mean_ns.get();
        // 1/8 of each new sample: a few slow replies do not stop the spinning, a run of
        // them does.
        let next = if m == 0 { took } else { m - m / 8 + took / 8 };
        t.mean_ns.set(next.max(1));
    });
}

/// A caller on this thread is about to wait for a reply from a shard on
/// `answer_cpu`: keep this thread awake for up to `budget` if replies have lately
/// come back within it (see the module docs). On a shard's executor that is
/// `stay_awake_until`; on a plain thread, a hint that [`block_on`] reads before it
/// parks.
pub(crate) fn expect_reply(budget: Duration, answer_cpu: Option<usize>) {
    if budget.is_zero() {
        return;
    }
    let mean = REPLY_TIMES.with(|t| t.mean_ns.get());
    if mean > budget.as_nanos() as u64 {
        return;
    }
    if SHARD.with(|s| s.get()).is_some() {
        if answer_cpu.is_none() || answer_cpu != current_cpu() {
            glommio::executor().stay_awake_until(Instant::now() + budget);
        }
        return;
    }
    HINT.with(|h| h.set(Some(SpinHint { budget, answer_cpu })));
}

/// Runs `fut` to completion on the calling (plain) thread, as
/// `futures_lite::future::block_on` does, but when the future waits for a
/// [`Handle`](super::Handle)'s reply that is expected soon it spins on this thread
/// for up to `ShardedConfig::reply_spin` before parking (see the module docs). Use it
/// for one request at a time from a plain thread; any executor works (the futures are
/// `Send`), this one saves the wake-up of the calling thread.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let signal = Arc::new(Signal {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        HINT.with(|h| h.set(None));
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let hint = HINT.with(|h| h.take());
        signal.wait(hint);
    }
}

/// For another plain-thread executor (the load generator's): forgets the hint of an
/// earlier poll; call before polling.
#[cfg_attr(not(feature = "tools"), allow(dead_code))]
pub(crate) fn clear_spin_hint() {
    HINT.with(|h| h.set(None));
}

/// For another plain-thread executor about to park: when a reply future it polled
/// since [`clear_spin_hint`] expects its reply soon, spins on this thread until
/// `woken()` or the hint's budget ends (never on the answering shard's CPU), as
/// [`block_on`] does. Returns whether `woken()` said so.
#[cfg_attr(not(feature = "tools"), allow(dead_code))]
pub(crate) fn spin_before_park(woken: impl Fn() -> bool) -> bool {
    let Some(h) = HINT.with(|h| h.take()) else {
        return false;
    };
    if h.answer_cpu.is_some() && h.answer_cpu == current_cpu() {
        return false;
    }
    let until = Instant::now() + h.budget;
    loop {
        if woken() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
}

/// [`block_on`]'s waker: a flag the thread spins on, and its `Thread` to unpark when
/// it parked (`unpark` of a thread that is not parked is an atomic swap, no syscall).
struct Signal {
    woken: AtomicBool,
    thread: Thread,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl Signal {
    /// Until woken: spins for the hint's budget (unless on the answering CPU), then
    /// parks.
    fn wait(&self, hint: Option<SpinHint>) {
        if let Some(h) = hint
            && (h.answer_cpu.is_none() || h.answer_cpu != current_cpu())
        {
            let until = Instant::now() + h.budget;
            loop {
                if self.woken.swap(false, Ordering::Acquire) {
                    return;
                }
                if Instant::now() >= until {
                    break;
                }
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
        }
        while !self.woken.swap(false, Ordering::Acquire) {
            std::thread::park();
        }
    }
}

/// Spinning state of a shard's executor thread ([`note_arrival`]).
#[derive(Clone, Copy)]
struct ShardAwake {
    window: Duration,
    last_arrival: Option<Instant>,
}

/// Marks the calling thread as a shard's executor whose awake window is `window`
/// (zero: never stays awake for requests) and which spins rather than parks while its
/// next timer is due within `timer_spin` (see the module docs).
pub(crate) fn enter_shard(window: Duration, timer_spin: Duration) {
    glommio::executor().spin_for_timers_within(timer_spin);
    SHARD.with(|s| {
        s.set(Some(ShardAwake {
            window,
            last_arrival: None,
        }))
    });
}

/// Requests just arrived on this shard: if the last ones came within the awake
/// window, stay awake for one window (see the module docs). A no-op off a shard.
pub fn note_arrival() {
    SHARD.with(|s| {
        let Some(mut awake) = s.get() else {
            return;
        };
        if awake.window.is_zero() {
            return;
        }
        let now = Instant::now();
        if awake
            .last_arrival
            .is_some_and(|last| now.duration_since(last) <= awake.window)
        {
            glommio::executor().stay_awake_until(now + awake.window);
        }
        awake.last_arrival = Some(now);
        s.set(Some(awake));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_on_with_a_late_cross_thread_wake() {
        for spin in [Duration::ZERO, Duration::from_micros(50)] {
            let (tx, rx) = flume::bounded::<u32>(1);
            let t = std::thread::spawn(move || {
                for i in 0..200 {
                    if i % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    tx.send(i).unwrap();
                }
            });
            for i in 0..200 {
                let v = block_on(async {
                    expect_reply(spin, None);
                    rx.recv_async().await
                });
                assert_eq!(v.unwrap(), i);
            }
            t.join().unwrap();
        }
    }

    #[test]
    fn spin_before_park_only_with_a_hint() {
        REPLY_TIMES.with(|t| t.mean_ns.set(0));
        clear_spin_hint();
        assert!(!spin_before_park(|| true), "no reply expected: no spin");
        let budget = Duration::from_millis(20);
        expect_reply(budget, None);
        let t = Instant::now();
        assert!(spin_before_park(|| t.elapsed() > Duration::from_millis(1)));
        expect_reply(budget, None);
        let t = Instant::now();
        assert!(!spin_before_park(|| false));
        assert!(t.elapsed() >= budget, "spun for the budget");
        assert!(!spin_before_park(|| true), "the hint is used once");
    }

    #[test]
    fn slow_replies_stop_the_spinning() {
        REPLY_TIMES.with(|t| t.mean_ns.set(0));
        let budget = Duration::from_micros(50);
        for _ in 0..64 {
            reply_took(0, 1_000_000);
        }
        expect_reply(budget, None);
        assert!(HINT.with(|h| h.take()).is_none(), "1 ms replies: no spin");
        for _ in 0..64 {
            reply_took(0, 5_000);
        }
        expect_reply(budget, None);
        assert!(HINT.with(|h| h.take()).is_some(), "5 us replies: spin");
    }
}
