#!/usr/bin/env bash
# Replication interop with rocketmq-rust's store crate (crates.io `rocketmq-store`
# 1.0.0: its classic DefaultHAService and DefaultHAClient), both directions, in one
# program (scripts/interop-ha, its own workspace and target dir; a heavy build, about
# 6 minutes on 2 cores the first time):
#   1. a one-shard coremq master, a RocketMQ slave: the slave reaches the master's end,
#      its commit-log bytes equal coremq's, its queues serve every message (whole copy,
#      ha.empty_slave_start = first), and from the master's last segment (RocketMQ's
#      rule) the bytes from there are equal;
#   2. a RocketMQ master, a one-shard coremq slave (record_crc off): the slave begins at
#      the master's last segment, its bytes equal the master's from there, and it
#      serves every replicated message by queue and by key;
#   3. a control with no coremq (RocketMQ master and slave), printed as a NOTE.
#
#   scripts/interop_ha.sh [MESSAGES]   (INTEROP_HA_TARGET=dir to reuse a target dir)
# Exit 0 when every check passed; 77 when the program cannot be built (skip).
# Not run by CI (the build is too long for it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${INTEROP_HA_TARGET:-/tmp/coremq-interop-ha-target}"
(cd "$here/interop-ha" && CARGO_TARGET_DIR="$target" cargo build -q) \
    || { echo "SKIPPED: cannot build the rocketmq-store interop program"; exit 77; }
RUST_LOG="${RUST_LOG:-error}" timeout 600 "$target/debug/coremq-interop-ha" "${1:-3000}"
