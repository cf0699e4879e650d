//! A produce run from start to end: open the sharded store, send each shard its job,
//! start the outside producers (`--via handle`), watch until everything is done, shut
//! the store down, and put the figures together.

use super::config::{LoadConfig, Via};
use super::executor::block_on_all;
use super::local::{ShardResult, shard_job};
use super::measure::{load_average, now_ns, process_usage};
use super::plan::{Plan, ShardCounters};
use super::produce::{Produced, Rng};
use super::progress::Progress;
use super::report::{Report, new_histogram};
use super::{TempDir, open_store, outside};
use crate::{Handle, ShardContext};
use serde_json::{Value, json};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Runs `job` on every shard of `handle` (`Handle::run_on`) and waits for all; their
/// results in shard order.
pub(super) fn on_every_shard<T, F, Fut>(handle: &Handle, job: F) -> Result<Vec<T>, String>
where
    T: Send + 'static,
    F: FnOnce(ShardContext) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let jobs = (0..handle.shards())
        .map(|i| handle.run_on(i, job.clone()))
        .collect();
    let results = block_on_all(jobs);
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.map_err(|e| format!("shard {i}: {e}")))
        .collect()
}

/// Round trips of the bare wake-up baseline (`--via handle`): ~1 s at ~50 us each.
const BARE_ROUNDS: usize = 20_000;

/// `--warm-up`: the outside producers of a plan like `plan` run for `cfg.warm_up`
/// seconds before anything is measured (no shard job runs yet; the measured run's
/// counters, CPU and log figures start after).
fn warm_up(cfg: &LoadConfig, plan: &Plan, handle: &Handle) -> Result<(), String> {
    let wcfg = LoadConfig {
        duration: cfg.warm_up,
        messages: None,
        consumers: false,
        ..cfg.clone()
    };
    let wplan = Arc::new(Plan::new(
        &wcfg,
        handle.ownership(),
        plan.shards,
        plan.pattern.clone(),
    )?);
    let threads = outside::spawn_producers(&wplan, handle)?;
    for t in threads {
        t.join()
            .map_err(|_| "a warm-up producer thread panicked".to_string())?;
    }
    // Not a measurement: failed puts are told, and the measured run reports its own.
    let failed = sum(&wplan.counters, |c| &c.errors);
    if failed > 0 && !cfg.quiet {
        eprintln!("coremq bench: {failed} of the warm-up's puts failed");
    }
    Ok(())
}

/// Runs the load described by `cfg` and returns what it measured. Prints a progress
/// line on stderr once a second unless `cfg.quiet`.
pub fn run(cfg: &LoadConfig) -> Result<Report, String> {
    cfg.validate()?;
    let shards = cfg.shard_count();
    let _ = now_ns(); // start the shared clock before any shard reads it
    let load_before = load_average();
    // Through the handle: a bare cross-thread wake-up of this machine first, the
    // baseline its put latency is read against (before the store opens, so neither
    // disturbs the other).
    let bare_wakeup = (cfg.via == Via::Handle).then(|| {
        let mut v = super::bare::thread_round_trips(BARE_ROUNDS, false);
        v.sort();
        let at = |p: f64| v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
        (at(0.50), at(0.99))
    });
    let (data_dir, kept) = match &cfg.data_dir {
        Some(d) => (d.clone(), true),
        None => {
            let d = std::env::current_dir()
                .map_err(|e| format!("current directory: {e}"))?
                .join(format!(
                    "coremq-bench-{}-{}",
                    std::process::id(),
                    crate::now_ms()
                ));
            (d, false)
        }
    };
    let _cleanup = TempDir((!kept).then(|| data_dir.clone()));

    let mut rng = Rng::new(0xC0FF_EE00);
    let pattern_len = cfg.body.max.max(4096) + 64 * 1024;
    let pattern = (0..pattern_len).map(|_| rng.next() as u8).collect();
    let store = open_store(cfg, &data_dir, shards, cfg.store_template(&data_dir))?;
    let plan = Arc::new(Plan::new(cfg, store.handle().ownership(), shards, pattern)?);
    let idle: Vec<usize> = (0..shards).filter(|&s| plan.owned[s].is_empty()).collect();
    if !idle.is_empty() && !cfg.quiet {
        eprintln!(
            "coremq bench: shards {idle:?} own none of the queues (queues per shard: {:?}; \
             --queues-per-shard balances them)",
            plan.queue_counts()
        );
    }
    let slave = match cfg.slave {
        true => Some(super::replica::start_slave(cfg, &store, &data_dir)?),
        false => None,
    };
    let handle = store.handle();
    if cfg.warm_up > 0.0 {
        warm_up(cfg, &plan, &handle)?;
    }
    let (cpu_start, _) = process_usage();
    let started = Instant::now();
    let progress = Progress::new(&plan, started, !cfg.quiet);
    let stop = AtomicBool::new(false);
    let mut cpu_produced = None;
    let (shard_results, outside_results) = std::thread::scope(|s| {
        s.spawn(|| progress.run(&stop));
        let job_plan = plan.clone();
        let jobs = s.spawn(|| on_every_shard(&handle, move |ctx| shard_job(ctx, job_plan)));
        let mut producers = Ok(Vec::new());
        if cfg.via == Via::Handle {
            // Consumers first, so they start at the queues' ends before the first put.
            while plan.ready.load(Ordering::Acquire) < shards && !jobs.is_finished() {
                std::thread::sleep(Duration::from_millis(1));
            }
            if !jobs.is_finished() {
                producers = outside::spawn_producers(&plan, &handle);
            }
            if producers.is_err() {
                (0..shards).for_each(|s| plan.mark_produced(s));
            }
        }
        while !jobs.is_finished() {
            if cpu_produced.is_none() && plan.all_produced() {
                cpu_produced = Some(process_usage().0);
                if cfg.kill_after_flush {
                    kill_when_flushed(&plan, started);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        let outside: Result<Vec<Produced>, String> = producers.and_then(|threads| {
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .map_err(|_| "a producer thread panicked".to_string())
                })
                .collect()
        });
        let jobs = jobs
            .join()
            .unwrap_or_else(|_| Err("the shard jobs' thread panicked".into()));
        (jobs, outside)
    });
    let shut = store
        .shutdown()
        .map_err(|e| format!("shutdown failed: {e}"));
    if let Some(slave) = slave {
        slave
            .store
            .shutdown()
            .map_err(|e| format!("slave shutdown failed: {e}"))?;
    }
    let total_seconds = started.elapsed().as_secs_f64();
    let (cpu_end, peak_rss_bytes) = process_usage();
    let (shard_results, outside_results) = (shard_results?, outside_results?);
    shut?;

    let mut report = Report {
        config: cfg.clone(),
        shards,
        shard_queues: plan.queue_counts(),
        data_dir: data_dir.clone(),
        kept,
        messages: sum(&plan.counters, |c| &c.messages),
        bytes: sum(&plan.counters, |c| &c.bytes),
        log_bytes: shard_results.iter().map(|r| r.log_bytes).sum(),
        seconds: 0.0,
        total_seconds,
        consumed: sum(&plan.counters, |c| &c.consumed),
        consumed_while_producing: shard_results
            .iter()
            .map(|r| r.consumed_while_producing)
            .sum(),
        errors: sum(&plan.counters, |c| &c.errors),
        first_error: None,
        put_latency: new_histogram(),
        start_late: new_histogram(),
        service: new_histogram(),
        e2e_latency: new_histogram(),
        cpu_seconds: cpu_end - cpu_start,
        producing_cpu_seconds: cpu_produced.unwrap_or(cpu_end) - cpu_start,
        shard_cpu_seconds: shard_results.iter().map(|r| r.producing_cpu_seconds).sum(),
        max_dispatch_lag_bytes: plan
            .counters
            .iter()
            .map(|c| c.max_dispatch_lag.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0),
        peak_rss_bytes,
        load_before,
        bare_wakeup,
    };
    merge(&mut report, shard_results, outside_results)?;
    Ok(report)
}

fn sum(counters: &[ShardCounters], f: fn(&ShardCounters) -> &AtomicU64) -> u64 {
    counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
}

/// Adds the producers' and the shards' histograms, window and first problem to
/// `report`.
fn merge(
    report: &mut Report,
    shards: Vec<ShardResult>,
    outside: Vec<Produced>,
) -> Result<(), String> {
    let mut produced: Vec<Produced> = outside;
    let mut first_error = None;
    for r in shards {
        produced.extend(r.produced);
        first_error = first_error.or(r.first_error);
        report
            .e2e_latency
            .add(&r.e2e_latency)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    let start = produced.iter().map(|p| p.start_ns).min().unwrap_or(0);
    let end = produced.iter().map(|p| p.end_ns).max().unwrap_or(0);
    report.seconds = end.saturating_sub(start) as f64 / 1e9;
    for p in produced {
        first_error = p.first_error.or(first_error);
        report
            .put_latency
            .add(&p.put_latency)
            .map_err(|e| format!("merging histograms: {e}"))?;
        report
            .start_late
            .add(&p.start_late)
            .map_err(|e| format!("merging histograms: {e}"))?;
        report
            .service
            .add(&p.service)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    if first_error.is_none() && report.config.consumers && report.consumed != report.messages {
        first_error = Some(format!(
            "consumers read {} of {} messages",
            report.consumed, report.messages
        ));
    }
    report.first_error = first_error;
    Ok(())
}

/// `--kill-after-flush`: waits (up to a minute) until every shard's log is flushed as
/// far as it is written, writes the JSON report of what was put, and SIGKILLs the
/// process, as `kill -9` would: no shutdown, the abort files stay, dispatch (queues and
/// key index) stops wherever it was.
fn kill_when_flushed(plan: &Plan, started: Instant) -> ! {
    let flushed = || {
        plan.counters.iter().enumerate().all(|(i, c)| {
            let written = c.log[0].load(Ordering::Relaxed);
            let base = (i as u64) << crate::shard::SHARD_SHIFT;
            // A shard that owns no queue wrote nothing: its log is as flushed as it gets.
            (written > base || plan.owned[i].is_empty())
                && c.log[2].load(Ordering::Relaxed) >= written
        })
    };
    let give_up = Instant::now() + Duration::from_secs(60);
    // Twice in a row, a monitor round apart: the positions are sampled every 100 ms.
    let mut seen = 0;
    while seen < 2 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(150));
        seen = if flushed() { seen + 1 } else { 0 };
    }
    let shards: Vec<Value> = plan
        .counters
        .iter()
        .map(|c| {
            let [w, cm, f, d] = c.log.each_ref().map(|a| a.load(Ordering::Relaxed));
            json!({"written": w, "committed": cm, "flushed": f, "dispatched": d})
        })
        .collect();
    let report = json!({
        "label": plan.cfg.label,
        "config": plan.cfg.to_json(),
        "ok": seen >= 2,
        "killed": true,
        "first_error": if seen >= 2 { None } else { Some("the log was not flushed within 60 s") },
        "messages": sum(&plan.counters, |c| &c.messages),
        "bytes": sum(&plan.counters, |c| &c.bytes),
        "errors": sum(&plan.counters, |c| &c.errors),
        "seconds_until_kill": started.elapsed().as_secs_f64(),
        "peak_rss_bytes": process_usage().1,
        "shards": shards,
    });
    eprintln!("coremq bench: log flushed; killing the process (SIGKILL): {report}");
    if let Some(path) = &plan.cfg.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON of numbers");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("coremq bench: cannot write {}: {e}", path.display());
        }
    }
    // SAFETY: kill on our own pid; SIGKILL cannot be caught, the process ends here.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// Runs, prints the summary on stdout and writes the JSON and SVG files asked for.
pub fn run_and_report(cfg: &LoadConfig) -> Result<Report, String> {
    let report = run(cfg)?;
    print!("{}", report.summary());
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report.to_json()).expect("JSON of numbers");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &cfg.svg {
        std::fs::write(path, report.svg())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(report)
}
