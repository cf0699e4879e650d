#!/usr/bin/env python3
"""A stand-in RocketMQ client for scripts/interop_admin.sh: it connects to the broker,
sends one HEART_BEAT (34) naming a consumer group (subscribed to a topic) and a
producer group, and then stays connected, heartbeating every 5 s, so the admin tool
finds a consumer and a producer online (consumerConnection, producerConnection,
consumerProgress, resetOffsetByTime). Every request the broker sends it (codes 40
NOTIFY_CONSUMER_IDS_CHANGED, 220 RESET_CONSUMER_CLIENT_OFFSET) is written to the log
file as one line: `<code> <header fields as JSON> <body>`.

Usage: interop_admin_client.py BROKER_HOST:PORT CONSUMER_GROUP PRODUCER_GROUP TOPIC LOG
Runs until killed. Only the standard library.
"""
import json
import socket
import struct
import sys
import threading
import time

host, port = sys.argv[1].rsplit(":", 1)
consumer_group, producer_group, topic, log_path = sys.argv[2:6]
client_id = "127.0.0.1@coremq-admin-interop"

sock = socket.create_connection((host, int(port)))
write_lock = threading.Lock()
opaque = [0]


def send_request(code, fields, body=b""):
    """One JSON-serialized RocketMQ remoting request."""
    opaque[0] += 1
    header = json.dumps({
        "code": code, "language": "JAVA", "version": 401, "opaque": opaque[0],
        "flag": 0, "extFields": fields,
    }).encode()
    # Length of what follows, then serialize type 0 (JSON) in the top byte of the
    # header length word.
    frame = struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body
    with write_lock:
        sock.sendall(frame)


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the broker closed the connection")
        buf += chunk
    return buf


def decode_header(kind, raw):
    """(code, flag, extFields) of a JSON (kind 0) or binary (kind 1) header."""
    if kind == 0:
        h = json.loads(raw)
        return h["code"], h.get("flag", 0), h.get("extFields") or {}
    code, _lang, _version, _opaque, flag, remark_len = struct.unpack(">hBhiii", raw[:17])
    at = 17 + remark_len
    ext_len = struct.unpack(">i", raw[at:at + 4])[0]
    at += 4
    end = at + ext_len
    fields = {}
    while at < end:
        klen = struct.unpack(">h", raw[at:at + 2])[0]
        key = raw[at + 2:at + 2 + klen].decode()
        at += 2 + klen
        vlen = struct.unpack(">i", raw[at:at + 4])[0]
        fields[key] = raw[at + 4:at + 4 + vlen].decode()
        at += 4 + vlen
    return code, flag, fields


def heartbeat():
    body = json.dumps({
        "clientID": client_id,
        "consumerDataSet": [{
            "groupName": consumer_group, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
            "unitMode": False,
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "expressionType": "TAG",
                                     "classFilterMode": False, "tagsSet": [], "codeSet": [],
                                     "subVersion": int(time.time() * 1000)}],
        }],
        "producerDataSet": [{"groupName": producer_group}],
    }).encode()
    send_request(34, {}, body)


def heartbeats():
    while True:
        time.sleep(5)
        heartbeat()


heartbeat()
threading.Thread(target=heartbeats, daemon=True).start()
with open(log_path, "a", buffering=1) as log:
    print("connected", flush=True)
    while True:
        length = struct.unpack(">I", read_exact(4))[0]
        payload = read_exact(length)
        word = struct.unpack(">I", payload[:4])[0]
        kind, header_len = word >> 24, word & 0xFFFFFF
        raw = payload[4:4 + header_len]
        body = payload[4 + header_len:]
        code, flag, fields = decode_header(kind, raw)
        if flag & 1:
            continue  # a response to one of our heartbeats
        log.write("%d %s %s\n" % (code, json.dumps(fields), body.decode("utf-8", "replace")))
