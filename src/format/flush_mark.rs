//! The `flushmark` file: how far the shard's CommitLog is known durable, recorded as
//! flushes happen, so recovery refuses damage below that line and cuts tears above it
//! (the checkpoint's flushed offset, written once a second, is too far behind: in
//! async mode a whole flush interval of data, in sync mode up to a second of
//! acknowledged puts).
//!
//! Two 4096-byte slots, written alternately (write `n` goes to slot `n % 2`), each a
//! direct-I/O page made durable before anything relies on it:
//!
//! ```text
//!  slot at 4096 * (sequence % 2)
//!  off size field
//!    0    4 magic "CMQF"
//!    4    4 version (1)
//!    8    8 sequence   the write's number (1, 2, ...): the higher valid slot wins
//!   16    8 flushed    every CommitLog byte below this is durable; a record boundary
//!   24    4 crc32 of bytes 0..24
//!   28 4068 zeros
//! ```
//!
//! A crash during a write tears at most that slot: its CRC fails and the other slot,
//! one write older (a true durable position too, only lower), wins. A slot never
//! written is all zeros ("no mark there"). Nothing relied on a write that did not
//! complete, so losing it loses nothing. A media flip in the newer slot likewise
//! falls back to the older one (a lower line: damage between the two is judged as a
//! torn tail, not refused).

use super::{Corruption, be_i32, be_i64};

pub const SLOT_LEN: usize = 4096;
/// The file: two slots.
pub const FILE_LEN: usize = 2 * SLOT_LEN;
pub const MAGIC: u32 = u32::from_be_bytes(*b"CMQF");
pub const VERSION: u32 = 1;
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 4;
const SEQUENCE_AT: usize = VERSION_AT + 4;
const FLUSHED_AT: usize = SEQUENCE_AT + 8;
const CRC_AT: usize = FLUSHED_AT + 8;
/// Bytes of a slot that carry data (the rest is zeros).
pub const USED_LEN: usize = CRC_AT + 4;
const _: () = assert!(USED_LEN <= SLOT_LEN && FILE_LEN == 2 * SLOT_LEN);

/// One slot's contents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushMark {
    /// Which write this was (1, 2, ...); it went to slot `sequence % 2`.
    pub sequence: u64,
    /// Every CommitLog byte below this offset is durable.
    pub flushed: u64,
}

impl FlushMark {
    /// File position of the slot that write number `sequence` goes to.
    pub fn slot_offset(sequence: u64) -> u64 {
        (sequence % 2) * SLOT_LEN as u64
    }

    pub fn encode(&self) -> [u8; SLOT_LEN] {
        let mut b = [0u8; SLOT_LEN];
        b[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(&MAGIC.to_be_bytes());
        b[VERSION_AT..VERSION_AT + 4].copy_from_slice(&VERSION.to_be_bytes());
        b[SEQUENCE_AT..SEQUENCE_AT + 8].copy_from_slice(&self.sequence.to_be_bytes());
        b[FLUSHED_AT..FLUSHED_AT + 8].copy_from_slice(&self.flushed.to_be_bytes());
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes one slot: `Ok(None)` when it was never written (its used bytes are all
    /// zeros, or the file ends before it), `Err` when it is damaged (bad magic, CRC,
    /// or a good CRC over another version, `BadLength(version)`, as the checkpoint
    /// does).
    pub fn decode(slot: &[u8]) -> Result<Option<FlushMark>, Corruption> {
        let used = &slot[..slot.len().min(USED_LEN)];
        if used.iter().all(|b| *b == 0) {
            return Ok(None);
        }
        let t = Corruption::Truncated;
        let magic = be_i32(slot, MAGIC_AT).ok_or(t)? as u32;
        if magic != MAGIC {
            return Err(Corruption::BadMagic(magic));
        }
        let stored = be_i32(slot, CRC_AT).ok_or(t)? as u32;
        if crc32fast::hash(&slot[..CRC_AT]) != stored {
            return Err(Corruption::Checksum);
        }
        let version = be_i32(slot, VERSION_AT).ok_or(t)? as u32;
        if version != VERSION {
            return Err(Corruption::BadLength(version as i64));
        }
        Ok(Some(FlushMark {
            sequence: be_i64(slot, SEQUENCE_AT).ok_or(t)? as u64,
            flushed: be_i64(slot, FLUSHED_AT).ok_or(t)? as u64,
        }))
    }

    /// The newest valid slot of a whole file (of any length: a short or empty file
    /// has slots never written). A slot holding a sequence that belongs in the other
    /// slot is damaged (`BadLength(sequence)`: never written so; found by the
    /// `flush_mark` fuzz target). `Err` only when no slot is valid and one is damaged
    /// (the first damage found); `Ok(None)` when no slot was ever written.
    pub fn latest(file: &[u8]) -> Result<Option<FlushMark>, Corruption> {
        let mut best: Option<FlushMark> = None;
        let mut damage = None;
        for i in 0..2 {
            let from = (i * SLOT_LEN).min(file.len());
            let to = ((i + 1) * SLOT_LEN).min(file.len());
            match FlushMark::decode(&file[from..to]) {
                Ok(Some(m)) if FlushMark::slot_offset(m.sequence) != from as u64 => {
                    damage.get_or_insert(Corruption::BadLength(m.sequence as i64));
                }
                Ok(Some(m)) if best.is_none_or(|b| m.sequence > b.sequence) => best = Some(m),
                Ok(_) => {}
                Err(e) => {
                    damage.get_or_insert(e);
                }
            }
        }
        match (best, damage) {
            (Some(m), _) => Ok(Some(m)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(slots: [Option<FlushMark>; 2]) -> Vec<u8> {
        let mut f = vec![0u8; FILE_LEN];
        for m in slots.into_iter().flatten() {
            let at = FlushMark::slot_offset(m.sequence) as usize;
            f[at..at + SLOT_LEN].copy_from_slice(&m.encode());
        }
        f
    }

    #[test]
    fn round_trip_and_damage() {
        let m = FlushMark {
            sequence: 7,
            flushed: 1 << 40,
        };
        let mut b = m.encode();
        assert_eq!(FlushMark::decode(&b), Ok(Some(m)));
        b[20] ^= 1;
        assert_eq!(FlushMark::decode(&b), Err(Corruption::Checksum));
        assert_eq!(FlushMark::decode(&[0u8; SLOT_LEN]), Ok(None));
        assert_eq!(FlushMark::decode(&[]), Ok(None));
        assert_eq!(
            FlushMark::decode(&m.encode()[..10]),
            Err(Corruption::Truncated)
        );
    }

    #[test]
    fn the_newest_valid_slot_wins() {
        let old = FlushMark {
            sequence: 4,
            flushed: 100,
        };
        let new = FlushMark {
            sequence: 5,
            flushed: 200,
        };
        assert_eq!(
            FlushMark::latest(&file([Some(old), Some(new)])),
            Ok(Some(new))
        );
        // The newer write torn: the older slot stands.
        let mut f = file([Some(old), Some(new)]);
        f[FlushMark::slot_offset(5) as usize + 17] ^= 0x10;
        assert_eq!(FlushMark::latest(&f), Ok(Some(old)));
        // Only a torn first write: no mark.
        let mut f = file([
            None,
            Some(FlushMark {
                sequence: 1,
                flushed: 9,
            }),
        ]);
        f[SLOT_LEN + 3] = 0;
        assert_eq!(
            FlushMark::latest(&f),
            Err(Corruption::BadMagic(0x434d_5100))
        );
        assert_eq!(FlushMark::latest(&[]), Ok(None));
        assert_eq!(FlushMark::latest(&file([None, None])), Ok(None));
    }

    /// A slot whose sequence belongs in the other slot was never written so: damage,
    /// not a mark (the `flush_mark` fuzz target found `latest` taking one).
    #[test]
    fn a_sequence_in_the_wrong_slot_is_damage() {
        let odd = FlushMark {
            sequence: 3,
            flushed: 7,
        };
        let mut f = vec![0u8; FILE_LEN];
        f[..SLOT_LEN].copy_from_slice(&odd.encode());
        assert_eq!(FlushMark::latest(&f), Err(Corruption::BadLength(3)));
        let even = FlushMark {
            sequence: 2,
            flushed: 5,
        };
        f[SLOT_LEN..].copy_from_slice(&even.encode());
        assert_eq!(FlushMark::latest(&f), Err(Corruption::BadLength(3)));
        let mut g = vec![0u8; FILE_LEN];
        g[..SLOT_LEN].copy_from_slice(&even.encode());
        g[SLOT_LEN..].copy_from_slice(&odd.encode());
        assert_eq!(FlushMark::latest(&g), Ok(Some(odd)));
    }

    /// A slot with an intact CRC but another version is refused, not read with
    /// version 1's layout (as the checkpoint's section).
    #[test]
    fn unknown_version_is_refused() {
        let mut b = FlushMark {
            sequence: 1,
            flushed: 4096,
        }
        .encode();
        b[VERSION_AT..VERSION_AT + 4].copy_from_slice(&2u32.to_be_bytes());
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(FlushMark::decode(&b), Err(Corruption::BadLength(2)));
    }
}
