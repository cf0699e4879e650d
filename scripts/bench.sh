#!/usr/bin/env bash
# coremq's benchmark suite, side by side with the disk's own limit (issue 5).
#
# In one go, on the filesystem of the work directory: fio baselines (sequential 1 MiB
# O_DIRECT writes at queue depth 8 through io_uring; 4 KiB write + fdatasync latency
# on a preallocated file; sequential 1 MiB O_DIRECT reads; 4 KiB O_DIRECT random reads
# at depth 1, the floor of a key query's record read), then the load generator's
# scenarios (`coremq bench`), each result next to its baseline as a ratio:
#   1-4  puts (async 1 KiB on the shards and 1b from threads through the handle,
#        1c one shard fed by one outside thread against the same shard producing on
#        itself, async 16 KiB, sync group commit with 256 outstanding and 3b one put at a
#        time, 3c the same into new and into recycled segments, tailing consumers);
#   5    catch-up reads of a kept store several times larger than the write pools,
#        from every queue's first offset (5a: one queue per shard, 5b: 64 queues);
#   6    random key queries (each asking every shard) over a store with many keys;
#   7    abnormal recovery: a writer SIGKILLed once its log is flushed, then the open
#        timed, against fio reading as many bytes;
#   8    replication (issue 17): 8a a kept store replicated to a new, empty slave over
#        loopback (catch-up rate against fio write); 8b sync flush with and without a
#        SYNC_MASTER slave in the same run, 1 and 256 puts outstanding (put p50/p99);
#   9    timed messages (RocketMQ 5's timer, `--mode timer`): plain puts against timed
#        puts in the same run (msg/s, CPU per message), then a million timed messages
#        pending at once (RSS next to the timer's memory bound), then their delivery
#        over 60 s (--quick: 200,000 over 20 s): lateness p50/p99/p99.9/max, missing,
#        duplicates, early;
#   10   the node (issue 20): `coremq serve` on a fresh store driven through RocketMQ's
#        protocol by `coremq bench --target` on the same machine: single 1 KiB sends
#        (4 connections x 64 outstanding), batched sends (32 per SEND_BATCH_MESSAGE),
#        one send in flight, and a pull read-back (32 per request), with the node's
#        CPU per message (from /proc/<pid>/stat) next to the embedded put's CPU per
#        message (single sends and the embedded put in three interleaved rounds, each
#        side at its median round), a loopback TCP echo round trip (and its server's CPU per round
#        trip, at one in flight and at 4 x 64) and the embedded catch-up rate, all
#        measured in the same run; and the
#        node's CPU per message at 1k, 3k, 10k, 30k and 100k msg/s offered
#        (bench-results/s10-cpu-vs-rate.svg), the node's CPU per request for 1,000
#        heartbeats a second (a request without store work, `--request heartbeat`: the
#        floor under the 1,000 sends a second), and an embedded store's shard threads at
#        1,000 puts a second through the handle. The node runs with shard ports
#        (`--shard-listen`) and the client follows its route (`--follow-route`), as a
#        RocketMQ client does: each send goes to its queue's shard; single sends on
#        the node's own port (half handed between shards) are measured beside them;
#   11   latency against load (issue 23): scenario 4's open loop (async 1 KiB puts,
#        tailing consumers) at 10, 25, 50, 75 and 90% of the closed-loop rate of the
#        same workload (s11-capacity, run first), one run per point:
#        offered and achieved msg/s, put p50/p99/p99.9 and end-to-end p99 per point,
#        and the put's own service time p99 (from when its lane began it: the rest of
#        the latency is the late start, put_start_late_us in each point's JSON),
#        the curves in bench-results/s11-latency-vs-load.svg. The floor beside them:
#        the same schedule at 10% and 50% kept and timed with nothing put
#        (`coremq bench --pace-only`, s11-floor-10 and s11-floor-50), what the executor
#        and the machine alone put under a paced put's latency.
#
# Usage: scripts/bench.sh [--quick] [--only LIST] [--dir DIR] [--out DIR]
#   --quick      about 2 minutes instead of about 10 (shorter runs, smaller stores)
#   --only LIST  run only these scenarios, e.g. 5,6,7 (fio baselines always run)
#   --dir DIR    work directory for fio files and stores (default: ./bench-work);
#                emptied of what the script made at the end
#   --out DIR    where bench-results.{json,md} and the per-scenario JSON/SVG go
#                (default: the current directory)
#
# Needs fio and jq (installed with apt-get when missing) and a Rust toolchain.
set -euo pipefail

quick=0
only="1,2,3,4,5,6,7,8,9,10,11"
work=""
out="."
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) only="$2"; shift ;;
        --dir) work="$2"; shift ;;
        --out) out="$2"; shift ;;
        -h|--help) sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mkdir -p "${work:-./bench-work}" && cd "${work:-./bench-work}" && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
detail="$out/bench-results"
mkdir -p "$detail"

# s5_msgs x 4 KiB: the catch-up log (the write pools hold 2 x 64 MiB);
# s6_keys: messages with one key each; s7_msgs x 1 KiB: the log recovered;
# s8_msgs x 4 KiB: the log replicated to an empty slave; s9_timed timed messages of
# 256 B due over s9_spread seconds.
if [ "$quick" = 1 ]; then
    fio_bytes=1G; fio_sync_secs=2; secs=3; s10_msgs=100000; s9_timed=200000; s9_spread=20
    s5_msgs=120000; s6_keys=200000; s6_queries=20000; s7_msgs=300000; s8_msgs=120000; limit=180
else
    fio_bytes=8G; fio_sync_secs=10; secs=15; s10_msgs=500000; s9_timed=1000000; s9_spread=60
    s5_msgs=600000; s6_keys=10000000; s6_queries=100000; s7_msgs=2500000; s8_msgs=600000; limit=1200
fi
# want N: scenario N is in --only.
want() { [[ ",$only," == *",$1,"* ]]; }

log() { printf '\n== %s\n' "$*" >&2; }

need() {
    local tool="$1"
    if ! command -v "$tool" >/dev/null 2>&1; then
        log "installing $tool"
        if [ "$(id -u)" = 0 ]; then
            apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null
        else
            sudo apt-get update -qq && sudo apt-get install -y -qq "$tool" >/dev/null
        fi
    fi
}
need fio
need jq

log "building coremq (release)"
(cd "$repo" && cargo build --release --quiet --features cli)
# A private copy: a concurrent build cannot swap the binary in the middle of a run.
bin="$work/coremq"
cp "${CARGO_TARGET_DIR:-$repo/target}/release/coremq" "$bin"

cleanup() {
    rm -rf "$work"/fio-* "$work"/s[0-9]-* "$work"/s1[01]-* "$bin"
    rmdir "$work" 2>/dev/null || true
}
trap cleanup EXIT

# ---------------------------------------------------------------------------------
# fio baselines

log "fio: sequential 1 MiB O_DIRECT writes, io_uring, iodepth 8, $fio_bytes fresh file"
rm -f "$work/fio-seq"
fio --name=seqwrite --filename="$work/fio-seq" --rw=write --bs=1M --size="$fio_bytes" \
    --direct=1 --ioengine=io_uring --iodepth=8 --output-format=json >"$detail/fio-write.json"
write_bw=$(jq '.jobs[0].write.bw_bytes' "$detail/fio-write.json")

log "fio: sequential 1 MiB O_DIRECT reads, io_uring, iodepth 8"
fio --name=seqread --filename="$work/fio-seq" --rw=read --bs=1M --size="$fio_bytes" \
    --direct=1 --ioengine=io_uring --iodepth=8 --output-format=json >"$detail/fio-read.json"
read_bw=$(jq '.jobs[0].read.bw_bytes' "$detail/fio-read.json")

log "fio: 4 KiB O_DIRECT random reads, iodepth 1, ${fio_sync_secs}s (a key query's record read)"
fio --name=randread --filename="$work/fio-seq" --rw=randread --bs=4k --size="$fio_bytes" \
    --direct=1 --ioengine=io_uring --iodepth=1 --runtime="$fio_sync_secs" --time_based \
    --output-format=json >"$detail/fio-randread.json"
rpct() { jq ".jobs[0].read.clat_ns.percentile[\"$1\"] / 1000" "$detail/fio-randread.json"; }
rr50=$(rpct 50.000000); rr99=$(rpct 99.000000)
rm -f "$work/fio-seq"

log "fio: 4 KiB O_DIRECT write + fdatasync, iodepth 1, preallocated 256 MiB file, ${fio_sync_secs}s"
fio --name=fill --filename="$work/fio-sync" --rw=write --bs=1M --size=256M --direct=1 \
    --output-format=json >/dev/null
fio --name=syncwrite --filename="$work/fio-sync" --rw=write --bs=4k --size=256M --direct=1 \
    --ioengine=sync --fdatasync=1 --iodepth=1 --runtime="$fio_sync_secs" --time_based \
    --output-format=json >"$detail/fio-fdatasync.json"
rm -f "$work/fio-sync"
pct() { jq ".jobs[0].$1.percentile[\"$2\"] / 1000" "$detail/fio-fdatasync.json"; }
w50=$(pct write.clat_ns 50.000000); w99=$(pct write.clat_ns 99.000000)
s50=$(pct sync.lat_ns 50.000000); s99=$(pct sync.lat_ns 99.000000)
sync_iops=$(jq '.jobs[0].write.iops' "$detail/fio-fdatasync.json")
# fio times the write and the fdatasync separately; their sum bounds the pair.
fsync_p50=$(echo "$w50 + $s50" | bc -l)
fsync_p99=$(echo "$w99 + $s99" | bc -l)

# ---------------------------------------------------------------------------------
# scenarios

# bench_run NAME LABEL DIR ARGS...: one `coremq bench` run on the store in DIR, kept.
# A run that found problems (exit 1), could not finish (exit 2: a shard failed) or hung
# (SIGKILLed after $limit s) is reported in the table, and the script goes on.
bench_run() {
    local name="$1" label="$2" dir="$3" rc
    shift 3
    log "scenario $name: $label"
    rm -f "$detail/$name.json" "$detail/$name.svg"
    # stdout as is; stderr (progress, errors) to the terminal and to a log.
    set +e
    {
        timeout --signal=KILL "$limit" "$bin" bench --label "$label" --data-dir "$dir" \
            --json "$detail/$name.json" --svg "$detail/$name.svg" "$@" \
            2>&1 >&3 | tee "$detail/$name.log" >&2
    } 3>&1
    rc=${PIPESTATUS[0]}
    set -e
    if [ ! -s "$detail/$name.json" ]; then
        local why
        why=$(grep -m1 '^coremq: ' "$detail/$name.log" | cut -c9-300 || true)
        if [ -z "$why" ] && [ "$rc" = 137 ]; then
            why="no answer within $limit s (hung; SIGKILLed)"
        fi
        jq -n --arg lbl "$label" --arg why "${why:-exit status $rc}" \
            '{"label": $lbl, "ok": false, "failed": true, "first_error": $why}' >"$detail/$name.json"
    fi
}

# run NAME LABEL ARGS...: one `coremq bench` run on a fresh store, removed afterwards.
run() {
    local name="$1" label="$2"
    shift 2
    bench_run "$name" "$label" "$work/$name" "$@"
    rm -rf "${work:?}/$name"
}

# skip NAME...: placeholders for scenarios left out by --only.
skip() {
    local name
    for name in "$@"; do
        jq -n '{"ok": false, "skipped": true}' >"$detail/$name.json"
    done
}

export RUST_LOG="${RUST_LOG:-warn}"
if want 1; then
    run s1-async-1k "async flush, 1 KiB, all shards, 64 queues" \
        --duration "$secs" --body 1024 --queues 64
    # 1b: the same load from two plain threads putting through the Send + Sync handle
    # (what an embedder does first): every put crosses to its shard and back.
    run s1b-handle "async flush, 1 KiB, 2 threads through the handle" \
        --duration "$secs" --body 1024 --queues 64 --via handle --producers 2
    # 1c: one shard fed by one outside thread (the kernel gives it the other core),
    # against that shard producing on itself: the handle's cost where the host's
    # thread has a core of its own (1b shares two cores between four threads).
    run s1c-local "async flush, 1 KiB, one shard producing on itself" \
        --duration "$secs" --body 1024 --queues 64 --shards 1
    run s1c-handle "async flush, 1 KiB, one shard, one thread through the handle" \
        --duration "$secs" --body 1024 --queues 64 --shards 1 --via handle --producers 1
else skip s1-async-1k s1b-handle s1c-local s1c-handle; fi
if want 2; then
    run s2-async-16k "async flush, 16 KiB, all shards, 64 queues" \
        --duration "$secs" --body 16384 --queues 64
else skip s2-async-16k; fi
if want 3; then
    run s3-sync-1k "sync flush (group commit), 1 KiB, 256 outstanding" \
        --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding 256
    # 3b: one put at a time on one shard, so every put is its own round: the store's
    # latency next to fio's bare write + fdatasync. (With 256 outstanding per shard the
    # mean latency is outstanding / throughput by Little's law, whatever the disk does.)
    run s3b-sync-1 "sync flush, 1 KiB, 1 outstanding, 1 shard" \
        --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding 1 --shards 1
    # 3c: the same into new segments (sparse, zero-filled ahead by the prewriter) and
    # into recycled ones (retired segments kept zero-filled, `--spare-segments`): 8 MiB
    # segments, 8 written and retired first, so the run crosses several.
    run s3c-fresh "sync flush, 1 KiB, 1 outstanding, new segments" \
        --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding 1 --shards 1 \
        --segment-mib 8 --fill-segments 8
    run s3c-recycled "sync flush, 1 KiB, 1 outstanding, recycled segments" \
        --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding 1 --shards 1 \
        --segment-mib 8 --fill-segments 8 --spare-segments 8
else skip s3-sync-1k s3b-sync-1 s3c-fresh s3c-recycled; fi
# Tailing consumers under an open loop at a quarter of scenario 1's closed-loop rate:
# a load the shards have CPU to spare for, so consumers should keep up.
s4_rate=$(jq '((.messages_per_sec // 400000) / 4) | floor' "$detail/s1-async-1k.json")
if want 4; then
    run s4-consumers "async flush, 1 KiB, tailing consumers, $s4_rate msg/s" \
        --duration "$secs" --body 1024 --queues 64 --consumers --rate "$s4_rate" \
        --drain-timeout 10
else skip s4-consumers; fi

# Catch-up (5): a store written and shut down, then every queue read from its first
# offset by one reader per queue, 256 messages per get. The CommitLog is read with
# O_DIRECT (no page cache to drop); only the newest windows of each shard's write
# pool can serve reads from memory. 5a: one queue per shard (each reader's records
# are contiguous; queue ids picked so that every shard owns one); 5b: 64 queues
# (each reader's records are about 1/32 of its shard's log).
s5_bytes=$((s5_msgs * 4096))
for v in a b; do
    if [ "$v" = a ]; then q=(--queues-per-shard 1); what="1 queue per shard"
    else q=(--queues 64); what="64 queues"; fi
    if want 5; then
        bench_run "s5$v-write" "catch-up log: $s5_msgs x 4 KiB, $what" "$work/s5$v-store" \
            --messages "$s5_msgs" --body 4096 "${q[@]}"
        bench_run "s5$v-catch-up" "catch-up read, $what, 256 per get" "$work/s5$v-store" \
            --mode catch-up --pull-batch 256
        rm -rf "${work:?}/s5$v-store"
    else skip "s5$v-write" "s5$v-catch-up"; fi
done

# Key queries (6): a store with s6_keys messages of one key each (128 B bodies),
# shut down, reopened, then random queries one at a time, each through the handle's
# all-shard query (1 in 100 for a key never written).
if want 6; then
    bench_run s6-write "key index: $s6_keys keys" "$work/s6-store" \
        --messages "$s6_keys" --body 128 --queues 64
    bench_run s6-key-queries "key queries over $s6_keys keys" "$work/s6-store" \
        --mode key-queries --messages "$s6_keys" --queues 64 --queries "$s6_queries"
    rm -rf "${work:?}/s6-store"
else skip s6-write s6-key-queries; fi

# Recovery (7): async flush, SIGKILL once every shard's log is flushed as far as it
# is written (dispatch, queues and index, may lag), then the open timed.
if want 7; then
    bench_run s7-write "recovery log: $s7_msgs x 1 KiB, killed" "$work/s7-store" \
        --messages "$s7_msgs" --body 1024 --queues 64 --kill-after-flush
    bench_run s7-recovery "abnormal recovery of $s7_msgs x 1 KiB" "$work/s7-store" \
        --mode recover
    rm -rf "${work:?}/s7-store"
else skip s7-write s7-recovery; fi

# Replication (8): 8a, a store of s8_msgs x 4 KiB written and shut down, then opened
# as a master and replicated whole to a new slave (another store in the same process,
# over loopback); 8b, sync flush at 1 and 256 puts outstanding, alone and as a
# SYNC_MASTER whose puts also wait for a slave's acknowledgement, in this run.
if want 8; then
    bench_run s8-write "replication log: $s8_msgs x 4 KiB" "$work/s8-store" \
        --messages "$s8_msgs" --body 4096 --queues 64
    bench_run s8-replicate "catch-up replication to an empty slave" "$work/s8-store" \
        --mode replicate
    rm -rf "${work:?}/s8-store" "${work:?}/s8-store-slave"
    for n in 1 256; do
        run "s8-sync-$n" "sync flush, 1 KiB, $n outstanding" \
            --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding "$n"
        run "s8-sync-master-$n" "sync flush + SYNC_MASTER slave, 1 KiB, $n outstanding" \
            --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding "$n" --slave
        rm -rf "${work:?}/s8-sync-master-$n-slave"
    done
else skip s8-write s8-replicate s8-sync-1 s8-sync-master-1 s8-sync-256 s8-sync-master-256; fi

# Timed messages (9): on a fresh store, plain puts then as many timed puts (the first
# of the s9_timed), then the rest, all due at random times over s9_spread seconds that
# start once every put is done; RSS while all are pending; then the delivered records'
# lateness (store timestamp - TIMER_OUT_MS) until all are read or s9_spread + 60 s.
if want 9; then
    run s9-timer "$s9_timed timed messages, 256 B, due over $s9_spread s" \
        --mode timer --timed "$s9_timed" --spread-secs "$s9_spread" --body 256 --queues 64
else skip s9-timer; fi

# The node (10): one `coremq serve` on a fresh store; every remote run's node CPU is
# the change of the node process's user + system time (/proc/<pid>/stat, all threads)
# across that run, divided by the messages acknowledged. Baselines in the same run:
# the embedded put's CPU per message (10-embedded), a loopback TCP echo server's round
# trip at one in flight (10-echo), the embedded catch-up read at 32 per get.
node_pid=""
stop_node() {
    if [ -n "$node_pid" ]; then
        kill -TERM "$node_pid" 2>/dev/null || true
        wait "$node_pid" 2>/dev/null || true
        node_pid=""
    fi
}
trap 'stop_node; cleanup' EXIT
# The node's CPU seconds so far: its `process_cpu_seconds_total` (getrusage, microseconds)
# from /metrics; `/proc/<pid>/stat` (10 ms ticks: 0.33% of a core over 3 s) if that fails.
node_cpu() {
    local v
    v=$(curl -s --max-time 2 "http://127.0.0.1:$metrics_port/metrics" 2>/dev/null |
        awk '$1 == "process_cpu_seconds_total" {print $2}')
    if [ -n "$v" ]; then echo "$v"
    else awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' "/proc/$node_pid/stat"; fi
}
# median_round NAME FIELD: NAME.json is the round (NAME-1..3.json) whose FIELD is the
# median, with every round's FIELD added as `rounds` (a failed round counts as missing).
median_round() {
    local name="$1" field="$2" pick
    pick=$(for k in 1 2 3; do
        v=$(jq -r "if .ok == false then empty else $field // empty end" "$detail/$name-$k.json" 2>/dev/null)
        [ -n "$v" ] && echo "$v $k"
    done | sort -g | awk '{v[NR] = $2} END {if (NR) print v[int((NR + 1) / 2)]}')
    if [ -z "$pick" ]; then pick=1; fi
    jq --argjson rounds "$(for k in 1 2 3; do jq "$field // null" "$detail/$name-$k.json" 2>/dev/null || echo null; done | jq -s .)" \
        '. + {rounds: $rounds}' "$detail/$name-$pick.json" >"$detail/$name.json"
}
# quiesce: wait (at most 10 s) until the node uses under 5% of a core over 250 ms, so
# the background work an earlier run left (flushes of the gigabytes a batched run wrote)
# is not counted as the next run's CPU.
quiesce() {
    local c0 c1 i
    for i in $(seq 40); do
        c0=$(node_cpu)
        sleep 0.25
        c1=$(node_cpu)
        if [ "$(echo "($c1 - $c0) < 0.0125" | bc -l)" = 1 ]; then return; fi
    done
    log "the node did not quiesce within 10 s"
}
# remote_run NAME LABEL TARGET ARGS...: one `coremq bench --target` run, the node's CPU
# added to its JSON.
remote_run() {
    local name="$1" label="$2" target="$3" c0 c1
    shift 3
    log "scenario $name: $label"
    rm -f "$detail/$name.json"
    c0=0
    if [ "$target" != echo ]; then
        quiesce
        c0=$(node_cpu)
    fi
    set +e
    timeout --signal=KILL "$limit" "$bin" bench --label "$label" --target "$target" \
        --json "$detail/$name.json" --quiet "$@" 2>&1 | tee "$detail/$name.log" >&2
    set -e
    # No message acknowledged (e.g. the node refusing puts on a full disk): a failure.
    if [ ! -s "$detail/$name.json" ] || [ "$(jq '.messages_acknowledged' "$detail/$name.json")" = 0 ]; then
        jq -n --arg lbl "$label" --arg why "$(tail -c 300 "$detail/$name.log")" \
            '{"label": $lbl, "ok": false, "failed": true, "first_error": $why}' >"$detail/$name.json"
        return
    fi
    if [ "$target" != echo ]; then
        c1=$(node_cpu)
        jq --argjson c "$(echo "$c1 - $c0" | bc -l)" \
            '. + {ok: (.messages_failed == 0), node_cpu_seconds: $c,
                  node_cpu_us_per_message: ($c * 1e6 / ([.messages_acknowledged, 1] | max))}' \
            "$detail/$name.json" >"$detail/$name.json.tmp"
        mv "$detail/$name.json.tmp" "$detail/$name.json"
    else
        jq '. + {ok: (.messages_failed == 0)}' "$detail/$name.json" >"$detail/$name.json.tmp"
        mv "$detail/$name.json.tmp" "$detail/$name.json"
    fi
}
# CPU against load (issue 22): the node's CPU per message at these offered rates, one
# curve (s10-cpu-vs-rate.{json,svg}); it should fall, never rise, as the rate grows.
s10_rates=(1000 3000 10000 30000 100000)
s10_names="s10-embedded s10-handle-1k s10-catch-up-write s10-catch-up s10-echo s10-echo-pipelined s10-idle s10-rate1k s10-heartbeat-1k s10-single s10-single-binary s10-single-routed s10-batch s10-one s10-pull ${s10_rates[*]/#/s10-rate-} s10-cpu-vs-rate"
if want 10; then
    bench_run s10-catch-up-write "catch-up log: $s10_msgs x 1 KiB" "$work/s10-store" \
        --messages "$s10_msgs" --body 1024 --queues 8
    bench_run s10-catch-up "catch-up read, 8 queues, 32 per get" "$work/s10-store" \
        --mode catch-up --pull-batch 32
    rm -rf "${work:?}/s10-store"
    # Issue 22's light load for an embedded store: 1,000 puts a second from one outside
    # thread through the handle, the shard threads' CPU (`shard_core_share`) beside the
    # node's at the same rate; after an unmeasured second (`--warm-up`: a fresh store's
    # first use costs ~50 ms of CPU once, 1.7 points of a core over --quick's 3 s).
    run s10-handle-1k "embedded through the handle: 1,000 msg/s offered, 1 KiB" \
        --duration "$secs" --body 1024 --queues 8 --via handle --producers 1 --outstanding 8 --rate 1000 \
        --warm-up 1
    remote_run s10-echo "loopback TCP echo, 1 KiB, 1 in flight" echo \
        --duration "$secs" --body 1024 --producers 1 --outstanding 1
    # The same echo under the single sends' load (4 x 64): the kernel's loopback share of
    # a server's CPU per message at that pipelining, the floor under the node's figure
    # (it writes back each 1 KiB request, more than a send's answer).
    remote_run s10-echo-pipelined "loopback TCP echo, 1 KiB, 4 x 64 outstanding" echo \
        --duration "$secs" --body 1024 --producers 4 --outstanding 64
    # A node on fresh ports in data directory $1, its log in $2.
    start_node() {
        port=$((20000 + RANDOM % 20000))
        metrics_port=$((port + 2))
        "$bin" serve --data-dir "$1" --listen "127.0.0.1:$port" \
            --namesrv-listen "127.0.0.1:$((port + 1))" --metrics-listen "127.0.0.1:$metrics_port" \
            --ha-listen "127.0.0.1:$((port + 3))" --shard-listen "127.0.0.1:$((port + 10))" 2>"$2" &
        node_pid=$!
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
            sleep 0.1
        done
    }
    start_node "$work/s10-node" "$detail/s10-node.log"
    # Idle (issue 22): the node's CPU over a quiet spell, as a share of one core, and
    # how often its threads woke (their voluntary switches: the count this machine's
    # speed does not move, where a wake-up's CPU cost moves 5x between its hours). The
    # CPU from its threads' schedstat (ns), not `node_cpu`: a `/metrics` scrape costs
    # the node 3-4 ms of CPU (13 ms the first), 0.1-0.3% of a core over 3 s.
    log "scenario s10-idle: node idle for $secs s"
    sleep 2
    node_wakes() {
        cat /proc/"$node_pid"/task/*/status 2>/dev/null |
            awk '$1 == "voluntary_ctxt_switches:" {s += $2} END {print s + 0}'
    }
    node_threads_cpu() {
        cat /proc/"$node_pid"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.9f\n", s / 1e9}'
    }
    c0=$(node_threads_cpu)
    w0=$(node_wakes)
    sleep "$secs"
    w1=$(node_wakes)
    c1=$(node_threads_cpu)
    jq -n --argjson c "$(echo "$c1 - $c0" | bc -l)" --argjson s "$secs" --argjson w "$((w1 - w0))" \
        '{label: "node: idle", ok: true, node_cpu_seconds: $c, seconds: $s, core_share: ($c / $s),
          wakeups_per_sec: ($w / $s)}' \
        >"$detail/s10-idle.json"
    # A light load (issue 22): 1,000 sends a second offered, one producer, measured on
    # a warm node (one unrecorded second first): the first run on a fresh node costs
    # more, once (the same 1 s run took 109-127 ms of node CPU first, 56-75 ms after;
    # +21-28 us a message over --quick's 3 s; docs/performance/node.md).
    "$bin" bench --target "127.0.0.1:$port" --follow-route --duration 1 --body 1024 \
        --queues 8 --producers 1 --outstanding 8 --rate 1000 --quiet >/dev/null 2>&1 || true
    remote_run s10-rate1k "node: 1,000 msg/s offered, 1 KiB" "127.0.0.1:$port" --follow-route \
        --duration "$secs" --body 1024 --queues 8 --producers 1 --outstanding 8 --rate 1000
    # The same pace of requests the node answers without the store (a producer's
    # HEART_BEAT): what any request costs the node at this rate, under the send's.
    remote_run s10-heartbeat-1k "node: 1,000 heartbeats/s offered (no store work)" "127.0.0.1:$port" \
        --follow-route --duration "$secs" --queues 8 --producers 1 --outstanding 8 --rate 1000 \
        --request heartbeat
    # Issue 20's ratio: the node's single sends against the embedded put, three rounds
    # interleaved (the idle node waits while the embedded store runs), each side taken at
    # its median round: one run of either moved by a third between minutes of this shared
    # machine, and the ratio of two runs minutes apart with it (2.08 and 3.12 in one hour).
    for k in 1 2 3; do
        run "s10-embedded-$k" "embedded async puts, 1 KiB, 8 queues (round $k)" \
            --duration "$secs" --body 1024 --queues 8
        remote_run "s10-single-$k" "node: single sends, 1 KiB, 4 x 64 outstanding (round $k)" \
            "127.0.0.1:$port" --follow-route --duration "$secs" --body 1024 --queues 8 \
            --producers 4 --outstanding 64
        # The same in RocketMQ's binary header layout (`serializeType` ROCKETMQ, which a
        # Java client chooses with `rocketmq.serialize.type`): the node answers in kind.
        remote_run "s10-single-binary-$k" "node: single sends, binary headers, 1 KiB, 4 x 64 outstanding (round $k)" \
            "127.0.0.1:$port" --follow-route --duration "$secs" --body 1024 --queues 8 \
            --producers 4 --outstanding 64 --header-format rocketmq
    done
    median_round s10-embedded .cpu_us_per_message
    median_round s10-single .node_cpu_us_per_message
    median_round s10-single-binary .node_cpu_us_per_message
    remote_run s10-single-routed "node's own port: single sends, 1 KiB, 4 x 64 outstanding" \
        "127.0.0.1:$port" --duration "$secs" --body 1024 --queues 8 --producers 4 --outstanding 64
    remote_run s10-batch "node: batched sends, 32 x 1 KiB, 4 x 8 outstanding" "127.0.0.1:$port" \
        --follow-route --duration "$secs" --body 1024 --queues 8 --producers 4 --outstanding 8 --batch 32
    remote_run s10-one "node: one send in flight, 1 KiB" "127.0.0.1:$port" --follow-route \
        --duration "$secs" --body 1024 --queues 8 --producers 1 --outstanding 1
    for r in "${s10_rates[@]}"; do
        remote_run "s10-rate-$r" "node: $r msg/s offered, 1 KiB, 4 x 64 outstanding" "127.0.0.1:$port" \
            --follow-route --duration "$secs" --body 1024 --queues 8 --producers 4 --outstanding 64 --rate "$r"
    done
    stop_node
    rm -rf "${work:?}/s10-node"
    # The read-back: s10_msgs, then pulls 32 at a time from offset 0 of every queue, on
    # a node of its own. On the node above the queues also held every earlier run's
    # messages (over a million, mostly no longer in the write pools), so the read-back
    # read those too and its rate swung with how much they had written (0.16-0.84 of
    # the embedded catch-up, which reads s10_msgs of a fresh store).
    start_node "$work/s10-pull-node" "$detail/s10-pull-node.log"
    remote_run s10-pull "node: pull read-back, 32 per request" "127.0.0.1:$port" \
        --messages "$s10_msgs" --body 1024 --queues 8 --topics 2 --producers 4 \
        --outstanding 64 --consumers
    stop_node
    rm -rf "${work:?}/s10-pull-node"
    s10_files=()
    for r in "${s10_rates[@]}"; do s10_files+=("$detail/s10-rate-$r.json"); done
    jq -s --argjson rates "$(printf '%s\n' "${s10_rates[@]}" | jq -s .)" \
        '[range(0; length) as $i | .[$i] as $r | {offered_per_sec: $rates[$i],
            achieved_per_sec: $r.messages_per_sec, ok: ($r.ok // false),
            node_cpu_us_per_message: $r.node_cpu_us_per_message,
            node_core_share: (($r.node_cpu_seconds // 0) / ([$r.seconds // 0, 0.001] | max)),
            client_cpu_us_per_message: $r.client_cpu_us_per_message,
            send_latency_us: $r.send_latency_us}] as $points
        | [$points[] | .node_cpu_us_per_message | select(. != null)] as $c
        | {label: "node CPU per message against offered load", ok: all($points[]; .ok),
           failed: all($points[]; .ok | not),
           falls_as_load_grows: ([range(1; $c | length) | $c[.] <= $c[. - 1]] | all),
           # Where it rose most from one rate to the next (a flat stretch rises or falls
           # by the run-to-run noise of a 3 s point: both are shown).
           largest_rise: ([$points[] | select(.node_cpu_us_per_message != null)] as $p
               | [range(1; $p | length) | {from: $p[. - 1].offered_per_sec,
                   to: $p[.].offered_per_sec,
                   rise: ($p[.].node_cpu_us_per_message / $p[. - 1].node_cpu_us_per_message - 1)}]
               | max_by(.rise)),
           points: $points}' "${s10_files[@]}" >"$detail/s10-cpu-vs-rate.json"
    # The curve: node CPU µs per message (log) against the offered rate (log).
    jq -r '.points[] | select(.node_cpu_us_per_message != null)
        | [.offered_per_sec, .node_cpu_us_per_message] | @tsv' "$detail/s10-cpu-vs-rate.json" |
        awk -F'\t' -v title="coremq node: CPU per message against offered load (1 KiB sends)" '
        function lg(v) { return log(v) / log(10) }
        function x(r) { return left + (lg(r) - 3) / 2 * pw }
        function y(v) { if (v < 0.1) v = 0.1; return top + ph - (lg(v) - lo) / (hi - lo) * ph }
        { n++; r[n] = $1; c[n] = $2; if (max == "" || $2 > max) max = $2; if (min == "" || $2 < min) min = $2 }
        END {
            w = 760; h = 480; left = 80; right = 40; top = 50; bottom = 60; pw = w - left - right; ph = h - top - bottom
            if (min == "") { min = 1; max = 100 }
            lo = int(lg(min < 0.1 ? 0.1 : min)); if (10 ^ lo > min) lo--
            hi = int(lg(max < 1 ? 1 : max)); if (10 ^ hi < max) hi++; if (hi <= lo) hi = lo + 1
            printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", w, h, w, h
            printf "<rect width=\"%d\" height=\"%d\" fill=\"white\"/><text x=\"%.1f\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", w, h, left + pw / 2, title
            for (d = 3; d <= 5; d++)
                printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s msg/s</text>\n", x(10 ^ d), top, x(10 ^ d), top + ph, x(10 ^ d), top + ph + 18, (d == 3 ? "1k" : d == 4 ? "10k" : "100k")
            for (d = lo; d <= hi; d++)
                printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s µs</text>\n", left, y(10 ^ d), left + pw, y(10 ^ d), left - 6, y(10 ^ d) + 4, 10 ^ d
            printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">offered load</text>\n", left + pw / 2, h - 15
            printf "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">node CPU per message</text>\n", top + ph / 2, top + ph / 2
            printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\"/>\n", left, top, pw, ph
            pts = ""; dots = ""
            for (i = 1; i <= n; i++) {
                pts = pts sprintf("%.1f,%.1f ", x(r[i]), y(c[i]))
                dots = dots sprintf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#1f77b4\"/>", x(r[i]), y(c[i]))
            }
            if (pts != "") printf "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"%s\"/>%s\n", pts, dots
            print "</svg>"
        }' >"$detail/s10-cpu-vs-rate.svg"
else
    # shellcheck disable=SC2086
    skip $s10_names
fi

# Latency against load (11, issue 23): scenario 4's open loop (async 1 KiB puts, 64
# queues, tailing consumers) offered at 10, 25, 50, 75 and 90% of the closed-loop rate
# of the same workload measured first in this run (s11-capacity), one run per point;
# put p50/p99/p99.9 and end-to-end p99 against the offered load, gathered in
# s11-latency-vs-load.{json,svg}.
s11_pcts=(10 25 50 75 90)
s11_floors=(10 50)
s11_names="s11-capacity ${s11_pcts[*]/#/s11-} ${s11_floors[*]/#/s11-floor-}"
if want 11; then
    # The closed loop runs the points' workload, tailing consumers included: without
    # them (scenario 1) the store took twice what it sustains with them on these two
    # CPUs, and the 75% and 90% points only measured an overload.
    run s11-capacity "async flush, 1 KiB, all shards, 64 queues, tailing consumers (closed loop for 11)" \
        --duration "$secs" --body 1024 --queues 64 --consumers --drain-timeout 10
    s11_cap=$(jq '(.messages_per_sec // 0) | floor' "$detail/s11-capacity.json")
    s11_from="s11-capacity, with consumers"
    s11_rates=()
    for p in "${s11_pcts[@]}"; do
        rate=$((s11_cap * p / 100))
        s11_rates+=("$rate")
        if [ "$rate" -gt 0 ]; then
            run "s11-$p" "async flush, 1 KiB, tailing consumers, $p% of closed loop ($rate msg/s)" \
                --duration "$secs" --body 1024 --queues 64 --consumers --rate "$rate" \
                --drain-timeout 10
        else
            jq -n --arg lbl "$p% of closed loop" \
                '{"label": $lbl, "ok": false, "failed": true, "first_error": "no closed-loop rate"}' \
                >"$detail/s11-$p.json"
        fi
    done
    # The floor: the same schedule (no consumers: they would wait for nothing), each
    # slot timed as a put and nothing put.
    for p in "${s11_floors[@]}"; do
        rate=$((s11_cap * p / 100))
        if [ "$rate" -gt 0 ]; then
            run "s11-floor-$p" "the schedule of $p% of closed loop ($rate msg/s), nothing put (floor)" \
                --duration "$secs" --body 1024 --queues 64 --rate "$rate" --pace-only
        else skip "s11-floor-$p"; fi
    done
    s11_files=()
    for p in "${s11_pcts[@]}"; do s11_files+=("$detail/s11-$p.json"); done
    jq -s --argjson cap "$s11_cap" --arg from "$s11_from" \
        --argjson pcts "$(printf '%s\n' "${s11_pcts[@]}" | jq -s .)" \
        --argjson rates "$(printf '%s\n' "${s11_rates[@]}" | jq -s .)" \
        '[range(0; length) as $i | .[$i] as $r | {
            name: "s11-\($pcts[$i])", percent: $pcts[$i], offered_per_sec: $rates[$i],
            achieved_per_sec: $r.messages_per_sec, ok: ($r.ok // false),
            failed: ($r.failed // false), first_error: $r.first_error,
            put_latency_us: $r.put_latency_us, e2e_latency_us: $r.e2e_latency_us,
            put_start_late_us: $r.put_start_late_us, put_service_us: $r.put_service_us,
            consumed_while_producing: $r.consumed_while_producing, messages: $r.messages,
            cpu_us_per_message: $r.cpu_us_per_message}] as $points
        | {label: "latency vs load (async 1 KiB, tailing consumers)",
           closed_loop_messages_per_sec: $cap, closed_loop_from: $from,
           ok: ($cap > 0 and all($points[]; .ok)),
           failed: ($cap <= 0 or all($points[]; .failed)),
           first_error: (if $cap <= 0 then "no closed-loop rate (\($from))"
               else first($points[] | select(.ok | not) | "\(.name): \(.first_error // "see its JSON")") // null end),
           points: $points}' \
        "${s11_files[@]}" >"$detail/s11-latency-vs-load.json"
    # The curves: put p99, put p99.9 and end-to-end p99 (log µs) against the offered
    # load (% of the closed-loop rate).
    jq -r '.points[] | select(.put_latency_us != null)
        | [.percent, .put_latency_us.p99, .put_latency_us.p99_9, (.e2e_latency_us.p99 // -1),
           .put_latency_us.p50] | @tsv' "$detail/s11-latency-vs-load.json" |
        awk -F'\t' -v title="coremq: latency vs load (async 1 KiB, 64 queues, tailing consumers)" \
            -v subtitle="closed loop $(printf "%'d" "$s11_cap") msg/s ($s11_from); $secs s per point" '
        function y(v) { if (v < 1e-3) v = 1e-3; return top + ph - (log(v) / log(10) - lo) / (hi - lo) * ph }
        function x(p) { return left + p / 100 * pw }
        { n++; pc[n] = $1; v[1, n] = $5; v[2, n] = $2; v[3, n] = $3; v[4, n] = $4
          for (c = 1; c <= 4; c++) if (v[c, n] > 0) { if (min == "" || v[c, n] < min) min = v[c, n]; if (v[c, n] > max) max = v[c, n] } }
        END {
            w = 900; h = 540; left = 80; right = 170; top = 64; bottom = 60; pw = w - left - right; ph = h - top - bottom
            if (min == "") { min = 1; max = 1000 }
            lo = int(log(min < 0.1 ? 0.1 : min) / log(10)); if (10 ^ lo > min) lo--
            hi = int(log(max < 1 ? 1 : max) / log(10)); if (10 ^ hi < max) hi++; if (hi <= lo) hi = lo + 1
            printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", w, h, w, h
            printf "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", w, h
            printf "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">%s</text><text x=\"%.1f\" y=\"44\" text-anchor=\"middle\">%s</text>\n", left + pw / 2, title, left + pw / 2, subtitle
            for (p = 0; p <= 100; p += 10)
                printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d%%</text>\n", x(p), top, x(p), top + ph, x(p), top + ph + 18, p
            printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">offered load (%% of the closed-loop rate)</text>\n", left + pw / 2, h - 15
            for (d = lo; d <= hi; d++) {
                val = 10 ^ d
                if (val >= 1e6) lbl = (val / 1e6) " s"; else if (val >= 1e3) lbl = (val / 1e3) " ms"; else lbl = val " µs"
                printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left, y(val), left + pw, y(val), left - 6, y(val) + 4, lbl
            }
            printf "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">latency</text>\n", top + ph / 2, top + ph / 2
            printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\"/>\n", left, top, pw, ph
            split("put p50|put p99|put p99.9|end-to-end p99", name, "|"); split("#999|#1f77b4|#d62728|#2ca02c", color, "|")
            for (c = 1; c <= 4; c++) {
                pts = ""; dots = ""
                for (i = 1; i <= n; i++) if (v[c, i] > 0) {
                    pts = pts sprintf("%.1f,%.1f ", x(pc[i]), y(v[c, i]))
                    dots = dots sprintf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>", x(pc[i]), y(v[c, i]), color[c])
                }
                if (pts != "") printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>%s\n", color[c], pts, dots
                ly = top + 20 + 28 * (c - 1); lx = left + pw + 15
                printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">%s</text>\n", lx, ly, lx + 25, ly, color[c], lx + 32, ly + 4, name[c]
            }
            print "</svg>"
        }' >"$detail/s11-latency-vs-load.svg"
else
    # shellcheck disable=SC2086
    skip $s11_names s11-latency-vs-load
fi

# ---------------------------------------------------------------------------------
# report

j() { jq -r "$2" "$detail/$1.json"; }
failed() { [ "$(j "$1" '.failed // false')" = true ]; }
skipped() { [ "$(j "$1" '.skipped // false')" = true ]; }
# "; problem: ..." when a run found problems.
problem() { j "$1" 'if .ok then "" else "; **problem: \(.first_error // "see JSON")**" end'; }
fmt() { printf "%'.${2:-0}f" "$1"; }
ratio() { echo "scale=2; $1 / $2" | bc -l | sed 's/^\./0./'; }
mb() { echo "$1 / 1000000" | bc -l; }

write_mb=$(mb "$write_bw")
read_mb=$(mb "$read_bw")

machine="$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), \
$(free -g | awk '/Mem:/ {print $2}') GiB RAM, Linux $(uname -r), \
$(df -T "$work" | awk 'NR==2 {print $2 " on " $1}')"

row() { printf '| %s | %s | %s | %s |\n' "$@"; }
# scenario NAME TITLE BASELINE RESULT-FUNCTION RATIO-FUNCTION: a row, or the failure.
scenario() {
    if skipped "$1"; then
        row "$2" "skipped (--only $only)" "$3" "-"
    elif failed "$1"; then
        row "$2" "**failed: $(j "$1" .first_error)**" "$3" "-"
    else
        row "$2" "$("$4")$(problem "$1")" "$3" "$("$5")"
    fi
}

s1_result() {
    echo "$(fmt "$(j s1-async-1k .messages_per_sec)") msg/s, $(fmt "$(j s1-async-1k .mb_per_sec)" 1) MB/s" \
        "($(fmt "$(j s1-async-1k .log_mb_per_sec)" 1) MB/s log); put p99 $(fmt "$(j s1-async-1k .put_latency_us.p99)" 1) µs;" \
        "$(fmt "$(j s1-async-1k .cpu_us_per_message)" 2) µs CPU/msg ($(fmt "$(j s1-async-1k .producing_cpu_us_per_message)" 2) while producing);" \
        "dispatch up to $(fmt "$(j s1-async-1k '.max_dispatch_lag_bytes / 1e6')" 0) MB behind"
}
s1_ratio() { ratio "$(j s1-async-1k .mb_per_sec)" "$write_mb"; }
s1b_result() {
    echo "$(fmt "$(j s1b-handle .messages_per_sec)") msg/s, $(fmt "$(j s1b-handle .mb_per_sec)" 1) MB/s;" \
        "put p50 $(fmt "$(j s1b-handle .put_latency_us.p50)" 1) µs, p99 $(fmt "$(j s1b-handle .put_latency_us.p99)" 1) µs;" \
        "$(fmt "$(j s1b-handle .cpu_us_per_message)" 2) µs CPU/msg"
}
s1b_ratio() {
    echo "$(ratio "$(j s1b-handle .mb_per_sec)" "$write_mb") of fio;" \
        "$(ratio "$(j s1b-handle .messages_per_sec)" "$(j s1-async-1k '[.messages_per_sec, 1] | max')") of 1"
}
s1c_result() {
    echo "$(fmt "$(j s1c-handle .messages_per_sec)") msg/s through the handle at" \
        "$(fmt "$(j s1c-handle .cpu_us_per_message)" 2) µs CPU/msg (both threads);" \
        "$(fmt "$(j s1c-local .messages_per_sec)") msg/s on the shard at $(fmt "$(j s1c-local .cpu_us_per_message)" 2) µs"
}
s1c_ratio() {
    echo "$(ratio "$(j s1c-handle .messages_per_sec)" "$(j s1c-local '[.messages_per_sec, 1] | max')") of the shard alone"
}
s2_result() {
    echo "$(fmt "$(j s2-async-16k .messages_per_sec)") msg/s, $(fmt "$(j s2-async-16k .mb_per_sec)" 1) MB/s" \
        "($(fmt "$(j s2-async-16k .log_mb_per_sec)" 1) MB/s log); put p99 $(fmt "$(j s2-async-16k .put_latency_us.p99)" 1) µs"
}
s2_ratio() { ratio "$(j s2-async-16k .mb_per_sec)" "$write_mb"; }
s3_result() {
    echo "$(fmt "$(j s3-sync-1k .messages_per_sec)") msg/s; put p50 $(fmt "$(j s3-sync-1k .put_latency_us.p50)" 1) µs," \
        "p99 $(fmt "$(j s3-sync-1k .put_latency_us.p99)" 1) µs"
}
s3_ratio() { echo "$(ratio "$(j s3-sync-1k .put_latency_us.p99)" "$fsync_p99") (p99)"; }
s3b_result() {
    echo "$(fmt "$(j s3b-sync-1 .messages_per_sec)") msg/s; put p50 $(fmt "$(j s3b-sync-1 .put_latency_us.p50)" 1) µs," \
        "p99 $(fmt "$(j s3b-sync-1 .put_latency_us.p99)" 1) µs"
}
s3b_ratio() {
    echo "$(ratio "$(j s3b-sync-1 .put_latency_us.p50)" "$fsync_p50") (p50), $(ratio "$(j s3b-sync-1 .put_latency_us.p99)" "$fsync_p99") (p99)"
}
s3c_result() {
    echo "new: $(fmt "$(j s3c-fresh .messages_per_sec)") msg/s, p50 $(fmt "$(j s3c-fresh .put_latency_us.p50)" 1) µs," \
        "p99 $(fmt "$(j s3c-fresh .put_latency_us.p99)" 1) µs; recycled: $(fmt "$(j s3c-recycled .messages_per_sec)") msg/s," \
        "p50 $(fmt "$(j s3c-recycled .put_latency_us.p50)" 1) µs, p99 $(fmt "$(j s3c-recycled .put_latency_us.p99)" 1) µs"
}
s3c_ratio() {
    echo "recycled/new p50 $(ratio "$(j s3c-recycled .put_latency_us.p50)" "$(j s3c-fresh .put_latency_us.p50)")," \
        "p99 $(ratio "$(j s3c-recycled .put_latency_us.p99)" "$(j s3c-fresh .put_latency_us.p99)");" \
        "recycled p50 $(ratio "$(j s3c-recycled .put_latency_us.p50)" "$fsync_p50") of fio"
}
s4_result() {
    echo "$(fmt "$(j s4-consumers .messages_per_sec)") msg/s put; end-to-end p50" \
        "$(fmt "$(j s4-consumers .e2e_latency_us.p50)" 1) µs, p99 $(fmt "$(j s4-consumers .e2e_latency_us.p99)" 1) µs"
}
s4_ratio() {
    echo "$(ratio "$(j s4-consumers '.consumed_while_producing / ([.messages, 1] | max)')" 1) read while producing"
}

s5_result() {
    local n="s5$1-catch-up"
    echo "$(fmt "$(j "$n" .mb_per_sec)" 1) MB/s, $(fmt "$(j "$n" .messages_per_sec)") msg/s" \
        "($(fmt "$(j "$n" '.log_size_bytes / 1e6')") MB log, $(j "$n" .queues) queues);" \
        "get p99 $(fmt "$(j "$n" '.get_latency_us.p99 / 1000')" 1) ms;" \
        "peak RSS $(fmt "$(j "$n" '.peak_rss_bytes / 1048576')") MiB"
}
s5a_result() { s5_result a; }
s5b_result() { s5_result b; }
s5a_ratio() { ratio "$(j s5a-catch-up .mb_per_sec)" "$read_mb"; }
s5b_ratio() { ratio "$(j s5b-catch-up .mb_per_sec)" "$read_mb"; }
s6_result() {
    echo "$(fmt "$(j s6-key-queries .keys)") keys, $(fmt "$(j s6-key-queries .queries)") queries:" \
        "p50 $(fmt "$(j s6-key-queries .query_latency_us.p50)") µs, p99 $(fmt "$(j s6-key-queries .query_latency_us.p99)") µs," \
        "p99.9 $(fmt "$(j s6-key-queries .query_latency_us.p99_9)") µs, max $(fmt "$(j s6-key-queries '.query_latency_us.max / 1000')" 1) ms;" \
        "misses p99 $(fmt "$(j s6-key-queries '.miss_latency_us.p99 // 0')") µs;" \
        "peak RSS $(fmt "$(j s6-key-queries '.peak_rss_bytes / 1048576')") MiB"
}
s6_ratio() {
    echo "$(ratio "$(j s6-key-queries .query_latency_us.p99)" 1000) (p99 / 1 ms);" \
        "$(ratio "$(j s6-key-queries .query_latency_us.p99)" "$rr99") (p99 / fio random-read p99)"
}
# fio's time to read the recovered log's bytes.
s7_fio_secs() { echo "$(j s7-recovery .log_bytes) / $read_bw" | bc -l; }
s7_result() {
    echo "open $(fmt "$(j s7-recovery .open_seconds)" 2) s for $(fmt "$(j s7-recovery '.log_bytes / 1e6')") MB of log" \
        "($(j s7-recovery 'if .abnormal then "abnormal" else "NOT abnormal" end');" \
        "$(fmt "$(j s7-recovery .records_scanned)") records scanned, $(fmt "$(j s7-recovery .entries_rebuilt)") queue entries rebuilt);" \
        "fio reads as much in $(fmt "$(s7_fio_secs)" 2) s; peak RSS $(fmt "$(j s7-recovery '.peak_rss_bytes / 1048576')") MiB"
}
s7_ratio() { ratio "$(j s7-recovery .open_seconds)" "$(s7_fio_secs)"; }
s8a_result() {
    echo "$(fmt "$(j s8-replicate .log_mb_per_sec)" 1) MB/s of log" \
        "($(fmt "$(j s8-replicate '.log_bytes / 1e6')") MB in $(fmt "$(j s8-replicate .seconds)" 2) s)"
}
s8a_ratio() { ratio "$(j s8-replicate .log_mb_per_sec)" "$write_mb"; }
s8_lat() { echo "p50 $(fmt "$(j "$1" .put_latency_us.p50)" 1) µs, p99 $(fmt "$(j "$1" .put_latency_us.p99)" 1) µs"; }
s8b_result() {
    echo "1 outstanding: $(s8_lat s8-sync-master-1) (alone $(s8_lat s8-sync-1));" \
        "256: $(s8_lat s8-sync-master-256), $(fmt "$(j s8-sync-master-256 .messages_per_sec)") msg/s" \
        "(alone $(s8_lat s8-sync-256), $(fmt "$(j s8-sync-256 .messages_per_sec)") msg/s)"
}
s8b_ratio() {
    echo "$(ratio "$(j s8-sync-master-1 .put_latency_us.p50)" "$(j s8-sync-1 '[.put_latency_us.p50, 0.001] | max')") (p50, 1)," \
        "$(ratio "$(j s8-sync-master-256 .put_latency_us.p99)" "$(j s8-sync-256 '[.put_latency_us.p99, 0.001] | max')") (p99, 256)"
}

s9_result() {
    echo "timed puts $(fmt "$(j s9-timer '.timed_first.messages_per_sec // 0')") msg/s," \
        "$(fmt "$(j s9-timer '.timed_first.cpu_us_per_message // 0')" 2) µs CPU/msg" \
        "(all $(fmt "$(j s9-timer '.timed_all.cpu_us_per_message // 0')" 2));" \
        "$(fmt "$(j s9-timer '.timed_stored // 0')") pending: RSS $(fmt "$(j s9-timer '(.memory.after_timed_puts.rss_bytes // 0) / 1048576')") MiB" \
        "(after the plain puts $(fmt "$(j s9-timer '(.memory.after_plain_puts.rss_bytes // 0) / 1048576')") MiB);" \
        "delivered $(fmt "$(j s9-timer '.delivery.delivered // 0')"), lateness p50 $(j s9-timer '.delivery.lateness_ms.p50 // "-"') ms," \
        "p99 $(j s9-timer '.delivery.lateness_ms.p99 // "-"') ms, p99.9 $(j s9-timer '.delivery.lateness_ms.p99_9 // "-"') ms," \
        "max $(j s9-timer '.delivery.lateness_ms.max // "-"') ms; $(fmt "$(j s9-timer '.delivery.messages_per_sec // 0')") msg/s delivered" \
        "($(fmt "$(j s9-timer '.delivery.offered_per_sec // 0')") due)"
}
s9_baseline() {
    echo "plain puts, same run: $(fmt "$(j s9-timer '.plain.messages_per_sec // 0')") msg/s," \
        "$(fmt "$(j s9-timer '.plain.cpu_us_per_message // 0')" 2) µs CPU/msg;" \
        "timer bound $(fmt "$(j s9-timer '(.memory.timer_bound_bytes // 0) / 1048576')" 1) MiB"
}
s9_ratio() {
    echo "timed/plain CPU/msg $(fmt "$(j s9-timer '.timed_to_plain.cpu_per_message_ratio // 0')" 2)," \
        "msg/s $(fmt "$(j s9-timer '.timed_to_plain.messages_per_sec_ratio // 0')" 2)"
}
s10_result() {
    echo "single: $(fmt "$(j s10-single .messages_per_sec)") msg/s, node $(fmt "$(j s10-single .node_cpu_us_per_message)" 2) µs CPU/msg" \
        "(median of rounds $(j s10-single '[.rounds[]? // 0 | . * 100 | round / 100] | map(tostring) | join(", ")');" \
        "client $(fmt "$(j s10-single .client_cpu_us_per_message)" 2)); binary headers: $(fmt "$(j s10-single-binary .messages_per_sec)") msg/s," \
        "node $(fmt "$(j s10-single-binary .node_cpu_us_per_message)" 2) µs CPU/msg; on the node's own port (routed):" \
        "$(fmt "$(j s10-single-routed .messages_per_sec)") msg/s, node $(fmt "$(j s10-single-routed .node_cpu_us_per_message)" 2) µs CPU/msg; batched: $(fmt "$(j s10-batch .messages_per_sec)") msg/s," \
        "node $(fmt "$(j s10-batch .node_cpu_us_per_message)" 2) µs CPU/msg; one in flight: p50 $(fmt "$(j s10-one .send_latency_us.p50)") µs," \
        "p99 $(fmt "$(j s10-one .send_latency_us.p99)") µs, node $(fmt "$(j s10-one .node_cpu_us_per_message)" 1) µs CPU/msg;" \
        "pull read-back $(fmt "$(j s10-pull '.read_back_per_sec // 0')") msg/s;" \
        "idle $(fmt "$(j s10-idle '(.core_share // 0) * 100')" 2)% of a core ($(fmt "$(j s10-idle '.wakeups_per_sec // 0')" 1) wake-ups a second); at 1,000 msg/s offered" \
        "$(fmt "$(j s10-rate1k '(.node_cpu_seconds // 0) * 100 / ([.seconds // 1, 0.001] | max)')" 1)% of a core," \
        "$(fmt "$(j s10-rate1k '.node_cpu_us_per_message // 0')" 1) µs CPU/msg (a heartbeat at the same pace:" \
        "$(fmt "$(j s10-heartbeat-1k '.node_cpu_us_per_message // 0')" 1) µs CPU/request, no store work; embedded through the handle: shard threads" \
        "$(fmt "$(j s10-handle-1k '(.shard_core_share // 0) * 100')" 1)% of a core, $(fmt "$(j s10-handle-1k '.shard_cpu_us_per_message // 0')" 1) µs/msg);" \
        "CPU/msg against offered msg/s (4 x 64):" \
        "$(jq -r '[.points[]? | "\(.offered_per_sec): \((.node_cpu_us_per_message // 0) * 10 | floor / 10)"] | join(", ")' "$detail/s10-cpu-vs-rate.json")" \
        "(falls as load grows: $(j s10-cpu-vs-rate '.falls_as_load_grows | tostring')$(j s10-cpu-vs-rate 'if .falls_as_load_grows or .largest_rise == null then "" else "; largest rise +\(.largest_rise.rise * 1000 | round / 10)%, \(.largest_rise.from) -> \(.largest_rise.to) msg/s" end'))"
}
s10_baseline() {
    echo "embedded put $(fmt "$(j s10-embedded .cpu_us_per_message)" 2) µs CPU/msg" \
        "(median of rounds $(j s10-embedded '[.rounds[]? // 0 | . * 100 | round / 100] | map(tostring) | join(", ")'));" \
        "echo p50 $(fmt "$(j s10-echo .send_latency_us.p50)") µs, echo server $(fmt "$(j s10-echo '.echo_server_cpu_us_per_message // 0')" 1) µs CPU/msg" \
        "($(fmt "$(j s10-echo-pipelined '.echo_server_cpu_us_per_message // 0')" 2) µs at 4 x 64);" \
        "embedded catch-up $(fmt "$(j s10-catch-up .messages_per_sec)") msg/s"
}
s10_ratio() {
    echo "CPU/msg $(ratio "$(j s10-single .node_cpu_us_per_message)" "$(j s10-embedded .cpu_us_per_message)") (single)," \
        "$(ratio "$(j s10-single-binary .node_cpu_us_per_message)" "$(j s10-embedded .cpu_us_per_message)") (single, binary headers)," \
        "$(ratio "$(j s10-batch .node_cpu_us_per_message)" "$(j s10-embedded .cpu_us_per_message)") (batched) of embedded (goal <= 2);" \
        "p50 $(ratio "$(j s10-one .send_latency_us.p50)" "$(j s10-echo '[.send_latency_us.p50, 1] | max')") of echo (goal <= 2);" \
        "one in flight CPU/msg $(ratio "$(j s10-one .node_cpu_us_per_message)" "$(j s10-echo '[.echo_server_cpu_us_per_message // 0, 0.001] | max')") of the echo server's;" \
        "pull $(ratio "$(j s10-pull '.read_back_per_sec // 0')" "$(j s10-catch-up '[.messages_per_sec, 1] | max')") of catch-up (goal >= 0.5)"
}
# lat US: a latency in µs, ms or s, 2 or 3 significant figures.
lat() {
    awk -v v="$1" 'BEGIN {
        if (v >= 1e6) printf "%.1f s", v / 1e6
        else if (v >= 1e4) printf "%.0f ms", v / 1e3
        else if (v >= 1e3) printf "%.1f ms", v / 1e3
        else printf "%.0f µs", v }'
}
s11_result() {
    local p n out="offered → achieved msg/s: put p50 / p99 / p99.9, e2e p99 at"
    for p in "${s11_pcts[@]}"; do
        n="s11-$p"
        if failed "$n" || [ "$(j "$n" '.put_latency_us == null')" = true ]; then
            out="$out $p%: failed ($(j "$n" '.first_error // "see its JSON"' | tr '\n|' '  '));"
        else
            out="$out $p%: $(fmt "$(j "$n" .config.rate)") → $(fmt "$(j "$n" .messages_per_sec)"):"
            out="$out $(lat "$(j "$n" .put_latency_us.p50)") / $(lat "$(j "$n" .put_latency_us.p99)") / $(lat "$(j "$n" .put_latency_us.p99_9)"),"
            out="$out e2e $(lat "$(j "$n" '.e2e_latency_us.p99 // 0')"),"
            out="$out put service p99 $(lat "$(j "$n" '.put_service_us.p99 // 0')");"
        fi
    done
    for p in "${s11_floors[@]}"; do
        n="s11-floor-$p"
        if ! failed "$n" && [ "$(j "$n" '.put_latency_us == null')" = false ]; then
            out="$out floor (the $p% schedule, nothing put): $(lat "$(j "$n" .put_latency_us.p50)") / $(lat "$(j "$n" .put_latency_us.p99)") / $(lat "$(j "$n" .put_latency_us.p99_9)");"
        fi
    done
    echo "${out%;}"
}
s11_baseline() {
    if skipped s11-latency-vs-load; then echo "-"; return; fi
    echo "closed loop $(fmt "$(j s11-latency-vs-load .closed_loop_messages_per_sec)") msg/s" \
        "($(j s11-latency-vs-load .closed_loop_from), same run)"
}
s11_ratio() {
    # put p99 and p99.9 at 90% over the same at 10%.
    if failed s11-10 || failed s11-90 || [ "$(j s11-90 '.put_latency_us == null')" = true ]; then echo "-"; return; fi
    local p out
    out="put p99 at 90% / at 10%: $(ratio "$(j s11-90 .put_latency_us.p99)" "$(j s11-10 '[.put_latency_us.p99, 0.001] | max')");"
    out="$out p99.9: $(ratio "$(j s11-90 .put_latency_us.p99_9)" "$(j s11-10 '[.put_latency_us.p99_9, 0.001] | max')")"
    # Each floored point over its floor.
    for p in "${s11_floors[@]}"; do
        if ! failed "s11-$p" && ! failed "s11-floor-$p" && [ "$(j "s11-floor-$p" '.put_latency_us == null')" = false ]; then
            out="$out; at $p%, put p99 / p99.9 over the floor's: $(ratio "$(j "s11-$p" .put_latency_us.p99)" "$(j "s11-floor-$p" '[.put_latency_us.p99, 0.001] | max')")"
            out="$out / $(ratio "$(j "s11-$p" .put_latency_us.p99_9)" "$(j "s11-floor-$p" '[.put_latency_us.p99_9, 0.001] | max')")"
        fi
    done
    echo "$out"
}
{
    echo "# coremq benchmark results"
    echo
    echo "Machine: $machine. Run: $(date -u '+%Y-%m-%d %H:%M UTC'), $([ "$quick" = 1 ] && echo quick || echo full) ($secs s per scenario)."
    echo
    row scenario result baseline ratio
    row --- --- --- ---
    scenario s1-async-1k "1. async, 1 KiB, all shards, 64 queues" \
        "fio seq write $(fmt "$write_mb" 1) MB/s" s1_result s1_ratio
    scenario s1b-handle "1b. async, 1 KiB, 2 threads through the handle" \
        "fio seq write $(fmt "$write_mb" 1) MB/s; scenario 1" s1b_result s1b_ratio
    scenario s1c-handle "1c. async, 1 KiB, one shard, one thread through the handle" \
        "the same shard producing on itself" s1c_result s1c_ratio
    scenario s2-async-16k "2. async, 16 KiB" \
        "fio seq write $(fmt "$write_mb" 1) MB/s" s2_result s2_ratio
    scenario s3-sync-1k "3. sync (group commit), 1 KiB, 256 outstanding" \
        "fio 4 KiB write+fdatasync p50 $(fmt "$fsync_p50" 1) µs, p99 $(fmt "$fsync_p99" 1) µs ($(fmt "$sync_iops") IOPS)" \
        s3_result s3_ratio
    scenario s3b-sync-1 "3b. sync, 1 KiB, 1 outstanding, 1 shard" \
        "fio 4 KiB write+fdatasync p50 $(fmt "$fsync_p50" 1) µs, p99 $(fmt "$fsync_p99" 1) µs" \
        s3b_result s3b_ratio
    scenario s3c-recycled "3c. sync, 1 KiB, 1 outstanding, new vs recycled segments" \
        "fio 4 KiB write+fdatasync p50 $(fmt "$fsync_p50" 1) µs; new segments, same run" \
        s3c_result s3c_ratio
    scenario s4-consumers "4. tailing consumers, $(fmt "$s4_rate") msg/s offered" \
        "consumers read all while producing" s4_result s4_ratio
    scenario s5a-catch-up "5a. catch-up read, $(fmt "$s5_msgs") x 4 KiB, 1 queue per shard" \
        "fio seq read $(fmt "$read_mb" 1) MB/s" s5a_result s5a_ratio
    scenario s5b-catch-up "5b. catch-up read, $(fmt "$s5_msgs") x 4 KiB, 64 queues" \
        "fio seq read $(fmt "$read_mb" 1) MB/s" s5b_result s5b_ratio
    scenario s6-key-queries "6. key queries, one at a time, all shards each" \
        "target p99 < 1 ms (10 M keys); fio 4 KiB random read p50 $(fmt "$rr50") µs, p99 $(fmt "$rr99") µs" \
        s6_result s6_ratio
    scenario s7-recovery "7. abnormal recovery after SIGKILL, $(fmt "$s7_msgs") x 1 KiB" \
        "fio seq read $(fmt "$read_mb" 1) MB/s" s7_result s7_ratio
    scenario s8-replicate "8a. catch-up replication, $(fmt "$s8_msgs") x 4 KiB, empty slave" \
        "fio seq write $(fmt "$write_mb" 1) MB/s" s8a_result s8a_ratio
    scenario s8-sync-master-256 "8b. sync flush + SYNC_MASTER slave, 1 KiB" \
        "sync flush alone, same run" s8b_result s8b_ratio
    if skipped s9-timer || failed s9-timer; then
        scenario s9-timer "9. $(fmt "$s9_timed") pending timed messages, due over $s9_spread s" "-" s9_result s9_ratio
    else
        scenario s9-timer "9. $(fmt "$s9_timed") pending timed messages, due over $s9_spread s" \
            "$(s9_baseline)" s9_result s9_ratio
    fi
    if skipped s10-single; then
        scenario s10-single "10. the node, 1 KiB (load generator on the same machine)" "-" s10_result s10_ratio
    elif failed s10-single || failed s10-batch || failed s10-one || failed s10-pull; then
        row "10. the node, 1 KiB (load generator on the same machine)" \
            "**failed: $(for n in s10-single s10-batch s10-one s10-pull; do
                failed "$n" && printf '%s: %s; ' "$n" "$(j "$n" .first_error | tr '\n|' '  ')"; done)**" "-" "-"
    else
        row "10. the node, 1 KiB (load generator on the same machine)" "$(s10_result)" "$(s10_baseline)" "$(s10_ratio)"
    fi
    scenario s11-latency-vs-load "11. latency vs load (async 1 KiB, tailing consumers)" \
        "$(s11_baseline)" s11_result s11_ratio
    echo
    echo "MB = 10^6 bytes. MB/s counts message bodies (\"log\": CommitLog bytes with record headers and properties)."
    echo "Latencies are from the send time (the intended one under a target rate) and come from HDR histograms;"
    echo "fio's write+fdatasync figure is its write latency plus its fdatasync latency at the same percentile."
    echo "Catch-up MB/s counts bodies read; reads are O_DIRECT (no page cache involved), so only each shard's"
    echo "write pool (16 x 4 MiB) can serve them from memory. Recovery: the time to open every shard's store"
    echo "(in parallel) after a SIGKILL, against the time fio takes to read as many bytes as the log holds."
    echo "Replication: 8a counts CommitLog bytes from the slave's open to its last shard reaching the master's"
    echo "end (both stores in one process, loopback); 8b's slave acknowledges what it appended to its write buffer."
    echo "Timed messages: a put phase runs from its first put to every shard's dispatch caught up; its CPU is the"
    echo "whole process's (the timer reading its queue included). RSS is the whole process, not the timer alone;"
    echo "lateness is a delivered record's store timestamp minus its TIMER_OUT_MS (ms)."
    echo "Node: CPU per message is the node process's user + system time over the run (its process_cpu_seconds_total, getrusage)"
    echo "divided by the messages acknowledged; the load generator runs on the same CPUs; goals from issue 20."
    echo "Latency vs load: open-loop runs offered a share of the closed-loop rate of the same workload with consumers (s11-capacity, this run);"
    echo "curves in $(basename "$detail")/s11-latency-vs-load.svg. Its floor: the same open-loop schedule with nothing put (--pace-only), each slot timed"
    echo "as a put: how late the executor and the machine start a put that costs nothing (timer wake-ups, the CPU lost to other threads)."
    echo "Per-scenario JSON, SVG latency curves and logs: $(basename "$detail")/."
} >"$out/bench-results.md"

jq -n \
    --arg machine "$machine" \
    --arg date "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" \
    --argjson quick "$quick" \
    --argjson write_bw "$write_bw" --argjson read_bw "$read_bw" \
    --argjson fsync_p50 "$fsync_p50" --argjson fsync_p99 "$fsync_p99" \
    --argjson w50 "$w50" --argjson w99 "$w99" --argjson s50 "$s50" --argjson s99 "$s99" \
    --argjson sync_iops "$sync_iops" --argjson rr50 "$rr50" --argjson rr99 "$rr99" \
    --slurpfile s1 "$detail/s1-async-1k.json" --slurpfile s1b "$detail/s1b-handle.json" \
    --slurpfile s1cl "$detail/s1c-local.json" --slurpfile s1ch "$detail/s1c-handle.json" \
    --slurpfile s2 "$detail/s2-async-16k.json" \
    --slurpfile s3 "$detail/s3-sync-1k.json" --slurpfile s3b "$detail/s3b-sync-1.json" \
    --slurpfile s3cf "$detail/s3c-fresh.json" --slurpfile s3cr "$detail/s3c-recycled.json" \
    --slurpfile s4 "$detail/s4-consumers.json" \
    --slurpfile s5aw "$detail/s5a-write.json" --slurpfile s5a "$detail/s5a-catch-up.json" \
    --slurpfile s5bw "$detail/s5b-write.json" --slurpfile s5b "$detail/s5b-catch-up.json" \
    --slurpfile s6w "$detail/s6-write.json" --slurpfile s6 "$detail/s6-key-queries.json" \
    --slurpfile s7w "$detail/s7-write.json" --slurpfile s7 "$detail/s7-recovery.json" \
    --slurpfile s8w "$detail/s8-write.json" --slurpfile s8 "$detail/s8-replicate.json" \
    --slurpfile s8s1 "$detail/s8-sync-1.json" --slurpfile s8m1 "$detail/s8-sync-master-1.json" \
    --slurpfile s8s256 "$detail/s8-sync-256.json" --slurpfile s8m256 "$detail/s8-sync-master-256.json" \
    --slurpfile s9 "$detail/s9-timer.json" \
    --slurpfile s10e "$detail/s10-embedded.json" --slurpfile s10cw "$detail/s10-catch-up-write.json" \
    --slurpfile s10c "$detail/s10-catch-up.json" --slurpfile s10echo "$detail/s10-echo.json" \
    --slurpfile s10echop "$detail/s10-echo-pipelined.json" \
    --slurpfile s10s "$detail/s10-single.json" --slurpfile s10sb "$detail/s10-single-binary.json" \
    --slurpfile s10b "$detail/s10-batch.json" \
    --slurpfile s10o "$detail/s10-one.json" --slurpfile s10p "$detail/s10-pull.json" \
    --slurpfile s10idle "$detail/s10-idle.json" --slurpfile s10r1k "$detail/s10-rate1k.json" \
    --slurpfile s10hb "$detail/s10-heartbeat-1k.json" \
    --slurpfile s10curve "$detail/s10-cpu-vs-rate.json" \
    --slurpfile s11 "$detail/s11-latency-vs-load.json" \
    '{
        machine: $machine, date: $date, quick: ($quick == 1),
        fio: {
            seq_write_bytes_per_sec: $write_bw,
            seq_read_bytes_per_sec: $read_bw,
            write_fdatasync_4k_us: {
                p50: $fsync_p50, p99: $fsync_p99,
                write_p50: $w50, write_p99: $w99, fdatasync_p50: $s50, fdatasync_p99: $s99,
                iops: $sync_iops
            },
            random_read_4k_us: {p50: $rr50, p99: $rr99}
        },
        scenarios: {
            "1_async_1k": ($s1[0] + {ratio_to_fio_write: (($s1[0].mb_per_sec // 0) * 1e6 / $write_bw)}),
            "1b_async_1k_via_handle": ($s1b[0] + {ratio_to_fio_write: (($s1b[0].mb_per_sec // 0) * 1e6 / $write_bw)}),
            "1c_one_shard_via_handle": ($s1ch[0] + {shard_alone: $s1cl[0],
                ratio_to_shard_alone: (($s1ch[0].messages_per_sec // 0) / ([($s1cl[0].messages_per_sec // 0), 1] | max))}),
            "2_async_16k": ($s2[0] + {ratio_to_fio_write: (($s2[0].mb_per_sec // 0) * 1e6 / $write_bw)}),
            "3_sync_1k": ($s3[0] + {p99_ratio_to_fio_fdatasync: (($s3[0].put_latency_us.p99 // 0) / $fsync_p99)}),
            "3b_sync_1k_1_outstanding": ($s3b[0] + {
                p50_ratio_to_fio_fdatasync: (($s3b[0].put_latency_us.p50 // 0) / $fsync_p50),
                p99_ratio_to_fio_fdatasync: (($s3b[0].put_latency_us.p99 // 0) / $fsync_p99)}),
            "3c_sync_1k_new_vs_recycled_segments": {new: $s3cf[0], recycled: $s3cr[0],
                p50_ratio_recycled_to_new: (($s3cr[0].put_latency_us.p50 // 0) / ([$s3cf[0].put_latency_us.p50 // 1, 1e-9] | max)),
                p99_ratio_recycled_to_new: (($s3cr[0].put_latency_us.p99 // 0) / ([$s3cf[0].put_latency_us.p99 // 1, 1e-9] | max))},
            "4_consumers": $s4[0],
            "5a_catch_up_read_1_queue_per_shard": ($s5a[0] + {write: $s5aw[0],
                ratio_to_fio_read: (($s5a[0].mb_per_sec // 0) * 1e6 / $read_bw)}),
            "5b_catch_up_read_64_queues": ($s5b[0] + {write: $s5bw[0],
                ratio_to_fio_read: (($s5b[0].mb_per_sec // 0) * 1e6 / $read_bw)}),
            "6_key_queries": ($s6[0] + {write: $s6w[0],
                p99_ratio_to_1ms: (($s6[0].query_latency_us.p99 // 0) / 1000),
                p99_ratio_to_fio_random_read_p99: (($s6[0].query_latency_us.p99 // 0) / $rr99)}),
            "7_recovery": ($s7[0] + {write: $s7w[0],
                fio_read_seconds: (($s7[0].log_bytes // 0) / $read_bw),
                ratio_to_fio_read: (if ($s7[0].log_bytes // 0) > 0
                    then ($s7[0].open_seconds / ($s7[0].log_bytes / $read_bw)) else null end)}),
            "8a_catch_up_replication": ($s8[0] + {write: $s8w[0],
                ratio_to_fio_write: (($s8[0].log_mb_per_sec // 0) * 1e6 / $write_bw)}),
            "8b_sync_master": {
                sync_1: $s8s1[0], sync_master_1: $s8m1[0],
                sync_256: $s8s256[0], sync_master_256: $s8m256[0]
            },
            "9_timer": $s9[0],
            "10_node": {
                embedded: $s10e[0], catch_up_write: $s10cw[0], catch_up: $s10c[0], echo: $s10echo[0],
                echo_pipelined: $s10echop[0],
                single: $s10s[0], single_binary: $s10sb[0], batch: $s10b[0], one_in_flight: $s10o[0], pull: $s10p[0],
                idle: $s10idle[0], rate_1k: $s10r1k[0], heartbeat_1k: $s10hb[0], cpu_vs_rate: $s10curve[0],
                node_cpu_ratio_to_embedded_single: (($s10s[0].node_cpu_us_per_message // null)
                    | if . == null then null else . / ([$s10e[0].cpu_us_per_message // 0, 0.001] | max) end),
                node_cpu_ratio_to_embedded_single_binary: (($s10sb[0].node_cpu_us_per_message // null)
                    | if . == null then null else . / ([$s10e[0].cpu_us_per_message // 0, 0.001] | max) end),
                node_cpu_ratio_to_embedded_batch: (($s10b[0].node_cpu_us_per_message // null)
                    | if . == null then null else . / ([$s10e[0].cpu_us_per_message // 0, 0.001] | max) end),
                one_in_flight_p50_ratio_to_echo: (($s10o[0].send_latency_us.p50 // null)
                    | if . == null then null else . / ([$s10echo[0].send_latency_us.p50 // 0, 1] | max) end),
                pull_ratio_to_catch_up: (($s10p[0].read_back_per_sec // null)
                    | if . == null then null else . / ([$s10c[0].messages_per_sec // 0, 1] | max) end)
            },
            "11_latency_vs_load": $s11[0]
        }
    }' >"$out/bench-results.json"

echo
cat "$out/bench-results.md"
echo
echo "wrote $out/bench-results.md, $out/bench-results.json and $detail/"
