//! The CommitLog record, byte for byte as RocketMQ writes it.
//!
//! ```text
//!  off  size  field                      (V1 magic, IPv4 born and store hosts)
//!    0     4  TOTALSIZE                  whole record, this field included
//!    4     4  MAGICCODE                  V1 0xDAA320A7, V2 0xDAA320AB (2-byte topic length)
//!    8     4  BODYCRC                    masked CRC32 of the body
//!   12     4  QUEUEID
//!   16     4  FLAG
//!   20     8  QUEUEOFFSET                entry index in the ConsumeQueue
//!   28     8  PHYSICALOFFSET             this record's own commit-log offset
//!   36     4  SYSFLAG                    0x10 born host IPv6, 0x20 store host IPv6, 0xC tx type
//!   40     8  BORNTIMESTAMP
//!   48   8|20 BORNHOST                   address + int32 port
//!    .     8  STORETIMESTAMP
//!    .   8|20 STOREHOST
//!    .     4  RECONSUMETIMES
//!    .     8  PREPARED TRANSACTION OFFSET
//!    .     4  BODYLENGTH, then BODY
//!    .   1|2  TOPICLENGTH (signed), then TOPIC (UTF-8)
//!    .     2  PROPERTIESLENGTH (signed), then PROPERTIES
//! ```
//!
//! Checksums: BODYCRC always; and, by default in coremq, RocketMQ's optional record
//! CRC: the last 20 bytes of the properties hold `__CRC32#` 0x01 + ten reversed
//! decimal digits + 0x02, the masked CRC32 of the first TOTALSIZE-20 bytes. Together
//! they cover every byte of the record. The body is hashed once: its CRC is combined
//! into the record CRC with `crc32fast::Hasher::combine`.
//!
//! A segment that cannot hold the next record plus 8 bytes ends with an 8-byte blank
//! record: int32 remaining bytes, int32 0xCBD43194.

use super::properties::{self, CRC32_RESERVED_LEN};
use super::{Corruption, be_i16, be_i32, be_i64};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const MAGIC_V1: u32 = 0xDAA3_20A7;
pub const MAGIC_V2: u32 = 0xDAA3_20AB;
pub const BLANK_MAGIC: u32 = 0xCBD4_3194;
/// Every finished segment ends with a blank record of at least this size.
pub const END_FILE_MIN_BLANK_LENGTH: usize = 8;

pub const TOTAL_SIZE_AT: usize = 0;
pub const MAGIC_AT: usize = TOTAL_SIZE_AT + 4;
pub const BODY_CRC_AT: usize = MAGIC_AT + 4;
pub const QUEUE_ID_AT: usize = BODY_CRC_AT + 4;
pub const FLAG_AT: usize = QUEUE_ID_AT + 4;
pub const QUEUE_OFFSET_AT: usize = FLAG_AT + 4;
pub const PHYS_OFFSET_AT: usize = QUEUE_OFFSET_AT + 8;
pub const SYSFLAG_AT: usize = PHYS_OFFSET_AT + 8;
pub const BORN_TIMESTAMP_AT: usize = SYSFLAG_AT + 4;
pub const BORN_HOST_AT: usize = BORN_TIMESTAMP_AT + 8;
const _: () = assert!(BORN_HOST_AT == 48);

pub const SYSFLAG_BORNHOST_V6: i32 = 0x10;
pub const SYSFLAG_STOREHOST_V6: i32 = 0x20;
pub const SYSFLAG_TRANSACTION_MASK: i32 = 0xC;
pub const SYSFLAG_TRANSACTION_PREPARED: i32 = 0x4;
pub const SYSFLAG_TRANSACTION_COMMIT: i32 = 0x8;
pub const SYSFLAG_TRANSACTION_ROLLBACK: i32 = 0xC;

/// Fixed bytes of a V1 record with IPv4 hosts and empty body, topic and properties.
pub const V1_FIXED_LEN: usize = 91;
/// The smallest possible record (V1, IPv4, everything empty).
pub const MIN_RECORD_LEN: usize = V1_FIXED_LEN;
/// Longest topic that fits a V1 record (signed one-byte length).
pub const MAX_V1_TOPIC_LEN: usize = 127;
/// Longest topic any record can carry (signed two-byte length).
pub const MAX_V2_TOPIC_LEN: usize = i16::MAX as usize;
/// Longest properties region (signed two-byte length).
pub const MAX_PROPERTIES_LEN: usize = i16::MAX as usize;

/// Host field length for an address.
pub fn host_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 8,
        SocketAddr::V6(_) => 20,
    }
}

/// The record's total length for the given field lengths (RocketMQ's formula).
pub fn record_len(
    body_len: usize,
    topic_len: usize,
    props_len: usize,
    v2: bool,
    born_host_len: usize,
    store_host_len: usize,
) -> usize {
    // 4 size + 4 magic + 4 crc + 4 qid + 4 flag + 8 qoff + 8 phys + 4 sysflag + 8 born ts
    // + born host + 8 store ts + store host + 4 reconsume + 8 prepared + 4 body len + body
    // + topic len field + topic + 2 props len + props
    4 + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + born_host_len
        + 8
        + store_host_len
        + 4
        + 8
        + 4
        + body_len
        + if v2 { 2 } else { 1 }
        + topic_len
        + 2
        + props_len
}
const _: () =
    assert!(V1_FIXED_LEN == 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2);

/// Everything needed to lay out one record; the store fills in offsets and time.
pub struct RecordFields<'a> {
    pub topic: &'a str,
    pub queue_id: i32,
    pub flag: i32,
    pub queue_offset: i64,
    pub phys_offset: i64,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub store_timestamp: i64,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: &'a [u8],
    /// Encoded properties without the record-CRC property.
    pub properties: &'a [u8],
    /// Append RocketMQ's record-CRC property so every byte is covered.
    pub record_crc: bool,
}

impl RecordFields<'_> {
    /// Length of the properties region as it will be stored.
    pub fn stored_properties_len(&self) -> usize {
        if !self.record_crc {
            return self.properties.len();
        }
        let needs_sep = !self.properties.is_empty()
            && *self.properties.last().unwrap() != properties::PROPERTY_SEPARATOR;
        self.properties.len() + needs_sep as usize + CRC32_RESERVED_LEN
    }

    pub fn is_v2(&self) -> bool {
        self.topic.len() > MAX_V1_TOPIC_LEN
    }

    /// The total stored length of this record.
    pub fn encoded_len(&self) -> usize {
        record_len(
            self.body.len(),
            self.topic.len(),
            self.stored_properties_len(),
            self.is_v2(),
            host_len(&self.born_host),
            host_len(&self.store_host),
        )
    }
}

/// Writes fields one after another into a slice sized for them.
struct Out<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Out<'_> {
    fn put(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }

    fn put_host(&mut self, host: &SocketAddr) {
        match host {
            SocketAddr::V4(a) => self.put(&a.ip().octets()),
            SocketAddr::V6(a) => self.put(&a.ip().octets()),
        }
        self.put(&(host.port() as i32).to_be_bytes());
    }
}

/// Bodies up to this size are hashed twice (body CRC, record CRC) rather than
/// combined: see [`encode_to`].
const REHASH_BODY_MAX: usize = 16 << 10;

/// Appends the encoded record to `out`. The caller has validated lengths (topic
/// within [`MAX_V2_TOPIC_LEN`], properties within [`MAX_PROPERTIES_LEN`]).
/// Returns the body CRC (masked) that was stored.
pub fn encode(f: &RecordFields<'_>, out: &mut Vec<u8>) -> u32 {
    let start = out.len();
    out.resize(start + f.encoded_len(), 0);
    encode_to(f, &mut out[start..])
}

/// Encodes the record into `out`, which must be exactly [`RecordFields::encoded_len`]
/// bytes (the put path encodes straight into the write window this way: encoding
/// into a buffer and copying it to the window was ~2.5% of the CPU per 1 KiB put).
/// Same contract and result as [`encode`].
pub fn encode_to(f: &RecordFields<'_>, out: &mut [u8]) -> u32 {
    let total = f.encoded_len();
    let props_len = f.stored_properties_len();
    assert!(props_len <= MAX_PROPERTIES_LEN && f.topic.len() <= MAX_V2_TOPIC_LEN);
    assert_eq!(
        out.len(),
        total,
        "encode_to needs the record's exact length"
    );

    let mut body_hasher = crc32fast::Hasher::new();
    body_hasher.update(f.body);
    let body_crc = body_hasher.clone().finalize() & 0x7FFF_FFFF;

    let mut sys_flag = f.sys_flag & !(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    if f.born_host.is_ipv6() {
        sys_flag |= SYSFLAG_BORNHOST_V6;
    }
    if f.store_host.is_ipv6() {
        sys_flag |= SYSFLAG_STOREHOST_V6;
    }
    let mut o = Out { buf: out, at: 0 };
    o.put(&(total as i32).to_be_bytes());
    let magic = if f.is_v2() { MAGIC_V2 } else { MAGIC_V1 };
    o.put(&magic.to_be_bytes());
    o.put(&body_crc.to_be_bytes());
    o.put(&f.queue_id.to_be_bytes());
    o.put(&f.flag.to_be_bytes());
    o.put(&f.queue_offset.to_be_bytes());
    o.put(&f.phys_offset.to_be_bytes());
    o.put(&sys_flag.to_be_bytes());
    o.put(&f.born_timestamp.to_be_bytes());
    o.put_host(&f.born_host);
    o.put(&f.store_timestamp.to_be_bytes());
    o.put_host(&f.store_host);
    o.put(&f.reconsume_times.to_be_bytes());
    o.put(&f.prepared_transaction_offset.to_be_bytes());
    o.put(&(f.body.len() as i32).to_be_bytes());
    let head_end = o.at;
    o.put(f.body);
    let body_end = o.at;
    if f.is_v2() {
        o.put(&(f.topic.len() as i16).to_be_bytes());
    } else {
        o.put(&[f.topic.len() as u8]);
    }
    o.put(f.topic.as_bytes());
    o.put(&(props_len as i16).to_be_bytes());
    o.put(f.properties);
    if f.record_crc {
        if props_len != f.properties.len() + CRC32_RESERVED_LEN {
            o.put(&[properties::PROPERTY_SEPARATOR]);
        }
        let crc_end = o.at;
        debug_assert_eq!(crc_end, total - CRC32_RESERVED_LEN);
        // CRC of [0, crc_end) = head ++ body ++ tail. Small bodies are hashed again
        // in one pass: `Hasher::combine` (GF(2) matrix products) cost more than
        // hashing a 1 KiB body twice (perf of scenario 1: combine 2.3% of all CPU).
        let out = o.buf;
        let mut h = crc32fast::Hasher::new();
        if f.body.len() <= REHASH_BODY_MAX {
            h.update(&out[..crc_end]);
        } else {
            h.update(&out[..head_end]);
            h.combine(&body_hasher);
            h.update(&out[body_end..crc_end]);
        }
        let crc = h.finalize() & 0x7FFF_FFFF;
        properties::write_crc_property(&mut out[crc_end..], crc);
    } else {
        debug_assert_eq!(o.at, total);
    }
    body_crc
}

/// Writes the blank record that ends a segment with `remaining` bytes left.
pub fn encode_blank(remaining: u32) -> [u8; END_FILE_MIN_BLANK_LENGTH] {
    let mut b = [0u8; END_FILE_MIN_BLANK_LENGTH];
    b[..4].copy_from_slice(&(remaining as i32).to_be_bytes());
    b[4..].copy_from_slice(&BLANK_MAGIC.to_be_bytes());
    b
}

/// A decoded record, borrowing its variable parts from the input.
#[derive(Debug, Clone)]
pub struct RecordView<'a> {
    pub total_size: u32,
    pub magic: u32,
    pub body_crc: u32,
    pub queue_id: i32,
    pub flag: i32,
    pub queue_offset: i64,
    pub phys_offset: i64,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub store_timestamp: i64,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: &'a [u8],
    pub topic: &'a str,
    pub properties: &'a [u8],
    /// `Some(true)` when the record carries a record-CRC property that was verified.
    pub record_crc_verified: Option<bool>,
}

impl<'a> RecordView<'a> {
    pub fn property(&self, name: &str) -> Option<&'a str> {
        properties::get(self.properties, name)
    }
    pub fn tags(&self) -> Option<&'a str> {
        self.property(properties::TAGS)
    }
    pub fn keys(&self) -> Option<&'a str> {
        self.property(properties::KEYS)
    }
    /// Records of prepared or rolled-back transactions get no ConsumeQueue entry.
    pub fn is_dispatched_to_queue(&self) -> bool {
        let t = self.sys_flag & SYSFLAG_TRANSACTION_MASK;
        t != SYSFLAG_TRANSACTION_PREPARED && t != SYSFLAG_TRANSACTION_ROLLBACK
    }
}

/// Result of decoding at a position: a record, or the blank that ends a segment.
#[derive(Debug, Clone)]
pub enum Decoded<'a> {
    Record(RecordView<'a>),
    /// Blank record: the rest of the segment (this many bytes) is unused.
    Blank(u32),
}

/// How much to verify while decoding.
#[derive(Debug, Clone, Copy)]
pub struct Verify {
    /// Check the body CRC and, when present, the record CRC property.
    pub crc: bool,
    /// The commit-log offset the record was read from; checked against PHYSICALOFFSET.
    pub at_offset: Option<i64>,
    /// Largest total size accepted (bounds corrupt length fields).
    pub max_total_size: usize,
    /// With `crc`: the record must end with a record-CRC property (a store that writes
    /// it sets this, so damage to the property itself cannot switch the check off).
    pub require_record_crc: bool,
}

impl Verify {
    /// Framing only (lengths, magic, offset): for records this store wrote and already
    /// verified, such as dispatch reading back its own log.
    pub fn framing(at_offset: u64, max_total_size: usize) -> Verify {
        Verify {
            crc: false,
            at_offset: Some(at_offset as i64),
            max_total_size,
            require_record_crc: false,
        }
    }

    /// Framing and checksums; `require_record_crc` when the store wrote the record-CRC
    /// property at that offset (so damage to the property cannot switch the check off).
    pub fn checksums(at_offset: u64, max_total_size: usize, require_record_crc: bool) -> Verify {
        Verify {
            crc: true,
            at_offset: Some(at_offset as i64),
            max_total_size,
            require_record_crc,
        }
    }

    /// The same checks for the record at `at_offset`.
    pub fn at(self, at_offset: u64) -> Verify {
        Verify {
            at_offset: Some(at_offset as i64),
            ..self
        }
    }
}

/// Walks the records back to back in `buf`, which starts at log offset `base`: yields
/// each record's position in `buf` with what [`decode`] made of it, and ends after the
/// first blank, the first error, or at the end of `buf`. A record cut by the end of
/// `buf` yields `Err(Corruption::Truncated)`; callers that read in pieces stop there
/// and read on from that position.
pub struct Records<'a> {
    buf: &'a [u8],
    base: u64,
    at: usize,
    verify: Verify,
    done: bool,
}

impl<'a> Records<'a> {
    pub fn new(buf: &'a [u8], base: u64, verify: Verify) -> Records<'a> {
        Records {
            buf,
            base,
            at: 0,
            verify,
            done: false,
        }
    }

    /// Bytes of `buf` consumed so far: up to the end of the last record (or blank)
    /// yielded, not past a record that failed to decode.
    pub fn consumed(&self) -> usize {
        self.at
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = (usize, Result<Decoded<'a>, Corruption>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.at >= self.buf.len() {
            return None;
        }
        let at = self.at;
        let d = decode(&self.buf[at..], self.verify.at(self.base + at as u64));
        match &d {
            Ok(Decoded::Record(r)) => self.at += r.total_size as usize,
            Ok(Decoded::Blank(n)) => {
                self.at += *n as usize;
                self.done = true;
            }
            Err(_) => self.done = true,
        }
        Some((at, d))
    }
}

fn read_host(b: &[u8], at: usize, v6: bool) -> Option<(SocketAddr, usize)> {
    if v6 {
        let octets: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
        let port = be_i32(b, at + 16)?;
        Some((
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port as u16),
            20,
        ))
    } else {
        let octets: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        let port = be_i32(b, at + 4)?;
        Some((
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(octets)), port as u16),
            8,
        ))
    }
}

/// Reads just the total size and magic at the start of `buf`.
pub fn peek_header(buf: &[u8]) -> Result<(i32, u32), Corruption> {
    let size = be_i32(buf, TOTAL_SIZE_AT).ok_or(Corruption::Truncated)?;
    let magic = be_i32(buf, MAGIC_AT).ok_or(Corruption::Truncated)? as u32;
    Ok((size, magic))
}

/// Decodes the record (or blank) that starts at `buf[0]`. `buf` may extend past it.
pub fn decode(buf: &[u8], verify: Verify) -> Result<Decoded<'_>, Corruption> {
    let (size, magic) = peek_header(buf)?;
    if magic == BLANK_MAGIC {
        if size < END_FILE_MIN_BLANK_LENGTH as i32 {
            return Err(Corruption::BadLength(size as i64));
        }
        return Ok(Decoded::Blank(size as u32));
    }
    if magic != MAGIC_V1 && magic != MAGIC_V2 {
        return Err(Corruption::BadMagic(magic));
    }
    if size < MIN_RECORD_LEN as i32 || size as usize > verify.max_total_size {
        return Err(Corruption::BadLength(size as i64));
    }
    let total = size as usize;
    let rec = buf.get(..total).ok_or(Corruption::Truncated)?;
    let t = Corruption::Truncated;
    let body_crc = be_i32(rec, BODY_CRC_AT).ok_or(t)? as u32;
    let queue_id = be_i32(rec, QUEUE_ID_AT).ok_or(t)?;
    let flag = be_i32(rec, FLAG_AT).ok_or(t)?;
    let queue_offset = be_i64(rec, QUEUE_OFFSET_AT).ok_or(t)?;
    let phys_offset = be_i64(rec, PHYS_OFFSET_AT).ok_or(t)?;
    let sys_flag = be_i32(rec, SYSFLAG_AT).ok_or(t)?;
    let born_timestamp = be_i64(rec, BORN_TIMESTAMP_AT).ok_or(t)?;
    let (born_host, born_len) =
        read_host(rec, BORN_HOST_AT, sys_flag & SYSFLAG_BORNHOST_V6 != 0).ok_or(t)?;
    let mut at = BORN_HOST_AT + born_len;
    let store_timestamp = be_i64(rec, at).ok_or(t)?;
    at += 8;
    let (store_host, store_len) =
        read_host(rec, at, sys_flag & SYSFLAG_STOREHOST_V6 != 0).ok_or(t)?;
    at += store_len;
    let reconsume_times = be_i32(rec, at).ok_or(t)?;
    at += 4;
    let prepared_transaction_offset = be_i64(rec, at).ok_or(t)?;
    at += 8;
    let body_len = be_i32(rec, at).ok_or(t)?;
    at += 4;
    if body_len < 0 || body_len as usize > total {
        return Err(Corruption::BadLength(body_len as i64));
    }
    let body_start = at;
    let body = rec.get(at..at + body_len as usize).ok_or(t)?;
    at += body_len as usize;
    let v2 = magic == MAGIC_V2;
    let topic_len = if v2 {
        let l = be_i16(rec, at).ok_or(t)? as i64;
        at += 2;
        l
    } else {
        let l = *rec.get(at).ok_or(t)? as i8 as i64;
        at += 1;
        l
    };
    if topic_len < 0 {
        return Err(Corruption::BadLength(topic_len));
    }
    let topic_bytes = rec.get(at..at + topic_len as usize).ok_or(t)?;
    at += topic_len as usize;
    let props_len = be_i16(rec, at).ok_or(t)? as i64;
    at += 2;
    if props_len < 0 {
        return Err(Corruption::BadLength(props_len));
    }
    let properties = rec.get(at..at + props_len as usize).ok_or(t)?;
    let computed = record_len(
        body_len as usize,
        topic_len as usize,
        props_len as usize,
        v2,
        born_len,
        store_len,
    ) as i64;
    if computed != size as i64 {
        return Err(Corruption::SizeMismatch {
            stored: size,
            computed,
        });
    }
    if verify
        .at_offset
        .is_some_and(|expected| expected != phys_offset)
    {
        return Err(Corruption::WrongOffset {
            stored: phys_offset,
        });
    }
    let topic = std::str::from_utf8(topic_bytes).map_err(|_| Corruption::BadUtf8)?;
    let mut record_crc_verified = None;
    if verify.crc {
        let mut body_h = crc32fast::Hasher::new();
        body_h.update(body);
        let computed_body = body_h.clone().finalize() & 0x7FFF_FFFF;
        if computed_body != body_crc {
            return Err(Corruption::BodyCrc {
                stored: body_crc,
                computed: computed_body,
            });
        }
        if let Some(stored) = trailing_crc_property(properties) {
            let crc_end = total - CRC32_RESERVED_LEN;
            let mut h = crc32fast::Hasher::new();
            h.update(&rec[..body_start]);
            h.combine(&body_h);
            h.update(&rec[body_start + body.len()..crc_end]);
            let computed = h.finalize() & 0x7FFF_FFFF;
            if computed != stored {
                return Err(Corruption::RecordCrc { stored, computed });
            }
            record_crc_verified = Some(true);
        } else if verify.require_record_crc {
            return Err(Corruption::MissingRecordCrc);
        }
    }
    Ok(Decoded::Record(RecordView {
        total_size: size as u32,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phys_offset,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body,
        topic,
        properties,
        record_crc_verified,
    }))
}

/// The CRC stored in a record-CRC property that ends the properties region.
fn trailing_crc_property(props: &[u8]) -> Option<u32> {
    let tail = props.get(props.len().checked_sub(CRC32_RESERVED_LEN)?..)?;
    if !tail.starts_with(properties::CRC32.as_bytes())
        || tail[properties::CRC32.len()] != properties::NAME_VALUE_SEPARATOR
        || tail[CRC32_RESERVED_LEN - 1] != properties::PROPERTY_SEPARATOR
    {
        return None;
    }
    let digits =
        std::str::from_utf8(&tail[properties::CRC32.len() + 1..CRC32_RESERVED_LEN - 1]).ok()?;
    properties::parse_crc_digits(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(topic: &'a str, body: &'a [u8], props: &'a [u8], crc: bool) -> RecordFields<'a> {
        RecordFields {
            topic,
            queue_id: 3,
            flag: 7,
            queue_offset: 42,
            phys_offset: 4096,
            sys_flag: 0,
            born_timestamp: 1_700_000_000_000,
            born_host: "10.0.0.1:5555".parse().unwrap(),
            store_timestamp: 1_700_000_000_123,
            store_host: "127.0.0.1:10911".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body,
            properties: props,
            record_crc: crc,
        }
    }

    const V: Verify = Verify {
        crc: true,
        at_offset: Some(4096),
        max_total_size: 1 << 20,
        require_record_crc: false,
    };

    #[test]
    fn v1_layout_matches_rocketmq_offsets() {
        let f = fields("TopicA", b"hello", b"TAGS\x01a\x02", false);
        let mut out = Vec::new();
        encode(&f, &mut out);
        assert_eq!(out.len(), 91 + 5 + 6 + 7);
        assert_eq!(&out[4..8], &MAGIC_V1.to_be_bytes());
        assert_eq!(be_i64(&out, 20), Some(42));
        assert_eq!(be_i64(&out, 28), Some(4096));
        // Store timestamp at 56 with an IPv4 born host.
        assert_eq!(be_i64(&out, 56), Some(1_700_000_000_123));
        assert_eq!(
            be_i32(&out, 8).unwrap() as u32,
            super::super::masked_crc32(b"hello")
        );
        let Decoded::Record(r) = decode(&out, V).unwrap() else {
            panic!()
        };
        assert_eq!(r.topic, "TopicA");
        assert_eq!(r.body, b"hello");
        assert_eq!(r.tags(), Some("a"));
        assert_eq!(r.record_crc_verified, None);
    }

    #[test]
    fn record_crc_covers_every_byte() {
        let f = fields("TopicA", b"hello", b"TAGS\x01a", true);
        let mut out = Vec::new();
        encode(&f, &mut out);
        // A separator was inserted before the reserved CRC bytes.
        let Decoded::Record(r) = decode(&out, V).unwrap() else {
            panic!()
        };
        assert_eq!(r.tags(), Some("a"));
        assert_eq!(r.record_crc_verified, Some(true));
        let strict = Verify {
            require_record_crc: true,
            ..V
        };
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x01;
            assert!(
                decode(&bad, strict).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn v2_and_ipv6() {
        let topic = "%RETRY%".to_string() + &"x".repeat(200);
        let mut f = fields(&topic, b"b", b"", true);
        f.born_host = "[::1]:1".parse().unwrap();
        f.store_host = "[fe80::1]:10911".parse().unwrap();
        let mut out = Vec::new();
        encode(&f, &mut out);
        assert_eq!(out.len(), f.encoded_len());
        let Decoded::Record(r) = decode(&out, V).unwrap() else {
            panic!()
        };
        assert_eq!(r.magic, MAGIC_V2);
        assert_eq!(r.topic, topic);
        assert_eq!(r.born_host, f.born_host);
        assert_eq!(r.store_host, f.store_host);
        assert_eq!(r.sys_flag & 0x30, 0x30);
    }

    #[test]
    fn blank_and_garbage() {
        let b = encode_blank(100);
        assert!(matches!(decode(&b, V), Ok(Decoded::Blank(100))));
        assert_eq!(decode(&[0u8; 64], V).unwrap_err(), Corruption::BadMagic(0));
        assert_eq!(decode(&[0u8; 3], V).unwrap_err(), Corruption::Truncated);
        let f = fields("T", b"x", b"", true);
        let mut out = Vec::new();
        encode(&f, &mut out);
        assert_eq!(
            decode(&out[..out.len() - 1], V).unwrap_err(),
            Corruption::Truncated
        );
        let wrong_place = Verify {
            at_offset: Some(0),
            ..V
        };
        assert!(matches!(
            decode(&out, wrong_place),
            Err(Corruption::WrongOffset { .. })
        ));
    }

    #[test]
    fn records_walks_back_to_back_records_and_stops_at_blank_error_or_cut() {
        let mut log = Vec::new();
        let mut starts = Vec::new();
        for (i, body) in [&b"one"[..], b"second", b"3"].iter().enumerate() {
            starts.push(log.len());
            let mut f = fields("T", body, b"", true);
            f.phys_offset = 4096 + log.len() as i64;
            f.queue_offset = i as i64;
            encode(&f, &mut log);
        }
        let records_end = log.len();
        log.extend_from_slice(&encode_blank(64));
        log.extend_from_slice(&[0xAB; 56]);
        let v = Verify::checksums(0, 1 << 20, true);
        let seen: Vec<_> = Records::new(&log, 4096, v).collect();
        assert_eq!(seen.len(), 4, "three records, then the blank ends the walk");
        for (k, (at, d)) in seen.iter().take(3).enumerate() {
            assert_eq!(*at, starts[k]);
            let Ok(Decoded::Record(r)) = d else {
                panic!("record {k}: {d:?}")
            };
            assert_eq!(r.queue_offset, k as i64);
        }
        assert!(matches!(seen[3], (at, Ok(Decoded::Blank(64))) if at == records_end));

        // Cut inside the second record: one record, then Truncated, and consumed()
        // stops at the first record's end.
        let mut w = Records::new(&log[..starts[1] + 10], 4096, v);
        assert!(matches!(w.next(), Some((0, Ok(Decoded::Record(_))))));
        assert!(matches!(w.next(), Some((_, Err(Corruption::Truncated)))));
        assert!(w.next().is_none());
        assert_eq!(w.consumed(), starts[1]);

        // A wrong base offset is refused at the first record (PHYSICALOFFSET check).
        let mut w = Records::new(&log, 0, v);
        assert!(matches!(w.next(), Some((0, Err(_)))));
        assert!(w.next().is_none());
        assert_eq!(w.consumed(), 0);
    }
}
