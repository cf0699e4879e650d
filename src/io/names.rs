//! File names by offset: RocketMQ names every CommitLog segment and ConsumeQueue file
//! by its first byte's offset in 20 zero-padded digits, and so does this store.

use super::Disk;
use crate::error::Result;
use std::path::{Path, PathBuf};

/// A 20-digit zero-padded file name, as RocketMQ names its segments.
pub fn offset_name(offset: u64) -> String {
    format!("{offset:020}")
}

/// Parses a 20-digit file name.
pub fn parse_offset_name(name: &str) -> Option<u64> {
    if name.len() != 20 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// Files named by offset, sorted, and the other entries of a directory.
pub type OffsetListing = (Vec<(u64, PathBuf)>, Vec<PathBuf>);

/// [`Disk::list_offset_files`] on the real file system.
pub fn list_offset_files(dir: &Path) -> Result<OffsetListing> {
    Disk::Real.list_offset_files(dir)
}

impl Disk {
    /// Lists `dir`'s files named by 20-digit offsets, sorted; other regular files are
    /// returned separately so callers can refuse or ignore them.
    pub fn list_offset_files(&self, dir: &Path) -> Result<OffsetListing> {
        let mut named = Vec::new();
        let mut other = Vec::new();
        for e in self.list_dir(dir)? {
            match parse_offset_name(&e.name) {
                Some(off) if !e.is_dir => named.push((off, e.path)),
                _ if !e.is_dir => other.push(e.path),
                _ => {}
            }
        }
        named.sort();
        Ok((named, other))
    }
}
