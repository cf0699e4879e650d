//! Flush-mark file: a slot decodes, is "never written", or fails with a typed error;
//! what decodes re-encodes to the same checked bytes, and the newest valid slot of a
//! file is one that decodes on its own.
#![no_main]

use coremq::format::flush_mark::{FlushMark, USED_LEN};
use libfuzzer_sys::fuzz_target;

/// The checked part of a slot, magic to CRC.
const CHECKED: std::ops::Range<usize> = 0..USED_LEN;

fuzz_target!(|data: &[u8]| {
    check(data);
    // Again with the CRC made to match, so the fuzzer gets past the checksum.
    if data.len() >= CHECKED.end {
        let mut fixed = data.to_vec();
        let crc = crc32fast::hash(&fixed[..CHECKED.end - 4]);
        fixed[CHECKED.end - 4..CHECKED.end].copy_from_slice(&crc.to_be_bytes());
        check(&fixed);
    }
});

fn check(data: &[u8]) {
    match FlushMark::decode(data) {
        Ok(Some(m)) => assert_eq!(m.encode()[CHECKED], data[CHECKED]),
        Ok(None) => assert!(data.iter().take(USED_LEN).all(|b| *b == 0)),
        Err(_) => {}
    }
    if let Ok(Some(m)) = FlushMark::latest(data) {
        let at = (FlushMark::slot_offset(m.sequence) as usize).min(data.len());
        assert_eq!(FlushMark::decode(&data[at..]), Ok(Some(m)));
    }
}
