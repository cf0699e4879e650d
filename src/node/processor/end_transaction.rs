//! RocketMQ's `EndTransactionProcessor`: `END_TRANSACTION` (37), a producer's decision
//! about a half message (`crate::transaction` has the records). Commit (8) puts the
//! message into its real queue, then writes the op record; rollback (12) writes the op
//! record only; unknown (0) does nothing (the checker asks later). The half message is
//! found by `commitLogOffset` and must be in the half topic, at `tranStateTableOffset`,
//! of the request's `producerGroup`, as RocketMQ checks. Producers send this one-way:
//! refusals are logged as well as answered.

use super::{NodeState, Reject, field, num, ok, reject, store_error};
use crate::StoreOps;
use crate::format::record::{SYSFLAG_TRANSACTION_COMMIT, SYSFLAG_TRANSACTION_ROLLBACK};
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::shard::shard_of_offset;
use crate::transaction::{self, HALF_TOPIC, PGROUP};
use std::net::SocketAddr;

pub(super) async fn end_transaction(
    st: &NodeState,
    req: &RemotingCommand,
    peer: SocketAddr,
) -> Result<RemotingCommand, Reject> {
    let r = decide(st, req, peer).await;
    if let Err((code, remark)) = &r {
        tracing::warn!(code, remark = %remark, fields = ?req.ext_fields, "END_TRANSACTION refused");
    }
    r
}

async fn decide(
    st: &NodeState,
    req: &RemotingCommand,
    peer: SocketAddr,
) -> Result<RemotingCommand, Reject> {
    if st.broker_id != 0 {
        return Err(reject(
            SLAVE_NOT_AVAILABLE,
            "message store is slave mode, so end transaction is forbidden",
        ));
    }
    let group = field(req, "producerGroup")?;
    let kind: i32 = num(req, "commitOrRollback")?;
    let log_offset: i64 = num(req, "commitLogOffset")?;
    let queue_offset: i64 = num(req, "tranStateTableOffset")?;
    if kind != SYSFLAG_TRANSACTION_COMMIT && kind != SYSFLAG_TRANSACTION_ROLLBACK {
        if kind == 0 {
            return Ok(ok(req)); // unknown: the checker asks again later
        }
        return Err(reject(
            SYSTEM_ERROR,
            format!("commitOrRollback {kind} is not 0, 8 (commit) or 12 (rollback)"),
        ));
    }
    let not_found = || {
        reject(
            SYSTEM_ERROR,
            format!(
                "find prepared transaction message failed: no half message at commit log offset {log_offset}"
            ),
        )
    };
    if log_offset < 0 || shard_of_offset(log_offset as u64) >= st.handle.shards() {
        return Err(not_found());
    }
    let half = st
        .handle
        .look_by_offset(log_offset as u64)
        .await
        .map_err(store_error)?
        .ok_or_else(not_found)?;
    if half.topic != HALF_TOPIC {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "the message at commit log offset {log_offset} is in topic {}, not a half message",
                half.topic
            ),
        ));
    }
    if half.property(PGROUP) != Some(group) {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "the producer group of the half message at {log_offset} is {:?}, not {group:?}",
                half.property(PGROUP)
            ),
        ));
    }
    if half.queue_offset as i64 != queue_offset {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "the half message at {log_offset} has queue offset {}, not tranStateTableOffset {queue_offset}",
                half.queue_offset
            ),
        ));
    }
    if kind == SYSFLAG_TRANSACTION_COMMIT {
        let msg = transaction::committed(&half, log_offset as u64).ok_or_else(|| {
            reject(
                SYSTEM_ERROR,
                format!("the half message at {log_offset} has no valid REAL_TOPIC/REAL_QID"),
            )
        })?;
        // Its dispatch wakes the pulls held on its queue (`StoreConfig::on_arrival`).
        let r = st.handle.put(msg).await;
        if !r.status.is_stored() {
            return Err(reject(
                SYSTEM_ERROR,
                format!(
                    "commit of the half message at {log_offset} not stored ({:?}); it stays undecided",
                    r.status
                ),
            ));
        }
    }
    let op = st
        .handle
        .put(transaction::op_record(half.queue_offset, peer))
        .await;
    if !op.status.is_stored() {
        // The decision holds for a commit (the message is stored); the checker will
        // ask about it again, as RocketMQ's does when its op put fails.
        tracing::warn!(offset = half.queue_offset, status = ?op.status, "END_TRANSACTION: the op record was refused");
    }
    Ok(ok(req))
}
