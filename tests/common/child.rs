//! Helpers for the crash, recovery and bad-input tests: a seedable RNG, a body hash,
//! re-running this test binary as a child process, and file surgery on a stopped
//! store (flipping bytes, forging the checkpoint, marking an unclean stop).
//!
//! Included with `#[path = "common/child.rs"] mod child;` (tests/common/mod.rs is not
//! ours to change).
#![allow(dead_code)]

use coremq::format::checkpoint::{CHECKPOINT_LEN, Checkpoint};
use coremq::format::flush_mark::FlushMark;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// xorshift64: tiny, seedable, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// The seed in `var` (decimal), or one derived from the clock. Printed either way so
/// a failure can be replayed.
pub fn seed_from_env(var: &str) -> u64 {
    let seed = match std::env::var(var) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={s:?} is not a u64")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    };
    eprintln!("seed: {seed} (replay with {var}={seed})");
    seed
}

/// FNV-1a, 64 bits: enough to tell bodies apart.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Starts this test binary again, running only `test_name`, with `envs` set. The
/// child's stdout and stderr go to `log` (so a full pipe can never block it).
pub fn spawn_self(test_name: &str, envs: &[(&str, OsString)], log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("create child log");
    let err = out.try_clone().expect("clone child log");
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// The last `max` bytes of a child's log, for failure messages.
/// The last `max` bytes of a child's log, after the child's panic message if it
/// panicked (the message comes before a backtrace that would push it out).
pub fn log_tail(log: &Path, max: usize) -> String {
    let s = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(&s);
    let tail = &text[text.floor_char_boundary(text.len().saturating_sub(max))..];
    match text.find("panicked at") {
        Some(p) if p < text.len().saturating_sub(max) => {
            let end = text[p..]
                .find("stack backtrace")
                .map_or(text.len(), |e| p + e);
            format!("{}\n...\n{tail}", &text[p..end.min(p + 2000)])
        }
        _ => tail.to_string(),
    }
}

/// Path of the commit-log segment that starts at `start`.
pub fn segment_path(root: &Path, start: u64) -> PathBuf {
    root.join("commitlog").join(format!("{start:020}"))
}

/// (segment start, path) of every commit-log segment, sorted.
pub fn segments(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(root.join("commitlog"))
        .map(|rd| {
            rd.filter_map(|e| {
                let e = e.ok()?;
                let start = e.file_name().to_str()?.parse().ok()?;
                Some((start, e.path()))
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// XORs the byte at `offset` of `path` with `mask`.
pub fn flip_byte(path: &Path, offset: u64, mask: u8) {
    let mut data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    data[offset as usize] ^= mask;
    std::fs::write(path, &data).unwrap();
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

/// Overwrites `[offset, offset+bytes.len())` of `path`.
pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}

/// Flips a byte at commit-log offset `log_offset`.
pub fn flip_log_byte(root: &Path, seg_bytes: u64, log_offset: u64, mask: u8) {
    let start = log_offset / seg_bytes * seg_bytes;
    flip_byte(&segment_path(root, start), log_offset - start, mask);
}

/// Overwrites bytes at commit-log offset `log_offset` (within one segment).
pub fn write_log(root: &Path, seg_bytes: u64, log_offset: u64, bytes: &[u8]) {
    let start = log_offset / seg_bytes * seg_bytes;
    assert!(
        log_offset + bytes.len() as u64 <= start + seg_bytes,
        "write crosses a segment"
    );
    write_at(&segment_path(root, start), log_offset - start, bytes);
}

/// Leaves the `abort` file a crashed store leaves behind.
pub fn mark_unclean(root: &Path) {
    std::fs::write(root.join("abort"), b"12345").unwrap();
}

/// Makes the checkpoint unusable (all zeros: no coremq section) and removes the flush
/// mark, so recovery scans and dispatches the whole log with nothing assumed durable
/// (as for a RocketMQ store root or a store of a build without the mark).
pub fn invalidate_checkpoint(root: &Path) {
    std::fs::write(root.join("checkpoint"), vec![0u8; CHECKPOINT_LEN]).unwrap();
    let _ = std::fs::remove_file(root.join("flushmark"));
}

/// Records `log_flushed` as the newest flush mark (the next sequence, in its slot),
/// as the writer would have when that much was durable.
pub fn forge_flush_mark(root: &Path, log_flushed: u64) {
    let path = root.join("flushmark");
    let bytes = std::fs::read(&path).unwrap_or_default();
    let sequence = match FlushMark::latest(&bytes) {
        Ok(Some(m)) => m.sequence + 1,
        _ => 1,
    };
    let m = FlushMark {
        sequence,
        flushed: log_flushed,
    };
    if !path.exists() {
        std::fs::write(&path, vec![0u8; coremq::format::flush_mark::FILE_LEN]).unwrap();
    }
    write_at(&path, FlushMark::slot_offset(sequence), &m.encode());
}

/// Rewrites the (valid) checkpoint with these offsets, keeping its other fields, and
/// the flush mark at the same flushed offset, as a crash would leave them lagging the
/// log.
pub fn forge_checkpoint(root: &Path, log_flushed: u64, dispatch_safe: u64) {
    forge_flush_mark(root, log_flushed);
    let bytes = std::fs::read(root.join("checkpoint")).expect("read checkpoint");
    let (cp, valid) = Checkpoint::decode(&bytes).expect("decode checkpoint");
    assert!(
        valid,
        "forge_checkpoint needs a valid checkpoint to start from"
    );
    let cp = Checkpoint {
        log_flushed_offset: log_flushed,
        dispatch_safe_offset: dispatch_safe,
        ..cp
    };
    std::fs::write(root.join("checkpoint"), cp.encode()).unwrap();
}

/// Reads the checkpoint's (log_flushed, dispatch_safe), if valid.
pub fn read_checkpoint(root: &Path) -> Option<(u64, u64)> {
    let bytes = std::fs::read(root.join("checkpoint")).ok()?;
    match Checkpoint::decode(&bytes) {
        Ok((cp, true)) => Some((cp.log_flushed_offset, cp.dispatch_safe_offset)),
        _ => None,
    }
}

/// Every file under `root/sub` with its bytes (for "nothing was modified" checks).
pub fn snapshot(root: &Path, subs: &[&str]) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(p: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        if p.is_dir() {
            for e in std::fs::read_dir(p).unwrap() {
                walk(&e.unwrap().path(), out);
            }
        } else if p.is_file() {
            out.insert(p.to_path_buf(), std::fs::read(p).unwrap());
        }
    }
    let mut out = BTreeMap::new();
    for s in subs {
        walk(&root.join(s), &mut out);
    }
    out
}

/// Names of files that differ between two snapshots (added, removed or changed).
pub fn diff(a: &BTreeMap<PathBuf, Vec<u8>>, b: &BTreeMap<PathBuf, Vec<u8>>) -> Vec<String> {
    let mut out = Vec::new();
    for (p, bytes) in a {
        match b.get(p) {
            None => out.push(format!("removed {}", p.display())),
            Some(other) if other != bytes => {
                let first = bytes.iter().zip(other.iter()).position(|(x, y)| x != y);
                out.push(format!(
                    "changed {} (len {} -> {}, first difference at {first:?})",
                    p.display(),
                    bytes.len(),
                    other.len()
                ));
            }
            _ => {}
        }
    }
    for p in b.keys() {
        if !a.contains_key(p) {
            out.push(format!("added {}", p.display()));
        }
    }
    out
}

/// Copies a directory tree (a pristine store to damage in several ways).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Runs `f` on a fresh glommio executor thread and returns its output.
pub fn run_ret<T, F, Fut>(f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor panicked")
}
