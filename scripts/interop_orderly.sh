#!/usr/bin/env bash
# Orderly push consumers with the PyPI `rocketmq` client (0.4.4, Apache's C++ client;
# installed into a venv as scripts/interop_schedule.sh does): starts a coremq node and
# runs scripts/interop_orderly.py (two `PushConsumer(orderly=True)` of one group,
# queue locks 41/42, the consumer-ids-changed notice 40 on a join, per-key order).
#
#   scripts/interop_orderly.sh   (COREMQ_BIN=path, COREMQ_NETWORK=threads as interop.sh)
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
printf 'network = "%s"\n' "${COREMQ_NETWORK:-shards}" >"$work/coremq.toml"
# COREMQ_SHARD_PORTS=1: each shard a broker of its own on a free port (routes name them).
if [[ -n "${COREMQ_SHARD_PORTS:-}" ]]; then
    printf 'shard_listen = "127.0.0.1:0"\n' >>"$work/coremq.toml"
fi
# The queue locks' grants and releases are logged at debug level: checked below.
RUST_LOG="${RUST_LOG:-info,coremq::node::groups=debug}" "$COREMQ_BIN" serve --config "$work/coremq.toml" --data-dir "$work/data" --listen "127.0.0.1:$broker_port" \
    --namesrv-listen "127.0.0.1:$namesrv_port" --metrics-listen "127.0.0.1:$metrics_port" \
    >"$work/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 100); do
    grep -q "node serving" "$work/node.log" && break
    kill -0 "$node_pid" 2>/dev/null || { cat "$work/node.log"; exit 1; }
    sleep 0.1
done

status=0
(cd "$work" && timeout 180 "$venv/bin/python" "$here/interop_orderly.py" "127.0.0.1:$namesrv_port") || status=$?

kill -TERM "$node_pid"; wait "$node_pid" || status=1; node_pid=""
# The broker granted each queue's lock to one client at a time: replayed from its log,
# a grant to another client while a holder has not released is a failure (unless the
# holder's lock had expired, which the grant names).
"$py" - "$work/node.log" <<'PY' || status=1
import re, sys
held, grants, bad = {}, 0, []
for line in open(sys.argv[1], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    m = re.search(r'queue lock (granted|released) group="([^"]*)" client="([^"]*)" topic=(\S+) queue=(-?\d+)(?: expired_holder=(\S+))?', line)
    if not m:
        continue
    what, group, client, topic, queue, expired = m.groups()
    q = (group, topic, queue)
    if what == "granted":
        grants += 1
        if q in held and held[q] != client and expired in (None, "None"):
            bad.append((q, held[q], client))
        held[q] = client
    elif held.get(q) == client:
        del held[q]
ok = grants > 0 and not bad
print(("PASS " if ok else "FAIL ") + "the broker granted each queue's lock to one client at a time (%d grants)%s" % (grants, ": %s" % bad[:5] if bad else ""))
sys.exit(0 if ok else 1)
PY
[[ $status -eq 0 ]] || { echo "--- node log ---"; tail -40 "$work/node.log"; }
[[ -z "${KEEP_NODE_LOG:-}" ]] || cp "$work/node.log" "$KEEP_NODE_LOG"
exit $status
