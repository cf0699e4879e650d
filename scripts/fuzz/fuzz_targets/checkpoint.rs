//! Checkpoint page: decodes or fails with a typed error; what decodes re-encodes
//! to the same RocketMQ timestamps and, when trusted, the same coremq section.
#![no_main]

use coremq::format::checkpoint::{COREMQ_AT, Checkpoint};
use libfuzzer_sys::fuzz_target;

/// coremq's section, magic to CRC.
const SECTION: std::ops::Range<usize> = COREMQ_AT..COREMQ_AT + 40;

fuzz_target!(|data: &[u8]| {
    match Checkpoint::decode(data) {
        Ok((cp, trusted)) => {
            let again = cp.encode();
            assert_eq!(again[..24], data[..24]);
            if trusted {
                assert_eq!(again[SECTION], data[SECTION]);
                assert_eq!(Checkpoint::decode(&again), Ok((cp, true)));
            } else {
                assert_eq!(
                    (
                        cp.log_flushed_offset,
                        cp.dispatch_safe_offset,
                        cp.queue_count
                    ),
                    (0, 0, 0)
                );
            }
        }
        Err(_) => {}
    }
});
