//! The store side of RocketMQ's `AdminBrokerProcessor`, what `mqadmin` and
//! `rocketmq-admin-cli` ask a broker about its store:
//!
//! | code | request | here |
//! |---|---|---|
//! | 28 `GET_BROKER_RUNTIME_INFO` | none | KVTable of RocketMQ's keys (reference §25.4) from the store's statistics (`crate::stats`) |
//! | 26 `GET_BROKER_CONFIG` | none | `key=value` lines, RocketMQ's key names |
//! | 25 `UPDATE_BROKER_CONFIG` | properties text | the retention keys, applied to every shard at once (not written to a file: `coremq.toml` decides at the next start); any other key is refused naming it |
//! | 202 `GET_TOPIC_STATS_INFO` | `topic` | each queue's min, max and last store time |
//! | 215 `DELETE_TOPIC_IN_BROKER` | `topic` | the topic's config, consumer offsets and queues (the store's `delete_topic`; records age out of the log) |
//! | 316 `CLEAN_UNUSED_TOPIC` | none | queues of topics not in the topic table deleted (`cleanUnusedTopic`) |
//! | 329 `DELETE_EXPIRED_COMMITLOG` | none | a retention pass now on every shard (`executeDeleteFilesManually`) |
//!
//! Bodies with `MessageQueue` keys are written as fastjson writes them (object keys,
//! not strings: reference §25.1), by hand, since serde_json cannot.

use super::{NodeState, Reject, clip, field, ok, reject, store_error, valid_topic};
use crate::StoreOps;
use crate::config::RetentionConfig;
use crate::message::GetStatus;
use crate::node::remoting::RemotingCommand;
use crate::node::remoting::codes::*;
use crate::node::shard_view::{ShardView, listed};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

fn with_remark(c: RemotingCommand, remark: String) -> RemotingCommand {
    RemotingCommand {
        remark: Some(remark),
        ..c
    }
}

/// System topics a delete must not touch.
fn is_system_topic(t: &str) -> bool {
    t == "TBW102"
        || t == "SCHEDULE_TOPIC_XXXX"
        || t == "OFFSET_MOVED_EVENT"
        || t == "SELF_TEST_TOPIC"
        || t.starts_with("rmq_sys_")
        || t.starts_with("RMQ_SYS_")
}

/// `{"brokerName":..,"queueId":..,"topic":..}`, a fastjson `MessageQueue` key.
pub(crate) fn mq_key(broker: &str, topic: &str, queue_id: i32) -> String {
    format!(
        "{{\"brokerName\":{},\"queueId\":{queue_id},\"topic\":{}}}",
        serde_json::Value::from(broker),
        serde_json::Value::from(topic)
    )
}

/// Store time of the message at queue offset `q`, 0 when there is none.
pub(super) async fn store_time_at(st: &NodeState, topic: &str, queue_id: i32, q: u64) -> i64 {
    match st.handle.get(topic, queue_id, q, 1, 1 << 20).await {
        Ok(r) if r.status == GetStatus::Found => r
            .records
            .first()
            .and_then(|raw| crate::StoredMessage::decode(raw).ok())
            .map_or(0, |m| m.store_timestamp_ms),
        _ => 0,
    }
}

pub(super) async fn runtime_info(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let report = st.handle.stats().await.map_err(store_error)?;
    let t = &report.total;
    let space = crate::io::Disk::Real.space(&st.cfg.data_dir).ok().flatten();
    let mut kv: BTreeMap<&str, String> = BTreeMap::new();
    let now = crate::now_ms();
    kv.insert("bootTimestamp", st.started_ms.to_string());
    kv.insert("runtime", runtime_text(now - st.started_ms));
    kv.insert("brokerVersionDesc", "V4_9_4".into());
    kv.insert("brokerVersion", OUR_VERSION.to_string());
    kv.insert("brokerActive", "true".into());
    kv.insert("putTps", t.put_tps.rocketmq_text());
    kv.insert("getFoundTps", t.get_found_tps.rocketmq_text());
    kv.insert("getMissTps", t.get_miss_tps.rocketmq_text());
    let total_tps: Vec<String> = (0..3)
        .map(|i| {
            let v = t.get_found_tps.0[i].unwrap_or(0.0) + t.get_miss_tps.0[i].unwrap_or(0.0);
            format!("{v:.2}")
        })
        .collect();
    kv.insert("getTotalTps", total_tps.join(" "));
    kv.insert("getTransferredTps", t.get_transferred_tps.rocketmq_text());
    kv.insert("getTransferedTps", t.get_transferred_tps.rocketmq_text());
    kv.insert("putMessageTimesTotal", t.put_messages.to_string());
    kv.insert("putMessageFailedTimes", t.put_failed.to_string());
    kv.insert("putMessageSizeTotal", t.put_bytes.to_string());
    kv.insert(
        "putMessageAverageSize",
        format!("{:.2}", t.put_bytes as f64 / t.put_messages.max(1) as f64),
    );
    kv.insert(
        "putMessageEntireTimeMax",
        (t.put_latency.max_us / 1000).to_string(),
    );
    kv.insert(
        "putMessageDistributeTime",
        t.put_latency.rocketmq_distribution(),
    );
    kv.insert(
        "putLatency99",
        format!("{:.3}", t.put_latency.quantile_us(0.99) as f64 / 1000.0),
    );
    kv.insert(
        "putLatency999",
        format!("{:.3}", t.put_latency.quantile_us(0.999) as f64 / 1000.0),
    );
    kv.insert("getMessageEntireTimeMax", "0".into());
    kv.insert("dispatchMaxBuffer", "0".into());
    kv.insert("msgPutTotalTodayNow", t.put_messages.to_string());
    kv.insert("msgGetTotalTodayNow", t.get_messages.to_string());
    kv.insert("msgPutTotalTodayMorning", "0".into());
    kv.insert("msgGetTotalTodayMorning", "0".into());
    kv.insert("msgPutTotalYesterdayMorning", "0".into());
    kv.insert("msgGetTotalYesterdayMorning", "0".into());
    kv.insert("dispatchBehindBytes", t.dispatch_lag.to_string());
    kv.insert("remainHowManyDataToCommit", human_bytes(t.commit_lag));
    kv.insert("remainHowManyDataToFlush", human_bytes(t.flush_lag));
    kv.insert(
        "remainTransientStoreBufferNumbs",
        (t.pool_bytes.saturating_sub(t.pool_used)).to_string(),
    );
    kv.insert("pageCacheLockTimeMills", "0".into());
    kv.insert("startAcceptSendRequestTimeStamp", "0".into());
    let shard0 = report.shards.first();
    kv.insert(
        "commitLogMinOffset",
        shard0.map_or(0, |s| s.log_min).to_string(),
    );
    kv.insert(
        "commitLogMaxOffset",
        shard0.map_or(0, |s| s.log_max).to_string(),
    );
    let ratio = crate::clean::usage(space).unwrap_or(-1.0);
    kv.insert("commitLogDiskRatio", format!("{ratio}"));
    kv.insert("consumeQueueDiskRatio", format!("{ratio}"));
    kv.insert(
        "commitLogDirCapacity",
        match space {
            Some((total, free)) => format!(
                "Total : {}, Free : {}.",
                human_bytes(total),
                human_bytes(free)
            ),
            None => "Total : 0, Free : 0.".into(),
        },
    );
    let mut earliest = i64::MAX;
    for s in &report.shards {
        if s.log_max > s.log_min
            && let Ok(Some(m)) = st.handle.look_by_offset(s.log_min).await
        {
            earliest = earliest.min(m.store_timestamp_ms);
        }
    }
    kv.insert(
        "earliestMessageTimeStamp",
        if earliest == i64::MAX { 0 } else { earliest }.to_string(),
    );
    for (k, v) in [
        "sendThreadPoolQueueSize",
        "sendThreadPoolQueueCapacity",
        "pullThreadPoolQueueSize",
        "pullThreadPoolQueueCapacity",
        "queryThreadPoolQueueSize",
        "queryThreadPoolQueueCapacity",
        "sendThreadPoolQueueHeadWaitTimeMills",
        "pullThreadPoolQueueHeadWaitTimeMills",
        "queryThreadPoolQueueHeadWaitTimeMills",
    ]
    .into_iter()
    .map(|k| (k, "0"))
    {
        kv.insert(k, v.into());
    }
    // coremq's own, per shard.
    let mut own = Vec::new();
    for (i, s) in report.shards.iter().enumerate() {
        own.push((format!("coremq_shard{i}_putTps"), s.put_tps.rocketmq_text()));
        own.push((
            format!("coremq_shard{i}_logMinOffset"),
            s.log_min.to_string(),
        ));
        own.push((
            format!("coremq_shard{i}_logMaxOffset"),
            s.log_max.to_string(),
        ));
        own.push((
            format!("coremq_shard{i}_dispatchBehindBytes"),
            s.dispatch_lag.to_string(),
        ));
        own.push((
            format!("coremq_shard{i}_flushBehindBytes"),
            s.flush_lag.to_string(),
        ));
        own.push((
            format!("coremq_shard{i}_poolUse"),
            format!("{:.3}", s.pool_use()),
        ));
    }
    let mut table = serde_json::Map::new();
    for (k, v) in kv {
        table.insert(k.to_string(), v.into());
    }
    for (k, v) in own {
        table.insert(k, v.into());
    }
    let body = serde_json::json!({ "table": table });
    Ok(ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default()))
}

/// RocketMQ's `runtime` text: `[ d days, h hours, m minutes, s seconds ]`.
fn runtime_text(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    format!(
        "[ {} days, {} hours, {} minutes, {} seconds ]",
        s / 86_400,
        s / 3600 % 24,
        s / 60 % 60,
        s % 60
    )
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The broker config as RocketMQ names it: `(key, value)` in key order.
async fn config_pairs(st: &NodeState) -> Result<Vec<(String, String)>, Reject> {
    let c = &st.cfg;
    let r = st.handle.retention_config().await.map_err(store_error)?;
    let mut m: BTreeMap<String, String> = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), v);
    };
    put("brokerName", c.broker_name.clone());
    put("brokerClusterName", c.cluster_name.clone());
    put("brokerId", st.broker_id.to_string());
    put("brokerIP1", st.broker_addr.ip().to_string());
    put("listenPort", st.broker_addr.port().to_string());
    put("namesrvAddr", c.namesrv_addr.join(";"));
    put("autoCreateTopicEnable", c.auto_create_topic.to_string());
    put("defaultTopicQueueNums", c.default_queue_nums.to_string());
    put("longPollingEnable", c.long_polling.to_string());
    put(
        "flushDiskType",
        if c.flush == "sync" {
            "SYNC_FLUSH"
        } else {
            "ASYNC_FLUSH"
        }
        .into(),
    );
    put("brokerRole", c.role.to_ascii_uppercase());
    put("storePathRootDir", c.data_dir.display().to_string());
    put(
        "clientChannelMaxIdleTimeSeconds",
        (c.idle_timeout_ms / 1000).to_string(),
    );
    put(
        "fileReservedTime",
        (r.file_reserved_time.as_secs() / 3600).to_string(),
    );
    put("deleteWhen", r.delete_when.clone());
    put(
        "diskMaxUsedSpaceRatio",
        ((r.disk_max_used_space_ratio * 100.0).round() as i64).to_string(),
    );
    put(
        "diskSpaceCleanForciblyRatio",
        r.disk_clean_forcibly_ratio.to_string(),
    );
    put("cleanFileForciblyEnable", r.clean_file_forcibly.to_string());
    put("deleteFileBatchMax", r.delete_file_batch_max.to_string());
    put(
        "cleanResourceInterval",
        r.clean_interval.as_millis().to_string(),
    );
    put(
        "deleteCommitLogFilesInterval",
        r.delete_interval.as_millis().to_string(),
    );
    Ok(m.into_iter().collect())
}

pub(super) async fn broker_config(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let mut text = String::new();
    for (k, v) in config_pairs(st).await? {
        let _ = writeln!(text, "{k}={v}");
    }
    let version = serde_json::json!({"counter": 0, "timestamp": st.started_ms}).to_string();
    Ok(ok(req)
        .with_field("version", version)
        .with_body(text.into_bytes()))
}

/// Java `Properties` text, the simple form tools send: `key=value` (or `key:value`)
/// lines, `#`/`!` comments.
fn parse_properties(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .filter_map(|l| {
            let at = l.find(['=', ':'])?;
            Some((l[..at].trim().to_string(), l[at + 1..].trim().to_string()))
        })
        .collect()
}

/// Applies one retention key to `r`; `Err` names what is wrong.
fn apply_key(r: &mut RetentionConfig, k: &str, v: &str) -> Result<(), String> {
    let bad = || format!("{k}: {:?} is not a valid value", clip(v));
    match k {
        "fileReservedTime" => {
            let h: u64 = v.parse().map_err(|_| bad())?;
            r.file_reserved_time = Duration::from_secs(h.saturating_mul(3600));
        }
        "deleteWhen" => r.delete_when = v.to_string(),
        "diskMaxUsedSpaceRatio" => {
            let p: f64 = v.parse().map_err(|_| bad())?;
            r.disk_max_used_space_ratio = p / 100.0;
        }
        "diskSpaceCleanForciblyRatio" => {
            r.disk_clean_forcibly_ratio = v.parse().map_err(|_| bad())?
        }
        "cleanFileForciblyEnable" => r.clean_file_forcibly = v.parse().map_err(|_| bad())?,
        "deleteFileBatchMax" => r.delete_file_batch_max = v.parse().map_err(|_| bad())?,
        "cleanResourceInterval" => {
            let ms: u64 = v.parse().map_err(|_| bad())?;
            if ms == 0 || ms > crate::node::config::MAX_INTERVAL_MS {
                return Err(bad());
            }
            r.clean_interval = Duration::from_millis(ms);
        }
        "deleteCommitLogFilesInterval" => {
            let ms: u64 = v.parse().map_err(|_| bad())?;
            if ms > crate::node::config::MAX_INTERVAL_MS {
                return Err(bad());
            }
            r.delete_interval = Duration::from_millis(ms);
        }
        _ => {
            return Err(format!(
                "{} cannot be changed while the broker runs (only the retention keys \
                 fileReservedTime, deleteWhen, diskMaxUsedSpaceRatio, \
                 diskSpaceCleanForciblyRatio, cleanFileForciblyEnable, deleteFileBatchMax, \
                 cleanResourceInterval, deleteCommitLogFilesInterval can; set it in \
                 coremq.toml)",
                clip(k)
            ));
        }
    }
    Ok(())
}

pub(super) async fn update_broker_config(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let text = std::str::from_utf8(&req.body)
        .map_err(|_| reject(SYSTEM_ERROR, "the config body is not UTF-8 text"))?;
    let pairs = parse_properties(text);
    if pairs.is_empty() {
        return Err(reject(SYSTEM_ERROR, "no key=value in the config body"));
    }
    if let Some((k, _)) = pairs
        .iter()
        .find(|(k, _)| k == "configBlackList" || k == "brokerConfigPath")
    {
        return Err(reject(
            NO_PERMISSION,
            format!("Can not update config in black list: {k}"),
        ));
    }
    let mut r = st.handle.retention_config().await.map_err(store_error)?;
    for (k, v) in &pairs {
        apply_key(&mut r, k, v).map_err(|e| reject(SYSTEM_ERROR, e))?;
    }
    st.handle
        .set_retention_config(r)
        .await
        .map_err(store_error)?;
    tracing::info!(keys = ?pairs, "broker config updated");
    Ok(ok(req))
}

pub(super) async fn topic_stats(
    st: &NodeState,
    req: &RemotingCommand,
    view: Option<ShardView>,
) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    let Some(conf) = valid_topic(topic).then(|| st.topics.get(topic)).flatten() else {
        return Err(reject(
            TOPIC_NOT_EXIST,
            format!("topic[{}] not exist", clip(topic)),
        ));
    };
    let queues = conf.read_queue_nums.max(conf.write_queue_nums).max(0);
    // On a shard's port: that shard broker's queues, under its name and ids.
    let (broker, listed) = listed(view, &st.cfg.broker_name, topic, queues);
    let mut out = String::from("{\"offsetTable\":{");
    for (k, &(shown, q)) in listed.iter().enumerate() {
        let (min, max) = st
            .handle
            .queue_offsets(topic, q)
            .await
            .map_err(store_error)?;
        let last = if max > 0 {
            store_time_at(st, topic, q, max - 1).await
        } else {
            0
        };
        if k > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{}:{{\"lastUpdateTimestamp\":{last},\"maxOffset\":{max},\"minOffset\":{min}}}",
            mq_key(&broker, topic, shown)
        );
    }
    let tps = topic_put_tps(st).await;
    let _ = write!(out, "}},\"topicPutTps\":{tps:.2}}}");
    Ok(ok(req).with_body(out.into_bytes()))
}

/// The store's last-minute put rate (per topic rates are not kept; 0.0 if unknown).
async fn topic_put_tps(st: &NodeState) -> f64 {
    st.handle
        .stats()
        .await
        .ok()
        .and_then(|r| r.total.put_tps.0[1])
        .unwrap_or(0.0)
}

pub(super) async fn delete_topic(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    delete_one_topic(st, field(req, "topic")?).await?;
    Ok(ok(req))
}

/// `DELETE_TOPIC_IN_BROKER_LIST` (5002, RocketMQ-Rust's batch form of 215, which
/// `rocketmq-admin-cli deleteTopic` sends): body `{"topicList":[..]}`. Every name is
/// checked before any topic goes.
pub(super) async fn delete_topic_list(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let topics = string_list(req, "topicList")?;
    if let Some(bad) = topics
        .iter()
        .find(|t| !valid_topic(t) || is_system_topic(t))
    {
        return Err(reject(
            INVALID_PARAMETER,
            format!("The topic[{}] is conflict with system topic.", clip(bad)),
        ));
    }
    for topic in &topics {
        delete_one_topic(st, topic).await?;
    }
    Ok(ok(req))
}

/// A JSON body's list of strings under `key`.
pub(super) fn string_list(req: &RemotingCommand, key: &str) -> Result<Vec<String>, Reject> {
    let v: serde_json::Value = serde_json::from_slice(&req.body)
        .map_err(|e| reject(SYSTEM_ERROR, format!("the body is not JSON: {e}")))?;
    v.get(key)
        .and_then(serde_json::Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| reject(SYSTEM_ERROR, format!("the body has no {key} of strings")))
}

async fn delete_one_topic(st: &NodeState, topic: &str) -> Result<(), Reject> {
    if !valid_topic(topic) || is_system_topic(topic) {
        return Err(reject(
            INVALID_PARAMETER,
            format!("The topic[{}] is conflict with system topic.", clip(topic)),
        ));
    }
    if st.broker_id != 0 {
        return Err(reject(
            NO_PERMISSION,
            "a slave does not delete topics; delete it on the master",
        ));
    }
    let had = st.topics.remove(topic).map_err(store_error)?;
    st.offsets.remove_topic(topic);
    let queues = st.handle.delete_topic(topic).await.map_err(store_error)?;
    tracing::info!(topic, had, queues, "topic deleted by request");
    Ok(())
}

pub(super) async fn clean_unused_topics(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let keep: Vec<String> = st.topics.snapshot().into_iter().map(|(t, _)| t).collect();
    let done = st
        .handle
        .clean_unused_topics(keep)
        .await
        .map_err(store_error)?;
    for t in &done {
        st.offsets.remove_topic(t);
    }
    Ok(with_remark(
        ok(req),
        format!("deleted {} unused topics: {done:?}", done.len()),
    ))
}

pub(super) async fn delete_expired(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let reps = st
        .handle
        .delete_expired_files()
        .await
        .map_err(store_error)?;
    let segs: usize = reps
        .iter()
        .map(|r| r.expired_segments + r.forced_segments)
        .sum();
    let cq: usize = reps.iter().map(|r| r.queue_files).sum();
    let ix: usize = reps.iter().map(|r| r.index_files).sum();
    Ok(with_remark(
        ok(req),
        format!("deleted {segs} commit-log segments, {cq} consume-queue files, {ix} index files"),
    ))
}

/// The name server's `GET_ALL_TOPIC_LIST_FROM_NAMESERVER` (206): this node's topics.
pub(super) fn topic_list(st: &NodeState, req: &RemotingCommand) -> RemotingCommand {
    let list: Vec<String> = st.topics.snapshot().into_iter().map(|(t, _)| t).collect();
    let body = serde_json::json!({ "topicList": list });
    ok(req).with_body(serde_json::to_vec(&body).unwrap_or_default())
}

/// The name server's `DELETE_TOPIC_IN_NAMESRV` (216): routes come from this node's
/// topic table, so a topic deleted on the broker (215) has no route left; this only
/// answers whether that is so.
pub(super) fn namesrv_delete_topic(
    st: &NodeState,
    req: &RemotingCommand,
) -> Result<RemotingCommand, Reject> {
    let topic = field(req, "topic")?;
    if st.topics.get(topic).is_some() {
        return Err(reject(
            SYSTEM_ERROR,
            format!(
                "topic {} still exists on this broker: delete it there first (code 215)",
                clip(topic)
            ),
        ));
    }
    Ok(ok(req))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_and_retention_keys() {
        let p = parse_properties("# c\nfileReservedTime=48\n deleteWhen : 03;04 \n\nx");
        assert_eq!(
            p,
            vec![
                ("fileReservedTime".into(), "48".into()),
                ("deleteWhen".into(), "03;04".into())
            ]
        );
        let mut r = RetentionConfig::default();
        apply_key(&mut r, "fileReservedTime", "48").unwrap();
        apply_key(&mut r, "diskMaxUsedSpaceRatio", "70").unwrap();
        assert_eq!(r.file_reserved_time, Duration::from_secs(48 * 3600));
        assert!((r.disk_max_used_space_ratio - 0.70).abs() < 1e-9);
        assert!(apply_key(&mut r, "fileReservedTime", "x").is_err());
        let e = apply_key(&mut r, "listenPort", "1").unwrap_err();
        assert!(e.contains("listenPort") && e.contains("coremq.toml"), "{e}");
    }

    #[test]
    fn texts() {
        assert_eq!(
            runtime_text(90_061_000),
            "[ 1 days, 1 hours, 1 minutes, 1 seconds ]"
        );
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(
            mq_key("b", "T", 3),
            "{\"brokerName\":\"b\",\"queueId\":3,\"topic\":\"T\"}"
        );
    }
}
