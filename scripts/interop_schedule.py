#!/usr/bin/env python3
"""Delay levels and consumer retries with a RocketMQ client nobody here wrote (PyPI
`rocketmq` 0.4.4, Apache's C++ client). The node runs with a short delay table (level
n = n seconds, see interop_schedule.sh):

* messages sent with `set_delay_time_level(2)` reach a push consumer no sooner than
  2 s after they were sent, and within 2 s + 3 s;
* a push consumer that fails a message (its callback raises: RECONSUME_LATER, the
  client sends it back) sees it again after level 3 + reconsumeTimes (3 s, then 4 s),
  with reconsume_times 1, then 2, and never sooner.

Usage: interop_schedule.py NAMESRV_ADDR   (exit 0 = every check passed)
"""
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

namesrv = sys.argv[1]
checks = []


def check(name, ok, detail=""):
    checks.append(ok)
    print(("PASS " if ok else "FAIL ") + name + (": " + str(detail) if detail else ""), flush=True)


producer = Producer("interop-sched-producer")
producer.set_namesrv_addr(namesrv)
producer.start()

# Delay level 2 (2 s here).
arrived = {}
delay_done = threading.Event()


def on_delayed(msg):
    arrived.setdefault(msg.body.decode(), time.time())
    if len(arrived) >= 3:
        delay_done.set()


delayed = PushConsumer("interop-delay")
delayed.set_namesrv_addr(namesrv)
delayed.subscribe("DelayTopic", on_delayed)
delayed.start()
time.sleep(1)
sent = {}
for i in range(3):
    m = Message("DelayTopic")
    m.set_body("delayed-%d" % i)
    m.set_delay_time_level(2)
    sent["delayed-%d" % i] = time.time()
    r = producer.send_sync(m)
    check("send delayed-%d" % i, r.status == 0, (r.status, r.msg_id))
delay_done.wait(20)
waits = {k: arrived[k] - sent[k] for k in arrived}
check("3 delayed messages arrived", len(arrived) == 3, sorted(arrived))
# Store timestamps (and so due times) are whole milliseconds, as RocketMQ's: a message
# stored 0.9 ms into a millisecond is due up to 1 ms before its send + 2 s in real time.
check("none before its 2 s (to the millisecond)", all(w >= 2.0 - 0.001 for w in waits.values()), waits)
check("each within 3 s (< 1 s late)", all(w < 3.0 for w in waits.values()), waits)
delayed.shutdown()

# Retries: fail twice, then take it.
seen = []
retry_done = threading.Event()


def on_retry(msg):
    seen.append((time.time(), msg.reconsume_times, msg.body.decode()))
    if len(seen) < 3:
        raise RuntimeError("fail on purpose (attempt %d)" % len(seen))
    retry_done.set()


retry = PushConsumer("interop-retry")
retry.set_namesrv_addr(namesrv)
retry.subscribe("RetryTopic", on_retry)
retry.start()
time.sleep(1)
m = Message("RetryTopic")
m.set_body("poison")
r = producer.send_sync(m)
check("send poison", r.status == 0, (r.status, r.msg_id))
retry_done.wait(30)
check("seen 3 times", len(seen) == 3, [(round(t - seen[0][0], 2), n, b) for t, n, b in seen])
if len(seen) == 3:
    gaps = [seen[1][0] - seen[0][0], seen[2][0] - seen[1][0]]
    check("reconsume_times 0, 1, 2", [n for _, n, _ in seen] == [0, 1, 2], [n for _, n, _ in seen])
    check("back-off: 3 s then 4 s, never sooner", gaps[0] >= 3.0 and gaps[1] >= 4.0, gaps)
    check("back-off not much later (< 1 s late)", gaps[0] < 4.0 and gaps[1] < 5.0, gaps)
retry.shutdown()
producer.shutdown()

print("%d passed, %d failed" % (sum(checks), len(checks) - sum(checks)))
sys.exit(0 if all(checks) else 1)
