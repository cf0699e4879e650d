//! The HA protocol's decoders (`format::ha`): frame headers under any body limit and
//! slave reports; whatever decodes re-encodes to the input's bytes and stays within
//! the limit it was decoded with.
#![no_main]

use coremq::format::ha::{self, FrameHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let max_body = data.first().map_or(0, |b| (*b as usize) << 13);
    let rest = data.get(1..).unwrap_or_default();
    if let Ok(h) = FrameHeader::decode(rest, max_body) {
        assert!(h.size as usize <= max_body);
        assert_eq!(h.encode()[..], rest[..ha::FRAME_HEADER_LEN]);
        assert!(h.end() >= h.offset);
    }
    if let Ok(v) = ha::decode_report(rest) {
        assert_eq!(ha::encode_report(v)[..], rest[..ha::REPORT_LEN]);
    }
    let (last, used) = ha::last_report(rest);
    assert!(used <= rest.len() && used % ha::REPORT_LEN == 0);
    assert_eq!(last.is_some(), used > 0);
});
