//! Where a shard's io_uring workers run: on the CPUs that hold no shard, when there
//! are any ([`ShardedConfig::io_worker_cpus`](super::ShardedConfig::io_worker_cpus)).
//!
//! RocketMQ has no counterpart: its flush and commit services are JVM threads the
//! kernel places. Here a shard's file writes and fdatasyncs are done by io_uring's
//! worker threads (`iou-wrk-<shard tid>`; every file write goes there, glommio patch
//! i), and those inherit the CPU mask of the thread that created them: the pinned
//! shard's one CPU. Each worker run then takes the shard's CPU from it, for ~0.2-1 ms
//! (a write's block-layer submission), and every put due meanwhile starts late.
//!
//! Decisions:
//! * **The CPUs without a shard, when any are left.** One shard at 40,000 async puts a
//!   second with tailing consumers (1 KiB, 64 queues, key index on, `coremq bench
//!   --shards 1 --rate 40000 --consumers`), the other CPU free, seven interleaved
//!   pairs: put p99 385-978 us with the workers on the shard's CPU against 169-448 us
//!   on the other (lower in all seven), p99.9 1.10-3.12 ms against 0.64-1.77 ms. With a
//!   shard on every CPU the workers stay where the kernel puts them: moving them only
//!   moves their runs to another shard's CPU (two shards, each shard's workers on the
//!   other's CPU or both on CPU 0: p99 within the run-to-run noise).
//! * **Set once, first thing on the shard's thread** (`IORING_REGISTER_IOWQ_AFF`,
//!   Linux 5.14): the mask belongs to the thread's io_uring context, which every ring
//!   it creates shares, so a one-entry ring made for the call sets it for glommio's
//!   rings too; workers take the mask when they are created, so it is set before the
//!   store opens and writes anything. A kernel that refuses it leaves the workers on
//!   the shard's CPU, with a warning.

use std::io;

/// `IORING_REGISTER_IOWQ_AFF`, from `include/uapi/linux/io_uring.h`.
const IORING_REGISTER_IOWQ_AFF: libc::c_uint = 17;
/// The size of `struct io_uring_params` (`io_uring_setup` fills it in).
const IO_URING_PARAMS_LEN: usize = 120;

/// The CPUs the workers of shards pinned to `shard_cpus` go to by default: the ones
/// in `allowed` that hold no shard (empty when every one does, or when no shard is
/// pinned).
pub(crate) fn default_worker_cpus(allowed: &[usize], shard_cpus: &[Option<usize>]) -> Vec<usize> {
    if shard_cpus.iter().all(Option::is_none) {
        return Vec::new();
    }
    allowed
        .iter()
        .copied()
        .filter(|c| !shard_cpus.contains(&Some(*c)))
        .collect()
}

/// Lets the io_uring workers the calling thread creates from now on run on `cpus`
/// only (see the module docs).
pub(crate) fn confine_this_threads_workers(cpus: &[usize]) -> io::Result<()> {
    let Some(&max) = cpus.iter().max() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no CPU given"));
    };
    let mut mask = vec![0u64; max / 64 + 1];
    for &c in cpus {
        mask[c / 64] |= 1 << (c % 64);
    }
    let mut params = [0u8; IO_URING_PARAMS_LEN];
    // SAFETY: io_uring_setup writes at most `struct io_uring_params` into `params`.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = fd as libc::c_int;
    // SAFETY: the kernel reads `mask.len() * 8` bytes of the mask.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            fd,
            IORING_REGISTER_IOWQ_AFF,
            mask.as_ptr(),
            mask.len() * 8,
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is the ring made above, used by nothing else.
    unsafe { libc::close(fd) };
    if r < 0 { Err(err) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_go_to_the_cpus_without_a_shard() {
        assert_eq!(default_worker_cpus(&[0, 1], &[Some(1)]), vec![0]);
        assert_eq!(
            default_worker_cpus(&[0, 1, 2, 3], &[Some(1), Some(3)]),
            vec![0, 2]
        );
        // A shard on every CPU, or none pinned: the kernel's default.
        assert!(default_worker_cpus(&[0, 1], &[Some(0), Some(1)]).is_empty());
        assert!(default_worker_cpus(&[0, 1], &[None]).is_empty());
        // Shards beyond the CPUs are not pinned.
        assert!(default_worker_cpus(&[0, 1], &[Some(0), Some(1), None]).is_empty());
    }

    #[test]
    fn an_empty_set_is_refused() {
        assert!(confine_this_threads_workers(&[]).is_err());
    }
}
