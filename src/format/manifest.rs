//! `config/cq-manifest`: every ConsumeQueue's length at the checkpoint's dispatch
//! point, so recovery notices a queue that lost entries (a deleted or damaged last
//! file) even when nothing after the checkpoint would touch that queue.
//!
//! ```text
//!  magic "CMQM" | version u32 (1) | dispatch_safe u64 | count u32
//!  count x ( topic_len u16 | topic | queue_id i32 | max_offset u64 )
//!  crc32 u32 of everything before it
//! ```
//! The file lives under `config/`, which RocketMQ's loader never reads as queues.

use super::{Corruption, be_i16, be_i32, be_i64};

pub const MAGIC: u32 = u32::from_be_bytes(*b"CMQM");
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueManifest {
    pub dispatch_safe: u64,
    pub queues: Vec<(String, i32, u64)>,
}

impl QueueManifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24 + self.queues.len() * 32);
        b.extend_from_slice(&MAGIC.to_be_bytes());
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&self.dispatch_safe.to_be_bytes());
        b.extend_from_slice(&(self.queues.len() as u32).to_be_bytes());
        for (topic, qid, max) in &self.queues {
            b.extend_from_slice(&(topic.len() as u16).to_be_bytes());
            b.extend_from_slice(topic.as_bytes());
            b.extend_from_slice(&qid.to_be_bytes());
            b.extend_from_slice(&max.to_be_bytes());
        }
        super::seal_crc(&mut b);
        b
    }

    pub fn decode(b: &[u8]) -> Result<QueueManifest, Corruption> {
        let t = Corruption::Truncated;
        let b = super::crc_sealed_body(b)?;
        let magic = be_i32(b, 0).ok_or(t)? as u32;
        if magic != MAGIC {
            return Err(Corruption::BadMagic(magic));
        }
        if be_i32(b, 4).ok_or(t)? as u32 != VERSION {
            return Err(Corruption::BadLength(be_i32(b, 4).unwrap_or(0) as i64));
        }
        let dispatch_safe = be_i64(b, 8).ok_or(t)? as u64;
        let count = be_i32(b, 16).ok_or(t)? as u32 as usize;
        // Each entry takes at least 14 bytes: bound the allocation by the input.
        if count > b.len() / 14 {
            return Err(Corruption::BadLength(count as i64));
        }
        let mut queues = Vec::with_capacity(count);
        let mut at = 20;
        for _ in 0..count {
            let len = be_i16(b, at).ok_or(t)? as u16 as usize;
            at += 2;
            let topic = std::str::from_utf8(b.get(at..at + len).ok_or(t)?)
                .map_err(|_| Corruption::BadUtf8)?;
            at += len;
            let qid = be_i32(b, at).ok_or(t)?;
            let max = be_i64(b, at + 4).ok_or(t)? as u64;
            at += 12;
            queues.push((topic.to_string(), qid, max));
        }
        if at != b.len() {
            return Err(Corruption::BadLength(at as i64));
        }
        Ok(QueueManifest {
            dispatch_safe,
            queues,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let m = QueueManifest {
            dispatch_safe: 99,
            queues: vec![("A".into(), 0, 5), ("Bb".into(), 7, 1 << 40)],
        };
        let mut b = m.encode();
        assert_eq!(QueueManifest::decode(&b), Ok(m));
        b[9] ^= 1;
        assert_eq!(QueueManifest::decode(&b), Err(Corruption::Checksum));
        assert_eq!(QueueManifest::decode(&[]), Err(Corruption::Truncated));
        // A huge count with a matching CRC is refused before allocating.
        let mut evil = QueueManifest::default().encode();
        evil.truncate(evil.len() - 4);
        evil[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        let crc = crc32fast::hash(&evil);
        evil.extend_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            QueueManifest::decode(&evil),
            Err(Corruption::BadLength(_))
        ));
    }
}
