//! Every put answers in time while the disk stalls (issue 16).
//!
//! The device stops completing writes for a while; meanwhile producers keep putting
//! and every put must return within `sync_flush_timeout` plus 100 ms with a status
//! that tells the truth: `FlushDiskTimeout` (stored, durability unknown) or
//! `OsPageCacheBusy` (no room within the timeout: not stored); in async mode `PutOk`
//! until the write buffers are full. Gets of dispatched data still answer. Once the
//! device comes back the shard takes puts again, and after a clean shutdown and reopen
//! exactly the stored messages are there (every `PutOk` and `FlushDiskTimeout`, no
//! `OsPageCacheBusy`).
//!
//! Devices:
//! * the simulated disk's stall fault (`SimDisk::stall`): store-file writes and syncs
//!   wait, and the directory and small-file calls block whichever thread makes them,
//!   so a store that made one on its executor would stop answering;
//! * a real stalled device (needs root; `SKIPPED` otherwise): ext4 on dm-delay over a
//!   loop device, stalled with `dmsetup suspend --nolockfs` (all I/O waits) when the
//!   kernel has device-mapper; else ext4 on a loop device whose backing file lives on
//!   a second loop-mounted ext4 that is frozen with `fsfreeze` (the device's writes
//!   wait; its reads still answer).

mod common;

use coremq::io::{Disk, SimDisk};
use coremq::{FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(500);
/// How late a put may answer after its timeout.
const MARGIN: Duration = Duration::from_millis(100);
const STALL_FOR: Duration = Duration::from_millis(2500);
/// A store that blocked its executor would hang; the device is released after this
/// whatever happens, so the test fails instead.
const WATCHDOG: Duration = Duration::from_secs(20);
const TOPIC: &str = "Stall";
const QUEUES: i32 = 4;
const PRODUCERS: u64 = 8;

/// Timing tests: one at a time, so they do not slow each other down.
static SERIAL: Mutex<()> = Mutex::new(());

/// A device that stops completing I/O on demand.
trait Device: Send + Sync {
    /// Stalls now, or arms a stall that begins soon ([`Device::is_stalled`]).
    fn stall(&self);
    fn is_stalled(&self) -> bool {
        true
    }
    fn release(&self);
}

impl Device for SimDisk {
    fn stall(&self) {
        SimDisk::stall(self)
    }
    fn release(&self) {
        SimDisk::release(self)
    }
}

/// The simulated disk stalling when the store next makes a directory or name call:
/// in the middle of a checkpoint round (the manifest's rename) or a file creation
/// (its directory sync), the calls that block their thread.
struct AtNextDirCall(Arc<SimDisk>);

impl Device for AtNextDirCall {
    fn stall(&self) {
        self.0.stall_at_next_dir_call()
    }
    fn is_stalled(&self) -> bool {
        self.0.is_stalled()
    }
    fn release(&self) {
        self.0.release()
    }
}

fn cfg(root: &Path, mode: FlushMode) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = mode;
    c.sync_flush_timeout = TIMEOUT;
    // Checkpoint rounds (queue flushes, checkpoint, manifest, directory syncs) and
    // async flushes keep coming during the stall.
    c.consume_queue_flush_interval = Duration::from_millis(50);
    c.commit_interval = Duration::from_millis(20);
    c.flush_interval = Duration::from_millis(50);
    c.disk_check_interval = Duration::from_millis(50);
    c
}

fn message(i: u64, wait: bool, len: usize) -> Message {
    let mut body = vec![(i % 251) as u8; len];
    body[..8].copy_from_slice(&i.to_be_bytes());
    let m = Message::new(TOPIC, (i % QUEUES as u64) as i32, body).with_keys(format!("k{i}"));
    if wait {
        m
    } else {
        m.with_property("WAIT", "false")
    }
}

/// What happened to each put.
#[derive(Default)]
struct Log {
    next: u64,
    stored: BTreeSet<u64>,
    busy: BTreeSet<u64>,
    statuses: Vec<PutStatus>,
    slowest: Duration,
    /// The executor's longest gap during the stall (see [`Heartbeat`]).
    gap: Option<Rc<Heartbeat>>,
}

/// One timed put; panics if it answered late or with a status that cannot be right.
async fn put(
    store: &Store,
    log: &Rc<RefCell<Log>>,
    wait: bool,
    len: usize,
    what: &str,
) -> PutStatus {
    let i = {
        let mut l = log.borrow_mut();
        l.next += 1;
        l.next
    };
    let t0 = Instant::now();
    let r = store.put(message(i, wait, len)).await;
    let took = t0.elapsed();
    let gap = log.borrow().gap.as_ref().map(|g| g.gap());
    assert!(
        took <= TIMEOUT + MARGIN,
        "{what}: put {i} answered {:?} after {took:?}, later than the timeout {TIMEOUT:?} + \
         {MARGIN:?} (longest executor gap so far {gap:?}; statistics {:?})",
        r.status,
        store.stats()
    );
    let mut l = log.borrow_mut();
    l.slowest = l.slowest.max(took);
    l.statuses.push(r.status);
    match r.status {
        PutStatus::PutOk | PutStatus::FlushDiskTimeout => {
            assert_eq!(r.msg_ids.len(), 1, "{what}: a stored put names its record");
            l.stored.insert(i);
        }
        PutStatus::OsPageCacheBusy => {
            l.busy.insert(i);
        }
        s => panic!("{what}: put {i}: unexpected status {s:?}"),
    }
    r.status
}

/// Every message id in the store's queues.
async fn stored_ids(store: &Store) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for q in 0..QUEUES {
        for m in common::read_all(store, TOPIC, q).await {
            let i = u64::from_be_bytes(m.body[..8].try_into().unwrap());
            assert!(out.insert(i), "message {i} stored twice");
        }
    }
    out
}

/// Releases the device after `WATCHDOG` unless told to stand down first.
struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

impl Watchdog {
    fn arm(dev: Arc<dyn Device>) -> Watchdog {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(WATCHDOG) {
                eprintln!("watchdog: the stall outlived {WATCHDOG:?}; releasing the device");
                print_thread_stacks();
                dev.release();
            }
        });
        Watchdog(Some(tx))
    }
}

/// Every thread of this process, its state and its kernel stack (root only): where an
/// executor blocked in a system call, if one did.
fn print_thread_stacks() {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for t in tasks.flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit(") ")
            .next()
            .unwrap_or("")
            .chars()
            .next()
            .unwrap_or('?');
        eprintln!(
            "thread {} {:?} state {state} wchan {}\n{}",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan"),
            read("stack")
        );
    }
}

/// The longest gap between wakes of a task that sleeps 1 ms in its own task queue,
/// since the last [`Heartbeat::reset`]: a put answering late while the gap stayed small
/// was not woken; one answering late with a gap as long means its executor did not run.
struct Heartbeat {
    gap: std::cell::Cell<Duration>,
    reset: std::cell::Cell<bool>,
    /// The last beat: a beat still due counts as a gap too (an executor that stopped
    /// right after a reset has measured nothing yet).
    last: std::cell::Cell<Instant>,
}

impl Heartbeat {
    fn start() -> Rc<Heartbeat> {
        let hb = Rc::new(Heartbeat {
            gap: Default::default(),
            reset: Default::default(),
            last: std::cell::Cell::new(Instant::now()),
        });
        let h = hb.clone();
        let tq = glommio::executor().create_task_queue(
            glommio::Shares::Static(1000),
            glommio::Latency::NotImportant,
            "stall-heartbeat",
        );
        glommio::spawn_local_into(
            async move {
                while Rc::strong_count(&h) > 1 {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                    let now = Instant::now();
                    if h.reset.replace(false) {
                        h.gap.set(Duration::ZERO);
                    } else {
                        h.gap.set(h.gap.get().max(now - h.last.get()));
                    }
                    h.last.set(now);
                }
            },
            tq,
        )
        .unwrap()
        .detach();
        hb
    }

    /// Forgets the gaps so far (the next one measured starts at the next wake).
    fn reset(&self) {
        self.reset.set(true);
    }

    fn gap(&self) -> Duration {
        self.gap.get().max(self.last.get().elapsed())
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// The scenario of the module docs on `cfg`, with `dev` under the store.
async fn puts_answer_in_time(cfg: StoreConfig, dev: Arc<dyn Device>, what: &str) {
    let sync = cfg.flush_mode == FlushMode::Sync;
    let store = Store::open(cfg.clone()).await.unwrap();
    let log = Rc::new(RefCell::new(Log {
        gap: Some(Heartbeat::start()),
        ..Log::default()
    }));
    for _ in 0..40 {
        let s = put(&store, &log, true, 1000, what).await;
        assert_eq!(s, PutStatus::PutOk, "{what}: before the stall");
    }
    store.wait_dispatched().await;
    // Every queue has its files: the next directory call is a checkpoint's.
    store.checkpoint().await.unwrap();
    let first = store.get(TOPIC, 1, 0, 4, 1 << 20).await.unwrap();
    assert_eq!(first.status, GetStatus::Found);

    let watchdog = Watchdog::arm(dev.clone());
    dev.stall();
    if !dev.is_stalled() {
        // A stall armed for the next directory call: a checkpoint round makes one only
        // when it has something new to write (an idle round writes nothing), so one
        // more put gives the next round a new queue manifest to replace.
        let s = put(&store, &log, true, 1000, what).await;
        assert_eq!(
            s,
            PutStatus::PutOk,
            "{what}: the put before the armed stall"
        );
    }
    let armed = Instant::now();
    while !dev.is_stalled() {
        assert!(
            armed.elapsed() < Duration::from_secs(5),
            "{what}: the stall did not begin within 5 s, or it blocked this executor until \
             the watchdog ended it"
        );
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    let stalled_at = Instant::now();
    if let Some(hb) = &log.borrow().gap {
        hb.reset();
    }
    // Producers of ordinary puts, and one of `WAIT=false` puts with larger bodies
    // that fills the write buffers fast in sync mode too.
    let mut tasks = Vec::new();
    for p in 0..=PRODUCERS {
        let (store, log, what) = (store.clone(), log.clone(), what.to_string());
        tasks.push(glommio::spawn_local(async move {
            let (wait, len) = if p == PRODUCERS {
                (false, 16 << 10)
            } else {
                (true, 4000)
            };
            while stalled_at.elapsed() < STALL_FOR {
                put(&store, &log, wait, len, &what).await;
            }
        }));
    }
    // Gets of dispatched data answer meanwhile.
    glommio::timer::sleep(TIMEOUT * 2).await;
    let t0 = Instant::now();
    let got = futures_lite::future::or(
        async { Some(store.get(TOPIC, 1, 0, 4, 1 << 20).await) },
        async {
            glommio::timer::sleep(Duration::from_secs(2)).await;
            None
        },
    )
    .await
    .unwrap_or_else(|| panic!("{what}: a get of dispatched data did not answer during the stall"))
    .unwrap();
    assert_eq!(got.status, GetStatus::Found, "{what}: get during the stall");
    assert_eq!(got.records, first.records, "{what}: get during the stall");
    eprintln!(
        "{what}: get during the stall answered in {:?}",
        t0.elapsed()
    );
    for t in tasks {
        t.await;
    }
    let still_stalled = stalled_at.elapsed() < WATCHDOG;
    dev.release();
    drop(watchdog);
    assert!(still_stalled, "{what}: the watchdog had to end the stall");
    {
        let l = log.borrow();
        let count = |s: PutStatus| l.statuses.iter().filter(|x| **x == s).count();
        eprintln!(
            "{what}: during the stall: {} ok, {} flush timeouts, {} busy; slowest put {:?}; \
             longest executor gap {:?}",
            count(PutStatus::PutOk) - 40,
            count(PutStatus::FlushDiskTimeout),
            count(PutStatus::OsPageCacheBusy),
            l.slowest,
            l.gap.as_ref().map(|g| g.gap())
        );
        assert!(
            count(PutStatus::OsPageCacheBusy) > 0,
            "{what}: the write buffers never filled"
        );
        if sync {
            assert!(
                count(PutStatus::FlushDiskTimeout) > 0,
                "{what}: no put was stored unflushed"
            );
        }
    }
    assert!(store.failure().is_none(), "{what}: {:?}", store.failure());

    // The device is back: puts are taken again.
    let back = Instant::now();
    while put(&store, &log, true, 1000, what).await != PutStatus::PutOk {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "{what}: puts never resumed"
        );
    }
    for _ in 0..20 {
        let s = put(&store, &log, true, 1000, what).await;
        assert_eq!(s, PutStatus::PutOk, "{what}: after the stall");
    }
    store.wait_dispatched().await;
    let expected = log.borrow().stored.clone();
    assert_eq!(
        stored_ids(&store).await,
        expected,
        "{what}: before shutdown"
    );
    store.shutdown().await.unwrap();

    let store = Store::open(cfg).await.unwrap();
    let found = stored_ids(&store).await;
    let busy = log.borrow().busy.clone();
    assert!(
        found.is_disjoint(&busy),
        "{what}: a put answered busy was stored"
    );
    assert_eq!(found, expected, "{what}: after reopening");
    store.shutdown().await.unwrap();
}

fn on_sim(mode: FlushMode, what: &'static str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    common::run(move || async move {
        let disk = SimDisk::new();
        disk.set_offload(true);
        let mut c = cfg(Path::new("/sim/stall"), mode);
        c.disk = Disk::Sim(disk.clone());
        puts_answer_in_time(c, disk, what).await;
    });
}

#[test]
fn sync_puts_answer_in_time_on_a_stalled_simulated_disk() {
    on_sim(FlushMode::Sync, "sim sync");
}

#[test]
fn async_puts_answer_in_time_on_a_stalled_simulated_disk() {
    on_sim(FlushMode::Async, "sim async");
}

#[test]
fn puts_answer_in_time_when_the_disk_stalls_during_a_checkpoint() {
    for mode in [FlushMode::Sync, FlushMode::Async] {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        common::run(move || async move {
            let disk = SimDisk::new();
            disk.set_offload(true);
            let mut c = cfg(Path::new("/sim/dir-call"), mode);
            c.disk = Disk::Sim(disk.clone());
            let what = format!("sim {mode:?}, stalled in a directory call");
            puts_answer_in_time(c, Arc::new(AtNextDirCall(disk)), &what).await;
        });
    }
}

/// Sync mode with dispatch allowed to lag less than the write buffers hold: puts
/// time out in the dispatch-backpressure wait rather than in the wait for room.
#[test]
fn sync_puts_waiting_for_dispatch_answer_in_time() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    common::run(|| async {
        let disk = SimDisk::new();
        disk.set_offload(true);
        let mut c = cfg(Path::new("/sim/lag"), FlushMode::Sync);
        c.disk = Disk::Sim(disk.clone());
        c.max_dispatch_lag_bytes = 128 << 10;
        puts_answer_in_time(c, disk, "sim sync, dispatch lag").await;
    });
}

// ---- a real stalled device ----

fn run_ok(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

fn output(cmd: &mut Command) -> Option<String> {
    let o = cmd.output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// How a [`RealDevice`] stalls.
enum Stall {
    /// `dmsetup suspend --nolockfs` of this dm-delay device.
    Dm(String),
    /// `fsfreeze` of the file system holding the loop device's backing file.
    FrozenBacking(PathBuf),
}

/// Stalls and releases a [`RealDevice`] (shared with the store's executor).
struct StallCtl {
    stall: Stall,
    stalled: AtomicBool,
}

impl Device for StallCtl {
    fn stall(&self) {
        let ok = match &self.stall {
            Stall::Dm(name) => {
                run_ok(Command::new("dmsetup").args(["suspend", "--nolockfs", name]))
            }
            Stall::FrozenBacking(outer) => run_ok(Command::new("fsfreeze").arg("-f").arg(outer)),
        };
        assert!(ok, "cannot stall the device");
        self.stalled.store(true, Ordering::SeqCst);
    }

    fn release(&self) {
        if !self.stalled.swap(false, Ordering::SeqCst) {
            return;
        }
        let ok = match &self.stall {
            Stall::Dm(name) => run_ok(Command::new("dmsetup").args(["resume", name])),
            Stall::FrozenBacking(outer) => run_ok(Command::new("fsfreeze").arg("-u").arg(outer)),
        };
        assert!(ok, "cannot release the device");
    }
}

/// ext4 on a device that stalls on demand, mounted at `mnt`; released and torn down
/// on drop (by the test's thread: a failed run may leave its executor's state behind).
struct RealDevice {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    ctl: Option<Arc<StallCtl>>,
    /// Undo steps, run in reverse order on drop.
    undo: Vec<Vec<String>>,
}

impl RealDevice {
    fn new() -> Option<RealDevice> {
        if !is_root() {
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir_all(&mnt).ok()?;
        let mut dev = RealDevice {
            mnt,
            ctl: None,
            undo: Vec::new(),
            dir,
        };
        if Path::new("/dev/mapper/control").exists() {
            if let Some(stall) = dev.setup_dm() {
                dev.ctl = Some(Arc::new(StallCtl {
                    stall,
                    stalled: AtomicBool::new(false),
                }));
                return Some(dev);
            }
            dev.teardown();
        }
        eprintln!("device-mapper is not usable here: stalling a loop device's backing file system");
        let stall = dev.setup_frozen_backing()?;
        dev.ctl = Some(Arc::new(StallCtl {
            stall,
            stalled: AtomicBool::new(false),
        }));
        Some(dev)
    }

    fn loop_device(&mut self, image: &Path, mib: u64) -> Option<String> {
        std::fs::File::create(image).ok()?.set_len(mib << 20).ok()?;
        let dev = output(Command::new("losetup").args(["-f", "--show"]).arg(image))?;
        self.undo
            .push(vec!["losetup".into(), "-d".into(), dev.clone()]);
        Some(dev)
    }

    fn mkfs_mount(&mut self, dev: &str, at: &Path) -> Option<()> {
        let ok = run_ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(dev))
            && run_ok(Command::new("mount").arg(dev).arg(at));
        if ok {
            let at = at.to_string_lossy().to_string();
            self.undo.push(vec!["umount".into(), "-l".into(), at]);
        }
        ok.then_some(())
    }

    /// ext4 on dm-delay (no delay) over a loop device.
    fn setup_dm(&mut self) -> Option<Stall> {
        let lo = self.loop_device(&self.dir.path().join("disk.img"), 192)?;
        let name = format!("coremq-stall-{}", std::process::id());
        let table = format!("0 {} delay {lo} 0 0", (192u64 << 20) / 512);
        if !run_ok(Command::new("dmsetup").args(["create", &name, "--table", &table])) {
            return None;
        }
        self.undo.push(vec![
            "dmsetup".into(),
            "remove".into(),
            "--force".into(),
            name.clone(),
        ]);
        let mnt = self.mnt.clone();
        self.mkfs_mount(&format!("/dev/mapper/{name}"), &mnt)?;
        Some(Stall::Dm(name))
    }

    /// ext4 on a loop device whose backing file lives on another loop-mounted ext4,
    /// which `fsfreeze` stops.
    fn setup_frozen_backing(&mut self) -> Option<Stall> {
        let outer = self.dir.path().join("outer");
        std::fs::create_dir_all(&outer).ok()?;
        let lo = self.loop_device(&self.dir.path().join("outer.img"), 256)?;
        self.mkfs_mount(&lo, &outer)?;
        let inner = self.loop_device(&outer.join("inner.img"), 192)?;
        let mnt = self.mnt.clone();
        self.mkfs_mount(&inner, &mnt)?;
        Some(Stall::FrozenBacking(outer))
    }

    fn teardown(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            ctl.release();
        }
        while let Some(step) = self.undo.pop() {
            let _ = Command::new(&step[0]).args(&step[1..]).output();
        }
    }
}

impl Drop for RealDevice {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn on_real_device(mode: FlushMode, what: &'static str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(dev) = RealDevice::new() else {
        eprintln!(
            "SKIPPED: cannot set up a stallable device here (needs root, losetup, mkfs.ext4)"
        );
        return;
    };
    let root = dev.mnt.join("store");
    let ctl: Arc<dyn Device> = dev.ctl.clone().unwrap();
    common::run(move || async move {
        puts_answer_in_time(cfg(&root, mode), ctl, what).await;
    });
    drop(dev);
}

#[test]
fn sync_puts_answer_in_time_on_a_stalled_device() {
    on_real_device(FlushMode::Sync, "device sync");
}

#[test]
fn async_puts_answer_in_time_on_a_stalled_device() {
    on_real_device(FlushMode::Async, "device async");
}

// ---- no journal handle on the executor for a read ----

/// Every regular file under `dir` and its access time (seconds, nanoseconds).
fn access_times(dir: &Path) -> Vec<(PathBuf, (i64, i64))> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path(), (m.atime(), m.atime_nsec())));
            }
        }
    }
    out.sort();
    out
}

/// Sets `path`'s access time to `t` seconds after the epoch, its change time untouched.
fn set_access_time(path: &Path, t: i64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: t,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: a valid NUL-terminated path and two timespecs, as utimensat takes.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
        0,
        "utimensat {}",
        path.display()
    );
}

/// Store files are read without access-time updates (O_NOATIME): under `relatime` a
/// read of a file whose access time is older than its modification updates it, a
/// journal handle started by the reading thread, which for an io_uring read issued
/// inline is the shard's executor; with the device stalled that handle can wait for
/// a journal commit that waits for the device (`Disk::open`).
#[test]
fn gets_read_store_files_without_updating_access_times() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let root2 = root.clone();
    common::run(move || async move {
        let cfg = StoreConfig::small_for_tests(&root2);
        let store = Store::open(cfg.clone()).await.unwrap();
        let mut sent = Vec::new();
        for i in 0..200u64 {
            let r = store.put(message(i, true, 2000)).await;
            assert_eq!(r.status, PutStatus::PutOk);
            sent.push(i);
        }
        store.wait_dispatched().await;
        store.shutdown().await.unwrap();
        // Reopened (nothing cached): then every store file's access time is set well
        // before its modification, and the gets read from the files.
        let store = Store::open(cfg).await.unwrap();
        let before = access_times(&root2);
        for (p, _) in &before {
            set_access_time(p, 1_000_000);
        }
        let before = access_times(&root2);
        assert!(
            before
                .iter()
                .any(|(p, _)| p.to_string_lossy().contains("commitlog"))
        );
        let ids = stored_ids(&store).await;
        assert_eq!(ids.len(), sent.len(), "every message read back");
        let after = access_times(&root2);
        let changed: Vec<_> = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| b != a)
            .map(|(b, _)| b.0.display().to_string())
            .collect();
        assert!(
            changed.is_empty(),
            "reads updated access times of {changed:?}"
        );
        store.shutdown().await.unwrap();
    });
}
