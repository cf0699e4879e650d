#!/usr/bin/env bash
# The process crash loop (issue 6) in a release build: a sharded sync-flush writer is
# killed with SIGKILL at random moments, the store is reopened and every acknowledged
# put is checked, cycle after cycle on one growing store (see tests/crash_loop.rs).
#
# Usage: scripts/crash.sh [--cycles N] [--seed S] [--dir DIR] [--full-every K] [--sync-lead]
#   --cycles N  kill/verify cycles (default 200)
#   --full-every K  check the whole store (and run inspect check) every K-th cycle and
#               the last; the others check each queue's tail, a sample of older
#               entries and the lookups (default 1: every cycle; a whole-store check
#               costs time in proportion to the store, so long runs want ~25-50)
#   --seed S    replay a run (default: from the clock; printed either way)
#   --sync-lead the writers' shards lead their rounds when idle (the store's
#               sync_flush_lead_when_idle; default: off, as the store's default)
#   --dir DIR   where the work directory goes (default: the temp dir); a failing
#               run keeps its store there and prints the path
#
# The full output goes to crash-loop-<seed>.log in DIR (or the temp dir). The last line is
#   cycles=N acked=A verified=V lost=L corrupt=C seed=S whole_store_checks=W
# and the exit status is 0 only when L and C are both 0.
set -euo pipefail

cycles=200
seed=""
dir=""
full_every=1
while [ $# -gt 0 ]; do
    case "$1" in
        --cycles) cycles="$2"; shift ;;
        --seed) seed="$2"; shift ;;
        --dir) dir="$2"; shift ;;
        --full-every) full_every="$2"; shift ;;
        --sync-lead) export COREMQ_CRASH_SYNC_LEAD=1 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "crash.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case "$cycles" in ''|*[!0-9]*) echo "crash.sh: --cycles wants a number" >&2; exit 2 ;; esac
if [ -z "$seed" ]; then
    seed="$(date +%s%N)"
fi
case "$seed" in *[!0-9]*) echo "crash.sh: --seed wants a number" >&2; exit 2 ;; esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
logdir="${dir:-${TMPDIR:-/tmp}}"
mkdir -p "$logdir"
log="$(cd "$logdir" && pwd)/crash-loop-$seed.log"

cargo test --release --features cli --test crash_loop --no-run >&2

case "$full_every" in ''|*[!0-9]*) echo "crash.sh: --full-every wants a number" >&2; exit 2 ;; esac
export COREMQ_CRASH_CYCLES="$cycles" COREMQ_CRASH_SEED="$seed" COREMQ_CRASH_FULL_EVERY="$full_every"
if [ -n "$dir" ]; then
    export COREMQ_CRASH_DIR="$dir"
fi
set +e
cargo test --release --features cli --test crash_loop -- --nocapture --test-threads=1 >"$log" 2>&1
status=$?
set -e

# Progress and failures for the reader; the summary line last.
grep -E '^(cycle [0-9]+: FAILED|  - |the store and|writers:)' "$log" >&2 || true
line="$(grep -E '^cycles=[0-9]+ acked=' "$log" | tail -n 1 || true)"
if [ -z "$line" ]; then
    echo "crash.sh: the harness ended (status $status) without a summary; see $log" >&2
    tail -n 30 "$log" >&2
    exit 1
fi
echo "$line"
lost="$(sed -E 's/.* lost=([0-9]+).*/\1/' <<<"$line")"
corrupt="$(sed -E 's/.* corrupt=([0-9]+).*/\1/' <<<"$line")"
if [ "$lost" != 0 ] || [ "$corrupt" != 0 ] || [ "$status" != 0 ]; then
    exit 1
fi
