#!/usr/bin/env python3
"""Drives a coremq node with the RocketMQ C++ client (PyPI `rocketmq`, which bundles
librocketmq.so): produce (single and batch), consume with a pull consumer and a push
consumer (offsets committed by the client), and check what came back.

Usage: interop_client.py NAMESRV_ADDR TOPIC   (exit 0 = every check passed)
"""
import sys
import threading
import time

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer

namesrv, topic = sys.argv[1], sys.argv[2]
N = 20
checks = []


def check(name, ok, detail=""):
    checks.append(ok)
    print(("PASS " if ok else "FAIL ") + name + (": " + str(detail) if detail else ""), flush=True)


producer = Producer("interop-producer")
producer.set_namesrv_addr(namesrv)
producer.start()
sent = {}
for i in range(N):
    msg = Message(topic)
    msg.set_keys("key-%d" % i)
    msg.set_tags("tagA" if i % 2 == 0 else "tagB")
    msg.set_body("body-%d" % i)
    r = producer.send_sync(msg)
    sent["body-%d" % i] = r
check("send_sync x%d" % N, all(r.status == 0 for r in sent.values()),
      [(r.status, r.msg_id, r.offset) for r in list(sent.values())[:3]])

batch = []
for i in range(N, N + 5):
    msg = Message(topic)
    msg.set_keys("key-%d" % i)
    msg.set_body("body-%d" % i)
    batch.append(msg)
try:
    r = producer.send_batch(batch)
    check("send_batch x5", r.status == 0, (r.status, r.msg_id, r.offset))
    total = N + 5
except Exception as e:  # noqa: BLE001
    check("send_batch x5", False, repr(e))
    total = N
producer.shutdown()

# Pull consumer: reads every queue from the start.
# The Python wrapper keeps its pull offsets by topic and queue id alone
# (`PullConsumer._get_mq_key`), so with more than one broker (a node's shard ports, or
# any RocketMQ cluster) queue 0 of one broker starts where queue 0 of the other
# stopped. Keyed by broker too here; the C++ client underneath is unchanged.
PullConsumer._get_mq_key = lambda self, mq: "%s@%s@%s" % (mq.topic, mq.brokerName, mq.queueId)
pc = PullConsumer("interop-pull")
pc.set_namesrv_addr(namesrv)
pc.start()
pulled = []
deadline = time.time() + 20
while time.time() < deadline and len(pulled) < total:
    for m in pc.pull(topic):
        pulled.append(m.body.decode())
pc.shutdown()
check("pull consumer got all %d" % total, len(set(pulled)) == total,
      "%d distinct" % len(set(pulled)))

# Push consumer: long polling, offsets committed to the broker by the client.
got = set()
done = threading.Event()


def on_message(msg):
    got.add(msg.body.decode())
    if len(got) >= total:
        done.set()


push = PushConsumer("interop-push")
push.set_namesrv_addr(namesrv)
push.subscribe(topic, on_message)
push.start()
done.wait(30)
check("push consumer got all %d" % total, len(got) >= total, "%d distinct" % len(got))
# A message sent while the push consumer waits arrives through a held pull.
producer = Producer("interop-producer-2")
producer.set_namesrv_addr(namesrv)
producer.start()
late = Message(topic)
late.set_body("late")
t0 = time.time()
producer.send_sync(late)
while "late" not in got and time.time() - t0 < 10:
    time.sleep(0.01)
check("push consumer woke for a new message", "late" in got, "%.3f s" % (time.time() - t0))
producer.shutdown()
time.sleep(6)  # the client commits offsets every 5 s
push.shutdown()

print("%d passed, %d failed" % (sum(checks), len(checks) - sum(checks)))
sys.exit(0 if all(checks) else 1)
