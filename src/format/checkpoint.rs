//! The `checkpoint` file: one 4096-byte page.
//!
//! ```text
//!  off size field                    (RocketMQ's part: read by RocketMQ tools)
//!    0    8 physicMsgTimestamp       store time of the last record known flushed
//!    8    8 logicsMsgTimestamp       store time of the last record in a ConsumeQueue
//!   16    8 indexMsgTimestamp        end time of the last full index file flushed
//!   24    8 masterFlushedOffset      (5.x, HA)
//!   32    8 confirmPhyOffset         (5.x)
//!                                    (coremq's part: RocketMQ ignores these bytes)
//!   64    4 magic "CMQK"
//!   68    4 version (1)
//!   72    8 log_flushed_offset       every record below this was fdatasync'ed
//!   80    8 dispatch_safe_offset     every ConsumeQueue entry for records below this is on disk
//!   88    4 queue_count              ConsumeQueues holding entries when this was written
//!   92    8 crc_required_from        records from here on must carry the record-CRC property
//!  100    4 crc32 of bytes 64..100
//! ```
//! Recovery trusts coremq's part only when its CRC matches; otherwise it falls back to
//! scanning and dispatching the whole CommitLog (slow, never wrong).

use super::{Corruption, be_i32, be_i64};

pub const CHECKPOINT_LEN: usize = 4096;
pub const PHYSIC_TS_AT: usize = 0;
pub const LOGICS_TS_AT: usize = PHYSIC_TS_AT + 8;
pub const INDEX_TS_AT: usize = LOGICS_TS_AT + 8;
pub const MASTER_FLUSHED_AT: usize = INDEX_TS_AT + 8;
pub const CONFIRM_AT: usize = MASTER_FLUSHED_AT + 8;
pub const COREMQ_AT: usize = 64;
pub const COREMQ_MAGIC: u32 = u32::from_be_bytes(*b"CMQK");
pub const COREMQ_VERSION: u32 = 1;
const LOG_FLUSHED_AT: usize = COREMQ_AT + 8;
const DISPATCH_SAFE_AT: usize = LOG_FLUSHED_AT + 8;
const QUEUE_COUNT_AT: usize = DISPATCH_SAFE_AT + 8;
const CRC_REQUIRED_AT: usize = QUEUE_COUNT_AT + 4;
const CRC_AT: usize = CRC_REQUIRED_AT + 8;
const _: () = assert!(CONFIRM_AT + 8 <= COREMQ_AT && CRC_AT + 4 <= CHECKPOINT_LEN);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub physic_msg_timestamp: i64,
    pub logics_msg_timestamp: i64,
    pub index_msg_timestamp: i64,
    pub log_flushed_offset: u64,
    pub dispatch_safe_offset: u64,
    /// Lets recovery notice ConsumeQueue directories that disappeared.
    pub queue_count: u32,
    /// Records at or after this offset were written with the record-CRC property
    /// (0 for a store created by coremq; the log end when a RocketMQ store was adopted).
    pub crc_required_from: u64,
}

impl Checkpoint {
    pub fn encode(&self) -> [u8; CHECKPOINT_LEN] {
        let mut b = [0u8; CHECKPOINT_LEN];
        b[PHYSIC_TS_AT..PHYSIC_TS_AT + 8].copy_from_slice(&self.physic_msg_timestamp.to_be_bytes());
        b[LOGICS_TS_AT..LOGICS_TS_AT + 8].copy_from_slice(&self.logics_msg_timestamp.to_be_bytes());
        b[INDEX_TS_AT..INDEX_TS_AT + 8].copy_from_slice(&self.index_msg_timestamp.to_be_bytes());
        b[CONFIRM_AT..CONFIRM_AT + 8]
            .copy_from_slice(&(self.log_flushed_offset as i64).to_be_bytes());
        b[COREMQ_AT..COREMQ_AT + 4].copy_from_slice(&COREMQ_MAGIC.to_be_bytes());
        b[COREMQ_AT + 4..COREMQ_AT + 8].copy_from_slice(&COREMQ_VERSION.to_be_bytes());
        b[LOG_FLUSHED_AT..LOG_FLUSHED_AT + 8]
            .copy_from_slice(&self.log_flushed_offset.to_be_bytes());
        b[DISPATCH_SAFE_AT..DISPATCH_SAFE_AT + 8]
            .copy_from_slice(&self.dispatch_safe_offset.to_be_bytes());
        b[QUEUE_COUNT_AT..QUEUE_COUNT_AT + 4].copy_from_slice(&self.queue_count.to_be_bytes());
        b[CRC_REQUIRED_AT..CRC_REQUIRED_AT + 8]
            .copy_from_slice(&self.crc_required_from.to_be_bytes());
        let crc = crc32fast::hash(&b[COREMQ_AT..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes a checkpoint page. RocketMQ's timestamps are always read; coremq's
    /// offsets come back only if its section is intact (`Ok((_, false))` when the
    /// section is absent, as in a RocketMQ store). A section with a good CRC but
    /// another version is refused with `BadLength(version)`, as the manifest does.
    pub fn decode(b: &[u8]) -> Result<(Checkpoint, bool), Corruption> {
        let t = Corruption::Truncated;
        let mut cp = Checkpoint {
            physic_msg_timestamp: be_i64(b, PHYSIC_TS_AT).ok_or(t)?,
            logics_msg_timestamp: be_i64(b, LOGICS_TS_AT).ok_or(t)?,
            index_msg_timestamp: be_i64(b, INDEX_TS_AT).ok_or(t)?,
            ..Default::default()
        };
        let magic = be_i32(b, COREMQ_AT).ok_or(t)? as u32;
        if magic != COREMQ_MAGIC {
            return Ok((cp, false));
        }
        let stored = be_i32(b, CRC_AT).ok_or(t)? as u32;
        if crc32fast::hash(&b[COREMQ_AT..CRC_AT]) != stored {
            return Err(Corruption::Checksum);
        }
        // A section of another version has another layout: never read it as ours.
        let version = be_i32(b, COREMQ_AT + 4).ok_or(t)? as u32;
        if version != COREMQ_VERSION {
            return Err(Corruption::BadLength(version as i64));
        }
        cp.log_flushed_offset = be_i64(b, LOG_FLUSHED_AT).ok_or(t)? as u64;
        cp.dispatch_safe_offset = be_i64(b, DISPATCH_SAFE_AT).ok_or(t)? as u64;
        cp.queue_count = be_i32(b, QUEUE_COUNT_AT).ok_or(t)? as u32;
        cp.crc_required_from = be_i64(b, CRC_REQUIRED_AT).ok_or(t)? as u64;
        Ok((cp, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let cp = Checkpoint {
            physic_msg_timestamp: 1,
            logics_msg_timestamp: 2,
            index_msg_timestamp: 3,
            log_flushed_offset: 4096,
            dispatch_safe_offset: 2048,
            queue_count: 7,
            crc_required_from: 0,
        };
        let mut b = cp.encode();
        assert_eq!(Checkpoint::decode(&b), Ok((cp, true)));
        b[75] ^= 1;
        assert_eq!(Checkpoint::decode(&b), Err(Corruption::Checksum));
        let plain = [0u8; CHECKPOINT_LEN];
        assert_eq!(
            Checkpoint::decode(&plain),
            Ok((Checkpoint::default(), false))
        );
        assert_eq!(Checkpoint::decode(&plain[..10]), Err(Corruption::Truncated));
    }

    /// Found by the `checkpoint` fuzz target: a section with an intact CRC but an
    /// unknown version was trusted and read with version 1's layout.
    #[test]
    fn unknown_version_is_refused() {
        let mut b = Checkpoint {
            log_flushed_offset: 4096,
            ..Default::default()
        }
        .encode();
        b[COREMQ_AT + 4..COREMQ_AT + 8].copy_from_slice(&2u32.to_be_bytes());
        let crc = crc32fast::hash(&b[COREMQ_AT..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(Checkpoint::decode(&b), Err(Corruption::BadLength(2)));
    }
}
