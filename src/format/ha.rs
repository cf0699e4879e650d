//! RocketMQ's classic HA protocol on the wire (`DefaultHAService`, `HAConnection`,
//! `HAClient`): plain TCP, no RPC framing, two message kinds.
//!
//! ```text
//!  slave -> master: a report, repeated
//!    off size field
//!      0    8 max offset     the slave's commit-log end (big-endian i64): every byte
//!                            below it is appended, so it acknowledges them all
//!
//!  master -> slave: a frame, repeated
//!    off size field
//!      0    8 offset         commit-log offset of the first body byte (big-endian i64)
//!      8    4 size           body bytes that follow (big-endian i32); 0 = heartbeat
//!     12 size body           raw commit-log bytes, never across a segment's end
//! ```
//!
//! A frame's body is any byte range of the log: it may start or end inside a record
//! (the slave keeps a cut record until its rest arrives). Decoding is pure and never
//! panics; a size or offset outside what the reader accepts is a [`Corruption`], so a
//! peer cannot make the reader allocate what it declares.

use super::{Corruption, be_i32, be_i64};

/// Bytes of a slave report.
pub const REPORT_LEN: usize = 8;
pub const FRAME_OFFSET_AT: usize = 0;
pub const FRAME_SIZE_AT: usize = FRAME_OFFSET_AT + 8;
/// Bytes of a frame header.
pub const FRAME_HEADER_LEN: usize = FRAME_SIZE_AT + 4;
const _: () = assert!(FRAME_HEADER_LEN == 12 && REPORT_LEN == 8);

/// A slave report: its commit-log end.
pub fn encode_report(offset: u64) -> [u8; REPORT_LEN] {
    debug_assert!(offset <= i64::MAX as u64);
    (offset as i64).to_be_bytes()
}

/// The report at the start of `buf`: `Truncated` when fewer than 8 bytes, `BadLength`
/// for a negative offset (a Java `long` the slave cannot mean).
pub fn decode_report(buf: &[u8]) -> Result<u64, Corruption> {
    let v = be_i64(buf, 0).ok_or(Corruption::Truncated)?;
    if v < 0 {
        return Err(Corruption::BadLength(v));
    }
    Ok(v as u64)
}

/// The last whole report in `buf` (the master acts on the newest one, as RocketMQ's
/// read service does) and how many bytes the whole reports take: a partial report
/// stays for the next read.
pub fn last_report(buf: &[u8]) -> (Option<Result<u64, Corruption>>, usize) {
    let whole = buf.len() / REPORT_LEN * REPORT_LEN;
    if whole == 0 {
        return (None, 0);
    }
    (Some(decode_report(&buf[whole - REPORT_LEN..whole])), whole)
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub offset: u64,
    pub size: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[FRAME_OFFSET_AT..FRAME_SIZE_AT].copy_from_slice(&(self.offset as i64).to_be_bytes());
        b[FRAME_SIZE_AT..FRAME_HEADER_LEN].copy_from_slice(&(self.size as i32).to_be_bytes());
        b
    }

    /// The commit-log offset just past the body.
    pub fn end(&self) -> u64 {
        self.offset + self.size as u64
    }

    /// Decodes the header at the start of `buf`, accepting bodies of at most
    /// `max_body` bytes: `Truncated` when fewer than 12 bytes, `BadLength` for a
    /// negative offset, a negative or oversized body, or an end past `i64::MAX`.
    pub fn decode(buf: &[u8], max_body: usize) -> Result<FrameHeader, Corruption> {
        let offset = be_i64(buf, FRAME_OFFSET_AT).ok_or(Corruption::Truncated)?;
        let size = be_i32(buf, FRAME_SIZE_AT).ok_or(Corruption::Truncated)?;
        if offset < 0 {
            return Err(Corruption::BadLength(offset));
        }
        if size < 0 || size as usize > max_body {
            return Err(Corruption::BadLength(size as i64));
        }
        if offset.checked_add(size as i64).is_none() {
            return Err(Corruption::BadLength(offset));
        }
        Ok(FrameHeader {
            offset: offset as u64,
            size: size as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_match_rocketmq() {
        // The bytes rocketmq-rust's tests pin for Java's DefaultHA.
        let h = FrameHeader {
            offset: 4096,
            size: 26,
        };
        assert_eq!(h.encode(), [0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 26]);
        assert_eq!(encode_report(4122), [0, 0, 0, 0, 0, 0, 16, 26]);
        assert_eq!(FrameHeader::decode(&h.encode(), 26), Ok(h));
        assert_eq!(
            FrameHeader::decode(&h.encode(), 25),
            Err(Corruption::BadLength(26))
        );
        assert_eq!(decode_report(&encode_report(7)), Ok(7));
        assert_eq!(decode_report(&[0xff; 8]), Err(Corruption::BadLength(-1)));
        assert_eq!(last_report(&[0; 7]), (None, 0));
        let mut two = encode_report(1).to_vec();
        two.extend_from_slice(&encode_report(9));
        two.push(3);
        assert_eq!(last_report(&two), (Some(Ok(9)), 16));
    }
}
