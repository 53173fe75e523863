//! Buffers for bytes about to arrive.

#![allow(unsafe_code)] // madvise on memory this module just allocated; see the SAFETY note

use bytes::BytesMut;

/// Below this, populating ahead costs more than the faults it saves.
const MIN_POPULATE: usize = 256 * 1024;

/// An empty buffer with room for `len` bytes whose pages are already mapped and writable.
///
/// Filling fresh memory costs a page fault per 4 KiB: on the VMs we measured, a cold gateway read spent about
/// a quarter of its CPU in faults while copying network chunks into cache blocks. One
/// `madvise(MADV_POPULATE_WRITE)` maps the whole range in a single call instead (the same pages, without a
/// trap for each). Memory the allocator recycles is already mapped and the call then costs little. Where the
/// kernel lacks the call (before Linux 5.14) it fails and the buffer is simply faulted in as it is filled.
pub fn prefaulted(len: usize) -> BytesMut {
    let mut b = BytesMut::with_capacity(len);
    if len >= MIN_POPULATE {
        let spare = b.spare_capacity_mut();
        let start = spare.as_mut_ptr() as usize;
        let page = 4096;
        let (lo, hi) = (
            start.next_multiple_of(page),
            (start + spare.len()) / page * page,
        );
        if hi > lo {
            // SAFETY: `lo..hi` lies inside the buffer's allocation, which this function owns; populating only
            // maps its pages (contents and ownership unchanged). The result is ignored: without the call the
            // pages are faulted in on first write, as usual.
            #[cfg(target_os = "linux")]
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_POPULATE_WRITE);
            }
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefaulted_buffer_is_an_ordinary_empty_buffer() {
        for len in [0, 10, MIN_POPULATE, 8 << 20] {
            let mut b = prefaulted(len);
            assert!(b.is_empty() && b.capacity() >= len);
            b.extend_from_slice(&vec![7u8; len]);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 7));
        }
    }
}
