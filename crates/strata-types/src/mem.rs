//! Buffers for bytes about to arrive.

#![allow(unsafe_code)] // madvise on memory the caller owns or borrows; see the SAFETY note

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
        madvise_inside(spare.as_mut_ptr() as usize, spare.len(), POPULATE_WRITE);
    }
    b
}

/// Like [`prefaulted`], as an empty `Vec` with room for `len` bytes.
pub fn prefaulted_vec(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    if len >= MIN_POPULATE {
        let spare = v.spare_capacity_mut();
        madvise_inside(spare.as_mut_ptr() as usize, spare.len(), POPULATE_WRITE);
    }
    v
}

/// Map the pages inside `mem` into this process in one call, for reading: memory another process wrote (a
/// shared mapping) otherwise faults once per 4 KiB as it is read. Best effort, like [`prefaulted`]; short
/// ranges are left alone.
pub fn populate_read(mem: &[u8]) {
    if mem.len() < MIN_POPULATE / 4 {
        return;
    }
    madvise_inside(mem.as_ptr() as usize, mem.len(), POPULATE_READ);
}

#[cfg(target_os = "linux")]
const POPULATE_READ: libc::c_int = libc::MADV_POPULATE_READ;
#[cfg(target_os = "linux")]
const POPULATE_WRITE: libc::c_int = libc::MADV_POPULATE_WRITE;
#[cfg(not(target_os = "linux"))]
const POPULATE_READ: i32 = 0;
#[cfg(not(target_os = "linux"))]
const POPULATE_WRITE: i32 = 0;

/// `madvise(advice)` on the whole pages inside `start..start + len` (none if it spans no whole page).
#[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
fn madvise_inside(start: usize, len: usize, advice: i32) {
    let page = 4096;
    let (lo, hi) = (start.next_multiple_of(page), (start + len) / page * page);
    if hi > lo {
        // SAFETY: `lo..hi` lies inside memory the caller owns or borrows; populating only maps its pages
        // (contents and ownership unchanged). The result is ignored: without the call the pages are faulted in
        // on first access, as usual.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::madvise(lo as *mut libc::c_void, hi - lo, advice);
        }
    }
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
            populate_read(&b);
            assert!(b.iter().all(|&x| x == 7), "populating changes nothing");
            let mut v = prefaulted_vec(len);
            assert!(v.is_empty() && v.capacity() >= len);
            v.extend_from_slice(&vec![7u8; len]);
            assert!(v.iter().all(|&x| x == 7));
        }
    }
}
