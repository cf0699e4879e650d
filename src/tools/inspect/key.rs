//! `coremq inspect key`: records found by message key through the IndexFiles
//! (RocketMQ's `IndexService.queryOffset`), each verified against the record itself.

use super::log::LogFiles;
use super::read_full_at;
use super::records::RecordInfo;
use crate::error::{Error, Result};
use crate::format::index_file::{self as ixf, Geometry, IndexEntry, IndexHeader};
use crate::format::properties;
use crate::format::record::{self, Decoded};
use std::collections::HashSet;
use std::fs::File;
use std::path::Path;

/// An `inspect key` lookup: the key, the store-time range (inclusive) and the index
/// geometry the files were written with (RocketMQ's files do not record it).
#[derive(Debug, Clone)]
pub struct KeyQuery {
    pub topic: String,
    pub key: String,
    pub begin: i64,
    pub end: i64,
    pub slots: u32,
    pub entries: u32,
}

/// One record found through an index file.
#[derive(Debug, Clone)]
pub struct KeyHit {
    pub index_file: String,
    pub record: RecordInfo,
}

/// The records of `q.topic` carrying `q.key` (a `KEYS` part or `UNIQ_KEY`) stored
/// within the range, found through the index files of the store at `root`, newest
/// first, each verified against the record itself. Both index-key forms are tried
/// (`topic#key`, and `topic#U#key` for stores written by newer RocketMQ). Returns
/// the hits and the problems met (files of another size, unreadable records).
pub fn key_hits(root: &Path, q: &KeyQuery) -> Result<(Vec<KeyHit>, Vec<String>)> {
    let dir = root.join("index");
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
            .filter(|n| ixf::parse_file_name(n).is_some())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(Error::io("list", &dir, 0, e)),
    };
    names.sort_unstable_by(|a, b| b.cmp(a));
    let mut lookup = Lookup {
        q,
        geo: Geometry {
            slots: q.slots,
            entries: q.entries,
        },
        log: LogFiles::open(root)?,
        hashes: vec![ixf::key_hash(&q.topic, &q.key)],
        seen: HashSet::new(),
        hits: Vec::new(),
        problems: Vec::new(),
    };
    let typed = ixf::typed_uniq_key_hash(&q.topic, &q.key);
    if typed != lookup.hashes[0] {
        lookup.hashes.push(typed);
    }
    for name in names {
        lookup.file(&dir.join(&name), &name)?;
    }
    let mut hits = lookup.hits;
    hits.sort_by_key(|h| std::cmp::Reverse((h.record.store_timestamp, h.record.offset)));
    Ok((hits, lookup.problems))
}

/// One key lookup across a root's index files.
struct Lookup<'a> {
    q: &'a KeyQuery,
    geo: Geometry,
    log: LogFiles,
    hashes: Vec<i32>,
    /// Commit-log offsets already looked at (both key forms may lead to one record).
    seen: HashSet<i64>,
    hits: Vec<KeyHit>,
    problems: Vec<String>,
}

impl Lookup<'_> {
    /// Follows the key's hash chains in one index file.
    fn file(&mut self, path: &Path, name: &str) -> Result<()> {
        let (q, geo) = (self.q, self.geo);
        let file = File::open(path).map_err(|e| Error::io("open", path, 0, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", path, 0, e))?
            .len();
        if len != geo.file_len() {
            self.problems.push(format!(
                "{}: {len} bytes, not {} (pass the store's --index-slots and --index-entries)",
                path.display(),
                geo.file_len()
            ));
            return Ok(());
        }
        let read = |pos: u64, n: usize| {
            read_full_at(&file, pos, n).map_err(|e| Error::io("read", path, pos, e))
        };
        let Ok(h) = IndexHeader::decode(&read(0, ixf::HEADER_LEN)?) else {
            self.problems
                .push(format!("{}: damaged header", path.display()));
            return Ok(());
        };
        if !h.has_entries() || h.begin_timestamp > q.end || h.end_timestamp < q.begin {
            return Ok(());
        }
        for k in 0..self.hashes.len() {
            let hash = self.hashes[k];
            let slot = read(geo.slot_pos(geo.slot_of(hash)), 4)?;
            let mut i = crate::format::be_i32(&slot, 0).unwrap_or(0);
            while geo.valid_link(i, h.index_count) {
                let Ok(e) = IndexEntry::decode(&read(geo.entry_pos(i as u32), ixf::ENTRY_LEN)?)
                else {
                    break;
                };
                let t = e.time(&h);
                if t.saturating_add(999) < q.begin {
                    break;
                }
                if e.key_hash == hash
                    && t <= q.end
                    && e.phy_offset >= 0
                    && self.seen.insert(e.phy_offset)
                {
                    self.record(e.phy_offset as u64, name, i);
                }
                if e.prev_index >= i {
                    break;
                }
                i = e.prev_index;
            }
        }
        Ok(())
    }

    /// Keeps the record an entry (`i` of index file `name`) points at when it really
    /// is one of the query's.
    fn record(&mut self, at: u64, name: &str, i: i32) {
        let q = self.q;
        let raw = match self.log.read_record(at) {
            Ok(raw) => raw,
            Err(why) => {
                // Removed by retention or lost with a torn tail: not a hit.
                if at >= self.log.min_offset() {
                    self.problems.push(format!(
                        "{name}: entry {i} -> commit-log offset {at}: {why}"
                    ));
                }
                return;
            }
        };
        // `read_record` verified the checksums already.
        let Ok(Decoded::Record(r)) = record::decode(&raw, self.log.verify(at, false)) else {
            return;
        };
        let key_ok = ixf::has_key(r.property(properties::UNIQ_KEY), r.keys(), &q.key);
        if r.topic == q.topic && key_ok && (q.begin..=q.end).contains(&r.store_timestamp) {
            self.hits.push(KeyHit {
                index_file: name.to_string(),
                record: RecordInfo::new(at, &r, None),
            });
        }
    }
}
