//! ConsumeQueue entries: 20 bytes each, 300,000 per file by default.
//!
//! ```text
//!  off size field
//!    0    8 commit-log offset of the record
//!    8    4 record size (TOTALSIZE)
//!   12    8 tags code (Java hashCode of TAGS, sign-extended; 0 without tags)
//! ```
//! An entry is valid iff offset >= 0 and size > 0; the first all-zero entry ends the
//! queue. Files are named by the byte position of their first entry (entry index x 20).

use super::{be_i32, be_i64};

pub const ENTRY_LEN: usize = 20;
pub const PHYS_OFFSET_AT: usize = 0;
pub const SIZE_AT: usize = PHYS_OFFSET_AT + 8;
pub const TAGS_CODE_AT: usize = SIZE_AT + 4;
const _: () = assert!(TAGS_CODE_AT + 8 == ENTRY_LEN);

/// Size RocketMQ writes for "pre-blank" entries before a queue's real start.
pub const PRE_BLANK_SIZE: i32 = i32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    pub phys_offset: i64,
    pub size: i32,
    pub tags_code: i64,
}

impl CqEntry {
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[PHYS_OFFSET_AT..SIZE_AT].copy_from_slice(&self.phys_offset.to_be_bytes());
        b[SIZE_AT..TAGS_CODE_AT].copy_from_slice(&self.size.to_be_bytes());
        b[TAGS_CODE_AT..].copy_from_slice(&self.tags_code.to_be_bytes());
        b
    }

    /// Decodes the entry at the start of `b`; `None` if `b` is too short.
    pub fn decode(b: &[u8]) -> Option<CqEntry> {
        Some(CqEntry {
            phys_offset: be_i64(b, PHYS_OFFSET_AT)?,
            size: be_i32(b, SIZE_AT)?,
            tags_code: be_i64(b, TAGS_CODE_AT)?,
        })
    }

    /// RocketMQ's validity rule: offset >= 0 and size > 0.
    pub fn is_valid(&self) -> bool {
        self.phys_offset >= 0 && self.size > 0
    }

    pub fn is_pre_blank(&self) -> bool {
        self.phys_offset == 0 && self.size == PRE_BLANK_SIZE && self.tags_code == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let e = CqEntry {
            phys_offset: 1 << 40,
            size: 1234,
            tags_code: -5,
        };
        let b = e.encode();
        assert_eq!(CqEntry::decode(&b), Some(e));
        assert!(e.is_valid());
        assert!(!CqEntry::decode(&[0u8; 20]).unwrap().is_valid());
        assert_eq!(CqEntry::decode(&b[..19]), None);
    }
}
