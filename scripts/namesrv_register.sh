#!/usr/bin/env bash
# Joining an existing RocketMQ cluster (issue 7): start a name server nobody here wrote
# (rocketmq-rust's `rocketmq-namesrv` from crates.io), start a coremq node with
# `namesrv_addr` pointing at it, create a topic on the node, and ask the *name server*
# for that topic's route: it must name the coremq node (REGISTER_BROKER, code 103).
#
#   scripts/namesrv_register.sh          # installs rocketmq-namesrv with cargo if missing
#   NAMESRV_BIN=path scripts/namesrv_register.sh
#
# Exit 0 when the route came back naming the node; 77 when the name server cannot be
# installed (skip).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
work="$(mktemp -d /tmp/coremq-namesrv.XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

bin="${NAMESRV_BIN:-}"
if [[ -z "$bin" ]]; then
    inst="${NAMESRV_ROOT:-/tmp/rmq-namesrv}"
    bin="$(ls "$inst"/bin/rocketmq-namesrv* 2>/dev/null | head -1 || true)"
    if [[ -z "$bin" ]]; then
        cargo install -q rocketmq-namesrv --root "$inst" || { echo "SKIPPED: cannot install rocketmq-namesrv"; exit 77; }
        bin="$(ls "$inst"/bin/rocketmq-namesrv* | head -1)"
    fi
fi
if [[ -z "${COREMQ_BIN:-}" ]]; then
    (cd "$root" && cargo build -q --features cli)
    COREMQ_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/coremq"
fi
py=python3
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ns_port=$(free_port); broker_port=$(free_port); own_ns=$(free_port); metrics_port=$(free_port)

(cd "$work" && ROCKETMQ_HOME="$work" "$bin" --listenPort "$ns_port" >"$work/namesrv.log" 2>&1) &
pids+=($!)
for _ in $(seq 100); do
    "$py" -c "import socket; socket.create_connection(('127.0.0.1',$ns_port),1)" 2>/dev/null && break
    sleep 0.2
done

cat >"$work/coremq.toml" <<TOML
namesrv_addr = ["127.0.0.1:$ns_port"]
register_interval_ms = 1000
TOML
"$COREMQ_BIN" serve --config "$work/coremq.toml" --data-dir "$work/data" --listen "127.0.0.1:$broker_port" \
    --namesrv-listen "127.0.0.1:$own_ns" --metrics-listen "127.0.0.1:$metrics_port" >"$work/node.log" 2>&1 &
pids+=($!)

set +e
"$py" - "$broker_port" "$ns_port" <<'PY'
import json, socket, struct, sys, time
broker, ns = int(sys.argv[1]), int(sys.argv[2])
def call(port, code, fields, opaque=1):
    head = json.dumps({"code": code, "language": "JAVA", "version": 0, "opaque": opaque,
                       "flag": 0, "extFields": fields, "serializeTypeCurrentRPC": "JSON"}).encode()
    frame = struct.pack(">I", len(head)) + head
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.sendall(struct.pack(">I", len(frame)) + frame)
    def read(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c: raise EOFError
            b += c
        return b
    total = struct.unpack(">I", read(4))[0]
    rest = read(total)
    hl = struct.unpack(">I", rest[:4])[0] & 0xFFFFFF
    return json.loads(rest[4:4 + hl]), rest[4 + hl:]
# Create the topic on the node; it registers with the name server within a second.
for _ in range(50):
    try:
        h, _ = call(broker, 17, {"topic": "JoinTopic", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"})
        break
    except OSError:
        time.sleep(0.2)
print("create topic:", h.get("code"), h.get("remark"))
deadline = time.time() + 20
while time.time() < deadline:
    h, body = call(ns, 105, {"topic": "JoinTopic"})
    if h.get("code") == 0 and str(broker).encode() in body:
        print("PASS the name server routes JoinTopic to the coremq node:", body[:200].decode(errors="replace"))
        sys.exit(0)
    time.sleep(0.5)
print("FAIL no route from the name server:", h, body[:300])
sys.exit(1)
PY
status=$?
if [[ $status -ne 0 ]]; then
    echo "--- node log"; tail -20 "$work/node.log"
    echo "--- name server log"; tail -20 "$work/namesrv.log"
fi
exit $status
