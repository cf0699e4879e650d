//! CommitLog record decoder under every kind of verification. Whatever decodes
//! must lie inside the input, satisfy what was verified, and survive a re-encode:
//! encode(decoded) decodes to the same fields.
//!
//! With a first byte of 0xFF the input instead describes a valid record: it is
//! encoded with the record-CRC property, must decode to itself under strict
//! verification, and with one bit flipped (chosen by the input) must be refused.
#![no_main]

use coremq::StoredMessage;
use coremq::format::masked_crc32;
use coremq::format::record::{self, Decoded, MAGIC_V2, RecordFields, Verify};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fuzz_target!(|data: &[u8]| {
    // First byte picks the verification; the rest is the record.
    let Some((&mode, buf)) = data.split_first() else {
        return;
    };
    if mode == 0xFF {
        valid_then_flipped(buf);
        return;
    }
    let verify = Verify {
        crc: mode & 1 != 0,
        require_record_crc: mode & 2 != 0,
        // Check the stored offset against the one it holds, or against 0.
        at_offset: match (mode >> 2) & 3 {
            0 => None,
            1 => Some(0),
            _ => buf
                .get(28..36)
                .map(|b| i64::from_be_bytes(b.try_into().unwrap())),
        },
        max_total_size: match mode >> 4 {
            0 => 0,
            1 => record::MIN_RECORD_LEN,
            2 => 4096,
            3 => buf.len(),
            _ => usize::MAX,
        },
    };
    let _ = record::peek_header(buf);
    let _ = StoredMessage::decode(&bytes_of(buf));
    let Ok(decoded) = record::decode(buf, verify) else {
        return;
    };
    let r = match decoded {
        Decoded::Blank(n) => {
            assert!(n >= 8 && n <= i32::MAX as u32);
            return;
        }
        Decoded::Record(r) => r,
    };
    let total = r.total_size as usize;
    assert!(
        total >= record::MIN_RECORD_LEN && total <= buf.len() && total <= verify.max_total_size
    );
    let start = buf.as_ptr() as usize;
    for part in [r.body, r.topic.as_bytes(), r.properties] {
        let at = part.as_ptr() as usize - start;
        assert!(at + part.len() <= total);
    }
    if let Some(at) = verify.at_offset {
        assert_eq!(at, r.phys_offset);
    }
    if verify.crc {
        assert_eq!(r.body_crc, masked_crc32(r.body));
        if verify.require_record_crc {
            assert_eq!(r.record_crc_verified, Some(true));
        }
    }
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
    // A V2 record may hold a short topic that the encoder would write as V1.
    if (r.magic == MAGIC_V2) != fields.is_v2() {
        assert!(r.magic == MAGIC_V2 && r.topic.len() <= record::MAX_V1_TOPIC_LEN);
        return;
    }
    assert_eq!(fields.encoded_len(), total);
    let mut out = Vec::new();
    record::encode(&fields, &mut out);
    assert_eq!(out.len(), total);
    // Without CRC checks: ports wider than 16 bits do not survive the round trip,
    // so a record-CRC property copied as is may no longer match.
    let again = record::decode(
        &out,
        Verify {
            crc: false,
            ..verify
        },
    )
    .expect("a re-encoded record decodes");
    let Decoded::Record(a) = again else {
        panic!("a re-encoded record decoded as a blank")
    };
    assert_eq!(
        (
            a.total_size,
            a.magic,
            a.queue_id,
            a.flag,
            a.queue_offset,
            a.phys_offset,
            a.sys_flag
        ),
        (
            r.total_size,
            r.magic,
            r.queue_id,
            r.flag,
            r.queue_offset,
            r.phys_offset,
            r.sys_flag
        )
    );
    assert_eq!(
        (
            a.born_timestamp,
            a.born_host,
            a.store_timestamp,
            a.store_host
        ),
        (
            r.born_timestamp,
            r.born_host,
            r.store_timestamp,
            r.store_host
        )
    );
    assert_eq!(
        (a.reconsume_times, a.prepared_transaction_offset),
        (r.reconsume_times, r.prepared_transaction_offset)
    );
    assert_eq!(
        (a.body, a.topic, a.properties),
        (r.body, r.topic, r.properties)
    );
    assert_eq!(a.body_crc, masked_crc32(r.body));
});

fn bytes_of(b: &[u8]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(b)
}

fn take<'a>(it: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (a, b) = it.split_at(n.min(it.len()));
    *it = b;
    a
}

fn int(it: &mut &[u8], n: usize) -> u64 {
    take(it, n).iter().fold(0u64, |v, b| v << 8 | *b as u64)
}

fn host(it: &mut &[u8], v6: bool) -> SocketAddr {
    let port = int(it, 2) as u16;
    if v6 {
        let mut ip = [0u8; 16];
        let b = take(it, 16);
        ip[..b.len()].copy_from_slice(b);
        SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::from(int(it, 4) as u32)), port)
    }
}

fn valid_then_flipped(mut it: &[u8]) {
    let it = &mut it;
    let flags = int(it, 1);
    let topic_len = int(it, 1) as usize * if flags & 4 != 0 { 2 } else { 1 };
    let body_len = int(it, 2) as usize;
    let props_len = int(it, 2) as usize % 2048;
    let bit = int(it, 4) as usize;
    let born_host = host(it, flags & 1 != 0);
    let store_host = host(it, flags & 2 != 0);
    let topic = String::from_utf8_lossy(take(it, topic_len)).into_owned();
    let body = take(it, body_len).to_vec();
    let properties = take(it, props_len).to_vec();
    let fields = RecordFields {
        topic: &topic,
        queue_id: int(it, 4) as i32,
        flag: int(it, 4) as i32,
        queue_offset: int(it, 8) as i64,
        phys_offset: int(it, 8) as i64,
        sys_flag: int(it, 4) as i32,
        born_timestamp: int(it, 8) as i64,
        born_host,
        store_timestamp: int(it, 8) as i64,
        store_host,
        reconsume_times: int(it, 4) as i32,
        prepared_transaction_offset: int(it, 8) as i64,
        body: &body,
        properties: &properties,
        record_crc: true,
    };
    let mut out = Vec::new();
    let body_crc = record::encode(&fields, &mut out);
    assert_eq!(out.len(), fields.encoded_len());
    let strict = Verify {
        crc: true,
        at_offset: Some(fields.phys_offset),
        max_total_size: usize::MAX,
        require_record_crc: true,
    };
    let Ok(Decoded::Record(r)) = record::decode(&out, strict) else {
        panic!("a freshly encoded record does not decode");
    };
    assert_eq!(r.body_crc, body_crc);
    assert_eq!((r.topic, r.body), (topic.as_str(), &body[..]));
    assert!(r.properties.starts_with(&properties));
    assert_eq!(r.record_crc_verified, Some(true));
    assert_eq!(
        (r.queue_id, r.flag, r.queue_offset, r.phys_offset),
        (
            fields.queue_id,
            fields.flag,
            fields.queue_offset,
            fields.phys_offset
        )
    );
    assert_eq!(
        (
            r.born_timestamp,
            r.born_host,
            r.store_timestamp,
            r.store_host
        ),
        (
            fields.born_timestamp,
            born_host,
            fields.store_timestamp,
            store_host
        )
    );
    assert_eq!(
        (r.reconsume_times, r.prepared_transaction_offset),
        (fields.reconsume_times, fields.prepared_transaction_offset)
    );
    let bit = bit % (out.len() * 8);
    out[bit / 8] ^= 1 << (bit % 8);
    assert!(
        record::decode(&out, strict).is_err(),
        "flip of bit {bit} went unnoticed"
    );
}
