//! `config/deleted-topics`: the topics deleted from a shard and where, so that records
//! of a deleted topic left in the CommitLog (retention removes them later, as in
//! RocketMQ) never come back: a rebuild of the queues from the log skips them, and key
//! queries filter them out (the index entries go lazily, with their files).
//!
//! ```text
//!  magic "CMQD" | version u32 (1) | count u32
//!  count x ( topic_len u16 | topic (UTF-8) | deleted_below u64 )
//!  crc32 u32 of everything before it
//! ```
//! A record of `topic` at a commit-log offset below `deleted_below` is deleted. The
//! file is replaced atomically; it lives under `config/`, which RocketMQ's loader never
//! reads.

use super::{Corruption, be_i16, be_i32, be_i64};

pub const MAGIC: u32 = u32::from_be_bytes(*b"CMQD");
pub const VERSION: u32 = 1;
const HEADER_LEN: usize = 12;
/// The smallest entry: a zero-length topic and the offset.
const MIN_ENTRY_LEN: usize = 2 + 8;

/// Every deleted topic and the commit-log offset below which its records are gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeletedTopics {
    pub topics: Vec<(String, u64)>,
}

impl DeletedTopics {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN + 4 + self.topics.len() * 32);
        b.extend_from_slice(&MAGIC.to_be_bytes());
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&(self.topics.len() as u32).to_be_bytes());
        for (topic, below) in &self.topics {
            b.extend_from_slice(&(topic.len() as u16).to_be_bytes());
            b.extend_from_slice(topic.as_bytes());
            b.extend_from_slice(&below.to_be_bytes());
        }
        super::seal_crc(&mut b);
        b
    }

    pub fn decode(b: &[u8]) -> Result<DeletedTopics, Corruption> {
        let t = Corruption::Truncated;
        let b = super::crc_sealed_body(b)?;
        let magic = be_i32(b, 0).ok_or(t)? as u32;
        if magic != MAGIC {
            return Err(Corruption::BadMagic(magic));
        }
        let version = be_i32(b, 4).ok_or(t)? as u32;
        if version != VERSION {
            return Err(Corruption::BadLength(version as i64));
        }
        let count = be_i32(b, 8).ok_or(t)? as u32 as usize;
        // Bound the allocation by the input before using the count.
        if count > b.len() / MIN_ENTRY_LEN {
            return Err(Corruption::BadLength(count as i64));
        }
        let mut topics = Vec::with_capacity(count);
        let mut at = HEADER_LEN;
        for _ in 0..count {
            let len = be_i16(b, at).ok_or(t)? as u16 as usize;
            at += 2;
            let topic = std::str::from_utf8(b.get(at..at + len).ok_or(t)?)
                .map_err(|_| Corruption::BadUtf8)?;
            at += len;
            let below = be_i64(b, at).ok_or(t)? as u64;
            at += 8;
            topics.push((topic.to_string(), below));
        }
        if at != b.len() {
            return Err(Corruption::BadLength(at as i64));
        }
        Ok(DeletedTopics { topics })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let d = DeletedTopics {
            topics: vec![("A".into(), 5), ("Orders".into(), 1 << 57)],
        };
        let mut b = d.encode();
        assert_eq!(DeletedTopics::decode(&b), Ok(d));
        b[13] ^= 1;
        assert_eq!(DeletedTopics::decode(&b), Err(Corruption::Checksum));
        assert_eq!(DeletedTopics::decode(&[]), Err(Corruption::Truncated));
        assert_eq!(
            DeletedTopics::decode(&DeletedTopics::default().encode()),
            Ok(DeletedTopics::default())
        );
        // A huge count behind a valid CRC is refused before allocating.
        let mut evil = DeletedTopics::default().encode();
        evil.truncate(evil.len() - 4);
        evil[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        let crc = crc32fast::hash(&evil);
        evil.extend_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            DeletedTopics::decode(&evil),
            Err(Corruption::BadLength(_))
        ));
    }
}
