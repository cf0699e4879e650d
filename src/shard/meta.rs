//! `<root>/store.meta`: the format version and the shard count of a sharded store.
//!
//! coremq's own file: RocketMQ has no shards, and a lone [`Store`](crate::Store) (a
//! RocketMQ store root) has no such file. `key=value` lines:
//!
//! ```text
//! format=2
//! shards=4
//! ```
//!
//! The format names the ownership rule (`ownership`): 1 is [`Ownership::QueueCrc32`]
//! (stores created before format 2), 2 is [`Ownership::TopicPlusQueue`]. The shard count
//! is fixed when the store is created: queues are placed by it, so opening with another
//! count would look for every queue on a shard that does not hold its data. Such an open
//! is refused with a message naming the count to use. The file is written once,
//! atomically (temporary file, fsync, rename).

use super::ownership::Ownership;
use crate::error::{Error, Result};
use std::path::Path;

/// The `format` this code writes; it also opens format 1.
pub const META_FORMAT_VERSION: u32 = 2;

/// Checks `<root>/store.meta` against `shards`, creating the file on first open, and
/// returns the store's ownership rule.
pub(super) fn read_or_create_meta(root: &Path, shards: usize) -> Result<Ownership> {
    let path = root.join("store.meta");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = format!("format={META_FORMAT_VERSION}\nshards={shards}\n");
            crate::io::Disk::Real.replace_file(&path, text.as_bytes())?;
            return Ok(Ownership::CURRENT);
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
    let ownership = match format {
        1 => Ownership::QueueCrc32,
        2 => Ownership::TopicPlusQueue,
        _ => {
            return Err(Error::BadLayout {
                path,
                why: format!("unknown store format {format}"),
            });
        }
    };
    if found as usize != shards {
        return Err(Error::Config(format!(
            "the store at {} was created with {found} shards; open it with shards = {found} \
             (changing the count would move queues to shards that do not hold their data)",
            root.display()
        )));
    }
    Ok(ownership)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(
            read_or_create_meta(root, 3).unwrap(),
            Ownership::TopicPlusQueue
        );
        let text = std::fs::read_to_string(root.join("store.meta")).unwrap();
        assert_eq!(text, "format=2\nshards=3\n");
        read_or_create_meta(root, 3).unwrap();
        // A store created before format 2 keeps its rule.
        std::fs::write(root.join("store.meta"), "format=1\nshards=3\n").unwrap();
        assert_eq!(read_or_create_meta(root, 3).unwrap(), Ownership::QueueCrc32);
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
