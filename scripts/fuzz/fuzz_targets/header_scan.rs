//! The node's in-place header reader (issue 20): on any header bytes, of either kind,
//! the in-place reader declines, or reads exactly what the general decoder reads (the
//! fixed fields, the send and the pull header); it never takes a header the general
//! decoder refuses (`coremq::node::remoting::oracle::check_header`).
#![no_main]

use coremq::node::remoting::oracle::check_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, header)) = data.split_first() else {
        return;
    };
    if let Err(e) = check_header(kind % 3, header) {
        panic!("{e}");
    }
});
