#!/usr/bin/env bash
# Runs one program of scripts/interop-rust (rocketmq-client-rust 1.0.0 from crates.io; same
# workspace and target dir as scripts/interop_rust.sh) against a coremq node started on free
# loopback ports with extra settings: what scripts/interop_rust_transaction.sh and
# scripts/interop_rust_timer.sh share.
#
#   scripts/interop_rust_program.sh PROGRAM TOPIC 'SETTINGS'   (SETTINGS: coremq.toml lines)
#   (INTEROP_RUST_TARGET, COREMQ_NETWORK as interop_rust.sh)
# Exit 0 when every check passed; 77 when the client cannot be built (skip).
program="$1"; topic="$2"; settings="${3:-}"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
work="$(mktemp -d /tmp/coremq-interop-rust.XXXXXX)"
target="${INTEROP_RUST_TARGET:-/tmp/coremq-interop-rust-target}"
node_pid=""
cleanup() {
    if [[ -n "$node_pid" ]] && kill -0 "$node_pid" 2>/dev/null; then kill -TERM "$node_pid" || true; wait "$node_pid" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

(cd "$here/interop-rust" && CARGO_TARGET_DIR="$target" cargo build -q) \
    || { echo "SKIPPED: cannot build rocketmq-client-rust"; exit 77; }
if [[ -z "${COREMQ_BIN:-}" ]]; then
    (cd "$root" && cargo build -q --features cli)
    COREMQ_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/coremq"
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
broker_port=$(free_port); namesrv_port=$(free_port); metrics_port=$(free_port)
# COREMQ_NETWORK=threads runs the thread-per-connection front end instead.
printf 'network = "%s"\n%s' "${COREMQ_NETWORK:-shards}" "$settings" >"$work/coremq.toml"
"$COREMQ_BIN" serve --config "$work/coremq.toml" --data-dir "$work/data" --listen "127.0.0.1:$broker_port" \
    --namesrv-listen "127.0.0.1:$namesrv_port" --metrics-listen "127.0.0.1:$metrics_port" \
    >"$work/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 100); do
    grep -q "node serving" "$work/node.log" && break
    kill -0 "$node_pid" 2>/dev/null || { cat "$work/node.log"; exit 1; }
    sleep 0.1
done
status=0
timeout 180 "$target/debug/$program" "127.0.0.1:$namesrv_port" "$topic" 2>/dev/null || status=$?
kill -TERM "$node_pid"; wait "$node_pid" || status=1; node_pid=""
[[ $status -eq 0 ]] || { echo "--- node log ---"; tail -40 "$work/node.log"; }
exit $status
