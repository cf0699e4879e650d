//! The storage door: every file the store touches goes through [`Disk`] (the real file
//! system, O_DIRECT through glommio, or the simulated disk) and [`File`], which turn
//! failures into errors that name the operation, the path and the offset. RocketMQ
//! maps its files (`MappedByteBuffer`); this store never maps a file and never reads
//! through the page cache, so it owns its alignment rules and its caches.
//!
//! | file | what |
//! |---|---|
//! | `disk.rs` | [`Disk`] (real or simulated): directory and small-file calls, opening files, `SEEK_DATA`, free space, glommio's probe priming |
//! | `file.rs` | [`File`]: DMA reads and writes, durable writes, fdatasync, truncate |
//! | `buf.rs` | [`PAGE`], [`align_down`]/[`align_up`], [`AlignedBuf`], [`ReadBuf`] |
//! | `dsync.rs` | `pwritev2(RWF_DSYNC)` and the per-executor sync-write thread |
//! | `offload.rs` | [`Disk::off_executor`]: blocking disk calls on glommio's blocking thread |
//! | `lock.rs` | the root lock ([`RootLock`]) |
//! | `names.rs` | 20-digit offset file names and listings |
//! | `sim.rs` | the simulated disk ([`SimDisk`]): torn sectors, lost unsynced data, faults, stalls, replayed by seed |
//!
//! Invariants: direct-I/O writes are page-aligned in offset, length and memory.
//! Nothing here retries a failed write, fdatasync or truncate: what reached the disk
//! is unknown, so the callers stop writing (fail-stop).

mod buf;
mod disk;
mod dsync;
mod file;
mod lock;
mod names;
mod offload;
pub mod sim;

pub use buf::{AlignedBuf, PAGE, ReadBuf, align_down, align_up};
pub use disk::{DirEntry, Disk, next_data, prime_executor, sync_dir};
pub(crate) use dsync::pwritev_dsync;
pub use file::File;
pub use lock::RootLock;
pub(crate) use lock::lock_root;
pub use names::{OffsetListing, list_offset_files, offset_name, parse_offset_name};
pub use sim::{SimDisk, SimOp};
