//! IndexFile header, slots and entries, plus file names: decode or fail with a
//! typed error; whatever decodes re-encodes to the same bytes; slot and entry
//! positions never overflow.
#![no_main]

use coremq::format::index_file::{
    self, ENTRY_LEN, Geometry, HEADER_LEN, IndexEntry, IndexHeader, SLOT_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let header = match IndexHeader::decode(data) {
        Ok(h) => {
            assert!(h.index_count >= 0);
            assert_eq!(h.encode(), data[..HEADER_LEN]);
            h
        }
        Err(_) => IndexHeader::empty(),
    };
    // Geometry taken from the input (as a damaged file could suggest), slots and
    // entries read after a header as a reader would.
    let word = |at: usize| {
        data.get(at..at + 4)
            .map_or(0, |b| u32::from_be_bytes(b.try_into().unwrap()))
    };
    let g = Geometry {
        slots: word(0) % 4096,
        entries: word(4) % 4096,
    };
    let big = Geometry {
        slots: word(8),
        entries: word(12),
    };
    assert!(big.slots_end() <= big.file_len());
    let _ = big.slot_pos(word(16));
    let _ = big.entry_pos(word(20));
    let mut slot = 0;
    while let Some(b) = data.get(HEADER_LEN + SLOT_LEN * slot as usize..) {
        if slot >= g.slots || b.len() < SLOT_LEN {
            break;
        }
        let v = i32::from_be_bytes(b[..SLOT_LEN].try_into().unwrap());
        if g.valid_link(v, header.index_count) {
            let at = g.entry_pos(v as u32);
            assert!(at + ENTRY_LEN as u64 <= g.file_len());
            if let Some(e) = data
                .get(at as usize..)
                .and_then(|b| IndexEntry::decode(b).ok())
            {
                let _ = e.time(&header);
                assert_eq!(&e.encode()[..], &data[at as usize..at as usize + ENTRY_LEN]);
            }
        }
        assert!(g.slot_of(v) < g.slots.max(1));
        slot += 1;
    }
    for chunk in data.chunks(ENTRY_LEN) {
        match IndexEntry::decode(chunk) {
            Ok(e) => assert_eq!(e.encode(), chunk),
            Err(_) => assert!(chunk.len() < ENTRY_LEN),
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Some(ms) = index_file::parse_file_name(s) {
            // Real dates name themselves; Feb 31 or a leap second normalise.
            let name = index_file::file_name(ms);
            assert_eq!(index_file::parse_file_name(&name), Some(ms));
        }
        let _ = index_file::key_hash(s, s);
        let _ = index_file::typed_uniq_key_hash(s, s);
    }
    let ms = data
        .get(..8)
        .map_or(0, |b| i64::from_be_bytes(b.try_into().unwrap()));
    assert_eq!(index_file::file_name(ms).len(), index_file::NAME_LEN);
    let _ = index_file::time_diff(ms, header.begin_timestamp);
});
