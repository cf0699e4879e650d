//! Transactions through rocketmq-client-rust's TransactionMQProducer against a coremq
//! node: a message committed by the local transaction is consumed; one rolled back is
//! never consumed; one left "unknown" is checked back by the broker
//! (CHECK_TRANSACTION_STATE over the producer's connection), committed by the check
//! listener, then consumed. The node runs with short transaction timeouts
//! (scripts/interop_rust_transaction.sh).
//! Usage: transaction NAMESRV_ADDR TOPIC (exit 0 = every check passed).
use std::any::Any;
use std::collections::HashSet;
#[path = "../common.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, DefaultMQPushConsumer, LocalTransactionState, MQPushConsumer,
    MessageListenerConcurrently, TransactionListener, TransactionMQProducer,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;

fn body_of(m: &dyn MessageTrait) -> String {
    m.get_body()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// Decides by body; counts check-backs per body.
struct Local(Arc<Mutex<Vec<String>>>);

impl TransactionListener for Local {
    fn execute_local_transaction(
        &self,
        msg: &dyn MessageTrait,
        _arg: Option<&(dyn Any + Send + Sync)>,
    ) -> LocalTransactionState {
        match body_of(msg).as_str() {
            "tx-commit" => LocalTransactionState::CommitMessage,
            "tx-rollback" => LocalTransactionState::RollbackMessage,
            _ => LocalTransactionState::Unknown,
        }
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        let body = body_of(msg);
        self.0.lock().unwrap().push(body.clone());
        if body == "tx-unknown" {
            LocalTransactionState::CommitMessage
        } else {
            LocalTransactionState::RollbackMessage
        }
    }
}

struct Collect(Arc<Mutex<HashSet<String>>>);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _ctx: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let mut got = self.0.lock().unwrap();
        for m in msgs {
            got.insert(body_of(*m));
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

#[tokio::main]
async fn main() -> ClientResult<()> {
    let namesrv = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "RustTx".into());
    let client = common::Client::start("interop-tx")?;
    let rt = client.rt.clone();
    let checks: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut producer = TransactionMQProducer::builder(rt.clone())
        .producer_group("rust-tx-group".to_string())
        .name_server_addr(namesrv.clone())
        .transaction_listener(Local(checks.clone()))
        .build();
    producer.start().await?;
    let mut tally = common::Checks::default();
    let got: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut consumer = DefaultMQPushConsumer::builder(rt.clone())
        .consumer_group("rust-tx-consumer".to_string())
        .name_server_addr(namesrv.clone())
        .build();
    consumer.subscribe(&topic, "*").await?;
    consumer.register_message_listener_concurrently(Collect(got.clone()));
    consumer.start().await?;
    let sent_at = Instant::now();
    for body in ["tx-commit", "tx-rollback", "tx-unknown"] {
        let msg = Message::builder()
            .topic(topic.as_str())
            .body_slice(body.as_bytes())
            .build_unchecked();
        match producer.send_message_in_transaction::<(), _>(msg, None).await {
            Ok(r) => tally.check(
                &format!("send {body} in a transaction"),
                true,
                format!("{:?}", r.local_transaction_state),
            ),
            Err(e) => tally.check(&format!("send {body} in a transaction"), false, format!("{e}")),
        }
    }
    let t0 = Instant::now();
    while !got.lock().unwrap().contains("tx-commit") && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tally.check(
        "committed message consumed",
        got.lock().unwrap().contains("tx-commit"),
        format!("{:?}", t0.elapsed()),
    );
    while !got.lock().unwrap().contains("tx-unknown") && t0.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = sent_at.elapsed();
    tally.check(
        "unknown message committed from the check-back and consumed",
        got.lock().unwrap().contains("tx-unknown"),
        format!("after {took:?}, checks {:?}", checks.lock().unwrap()),
    );
    tally.check(
        "checked back no sooner than the transaction timeout (1 s)",
        took >= Duration::from_millis(1000),
        format!("{took:?}"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = got.lock().unwrap().clone();
    tally.check(
        "rolled-back message never consumed",
        !seen.contains("tx-rollback"),
        format!("{seen:?}"),
    );
    let asked = checks.lock().unwrap().clone();
    tally.check(
        "only the unknown one was checked back",
        !asked.is_empty() && asked.iter().all(|b| b == "tx-unknown"),
        format!("{asked:?}"),
    );
    consumer.shutdown().await;
    producer.shutdown().await;
    tally.exit();
}
