#!/usr/bin/env bash
# coremq's benchmark suite, side by side with the disk's own limit (issue 5).
#
# In one go, on the filesystem of the work directory: fio baselines (sequential 1 MiB
# O_DIRECT writes at queue depth 8 through io_uring; 4 KiB write + fdatasync latency
# on a preallocated file; sequential 1 MiB O_DIRECT reads), then the load generator's
# scenarios (`coremq bench`), each result next to its baseline as a ratio.
#
# Usage: scripts/bench.sh [--quick] [--dir DIR] [--out DIR]
#   --quick    about 30 s instead of about 3 minutes (shorter runs, smaller files)
#   --dir DIR  work directory for fio files and stores (default: ./bench-work);
#              emptied of what the script made at the end
#   --out DIR  where bench-results.{json,md} and the per-scenario JSON/SVG go
#              (default: the current directory)
#
# Needs fio and jq (installed with apt-get when missing) and a Rust toolchain.
set -euo pipefail

quick=0
work=""
out="."
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --dir) work="$2"; shift ;;
        --out) out="$2"; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

if [ "$quick" = 1 ]; then
    fio_bytes=1G; fio_sync_secs=2; secs=3
else
    fio_bytes=8G; fio_sync_secs=10; secs=15
fi

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
(cd "$repo" && cargo build --release --quiet)
# A private copy: a concurrent build cannot swap the binary in the middle of a run.
bin="$work/coremq"
cp "$repo/target/release/coremq" "$bin"

cleanup() {
    rm -rf "$work"/fio-* "$work"/s[0-9]-* "$bin"
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

# run NAME LABEL ARGS...: one `coremq bench` run on a fresh store, removed afterwards.
# A run that found problems (exit 1) or could not finish (exit 2: a shard failed) is
# reported in the table, and the script goes on with the next scenario.
run() {
    local name="$1" label="$2" rc
    shift 2
    log "scenario $name: $label"
    rm -f "$detail/$name.json" "$detail/$name.svg"
    # stdout as is; stderr (progress, errors) to the terminal and to a log.
    set +e
    {
        "$bin" bench --label "$label" --data-dir "$work/$name" \
            --json "$detail/$name.json" --svg "$detail/$name.svg" "$@" \
            2>&1 >&3 | tee "$detail/$name.log" >&2
    } 3>&1
    rc=${PIPESTATUS[0]}
    set -e
    rm -rf "${work:?}/$name"
    if [ ! -s "$detail/$name.json" ]; then
        local why
        why=$(grep -m1 '^coremq: ' "$detail/$name.log" | cut -c9-300 || true)
        jq -n --arg lbl "$label" --arg why "${why:-exit status $rc}" \
            '{"label": $lbl, "ok": false, "failed": true, "first_error": $why}' >"$detail/$name.json"
    fi
}

export RUST_LOG="${RUST_LOG:-warn}"
run s1-async-1k "async flush, 1 KiB, all shards, 64 queues" \
    --duration "$secs" --body 1024 --queues 64
run s2-async-16k "async flush, 16 KiB, all shards, 64 queues" \
    --duration "$secs" --body 16384 --queues 64
run s3-sync-1k "sync flush (group commit), 1 KiB, 256 outstanding" \
    --duration "$secs" --body 1024 --queues 64 --flush sync --outstanding 256
# Tailing consumers under an open loop at a quarter of scenario 1's closed-loop rate:
# a load the shards have CPU to spare for, so consumers should keep up.
s4_rate=$(jq '((.messages_per_sec // 400000) / 4) | floor' "$detail/s1-async-1k.json")
run s4-consumers "async flush, 1 KiB, tailing consumers, $s4_rate msg/s" \
    --duration "$secs" --body 1024 --queues 64 --consumers --rate "$s4_rate" \
    --drain-timeout 10

# ---------------------------------------------------------------------------------
# report

j() { jq -r "$2" "$detail/$1.json"; }
failed() { [ "$(j "$1" '.failed // false')" = true ]; }
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
    if failed "$1"; then
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
s4_result() {
    echo "$(fmt "$(j s4-consumers .messages_per_sec)") msg/s put; end-to-end p50" \
        "$(fmt "$(j s4-consumers .e2e_latency_us.p50)" 1) µs, p99 $(fmt "$(j s4-consumers .e2e_latency_us.p99)" 1) µs"
}
s4_ratio() {
    echo "$(ratio "$(j s4-consumers '.consumed_while_producing / ([.messages, 1] | max)')" 1) read while producing"
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
    scenario s2-async-16k "2. async, 16 KiB" \
        "fio seq write $(fmt "$write_mb" 1) MB/s" s2_result s2_ratio
    scenario s3-sync-1k "3. sync (group commit), 1 KiB, 256 outstanding" \
        "fio 4 KiB write+fdatasync p50 $(fmt "$fsync_p50" 1) µs, p99 $(fmt "$fsync_p99" 1) µs ($(fmt "$sync_iops") IOPS)" \
        s3_result s3_ratio
    scenario s4-consumers "4. tailing consumers, $(fmt "$s4_rate") msg/s offered" \
        "consumers read all while producing" s4_result s4_ratio
    row "5. catch-up read" "not yet" "fio seq read $(fmt "$read_mb" 1) MB/s" "-"
    row "6. key queries" "not yet (key index)" "-" "-"
    row "7. abnormal recovery" "not yet" "fio seq read $(fmt "$read_mb" 1) MB/s" "-"
    echo
    echo "MB = 10^6 bytes. MB/s counts message bodies (\"log\": CommitLog bytes with record headers and properties)."
    echo "Latencies are from the send time (the intended one under a target rate) and come from HDR histograms;"
    echo "fio's write+fdatasync figure is its write latency plus its fdatasync latency at the same percentile."
    echo "Per-scenario JSON, SVG latency curves and logs: $(basename "$detail")/."
} >"$out/bench-results.md"

jq -n \
    --arg machine "$machine" \
    --arg date "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" \
    --argjson quick "$quick" \
    --argjson write_bw "$write_bw" --argjson read_bw "$read_bw" \
    --argjson fsync_p50 "$fsync_p50" --argjson fsync_p99 "$fsync_p99" \
    --argjson w50 "$w50" --argjson w99 "$w99" --argjson s50 "$s50" --argjson s99 "$s99" \
    --argjson sync_iops "$sync_iops" \
    --slurpfile s1 "$detail/s1-async-1k.json" --slurpfile s2 "$detail/s2-async-16k.json" \
    --slurpfile s3 "$detail/s3-sync-1k.json" --slurpfile s4 "$detail/s4-consumers.json" \
    '{
        machine: $machine, date: $date, quick: ($quick == 1),
        fio: {
            seq_write_bytes_per_sec: $write_bw,
            seq_read_bytes_per_sec: $read_bw,
            write_fdatasync_4k_us: {
                p50: $fsync_p50, p99: $fsync_p99,
                write_p50: $w50, write_p99: $w99, fdatasync_p50: $s50, fdatasync_p99: $s99,
                iops: $sync_iops
            }
        },
        scenarios: {
            "1_async_1k": ($s1[0] + {ratio_to_fio_write: (($s1[0].mb_per_sec // 0) * 1e6 / $write_bw)}),
            "2_async_16k": ($s2[0] + {ratio_to_fio_write: (($s2[0].mb_per_sec // 0) * 1e6 / $write_bw)}),
            "3_sync_1k": ($s3[0] + {p99_ratio_to_fio_fdatasync: (($s3[0].put_latency_us.p99 // 0) / $fsync_p99)}),
            "4_consumers": $s4[0],
            "5_catch_up_read": "not yet",
            "6_key_queries": "not yet",
            "7_recovery": "not yet"
        }
    }' >"$out/bench-results.json"

echo
cat "$out/bench-results.md"
echo
echo "wrote $out/bench-results.md, $out/bench-results.json and $detail/"
