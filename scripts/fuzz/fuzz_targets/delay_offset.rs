//! `config/delayOffset.json`: decode any bytes without panicking or unbounded
//! recursion; whatever decodes re-encodes to text that decodes to the same values.
#![no_main]

use coremq::format::delay_offset::DelayOffsets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = DelayOffsets::decode(data) {
        let again = DelayOffsets::decode(&d.encode(0)).expect("own encoding decodes");
        assert_eq!(again, d);
    }
});
