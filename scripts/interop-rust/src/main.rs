//! Interop check of a coremq node with the rocketmq-client-rust crate: produce with
//! keys, query by key, view by message id, queue offsets, a push consumer (long
//! polling, committed offsets, a failed message redelivered through the retry topic).
//! Usage: coremq-interop-rust NAMESRV_ADDR TOPIC (exit 0 = every check passed).
use std::sync::Arc;

use rocketmq_client_rust::{
    ClientError, ClientResult, ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, DefaultMQProducer, DefaultMQPushConsumer, MQPushConsumer,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use std::collections::HashSet;
use std::sync::Mutex;

struct Collect(Arc<Mutex<HashSet<String>>>, Arc<Mutex<u32>>);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _ctx: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let mut got = self.0.lock().unwrap();
        for m in msgs {
            if let Some(b) = m.body() {
                let body = String::from_utf8_lossy(&b).into_owned();
                if body == "rust-retry" {
                    // Fail the first delivery: the client sends it back, and it must
                    // come again (through the group's retry topic).
                    let mut seen = self.1.lock().unwrap();
                    *seen += 1;
                    if *seen == 1 {
                        return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
                    }
                }
                got.insert(body);
            }
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
        .unwrap_or_else(|| "RustInterop".into());
    let owner = RuntimeOwner::plan(RuntimeConfig {
        thread_name: "interop".into(),
        ..Default::default()
    })
    .expect("runtime config")
    .build()
    .map_err(|e| ClientError::internal("runtime", e))?;
    let telemetry = rocketmq_observability::install_global(
        &rocketmq_observability::TelemetryBootstrapConfig::default(),
    )
    .map_err(|e| ClientError::internal("telemetry", e))?;
    let rt: Arc<ClientRuntime> = ClientRuntime::try_new(
        owner.root_context().component("client"),
        ClientRuntimeConfig::default(),
        telemetry.handle(),
    )?;
    let mut producer = DefaultMQProducer::builder(rt.clone())
        .producer_group("rust-interop".to_string())
        .name_server_addr(namesrv.clone())
        .build();
    producer.start().await?;
    let mut passed = 0;
    let mut failed = 0;
    let mut check = |name: &str, ok: bool, detail: String| {
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        if ok {
            passed += 1
        } else {
            failed += 1
        }
    };
    let mut results = Vec::new();
    for i in 0..5 {
        let msg = Message::builder()
            .topic(topic.as_str())
            .tags("TagR")
            .key(format!("rust-key-{i}"))
            .body_slice(format!("rust-body-{i}").as_bytes())
            .build_unchecked();
        match producer.send_with_timeout(msg, 5000).await {
            Ok(Some(r)) => results.push(r),
            Ok(None) => check("send", false, "no result".into()),
            Err(e) => check("send", false, format!("{e}")),
        }
    }
    check(
        "send x5",
        results.len() == 5,
        format!(
            "{:?}",
            results
                .first()
                .map(|r| (&r.send_status, &r.msg_id, &r.offset_msg_id, r.queue_offset))
        ),
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    match producer
        .query_message(&topic, "rust-key-3", 32, 0, now + 60_000)
        .await
    {
        Ok(q) => {
            let bodies: Vec<String> = q
                .message_list()
                .iter()
                .filter_map(|m| m.body())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect();
            check(
                "query by key",
                bodies.contains(&"rust-body-3".to_string()),
                format!("{bodies:?}"),
            );
        }
        Err(e) => check("query by key", false, format!("{e}")),
    }
    if let Some(id) = results
        .get(2)
        .and_then(|r| r.offset_msg_id.as_ref().map(|s| s.to_string()))
    {
        match producer.view_message(&topic, &id).await {
            Ok(m) => {
                let body = m.body().map(|b| String::from_utf8_lossy(&b).into_owned());
                check(
                    "view by offset msg id",
                    body.as_deref() == Some("rust-body-2"),
                    format!("{id} -> {body:?}"),
                );
            }
            Err(e) => check("view by offset msg id", false, format!("{id}: {e}")),
        }
    } else {
        check(
            "view by offset msg id",
            false,
            "no offset msg id in the send result".into(),
        );
    }
    if let Some(mq) = results.first().and_then(|r| r.message_queue.clone()) {
        match producer.max_offset(&mq).await {
            Ok(o) => check("max offset", o >= 1, format!("{mq:?}: {o}")),
            Err(e) => check("max offset", false, format!("{e}")),
        }
        match producer.search_offset(&mq, 0).await {
            Ok(o) => check("search offset by time", o == 0, format!("{o}")),
            Err(e) => check("search offset by time", false, format!("{e}")),
        }
    }
    // Push consumer (long polling, offsets committed by the client).
    let got: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut consumer = DefaultMQPushConsumer::builder(rt.clone())
        .consumer_group("rust-interop-push".to_string())
        .name_server_addr(namesrv.clone())
        .build();
    consumer.subscribe(&topic, "*").await?;
    let retry_seen: Arc<Mutex<u32>> = Arc::default();
    consumer.register_message_listener_concurrently(Collect(got.clone(), retry_seen.clone()));
    consumer.start().await?;
    let t0 = std::time::Instant::now();
    while got.lock().unwrap().len() < 5 && t0.elapsed() < std::time::Duration::from_secs(30) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let n = got.lock().unwrap().len();
    check(
        "push consumer got all 5",
        n >= 5,
        format!("{n} in {:?}", t0.elapsed()),
    );
    let late = Message::builder()
        .topic(topic.as_str())
        .body_slice(b"rust-late")
        .build_unchecked();
    let t1 = std::time::Instant::now();
    let _ = producer.send_with_timeout(late, 5000).await;
    while !got.lock().unwrap().contains("rust-late")
        && t1.elapsed() < std::time::Duration::from_secs(15)
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    check(
        "push consumer woke for a new message",
        got.lock().unwrap().contains("rust-late"),
        format!("{:?}", t1.elapsed()),
    );
    let retry = Message::builder()
        .topic(topic.as_str())
        .body_slice(b"rust-retry")
        .build_unchecked();
    let t2 = std::time::Instant::now();
    let _ = producer.send_with_timeout(retry, 5000).await;
    while !got.lock().unwrap().contains("rust-retry")
        && t2.elapsed() < std::time::Duration::from_secs(30)
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let deliveries = *retry_seen.lock().unwrap();
    check(
        "failed message redelivered",
        got.lock().unwrap().contains("rust-retry") && deliveries >= 2,
        format!("{deliveries} deliveries in {:?}", t2.elapsed()),
    );
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    consumer.shutdown().await;
    producer.shutdown().await;
    println!("{passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
