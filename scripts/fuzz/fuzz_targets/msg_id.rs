//! Message ids from hex strings and raw bytes: parse or refuse; what parses
//! prints back as the same hex (ports keep 16 bits) and round-trips.
#![no_main]

use coremq::format::msg_id::{MSG_ID_LEN, MessageId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        match MessageId::parse(s) {
            Some(id) => {
                assert_eq!(s.len(), MSG_ID_LEN * 2);
                let shown = id.to_string();
                assert_eq!(shown[..8], s[..8].to_uppercase());
                assert_eq!(shown[12..], s[12..].to_uppercase());
                assert_eq!(MessageId::parse(&shown), Some(id));
            }
            None => assert!(s.len() != MSG_ID_LEN * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit())),
        }
    }
    if let Some(raw) = data.get(..MSG_ID_LEN) {
        let id = MessageId::from_bytes(raw.try_into().unwrap());
        assert_eq!(MessageId::from_bytes(&id.to_bytes()), id);
        assert_eq!(id.to_bytes()[..4], raw[..4]);
        assert_eq!(id.to_bytes()[6..], raw[6..]);
    }
});
