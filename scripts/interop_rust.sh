#!/usr/bin/env bash
# Interop test with rocketmq-client-rust (crates.io, 1.0.0): builds the small program
# in scripts/interop-rust (its own workspace and target dir; a heavy build: ~360
# crates), starts a coremq node on free loopback ports, and checks: produce with keys,
# query by key (QUERY_MESSAGE), view by offset message id (VIEW_MESSAGE_BY_ID), max
# offset, search offset by time, push consumer (long polling, committed offsets).
#
#   scripts/interop_rust.sh      (INTEROP_RUST_TARGET=dir to reuse a target dir;
#                                 COREMQ_NETWORK=threads for the other front end)
# Exit 0 when every check passed; 77 when the client cannot be built (skip).
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
printf 'network = "%s"\n' "${COREMQ_NETWORK:-shards}" >"$work/coremq.toml"
# COREMQ_SHARD_PORTS=1: each shard a broker of its own on a free port (routes name them).
if [[ -n "${COREMQ_SHARD_PORTS:-}" ]]; then
    printf 'shard_listen = "127.0.0.1:0"\n' >>"$work/coremq.toml"
fi
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
timeout 180 "$target/debug/coremq-interop-rust" "127.0.0.1:$namesrv_port" RustInterop 2>/dev/null || status=$?
kill -TERM "$node_pid"; wait "$node_pid" || status=1; node_pid=""
if [[ -e "$work/data/shard-0/abort" ]]; then echo "FAIL abort left after SIGTERM"; status=1; else echo "PASS clean shutdown (no abort)"; fi
if grep -q '"RustInterop@rust-interop-push"' "$work/data/config/consumerOffset.json" 2>/dev/null; then
    echo "PASS push consumer offsets persisted"
else
    echo "FAIL no committed offsets for rust-interop-push"; status=1
fi
[[ $status -eq 0 ]] || { echo "--- node log ---"; tail -40 "$work/node.log"; }
exit $status
