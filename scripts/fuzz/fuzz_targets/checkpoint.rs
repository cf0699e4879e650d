//! Checkpoint page: decodes or fails with a typed error; what decodes re-encodes
//! to the same RocketMQ timestamps and, when trusted, the same coremq section
//! (version included: a section of another version is refused).
#![no_main]

use coremq::format::Corruption;
use coremq::format::checkpoint::{COREMQ_AT, Checkpoint};
use libfuzzer_sys::fuzz_target;

/// coremq's section, magic to CRC.
const SECTION: std::ops::Range<usize> = COREMQ_AT..COREMQ_AT + 40;

fuzz_target!(|data: &[u8]| {
    check(data);
    // Again with coremq's CRC made to match, so the fuzzer gets past the checksum.
    if data.len() >= SECTION.end {
        let mut fixed = data.to_vec();
        let crc = crc32fast::hash(&fixed[SECTION.start..SECTION.end - 4]);
        fixed[SECTION.end - 4..SECTION.end].copy_from_slice(&crc.to_be_bytes());
        check(&fixed);
    }
});

fn check(data: &[u8]) {
    let (cp, trusted) = match Checkpoint::decode(data) {
        Ok(v) => v,
        Err(Corruption::Truncated) => {
            assert!(data.len() < SECTION.end);
            return;
        }
        // A bad CRC, or a good one over a section of another version.
        Err(Corruption::Checksum | Corruption::BadLength(_)) => {
            assert!(data.len() >= SECTION.end);
            return;
        }
        Err(e) => panic!("unexpected error {e}"),
    };
    let again = cp.encode();
    assert_eq!(again[..24], data[..24]);
    if trusted {
        assert_eq!(again[SECTION], data[SECTION]);
        assert_eq!(Checkpoint::decode(&again), Ok((cp, true)));
    } else {
        let rocketmq_only = Checkpoint {
            physic_msg_timestamp: cp.physic_msg_timestamp,
            logics_msg_timestamp: cp.logics_msg_timestamp,
            index_msg_timestamp: cp.index_msg_timestamp,
            ..Default::default()
        };
        assert_eq!(cp, rocketmq_only);
    }
}
