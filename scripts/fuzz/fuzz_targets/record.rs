//! CommitLog record decoder under every kind of verification. Whatever decodes
//! must lie inside the input, satisfy what was verified, and survive a re-encode:
//! encode(decoded) decodes to the same fields.
#![no_main]

use coremq::StoredMessage;
use coremq::format::masked_crc32;
use coremq::format::record::{self, Decoded, MAGIC_V2, RecordFields, Verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte picks the verification; the rest is the record.
    let Some((&mode, buf)) = data.split_first() else {
        return;
    };
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
