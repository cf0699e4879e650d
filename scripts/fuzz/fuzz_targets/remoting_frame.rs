//! RocketMQ remoting frames (issue 7): any bytes decode to a command, ask for more, or
//! give a typed frame error, never a panic or an allocation sized by a declared
//! length; a decoded command re-encodes to a frame that decodes to the same command.
#![no_main]

use coremq::node::remoting::decode_frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let max = 1 << 20;
    if let Ok(Some((cmd, used))) = decode_frame(data, max) {
        assert!(used <= data.len());
        let again = cmd.encode();
        let (back, n) = decode_frame(&again, usize::MAX >> 1)
            .expect("a re-encoded frame decodes")
            .expect("a re-encoded frame is whole");
        assert_eq!(n, again.len());
        assert_eq!(back.code, cmd.code);
        assert_eq!(back.opaque, cmd.opaque);
        assert_eq!(back.body, cmd.body);
    }
});
