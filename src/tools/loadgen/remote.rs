//! `coremq bench --target host:port`: drives a running node through RocketMQ's
//! remoting protocol (the same load-generator arguments as the embedded bench).
//!
//! Each producer is one connection with a writer thread and a reader thread: the
//! writer keeps up to `--outstanding` `SEND_MESSAGE_V2` requests in flight (a token
//! channel), the reader matches responses by opaque and records the round-trip
//! latency. Topics are created first (`UPDATE_AND_CREATE_TOPIC`) with `--queues`
//! queues; messages go round robin over topics and queues. With `--consumers`, every
//! queue is then read back with `PULL_MESSAGE` and the count checked.

use crate::node::remoting::codes::*;
use crate::node::remoting::{self, RemotingCommand};
use crate::tools::loadgen::LoadConfig;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAX_RESPONSE: usize = 64 << 20;

fn read_response(r: &mut impl Read) -> Result<RemotingCommand, String> {
    let mut prefix = [0u8; 4];
    r.read_exact(&mut prefix)
        .map_err(|e| format!("read: {e}"))?;
    let len = remoting::check_length(prefix, MAX_RESPONSE).map_err(|e| e.to_string())?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)
        .map_err(|e| format!("read: {e}"))?;
    remoting::decode_payload(payload.into()).map_err(|e| e.to_string())
}

/// One request and its response, on a connection with nothing else in flight.
fn call(
    s: &mut TcpStream,
    code: i32,
    fields: Vec<(String, String)>,
) -> Result<RemotingCommand, String> {
    let req = RemotingCommand::request(code, 1, fields);
    s.write_all(&req.encode())
        .map_err(|e| format!("write: {e}"))?;
    read_response(s)
}

fn topic_name(t: u32) -> String {
    format!("BenchTopic{t}")
}

fn body(cfg: &LoadConfig, i: u64) -> Vec<u8> {
    let span = (cfg.body.max - cfg.body.min) as u64 + 1;
    let len = cfg.body.min + (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % span) as usize;
    let mut b = vec![b'x'; len.max(8)];
    b[..8].copy_from_slice(&i.to_be_bytes());
    b
}

struct Shared {
    next: AtomicU64,
    limit: Option<u64>,
    deadline: Instant,
    stop: AtomicBool,
    ok: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    hist: Mutex<Histogram<u64>>,
}

impl Shared {
    /// The next message number to send, or `None` when done.
    fn take(&self) -> Option<u64> {
        if self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        match self.limit {
            Some(n) if i >= n => None,
            _ => Some(i),
        }
    }
}

fn producer(cfg: &LoadConfig, target: &str, sh: &Arc<Shared>) -> Result<(), String> {
    let s = TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}"))?;
    let _ = s.set_nodelay(true);
    let mut reader = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let (tokens_tx, tokens_rx) = flume::bounded::<()>(cfg.outstanding as usize);
    let sent: Arc<Mutex<HashMap<i32, Instant>>> = Arc::default();
    let sent2 = sent.clone();
    let sh2 = sh.clone();
    let reader_thread = std::thread::spawn(move || {
        let mut local = Histogram::<u64>::new(3).expect("histogram");
        loop {
            let Ok(r) = read_response(&mut reader) else {
                break;
            };
            let Some(t0) = sent2.lock().expect("sent map").remove(&r.opaque) else {
                continue;
            };
            let _ = local.record(t0.elapsed().as_micros() as u64);
            if r.code == SUCCESS {
                sh2.ok.fetch_add(1, Ordering::Relaxed);
            } else {
                sh2.failed.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tokens_rx.try_recv();
        }
        let _ = sh2.hist.lock().expect("histogram").add(&local);
    });
    let mut w = s;
    let topics = cfg.topics.max(1);
    let queues = cfg.queues.max(1);
    while let Some(i) = sh.take() {
        if tokens_tx.send(()).is_err() {
            break;
        }
        let topic = topic_name((i % topics as u64) as u32);
        let queue = ((i / topics as u64) % queues as u64).to_string();
        let b = body(cfg, i);
        let fields = vec![
            ("a".to_string(), "bench-producer".to_string()),
            ("b".into(), topic),
            ("c".into(), "TBW102".into()),
            ("d".into(), "4".into()),
            ("e".into(), queue),
            ("f".into(), "0".into()),
            ("g".into(), crate::now_ms().to_string()),
            ("h".into(), "0".into()),
            ("i".into(), format!("KEYS\u{1}bench-{i}\u{2}")),
            ("j".into(), "0".into()),
        ];
        let opaque = (i % i32::MAX as u64) as i32;
        let req = RemotingCommand::request(SEND_MESSAGE_V2, opaque, fields).with_body(b.clone());
        sent.lock()
            .expect("sent map")
            .insert(opaque, Instant::now());
        if w.write_all(&req.encode()).is_err() {
            sh.failed.fetch_add(1, Ordering::Relaxed);
            break;
        }
        sh.bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
    }
    // Wait for the responses still in flight.
    let drain = Instant::now() + Duration::from_secs(30);
    while !sent.lock().expect("sent map").is_empty() && Instant::now() < drain {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = w.shutdown(std::net::Shutdown::Both);
    let _ = reader_thread.join();
    Ok(())
}

/// Reads every queue back from offset 0; the messages found.
fn read_back(cfg: &LoadConfig, target: &str) -> Result<u64, String> {
    let mut s = TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}"))?;
    let mut total = 0;
    for t in 0..cfg.topics.max(1) {
        for q in 0..cfg.queues.max(1) {
            let mut offset = 0u64;
            loop {
                let f = |k: &str, v: String| (k.to_string(), v);
                let r = call(
                    &mut s,
                    PULL_MESSAGE,
                    vec![
                        f("consumerGroup", "bench-consumer".into()),
                        f("topic", topic_name(t)),
                        f("queueId", q.to_string()),
                        f("queueOffset", offset.to_string()),
                        f("maxMsgNums", "32".into()),
                        f("sysFlag", "0".into()),
                    ],
                )?;
                if r.code != SUCCESS {
                    break;
                }
                let mut at = 0usize;
                while at + 4 <= r.body.len() {
                    let size = u32::from_be_bytes(r.body[at..at + 4].try_into().expect("4 bytes"));
                    at += size.max(4) as usize;
                    total += 1;
                }
                offset = r
                    .field("nextBeginOffset")
                    .and_then(|v| v.parse().ok())
                    .ok_or("a pull response without nextBeginOffset")?;
            }
        }
    }
    Ok(total)
}

/// Runs the remote benchmark; prints a summary and returns the JSON report and
/// whether every message was acknowledged (and read back, with `--consumers`).
pub fn run(cfg: &LoadConfig, target: &str) -> Result<(Value, bool), String> {
    let mut admin = TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}"))?;
    for t in 0..cfg.topics.max(1) {
        let q = cfg.queues.to_string();
        let r = call(
            &mut admin,
            UPDATE_AND_CREATE_TOPIC,
            vec![
                ("topic".into(), topic_name(t)),
                ("readQueueNums".into(), q.clone()),
                ("writeQueueNums".into(), q),
                ("perm".into(), "6".into()),
            ],
        )?;
        if r.code != SUCCESS {
            return Err(format!("cannot create {}: {:?}", topic_name(t), r.remark));
        }
    }
    let started = Instant::now();
    let sh = Arc::new(Shared {
        next: AtomicU64::new(0),
        limit: cfg.messages,
        deadline: if cfg.messages.is_some() {
            started + Duration::from_secs(24 * 3600)
        } else {
            started + Duration::from_secs_f64(cfg.duration.max(0.0))
        },
        stop: AtomicBool::new(false),
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        hist: Mutex::new(Histogram::new(3).expect("histogram")),
    });
    let producers: Vec<_> = (0..cfg.producers.max(1))
        .map(|_| {
            let (cfg, target, sh) = (cfg.clone(), target.to_string(), sh.clone());
            std::thread::spawn(move || producer(&cfg, &target, &sh))
        })
        .collect();
    let mut errors = Vec::new();
    for p in producers {
        match p.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a producer thread panicked".into()),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let ok = sh.ok.load(Ordering::Relaxed);
    let failed = sh.failed.load(Ordering::Relaxed);
    let bytes = sh.bytes.load(Ordering::Relaxed);
    let hist = sh.hist.lock().expect("histogram").clone();
    let read = if cfg.consumers {
        Some(read_back(cfg, target)?)
    } else {
        None
    };
    let pct = |p: f64| hist.value_at_quantile(p / 100.0);
    let report = json!({
        "label": cfg.label,
        "target": target,
        "messages_acknowledged": ok,
        "messages_failed": failed,
        "seconds": seconds,
        "messages_per_sec": ok as f64 / seconds.max(1e-9),
        "mb_per_sec": bytes as f64 / 1e6 / seconds.max(1e-9),
        "send_latency_us": {"p50": pct(50.0), "p99": pct(99.0), "p99.9": pct(99.9), "max": hist.max()},
        "read_back": read,
        "errors": errors,
    });
    println!(
        "{}: {ok} acknowledged, {failed} failed in {seconds:.2} s: {:.0} msg/s, {:.1} MB/s; \
         send round trip p50 {} us, p99 {} us, p99.9 {} us{}",
        cfg.label,
        ok as f64 / seconds.max(1e-9),
        bytes as f64 / 1e6 / seconds.max(1e-9),
        pct(50.0),
        pct(99.0),
        pct(99.9),
        read.map(|n| format!("; read back {n}")).unwrap_or_default()
    );
    // Read back counts every message stored in the bench topics, earlier runs too.
    let good = failed == 0 && errors.is_empty() && read.is_none_or(|n| n >= ok);
    Ok((report, good))
}
