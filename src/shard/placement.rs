//! Which CPU each shard's executor runs on when [`ShardedConfig::cpus`] is not given:
//! with fewer shards than CPUs, the CPUs that take the data disk's completion
//! interrupts come first.
//!
//! RocketMQ leaves placement to the JVM and the kernel. A shard is pinned, so it must
//! choose: a sync put waits for its round's write and flush, and each completion wakes
//! the thread waiting in `pwritev2` on the CPU its interrupt landed on. On a CPU
//! where the shard is not, that is a wake-up of another, usually idle, CPU, twice a
//! round.
//!
//! Decisions:
//! * **Interrupt CPUs first, only with CPUs to spare.** Scenario 3b (one sync put at a
//!   time, one shard) on the 2-CPU VM, whose single-queue disk interrupts CPU 1: the
//!   shard on CPU 1 put p50 115-119 us, p99 268-277 us, against 184-195 / 410-467 us on
//!   CPU 0, three interleaved rounds; fio's write + fdatasync itself p50 163-195 us
//!   pinned to CPU 0, 100-112 on CPU 1 or where the kernel puts it. The cost: one shard
//!   at 256 sync puts outstanding did 207-209 k msg/s on the interrupt CPU against
//!   259-271 k on the other (the interrupts' own work shares the shard's CPU there);
//!   async puts showed no difference (644-696 k both). Latency at the load an embedder
//!   runs is what a 1-shard store is for; such a store that saturates its disk with
//!   sync puts names its CPU in `cpus`. With a shard per CPU nothing changes.
//! * **From `/proc/interrupts`, not the IRQs' affinity masks.** Where interrupts
//!   actually landed is what wakes the shard; a mask of several CPUs does not say
//!   which takes them. A CPU counts as an interrupt CPU with at least a quarter of the
//!   disk's interrupts: a single-queue disk has one, a per-CPU-queue NVMe disk none (its
//!   completions land where they were submitted already), and the order stays stable.
//! * **The disk behind the root**: the device of the root's file system
//!   (`/sys/dev/block/MAJ:MIN`, a partition's parent disk, a device-mapper or md
//!   device's members), then the PCI function above it and its MSI interrupts (its
//!   legacy `irq` when it has none). A file system without a block device (tmpfs,
//!   btrfs subvolumes' anonymous devices) or a disk without a PCI function keeps the
//!   plain order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A CPU is one of the disk's interrupt CPUs with at least 1/`SHARE` of its interrupts.
const SHARE: u64 = 4;

/// Levels of device-mapper or md members followed to find disks.
const MAX_STACK: usize = 4;

/// The CPUs for `shards` pinned shards, in shard order: `allowed` (the CPUs this
/// process may use) with the CPUs that take most of `root`'s disk's interrupts first
/// when there are fewer shards than CPUs; shards beyond `allowed` are not pinned.
pub(crate) fn shard_cpus(allowed: &[usize], shards: usize, root: &Path) -> Vec<Option<usize>> {
    let order = if shards < allowed.len() {
        let counts = disk_interrupts(root);
        let order = interrupt_cpus_first(allowed, &counts);
        if order != allowed {
            tracing::info!(
                root = %root.display(),
                ?counts,
                cpus = ?&order[..shards],
                "shards placed on the CPUs that take the data disk's interrupts"
            );
        }
        order
    } else {
        allowed.to_vec()
    };
    (0..shards).map(|i| order.get(i).copied()).collect()
}

/// `allowed` with the CPUs that took at least 1/`SHARE` of the interrupts in `counts`
/// (CPU -> interrupts) moved to the front, each group in its original order.
pub(crate) fn interrupt_cpus_first(allowed: &[usize], counts: &BTreeMap<usize, u64>) -> Vec<usize> {
    let total: u64 = counts.values().sum();
    let busy = |c: &usize| total > 0 && counts.get(c).is_some_and(|&n| n * SHARE >= total);
    let mut order: Vec<usize> = allowed.iter().copied().filter(busy).collect();
    order.extend(allowed.iter().copied().filter(|c| !busy(c)));
    order
}

/// Interrupts taken per CPU, over the interrupts of the disk(s) behind `root`'s file
/// system; empty when they cannot be found.
pub(crate) fn disk_interrupts(root: &Path) -> BTreeMap<usize, u64> {
    let irqs = disk_irqs(root);
    if irqs.is_empty() {
        return BTreeMap::new();
    }
    match std::fs::read_to_string("/proc/interrupts") {
        Ok(text) => interrupts_per_cpu(&text, &irqs),
        Err(_) => BTreeMap::new(),
    }
}

/// The interrupt numbers of the disk(s) holding `root`'s file system.
fn disk_irqs(root: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(root) else {
        return Vec::new();
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return Vec::new();
    }
    let mut irqs = Vec::new();
    if let Ok(dir) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) {
        block_irqs(&dir, 0, &mut irqs);
    }
    irqs.sort_unstable();
    irqs.dedup();
    irqs
}

/// Adds the interrupts of the block device at sysfs directory `dir` (a disk, a
/// partition, or a stacked device with `slaves`).
fn block_irqs(dir: &Path, depth: usize, irqs: &mut Vec<u32>) {
    // A partition's disk is its parent directory.
    let disk = if dir.join("partition").exists() {
        match dir.parent() {
            Some(p) => p.to_path_buf(),
            None => return,
        }
    } else {
        dir.to_path_buf()
    };
    if let Ok(members) = std::fs::read_dir(disk.join("slaves")) {
        let members: Vec<PathBuf> = members.flatten().map(|e| e.path()).collect();
        if !members.is_empty() {
            if depth < MAX_STACK {
                for m in members {
                    if let Ok(m) = std::fs::canonicalize(m) {
                        block_irqs(&m, depth + 1, irqs);
                    }
                }
            }
            return;
        }
    }
    if let Ok(device) = std::fs::canonicalize(disk.join("device")) {
        irqs.extend(function_irqs(&device));
    }
}

/// The interrupts of the nearest PCI function at or above sysfs directory `device`:
/// its MSI/MSI-X vectors, else its legacy interrupt line.
fn function_irqs(device: &Path) -> Vec<u32> {
    for dir in device.ancestors() {
        if !dir.starts_with("/sys/devices") || dir == Path::new("/sys/devices") {
            break;
        }
        if let Ok(entries) = std::fs::read_dir(dir.join("msi_irqs")) {
            let irqs: Vec<u32> = entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect();
            if !irqs.is_empty() {
                return irqs;
            }
        }
        if dir.join("vendor").exists()
            && let Ok(irq) = std::fs::read_to_string(dir.join("irq"))
            && let Ok(irq) = irq.trim().parse::<u32>()
            && irq > 0
        {
            // A PCI function (it has `vendor`) without MSI: its interrupt line.
            return vec![irq];
        }
    }
    Vec::new()
}

/// Per-CPU counts of the interrupts `irqs` in `/proc/interrupts` text: a header of
/// `CPU<n>` columns, then `<irq>: <count per column> <chip> ... <name>` lines.
pub(crate) fn interrupts_per_cpu(text: &str, irqs: &[u32]) -> BTreeMap<usize, u64> {
    let mut lines = text.lines();
    let cpus: Vec<usize> = match lines.next() {
        Some(header) => header
            .split_whitespace()
            .filter_map(|c| c.strip_prefix("CPU")?.parse().ok())
            .collect(),
        None => return BTreeMap::new(),
    };
    let mut counts = BTreeMap::new();
    for line in lines {
        let mut fields = line.split_whitespace();
        let Some(irq) = fields
            .next()
            .and_then(|f| f.strip_suffix(':')?.parse::<u32>().ok())
        else {
            continue;
        };
        if !irqs.contains(&irq) {
            continue;
        }
        for (&cpu, field) in cpus.iter().zip(fields) {
            match field.parse::<u64>() {
                Ok(n) => *counts.entry(cpu).or_insert(0) += n,
                Err(_) => break,
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "           CPU0       CPU1       \n\
  1:          9          0   IO-APIC   1-edge      i8042\n\
 35:          0          1  PCI-MSIX-0000:00:02.0   0-edge      virtio1-config\n\
 36:         12   38266097  PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n\
 40:       5000       5000  PCI-MSIX-0000:00:04.0   1-edge      virtio3-input.0\n\
NMI:          0          0   Non-maskable interrupts\n\
LOC:    1234567    2345678   Local timer interrupts\n";

    #[test]
    fn counts_only_the_disks_interrupts_per_cpu() {
        let c = interrupts_per_cpu(SAMPLE, &[35, 36]);
        assert_eq!(c, BTreeMap::from([(0, 12), (1, 38_266_098)]));
        assert!(interrupts_per_cpu(SAMPLE, &[99]).values().all(|&n| n == 0));
        // Columns follow the header's CPU numbers, not positions (CPU 1 offline).
        let sparse = "  CPU0 CPU2\n 36: 3 7 PCI-MSIX x\n";
        assert_eq!(
            interrupts_per_cpu(sparse, &[36]),
            BTreeMap::from([(0, 3), (2, 7)])
        );
    }

    #[test]
    fn interrupt_cpus_go_first_in_their_order() {
        let single_queue = BTreeMap::from([(0, 12), (1, 38_266_098)]);
        assert_eq!(interrupt_cpus_first(&[0, 1], &single_queue), vec![1, 0]);
        assert_eq!(
            interrupt_cpus_first(&[0, 1, 2, 3], &single_queue),
            vec![1, 0, 2, 3]
        );
        // Not allowed to run there: the order of what is allowed stands.
        assert_eq!(interrupt_cpus_first(&[0, 2], &single_queue), vec![0, 2]);
        // Spread over every CPU (per-CPU queues) or none yet: unchanged.
        let spread = BTreeMap::from([(0, 100), (1, 98), (2, 101), (3, 99), (4, 97)]);
        assert_eq!(
            interrupt_cpus_first(&[0, 1, 2, 3, 4], &spread),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(interrupt_cpus_first(&[0, 1], &BTreeMap::new()), vec![0, 1]);
        // Two of four take them: both first, in order.
        let two = BTreeMap::from([(1, 500), (3, 400), (0, 2)]);
        assert_eq!(interrupt_cpus_first(&[0, 1, 2, 3], &two), vec![1, 3, 0, 2]);
    }

    #[test]
    fn a_shard_per_cpu_keeps_the_plain_order() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(shard_cpus(&[0, 1], 2, dir.path()), vec![Some(0), Some(1)]);
        assert_eq!(
            shard_cpus(&[0, 1], 3, dir.path()),
            vec![Some(0), Some(1), None]
        );
    }

    /// On a machine whose data disk is a PCI function (this project's VM and CI: a
    /// virtio disk), the disk's interrupts are found and one shard goes to the CPU
    /// that took most of them.
    #[test]
    fn finds_the_interrupts_of_a_pci_disk() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let Ok(sys) = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
            eprintln!(
                "{}: not on a block device; nothing to check",
                dir.path().display()
            );
            return;
        };
        if !sys.starts_with("/sys/devices/pci0000:00") {
            eprintln!("{}: not a PCI disk; nothing to check", sys.display());
            return;
        }
        let counts = disk_interrupts(dir.path());
        assert!(
            counts.values().sum::<u64>() > 0,
            "no interrupts found for {}",
            sys.display()
        );
        let total: u64 = counts.values().sum();
        let busy = |c: usize| counts.get(&c).copied().unwrap_or(0) * SHARE >= total;
        let allowed = crate::shard::wait::allowed_cpus();
        if allowed.len() > 1 && allowed.iter().any(|&c| busy(c)) {
            let placed = shard_cpus(&allowed, 1, dir.path());
            let cpu = placed[0].expect("one shard, CPUs to spare: pinned");
            assert!(busy(cpu), "placed on CPU {cpu}; counts {counts:?}");
        }
    }
}
