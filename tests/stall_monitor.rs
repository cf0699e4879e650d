//! The stall detector's monitor thread (`src/shard/stall.rs`) reports a shard whose
//! heartbeat is overdue as "still frozen". A clean shutdown stops the heartbeats
//! without a last beat; the monitor must not take that for a freeze. It did: every
//! `coremq bench` run ended with a "still frozen" warning for each shard (22-27 ms).
//!
//! Its own test binary: the warnings are captured process-wide, and other tests
//! freeze shards on purpose.

use coremq::{Message, ShardedConfig, ShardedStore, StoreOps};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything logged at warn and above, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_clean_shutdown_is_not_reported_as_a_frozen_shard() {
    let log = Captured::default();
    let sink = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .init();
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ShardedConfig::new(dir.path());
        c.shards = 2;
        c.pin = false;
        c.io_memory_bytes = 8 << 20;
        // Well above a scheduling hiccup of a loaded machine; the stale last beat
        // the monitor may find after a stop is overdue by up to its 100 ms period.
        c.stall_threshold = Some(Duration::from_millis(40));
        let store = ShardedStore::open(c).unwrap();
        let h = store.handle();
        // Busy shards beat every 10 ms (a quarter of the threshold).
        futures_lite::future::block_on(async {
            for i in 0..2000 {
                let r = h.put(Message::new("T", i % 8, vec![7; 100])).await;
                assert!(r.status.is_stored(), "round {round}: {:?}", r.status);
            }
        });
        store.shutdown().unwrap();
    }
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains("still frozen"), "{text}");
}
