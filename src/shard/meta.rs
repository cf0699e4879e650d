//! `<root>/store.meta`: the format version and the shard count of a sharded store.
//!
//! coremq's own file: RocketMQ has no shards, and a lone [`Store`](crate::Store) (a
//! RocketMQ store root) has no such file. Two `key=value` lines:
//!
//! ```text
//! format=1
//! shards=4
//! ```
//!
//! The shard count is fixed when the store is created: queues are placed by
//! `crc32 % shards` (see `ownership`), so opening with another count would look for
//! every queue on a shard that does not hold its data. Such an open is refused with a
//! message naming the count to use. The file is written once, atomically (temporary
//! file, fsync, rename).

use crate::error::{Error, Result};
use std::path::Path;

/// The `format` this code writes and accepts.
pub const META_FORMAT_VERSION: u32 = 1;

/// Checks `<root>/store.meta` against `shards`, creating the file on first open.
pub(super) fn read_or_create_meta(root: &Path, shards: usize) -> Result<()> {
    let path = root.join("store.meta");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = format!("format={META_FORMAT_VERSION}\nshards={shards}\n");
            return crate::io::Disk::Real.replace_file(&path, text.as_bytes());
        }
        Err(e) => return Err(Error::io("read", &path, 0, e)),
    };
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let (Some(format), Some(found)) = (field("format"), field("shards")) else {
        return Err(Error::BadLayout {
            path,
            why: "store.meta is unreadable".into(),
        });
    };
    if format != META_FORMAT_VERSION as u64 {
        return Err(Error::BadLayout {
            path,
            why: format!("unknown store format {format}"),
        });
    }
    if found as usize != shards {
        return Err(Error::Config(format!(
            "the store at {} was created with {found} shards; open it with shards = {found} \
             (changing the count would move queues to shards that do not hold their data)",
            root.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        read_or_create_meta(root, 3).unwrap();
        let text = std::fs::read_to_string(root.join("store.meta")).unwrap();
        assert_eq!(text, "format=1\nshards=3\n");
        read_or_create_meta(root, 3).unwrap();
        let err = read_or_create_meta(root, 2).unwrap_err();
        assert!(
            matches!(err, Error::Config(ref m) if m.contains("shards = 3")),
            "{err}"
        );

        std::fs::write(root.join("store.meta"), "format=9\nshards=3\n").unwrap();
        let err = read_or_create_meta(root, 3).unwrap_err();
        assert!(matches!(err, Error::BadLayout { ref why, .. } if why.contains("format 9")));
        std::fs::write(root.join("store.meta"), "shards=x\n").unwrap();
        let err = read_or_create_meta(root, 3).unwrap_err();
        assert!(matches!(err, Error::BadLayout { ref why, .. } if why.contains("unreadable")));
    }
}
