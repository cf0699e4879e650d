#!/usr/bin/env bash
# Interop test against a RocketMQ client nobody here wrote: the PyPI package
# `rocketmq` (0.4.4, a manylinux wheel bundling Apache RocketMQ's C++ client,
# librocketmq.so). Installs it into a throwaway venv, starts a coremq node on free
# loopback ports in a fresh data directory, runs scripts/interop_client.py (produce
# single and batch, pull consumer, push consumer with long polling and committed
# offsets), then stops the node with SIGTERM and checks the clean shutdown (no
# `abort` left, consumer offsets written).
#
#   scripts/interop.sh            # builds coremq (debug) first
#   COREMQ_NETWORK=threads scripts/interop.sh   # the thread-per-connection front end
#   COREMQ_SHARD_PORTS=1 scripts/interop.sh      # shard ports: the client sees a broker per shard
#   COREMQ_BIN=path scripts/interop.sh
#
# Exit 0 when every check passed; 77 when the client cannot be installed (skip).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
work="$(mktemp -d /tmp/coremq-interop.XXXXXX)"
venv="${INTEROP_VENV:-/tmp/coremq-interop-venv}"
node_pid=""
cleanup() {
    if [[ -n "$node_pid" ]] && kill -0 "$node_pid" 2>/dev/null; then kill -TERM "$node_pid" || true; wait "$node_pid" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

py="${PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]]; then
    "$py" -m venv "$venv" || { echo "SKIPPED: cannot create a venv"; exit 77; }
fi
if ! "$venv/bin/python" -c 'import rocketmq.client' 2>/dev/null; then
    "$venv/bin/pip" install -q 'rocketmq==0.4.4' || { echo "SKIPPED: cannot install rocketmq from PyPI"; exit 77; }
fi

if [[ -z "${COREMQ_BIN:-}" ]]; then
    (cd "$root" && cargo build -q --features cli)
    COREMQ_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/coremq"
fi

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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
(cd "$work" && timeout 180 "$venv/bin/python" "$here/interop_client.py" "127.0.0.1:$namesrv_port" InteropTopic) || status=$?

kill -TERM "$node_pid"; wait "$node_pid" || status=1; node_pid=""
if [[ -e "$work/data/shard-0/abort" ]]; then echo "FAIL abort left after SIGTERM"; status=1; else echo "PASS clean shutdown (no abort)"; fi
if grep -q '"InteropTopic@interop-push"' "$work/data/config/consumerOffset.json" 2>/dev/null; then
    echo "PASS push consumer offsets persisted"
else
    echo "FAIL no committed offsets for interop-push"; status=1
fi
[[ $status -eq 0 ]] || { echo "--- node log ---"; tail -40 "$work/node.log"; }
exit $status
