//! Deleted-topics file: decode or fail with a typed error, never allocating by an
//! unchecked count; the encoding is canonical, so whatever decodes re-encodes to the
//! input. The input is also tried with a valid CRC appended, so the fuzzer gets past
//! the checksum.
#![no_main]

use coremq::format::deleted_topics::DeletedTopics;
use libfuzzer_sys::fuzz_target;

fn check(b: &[u8]) {
    if let Ok(d) = DeletedTopics::decode(b) {
        assert_eq!(d.encode(), b);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut with_crc = data.to_vec();
    with_crc.extend_from_slice(&crc32fast::hash(data).to_be_bytes());
    check(&with_crc);
});
