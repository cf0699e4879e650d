#!/usr/bin/env python3
"""Replication through a client nobody here wrote (the RocketMQ C++ client from PyPI
`rocketmq` 0.4.4): produce to a SYNC_MASTER coremq node, then pull every message from
its slave node (the slave's name server routes to the slave, broker id 1).

Usage: interop_ha_client.py MASTER_NAMESRV SLAVE_NAMESRV TOPIC   (exit 0 = all passed)
"""
import sys
import time

from rocketmq.client import Message, Producer, PullConsumer

master_ns, slave_ns, topic = sys.argv[1], sys.argv[2], sys.argv[3]
N = 40
checks = []


def check(name, ok, detail=""):
    checks.append(ok)
    print(("PASS " if ok else "FAIL ") + name + (": " + str(detail) if detail else ""), flush=True)


producer = Producer("interop-ha-producer")
producer.set_namesrv_addr(master_ns)
producer.start()
statuses = []
for i in range(N):
    msg = Message(topic)
    msg.set_keys("key-%d" % i)
    msg.set_body("body-%d" % i)
    statuses.append(producer.send_sync(msg).status)
producer.shutdown()
# SEND_OK = 0; a SYNC_MASTER answers SUCCESS only once its slave acknowledged.
check("send_sync x%d to the SYNC_MASTER acknowledged (SEND_OK)" % N,
      all(s == 0 for s in statuses), statuses[:5])

pc = PullConsumer("interop-ha-pull")
pc.set_namesrv_addr(slave_ns)
pc.start()
pulled = set()
deadline = time.time() + 30
while time.time() < deadline and len(pulled) < N:
    for m in pc.pull(topic):
        pulled.add(m.body.decode())
pc.shutdown()
check("pull consumer on the slave got all %d" % N,
      pulled == {"body-%d" % i for i in range(N)}, "%d distinct" % len(pulled))

print("%d passed, %d failed" % (sum(checks), len(checks) - sum(checks)))
sys.exit(0 if all(checks) else 1)
