//! The simulated disk ([`SimDisk`], chosen by `StoreConfig::disk = Disk::Sim`): the
//! same store code runs on memory whose crash behaviour is chosen by a seed, so the
//! failures a real disk produces rarely (torn writes, lost unsynced data, I/O errors,
//! flipped bits) happen on purpose and replay exactly.
//!
//! The model is the contract POSIX and ext4 give a program that uses `fdatasync` and
//! directory `fsync`, made as weak as the contract allows:
//! * A file's bytes become durable only when the file is synced. Until then every
//!   512-byte sector written since the last sync is independently old or new after a
//!   crash (a torn write), and a length change may or may not have happened.
//! * A directory entry (a file or a directory created, renamed or removed) becomes
//!   durable only when its parent directory is synced. Until then every entry that
//!   changed since that sync is, after a crash, independently as it was at the sync
//!   or as it is now (a rename is the change of two entries, and a name whose
//!   directory's own entry is lost goes with it); the seed chooses, as for sectors.
//!   A path without a parent (the file system's root) is durable at once.
//! * Reads see the current (page-cache) contents, as on a real file system.
//!
//! Faults: [`SimDisk::crash_at_sync`] makes the k-th sync point (file or directory
//! sync) fail and every operation after it fail too, as if the machine lost power
//! there; [`SimDisk::crash_image`] then gives the disk a restarted machine would see.
//! [`SimDisk::fail_nth`] fails one future write, sync or truncate with EIO and keeps
//! the disk working (for fail-stop tests); [`SimDisk::flip_bits`] damages stored
//! bytes; [`SimDisk::set_capacity`] makes writes past a size fail with ENOSPC.
//! [`SimDisk::stall`] makes the device stop completing writes until
//! [`SimDisk::release`], as a hung disk does (see "Stalls" below);
//! [`SimDisk::stall_at_next_dir_call`] stalls it when the next directory call starts.
//!
//! Everything runs synchronously under one mutex: an operation never yields (unless
//! the disk is stalled), so a single-executor workload on a simulated disk runs the
//! same way every time.
//!
//! # Stalls
//! While stalled, what would wait for the device waits, the way each call waits on a
//! real disk: a store file's writes, syncs and truncates (io_uring requests there) wait
//! asynchronously ([`SimDisk::unstalled`], awaited by `io::File`), so the executor goes
//! on; the directory and small-file calls (`std::fs` there: directory syncs, creating,
//! renaming and removing names) block the calling thread until the release. Reads and
//! look-ups answer, as from a device whose write path hangs. The store must run the
//! blocking calls off its executor ([`Disk::off_executor`]); on the simulated disk it
//! does so only when [`SimDisk::set_offload`] is on, since a hop to another thread
//! makes runs no longer replay exactly (the crash sweeps count sync points).
//!
//! [`Disk::off_executor`]: super::Disk::off_executor

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// Sector size of the simulated device: the unit in which writes tear.
pub const SECTOR: u64 = 512;

/// Kinds of operations whose n-th occurrence [`SimDisk::fail_nth`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimOp {
    Write,
    Sync,
    Truncate,
    Read,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Dir,
    File(u64),
}

#[derive(Debug, Default, Clone)]
struct Node {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Sectors written (or zeroed by a length change) since the last sync.
    dirty: BTreeSet<u64>,
}

#[derive(Debug, Default)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    names: BTreeMap<PathBuf, Entry>,
    durable_names: BTreeMap<PathBuf, Entry>,
    sync_points: u64,
    crash_at: Option<u64>,
    crashed: bool,
    fail: Vec<(SimOp, u64)>,
    counts: HashMap<SimOp, u64>,
    capacity: Option<u64>,
    locks: HashSet<PathBuf>,
}

/// A deterministic random source (SplitMix64): tests replay a seed exactly.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// An in-memory disk shared by every file of a store (see the module docs).
#[derive(Debug, Default)]
pub struct SimDisk {
    state: Mutex<State>,
    stall: Stall,
}

/// The stall fault (module docs), apart from `State` so that a blocked call holds no
/// lock the other calls need.
#[derive(Debug, Default)]
struct Stall {
    on: AtomicBool,
    /// Stall at the next blocking call (`stall_at_next_dir_call`).
    armed: AtomicBool,
    /// Run the blocking calls on the executor's blocking thread (`set_offload`).
    offload: AtomicBool,
    /// Tasks waiting in [`SimDisk::unstalled`].
    wakers: Mutex<Vec<Waker>>,
    released: Condvar,
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EIO)
}

impl SimDisk {
    pub fn new() -> Arc<SimDisk> {
        Arc::new(SimDisk::default())
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `k`-th sync point from the disk's creation (1-based, counting file and
    /// directory syncs) fails, and so does everything after it.
    pub fn crash_at_sync(&self, k: u64) {
        self.st().crash_at = Some(k);
    }

    /// Sync points so far.
    pub fn sync_points(&self) -> u64 {
        self.st().sync_points
    }

    pub fn crashed(&self) -> bool {
        self.st().crashed
    }

    /// Stops the disk now, as a power loss would.
    pub fn crash_now(&self) {
        self.st().crashed = true;
    }

    /// The `n`-th future operation of kind `op` (1-based) fails with EIO; the disk
    /// keeps working afterwards.
    pub fn fail_nth(&self, op: SimOp, n: u64) {
        let mut st = self.st();
        let base = st.counts.get(&op).copied().unwrap_or(0);
        st.fail.push((op, base + n));
    }

    /// Writes that would make the files' total size exceed `bytes` fail with ENOSPC.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.st().capacity = bytes;
    }

    /// (total, free) bytes as a file system would report them.
    pub fn space(&self) -> Option<(u64, u64)> {
        let st = self.st();
        let cap = st.capacity?;
        let used = st.used_bytes();
        Some((cap, cap.saturating_sub(used)))
    }

    /// From now on the device completes no write, sync, truncate or name change until
    /// [`SimDisk::release`] (module docs, "Stalls").
    pub fn stall(&self) {
        self.stall.on.store(true, Ordering::SeqCst);
    }

    /// Stalls the device when the next directory or name call (a directory sync,
    /// creating a directory, a rename, a removal) starts, that call included: a disk
    /// that hangs in the middle of a checkpoint's fsync.
    pub fn stall_at_next_dir_call(&self) {
        self.stall.armed.store(true, Ordering::SeqCst);
    }

    /// Ends a stall (or disarms [`SimDisk::stall_at_next_dir_call`]): every waiting
    /// call goes on.
    pub fn release(&self) {
        let wakers = {
            let mut w = self.stall.wakers.lock().unwrap_or_else(|p| p.into_inner());
            self.stall.armed.store(false, Ordering::SeqCst);
            self.stall.on.store(false, Ordering::SeqCst);
            std::mem::take(&mut *w)
        };
        self.stall.released.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    pub fn is_stalled(&self) -> bool {
        self.stall.on.load(Ordering::SeqCst)
    }

    /// Whether the store runs its blocking calls (directory syncs, small durable
    /// files) on the executor's blocking thread, as on the real disk, instead of
    /// inline (the default: runs replay exactly). Stall tests turn it on.
    pub fn set_offload(&self, on: bool) {
        self.stall.offload.store(on, Ordering::SeqCst);
    }

    pub fn offload(&self) -> bool {
        self.stall.offload.load(Ordering::SeqCst)
    }

    /// Completes at once unless stalled, else at the release: awaited before a store
    /// file's writes, syncs and truncates (an io_uring request waits without blocking
    /// its thread).
    pub fn unstalled(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if !self.stall.on.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            let mut w = self.stall.wakers.lock().unwrap_or_else(|p| p.into_inner());
            // Checked again under the lock `release` takes: no wake-up is lost.
            if !self.stall.on.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    /// Blocks the calling thread while stalled: the directory and small-file calls
    /// (`std::fs` on the real disk) wait so.
    fn block_while_stalled(&self) {
        if self.stall.armed.swap(false, Ordering::SeqCst) {
            self.stall.on.store(true, Ordering::SeqCst);
        }
        if !self.stall.on.load(Ordering::SeqCst) {
            return;
        }
        let mut w = self.stall.wakers.lock().unwrap_or_else(|p| p.into_inner());
        while self.stall.on.load(Ordering::SeqCst) {
            w = self
                .stall
                .released
                .wait(w)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The disk after a power loss at this moment: every directory entry changed since
    /// its parent's last sync as it was then or as it is now, every unsynced sector old
    /// or new and every unsynced length change done or not, as `seed` picks.
    pub fn crash_image(&self, seed: u64) -> Arc<SimDisk> {
        let st = self.st();
        let mut rng = SimRng::new(seed);
        let mut out = State {
            next_ino: st.next_ino,
            ..State::default()
        };
        let paths: BTreeSet<&PathBuf> = st.names.keys().chain(st.durable_names.keys()).collect();
        // Sorted, so a directory comes before everything under it.
        for path in paths {
            let (now, then) = (st.names.get(path), st.durable_names.get(path));
            let kept = if now == then || path.parent().is_none() || rng.chance(50) {
                now
            } else {
                then
            };
            let Some(e) = kept else { continue };
            if !Self::parent_is_dir(&out, path) {
                // Its directory's entry was lost.
                continue;
            }
            out.names.insert(path.clone(), *e);
            out.durable_names.insert(path.clone(), *e);
        }
        for e in out.names.values() {
            if let Entry::File(ino) = e {
                if out.nodes.contains_key(ino) {
                    continue;
                }
                let n = &st.nodes[ino];
                let mut img = n.durable.clone();
                if n.data.len() != n.durable.len() && rng.chance(50) {
                    img.resize(n.data.len(), 0);
                }
                for &s in &n.dirty {
                    let from = (s * SECTOR) as usize;
                    if from >= img.len() || !rng.chance(50) {
                        continue;
                    }
                    let to = (from + SECTOR as usize).min(img.len());
                    for (i, b) in img[from..to].iter_mut().enumerate() {
                        *b = n.data.get(from + i).copied().unwrap_or(0);
                    }
                }
                out.nodes.insert(
                    *ino,
                    Node {
                        data: img.clone(),
                        durable: img,
                        dirty: BTreeSet::new(),
                    },
                );
            }
        }
        out.capacity = st.capacity;
        Arc::new(SimDisk {
            state: Mutex::new(out),
            stall: Stall::default(),
        })
    }

    /// Flips `n` random bits of the stored files whose path contains `within` (all
    /// files when empty), in both the current and the durable bytes. Returns where.
    pub fn flip_bits(&self, seed: u64, n: usize, within: &str) -> Vec<(PathBuf, u64)> {
        let mut st = self.st();
        let mut rng = SimRng::new(seed);
        let files: Vec<(PathBuf, u64)> = st
            .names
            .iter()
            .filter_map(|(p, e)| match e {
                Entry::File(ino) if p.to_string_lossy().contains(within) => Some((p.clone(), *ino)),
                _ => None,
            })
            .filter(|(_, ino)| st.nodes.get(ino).is_some_and(|n| !n.data.is_empty()))
            .collect();
        let mut done = Vec::new();
        if files.is_empty() {
            return done;
        }
        for _ in 0..n {
            let (path, ino) = &files[rng.below(files.len() as u64) as usize];
            let node = st.nodes.get_mut(ino).unwrap();
            let at = rng.below(node.data.len() as u64) as usize;
            let bit = 1u8 << rng.below(8);
            node.data[at] ^= bit;
            if at < node.durable.len() {
                node.durable[at] ^= bit;
            }
            done.push((path.clone(), at as u64));
        }
        done
    }

    /// The current bytes of the file at `path` (for tests and inspection).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.st();
        match st.names.get(path)? {
            Entry::File(ino) => Some(st.nodes[ino].data.clone()),
            Entry::Dir => None,
        }
    }

    /// Every file path currently named.
    pub fn files(&self) -> Vec<PathBuf> {
        self.st()
            .names
            .iter()
            .filter(|(_, e)| matches!(e, Entry::File(_)))
            .map(|(p, _)| p.clone())
            .collect()
    }

    // ---- operations used by `io` ----

    /// Checks the crash state and the fault plan for one operation of kind `op`.
    fn begin(st: &mut State, op: Option<SimOp>) -> std::io::Result<()> {
        if st.crashed {
            return Err(eio());
        }
        if let Some(op) = op {
            let c = st.counts.entry(op).or_insert(0);
            *c += 1;
            let c = *c;
            if let Some(i) = st.fail.iter().position(|&(o, n)| o == op && n == c) {
                st.fail.swap_remove(i);
                return Err(eio());
            }
        }
        Ok(())
    }

    /// Counts a sync point; crashes the disk if it is the chosen one.
    fn sync_point(st: &mut State) -> std::io::Result<()> {
        st.sync_points += 1;
        if st.crash_at == Some(st.sync_points) {
            st.crashed = true;
            return Err(eio());
        }
        Ok(())
    }

    pub(crate) fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.block_while_stalled();
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        for p in path.ancestors() {
            if p.as_os_str().is_empty() {
                break;
            }
            match st.names.get(p) {
                Some(Entry::Dir) => {}
                Some(Entry::File(_)) => {
                    return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
                }
                None => {
                    st.names.insert(p.to_path_buf(), Entry::Dir);
                    if p.parent().is_none() {
                        // The file system's root.
                        st.durable_names.insert(p.to_path_buf(), Entry::Dir);
                    }
                }
            }
        }
        Ok(())
    }

    fn parent_is_dir(st: &State, path: &Path) -> bool {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => matches!(st.names.get(p), Some(Entry::Dir)),
            _ => true,
        }
    }

    pub(crate) fn open(&self, path: &Path, create: bool) -> std::io::Result<u64> {
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        match st.names.get(path) {
            Some(Entry::File(ino)) => Ok(*ino),
            Some(Entry::Dir) => Err(std::io::Error::from_raw_os_error(libc::EISDIR)),
            None if create => {
                if !Self::parent_is_dir(&st, path) {
                    return Err(std::io::ErrorKind::NotFound.into());
                }
                st.next_ino += 1;
                let ino = st.next_ino;
                st.nodes.insert(ino, Node::default());
                st.names.insert(path.to_path_buf(), Entry::File(ino));
                Ok(ino)
            }
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    pub(crate) fn write(&self, ino: u64, pos: u64, data: &[u8]) -> std::io::Result<()> {
        let mut st = self.st();
        Self::begin(&mut st, Some(SimOp::Write))?;
        let end = pos + data.len() as u64;
        let old_len = st.nodes[&ino].data.len() as u64;
        if let Some(cap) = st.capacity
            && end > old_len
            && st.used_bytes() + (end - old_len) > cap
        {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let n = st.nodes.get_mut(&ino).unwrap();
        if (n.data.len() as u64) < end {
            n.data.resize(end as usize, 0);
        }
        n.data[pos as usize..end as usize].copy_from_slice(data);
        if !data.is_empty() {
            n.dirty.extend(pos / SECTOR..=(end - 1) / SECTOR);
        }
        Ok(())
    }

    pub(crate) fn read(&self, ino: u64, pos: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut st = self.st();
        Self::begin(&mut st, Some(SimOp::Read))?;
        let d = &st.nodes[&ino].data;
        let from = (pos as usize).min(d.len());
        let to = (pos as usize).saturating_add(len).min(d.len());
        Ok(d[from..to].to_vec())
    }

    pub(crate) fn truncate(&self, ino: u64, len: u64) -> std::io::Result<()> {
        let mut st = self.st();
        Self::begin(&mut st, Some(SimOp::Truncate))?;
        let n = st.nodes.get_mut(&ino).unwrap();
        let old = n.data.len() as u64;
        if old == len {
            return Ok(());
        }
        let (lo, hi) = (old.min(len), old.max(len));
        n.data.resize(len as usize, 0);
        n.dirty.extend(lo / SECTOR..hi.div_ceil(SECTOR));
        Ok(())
    }

    pub(crate) fn sync(&self, ino: u64) -> std::io::Result<()> {
        let mut st = self.st();
        Self::begin(&mut st, Some(SimOp::Sync))?;
        Self::sync_point(&mut st)?;
        let n = st.nodes.get_mut(&ino).unwrap();
        let dirty = std::mem::take(&mut n.dirty);
        n.durable.resize(n.data.len(), 0);
        for s in dirty {
            let from = (s * SECTOR) as usize;
            if from >= n.data.len() {
                continue;
            }
            let to = (from + SECTOR as usize).min(n.data.len());
            let (data, durable) = (&n.data, &mut n.durable);
            durable[from..to].copy_from_slice(&data[from..to]);
        }
        Ok(())
    }

    pub(crate) fn len(&self, ino: u64) -> std::io::Result<u64> {
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        Ok(st.nodes[&ino].data.len() as u64)
    }

    pub(crate) fn path_len(&self, path: &Path) -> std::io::Result<u64> {
        let ino = self.open(path, false)?;
        self.len(ino)
    }

    pub(crate) fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.block_while_stalled();
        let mut st = self.st();
        Self::begin(&mut st, Some(SimOp::Sync))?;
        Self::sync_point(&mut st)?;
        if !matches!(st.names.get(dir), Some(Entry::Dir)) {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        let in_dir = |p: &Path| p.parent() == Some(dir);
        let now: Vec<(PathBuf, Entry)> = st
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, e)| (p.clone(), *e))
            .collect();
        st.durable_names.retain(|p, _| !in_dir(p));
        for (p, e) in now {
            st.durable_names.insert(p, e);
        }
        Ok(())
    }

    pub(crate) fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.block_while_stalled();
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        match st.names.get(path) {
            Some(Entry::File(_)) => {
                st.names.remove(path);
                Ok(())
            }
            Some(Entry::Dir) => Err(std::io::Error::from_raw_os_error(libc::EISDIR)),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    /// Removes a directory tree (durable once the parent is synced).
    pub(crate) fn remove_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.block_while_stalled();
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        st.names.retain(|p, _| !p.starts_with(path));
        Ok(())
    }

    pub(crate) fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.block_while_stalled();
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        let e = st
            .names
            .remove(from)
            .ok_or(std::io::Error::from(std::io::ErrorKind::NotFound))?;
        st.names.insert(to.to_path_buf(), e);
        Ok(())
    }

    /// How many names the file at `path` has.
    pub(crate) fn link_count(&self, path: &Path) -> std::io::Result<u64> {
        let st = self.st();
        let Some(Entry::File(ino)) = st.names.get(path) else {
            return Err(std::io::ErrorKind::NotFound.into());
        };
        Ok(st
            .names
            .values()
            .filter(|e| **e == Entry::File(*ino))
            .count() as u64)
    }

    /// `(name, path, is_dir)` of a directory's entries, or `None` if it is missing.
    pub(crate) fn list(&self, dir: &Path) -> std::io::Result<Option<Vec<(String, PathBuf, bool)>>> {
        let mut st = self.st();
        Self::begin(&mut st, None)?;
        if !matches!(st.names.get(dir), Some(Entry::Dir)) {
            return Ok(None);
        }
        Ok(Some(
            st.names
                .iter()
                .filter(|(p, _)| p.parent() == Some(dir))
                .map(|(p, e)| {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    (name, p.clone(), *e == Entry::Dir)
                })
                .collect(),
        ))
    }

    pub(crate) fn exists(&self, path: &Path) -> bool {
        self.st().names.contains_key(path)
    }

    /// First offset at or after `from` in a sector ever written (`SEEK_DATA`).
    pub(crate) fn next_data(&self, path: &Path, from: u64) -> std::io::Result<Option<u64>> {
        let ino = self.open(path, false)?;
        let st = self.st();
        let d = &st.nodes[&ino].data;
        let mut s = from / SECTOR * SECTOR;
        while (s as usize) < d.len() {
            let to = ((s + SECTOR) as usize).min(d.len());
            if d[s as usize..to].iter().any(|b| *b != 0) {
                return Ok(Some(s.max(from)));
            }
            s += SECTOR;
        }
        Ok(None)
    }

    pub(crate) fn try_lock(&self, path: &Path) -> bool {
        self.st().locks.insert(path.to_path_buf())
    }

    pub(crate) fn unlock(&self, path: &Path) {
        self.st().locks.remove(path);
    }
}

impl State {
    fn used_bytes(&self) -> u64 {
        let live: HashSet<u64> = self
            .names
            .values()
            .filter_map(|e| match e {
                Entry::File(i) => Some(*i),
                Entry::Dir => None,
            })
            .collect();
        live.iter().map(|i| self.nodes[i].data.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    #[test]
    fn unsynced_data_can_tear() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/r")).unwrap();
        d.sync_dir(Path::new("/")).unwrap();
        let a = d.open(Path::new("/r/a"), true).unwrap();
        d.write(a, 0, &[1u8; 1024]).unwrap();
        d.sync(a).unwrap();
        d.sync_dir(Path::new("/r")).unwrap();
        d.write(a, 0, &[2u8; 1024]).unwrap();
        let mut saw = HashSet::new();
        for seed in 0..64 {
            let img = d.crash_image(seed);
            let c = img.contents(Path::new("/r/a")).unwrap();
            assert_eq!(c.len(), 1024);
            // Each sector is wholly old or wholly new.
            for s in c.chunks(512) {
                assert!(s.iter().all(|b| *b == s[0]) && (s[0] == 1 || s[0] == 2));
            }
            saw.insert((c[0], c[600]));
        }
        assert_eq!(saw.len(), 4, "both sectors tear independently: {saw:?}");
        d.sync(a).unwrap();
        assert_eq!(
            d.crash_image(7).contents(Path::new("/r/a")).unwrap(),
            vec![2u8; 1024]
        );
    }

    /// What each of 64 crash images keeps of `paths`.
    fn outcomes(d: &SimDisk, paths: &[&str]) -> HashSet<Vec<bool>> {
        (0..64)
            .map(|seed| {
                let img = d.crash_image(seed);
                paths.iter().map(|p| img.exists(Path::new(p))).collect()
            })
            .collect()
    }

    #[test]
    fn unsynced_entries_are_each_kept_or_lost() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/r/s")).unwrap();
        for f in ["/r/s/a", "/r/s/b"] {
            let ino = d.open(Path::new(f), true).unwrap();
            d.sync(ino).unwrap();
        }
        // Nothing synced: every entry kept or lost, and a file goes with its directory.
        let all = ["/r", "/r/s", "/r/s/a", "/r/s/b"];
        let seen = outcomes(&d, &all);
        assert!(seen.contains(&vec![false; 4]) && seen.contains(&vec![true; 4]));
        assert!(seen.contains(&vec![true, true, true, false]));
        assert!(
            seen.iter()
                .all(|o| (o[0] || !o[1]) && (o[1] || !(o[2] || o[3])))
        );
        // The files' directory synced, not its parent: the files go with it or stay.
        d.sync_dir(Path::new("/r/s")).unwrap();
        let seen = outcomes(&d, &["/r/s", "/r/s/a", "/r/s/b"]);
        assert_eq!(seen, HashSet::from([vec![false; 3], vec![true; 3]]));
        // Every directory of the chain synced: kept by every crash.
        d.sync_dir(Path::new("/r")).unwrap();
        d.sync_dir(Path::new("/")).unwrap();
        assert_eq!(outcomes(&d, &all), HashSet::from([vec![true; 4]]));
        // A removal, a rename and a removed tree: each undone or not until synced.
        d.remove_file(Path::new("/r/s/a")).unwrap();
        d.rename(Path::new("/r/s/b"), Path::new("/r/s/c")).unwrap();
        let seen = outcomes(&d, &["/r/s/a", "/r/s/b", "/r/s/c"]);
        assert_eq!(seen.len(), 8, "{seen:?}");
        d.sync_dir(Path::new("/r/s")).unwrap();
        let seen = outcomes(&d, &["/r/s/a", "/r/s/b", "/r/s/c"]);
        assert_eq!(seen, HashSet::from([vec![false, false, true]]));
        d.remove_dir_all(Path::new("/r/s")).unwrap();
        let seen = outcomes(&d, &["/r/s", "/r/s/c"]);
        assert_eq!(seen.len(), 3, "{seen:?}");
        d.sync_dir(Path::new("/r")).unwrap();
        assert_eq!(outcomes(&d, &["/r/s"]), HashSet::from([vec![false]]));
        assert!(d.sync_dir(Path::new("/r/s")).is_err(), "no such directory");
    }

    /// Replacing a file by a rename over it (write, sync, rename, sync the directory)
    /// leaves the old or the new file after any crash, never neither.
    #[test]
    fn a_replaced_file_is_old_or_new() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/r")).unwrap();
        d.sync_dir(Path::new("/")).unwrap();
        let put = |path: &str, v: u8| {
            let ino = d.open(Path::new(path), true).unwrap();
            d.write(ino, 0, &[v; 16]).unwrap();
            d.sync(ino).unwrap();
        };
        put("/r/f", 1);
        d.sync_dir(Path::new("/r")).unwrap();
        put("/r/f.tmp", 2);
        d.rename(Path::new("/r/f.tmp"), Path::new("/r/f")).unwrap();
        let seen: HashSet<Option<Vec<u8>>> = (0..64)
            .map(|seed| d.crash_image(seed).contents(Path::new("/r/f")))
            .collect();
        assert_eq!(
            seen,
            HashSet::from([Some(vec![1u8; 16]), Some(vec![2u8; 16])])
        );
    }

    #[test]
    fn crash_point_stops_everything_and_replays() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/r")).unwrap();
        let a = d.open(Path::new("/r/a"), true).unwrap();
        d.crash_at_sync(2);
        d.sync_dir(Path::new("/r")).unwrap();
        d.write(a, 0, b"x").unwrap();
        assert!(d.sync(a).is_err());
        assert!(d.crashed());
        assert!(d.write(a, 0, b"y").is_err());
        assert!(d.read(a, 0, 1).is_err());
        let i1 = d.crash_image(3).contents(Path::new("/r/a"));
        let i2 = d.crash_image(3).contents(Path::new("/r/a"));
        assert_eq!(i1, i2);
    }

    #[test]
    fn a_stall_blocks_dir_calls_and_holds_file_calls_until_released() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/r")).unwrap();
        d.stall_at_next_dir_call();
        assert!(!d.is_stalled(), "armed, not yet stalled");
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.sync_dir(Path::new("/r")));
        while !d.is_stalled() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut gate = std::pin::pin!(d.unstalled());
        let mut cx = std::task::Context::from_waker(Waker::noop());
        assert!(gate.as_mut().poll(&mut cx).is_pending());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "the directory sync waits for the release");
        d.release();
        t.join().unwrap().unwrap();
        assert!(gate.as_mut().poll(&mut cx).is_ready());
        assert!(std::pin::pin!(d.unstalled()).poll(&mut cx).is_ready());
    }

    #[test]
    fn one_shot_faults_and_capacity() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/r")).unwrap();
        let a = d.open(Path::new("/r/a"), true).unwrap();
        d.fail_nth(SimOp::Sync, 2);
        d.sync(a).unwrap();
        assert_eq!(d.sync(a).unwrap_err().raw_os_error(), Some(libc::EIO));
        d.sync(a).unwrap();
        d.set_capacity(Some(4096));
        d.write(a, 0, &[0u8; 4096]).unwrap();
        let e = d.write(a, 4096, &[0u8; 1]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(d.space(), Some((4096, 0)));
    }
}
