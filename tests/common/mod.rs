#![allow(dead_code)]
use coremq::{GetStatus, Message, Store, StoredMessage};
use std::future::Future;

/// Runs `f` on a fresh glommio executor thread and waits for it.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor panicked");
}

pub fn body(topic: &str, q: i32, i: u64) -> Vec<u8> {
    let len = 50 + (i as usize * 7919) % 3000;
    let mut b = format!("{topic}/{q}/{i}:").into_bytes();
    while b.len() < len {
        b.push(b'a' + (b.len() % 26) as u8);
    }
    b
}

pub fn msg(topic: &str, q: i32, i: u64) -> Message {
    Message::new(topic, q, body(topic, q, i))
        .with_tags(format!("tag{}", i % 3))
        .with_keys(format!("key-{i} k{}", i % 10))
}

/// Reads the whole queue from `from` and checks every body against `body()`.
pub async fn read_all(store: &Store, topic: &str, q: i32) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut off = store.min_queue_offset(topic, q);
    loop {
        let r = store.get(topic, q, off, 32, 1 << 20).await.expect("get");
        match r.status {
            GetStatus::Found => {
                for raw in &r.records {
                    out.push(StoredMessage::decode(raw).unwrap_or_else(|e| {
                        panic!(
                            "decode {e} at q {off} raw len {} head {:?}",
                            raw.len(),
                            &raw[..16.min(raw.len())]
                        )
                    }));
                }
                off = r.next_begin_offset;
            }
            GetStatus::OffsetOverflowOne | GetStatus::NoMessageInQueue => return out,
            s => panic!("unexpected status {s:?} at {off}"),
        }
    }
}

/// Unmounts on drop, so a failing test does not leave a loop mount behind.
pub struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Mounts a tiny ext4 image at `at`; `None` when this machine cannot (not root).
pub fn tiny_fs(image: &std::path::Path, at: &std::path::Path, mib: u64) -> Option<Mount> {
    std::fs::create_dir_all(at).unwrap();
    std::fs::File::create(image)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    let ok =
        |c: &mut std::process::Command| c.output().map(|o| o.status.success()).unwrap_or(false);
    if !ok(std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", "^has_journal"])
        .arg(image))
    {
        return None;
    }
    if !ok(std::process::Command::new("mount")
        .args(["-o", "loop"])
        .arg(image)
        .arg(at))
    {
        return None;
    }
    Some(Mount(at.to_path_buf()))
}
