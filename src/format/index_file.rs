//! RocketMQ's IndexFile (the key index): pure layout, hashing and naming.
//!
//! ```text
//!  header (40 bytes)
//!    0  8 beginTimestamp   store time of the file's first entry
//!    8  8 endTimestamp     store time of the file's last entry
//!   16  8 beginPhyOffset   commit-log offset of the first entry's record
//!   24  8 endPhyOffset     commit-log offset of the last entry's record
//!   32  4 hashSlotCount    slots ever used
//!   36  4 indexCount       next entry number (starts at 1; entry 0 is never used)
//!  slots: slotNum x int32 at 40 + 4*s, the newest entry of that slot (0 = empty)
//!  entries: 20 bytes at 40 + 4*slotNum + 20*i
//!    0  4 keyHash          |Java hashCode("topic#key")| (Integer.MIN_VALUE -> 0)
//!    4  8 phyOffset        commit-log offset of the record
//!   12  4 timeDiff         (storeTimestamp - beginTimestamp) / 1000, clamped to [0, i32::MAX]
//!   16  4 prevIndex        older entry of the same slot (0 = end of chain)
//! ```
//!
//! Index keys are the classic plain form `topic#key`, for `UNIQ_KEY` as for each
//! `KEYS` part (what RocketMQ up to 5.3.3 writes; newer writers use `topic#U#uniq` for
//! the unique key, see [`typed_uniq_key_hash`]).

use super::{Corruption, be_i32, be_i64};

pub const HEADER_LEN: usize = 40;
pub const SLOT_LEN: usize = 4;
pub const ENTRY_LEN: usize = 20;
/// RocketMQ's `maxHashSlotNum`.
pub const DEFAULT_SLOTS: u32 = 5_000_000;
/// RocketMQ's `maxIndexNum`.
pub const DEFAULT_ENTRIES: u32 = 20_000_000;
/// Length of a file name: `yyyyMMddHHmmssSSS`.
pub const NAME_LEN: usize = 17;

/// The 40-byte header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexHeader {
    pub begin_timestamp: i64,
    pub end_timestamp: i64,
    pub begin_phy_offset: i64,
    pub end_phy_offset: i64,
    pub hash_slot_count: i32,
    pub index_count: i32,
}

impl IndexHeader {
    /// The header of a new, empty file (RocketMQ: indexCount starts at 1).
    pub fn empty() -> IndexHeader {
        IndexHeader {
            index_count: 1,
            ..Default::default()
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.begin_timestamp.to_be_bytes());
        b[8..16].copy_from_slice(&self.end_timestamp.to_be_bytes());
        b[16..24].copy_from_slice(&self.begin_phy_offset.to_be_bytes());
        b[24..32].copy_from_slice(&self.end_phy_offset.to_be_bytes());
        b[32..36].copy_from_slice(&self.hash_slot_count.to_be_bytes());
        b[36..40].copy_from_slice(&self.index_count.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<IndexHeader, Corruption> {
        let t = Corruption::Truncated;
        let h = IndexHeader {
            begin_timestamp: be_i64(b, 0).ok_or(t)?,
            end_timestamp: be_i64(b, 8).ok_or(t)?,
            begin_phy_offset: be_i64(b, 16).ok_or(t)?,
            end_phy_offset: be_i64(b, 24).ok_or(t)?,
            hash_slot_count: be_i32(b, 32).ok_or(t)?,
            index_count: be_i32(b, 36).ok_or(t)?,
        };
        if h.index_count < 0 {
            return Err(Corruption::BadLength(h.index_count as i64));
        }
        Ok(h)
    }

    /// Whether the file holds at least one entry.
    pub fn has_entries(&self) -> bool {
        self.index_count > 1
    }
}

/// One 20-byte entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexEntry {
    pub key_hash: i32,
    pub phy_offset: i64,
    pub time_diff: i32,
    pub prev_index: i32,
}

impl IndexEntry {
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..4].copy_from_slice(&self.key_hash.to_be_bytes());
        b[4..12].copy_from_slice(&self.phy_offset.to_be_bytes());
        b[12..16].copy_from_slice(&self.time_diff.to_be_bytes());
        b[16..20].copy_from_slice(&self.prev_index.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<IndexEntry, Corruption> {
        let t = Corruption::Truncated;
        Ok(IndexEntry {
            key_hash: be_i32(b, 0).ok_or(t)?,
            phy_offset: be_i64(b, 4).ok_or(t)?,
            time_diff: be_i32(b, 12).ok_or(t)?,
            prev_index: be_i32(b, 16).ok_or(t)?,
        })
    }

    /// Approximate store time: the header's begin plus whole seconds, so the real
    /// store time lies in `[time, time + 999]`.
    pub fn time(&self, header: &IndexHeader) -> i64 {
        header
            .begin_timestamp
            .saturating_add(self.time_diff as i64 * 1000)
    }
}

/// Geometry of a file: slot count and entry capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub slots: u32,
    pub entries: u32,
}

impl Geometry {
    pub fn slot_pos(&self, slot: u32) -> u64 {
        HEADER_LEN as u64 + SLOT_LEN as u64 * slot as u64
    }
    /// First byte after the slot table.
    pub fn slots_end(&self) -> u64 {
        self.slot_pos(self.slots)
    }
    pub fn entry_pos(&self, index: u32) -> u64 {
        self.slots_end() + ENTRY_LEN as u64 * index as u64
    }
    /// Exact file size (RocketMQ: 420,000,040 bytes with the defaults).
    pub fn file_len(&self) -> u64 {
        self.entry_pos(self.entries)
    }
    pub fn slot_of(&self, key_hash: i32) -> u32 {
        // key_hash is never negative (see `abs_hash`); be safe anyway.
        (key_hash as u32 & 0x7FFF_FFFF) % self.slots.max(1)
    }
    /// A slot value that names a usable entry of a file with `index_count`.
    pub fn valid_link(&self, v: i32, index_count: i32) -> bool {
        v > 0 && v < index_count && (v as u32) < self.entries
    }
}

/// RocketMQ's rule: `Math.abs(hashCode)`, and 0 if still negative (MIN_VALUE).
pub fn abs_hash(h: i32) -> i32 {
    let a = h.wrapping_abs();
    if a < 0 { 0 } else { a }
}

/// Java `hashCode` continued over more text (UTF-16 units), so `topic#key` is
/// hashed without building the string. ASCII (one UTF-16 unit per byte) is hashed
/// byte by byte; the rest of the text from its first other character goes through
/// `encode_utf16`.
fn continue_hash(mut h: i32, s: &str) -> i32 {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && b[i] < 0x80 {
        h = h.wrapping_mul(31).wrapping_add(b[i] as i32);
        i += 1;
    }
    if i == b.len() {
        return h;
    }
    // `i` is a character boundary: every byte before it is ASCII.
    s[i..]
        .encode_utf16()
        .fold(h, |h, unit| h.wrapping_mul(31).wrapping_add(unit as i32))
}

/// Hash of the index key `topic#key`, as stored in entries.
pub fn key_hash(topic: &str, key: &str) -> i32 {
    key_hash_with(topic_prefix_hash(topic), key)
}

/// The hash state after `topic#`: computed once per record, then
/// [`key_hash_with`] for each of its keys.
pub fn topic_prefix_hash(topic: &str) -> i32 {
    continue_hash(continue_hash(0, topic), "#")
}

/// [`key_hash`] of `topic#key` from `topic`'s [`topic_prefix_hash`].
pub fn key_hash_with(prefix: i32, key: &str) -> i32 {
    abs_hash(continue_hash(prefix, key))
}

/// The `UNIQ_KEY` and `KEYS` values of an encoded properties region, in one pass,
/// as [`super::properties::get`] finds them (the first segment of that name with a
/// valid UTF-8 value). Names are compared as bytes; only the two values used are
/// checked for UTF-8.
pub fn index_properties(props: &[u8]) -> (Option<&str>, Option<&str>) {
    use super::properties::{KEYS, NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, UNIQ_KEY};
    let (mut uniq, mut keys) = (None, None);
    for seg in props.split(|b| *b == PROPERTY_SEPARATOR) {
        if seg.len() < 3 {
            continue;
        }
        let Some(sep) = seg.iter().position(|b| *b == NAME_VALUE_SEPARATOR) else {
            continue;
        };
        if sep == 0 || sep == seg.len() - 1 {
            continue;
        }
        let name = &seg[..sep];
        let slot = if name == KEYS.as_bytes() {
            &mut keys
        } else if name == UNIQ_KEY.as_bytes() {
            &mut uniq
        } else {
            continue;
        };
        if slot.is_none()
            && let Ok(v) = std::str::from_utf8(&seg[sep + 1..])
        {
            *slot = Some(v);
            if uniq.is_some() && keys.is_some() {
                break;
            }
        }
    }
    (uniq, keys)
}

/// Hash of the typed unique-key form `topic#U#key` some newer writers use.
pub fn typed_uniq_key_hash(topic: &str, key: &str) -> i32 {
    let h = continue_hash(continue_hash(0, topic), "#U#");
    abs_hash(continue_hash(h, key))
}

/// Seconds from `begin` to `store_ts` as RocketMQ stores them (0 if `begin <= 0`).
pub fn time_diff(store_ts: i64, begin: i64) -> i32 {
    if begin <= 0 {
        return 0;
    }
    (store_ts.saturating_sub(begin) / 1000).clamp(0, i32::MAX as i64) as i32
}

/// The keys a record is indexed under (before the `topic#` prefix): `UNIQ_KEY` first,
/// then every non-empty part of `KEYS` split on single spaces.
pub fn index_keys<'a>(
    uniq: Option<&'a str>,
    keys: Option<&'a str>,
) -> impl Iterator<Item = &'a str> {
    uniq.filter(|u| !u.is_empty()).into_iter().chain(
        keys.into_iter()
            .flat_map(|k| k.split(' '))
            .filter(|k| !k.is_empty()),
    )
}

/// Whether a record with these properties carries `key`.
pub fn has_key(uniq: Option<&str>, keys: Option<&str>, key: &str) -> bool {
    index_keys(uniq, keys).any(|k| k == key)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `yyyyMMddHHmmssSSS` of a wall-clock time given as milliseconds since the epoch in
/// the zone wanted (add the zone's UTC offset first for local time).
pub fn file_name(wall_ms: i64) -> String {
    let days = wall_ms.div_euclid(86_400_000);
    let in_day = wall_ms.rem_euclid(86_400_000);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s, ms) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    format!(
        "{:04}{mo:02}{d:02}{h:02}{mi:02}{s:02}{ms:03}",
        y.clamp(0, 9999)
    )
}

/// The wall-clock milliseconds a file name stands for (inverse of [`file_name`]).
pub fn parse_file_name(name: &str) -> Option<i64> {
    if name.len() != NAME_LEN || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |a: usize, b: usize| name[a..b].parse::<i64>().ok();
    let (y, mo, d) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (h, mi, s, ms) = (n(8, 10)?, n(10, 12)?, n(12, 14)?, n(14, 17)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y, mo as u32, d as u32);
    Some(days * 86_400_000 + h * 3_600_000 + mi * 60_000 + s * 1000 + ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::java::string_hash_code;

    #[test]
    fn header_and_entry_round_trip_big_endian() {
        let h = IndexHeader {
            begin_timestamp: 1,
            end_timestamp: 2,
            begin_phy_offset: 3,
            end_phy_offset: 4,
            hash_slot_count: 5,
            index_count: 6,
        };
        let b = h.encode();
        assert_eq!(&b[0..8], &1i64.to_be_bytes());
        assert_eq!(&b[24..32], &4i64.to_be_bytes());
        assert_eq!(&b[36..40], &6i32.to_be_bytes());
        assert_eq!(IndexHeader::decode(&b), Ok(h));
        let e = IndexEntry {
            key_hash: 7,
            phy_offset: 1 << 40,
            time_diff: 9,
            prev_index: 10,
        };
        let eb = e.encode();
        assert_eq!(&eb[4..12], &(1i64 << 40).to_be_bytes());
        assert_eq!(IndexEntry::decode(&eb), Ok(e));
    }

    #[test]
    fn decoders_never_panic() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                IndexHeader::decode(&vec![0xFF; len]),
                Err(Corruption::Truncated)
            );
        }
        for len in 0..ENTRY_LEN {
            assert!(IndexEntry::decode(&vec![0x80; len]).is_err());
        }
        let mut b = IndexHeader::empty().encode();
        b[36] = 0x80;
        assert!(matches!(
            IndexHeader::decode(&b),
            Err(Corruption::BadLength(_))
        ));
        for junk in [
            "",
            "2024",
            "2024010100000000x",
            "20241301000000000",
            "20240100000000000",
        ] {
            assert_eq!(parse_file_name(junk), None, "{junk}");
        }
    }

    #[test]
    fn default_geometry_matches_rocketmq() {
        let g = Geometry {
            slots: DEFAULT_SLOTS,
            entries: DEFAULT_ENTRIES,
        };
        assert_eq!(g.file_len(), 420_000_040);
        assert_eq!(g.slot_pos(0), 40);
        assert_eq!(g.entry_pos(1), 40 + 20_000_000 + 20);
    }

    #[test]
    fn key_hash_is_java_hash_of_topic_hash_key() {
        for (t, k) in [
            ("TopicA", "k1"),
            ("T", ""),
            ("%RETRY%g", "\u{1F600}x"),
            ("a", "b c"),
            ("T\u{e9}", "x\u{1F600}y"),
            ("Topic", "k\u{7f}\u{80}"),
        ] {
            let h = string_hash_code(&format!("{t}#{k}"));
            assert_eq!(key_hash(t, k), abs_hash(h));
            assert_eq!(
                typed_uniq_key_hash(t, k),
                abs_hash(string_hash_code(&format!("{t}#U#{k}")))
            );
        }
        // Known Java values: "T#k".hashCode() = (84*31 + 35)*31 + 107 = 81916.
        assert_eq!(key_hash("T", "k"), 81_916);
        // Collisions are real: "Aa" and "BB" share a hash, so do "T#Aa" and "T#BB".
        assert_eq!(key_hash("T", "Aa"), key_hash("T", "BB"));
        assert_eq!(abs_hash(i32::MIN), 0);
        assert_eq!(abs_hash(-5), 5);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE.
        assert_eq!(abs_hash(string_hash_code("polygenelubricants")), 0);
        let g = Geometry {
            slots: 10,
            entries: 100,
        };
        assert_eq!(g.slot_of(81_916), 6);
        assert_eq!(g.slot_of(0), 0);
    }

    #[test]
    fn one_pass_properties_match_get() {
        use crate::format::properties::{self, KEYS, UNIQ_KEY};
        let cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"KEYS\x01a b\x02UNIQ_KEY\x01U1\x02TAGS\x01t\x02".to_vec(),
            b"TAGS\x01t\x02UNIQ_KEY\x01U1\x02KEYS\x01k\x02KEYS\x01second\x02".to_vec(),
            // An invalid value is skipped; the next segment of that name counts.
            b"KEYS\x01\xff\xfe\x02KEYS\x01ok\x02".to_vec(),
            b"KEYS\x01\x02\x01KEYS\x02KEYS\x01x\x01y\x02UNIQ_KEY".to_vec(),
            "KEYS\u{1}\u{1F600} \u{e9}\u{2}".as_bytes().to_vec(),
        ];
        for props in &cases {
            assert_eq!(
                index_properties(props),
                (
                    properties::get(props, UNIQ_KEY),
                    properties::get(props, KEYS)
                ),
                "{props:?}"
            );
        }
    }

    #[test]
    fn time_diff_rules() {
        assert_eq!(time_diff(5_000, 0), 0);
        assert_eq!(time_diff(5_999, 1_000), 4);
        assert_eq!(time_diff(500, 1_000), 0);
        assert_eq!(time_diff(i64::MAX, 1), i32::MAX);
        let h = IndexHeader {
            begin_timestamp: 1_000,
            ..IndexHeader::empty()
        };
        assert_eq!(
            IndexEntry {
                time_diff: 4,
                ..Default::default()
            }
            .time(&h),
            5_000
        );
    }

    #[test]
    fn keys_split_on_spaces() {
        let v: Vec<_> = index_keys(Some("U1"), Some(" a  b c ")).collect();
        assert_eq!(v, ["U1", "a", "b", "c"]);
        let v: Vec<_> = index_keys(Some(""), None).collect();
        assert!(v.is_empty());
        assert!(has_key(None, Some("x y"), "y"));
        assert!(!has_key(None, Some("x y"), "x y"));
    }

    #[test]
    fn names_are_local_wall_clock_millis() {
        // 2021-03-04 05:06:07.089 UTC = 1614834367089 ms.
        assert_eq!(file_name(1_614_834_367_089), "20210304050607089");
        assert_eq!(
            parse_file_name("20210304050607089"),
            Some(1_614_834_367_089)
        );
        assert_eq!(file_name(0), "19700101000000000");
        for ms in [0i64, 951_782_400_000, 4_102_444_799_999, 1_709_164_800_123] {
            assert_eq!(parse_file_name(&file_name(ms)), Some(ms));
        }
        assert_eq!(file_name(951_782_400_000), "20000229000000000");
    }
}
