//! Properties parser: any bytes parse into pairs without separator bytes, and the
//! pairs the encoder accepts re-encode and parse back to themselves.
#![no_main]

use coremq::format::properties::{self, CRC32, CRC32_RESERVED_LEN, TRANSIENT_PREFIX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut pairs = Vec::new();
    for (name, value) in properties::iter(data) {
        assert!(!name.is_empty() && !value.is_empty());
        assert!(!name.bytes().any(|b| b == 1 || b == 2));
        assert!(!value.bytes().any(|b| b == 2));
        assert!(properties::get(data, name).is_some());
        if let Some(crc) = properties::parse_crc_digits(value) {
            let mut tail = [0u8; CRC32_RESERVED_LEN];
            properties::write_crc_property(&mut tail, crc);
            assert_eq!(
                &tail[CRC32.len() + 1..CRC32_RESERVED_LEN - 1],
                value.as_bytes()
            );
        }
        // The encoder skips these and refuses separators inside values.
        if name != CRC32 && !name.starts_with(TRANSIENT_PREFIX) && !value.contains('\u{1}') {
            pairs.push((name.to_string(), value.to_string()));
        }
    }
    let mut out = Vec::new();
    assert!(properties::encode_into(&pairs, &mut out));
    let back: Vec<(String, String)> = properties::iter(&out)
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!(back, pairs);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = properties::parse_crc_digits(s);
        let _ = properties::get(data, s);
    }
});
