//! The node's transaction checker (RocketMQ's `TransactionalMessageCheckService` and
//! `Broker2Client.checkProducerTransactionState`): every
//! `transaction_check_interval_ms` a pass of `crate::transaction::check` finds half
//! messages undecided for `transaction_timeout_ms`, and each is asked about with a
//! one-way CHECK_TRANSACTION_STATE (39) sent over a connection of a producer of its
//! group (the first one registered by heartbeat, as RocketMQ picks one channel). The
//! producer answers with END_TRANSACTION. With no producer of that group connected the
//! check still counts (RocketMQ's rule), so a group gone for good ends in
//! `TRANS_CHECK_MAX_TIME_TOPIC` after `transaction_check_max` checks.
//!
//! The checker's progress in the half queue is group `CID_RMQ_SYS_TRANS`'s consumer
//! offset (persisted with the others in `config/consumerOffset.json`). Masters only.

use super::NodeState;
use super::broker2client::oneway_frame;
use super::remoting::codes::CHECK_TRANSACTION_STATE;
use super::state::Sent;
use crate::format::msg_id::MessageId;
use crate::transaction::check::{CheckBack, CheckRules, Checker};
use crate::transaction::{CHECK_GROUP, HALF_TOPIC, TRANSACTION_ID};
use std::sync::Arc;
use std::time::Duration;

pub(super) fn check_loop(st: Arc<NodeState>) {
    let every = Duration::from_millis(st.cfg.transaction_check_interval_ms);
    let rules = CheckRules {
        timeout: Duration::from_millis(st.cfg.transaction_timeout_ms),
        check_max: st.cfg.transaction_check_max,
    };
    let mut checker = Checker::default();
    while st.pause(every) {
        let progress = st.offsets.get(CHECK_GROUP, HALF_TOPIC, 0).unwrap_or(0);
        let pass = checker.pass(&st.handle, progress, rules, crate::now_ms(), |c| {
            ask(&st, c)
        });
        match futures_lite::future::block_on(pass) {
            Ok(report) => {
                if report.progress != progress {
                    st.offsets.set(CHECK_GROUP, HALF_TOPIC, 0, report.progress);
                }
                if report.checked + report.discarded > 0 {
                    tracing::info!(?report, "transaction check pass");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "transaction check pass failed; trying again later")
            }
        }
    }
}

/// Sends one CHECK_TRANSACTION_STATE for `c` to a producer of its group.
fn ask(st: &NodeState, c: CheckBack) {
    let offset_id = MessageId {
        store_host: st.broker_addr,
        offset: c.log_offset,
    }
    .to_string();
    let uniq = c
        .message
        .property("UNIQ_KEY")
        .map(str::to_string)
        .unwrap_or_else(|| offset_id.clone());
    let tx_id = c
        .message
        .property(TRANSACTION_ID)
        .map(str::to_string)
        .unwrap_or_else(|| uniq.clone());
    let fields = vec![
        (
            "tranStateTableOffset".to_string(),
            c.queue_offset.to_string(),
        ),
        ("commitLogOffset".to_string(), c.log_offset.to_string()),
        ("msgId".to_string(), uniq),
        ("transactionId".to_string(), tx_id),
        ("offsetMsgId".to_string(), offset_id),
    ];
    let frame = oneway_frame(CHECK_TRANSACTION_STATE, fields, c.record.clone());
    let sent = st
        .producers
        .connections(&c.group)
        .into_iter()
        .any(|conn| st.outboxes.send(conn, frame.clone()) == Sent::Queued);
    if !sent {
        tracing::warn!(
            group = %c.group,
            offset = c.queue_offset,
            "transaction check: no connected producer of the group to ask; the check counts"
        );
    }
}
