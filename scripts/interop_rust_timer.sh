#!/usr/bin/env bash
# Timed messages with rocketmq-client-rust (crates.io, 1.0.0): runs scripts/interop-rust's
# `timer` program against a coremq node with `timer_max_delay_sec = 60`, and checks that
# messages sent with set_delay_time_sec / set_delay_time_ms / set_deliver_time_ms reach a
# push consumer once, not before their time and within 1 s after it, and that a time past
# the maximum is refused.
#
#   scripts/interop_rust_timer.sh   (INTEROP_RUST_TARGET, COREMQ_NETWORK as interop_rust.sh)
# Exit 0 when every check passed; 77 when the client cannot be built (skip).
exec "$(dirname "$0")/interop_rust_program.sh" timer RustTimer $'timer_max_delay_sec = 60\n'
