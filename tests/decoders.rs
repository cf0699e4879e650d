//! Property tests for every decoder that reads untrusted bytes or strings
//! (`coremq::format::*`, `StoredMessage::decode`, segment file names).
//!
//! For each decoder, three kinds of property:
//! - random input of random length (0 bytes, short, long, huge declared lengths)
//!   decodes to a value or a typed error and never panics;
//! - mutations of a valid encoding (bit flips, truncation, extension, length fields
//!   overwritten with extreme values) give an error, or the original value when the
//!   mutation did not touch checked bytes; with record CRC verification on, every
//!   single flipped bit of a record is detected;
//! - round trip: `decode(encode(x)) == x`, and where the encoding is canonical,
//!   `encode(decode(b)) == b` for every `b` that decodes.
//!
//! The cargo-fuzz targets under `scripts/fuzz/` drive the same decoders with
//! coverage-guided input.

use coremq::StoredMessage;
use coremq::format::checkpoint::{CHECKPOINT_LEN, COREMQ_AT, COREMQ_MAGIC, Checkpoint};
use coremq::format::consume_queue::{self, CqEntry};
use coremq::format::deleted_topics::{self, DeletedTopics};
use coremq::format::flush_mark::{self, FlushMark};
use coremq::format::ha;
use coremq::format::index_file::{self, Geometry, IndexEntry, IndexHeader};
use coremq::format::manifest::{self, QueueManifest};
use coremq::format::msg_id::{MSG_ID_LEN, MessageId};
use coremq::format::properties::{self, CRC32, CRC32_RESERVED_LEN};
use coremq::format::record::{
    self, BLANK_MAGIC, BORN_HOST_AT, Decoded, MAGIC_V1, MAGIC_V2, MIN_RECORD_LEN, RecordFields,
    RecordView, Verify,
};
use coremq::format::{Corruption, masked_crc32};
use coremq::io::{offset_name, parse_offset_name};
use proptest::prelude::*;
use proptest::sample::Index;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

const CASES: u32 = 512;

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(CASES)
}

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Random bytes of random length, biased to short inputs but reaching past a page.
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..64),
        2 => prop::collection::vec(any::<u8>(), 0..max),
        1 => Just(Vec::new()),
    ]
}

/// 32-bit values a corrupt length field likes to hold.
fn extreme_i32() -> impl Strategy<Value = i32> {
    prop_oneof![
        prop::sample::select(vec![
            0,
            1,
            -1,
            7,
            8,
            90,
            91,
            92,
            i32::MAX,
            i32::MIN,
            i32::MAX - 1,
            i16::MAX as i32,
            u16::MAX as i32,
            1 << 20,
        ]),
        any::<i32>(),
    ]
}

/// 16-bit values a corrupt length field likes to hold (as the raw bits).
fn extreme_u16() -> impl Strategy<Value = u16> {
    prop_oneof![
        prop::sample::select(vec![0u16, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF]),
        any::<u16>(),
    ]
}

fn host() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
    ]
}

/// Property pairs the store could write: non-empty names and values without
/// separator bytes (RocketMQ's parser drops empty values, see
/// `properties_empty_values_are_dropped`).
fn prop_pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        ("[A-Za-z][A-Za-z0-9_#.]{0,12}", "[^\u{0}-\u{2}]{1,16}"),
        0..6,
    )
}

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[^\u{0}]{0,24}",
        // Past 127 bytes: a V2 record with a two-byte topic length.
        1 => "[A-Za-z0-9%_-]{120,300}",
    ]
}

/// An owned record to encode.
#[derive(Debug, Clone)]
struct Rec {
    topic: String,
    queue_id: i32,
    flag: i32,
    queue_offset: i64,
    phys_offset: i64,
    sys_flag: i32,
    born_timestamp: i64,
    born_host: SocketAddr,
    store_timestamp: i64,
    store_host: SocketAddr,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    body: Vec<u8>,
    properties: Vec<u8>,
    record_crc: bool,
}

impl Rec {
    fn fields(&self) -> RecordFields<'_> {
        RecordFields {
            topic: &self.topic,
            queue_id: self.queue_id,
            flag: self.flag,
            queue_offset: self.queue_offset,
            phys_offset: self.phys_offset,
            sys_flag: self.sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: self.born_host,
            store_timestamp: self.store_timestamp,
            store_host: self.store_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: self.prepared_transaction_offset,
            body: &self.body,
            properties: &self.properties,
            record_crc: self.record_crc,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let body_crc = record::encode(&self.fields(), &mut out);
        assert_eq!(body_crc, masked_crc32(&self.body));
        out
    }

    /// Byte offset of BODYLENGTH in the encoding.
    fn body_len_at(&self) -> usize {
        BORN_HOST_AT
            + record::host_len(&self.born_host)
            + 8
            + record::host_len(&self.store_host)
            + 4
            + 8
    }
    fn topic_len_at(&self) -> usize {
        self.body_len_at() + 4 + self.body.len()
    }
    fn props_len_at(&self) -> usize {
        let field = if self.fields().is_v2() { 2 } else { 1 };
        self.topic_len_at() + field + self.topic.len()
    }

    /// What decoding the encoding must give back.
    fn expected(&self) -> Seen {
        let mut sys_flag =
            self.sys_flag & !(record::SYSFLAG_BORNHOST_V6 | record::SYSFLAG_STOREHOST_V6);
        if self.born_host.is_ipv6() {
            sys_flag |= record::SYSFLAG_BORNHOST_V6;
        }
        if self.store_host.is_ipv6() {
            sys_flag |= record::SYSFLAG_STOREHOST_V6;
        }
        let f = self.fields();
        let encoded = self.encode();
        let props_len = f.stored_properties_len();
        Seen {
            total_size: f.encoded_len() as u32,
            magic: if f.is_v2() { MAGIC_V2 } else { MAGIC_V1 },
            body_crc: masked_crc32(&self.body),
            queue_id: self.queue_id,
            flag: self.flag,
            queue_offset: self.queue_offset,
            phys_offset: self.phys_offset,
            sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: self.born_host,
            store_timestamp: self.store_timestamp,
            store_host: self.store_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: self.prepared_transaction_offset,
            body: self.body.clone(),
            topic: self.topic.clone(),
            properties: encoded[encoded.len() - props_len..].to_vec(),
        }
    }
}

/// The owned, comparable content of a decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    total_size: u32,
    magic: u32,
    body_crc: u32,
    queue_id: i32,
    flag: i32,
    queue_offset: i64,
    phys_offset: i64,
    sys_flag: i32,
    born_timestamp: i64,
    born_host: SocketAddr,
    store_timestamp: i64,
    store_host: SocketAddr,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    body: Vec<u8>,
    topic: String,
    properties: Vec<u8>,
}

impl From<&RecordView<'_>> for Seen {
    fn from(r: &RecordView<'_>) -> Seen {
        Seen {
            total_size: r.total_size,
            magic: r.magic,
            body_crc: r.body_crc,
            queue_id: r.queue_id,
            flag: r.flag,
            queue_offset: r.queue_offset,
            phys_offset: r.phys_offset,
            sys_flag: r.sys_flag,
            born_timestamp: r.born_timestamp,
            born_host: r.born_host,
            store_timestamp: r.store_timestamp,
            store_host: r.store_host,
            reconsume_times: r.reconsume_times,
            prepared_transaction_offset: r.prepared_transaction_offset,
            body: r.body.to_vec(),
            topic: r.topic.to_string(),
            properties: r.properties.to_vec(),
        }
    }
}

fn rec() -> impl Strategy<Value = Rec> {
    let ints = (
        any::<i32>(),
        any::<i32>(),
        any::<i64>(),
        any::<i64>(),
        any::<i32>(),
        any::<i64>(),
        any::<i64>(),
        any::<i32>(),
        any::<i64>(),
    );
    let parts = (
        topic(),
        host(),
        host(),
        prop::collection::vec(any::<u8>(), 0..300),
        prop_pairs(),
        any::<bool>(),
        any::<bool>(),
    );
    (ints, parts).prop_map(
        |(
            (qid, flag, qoff, phys, sys, born_ts, store_ts, reconsume, prepared),
            (topic, born_host, store_host, body, pairs, drop_last_sep, record_crc),
        )| {
            let mut properties = Vec::new();
            assert!(properties::encode_into(&pairs, &mut properties));
            // A region that does not end in a separator makes the encoder add one
            // before the record-CRC property.
            if drop_last_sep {
                properties.pop();
            }
            Rec {
                topic,
                queue_id: qid,
                flag,
                queue_offset: qoff,
                phys_offset: phys,
                sys_flag: sys,
                born_timestamp: born_ts,
                born_host,
                store_timestamp: store_ts,
                store_host,
                reconsume_times: reconsume,
                prepared_transaction_offset: prepared,
                body,
                properties,
                record_crc,
            }
        },
    )
}

fn verify() -> impl Strategy<Value = Verify> {
    (
        any::<bool>(),
        prop::option::of(any::<i64>()),
        prop::sample::select(vec![0usize, 8, MIN_RECORD_LEN, 4096, 1 << 20, usize::MAX]),
        any::<bool>(),
    )
        .prop_map(
            |(crc, at_offset, max_total_size, require_record_crc)| Verify {
                crc,
                at_offset,
                max_total_size,
                require_record_crc,
            },
        )
}

/// Strict verification for `r`, as the store uses it for records it wrote.
fn strict(r: &Rec) -> Verify {
    Verify {
        crc: true,
        at_offset: Some(r.phys_offset),
        max_total_size: 1 << 20,
        require_record_crc: true,
    }
}

/// What a decoded record must satisfy whatever the input was.
fn check_view(buf: &[u8], d: &Decoded<'_>, v: Verify) -> Result<(), TestCaseError> {
    match d {
        Decoded::Blank(n) => {
            prop_assert!(*n >= 8 && *n <= i32::MAX as u32);
            prop_assert_eq!(&buf[4..8], &BLANK_MAGIC.to_be_bytes());
        }
        Decoded::Record(r) => {
            let total = r.total_size as usize;
            prop_assert!(total >= MIN_RECORD_LEN && total <= buf.len());
            prop_assert!(total <= v.max_total_size);
            prop_assert!(r.magic == MAGIC_V1 || r.magic == MAGIC_V2);
            let range = buf.as_ptr_range();
            for part in [r.body, r.topic.as_bytes(), r.properties] {
                let p = part.as_ptr_range();
                prop_assert!(p.start >= range.start && p.end <= range.end);
                prop_assert!(p.end as usize - buf.as_ptr() as usize <= total);
            }
            if let Some(at) = v.at_offset {
                prop_assert_eq!(at, r.phys_offset);
            }
            if v.crc {
                prop_assert_eq!(r.body_crc, masked_crc32(r.body));
                if v.require_record_crc {
                    prop_assert_eq!(r.record_crc_verified, Some(true));
                }
            } else {
                prop_assert_eq!(r.record_crc_verified, None);
            }
            // Whatever decoded re-encodes to the same layout.
            let fields = RecordFields {
                topic: r.topic,
                queue_id: r.queue_id,
                flag: r.flag,
                queue_offset: r.queue_offset,
                phys_offset: r.phys_offset,
                sys_flag: r.sys_flag,
                born_timestamp: r.born_timestamp,
                born_host: r.born_host,
                store_timestamp: r.store_timestamp,
                store_host: r.store_host,
                reconsume_times: r.reconsume_times,
                prepared_transaction_offset: r.prepared_transaction_offset,
                body: r.body,
                properties: r.properties,
                record_crc: false,
            };
            // A V2 record may carry a short topic the encoder would write as V1.
            let v2 = r.magic == MAGIC_V2;
            if v2 == fields.is_v2() {
                prop_assert_eq!(fields.encoded_len(), total);
                let mut out = Vec::new();
                record::encode(&fields, &mut out);
                let again = record::decode(&out, Verify { crc: false, ..v })
                    .map_err(|e| TestCaseError::fail(format!("re-encoded: {e}")))?;
                let Decoded::Record(again) = again else {
                    return Err(TestCaseError::fail("re-encoded record decoded as a blank"));
                };
                let mut want = Seen::from(r);
                want.body_crc = masked_crc32(r.body);
                prop_assert_eq!(Seen::from(&again), want);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// CommitLog records
// ---------------------------------------------------------------------------

/// A record header with a chosen magic and total size, followed by random bytes.
fn record_like() -> impl Strategy<Value = Vec<u8>> {
    (
        extreme_i32(),
        prop::sample::select(vec![MAGIC_V1, MAGIC_V2, BLANK_MAGIC, 0, 0xDAA3_20A0]),
        prop::collection::vec(any::<u8>(), 0..400),
    )
        .prop_map(|(size, magic, tail)| {
            let mut b = size.to_be_bytes().to_vec();
            b.extend_from_slice(&magic.to_be_bytes());
            b.extend_from_slice(&tail);
            b
        })
}

/// A mutation of an encoded value.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBits(Vec<Index>),
    Truncate(Index),
    Extend(Vec<u8>),
    Overwrite(Index, Vec<u8>),
    /// A record length field set to the raw bits given.
    TotalSize(i32),
    BodyLen(i32),
    TopicLen(u16),
    PropsLen(u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        prop::collection::vec(any::<Index>(), 1..8).prop_map(Mutation::FlipBits),
        any::<Index>().prop_map(Mutation::Truncate),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Overwrite(i, b)),
        extreme_i32().prop_map(Mutation::TotalSize),
        extreme_i32().prop_map(Mutation::BodyLen),
        extreme_u16().prop_map(Mutation::TopicLen),
        extreme_u16().prop_map(Mutation::PropsLen),
    ]
}

/// Applies `m` to `b`. Record length fields are only meaningful for a record; for
/// other structures they overwrite the first bytes. Returns whether `b[..checked]`
/// may have changed (truncation counts as a change).
fn apply(m: &Mutation, b: &mut Vec<u8>, r: Option<&Rec>, checked: usize) -> bool {
    let before = b.clone();
    let put = |b: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        for (i, x) in bytes.iter().enumerate() {
            if let Some(slot) = b.get_mut(at + i) {
                *slot = *x;
            }
        }
    };
    match m {
        Mutation::FlipBits(bits) => {
            if b.is_empty() {
                return false;
            }
            for i in bits {
                let bit = i.index(b.len() * 8);
                b[bit / 8] ^= 1 << (bit % 8);
            }
        }
        Mutation::Truncate(i) => {
            let keep = i.index(b.len().max(1));
            b.truncate(keep);
            return keep < checked;
        }
        Mutation::Extend(more) => b.extend_from_slice(more),
        Mutation::Overwrite(i, bytes) => {
            let at = i.index(b.len().max(1));
            put(b, at, bytes);
        }
        Mutation::TotalSize(v) => put(b, 0, &v.to_be_bytes()),
        Mutation::BodyLen(v) => {
            let at = r.map_or(0, Rec::body_len_at);
            put(b, at, &v.to_be_bytes());
        }
        Mutation::TopicLen(v) => match r {
            Some(r) if !r.fields().is_v2() => put(b, r.topic_len_at(), &[*v as u8]),
            Some(r) => put(b, r.topic_len_at(), &v.to_be_bytes()),
            None => put(b, 0, &v.to_be_bytes()),
        },
        Mutation::PropsLen(v) => {
            let at = r.map_or(0, Rec::props_len_at);
            put(b, at, &v.to_be_bytes());
        }
    }
    let end = checked.min(b.len()).min(before.len());
    b[..end] != before[..end]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn record_random_bytes_never_panic(buf in bytes(600), v in verify()) {
        if let Ok(d) = record::decode(&buf, v) {
            check_view(&buf, &d, v)?;
        }
        let _ = record::peek_header(&buf);
        let _ = StoredMessage::decode(&bytes::Bytes::from(buf));
    }

    #[test]
    fn record_declared_lengths_never_panic(buf in record_like(), v in verify()) {
        if let Ok(d) = record::decode(&buf, v) {
            check_view(&buf, &d, v)?;
        }
        let _ = StoredMessage::decode(&bytes::Bytes::from(buf));
    }

    #[test]
    fn record_round_trip(r in rec(), junk in prop::collection::vec(any::<u8>(), 0..32)) {
        let mut buf = r.encode();
        prop_assert_eq!(buf.len(), r.fields().encoded_len());
        let len = buf.len();
        // The buffer may go on past the record.
        buf.extend_from_slice(&junk);
        let verify = Verify { require_record_crc: r.record_crc, ..strict(&r) };
        let d = record::decode(&buf, verify)
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let Decoded::Record(view) = &d else {
            return Err(TestCaseError::fail("decoded a blank"));
        };
        prop_assert_eq!(Seen::from(view), r.expected());
        prop_assert_eq!(view.total_size as usize, len);
        prop_assert_eq!(view.record_crc_verified, r.record_crc.then_some(true));
        if r.record_crc {
            prop_assert!(view.properties.ends_with(&[properties::PROPERTY_SEPARATOR]));
            prop_assert!(view.property(CRC32).is_some());
        }
        check_view(&buf, &d, verify)?;
        // The store's own decoder of raw records agrees.
        let m = StoredMessage::decode(&bytes::Bytes::from(buf[..len].to_vec()))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(&m.topic, &r.topic);
        prop_assert_eq!(&m.body[..], &r.body[..]);
        let mut pairs = Vec::new();
        for (n, v) in properties::iter(&r.properties) {
            pairs.push((n.to_string(), v.to_string()));
        }
        prop_assert_eq!(m.properties, pairs);
    }

    #[test]
    fn record_every_single_bit_flip_is_detected(r in rec(), bit in any::<Index>()) {
        let r = Rec { record_crc: true, ..r };
        let mut buf = r.encode();
        let bit = bit.index(buf.len() * 8);
        buf[bit / 8] ^= 1 << (bit % 8);
        let got = record::decode(&buf, strict(&r));
        prop_assert!(got.is_err(), "flip of bit {} went unnoticed: {:?}", bit, got);
        // Without `require_record_crc` a flip can only go unnoticed by damaging the
        // record-CRC property itself, and then the view says it was not verified.
        let lax = Verify { require_record_crc: false, ..strict(&r) };
        if let Ok(Decoded::Record(v)) = record::decode(&buf, lax) {
            prop_assert!(bit / 8 >= buf.len() - CRC32_RESERVED_LEN);
            prop_assert_eq!(v.record_crc_verified, None);
        }
    }

    #[test]
    fn record_mutations_are_caught(r in rec(), m in mutation(), v in verify()) {
        let r = Rec { record_crc: true, ..r };
        let orig = r.encode();
        let mut buf = orig.clone();
        let changed = apply(&m, &mut buf, Some(&r), orig.len());
        match record::decode(&buf, strict(&r)) {
            Ok(Decoded::Record(view)) => {
                prop_assert!(!changed, "mutation {:?} went unnoticed", m);
                prop_assert_eq!(Seen::from(&view), r.expected());
            }
            Ok(Decoded::Blank(_)) => prop_assert_eq!(&buf[4..8], &BLANK_MAGIC.to_be_bytes()),
            Err(_) => prop_assert!(changed, "unchanged record refused after {:?}", m),
        }
        // Any other verification: no panic, and whatever decodes is consistent.
        if let Ok(d) = record::decode(&buf, v) {
            check_view(&buf, &d, v)?;
        }
        // Without the record CRC only the body CRC guards the bytes.
        let r2 = Rec { record_crc: false, ..r.clone() };
        let mut buf2 = r2.encode();
        apply(&m, &mut buf2, Some(&r2), 0);
        if let Ok(d) = record::decode(&buf2, v) {
            check_view(&buf2, &d, v)?;
        }
    }

    #[test]
    fn blank_round_trip(n in any::<u32>()) {
        let b = record::encode_blank(n);
        let v = Verify { crc: true, at_offset: None, max_total_size: 0, require_record_crc: true };
        match record::decode(&b, v) {
            Ok(Decoded::Blank(got)) => {
                prop_assert!((8..=i32::MAX as u32).contains(&n));
                prop_assert_eq!(got, n);
            }
            Err(Corruption::BadLength(l)) => {
                prop_assert!(!(8..=i32::MAX as u32).contains(&n));
                prop_assert_eq!(l, n as i32 as i64);
            }
            other => prop_assert!(false, "{:?}", other),
        }
        prop_assert_eq!(record::peek_header(&b), Ok((n as i32, BLANK_MAGIC)));
    }
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn properties_random_bytes_never_panic(buf in bytes(600), name in "\\PC{0,8}") {
        for (n, v) in properties::iter(&buf) {
            prop_assert!(!n.is_empty() && !v.is_empty());
            prop_assert!(!n.as_bytes().contains(&properties::NAME_VALUE_SEPARATOR));
            prop_assert!(!n.as_bytes().contains(&properties::PROPERTY_SEPARATOR));
            prop_assert!(!v.as_bytes().contains(&properties::PROPERTY_SEPARATOR));
        }
        if let Some(v) = properties::get(&buf, &name) {
            prop_assert!(properties::iter(&buf).any(|p| p == (name.as_str(), v)));
        }
        let text = String::from_utf8_lossy(&buf);
        if let Some(crc) = properties::parse_crc_digits(&text) {
            let mut out = [0u8; CRC32_RESERVED_LEN];
            properties::write_crc_property(&mut out, crc);
            prop_assert_eq!(&out[CRC32.len() + 1..CRC32_RESERVED_LEN - 1], text.as_bytes());
        }
    }

    #[test]
    fn properties_round_trip(pairs in prop_pairs(), crc in any::<u32>()) {
        let mut out = Vec::new();
        prop_assert!(properties::encode_into(&pairs, &mut out));
        let got: Vec<(String, String)> = properties::iter(&out)
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        prop_assert_eq!(&got, &pairs);
        for (n, v) in &pairs {
            let first = pairs.iter().find(|(m, _)| m == n).map(|(_, v)| v.as_str());
            prop_assert_eq!(properties::get(&out, n), first);
            let _ = v;
        }
        // The record-CRC property parses back to the CRC it was written for.
        let mut tail = [0u8; CRC32_RESERVED_LEN];
        properties::write_crc_property(&mut tail, crc);
        out.extend_from_slice(&tail);
        let digits = properties::get(&out, CRC32).unwrap();
        prop_assert_eq!(properties::parse_crc_digits(digits), Some(crc));
    }

    #[test]
    fn properties_mutations_never_panic(pairs in prop_pairs(), m in mutation()) {
        let mut out = Vec::new();
        prop_assert!(properties::encode_into(&pairs, &mut out));
        apply(&m, &mut out, None, 0);
        let n = properties::iter(&out).count();
        prop_assert!(n <= out.len() / 3 + 1);
        for (name, _) in &pairs {
            let _ = properties::get(&out, name);
        }
    }

    #[test]
    fn crc_digits_any_string(s in "\\PC{0,12}", digits in "[0-9]{10}") {
        let _ = properties::parse_crc_digits(&s);
        // Ten digits, least significant first: valid iff the value fits in 32 bits.
        let value: u64 = digits.bytes().rev().fold(0, |v, b| v * 10 + (b - b'0') as u64);
        prop_assert_eq!(properties::parse_crc_digits(&digits), u32::try_from(value).ok());
    }
}

#[test]
fn properties_empty_values_are_dropped() {
    // RocketMQ's parser needs a segment of 3+ bytes with the 0x01 inside it, so an
    // empty value is written but not read back, here as in RocketMQ.
    let mut out = Vec::new();
    assert!(properties::encode_into(
        &[("A".into(), String::new()), ("B".into(), "b".into())],
        &mut out
    ));
    assert_eq!(properties::iter(&out).collect::<Vec<_>>(), [("B", "b")]);
}

// ---------------------------------------------------------------------------
// ConsumeQueue entries
// ---------------------------------------------------------------------------

fn cq_entry() -> impl Strategy<Value = CqEntry> {
    (any::<i64>(), extreme_i32(), any::<i64>()).prop_map(|(phys_offset, size, tags_code)| CqEntry {
        phys_offset,
        size,
        tags_code,
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cq_random_bytes(buf in bytes(100)) {
        match CqEntry::decode(&buf) {
            None => prop_assert!(buf.len() < consume_queue::ENTRY_LEN),
            // Every 20 bytes are an entry; the encoding is canonical.
            Some(e) => prop_assert_eq!(&e.encode()[..], &buf[..consume_queue::ENTRY_LEN]),
        }
    }

    #[test]
    fn cq_round_trip_and_mutations(e in cq_entry(), m in mutation()) {
        let b = e.encode();
        prop_assert_eq!(CqEntry::decode(&b), Some(e));
        prop_assert_eq!(e.is_valid(), e.phys_offset >= 0 && e.size > 0);
        let mut bad = b.to_vec();
        apply(&m, &mut bad, None, consume_queue::ENTRY_LEN);
        match CqEntry::decode(&bad) {
            None => prop_assert!(bad.len() < consume_queue::ENTRY_LEN),
            Some(got) => prop_assert_eq!(&got.encode()[..], &bad[..consume_queue::ENTRY_LEN]),
        }
    }
}

// ---------------------------------------------------------------------------
// Checkpoint
// ---------------------------------------------------------------------------

fn checkpoint() -> impl Strategy<Value = Checkpoint> {
    (
        (any::<i64>(), any::<i64>(), any::<i64>()),
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()),
    )
        .prop_map(|((p, l, i), (flushed, safe, count, crc_from))| Checkpoint {
            physic_msg_timestamp: p,
            logics_msg_timestamp: l,
            index_msg_timestamp: i,
            log_flushed_offset: flushed,
            dispatch_safe_offset: safe,
            queue_count: count,
            crc_required_from: crc_from,
        })
}

/// Bytes of coremq's section, magic to CRC included.
const CP_CHECKED: std::ops::Range<usize> = COREMQ_AT..COREMQ_AT + 40;

fn rocketmq_part(cp: &Checkpoint) -> Checkpoint {
    Checkpoint {
        physic_msg_timestamp: cp.physic_msg_timestamp,
        logics_msg_timestamp: cp.logics_msg_timestamp,
        index_msg_timestamp: cp.index_msg_timestamp,
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn checkpoint_random_bytes(mut buf in bytes(CHECKPOINT_LEN + 200), magic in any::<bool>()) {
        if magic && buf.len() >= COREMQ_AT + 4 {
            buf[COREMQ_AT..COREMQ_AT + 4].copy_from_slice(&COREMQ_MAGIC.to_be_bytes());
        }
        match Checkpoint::decode(&buf) {
            Ok((cp, true)) => {
                let again = cp.encode();
                prop_assert_eq!(&again[..24], &buf[..24]);
                prop_assert_eq!(&again[CP_CHECKED], &buf[CP_CHECKED]);
            }
            Ok((cp, false)) => {
                prop_assert_eq!(cp, rocketmq_part(&cp));
                prop_assert_eq!(&cp.encode()[..24], &buf[..24]);
            }
            Err(Corruption::Truncated) => prop_assert!(buf.len() < CP_CHECKED.end),
            Err(Corruption::Checksum | Corruption::BadLength(_)) => {
                prop_assert!(buf.len() >= CP_CHECKED.end)
            }
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
    }

    /// coremq's section with random contents but a matching CRC: trusted only when
    /// it is exactly what `encode` writes (the version included).
    #[test]
    fn checkpoint_section_with_valid_crc(
        section in prop::collection::vec(any::<u8>(), 32),
        version in prop_oneof![Just(1u32), Just(0), Just(2), any::<u32>()],
        head in any::<[u8; 24]>(),
    ) {
        let mut b = vec![0u8; CHECKPOINT_LEN];
        b[..24].copy_from_slice(&head);
        b[COREMQ_AT..COREMQ_AT + 4].copy_from_slice(&COREMQ_MAGIC.to_be_bytes());
        b[COREMQ_AT + 4..COREMQ_AT + 8].copy_from_slice(&version.to_be_bytes());
        b[COREMQ_AT + 8..COREMQ_AT + 36].copy_from_slice(&section[..28]);
        let crc = crc32fast::hash(&b[COREMQ_AT..COREMQ_AT + 36]);
        b[COREMQ_AT + 36..COREMQ_AT + 40].copy_from_slice(&crc.to_be_bytes());
        match Checkpoint::decode(&b) {
            Ok((cp, true)) => {
                prop_assert_eq!(version, 1);
                prop_assert_eq!(&cp.encode()[CP_CHECKED], &b[CP_CHECKED]);
                prop_assert_eq!(&cp.encode()[..24], &b[..24]);
            }
            Err(Corruption::BadLength(v)) => {
                prop_assert_ne!(version, 1);
                prop_assert_eq!(v, version as i64);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn checkpoint_round_trip_and_mutations(cp in checkpoint(), m in mutation()) {
        let b = cp.encode();
        prop_assert_eq!(Checkpoint::decode(&b), Ok((cp, true)));
        let mut bad = b.to_vec();
        apply(&m, &mut bad, None, 0);
        let section_changed = bad.len() < CP_CHECKED.end || bad[CP_CHECKED] != b[CP_CHECKED];
        match Checkpoint::decode(&bad) {
            Ok((got, true)) => {
                prop_assert!(!section_changed, "{:?} went unnoticed", m);
                // Only RocketMQ's unchecked timestamps may differ.
                prop_assert_eq!(
                    (got.log_flushed_offset, got.dispatch_safe_offset, got.queue_count, got.crc_required_from),
                    (cp.log_flushed_offset, cp.dispatch_safe_offset, cp.queue_count, cp.crc_required_from)
                );
                if bad[..24] == b[..24] {
                    prop_assert_eq!(got, cp);
                }
            }
            Ok((_, false)) => {
                prop_assert!(bad[COREMQ_AT..COREMQ_AT + 4] != b[COREMQ_AT..COREMQ_AT + 4]);
            }
            Err(_) => prop_assert!(section_changed),
        }
    }

    #[test]
    fn checkpoint_single_bit_flips(cp in checkpoint(), bit in 0usize..CP_CHECKED.end * 8) {
        let mut b = cp.encode();
        b[bit / 8] ^= 1 << (bit % 8);
        let byte = bit / 8;
        let got = Checkpoint::decode(&b);
        if CP_CHECKED.contains(&byte) {
            // A damaged magic reads as a RocketMQ checkpoint; anything else in
            // coremq's section fails its CRC.
            if byte < COREMQ_AT + 4 {
                prop_assert_eq!(got, Ok((rocketmq_part(&cp), false)));
            } else {
                prop_assert_eq!(got, Err(Corruption::Checksum));
            }
        } else {
            let (got, ok) = got.map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert!(ok);
            // RocketMQ's timestamps are not checked: a flip there reads as is.
            prop_assert_eq!(&got.encode()[..24], &b[..24]);
            prop_assert_eq!(
                Checkpoint { physic_msg_timestamp: 0, logics_msg_timestamp: 0, index_msg_timestamp: 0, ..got },
                Checkpoint { physic_msg_timestamp: 0, logics_msg_timestamp: 0, index_msg_timestamp: 0, ..cp }
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Flush mark
// ---------------------------------------------------------------------------

/// Bytes of a flush-mark slot that are checked (magic to CRC).
const MARK_CHECKED: usize = flush_mark::USED_LEN;

fn flush_mark() -> impl Strategy<Value = FlushMark> {
    (any::<u64>(), any::<u64>()).prop_map(|(sequence, flushed)| FlushMark { sequence, flushed })
}

proptest! {
    #![proptest_config(config())]

    /// Random slots and files: never a panic; whatever decodes re-encodes to the
    /// checked bytes it came from.
    #[test]
    fn flush_mark_random_bytes(mut buf in bytes(flush_mark::FILE_LEN + 200), magic in any::<bool>()) {
        if magic && buf.len() >= 4 {
            buf[..4].copy_from_slice(&flush_mark::MAGIC.to_be_bytes());
        }
        match FlushMark::decode(&buf) {
            Ok(Some(m)) => prop_assert_eq!(&m.encode()[..MARK_CHECKED], &buf[..MARK_CHECKED]),
            Ok(None) => prop_assert!(buf.iter().take(MARK_CHECKED).all(|b| *b == 0)),
            Err(_) => {}
        }
        if let Ok(Some(m)) = FlushMark::latest(&buf) {
            let at = FlushMark::slot_offset(m.sequence) as usize;
            let slot = &buf[at.min(buf.len())..];
            prop_assert_eq!(FlushMark::decode(slot), Ok(Some(m)));
        }
    }

    /// A file of two written slots, one of them then damaged by a mutation: the
    /// newest slot that still decodes wins, and the damaged one never reads as
    /// something it was not.
    #[test]
    fn flush_mark_newest_valid_slot_wins(
        older in flush_mark(),
        gap in 1u64..1000,
        flushed in any::<u64>(),
        damage_newer in any::<bool>(),
        m in mutation(),
    ) {
        let older = FlushMark { sequence: older.sequence % (u64::MAX / 2), ..older };
        let newer = FlushMark { sequence: older.sequence + gap * 2 - 1, flushed };
        prop_assert_ne!(FlushMark::slot_offset(older.sequence), FlushMark::slot_offset(newer.sequence));
        let mut file = vec![0u8; flush_mark::FILE_LEN];
        for w in [older, newer] {
            let at = FlushMark::slot_offset(w.sequence) as usize;
            file[at..at + flush_mark::SLOT_LEN].copy_from_slice(&w.encode());
        }
        prop_assert_eq!(FlushMark::latest(&file), Ok(Some(newer)));
        let (hit, kept) = if damage_newer { (newer, older) } else { (older, newer) };
        let at = FlushMark::slot_offset(hit.sequence) as usize;
        let mut slot = file[at..at + flush_mark::SLOT_LEN].to_vec();
        apply(&m, &mut slot, None, 0);
        let changed = slot.len() < MARK_CHECKED || slot[..MARK_CHECKED] != hit.encode()[..MARK_CHECKED];
        match FlushMark::decode(&slot) {
            Ok(Some(got)) => {
                prop_assert!(!changed, "{:?} went unnoticed", m);
                prop_assert_eq!(got, hit);
            }
            Ok(None) => prop_assert!(slot.iter().take(MARK_CHECKED).all(|b| *b == 0)),
            Err(_) => prop_assert!(changed),
        }
        if changed {
            slot.resize(flush_mark::SLOT_LEN, 0);
            file[at..at + flush_mark::SLOT_LEN].copy_from_slice(&slot);
            prop_assert_eq!(FlushMark::latest(&file), Ok(Some(kept)));
        }
    }
}

// ---------------------------------------------------------------------------
// IndexFile
// ---------------------------------------------------------------------------

fn index_header() -> impl Strategy<Value = IndexHeader> {
    (
        (any::<i64>(), any::<i64>(), any::<i64>(), any::<i64>()),
        (extreme_i32(), 0..=i32::MAX),
    )
        .prop_map(|((bt, et, bp, ep), (slots, count))| IndexHeader {
            begin_timestamp: bt,
            end_timestamp: et,
            begin_phy_offset: bp,
            end_phy_offset: ep,
            hash_slot_count: slots,
            index_count: count,
        })
}

fn index_entry() -> impl Strategy<Value = IndexEntry> {
    (any::<i32>(), any::<i64>(), extreme_i32(), extreme_i32()).prop_map(|(h, p, t, prev)| {
        IndexEntry {
            key_hash: h,
            phy_offset: p,
            time_diff: t,
            prev_index: prev,
        }
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn index_random_bytes(buf in bytes(100)) {
        match IndexHeader::decode(&buf) {
            Ok(h) => {
                prop_assert!(h.index_count >= 0);
                prop_assert_eq!(&h.encode()[..], &buf[..index_file::HEADER_LEN]);
            }
            Err(Corruption::Truncated) => prop_assert!(buf.len() < index_file::HEADER_LEN),
            Err(Corruption::BadLength(l)) => prop_assert!(l < 0),
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
        match IndexEntry::decode(&buf) {
            Ok(e) => prop_assert_eq!(&e.encode()[..], &buf[..index_file::ENTRY_LEN]),
            Err(e) => {
                prop_assert_eq!(e, Corruption::Truncated);
                prop_assert!(buf.len() < index_file::ENTRY_LEN);
            }
        }
    }

    #[test]
    fn index_round_trip_and_mutations(
        h in index_header(),
        e in index_entry(),
        m in mutation(),
    ) {
        prop_assert_eq!(IndexHeader::decode(&h.encode()), Ok(h));
        prop_assert_eq!(IndexEntry::decode(&e.encode()), Ok(e));
        let _ = e.time(&h);
        let mut bad = h.encode().to_vec();
        apply(&m, &mut bad, None, 0);
        if let Ok(got) = IndexHeader::decode(&bad) {
            prop_assert_eq!(&got.encode()[..], &bad[..index_file::HEADER_LEN]);
        }
        let mut bad = e.encode().to_vec();
        apply(&m, &mut bad, None, 0);
        if let Ok(got) = IndexEntry::decode(&bad) {
            prop_assert_eq!(&got.encode()[..], &bad[..index_file::ENTRY_LEN]);
        }
    }

    /// Slot and entry positions never overflow, and a slot value that passes
    /// `valid_link` names an entry inside the file.
    #[test]
    fn index_geometry_slots(
        slots in prop_oneof![Just(0u32), Just(1), Just(u32::MAX), any::<u32>()],
        entries in prop_oneof![Just(0u32), Just(1), Just(u32::MAX), any::<u32>()],
        key_hash in any::<i32>(),
        link in extreme_i32(),
        index_count in extreme_i32(),
    ) {
        let g = Geometry { slots, entries };
        let s = g.slot_of(key_hash);
        prop_assert!(s < slots.max(1));
        prop_assert!(g.slot_pos(s) + index_file::SLOT_LEN as u64 <= g.slots_end() || slots == 0);
        prop_assert!(g.slots_end() <= g.file_len());
        if g.valid_link(link, index_count) {
            prop_assert!(link > 0);
            prop_assert!(g.entry_pos(link as u32) + index_file::ENTRY_LEN as u64 <= g.file_len());
        }
        prop_assert!(index_file::abs_hash(key_hash) >= 0);
    }

    #[test]
    fn index_file_names(name in "\\PC{0,20}", digits in "[0-9]{17}", ms in any::<i64>()) {
        let _ = index_file::parse_file_name(&name);
        if let Some(ms) = index_file::parse_file_name(&digits) {
            // A valid name parses to a time whose name is itself when the date is real.
            let back = index_file::file_name(ms);
            if back == digits {
                prop_assert_eq!(index_file::parse_file_name(&back), Some(ms));
            }
        }
        let name = index_file::file_name(ms);
        prop_assert_eq!(name.len(), index_file::NAME_LEN);
        // Within years 0..=9999 names and times are inverse.
        let lo = -62_167_219_200_000i64; // 0000-01-01
        let hi = 253_402_300_800_000i64; // 10000-01-01
        if (lo..hi).contains(&ms) {
            prop_assert_eq!(index_file::parse_file_name(&name), Some(ms));
        }
        let _ = index_file::time_diff(ms, ms.wrapping_mul(3));
    }
}

// ---------------------------------------------------------------------------
// Message ids
// ---------------------------------------------------------------------------

fn msg_id() -> impl Strategy<Value = MessageId> {
    (any::<[u8; 4]>(), any::<u16>(), any::<u64>()).prop_map(|(ip, port, offset)| MessageId {
        store_host: SocketAddrV4::new(Ipv4Addr::from(ip), port),
        offset,
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn msg_id_any_string(s in prop_oneof!["\\PC{0,40}", "[0-9A-Fa-f+\\- ]{30,34}", "[0-9a-fé]{31}"]) {
        match MessageId::parse(&s) {
            Some(id) => {
                prop_assert_eq!(s.len(), MSG_ID_LEN * 2);
                prop_assert!(s.bytes().all(|b| b.is_ascii_hexdigit()));
                // Ports hold 16 bits: the two high bytes of the stored int32 drop.
                let shown = id.to_string();
                prop_assert_eq!(&shown[..8], &s[..8].to_uppercase());
                prop_assert_eq!(&shown[12..], &s[12..].to_uppercase());
            }
            None => prop_assert!(
                s.len() != MSG_ID_LEN * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit())
            ),
        }
    }

    #[test]
    fn msg_id_raw_bytes(buf in bytes(40)) {
        match <&[u8; MSG_ID_LEN]>::try_from(&buf[..]) {
            Ok(arr) => {
                let id = MessageId::from_bytes(arr);
                let mut want = *arr;
                want[4] = 0;
                want[5] = 0;
                prop_assert_eq!(id.to_bytes(), want);
            }
            Err(_) => prop_assert_ne!(buf.len(), MSG_ID_LEN),
        }
    }

    #[test]
    fn msg_id_round_trip(id in msg_id(), flip in 0usize..32) {
        prop_assert_eq!(MessageId::from_bytes(&id.to_bytes()), id);
        let s = id.to_string();
        prop_assert_eq!(MessageId::parse(&s), Some(id));
        prop_assert_eq!(MessageId::parse(&s.to_lowercase()), Some(id));
        // One character replaced by a non-hex one, or one dropped: refused.
        let mut bad = s.clone().into_bytes();
        bad[flip] = b'g';
        prop_assert_eq!(MessageId::parse(std::str::from_utf8(&bad).unwrap()), None);
        prop_assert_eq!(MessageId::parse(&s[..flip]), None);
    }
}

// ---------------------------------------------------------------------------
// ConsumeQueue manifest
// ---------------------------------------------------------------------------

fn queue_manifest() -> impl Strategy<Value = QueueManifest> {
    (
        any::<u64>(),
        prop::collection::vec(("\\PC{0,20}", any::<i32>(), any::<u64>()), 0..12),
    )
        .prop_map(|(dispatch_safe, queues)| QueueManifest {
            dispatch_safe,
            queues,
        })
}

/// `body` followed by its CRC, so decoding gets past the checksum.
fn with_crc(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&body);
    body.extend_from_slice(&crc.to_be_bytes());
    body
}

/// Whatever decodes re-encodes to the same bytes (the encoding is canonical).
fn check_manifest(buf: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(m) = QueueManifest::decode(buf) {
        prop_assert_eq!(&m.encode()[..], buf);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn manifest_random_bytes(buf in bytes(400), header in any::<bool>(), count in extreme_i32()) {
        check_manifest(&buf)?;
        // The same bytes behind a valid header and count, with a valid CRC.
        let mut body = manifest::MAGIC.to_be_bytes().to_vec();
        body.extend_from_slice(&manifest::VERSION.to_be_bytes());
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&count.to_be_bytes());
        if header {
            body.extend_from_slice(&buf);
        }
        check_manifest(&with_crc(body))?;
        check_manifest(&with_crc(buf))?;
    }

    #[test]
    fn manifest_round_trip(m in queue_manifest()) {
        let b = m.encode();
        prop_assert_eq!(QueueManifest::decode(&b), Ok(m));
    }

    #[test]
    fn manifest_mutations(
        m in queue_manifest(),
        mutation in mutation(),
        field in any::<Index>(),
        value in extreme_i32(),
    ) {
        let b = m.encode();
        let mut bad = b.clone();
        let changed = apply(&mutation, &mut bad, None, usize::MAX) || bad != b;
        match QueueManifest::decode(&bad) {
            Ok(got) => {
                prop_assert!(!changed, "{:?} went unnoticed", mutation);
                prop_assert_eq!(got, m.clone());
            }
            Err(_) => prop_assert!(changed),
        }
        // The same damage with a recomputed CRC: decoding must still not panic, and
        // a length field set to an extreme value is refused or read canonically.
        let mut body = b[..b.len() - 4].to_vec();
        apply(&mutation, &mut body, None, 0);
        check_manifest(&with_crc(body.clone()))?;
        if body.len() >= 4 {
            let at = field.index(body.len() - 3);
            body[at..at + 4].copy_from_slice(&value.to_be_bytes());
            check_manifest(&with_crc(body.clone()))?;
            let at = field.index(body.len() - 1);
            body[at..at + 2].copy_from_slice(&(value as u16).to_be_bytes());
            check_manifest(&with_crc(body))?;
        }
    }
}

// ---------------------------------------------------------------------------
// Segment file names (20-digit offsets)
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn offset_names(name in prop_oneof!["\\PC{0,24}", "[0-9]{20}", "[0-9+ -]{20}"], n in any::<u64>()) {
        if let Some(v) = parse_offset_name(&name) {
            prop_assert_eq!(offset_name(v), name);
        }
        prop_assert_eq!(parse_offset_name(&offset_name(n)), Some(n));
    }
}

// ---------------------------------------------------------------------------
// HA protocol: slave reports and master frame headers (`format::ha`)
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ha_random_bytes_never_panic(buf in bytes(64), max_body in 0usize..(1 << 21)) {
        match ha::FrameHeader::decode(&buf, max_body) {
            Ok(h) => {
                prop_assert!(buf.len() >= ha::FRAME_HEADER_LEN);
                prop_assert!(h.size as usize <= max_body);
                prop_assert!(h.end() <= i64::MAX as u64);
                prop_assert_eq!(&h.encode()[..], &buf[..ha::FRAME_HEADER_LEN]);
            }
            Err(e) => prop_assert!(matches!(e, Corruption::Truncated | Corruption::BadLength(_))),
        }
        match ha::decode_report(&buf) {
            Ok(v) => prop_assert_eq!(&ha::encode_report(v)[..], &buf[..ha::REPORT_LEN]),
            Err(e) => prop_assert!(buf.len() < ha::REPORT_LEN || matches!(e, Corruption::BadLength(_))),
        }
        let (last, used) = ha::last_report(&buf);
        prop_assert_eq!(used, buf.len() / 8 * 8);
        prop_assert_eq!(last.is_some(), used > 0);
    }

    #[test]
    fn ha_round_trip(offset in 0u64..(i64::MAX as u64 / 2), size in 0u32..(1 << 20)) {
        let h = ha::FrameHeader { offset, size };
        prop_assert_eq!(ha::FrameHeader::decode(&h.encode(), 1 << 20), Ok(h));
        prop_assert_eq!(ha::decode_report(&ha::encode_report(offset)), Ok(offset));
    }
}

// ---------------------------------------------------------------------------
// Deleted topics (config/deleted-topics)
// ---------------------------------------------------------------------------

fn deleted_topics_value() -> impl Strategy<Value = DeletedTopics> {
    prop::collection::vec(("\\PC{0,20}", any::<u64>()), 0..12)
        .prop_map(|topics| DeletedTopics { topics })
}

/// Whatever decodes re-encodes to the same bytes (the encoding is canonical).
fn check_deleted_topics(buf: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(d) = DeletedTopics::decode(buf) {
        prop_assert_eq!(&d.encode()[..], buf);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn deleted_topics_random_bytes(buf in bytes(400), header in any::<bool>(), count in extreme_i32()) {
        check_deleted_topics(&buf)?;
        let mut body = deleted_topics::MAGIC.to_be_bytes().to_vec();
        body.extend_from_slice(&deleted_topics::VERSION.to_be_bytes());
        body.extend_from_slice(&count.to_be_bytes());
        if header {
            body.extend_from_slice(&buf);
        }
        check_deleted_topics(&with_crc(body))?;
        check_deleted_topics(&with_crc(buf))?;
    }

    #[test]
    fn deleted_topics_round_trip(d in deleted_topics_value()) {
        let b = d.encode();
        prop_assert_eq!(DeletedTopics::decode(&b), Ok(d));
    }

    #[test]
    fn deleted_topics_mutations(d in deleted_topics_value(), mutation in mutation()) {
        let b = d.encode();
        let mut bad = b.clone();
        let changed = apply(&mutation, &mut bad, None, usize::MAX) || bad != b;
        match DeletedTopics::decode(&bad) {
            Ok(got) => {
                prop_assert!(!changed, "{:?} went unnoticed", mutation);
                prop_assert_eq!(got, d.clone());
            }
            Err(_) => prop_assert!(changed),
        }
    }
}

// ---------------------------------------------------------------------------
// config/delayOffset.json (RocketMQ's fastjson text, coremq's delivery positions)
// ---------------------------------------------------------------------------

use coremq::format::delay_offset::DelayOffsets;

fn delay_offsets() -> impl Strategy<Value = DelayOffsets> {
    (
        prop::collection::btree_map(1..300i32, 0..i64::MAX, 0..20),
        any::<i64>(),
        prop::option::of(0..i64::MAX as u64),
        prop::collection::btree_map(
            (any::<u32>(), any::<u32>()),
            (0..i64::MAX as u64, 0..i64::MAX as u64),
            0..20,
        ),
    )
        .prop_map(
            |(offset_table, counter, log_offset, delivered)| DelayOffsets {
                offset_table,
                counter,
                log_offset,
                delivered,
            },
        )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn delay_offset_random_bytes(buf in bytes(400)) {
        if let Ok(d) = DelayOffsets::decode(&buf) {
            prop_assert_eq!(DelayOffsets::decode(&d.encode(0)), Ok(d));
        }
    }

    #[test]
    fn delay_offset_round_trip(d in delay_offsets(), now in any::<i64>()) {
        prop_assert_eq!(DelayOffsets::decode(&d.encode(now)), Ok(d));
    }

    /// Any byte of a valid file changed: an error or some document, never a panic.
    #[test]
    fn delay_offset_mutations(d in delay_offsets(), at in any::<Index>(), value in any::<u8>()) {
        let mut text = d.encode(1);
        let i = at.index(text.len());
        text[i] = value;
        let _ = DelayOffsets::decode(&text);
        text.truncate(i);
        let _ = DelayOffsets::decode(&text);
    }
}
