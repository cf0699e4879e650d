#!/usr/bin/env bash
# Transactions with rocketmq-client-rust (crates.io, 1.0.0): runs scripts/interop-rust's
# `transaction` program against a coremq node with a 1 s transaction timeout and a 200 ms
# check interval, and checks commit, rollback, and "unknown" answered through the broker's
# check-back (CHECK_TRANSACTION_STATE) with TransactionMQProducer.
#
#   scripts/interop_rust_transaction.sh   (INTEROP_RUST_TARGET, COREMQ_NETWORK as interop_rust.sh)
# Exit 0 when every check passed; 77 when the client cannot be built (skip).
exec "$(dirname "$0")/interop_rust_program.sh" transaction RustTx \
    $'transaction_timeout_ms = 1000\ntransaction_check_interval_ms = 200\n'
