//! Pure on-disk codecs: no I/O here, only bytes in and typed values (or a typed
//! corruption) out.
//!
//! Everything is big-endian, exactly as Apache RocketMQ writes it (see
//! `shared/reference/rocketmq-store.md`). Decoders never panic on bad bytes: every
//! length read from disk is bounded before it is used, and failures come back as
//! [`Corruption`] values that callers turn into errors naming the file and offset.

pub mod checkpoint;
pub mod consume_queue;
pub mod delay_offset;
pub mod deleted_topics;
pub mod flush_mark;
pub mod ha;
pub mod index_file;
pub mod java;
pub mod manifest;
pub mod msg_id;
pub mod properties;
pub mod record;
pub mod schedule;

/// What was wrong with bytes read from disk. Kept small and `Copy` so it can be
/// carried inside errors that also name the file and offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    /// The bytes end before the structure does.
    Truncated,
    /// A magic code that is neither a record nor a blank.
    BadMagic(u32),
    /// A length field outside what the format allows.
    BadLength(i64),
    /// The stored total size disagrees with the size computed from the fields.
    SizeMismatch { stored: i32, computed: i64 },
    /// The masked CRC32 of the body does not match.
    BodyCrc { stored: u32, computed: u32 },
    /// The record CRC property (`__CRC32#`) does not match.
    RecordCrc { stored: u32, computed: u32 },
    /// The record says it lives at another commit-log offset than where it was read.
    WrongOffset { stored: i64 },
    /// Text that must be UTF-8 is not.
    BadUtf8,
    /// A checksum over a metadata structure (checkpoint section) does not match.
    Checksum,
    /// The record-CRC property is required but absent or damaged.
    MissingRecordCrc,
    /// A consume-queue entry points at a record of another queue or queue offset.
    QueueMismatch,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Corruption::Truncated => write!(f, "truncated"),
            Corruption::BadMagic(m) => write!(f, "bad magic code {m:#010x}"),
            Corruption::BadLength(l) => write!(f, "length field out of range: {l}"),
            Corruption::SizeMismatch { stored, computed } => {
                write!(f, "total size {stored} but fields add up to {computed}")
            }
            Corruption::BodyCrc { stored, computed } => {
                write!(f, "body crc stored {stored:#x} computed {computed:#x}")
            }
            Corruption::RecordCrc { stored, computed } => {
                write!(f, "record crc stored {stored:#x} computed {computed:#x}")
            }
            Corruption::WrongOffset { stored } => {
                write!(f, "record claims commit-log offset {stored}")
            }
            Corruption::BadUtf8 => write!(f, "text is not UTF-8"),
            Corruption::Checksum => write!(f, "checksum mismatch"),
            Corruption::MissingRecordCrc => write!(f, "record-CRC property missing or damaged"),
            Corruption::QueueMismatch => {
                write!(
                    f,
                    "consume-queue entry points at a record of another queue position"
                )
            }
        }
    }
}

/// Appends the CRC32 of `b` (big-endian) as its 4-byte trailer: the framing of coremq's
/// own small files (`manifest`, `deleted_topics`).
pub(crate) fn seal_crc(b: &mut Vec<u8>) {
    let crc = crc32fast::hash(b);
    b.extend_from_slice(&crc.to_be_bytes());
}

/// The body of a file framed by [`seal_crc`], once its trailer matches.
pub(crate) fn crc_sealed_body(b: &[u8]) -> Result<&[u8], Corruption> {
    let t = Corruption::Truncated;
    let body_len = b.len().checked_sub(4).ok_or(t)?;
    let stored = be_i32(b, body_len).ok_or(t)? as u32;
    if crc32fast::hash(&b[..body_len]) != stored {
        return Err(Corruption::Checksum);
    }
    Ok(&b[..body_len])
}

/// Big-endian readers over a slice that never panic: `None` when out of range.
pub(crate) fn be_i16(b: &[u8], at: usize) -> Option<i16> {
    Some(i16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
pub(crate) fn be_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
pub(crate) fn be_i64(b: &[u8], at: usize) -> Option<i64> {
    Some(i64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// RocketMQ's CRC: zlib CRC-32 with the top bit cleared.
pub fn masked_crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes) & 0x7FFF_FFFF
}
