//! The `coremq` command line.
//!
//! * `coremq inspect records|queue|check|key DIR ...`: offline, read-only inspection of
//!   a store directory (see `coremq::tools::inspect`); JSON lines on stdout.
//! * `coremq run`: the main job on an embedded default: opens a store in a data
//!   directory, puts N messages with up to 256 puts outstanding, reads every queue
//!   back and verifies every body, shuts down cleanly and prints a JSON summary.
//! * `coremq serve`: a node speaking RocketMQ's remoting protocol (see `coremq::node`);
//!   defaults, then `--config coremq.toml`, then the address flags; SIGINT/SIGTERM
//!   shut it down cleanly.
//! * `coremq ha truncate --data-dir DIR --to OFFSET`: cut a slave that ran past its
//!   master back to the master's end (`coremq::ha::truncate`).
//! * `coremq bench`: the load generator (`coremq::tools::loadgen`) on a sharded store:
//!   producers on the shards or on threads through the handle (`--via`), optional
//!   tailing consumers, and modes for a kept store (catch-up, key queries, recovery);
//!   prints throughput, latency percentiles, CPU per message and peak memory; `--json
//!   FILE` and `--svg FILE` write the report; `--target HOST:PORT` drives a node.
//!
//! Exit codes: 0 success, 1 a problem was found (check failed, verification failed,
//! no such queue), 2 the command could not run (bad arguments, unreadable files,
//! store failed to open).

use clap::{Args, Parser, Subcommand, ValueEnum};
use coremq::format::properties;
use coremq::{
    FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig, StoredMessage, tools::inspect,
};
use serde_json::json;
use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "coremq",
    version,
    about = "RocketMQ's message store on glommio"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Read-only inspection of a store directory (coremq shard, RocketMQ store root,
    /// or a directory of shard-<i>/ stores).
    Inspect {
        #[command(subcommand)]
        what: Inspect,
    },
    /// Put, read back and verify messages on an embedded store; print a JSON summary.
    Run(RunArgs),
    /// Load generator on a sharded store: producers on the shards (--via local) or on
    /// threads through the handle (--via handle), optional tailing consumers; reports
    /// throughput, put and end-to-end latency percentiles, CPU per message, peak memory.
    Bench(Box<coremq::tools::loadgen::LoadConfig>),
    /// Serve RocketMQ's remoting protocol (broker and name-server ports) over a
    /// store in a data directory, until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Replication maintenance on a stopped store.
    Ha {
        #[command(subcommand)]
        what: HaCmd,
    },
}

#[derive(Subcommand)]
enum HaCmd {
    /// Cut a slave whose log runs past its master's back to the master's end (the
    /// offset the slave's error names); the cut bytes go to lost+found/. The store must
    /// be stopped.
    Truncate {
        #[arg(long)]
        data_dir: PathBuf,
        /// The commit-log offset to cut at (a record boundary).
        #[arg(long)]
        to: u64,
    },
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// A TOML file overriding the defaults (see coremq.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Store directory [default: ./coremq-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Broker address [default: 127.0.0.1:10911].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Name-server address [default: 127.0.0.1:9876].
    #[arg(long)]
    namesrv_listen: Option<std::net::SocketAddr>,
    /// Prometheus metrics address [default: 127.0.0.1:9100].
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Shard ports: shard i also listens on this port + i as a broker of its own, and
    /// routes name those shard brokers [default: off].
    #[arg(long)]
    shard_listen: Option<std::net::SocketAddr>,
    /// Replication role: async_master (or master), sync_master, slave [default: async_master].
    #[arg(long)]
    role: Option<String>,
    /// HA port slaves connect to [default: the broker address, port + 1: 127.0.0.1:10912].
    #[arg(long)]
    ha_listen: Option<std::net::SocketAddr>,
    /// A slave's master HA address.
    #[arg(long)]
    ha_master: Option<std::net::SocketAddr>,
}

#[derive(Subcommand)]
enum Inspect {
    /// Every CommitLog record, one JSON line each.
    Records { dir: PathBuf },
    /// One ConsumeQueue's entries, one JSON line each (summary on stderr).
    Queue {
        dir: PathBuf,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        queue: i32,
    },
    /// Verify records, queues and checkpoint; one JSON summary line; exit 1 on problems.
    Check { dir: PathBuf },
    /// Records with a key, found through the index files (newest first), one JSON line
    /// each; exit 1 when none is found.
    Key {
        dir: PathBuf,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        key: String,
        /// Earliest store time, ms since the epoch (inclusive).
        #[arg(long, default_value_t = 0)]
        begin: i64,
        /// Latest store time, ms since the epoch (inclusive).
        #[arg(long, default_value_t = i64::MAX)]
        end: i64,
        /// Hash slots per index file the store was written with.
        #[arg(long, default_value_t = coremq::format::index_file::DEFAULT_SLOTS)]
        index_slots: u32,
        /// Entries per index file the store was written with.
        #[arg(long, default_value_t = coremq::format::index_file::DEFAULT_ENTRIES)]
        index_entries: u32,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Flush {
    Async,
    Sync,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[arg(long, default_value = "./coremq-data")]
    data_dir: PathBuf,
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    queues: u32,
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    #[arg(long, value_enum, default_value_t = Flush::Async)]
    flush: Flush,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serve_cfg = match &cli.cmd {
        Cmd::Serve(args) => match serve_config(args) {
            Ok(c) => Some(c),
            Err(e) => {
                init_tracing("info");
                return fail(&e);
            }
        },
        _ => None,
    };
    init_tracing(serve_cfg.as_ref().map_or("info", |c| c.log_level.as_str()));
    if let Some(cfg) = serve_cfg {
        return serve_cmd(cfg);
    }
    match cli.cmd {
        Cmd::Serve(_) => unreachable!("handled above"),
        Cmd::Inspect { what } => inspect_cmd(what),
        Cmd::Run(args) => run_cmd(args),
        Cmd::Bench(cfg) => bench_cmd(&cfg),
        Cmd::Ha {
            what: HaCmd::Truncate { data_dir, to },
        } => match coremq::ha::truncate::truncate(&data_dir, to) {
            Ok(t) => {
                println!(
                    "{}",
                    json!({
                        "root": t.root.display().to_string(),
                        "truncated_to": to,
                        "old_end": t.old_end,
                        "kept_bytes": t.kept,
                        "lost_found": t.lost_found.map(|p| p.display().to_string()),
                    })
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
    }
}

fn init_tracing(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

// ---------------------------------------------------------------------------------
// inspect

fn inspect_cmd(what: Inspect) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = match &what {
        Inspect::Records { dir } => inspect::print_records(dir, &mut out).map(|_| true),
        Inspect::Queue { dir, topic, queue } => {
            let found = inspect::print_queue(dir, topic, *queue, &mut out, &mut std::io::stderr());
            if let Ok(false) = found {
                eprintln!("no consume queue {topic}/{queue} under {}", dir.display());
            }
            found
        }
        Inspect::Check { dir } => inspect::print_check(dir, &mut out),
        Inspect::Key {
            dir,
            topic,
            key,
            begin,
            end,
            index_slots,
            index_entries,
        } => {
            let q = inspect::KeyQuery {
                topic: topic.clone(),
                key: key.clone(),
                begin: *begin,
                end: *end,
                slots: *index_slots,
                entries: *index_entries,
            };
            let found = inspect::print_key(dir, &q, &mut out);
            if let Ok(false) = found {
                eprintln!(
                    "no message of topic {topic} with key {key:?} under {}",
                    dir.display()
                );
            }
            found
        }
    };
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(true), Ok(())) => ExitCode::SUCCESS,
        (Ok(false), Ok(())) => ExitCode::from(1),
        // The reader went away (`| head`): not a failure of the tool.
        (Err(coremq::Error::Io { source, .. }), _) if source.kind() == ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        (_, Err(e)) if e.kind() == ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        (Err(e), _) => fail(&e),
        (_, Err(e)) => fail(&e),
    }
}

fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("coremq: {e}");
    ExitCode::from(2)
}

// ---------------------------------------------------------------------------------
// serve

/// Defaults, then the config file, then the flags.
fn serve_config(args: &ServeArgs) -> coremq::Result<coremq::node::NodeConfig> {
    let mut cfg = match &args.config {
        Some(path) => coremq::node::NodeConfig::from_file(path)?,
        None => coremq::node::NodeConfig::default(),
    };
    if let Some(d) = &args.data_dir {
        cfg.data_dir = d.clone();
    }
    if let Some(a) = args.listen {
        cfg.listen = a;
    }
    if let Some(a) = args.namesrv_listen {
        cfg.namesrv_listen = a;
    }
    if let Some(a) = args.metrics_listen {
        cfg.metrics_listen = a;
    }
    if let Some(a) = args.shard_listen {
        cfg.shard_listen = Some(a);
    }
    if let Some(r) = &args.role {
        cfg.role = r.clone();
    }
    if let Some(a) = args.ha_listen {
        cfg.ha_listen = Some(a);
    }
    if let Some(a) = args.ha_master {
        cfg.ha_master_address = Some(a);
    }
    cfg.validate()?;
    Ok(cfg)
}

fn serve_cmd(cfg: coremq::node::NodeConfig) -> ExitCode {
    // SIGINT and SIGTERM are blocked here, before the node's threads start (they inherit
    // the mask), and taken by this thread's `sigtimedwait`: it sleeps until one comes or
    // a second passes to look for a failed node, instead of waking every 100 ms to look
    // at a flag a handler set (10 of an idle node's wake-ups a second, 0.4 ms of CPU).
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask only
    // changes this thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let node = match coremq::node::Node::start(cfg) {
        Ok(n) => n,
        Err(e) => return fail(&e),
    };
    let signal = loop {
        // A dead shard is never left silent: shut the others down cleanly and exit
        // with a status a supervisor sees (recovery runs on the dead shard at restart).
        if let Some(why) = node.failure() {
            eprintln!("coremq: the node failed: {why}");
            if let Err(e) = node.shutdown() {
                eprintln!("coremq: shutdown after the failure: {e}");
            }
            return ExitCode::from(coremq::node::EXIT_NODE_FAILED);
        }
        let second = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: `set` is a valid signal set; no siginfo is asked for.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &second) };
        if sig > 0 {
            break sig;
        }
        // -1: the second passed (EAGAIN) or another signal interrupted (EINTR).
    };
    tracing::info!(signal, "stop signal received");
    match node.shutdown() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------------------------
// bench

fn bench_cmd(cfg: &coremq::tools::loadgen::LoadConfig) -> ExitCode {
    if let Some(target) = &cfg.target {
        return match coremq::tools::loadgen::remote::run(cfg, target) {
            Ok((report, good)) => {
                if let Some(path) = &cfg.json {
                    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
                    if let Err(e) = std::fs::write(path, text + "\n") {
                        return fail(&format!("cannot write {}: {e}", path.display()));
                    }
                }
                if good {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => fail(&e),
        };
    }
    match coremq::tools::loadgen::run_mode(cfg) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------------------------
// run

const TOPIC: &str = "BenchTopic";
/// Puts kept outstanding at once.
const MAX_INFLIGHT: usize = 256;
/// Records asked for per `get` while reading back.
const GET_BATCH: usize = 256;

/// What `run` measured.
struct RunSummary {
    put_seconds: f64,
    read_seconds: f64,
    errors: Vec<String>,
}

fn run_cmd(args: RunArgs) -> ExitCode {
    let job = args.clone();
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("coremq-run")
        .spawn(move || async move { run_job(job).await });
    let summary = match handle.map(|h| h.join()) {
        Ok(Ok(Ok(s))) => s,
        Ok(Ok(Err(e))) => return fail(&e),
        Ok(Err(e)) | Err(e) => return fail(&e),
    };
    let verified = summary.errors.is_empty();
    for e in &summary.errors {
        tracing::error!("verification failed: {e}");
    }
    print_summary(&args, &summary, verified);
    if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_summary(args: &RunArgs, s: &RunSummary, verified: bool) {
    let bytes = args.messages * args.body_bytes as u64;
    let per_sec = |v: f64| {
        if s.put_seconds > 0.0 {
            v / s.put_seconds
        } else {
            0.0
        }
    };
    let line = json!({
        "messages": args.messages,
        "bytes": bytes,
        "put_seconds": s.put_seconds,
        "messages_per_sec": per_sec(args.messages as f64),
        "mb_per_sec": per_sec(bytes as f64 / 1e6),
        "read_seconds": s.read_seconds,
        "verified": verified,
        "data_dir": args.data_dir.display().to_string(),
        "flush": match args.flush { Flush::Async => "async", Flush::Sync => "sync" },
    });
    println!("{line}");
}

/// Opens the store, puts, waits for dispatch, reads back, shuts down.
async fn run_job(args: RunArgs) -> coremq::Result<RunSummary> {
    let mut cfg = StoreConfig::new(&args.data_dir);
    cfg.flush_mode = match args.flush {
        Flush::Async => FlushMode::Async,
        Flush::Sync => FlushMode::Sync,
    };
    let store = Store::open(cfg).await?;
    // Queue offsets where this run starts (non-zero when the directory is reused).
    let bases: Vec<u64> = (0..args.queues)
        .map(|q| store.max_queue_offset(TOPIC, q as i32))
        .collect();
    let started = Instant::now();
    let mut errors = put_all(&store, &args).await;
    let put_seconds = started.elapsed().as_secs_f64();
    store.wait_dispatched().await;
    let started = Instant::now();
    errors.extend(read_back(&store, &args, &bases).await);
    let read_seconds = started.elapsed().as_secs_f64();
    store.shutdown().await?;
    Ok(RunSummary {
        put_seconds,
        read_seconds,
        errors,
    })
}

/// The body of message `i`: `len` bytes derived from `i`.
/// Message `i`'s body: a pattern depending on `i`, built 8 bytes at a time so that
/// generating load costs little next to storing it.
fn body(i: u64, len: usize) -> Vec<u8> {
    let seed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
    let mut b = Vec::with_capacity(len + 8);
    while b.len() < len {
        b.extend_from_slice(&seed);
    }
    b.truncate(len);
    b
}

fn message(i: u64, args: &RunArgs) -> Message {
    let q = (i % args.queues as u64) as i32;
    Message::new(TOPIC, q, body(i, args.body_bytes))
        .with_tags(format!("tag{}", i % 8))
        .with_keys(format!("key-{i}"))
}

/// Puts every message, keeping up to [`MAX_INFLIGHT`] puts outstanding. Returns the
/// first few failures.
async fn put_all(store: &Store, args: &RunArgs) -> Vec<String> {
    let mut inflight: VecDeque<(u64, glommio::Task<PutStatus>)> =
        VecDeque::with_capacity(MAX_INFLIGHT);
    let mut errors = Vec::new();
    for i in 0..args.messages {
        if inflight.len() == MAX_INFLIGHT {
            let (j, task) = inflight.pop_front().expect("window is full");
            note_put(j, task.await, &mut errors);
        }
        let s = store.clone();
        let msg = message(i, args);
        inflight.push_back((
            i,
            glommio::spawn_local(async move { s.put(msg).await.status }),
        ));
    }
    for (j, task) in inflight {
        note_put(j, task.await, &mut errors);
    }
    errors
}

fn note_put(i: u64, status: PutStatus, errors: &mut Vec<String>) {
    if !status.is_stored() && errors.len() < 10 {
        errors.push(format!("put {i}: {status:?}"));
    }
}

/// Reads every queue from its base offset and checks each message against `body()`.
async fn read_back(store: &Store, args: &RunArgs, bases: &[u64]) -> Vec<String> {
    let mut seen = vec![false; args.messages as usize];
    let mut errors = Vec::new();
    for (q, base) in bases.iter().enumerate() {
        if let Err(e) = read_queue(store, q as i32, *base, args, &mut seen).await {
            errors.push(e);
        }
    }
    let missing = seen.iter().filter(|s| !**s).count();
    if missing > 0 {
        errors.push(format!(
            "{missing} of {} messages were not read back",
            args.messages
        ));
    }
    errors
}

async fn read_queue(
    store: &Store,
    q: i32,
    from: u64,
    args: &RunArgs,
    seen: &mut [bool],
) -> Result<(), String> {
    let mut off = from;
    loop {
        let r = store
            .get(TOPIC, q, off, GET_BATCH, 8 << 20)
            .await
            .map_err(|e| e.to_string())?;
        match r.status {
            GetStatus::Found => {
                for raw in &r.records {
                    let m = StoredMessage::decode(raw)
                        .map_err(|e| format!("queue {q}: bad record: {e}"))?;
                    verify_message(&m, q, args, seen)?;
                }
                off = r.next_begin_offset;
            }
            GetStatus::OffsetOverflowOne | GetStatus::NoMessageInQueue => return Ok(()),
            other => return Err(format!("queue {q}: get at offset {off} returned {other:?}")),
        }
    }
}

fn verify_message(
    m: &StoredMessage,
    q: i32,
    args: &RunArgs,
    seen: &mut [bool],
) -> Result<(), String> {
    let key = m.property(properties::KEYS).unwrap_or_default();
    let i: u64 = key
        .strip_prefix("key-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            format!(
                "queue {q} offset {}: unexpected keys {key:?}",
                m.queue_offset
            )
        })?;
    let slot = seen
        .get_mut(i as usize)
        .ok_or_else(|| format!("message {i} is out of range"))?;
    if *slot {
        return Err(format!("message {i} was read twice"));
    }
    if m.queue_id != q || i % args.queues as u64 != q as u64 {
        return Err(format!(
            "message {i} is in queue {} (read from {q})",
            m.queue_id
        ));
    }
    if m.body[..] != body(i, args.body_bytes)[..] {
        return Err(format!("message {i}: body differs from what was put"));
    }
    *slot = true;
    Ok(())
}
