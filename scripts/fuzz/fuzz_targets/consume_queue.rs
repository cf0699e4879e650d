//! ConsumeQueue entries: every 20 bytes decode, and re-encode to themselves.
#![no_main]

use coremq::format::consume_queue::{CqEntry, ENTRY_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks(ENTRY_LEN) {
        match CqEntry::decode(chunk) {
            Some(e) => {
                assert_eq!(e.encode(), chunk);
                assert_eq!(e.is_valid(), e.phys_offset >= 0 && e.size > 0);
                let _ = e.is_pre_blank();
            }
            None => assert!(chunk.len() < ENTRY_LEN),
        }
    }
});
