//! Buffers for direct I/O: the page size every O_DIRECT offset and length is aligned
//! to, the alignment helpers, [`AlignedBuf`] (page-aligned memory that can cross
//! threads, for the durable writes done off the executor) and [`ReadBuf`] (what a read
//! returns, on either disk).

/// The alignment of every direct-I/O offset, length and buffer address.
pub const PAGE: usize = 4096;

pub fn align_down(v: u64) -> u64 {
    v & !(PAGE as u64 - 1)
}
pub fn align_up(v: u64) -> u64 {
    align_down(v + PAGE as u64 - 1)
}

/// Bytes read from a file: glommio's buffer on the real disk, a vector on the
/// simulated one.
pub enum ReadBuf {
    Dma(glommio::io::ReadResult),
    Mem(Vec<u8>),
}

impl std::ops::Deref for ReadBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBuf::Dma(r) => r,
            ReadBuf::Mem(v) => v,
        }
    }
}

/// A page-aligned heap buffer that can move to another thread (glommio's
/// `DmaBuffer` cannot): the data of a durable write done on the sync-write thread.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its allocation exclusively; nothing else points into it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `cap` bytes (rounded up to a page), `len` 0.
    pub fn new(cap: usize) -> AlignedBuf {
        let cap = align_up(cap.max(1) as u64) as usize;
        let layout = std::alloc::Layout::from_size_align(cap, PAGE).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len: 0, cap }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length (at most the capacity); bytes keep their contents.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap);
        self.len = len;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialised (zeroed at allocation) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.cap, PAGE).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}
