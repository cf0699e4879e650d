//! `coremq bench --target host:port`: drives a running node through RocketMQ's
//! remoting protocol (the same load-generator arguments as the embedded bench).
//!
//! Each producer has its own connections (one, or one per broker with
//! `--follow-route`); a thread per CPU drives a share of the connections, dealt by
//! broker, on non-blocking sockets (`pipelined.rs`, `--client-threads`; a thread per
//! producer with a plain blocking write-then-read with `--outstanding 1`). A producer
//! keeps up to `--outstanding`
//! `SEND_MESSAGE_V2` requests in flight (with
//! `--batch N`, `SEND_BATCH_MESSAGE` requests of N messages to one queue), matches
//! responses by opaque and records the round-trip latency; `--outstanding` is split
//! over a producer's connections. Topics are created
//! first (`UPDATE_AND_CREATE_TOPIC`) with `--queues` queues; messages go round robin
//! over topics and queues. With `--consumers`, every queue is then read back with
//! `PULL_MESSAGE` (32 per request, one pull in flight per queue) and the count checked
//! (`read_back.rs`). `--request heartbeat` sends a producer's `HEART_BEAT` in place of
//! each send (same pacing and windows; the node answers it from its client tables): what
//! a request costs the node without the store, the floor under a send at a light paced
//! rate (under load it costs more than a send: it goes through the general decoder).
//!
//! The client shares the machine with the node it measures, so it is lean (issue 20):
//! requests are encoded straight into one reused buffer per producer
//! (`remoting::encode`), as many as the free in-flight slots allow per `write`;
//! responses are read into one reused buffer and only their code and opaque are read,
//! in place (`remoting::scan`); nothing is allocated per message once warm.
//!
//! With `--follow-route` the producers send as a RocketMQ client does: the node's
//! route for each topic (`GET_ROUTEINFO_BY_TOPIC`, which the broker port answers too)
//! names the brokers and their queue counts (with the node's `shard_listen`, one
//! broker per shard at its own port); each producer opens a connection per broker,
//! sends each broker's queues (its own ids) there, and splits `--outstanding` over
//! them (`route.rs`).
//!
//! `--target echo` runs the same producers against a loopback TCP echo server in this
//! process (a thread per connection that writes back what it reads): the floor a
//! node's round trip is compared with. Every echoed frame counts as acknowledged
//! (`echo.rs`).

use crate::node::remoting::codes::*;
use crate::node::remoting::encode::{FieldValue, FrameHead, encode_frame};
use crate::node::remoting::scan::HeaderView;
use crate::node::remoting::{self, HEADER_WORD, LENGTH_PREFIX, RemotingCommand, SerializeType};
use crate::tools::loadgen::{HeaderFormat, LoadConfig, RemoteRequest};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod echo;
mod pipelined;
mod read_back;
mod route;

use echo::{echo_cpu_seconds, echo_server};
use read_back::read_back;
use route::{Broker, route_brokers};

const MAX_RESPONSE: usize = 64 << 20;

/// Most requests one `write` carries.
const MAX_BURST: usize = 64;

/// A producer's read buffer (it grows for a frame that does not fit).
const READ_BUF: usize = 256 << 10;

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

/// Message `i`'s body length.
fn body_len(cfg: &LoadConfig, i: u64) -> usize {
    let span = (cfg.body.max - cfg.body.min) as u64 + 1;
    let len = cfg.body.min + (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % span) as usize;
    len.max(8)
}

/// Appends message `i`'s body: its number, then `x`s.
fn push_body(out: &mut Vec<u8>, len: usize, i: u64) {
    let at = out.len();
    out.resize(at + len, b'x');
    out[at..at + 8].copy_from_slice(&i.to_be_bytes());
}

/// Sets `props` to message `i`'s properties (RocketMQ's `name\x01value\x02` text):
/// `--keys` keys.
fn set_props(props: &mut String, keys: u32, i: u64) {
    use std::fmt::Write as _;
    props.clear();
    if keys == 0 {
        return;
    }
    props.push_str("KEYS\u{1}");
    for k in 0..keys {
        if k > 0 {
            props.push(' ');
        }
        let _ = write!(props, "bench-{i}");
        if k > 0 {
            let _ = write!(props, "-{k}");
        }
    }
    props.push('\u{2}');
}

struct Shared {
    next: AtomicU64,
    limit: Option<u64>,
    deadline: Instant,
    ok: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    hist: Mutex<Histogram<u64>>,
    /// Every frame that comes back counts (the echo server answers with the request).
    echo: bool,
    /// `--rate`: message `i` is sent no sooner than `started + i / rate`.
    started: Instant,
    rate: Option<f64>,
}

impl Shared {
    /// With `--rate`: when message `i` is due.
    fn due(&self, i: u64) -> Option<Instant> {
        let rate = self.rate.filter(|r| *r > 0.0)?;
        Some(self.started + Duration::from_secs_f64(i as f64 / rate))
    }

    /// Without waiting: the next `n` message numbers if the first is due
    /// ([`Next::Send`]), else when it will be, or that the run is over.
    fn take_due(&self, n: u64) -> Next {
        let now = Instant::now();
        if now >= self.deadline {
            return Next::Done;
        }
        let mut i = self.next.load(Ordering::Relaxed);
        loop {
            if let Some(due) = self.due(i) {
                if due >= self.deadline {
                    return Next::Done;
                }
                if due > now {
                    return Next::At(due);
                }
            }
            match self
                .next
                .compare_exchange_weak(i, i + n, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => i = seen,
            }
        }
        match self.limit {
            Some(limit) if i >= limit => Next::Done,
            Some(limit) => Next::Send(i, n.min(limit - i)),
            None => Next::Send(i, n),
        }
    }

    /// The first of the next `n` message numbers and how many of them to send, or
    /// `None` when done: [`Shared::take_due`], sleeping until the next is due.
    fn take(&self, n: u64) -> Option<(u64, u64)> {
        loop {
            match self.take_due(n) {
                Next::Send(first, n) => return Some((first, n)),
                Next::At(due) => std::thread::sleep(due.saturating_duration_since(Instant::now())),
                Next::Done => return None,
            }
        }
    }
}

/// What [`Shared::take_due`] gives a producer.
enum Next {
    /// Send messages `first..first + n`.
    Send(u64, u64),
    /// The next message is due then (`--rate`).
    At(Instant),
    /// The run is over.
    Done,
}

/// The topic (index) and queue of the send whose first message is number `first`:
/// sends (a batch counts as one) go round the topics, then the queues. Numbering by
/// message instead sent every 32-message batch to queue 0 of topic 0 whenever the
/// batch size was a multiple of the queue count (scenario 10's batches and read-back).
fn destination(first: u64, batch: u64, topics: u64, queues: u64) -> (u64, u64) {
    let send = first / batch.max(1);
    let topics = topics.max(1);
    (send % topics, (send / topics) % queues.max(1))
}

/// A producer's requests, encoded into one reused buffer.
struct Encoder {
    topics: Vec<String>,
    /// `--follow-route`: this connection's broker's (topic, queue) pairs, in turn;
    /// empty: every topic and queue of `--queues` ([`destination`]).
    dests: Vec<(u64, i64)>,
    /// Sends encoded so far (which of `dests` is next).
    turn: usize,
    queues: u64,
    keys: u32,
    batch: u64,
    kind: SerializeType,
    props: String,
    /// `--request heartbeat`: the `HEART_BEAT` body every request carries.
    heartbeat: Option<Vec<u8>>,
    out: Vec<u8>,
}

impl Encoder {
    /// Appends the request for messages `first..first + n` (one send, or one batch
    /// to the first message's queue); returns the body bytes.
    fn push(&mut self, cfg: &LoadConfig, opaque: i32, first: u64, n: u64) -> u64 {
        if let Some(body) = &self.heartbeat {
            let head = FrameHead {
                code: HEART_BEAT,
                flag: 0,
                opaque,
                serialize_type: self.kind,
                remark: None,
                fields: &[],
            };
            encode_frame(&mut self.out, &head, body.len());
            self.out.extend_from_slice(body);
            return 0;
        }
        let (t, queue) = if self.dests.is_empty() {
            let (t, q) = destination(first, self.batch, self.topics.len() as u64, self.queues);
            (t, q as i64)
        } else {
            self.turn += 1;
            self.dests[(self.turn - 1) % self.dests.len()]
        };
        let topic = &self.topics[t as usize];
        let batch = self.batch > 1;
        let mut body_bytes = 0u64;
        let mut wire_len = 0usize;
        if batch {
            for i in first..first + n {
                set_props(&mut self.props, self.keys, i);
                let len = body_len(cfg, i);
                body_bytes += len as u64;
                wire_len += 20 + len + 2 + self.props.len();
            }
            self.props.clear();
        } else {
            set_props(&mut self.props, self.keys, first);
            wire_len = body_len(cfg, first);
            body_bytes = wire_len as u64;
        }
        let fields = [
            ("a", FieldValue::Str("bench-producer")),
            ("b", FieldValue::Str(topic)),
            ("c", FieldValue::Str("TBW102")),
            ("d", FieldValue::Int(4)),
            ("e", FieldValue::Int(queue)),
            ("f", FieldValue::Int(0)),
            ("g", FieldValue::Int(crate::now_ms())),
            ("h", FieldValue::Int(0)),
            ("i", FieldValue::Str(&self.props)),
            ("j", FieldValue::Int(0)),
            ("m", FieldValue::Str(if batch { "true" } else { "false" })),
        ];
        let head = FrameHead {
            code: if batch {
                SEND_BATCH_MESSAGE
            } else {
                SEND_MESSAGE_V2
            },
            flag: 0,
            opaque,
            serialize_type: self.kind,
            remark: None,
            fields: &fields,
        };
        encode_frame(&mut self.out, &head, wire_len);
        if batch {
            // RocketMQ's `MessageDecoder.encodeMessages`: size, magic, body CRC, flag,
            // body length, body, properties length, properties.
            for i in first..first + n {
                set_props(&mut self.props, self.keys, i);
                let len = body_len(cfg, i);
                let size = 20 + len + 2 + self.props.len();
                self.out.extend_from_slice(&(size as i32).to_be_bytes());
                self.out.extend_from_slice(&[0; 8]);
                self.out.extend_from_slice(&0i32.to_be_bytes());
                self.out.extend_from_slice(&(len as i32).to_be_bytes());
                push_body(&mut self.out, len, i);
                self.out
                    .extend_from_slice(&(self.props.len() as i16).to_be_bytes());
                self.out.extend_from_slice(self.props.as_bytes());
            }
        } else {
            push_body(&mut self.out, wire_len, first);
        }
        body_bytes
    }
}

fn encoder(cfg: &LoadConfig, dests: &[(u64, i64)]) -> Encoder {
    Encoder {
        topics: (0..cfg.topics.max(1)).map(topic_name).collect(),
        dests: dests.to_vec(),
        turn: 0,
        queues: cfg.queues.max(1) as u64,
        keys: cfg.keys,
        batch: cfg.batch.max(1) as u64,
        kind: match cfg.header_format {
            HeaderFormat::Json => SerializeType::Json,
            HeaderFormat::Rocketmq => SerializeType::RocketMq,
        },
        props: String::new(),
        heartbeat: (cfg.request == RemoteRequest::Heartbeat).then(|| {
            // What a producer's heartbeat holds (`HeartbeatData`): its client id and group.
            json!({
                "clientID": "bench-client@127.0.0.1",
                "producerDataSet": [{"groupName": "bench-producer"}],
                "consumerDataSet": [],
            })
            .to_string()
            .into_bytes()
        }),
        out: Vec::with_capacity(MAX_BURST * (cfg.body.max + 512)),
    }
}

/// One request in flight: one thread writes a request and reads its response (no
/// hand-off between a writer and a reader thread on the round trip). With
/// `--follow-route`, one connection per broker: send `k` goes to broker `k % brokers`
/// (its own queues in turn), still one request in flight in all.
fn producer_one(
    cfg: &LoadConfig,
    conns: Vec<(TcpStream, &[(u64, i64)])>,
    sh: &Shared,
) -> Result<(), String> {
    let mut conns: Vec<(TcpStream, Encoder, Responses)> = conns
        .into_iter()
        .map(|(s, dests)| (s, encoder(cfg, dests), Responses::new()))
        .collect();
    let mut sent = HashMap::with_capacity(2);
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut seq: i32 = 0;
    let batch = cfg.batch.max(1) as u64;
    let n_conns = conns.len() as u64;
    while let Some((first, n)) = sh.take(batch) {
        let (s, enc, responses) = &mut conns[((first / batch) % n_conns) as usize];
        seq = seq.wrapping_add(1) & i32::MAX;
        enc.out.clear();
        // Each connection's encoder takes its own queues in turn.
        let bytes = enc.push(cfg, seq, first, n);
        sent.insert(seq, (Instant::now(), n));
        if s.write_all(&enc.out).is_err() {
            sh.failed.fetch_add(n, Ordering::Relaxed);
            break;
        }
        sh.bytes.fetch_add(bytes, Ordering::Relaxed);
        loop {
            let Some((code, opaque)) = responses.next(s) else {
                sh.failed.fetch_add(n, Ordering::Relaxed);
                let _ = sh.hist.lock().expect("histogram").add(&hist);
                return Ok(());
            };
            if settle(&mut sent, sh, &mut hist, code, opaque) {
                break;
            }
        }
    }
    let _ = sh.hist.lock().expect("histogram").add(&hist);
    for (s, _, _) in &conns {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    Ok(())
}

fn connect(target: &str) -> Result<TcpStream, String> {
    let s = TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Responses read into one reused buffer: every whole frame of a read, its code and
/// opaque read in place.
struct Responses {
    buf: Vec<u8>,
    start: usize,
    filled: usize,
}

impl Responses {
    fn new() -> Responses {
        Responses {
            buf: vec![0u8; READ_BUF],
            start: 0,
            filled: 0,
        }
    }

    /// The next response's code and opaque; `None` when the connection ends or sends
    /// a malformed frame.
    fn next(&mut self, r: &mut TcpStream) -> Option<(i32, i32)> {
        code_and_opaque(self.next_frame(r)?)
    }

    /// The next response frame (the bytes after its length prefix), reading as
    /// needed; `None` when the connection ends or sends a malformed length.
    fn next_frame(&mut self, r: &mut TcpStream) -> Option<&[u8]> {
        loop {
            match self.frame_at() {
                Err(()) => return None,
                Ok(Some((at, end))) => return Some(&self.buf[at..end]),
                Ok(None) => match self.fill(r) {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                },
            }
        }
    }

    /// The next whole frame already read, without reading; `Err` for a malformed length.
    fn frame(&mut self) -> Result<Option<&[u8]>, ()> {
        Ok(self.frame_at()?.map(|(at, end)| &self.buf[at..end]))
    }

    /// Where the next whole frame already read lies (past its length prefix), taken.
    fn frame_at(&mut self) -> Result<Option<(usize, usize)>, ()> {
        let Some(prefix) = self.buf[self.start..self.filled].first_chunk::<4>() else {
            return Ok(None);
        };
        let whole =
            LENGTH_PREFIX + remoting::check_length(*prefix, MAX_RESPONSE).map_err(|_| ())?;
        if self.filled - self.start >= whole {
            let at = self.start;
            self.start += whole;
            return Ok(Some((at + LENGTH_PREFIX, at + whole)));
        }
        if whole > self.buf.len() {
            self.buf.resize(whole, 0);
        }
        Ok(None)
    }

    /// One read into the buffer (a partial frame kept, at the front when the
    /// buffer's end is near); the bytes read, 0 at the connection's end.
    fn fill(&mut self, r: &mut TcpStream) -> std::io::Result<usize> {
        if self.start == self.filled {
            (self.start, self.filled) = (0, 0);
        } else if self.buf.len() - self.filled < READ_BUF / 4 || self.filled == self.buf.len() {
            self.buf.copy_within(self.start..self.filled, 0);
            (self.start, self.filled) = (0, self.filled - self.start);
        }
        let n = r.read(&mut self.buf[self.filled..])?;
        self.filled += n;
        Ok(n)
    }
}

/// Counts a response to a request in `sent`; whether it was one.
fn settle(
    sent: &mut HashMap<i32, (Instant, u64)>,
    sh: &Shared,
    hist: &mut Histogram<u64>,
    code: i32,
    opaque: i32,
) -> bool {
    let Some((t0, n)) = sent.remove(&opaque) else {
        return false;
    };
    let _ = hist.record(t0.elapsed().as_micros() as u64);
    if code == SUCCESS || sh.echo {
        sh.ok.fetch_add(n, Ordering::Relaxed);
    } else {
        sh.failed.fetch_add(n, Ordering::Relaxed);
    }
    true
}

/// A response's code and opaque (the bytes after its length prefix), read in place;
/// through the general decoder when the in-place reader declines the header.
fn code_and_opaque(frame: &[u8]) -> Option<(i32, i32)> {
    let word = u32::from_be_bytes(*frame.first_chunk::<4>()?);
    let header = frame.get(HEADER_WORD..HEADER_WORD + (word & 0x00FF_FFFF) as usize)?;
    match HeaderView::parse((word >> 24) as u8, header) {
        Ok(v) => Some((v.code, v.opaque)),
        Err(_) => remoting::decode_payload(bytes::Bytes::copy_from_slice(frame))
            .ok()
            .map(|c| (c.code, c.opaque)),
    }
}

/// Runs the remote benchmark; prints a summary and returns the JSON report and
/// whether every message was acknowledged (and read back, with `--consumers`).
pub fn run(cfg: &LoadConfig, target: &str) -> Result<(Value, bool), String> {
    let echo = target == "echo";
    if cfg.request == RemoteRequest::Heartbeat && (echo || cfg.batch > 1 || cfg.consumers) {
        return Err(
            "--request heartbeat needs a node (--target HOST:PORT) and sends no messages \
             (no --batch, no --consumers)"
                .into(),
        );
    }
    let target = if echo { &echo_server()? } else { target };
    let mut admin = TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}"))?;
    for t in 0..if echo { 0 } else { cfg.topics.max(1) } {
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
    let brokers = if cfg.follow_route && !echo {
        route_brokers(&mut admin, cfg.topics.max(1))?
    } else {
        vec![Broker {
            addr: target.to_string(),
            dests: Vec::new(),
        }]
    };
    let started = Instant::now();
    let cpu_before = crate::stats::process::process_cpu_seconds();
    let sh = Arc::new(Shared {
        next: AtomicU64::new(0),
        limit: cfg.messages,
        deadline: if cfg.messages.is_some() {
            started + Duration::from_secs(24 * 3600)
        } else {
            started + Duration::from_secs_f64(cfg.duration.max(0.0))
        },
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        hist: Mutex::new(Histogram::new(3).expect("histogram")),
        echo,
        started,
        rate: cfg.rate,
    });
    let brokers = Arc::new(brokers);
    let producers: Vec<_> = if cfg.outstanding == 1 {
        // One thread per producer, one request in flight over all its connections.
        (0..cfg.producers.max(1))
            .map(|_| {
                let (cfg, brokers, sh) = (cfg.clone(), brokers.clone(), sh.clone());
                std::thread::spawn(move || {
                    let conns = brokers
                        .iter()
                        .map(|b| Ok((connect(&b.addr)?, b.dests.as_slice())))
                        .collect::<Result<Vec<_>, String>>()?;
                    producer_one(&cfg, conns, &sh)
                })
            })
            .collect()
    } else {
        // A few threads drive all the producers' connections, dealt by broker
        // (`pipelined.rs`).
        let window = (cfg.outstanding as usize / brokers.len()).max(1);
        let dealt = pipelined::deal(
            brokers.len(),
            cfg.producers.max(1) as usize,
            cfg.client_thread_count(),
        );
        dealt
            .into_iter()
            .map(|mine| {
                let (cfg, brokers, sh) = (cfg.clone(), brokers.clone(), sh.clone());
                std::thread::spawn(move || {
                    let mine: Vec<&Broker> = mine.iter().map(|&b| &brokers[b]).collect();
                    pipelined::connections(&cfg, &mine, window, &sh)
                })
            })
            .collect()
    };
    let mut errors = Vec::new();
    for p in producers {
        match p.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a producer thread panicked".into()),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = crate::stats::process::process_cpu_seconds() - cpu_before;
    let echo_cpu = if echo { echo_cpu_seconds() } else { 0.0 };
    let ok = sh.ok.load(Ordering::Relaxed);
    let failed = sh.failed.load(Ordering::Relaxed);
    let bytes = sh.bytes.load(Ordering::Relaxed);
    let hist = sh.hist.lock().expect("histogram").clone();
    let read_started = Instant::now();
    let read = if cfg.consumers && !echo {
        Some(read_back(cfg, target)?)
    } else {
        None
    };
    let read_seconds = read_started.elapsed().as_secs_f64();
    let pct = |p: f64| hist.value_at_quantile(p / 100.0);
    let report = json!({
        "label": cfg.label,
        "target": target,
        "messages_acknowledged": ok,
        "messages_failed": failed,
        "seconds": seconds,
        "messages_per_sec": ok as f64 / seconds.max(1e-9),
        "mb_per_sec": bytes as f64 / 1e6 / seconds.max(1e-9),
        // This process's CPU (the echo server's too with `--target echo`).
        "client_cpu_seconds": cpu,
        "client_cpu_us_per_message": cpu * 1e6 / (ok.max(1)) as f64,
        // With `--target echo`: the echo server's threads alone (one side of the round trip).
        "echo_server_cpu_us_per_message": echo.then(|| echo_cpu * 1e6 / (ok.max(1)) as f64),
        "send_latency_us": {"p50": pct(50.0), "p99": pct(99.0), "p99.9": pct(99.9), "max": hist.max()},
        "target_kind": if echo { "loopback echo server" } else { "node" },
        "batch": cfg.batch,
        "outstanding": cfg.outstanding,
        "producers": cfg.producers,
        "client_threads": (cfg.outstanding > 1).then(|| cfg.client_thread_count()),
        // The brokers sent to (`--follow-route`: the route's; else the target).
        "brokers": brokers.iter().map(|b| b.addr.clone()).collect::<Vec<_>>(),
        "header_format": format!("{:?}", cfg.header_format).to_lowercase(),
        "request": format!("{:?}", cfg.request).to_lowercase(),
        "read_back": read,
        "read_back_seconds": read.map(|_| read_seconds),
        "read_back_per_sec": read.map(|n| n as f64 / read_seconds.max(1e-9)),
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
        read.map(|n| format!(
            "; read back {n} in {read_seconds:.2} s ({:.0} msg/s)",
            n as f64 / read_seconds.max(1e-9)
        ))
        .unwrap_or_default()
    );
    // Read back counts every message stored in the bench topics, earlier runs too.
    let good = failed == 0 && errors.is_empty() && read.is_none_or(|n| n >= ok);
    Ok((report, good))
}

#[cfg(test)]
mod tests {
    use super::destination;
    use std::collections::HashSet;

    #[test]
    fn sends_and_batches_go_round_every_topic_and_queue() {
        for (batch, topics, queues) in [(1, 1, 8), (32, 1, 8), (32, 2, 8), (4, 3, 4), (1, 2, 8)] {
            let seen: HashSet<(u64, u64)> = (0..topics * queues)
                .map(|send| destination(send * batch, batch, topics, queues))
                .collect();
            assert_eq!(
                seen.len() as u64,
                topics * queues,
                "batch {batch}, {topics} topics, {queues} queues: {seen:?}"
            );
        }
        // Single sends keep the numbering they always had.
        assert_eq!(destination(5, 1, 2, 8), (1, 2));
    }
}
