//! Timed messages through rocketmq-client-rust against a coremq node: messages sent with
//! `set_delay_time_sec`, `set_delay_time_ms` and `set_deliver_time_ms` (RocketMQ 5's
//! `TIMER_DELAY_SEC`, `TIMER_DELAY_MS`, `TIMER_DELIVER_MS`) reach a push consumer no
//! sooner than their time and close after it, once each; a time too far ahead is refused
//! (scripts/interop_rust_timer.sh starts the node with `timer_max_delay_sec = 60`).
//! Usage: timer NAMESRV_ADDR TOPIC (exit 0 = every check passed).
use std::collections::HashMap;
#[path = "../common.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, DefaultMQProducer, DefaultMQPushConsumer, MQPushConsumer,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// body -> every arrival time (epoch ms).
struct Collect(Arc<Mutex<HashMap<String, Vec<u64>>>>);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _ctx: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let at = now_ms();
        let mut got = self.0.lock().unwrap();
        for m in msgs {
            let body = m
                .get_body()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            got.entry(body).or_default().push(at);
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

#[tokio::main]
async fn main() -> ClientResult<()> {
    let namesrv = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = std::env::args().nth(2).unwrap_or_else(|| "RustTimer".into());
    let client = common::Client::start("interop-timer")?;
    let rt = client.rt.clone();
    let mut tally = common::Checks::default();
    let got: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
    let mut consumer = DefaultMQPushConsumer::builder(rt.clone())
        .consumer_group("rust-timer-consumer".to_string())
        .name_server_addr(namesrv.clone())
        .build();
    consumer.subscribe(&topic, "*").await?;
    consumer.register_message_listener_concurrently(Collect(got.clone()));
    consumer.start().await?;
    let mut producer = DefaultMQProducer::builder(rt.clone())
        .producer_group("rust-timer-producer".to_string())
        .name_server_addr(namesrv.clone())
        .build();
    producer.start().await?;
    // A plain message first: routes and the consumer are up once it arrives.
    let plain = Message::builder()
        .topic(topic.as_str())
        .body_slice(b"plain")
        .build_unchecked();
    producer.send_with_timeout(plain, 5000).await?;
    let t0 = Instant::now();
    while !got.lock().unwrap().contains_key("plain") && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tally.check(
        "plain message consumed",
        got.lock().unwrap().contains_key("plain"),
        format!("{:?}", t0.elapsed()),
    );
    // (body, due epoch ms) of each timed send.
    let mut due: Vec<(String, u64)> = Vec::new();
    for (i, how) in ["sec", "ms", "deliver", "ms-short", "deliver-late"].iter().enumerate() {
        let body = format!("timed-{how}");
        let mut msg = Message::builder()
            .topic(topic.as_str())
            .body_slice(body.as_bytes())
            .build_unchecked();
        let sent = now_ms();
        let at = match *how {
            "sec" => {
                msg.set_delay_time_sec(3);
                sent + 3000
            }
            "ms" => {
                msg.set_delay_time_ms(2500);
                sent + 2500
            }
            "deliver" => {
                msg.set_deliver_time_ms(sent + 4000);
                sent + 4000
            }
            "ms-short" => {
                msg.set_delay_time_ms(700);
                sent + 700
            }
            _ => {
                msg.set_deliver_time_ms(sent + 1500);
                sent + 1500
            }
        };
        match producer.send_with_timeout(msg, 5000).await {
            Ok(r) => tally.check(&format!("send {body}"), r.is_some(), format!("{r:?}")),
            Err(e) => tally.check(&format!("send {body}"), false, format!("{e}")),
        }
        due.push((body, at));
        let _ = i;
    }
    // Too far ahead: refused (the node allows 60 s).
    let mut far = Message::builder()
        .topic(topic.as_str())
        .body_slice(b"timed-too-far")
        .build_unchecked();
    far.set_delay_time_sec(120);
    let r = producer.send_with_timeout(far, 5000).await;
    tally.check(
        "a delivery time past timer_max_delay_sec is refused",
        r.is_err(),
        match r {
            Ok(r) => format!("accepted: {r:?}"),
            Err(e) => format!("{e}"),
        },
    );
    let t0 = Instant::now();
    loop {
        let done = {
            let g = got.lock().unwrap();
            due.iter().all(|(b, _)| g.contains_key(b))
        };
        if done || t0.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Duplicates would show up now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let g = got.lock().unwrap().clone();
    for (body, at) in &due {
        match g.get(body) {
            None => tally.check(&format!("{body} consumed"), false, "never".into()),
            Some(times) => {
                let first = times[0];
                tally.check(
                    &format!("{body} consumed once, not before its time, within 1 s after"),
                    times.len() == 1 && first >= *at && first < at + 1000,
                    format!("{} copies, {} ms after its time", times.len(), first as i64 - *at as i64),
                );
            }
        }
    }
    tally.check(
        "the refused one never arrives",
        !g.contains_key("timed-too-far"),
        format!("{:?}", g.keys().collect::<Vec<_>>()),
    );
    consumer.shutdown().await;
    producer.shutdown().await;
    tally.exit();
}
