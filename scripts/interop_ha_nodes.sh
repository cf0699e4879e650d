#!/usr/bin/env bash
# Replication between two `coremq serve` processes, driven by a client nobody here
# wrote (PyPI `rocketmq` 0.4.4, Apache RocketMQ's C++ client; the venv scripts/interop.sh
# makes): a SYNC_MASTER node and a slave node on free loopback ports; the client sends to
# the master and pulls everything from the slave (scripts/interop_ha_client.py); then both
# stop with SIGTERM, every shard's commit log is compared byte for byte (`cmp` up to the
# master's end), and `coremq inspect check` must pass on both data directories.
#
#   scripts/interop_ha_nodes.sh     (COREMQ_BIN=path to skip the build; not run by CI)
# Exit 0 when every check passed; 77 when the client cannot be installed (skip).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
work="$(mktemp -d /tmp/coremq-interop-ha-nodes.XXXXXX)"
venv="${INTEROP_VENV:-/tmp/coremq-interop-venv}"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
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

# start NAME ROLE TOML FLAGS...: a node in $work/NAME on free ports, TOML lines added to
# its config; sets ${NAME}_ns, ${NAME}_ha, ${NAME}_broker.
start() {
    local name="$1" role="$2" extra="$3"
    shift 3
    local broker ns metrics ha
    broker=$(free_port); ns=$(free_port); metrics=$(free_port); ha=$(free_port)
    printf 'shards = 2\npin = false\nrole = "%s"\nslave_sync_interval_ms = 500\nha_reconnect_interval_ms = 200\n%s\n' \
        "$role" "$extra" >"$work/$name.toml"
    "$COREMQ_BIN" serve --config "$work/$name.toml" --data-dir "$work/$name" \
        --listen "127.0.0.1:$broker" --namesrv-listen "127.0.0.1:$ns" \
        --metrics-listen "127.0.0.1:$metrics" --ha-listen "127.0.0.1:$ha" "$@" \
        >"$work/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        grep -q "node serving" "$work/$name.log" && break
        sleep 0.1
    done
    grep -q "node serving" "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
    printf -v "${name}_ns" '127.0.0.1:%s' "$ns"
    printf -v "${name}_ha" '127.0.0.1:%s' "$ha"
    printf -v "${name}_broker" '127.0.0.1:%s' "$broker"
}
start master sync_master ""
# shellcheck disable=SC2154
start slave slave "ha_master_broker_address = \"$master_broker\"" --ha-master "$master_ha"

# SYNC_MASTER answers SLAVE_NOT_AVAILABLE until the slave connected (both shards).
for _ in $(seq 100); do
    [[ $(grep -c "connected to the master" "$work/slave.log") -ge 2 ]] && break
    sleep 0.1
done
status=0
timeout 180 "$venv/bin/python" "$here/interop_ha_client.py" "$master_ns" "$slave_ns" InteropHa || status=$?
sleep 1
for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p" || status=1; done
pids=()
for s in 0 1; do
    m="$work/master/shard-$s/commitlog" sl="$work/slave/shard-$s/commitlog"
    # The master's end: past its last record.
    end=$("$COREMQ_BIN" inspect records "$work/master/shard-$s" | tail -1 | \
        "$py" -c 'import json,sys; l=sys.stdin.read().strip(); r=json.loads(l) if l else {}; print(r.get("offset",0)+r.get("size",0) if r else 0)')
    for f in "$m"/*; do
        [[ -e "$f" ]] || continue  # a shard that owns none of the topic's queues
        start=$((10#$(basename "$f")))
        n=$((end - start)); [[ $n -gt 0 ]] || continue
        if cmp -n "$n" "$f" "$sl/$(basename "$f")"; then echo "PASS shard $s segment $(basename "$f"): $n bytes identical"
        else echo "FAIL shard $s segment $(basename "$f") differs"; status=1; fi
    done
done
for d in master slave; do
    if "$COREMQ_BIN" inspect check "$work/$d" >/dev/null; then echo "PASS inspect check $d"
    else echo "FAIL inspect check $d"; status=1; fi
done
[[ $status -eq 0 ]] || { echo "--- master log ---"; tail -20 "$work/master.log"; echo "--- slave log ---"; tail -20 "$work/slave.log"; }
exit $status
