//! One CommitLog record as `coremq inspect records` shows it (the fields RocketMQ's
//! `MessageExt` decodes, plus the offset message id and the checksum verdict).

use super::log::{LogFiles, LogWalk, walk_log};
use crate::error::Result;
use crate::format::Corruption;
use crate::format::msg_id::MessageId;
use crate::format::properties;
use crate::format::record::RecordView;
use serde_json::{Map, Value, json};
use std::net::SocketAddr;
use std::path::Path;

/// One record as `inspect records` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    pub offset: u64,
    pub size: u32,
    pub topic: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub tags: Option<String>,
    pub keys: Option<String>,
    /// Stored properties in order, without the record-CRC property.
    pub properties: Vec<(String, String)>,
    pub store_timestamp: i64,
    pub born_timestamp: i64,
    pub body_size: usize,
    pub sys_flag: i32,
    /// Offset message id; `None` for an IPv6 store host.
    pub msg_id: Option<String>,
    /// `"ok"`, `"body_crc_mismatch"` or `"record_crc_mismatch"`.
    pub checksum: String,
    /// The checksum failure in words, when there is one.
    pub checksum_detail: Option<String>,
}

impl RecordInfo {
    pub fn new(offset: u64, r: &RecordView<'_>, checksum: Option<Corruption>) -> RecordInfo {
        let msg_id = match r.store_host {
            SocketAddr::V4(h) => Some(
                MessageId {
                    store_host: h,
                    offset: r.phys_offset as u64,
                }
                .to_string(),
            ),
            SocketAddr::V6(_) => None,
        };
        RecordInfo {
            offset,
            size: r.total_size,
            topic: r.topic.to_string(),
            queue_id: r.queue_id,
            queue_offset: r.queue_offset,
            tags: r.tags().map(str::to_string),
            keys: r.keys().map(str::to_string),
            properties: properties::iter(r.properties)
                .filter(|(n, _)| *n != properties::CRC32)
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            store_timestamp: r.store_timestamp,
            born_timestamp: r.born_timestamp,
            body_size: r.body.len(),
            sys_flag: r.sys_flag,
            msg_id,
            checksum: checksum_name(checksum).to_string(),
            checksum_detail: checksum.map(|c| c.to_string()),
        }
    }

    pub fn to_json(&self) -> Value {
        let props: Map<String, Value> = self
            .properties
            .iter()
            .map(|(n, v)| (n.clone(), Value::String(v.clone())))
            .collect();
        let mut v = json!({
            "offset": self.offset, "size": self.size, "topic": self.topic,
            "queue_id": self.queue_id, "queue_offset": self.queue_offset,
            "tags": self.tags, "keys": self.keys, "properties": props,
            "store_timestamp": self.store_timestamp, "born_timestamp": self.born_timestamp,
            "body_size": self.body_size, "sys_flag": self.sys_flag, "msg_id": self.msg_id,
            "checksum": self.checksum,
        });
        if let Some(d) = &self.checksum_detail {
            v["checksum_detail"] = json!(d);
        }
        v
    }
}

fn checksum_name(c: Option<Corruption>) -> &'static str {
    match c {
        None => "ok",
        Some(Corruption::BodyCrc { .. }) => "body_crc_mismatch",
        Some(Corruption::RecordCrc { .. }) => "record_crc_mismatch",
        Some(_) => "bad",
    }
}

/// Every record of the store at `root` (use [`walk_log`] to stream instead).
pub fn records(root: &Path) -> Result<(Vec<RecordInfo>, LogWalk)> {
    let log = LogFiles::open(root)?;
    let mut out = Vec::new();
    let walk = walk_log(&log, |(off, r, c)| out.push(RecordInfo::new(off, r, c)))?;
    Ok((out, walk))
}
