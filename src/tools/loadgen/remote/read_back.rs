//! `--consumers` with `--target`: every bench queue read back through `PULL_MESSAGE`
//! and the messages counted.

use super::{Responses, topic_name};
use crate::node::remoting::codes::*;
use crate::node::remoting::encode::{FieldValue, FrameHead, encode_frame};
use crate::node::remoting::scan::HeaderView;
use crate::node::remoting::{self, HEADER_WORD, SerializeType};
use crate::tools::loadgen::LoadConfig;
use std::io::Write;
use std::net::TcpStream;

/// Reads every queue back from offset 0, 32 messages per `PULL_MESSAGE`, with one
/// pull in flight per queue on one connection (as a RocketMQ consumer pulls its queues);
/// the messages found. A queue is done at its first answer other than SUCCESS.
pub(super) fn read_back(cfg: &LoadConfig, target: &str) -> Result<u64, String> {
    let mut s = TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}"))?;
    let _ = s.set_nodelay(true);
    let topics: Vec<String> = (0..cfg.topics.max(1)).map(topic_name).collect();
    let queues = cfg.queues.max(1) as usize;
    // Per queue (opaque = index): the next offset to pull.
    let mut offsets = vec![0u64; topics.len() * queues];
    let mut out = Vec::with_capacity(offsets.len() * 256);
    let pull = |out: &mut Vec<u8>, q: usize, offset: u64| {
        let fields = [
            ("consumerGroup", FieldValue::Str("bench-consumer")),
            ("topic", FieldValue::Str(&topics[q / queues])),
            ("queueId", FieldValue::Int((q % queues) as i64)),
            ("queueOffset", FieldValue::UInt(offset)),
            ("maxMsgNums", FieldValue::Int(32)),
            ("sysFlag", FieldValue::Int(0)),
        ];
        let head = FrameHead {
            code: PULL_MESSAGE,
            flag: 0,
            opaque: q as i32,
            serialize_type: SerializeType::Json,
            remark: None,
            fields: &fields,
        };
        encode_frame(out, &head, 0);
    };
    for q in 0..offsets.len() {
        pull(&mut out, q, 0);
    }
    s.write_all(&out).map_err(|e| format!("write: {e}"))?;
    let mut in_flight = offsets.len();
    let mut responses = Responses::new();
    let mut total = 0;
    while in_flight > 0 {
        let frame = responses
            .next_frame(&mut s)
            .ok_or("the node closed the connection during the read-back")?;
        let (code, q, next, records) = pull_answer(frame)?;
        let Some(offset) = offsets.get_mut(q) else {
            return Err(format!("a pull answer for an unknown queue ({q})"));
        };
        if code != SUCCESS {
            in_flight -= 1;
            continue;
        }
        total += records;
        *offset = next;
        out.clear();
        pull(&mut out, q, next);
        s.write_all(&out).map_err(|e| format!("write: {e}"))?;
    }
    Ok(total)
}

/// A pull answer's code, opaque, `nextBeginOffset` and record count, read in place.
fn pull_answer(frame: &[u8]) -> Result<(i32, usize, u64, u64), String> {
    let bad = || "a malformed pull answer".to_string();
    let word = u32::from_be_bytes(*frame.first_chunk::<4>().ok_or_else(bad)?);
    let header_end = HEADER_WORD + (word & 0x00FF_FFFF) as usize;
    let header = frame.get(HEADER_WORD..header_end).ok_or_else(bad)?;
    let cmd;
    let (code, opaque, next) = match HeaderView::parse((word >> 24) as u8, header) {
        Ok(v) => {
            let next = v
                .ext_fields()
                .find(|f| f.key == "nextBeginOffset")
                .and_then(|f| f.value)
                .and_then(|t| t.as_plain())
                .and_then(|t| t.parse().ok());
            (v.code, v.opaque, next)
        }
        Err(_) => {
            cmd = remoting::decode_payload(bytes::Bytes::copy_from_slice(frame))
                .map_err(|e| e.to_string())?;
            let next = cmd.field("nextBeginOffset").and_then(|v| v.parse().ok());
            (cmd.code, cmd.opaque, next)
        }
    };
    if code != SUCCESS {
        return Ok((code, opaque as usize, 0, 0));
    }
    let next = next.ok_or("a pull response without nextBeginOffset")?;
    // The body: whole stored records, each starting with its total size.
    let body = &frame[header_end..];
    let (mut at, mut records) = (0usize, 0u64);
    while let Some(size) = body.get(at..at + 4) {
        let size = u32::from_be_bytes(size.try_into().expect("4 bytes"));
        at += size.max(4) as usize;
        records += 1;
    }
    Ok((code, opaque as usize, next, records))
}
