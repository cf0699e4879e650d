//! A pinned shard that is mostly idle lets the kernel place its thread, and pins itself
//! again once busy (`ShardedConfig::unpin_when_idle`, on by default; coremq's, RocketMQ
//! pins nothing).
//!
//! Why: at light load almost every message wakes a parked shard, and waking a thread on
//! a CPU that went idle, from another CPU, is the dearest part of a message on the
//! machine this was measured on (a nested VM: a bare echo costs 23-25 us of CPU per
//! round trip across CPUs against 11-13 on one). An unpinned thread is woken where its
//! waker runs when that CPU has room. Deciding figures (interleaved pairs, 2 CPUs): a
//! node at 1,000 sends a second 67.5-80 us of CPU per send unpinned against 90-105
//! pinned; the handle at 1,000 puts a second 73-79 against 85-93 us per put; but an
//! unpaced embedded store 0.86-0.88 M msg/s unpinned against 1.03-1.13 M pinned. So
//! a shard follows its load: unpinning itself when idle, a node at 1,000 sends a second
//! spent 77.5-82.5 us per send against 100-107.5 pinned (docs/performance/shard.md, "A
//! shard that unpins itself").
//!
//! Invariants:
//! * Only the shard's own thread changes its mask (`sched_setaffinity(0, ..)` from a
//!   task on its executor), only between the shard's own CPU and the CPUs of all the
//!   shards (never onto a CPU left to io_uring workers or to the application).
//! * The decision reads the thread's own CPU time over a window of [`WINDOW`]: unpinned
//!   below [`UNPIN_BELOW`] of a CPU, pinned again above [`PIN_ABOVE`]; the gap between
//!   them keeps a shard near one threshold from flapping. An unpinned shard busy under
//!   [`IDLE_BELOW`] doubles its window up to the idle look (1 s), so an idle shard
//!   wakes for it once a second; it may then take up to 1 s to pin itself again once
//!   load begins.
//! * Where callers look for the shard's CPU (`wait.rs`: no reply spin on the
//!   answering shard's CPU), they keep the pinned CPU: a shard is unpinned only while
//!   it is woken from idle, when replies are slower than a spin budget anyway.

use crate::stats::process::thread_cpu_ns;
use std::time::{Duration, Instant};

/// How often a shard looks at its own load, on the shard's tick (`super::tick`: a
/// multiple of the heartbeat's 100 ms, so an idle shard's look shares its wake-up).
pub(crate) const WINDOW: Duration = Duration::from_millis(200);
/// Busy below this share of a CPU over a window: unpinned.
pub(crate) const UNPIN_BELOW: f64 = 0.10;
/// Busy above this share of a CPU over a window: pinned again.
pub(crate) const PIN_ABOVE: f64 = 0.25;
/// Unpinned and busy below this share of a CPU over a window, the shard looks half as
/// often, down to once per idle look (`stall::IDLE_LOOK`): an idle shard's looks every
/// 200 ms were half of its wake-ups once the heartbeat stopped beating while idle.
/// Above it, every `WINDOW` again.
pub(crate) const IDLE_BELOW: f64 = 0.02;

/// What a shard's mask should be after a window in which it was busy `busy` of a CPU,
/// given whether it is pinned now.
pub(crate) fn next_pinned(pinned: bool, busy: f64) -> bool {
    if pinned {
        busy >= UNPIN_BELOW
    } else {
        busy > PIN_ABOVE
    }
}

/// How long the next window is after one of `window` in which the shard was busy
/// `busy` of a CPU, pinned or not.
pub(crate) fn next_window(window: Duration, pinned: bool, busy: f64) -> Duration {
    if !pinned && busy < IDLE_BELOW {
        (window * 2).min(super::stall::IDLE_LOOK)
    } else {
        WINDOW
    }
}

/// Sets the calling thread's CPU mask to `cpus`.
fn set_this_threads_cpus(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it;
    // sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs on shard `shard`'s executor for as long as it lives: pinned to `cpu` while
/// busy, on `all` (the shards' CPUs) while mostly idle (see the module docs).
pub(crate) async fn follow_load(shard: usize, cpu: usize, all: Vec<usize>) {
    if all.len() < 2 {
        return;
    }
    let mut pinned = true;
    let mut at = Instant::now();
    let mut spent = thread_cpu_ns();
    let mut window = WINDOW;
    loop {
        glommio::timer::sleep(super::tick::until(window)).await;
        let (now, cpu_now) = (Instant::now(), thread_cpu_ns());
        let wall = now.duration_since(at).as_nanos().max(1) as f64;
        let busy = cpu_now.saturating_sub(spent) as f64 / wall;
        (at, spent) = (now, cpu_now);
        window = next_window(window, pinned, busy);
        let next = next_pinned(pinned, busy);
        if next == pinned {
            continue;
        }
        let mask: &[usize] = if next { &[cpu] } else { &all };
        match set_this_threads_cpus(mask) {
            Ok(()) => {
                tracing::debug!(
                    shard,
                    busy,
                    pinned = next,
                    "shard placement follows its load"
                );
                pinned = next;
            }
            Err(e) => {
                tracing::warn!(shard, error = %e, "shard placement: cannot change the CPU mask; stays as it is");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_unpinned_shard_looks_less_often() {
        let mut w = WINDOW;
        for _ in 0..10 {
            w = next_window(w, false, 0.001);
        }
        assert_eq!(
            w,
            crate::shard::stall::IDLE_LOOK,
            "idle: once per idle look"
        );
        assert_eq!(
            next_window(w, false, 0.05),
            WINDOW,
            "some work: every window"
        );
        assert_eq!(next_window(w, true, 0.001), WINDOW, "pinned: every window");
        assert_eq!(next_window(WINDOW, false, 0.001), 2 * WINDOW);
    }

    #[test]
    fn unpinned_when_idle_pinned_when_busy_with_a_gap_between() {
        assert!(!next_pinned(true, 0.02), "idle: unpinned");
        assert!(next_pinned(true, 0.15), "between: stays pinned");
        assert!(!next_pinned(false, 0.15), "between: stays unpinned");
        assert!(next_pinned(false, 0.5), "busy: pinned again");
        assert!(next_pinned(true, 0.9));
    }

    #[test]
    fn a_thread_reads_its_own_cpu_time_and_sets_its_own_mask() {
        let t0 = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(
            thread_cpu_ns() > t0,
            "CPU time moves while the thread works"
        );
        let allowed = crate::shard::wait::allowed_cpus();
        std::thread::spawn(move || {
            set_this_threads_cpus(&allowed[..1]).unwrap();
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let line = status
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .unwrap();
            assert_eq!(
                line.split(':').nth(1).unwrap().trim(),
                allowed[0].to_string()
            );
        })
        .join()
        .unwrap();
    }
}
