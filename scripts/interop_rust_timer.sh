#!/usr/bin/env bash
# Timed messages with rocketmq-client-rust (crates.io, 1.0.0): builds
# scripts/interop-rust's `timer` program (same workspace and target dir as
# scripts/interop_rust.sh), starts a coremq node with `timer_max_delay_sec = 60`, and
# checks that messages sent with set_delay_time_sec / set_delay_time_ms /
# set_deliver_time_ms reach a push consumer once, not before their time and within 1 s
# after it, and that a time past the maximum is refused.
#
#   scripts/interop_rust_timer.sh   (INTEROP_RUST_TARGET, COREMQ_NETWORK as interop_rust.sh)
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
printf 'network = "%s"\ntimer_max_delay_sec = 60\n' \
    "${COREMQ_NETWORK:-shards}" >"$work/coremq.toml"
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
timeout 180 "$target/debug/timer" "127.0.0.1:$namesrv_port" RustTimer 2>/dev/null || status=$?
kill -TERM "$node_pid"; wait "$node_pid" || status=1; node_pid=""
[[ $status -eq 0 ]] || { echo "--- node log ---"; tail -40 "$work/node.log"; }
exit $status
