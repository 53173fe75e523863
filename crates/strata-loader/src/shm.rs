//! A shared-memory region that samples cross DataLoader workers in, instead of being pickled.
//!
//! PyTorch's DataLoader sends what a worker yields through a pipe: every sample's bytes are pickled, written,
//! read and unpickled, four copies after the worker's own, from memory no cache has seen. For large samples
//! that is most of the CPU of an epoch. A [`SharedRegion`] is a `MAP_SHARED` anonymous mapping created by the
//! process that opens the dataset, before the DataLoader forks, so every worker has it at the same address.
//! A worker (the slot's *producer*) reads a sample into a slot of it (the rank's share server writes there
//! with `process_vm_writev`, one copy from its cache); the sample's `Bytes` are owned by the slot; sending one
//! through a multiprocessing queue sends a [`Handle`], and the receiving process [`adopt`](SharedRegion::adopt)s
//! it as `Bytes` over the same memory.
//!
//! Slots are runs of [`GRANULE`]-byte granules. The region's header holds, as atomics any process may use: a
//! lock (held for a bitmap scan only: bounded spinning, and a lock whose holder died is taken over), the
//! allocation bitmap, and per slot its length, its producer's pid, a generation (bumped at every allocation, so
//! a handle names one allocation, never a later one in the same place), two reference counts and, for every
//! granule, the slot it belongs to (so a sub-slice of a sample finds its slot). References are counted in two
//! classes: the producer's (its own `Bytes`, and handles it sent that nobody adopted yet) and adopted ones
//! (held by processes that adopted a handle, and handles they sent on). The last reference frees the slot (or,
//! if the lock is busy, leaves it to the next sweep). Allocation is first-fit, so the memory touched stays
//! about the peak in use.
//!
//! Leaks, and how they end: a DataLoader worker exits only when its iterator is shut down (exhausted, abandoned
//! mid-epoch, or failed), and then the handles it sent that were not adopted never will be (its queue is
//! discarded), and reads it had in flight never land. So when an allocation finds no room, the sweep drops the
//! producer references of slots whose producer no longer exists (or is a zombie), and frees those nobody
//! adopted. That is why only DataLoader workers produce (the Python layer attaches the region to them alone):
//! a generic `multiprocessing` worker may exit while its results wait in a queue. A reference copied into a
//! forked child (a parent's `Bytes` inherited at fork) is never released by the child: each owner remembers
//! the pid that took it. A full region makes reads land in private memory, pickled as bytes: slower, never
//! wrong, never blocked. Memory safety never depends on the counts: the mapping lives as long as any `Bytes`
//! over it, and a slot freed early is reused, not unmapped.
//!
//! One room (about 1,000 lines, a third of them tests): the header layout, the lock, allocation, the two
//! reference classes and the sweep are one protocol between processes, each part correct only with the others.

#![allow(unsafe_code)] // a shared mapping and atomics placed in it; see the SAFETY notes

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use strata_types::{Error, ErrorKind, Result};

/// Allocation unit of a region: a slot is a run of granules.
pub const GRANULE: usize = 16 * 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"STRATASH");
const PAGE: usize = 4096;
/// How long a lock is waited for before giving up (allocation falls back to private memory).
const LOCK_WAIT: Duration = Duration::from_millis(20);
/// Header: magic u64 | token u64 | lock u32 (the holder's pid, 0: free) | unused u32 | granules u64 | bitmap
/// u64s | refs u64s | span, owner, producer, generation u32s.
const FIXED: usize = 32;
/// Per-granule header bytes after the bitmap.
const PER_GRANULE: usize = 8 + 4 * 4;
/// A reference count word: producer references in the low half, adopted ones in the high half.
const PRODUCER: u64 = 1;
const ADOPTED: u64 = 1 << 32;
const LOW: u64 = 0xffff_ffff;

/// Regions of this process (inherited by forked children, like the mappings themselves).
static REGIONS: Mutex<Vec<Weak<SharedRegion>>> = Mutex::new(Vec::new());

/// Which class of reference a holder or a handle has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// The producer's own, or sent by it and not adopted yet.
    Producer,
    /// Taken by adopting a handle (or sent on by such a holder).
    Adopted,
}

impl Class {
    fn unit(self) -> u64 {
        match self {
            Class::Producer => PRODUCER,
            Class::Adopted => ADOPTED,
        }
    }

    fn count(self, r: u64) -> u64 {
        match self {
            Class::Producer => r & LOW,
            Class::Adopted => r >> 32,
        }
    }
}

/// What a process sends instead of a sample's bytes: where they are in which region, and the slot whose
/// reference the message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    /// The region's random token.
    pub token: u64,
    /// Offset of the bytes from the start of the region's data.
    pub offset: u64,
    /// Length of the bytes.
    pub len: u64,
    /// First granule of the slot holding them.
    pub slot: u32,
    /// The slot's generation when the handle was made.
    pub generation: u32,
    /// The reference is an adopted one (sent on by a process that adopted it), not the producer's.
    pub adopted: bool,
}

/// A shared anonymous mapping with a slot allocator and reference counts in its header.
#[derive(Debug)]
pub struct SharedRegion {
    base: NonNull<u8>,
    map_len: usize,
    data_off: usize,
    granules: usize,
    words: usize,
    token: u64,
}

// SAFETY: the mapping is plain memory shared by design; all shared state in it is accessed through atomics,
// and slot contents are only written by the slot's holder before its bytes are published.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

fn pid() -> u32 {
    std::process::id()
}

/// Whether process `pid` is gone: no such process, or one that exited and was not reaped yet.
fn gone(pid: u32) -> bool {
    if pid == 0 || pid == self::pid() {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only asks whether the pid exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

impl SharedRegion {
    /// Map a region for `bytes` of samples (rounded down to granules, at least one). The memory is reserved,
    /// not touched: resident memory grows with what is in use at once.
    pub fn create(bytes: u64) -> Result<Arc<Self>> {
        let granules = usize::try_from(bytes / GRANULE as u64)
            .unwrap_or(usize::MAX)
            .clamp(1, u32::MAX as usize / 2);
        let words = granules.div_ceil(64);
        let header = FIXED + 8 * words + PER_GRANULE * granules;
        let data_off = header.div_ceil(PAGE) * PAGE;
        let map_len = granules
            .checked_mul(GRANULE)
            .and_then(|d| d.checked_add(data_off))
            .ok_or_else(|| Error::invalid_input(format!("shared memory of {bytes} bytes")))?;
        // SAFETY: a new anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "mapping {map_len} bytes of shared memory: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| Error::internal("mmap gave null"))?;
        let token = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(p as usize);
            h.write_u32(pid());
            h.finish() | 1
        };
        let r = Self {
            base,
            map_len,
            data_off,
            granules,
            words,
            token,
        };
        r.u64_at(0).store(MAGIC, Ordering::Relaxed);
        r.u64_at(8).store(token, Ordering::Relaxed);
        r.u64_at(24).store(granules as u64, Ordering::Relaxed);
        let r = Arc::new(r);
        let mut g = REGIONS.lock();
        g.retain(|w| w.strong_count() > 0);
        g.push(Arc::downgrade(&r));
        Ok(r)
    }

    /// The region's token, which handles name it by.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Bytes the region can hold.
    pub fn capacity(&self) -> u64 {
        (self.granules * GRANULE) as u64
    }

    /// Bytes in allocated slots now (granules rounded up), as far as the bitmap says.
    pub fn in_use(&self) -> u64 {
        let set: u64 = (0..self.words)
            .map(|w| u64::from(self.word(w).load(Ordering::Relaxed).count_ones()))
            .sum();
        set * GRANULE as u64
    }

    /// The allocated slots now, as the header says (for a person asking what holds the region).
    pub fn held(&self) -> Vec<Held> {
        self.slots()
            .map(|(g, n)| {
                let r = self.refs(g).load(Ordering::Acquire);
                let producer = self.producer(g).load(Ordering::Relaxed);
                Held {
                    bytes: (n * GRANULE) as u64,
                    producer,
                    producer_gone: gone(producer),
                    producer_refs: (r & LOW) as u32,
                    adopted_refs: (r >> 32) as u32,
                }
            })
            .collect()
    }

    /// The allocated slots, `(first granule, granules)`, as the bitmap says when each is reached.
    fn slots(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut g = 0;
        std::iter::from_fn(move || {
            while g < self.granules && !self.bit(g) {
                g += 1;
            }
            (g < self.granules).then(|| {
                let slot = (g, self.span_of(g));
                g += slot.1;
                slot
            })
        })
    }

    /// Free what is left of processes that are gone (see the module notes); false if the lock was busy.
    /// Allocation does this by itself when it finds no room.
    pub fn reclaim(&self) -> bool {
        match self.lock() {
            Some(_guard) => {
                self.sweep();
                true
            }
            None => false,
        }
    }

    // -- header access ----------------------------------------------------------------------------------

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.data_off);
        // SAFETY: `off` is inside the header, 8-aligned (the mapping is page-aligned), and the memory lives as
        // long as `self`; it is only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.data_off);
        // SAFETY: as in `u64_at`, 4-aligned.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    fn lock_word(&self) -> &AtomicU32 {
        self.u32_at(16)
    }

    fn word(&self, w: usize) -> &AtomicU64 {
        self.u64_at(FIXED + 8 * w)
    }

    fn refs(&self, g: usize) -> &AtomicU64 {
        self.u64_at(FIXED + 8 * self.words + 8 * g)
    }

    /// The `i`th u32 array after the reference counts.
    fn u32_array(&self, i: usize, g: usize) -> &AtomicU32 {
        self.u32_at(FIXED + 8 * self.words + 8 * self.granules + 4 * (i * self.granules + g))
    }

    fn span(&self, g: usize) -> &AtomicU32 {
        self.u32_array(0, g)
    }

    fn owner(&self, g: usize) -> &AtomicU32 {
        self.u32_array(1, g)
    }

    fn producer(&self, g: usize) -> &AtomicU32 {
        self.u32_array(2, g)
    }

    fn generation(&self, g: usize) -> &AtomicU32 {
        self.u32_array(3, g)
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: `data_off` is inside the mapping.
        unsafe { self.base.as_ptr().add(self.data_off) }
    }

    fn bit(&self, g: usize) -> bool {
        self.word(g / 64).load(Ordering::Relaxed) & (1 << (g % 64)) != 0
    }

    fn set_bits(&self, first: usize, n: usize, on: bool) {
        for g in first..first + n {
            let m = 1u64 << (g % 64);
            if on {
                self.word(g / 64).fetch_or(m, Ordering::Relaxed);
            } else {
                self.word(g / 64).fetch_and(!m, Ordering::Relaxed);
            }
        }
    }

    fn span_of(&self, first: usize) -> usize {
        (self.span(first).load(Ordering::Relaxed) as usize).clamp(1, self.granules - first)
    }

    // -- the lock ---------------------------------------------------------------------------------------

    /// Take the region's lock, or give up after [`LOCK_WAIT`]. A lock held that long by a process that no
    /// longer exists is taken over.
    fn lock(&self) -> Option<LockGuard<'_>> {
        // The lock word is the holder's pid, set and cleared in one atomic step: a process killed at any
        // instruction leaves the lock either free or naming it (and then taken over once it is gone).
        let me = pid();
        let deadline = Instant::now() + LOCK_WAIT;
        let mut spins = 0u32;
        loop {
            if self
                .lock_word()
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(LockGuard(self));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            if Instant::now() < deadline {
                std::thread::yield_now();
                continue;
            }
            let holder = self.lock_word().load(Ordering::Relaxed);
            if holder != 0 && gone(holder) {
                tracing::warn!(
                    pid = holder,
                    "shared sample memory: taking over the lock of a process that died"
                );
                // Only from that holder: another process may have taken it over first.
                let _ = self.lock_word().compare_exchange(
                    holder,
                    0,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                spins = 0;
                continue;
            }
            return None;
        }
    }

    // -- slots ------------------------------------------------------------------------------------------

    /// A slot of at least `len` bytes produced by this process (one producer reference, the caller's), or
    /// `None` when the region has no room (or is busy): the caller uses private memory instead.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Option<SlotMut> {
        let n = len.div_ceil(GRANULE);
        if n == 0 || n > self.granules {
            return None;
        }
        let _guard = self.lock()?;
        let first = match self.find_free(n) {
            Some(f) => f,
            None => {
                self.sweep();
                self.find_free(n)?
            }
        };
        self.set_bits(first, n, true);
        self.span(first).store(n as u32, Ordering::Relaxed);
        for g in first..first + n {
            self.owner(g).store(first as u32, Ordering::Relaxed);
        }
        self.producer(first).store(pid(), Ordering::Relaxed);
        self.generation(first).fetch_add(1, Ordering::Relaxed);
        self.refs(first).store(PRODUCER, Ordering::Release);
        Some(SlotMut {
            region: self.clone(),
            first: first as u32,
            cap: n * GRANULE,
            pid: pid(),
        })
    }

    /// First run of `n` free granules. Under the lock.
    fn find_free(&self, n: usize) -> Option<usize> {
        let (mut g, mut start, mut run) = (0, 0, 0);
        while g < self.granules {
            if g % 64 == 0 && g + 64 <= self.granules {
                let w = self.word(g / 64).load(Ordering::Relaxed);
                if w == u64::MAX {
                    g += 64;
                    run = 0;
                    start = g;
                    continue;
                }
                if w == 0 && run + 64 < n {
                    run += 64;
                    g += 64;
                    continue;
                }
            }
            if self.bit(g) {
                run = 0;
                start = g + 1;
            } else {
                run += 1;
                if run == n {
                    return Some(start);
                }
            }
            g += 1;
        }
        None
    }

    /// Free the slots nobody holds: released while the lock was busy, or held only by producer references of
    /// a producer that is gone. Under the lock.
    fn sweep(&self) {
        let mut dead: Vec<(u32, bool)> = Vec::new();
        for (g, n) in self.slots() {
            let refs = self.refs(g);
            let mut r = refs.load(Ordering::Acquire);
            if r & LOW != 0 {
                let p = self.producer(g).load(Ordering::Relaxed);
                let is_gone = match dead.iter().find(|(q, _)| *q == p) {
                    Some(&(_, d)) => d,
                    None => {
                        let d = gone(p);
                        dead.push((p, d));
                        d
                    }
                };
                if is_gone {
                    // Its handles that nobody adopted never will be; its own references died with it.
                    while r & LOW != 0 {
                        match refs.compare_exchange(
                            r,
                            r & !LOW,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        ) {
                            Ok(_) => r &= !LOW,
                            Err(x) => r = x,
                        }
                    }
                }
            }
            if r == 0 {
                self.set_bits(g, n, false);
            }
        }
    }

    /// Drop one reference of `class` to the slot at `first`; the last one frees it.
    fn release(&self, first: usize, class: Class) {
        let refs = self.refs(first);
        let unit = class.unit();
        loop {
            let r = refs.load(Ordering::Acquire);
            if class.count(r) == 0 {
                // Already dropped for it (a producer that was taken for gone), or a corrupt handle.
                return;
            }
            let left = r - unit;
            if left == 0 {
                // The only holder: nobody else can change the count now.
                match self.lock() {
                    Some(_guard) => {
                        refs.store(0, Ordering::Release);
                        self.set_bits(first, self.span_of(first), false);
                    }
                    None => refs.store(0, Ordering::Release),
                }
                return;
            }
            if refs
                .compare_exchange(r, left, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Whether `offset..offset + len` of the data lies in the live slot starting at `first`.
    fn check(&self, first: usize, offset: usize, len: usize) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if len == 0 || end > self.granules * GRANULE || first >= self.granules {
            return false;
        }
        let (g0, g1) = (offset / GRANULE, (end - 1) / GRANULE);
        let n = self.span(first).load(Ordering::Relaxed) as usize;
        first <= g0
            && g1 < first + n
            && self.bit(first)
            && self.owner(g0).load(Ordering::Relaxed) as usize == first
            && self.owner(g1).load(Ordering::Relaxed) as usize == first
            && self.refs(first).load(Ordering::Acquire) != 0
    }

    /// Offset of `data` in this region's data area, if it lies there.
    fn offset_of(&self, data: &[u8]) -> Option<usize> {
        let (p, start) = (data.as_ptr() as usize, self.data() as usize);
        (p >= start && p + data.len() <= start + self.granules * GRANULE).then(|| p - start)
    }

    /// Whether `data` lies in one of this process's regions (the bytes of a sample read into a slot).
    pub fn holds(data: &[u8]) -> bool {
        !data.is_empty()
            && REGIONS
                .lock()
                .iter()
                .filter_map(Weak::upgrade)
                .any(|r| r.offset_of(data).is_some())
    }

    /// A handle for `data` if it lies in a slot of one of this process's regions, taking a reference for it
    /// (the receiver's [`adopt`](Self::adopt) takes it over). `None`: not shared memory; send the bytes.
    pub fn share(data: &[u8]) -> Option<Handle> {
        if data.is_empty() {
            return None;
        }
        let regions: Vec<Arc<Self>> = REGIONS.lock().iter().filter_map(Weak::upgrade).collect();
        for r in regions {
            let Some(offset) = r.offset_of(data) else {
                continue;
            };
            let first = r.owner(offset / GRANULE).load(Ordering::Relaxed) as usize;
            // `data` is held (by a slot owner), so its slot is live.
            if !r.check(first, offset, data.len()) {
                return None;
            }
            let class = if r.producer(first).load(Ordering::Relaxed) == pid() {
                Class::Producer
            } else {
                Class::Adopted
            };
            r.refs(first).fetch_add(class.unit(), Ordering::AcqRel);
            return Some(Handle {
                token: r.token,
                offset: offset as u64,
                len: data.len() as u64,
                slot: first as u32,
                generation: r.generation(first).load(Ordering::Relaxed),
                adopted: class == Class::Adopted,
            });
        }
        None
    }

    /// The bytes a handle names, taking over the reference it carries. Fails when the region is not mapped in
    /// this process (a process not forked from the one that opened the dataset) or the handle does not name
    /// live bytes of it.
    pub fn adopt(h: Handle) -> Result<Bytes> {
        let region = REGIONS
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| r.token == h.token)
            .ok_or_else(|| {
                Error::invalid_input(
                    "a shared sample's memory is not mapped in this process (only processes forked from \
                     the one that opened the dataset share it; send bytes(sample) to others)",
                )
            })?;
        let stale = || {
            Error::invalid_input(format!(
                "shared sample handle {h:?} does not name live bytes"
            ))
        };
        let (Ok(offset), Ok(len)) = (usize::try_from(h.offset), usize::try_from(h.len)) else {
            return Err(stale());
        };
        let first = h.slot as usize;
        if !region.check(first, offset, len)
            || region.generation(first).load(Ordering::Relaxed) != h.generation
        {
            return Err(stale());
        }
        // Take the message's reference over, as an adopted one.
        if !h.adopted {
            let refs = region.refs(first);
            let mut r = refs.load(Ordering::Acquire);
            loop {
                if r & LOW == 0 {
                    return Err(stale());
                }
                match refs.compare_exchange(
                    r,
                    r - PRODUCER + ADOPTED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(x) => r = x,
                }
            }
        }
        // SAFETY: `offset..offset + len` is inside the data area (checked), which lives as long as the
        // `region` Arc the owner holds.
        let ptr = unsafe { region.data().add(offset) };
        let owner = SlotRef {
            region,
            first: h.slot,
            class: Class::Adopted,
            pid: pid(),
            ptr,
            len,
        };
        // Another process wrote these pages: map them in one call rather than a fault per 4 KiB on reading.
        strata_types::mem::populate_read(owner.as_ref());
        Ok(Bytes::from_owner(owner))
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `create` with this length, and nothing refers to it any more:
        // every slot owner holds an Arc of the region.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

struct LockGuard<'a>(&'a SharedRegion);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.0.lock_word().store(0, Ordering::Release);
    }
}

/// One allocated slot of a region: who made it and who holds it ([`SharedRegion::held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Bytes of the slot (whole granules).
    pub bytes: u64,
    /// The pid of the process that allocated it.
    pub producer: u32,
    /// Whether that process is gone (exited, or a zombie); its references are then dropped by the next sweep.
    pub producer_gone: bool,
    /// References of the producer's class (its own, and handles it sent that were not adopted yet).
    pub producer_refs: u32,
    /// References held by processes that adopted a handle (and handles they sent on).
    pub adopted_refs: u32,
}

/// A slot being filled: the producer's reference and its memory. Dropped, it is freed; frozen, it becomes
/// `Bytes`.
#[derive(Debug)]
pub struct SlotMut {
    region: Arc<SharedRegion>,
    first: u32,
    cap: usize,
    /// The process the reference belongs to (a copy inherited by a forked child releases nothing).
    pid: u32,
}

impl SlotMut {
    /// Bytes the slot can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Where the slot's memory starts (for a writer in another process).
    pub fn address(&self) -> u64 {
        self.ptr() as usize as u64
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: the slot's granules are inside the data area.
        unsafe { self.region.data().add(self.first as usize * GRANULE) }
    }

    /// The slot's memory, to fill in this process.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the slot is allocated to this holder alone until it is frozen (no other process writes or
        // reads it: its handles do not exist yet), and shared anonymous memory is always initialized.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.cap) }
    }

    /// The first `len` bytes (written) as `Bytes` owned by the slot.
    pub fn freeze(self, len: usize) -> Bytes {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: moving the Arc out of a ManuallyDrop that is never used again.
        let region = unsafe { std::ptr::read(&me.region) };
        let ptr = me.ptr();
        Bytes::from_owner(SlotRef {
            region,
            first: me.first,
            class: Class::Producer,
            pid: me.pid,
            ptr,
            len: len.min(me.cap),
        })
    }

    /// Give up the slot without releasing it: another process may still be writing into it (a read cancelled
    /// before its reply). The reference is dropped by a sweep once this process is gone.
    pub fn leak(self) {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in `freeze`; the Arc is dropped, the reference count is not.
        drop(unsafe { std::ptr::read(&me.region) });
    }
}

impl Drop for SlotMut {
    fn drop(&mut self) {
        if self.pid == pid() {
            self.region.release(self.first as usize, Class::Producer);
        }
    }
}

/// The owner behind `Bytes` in a slot: one reference, given back on drop by the process that took it.
struct SlotRef {
    region: Arc<SharedRegion>,
    first: u32,
    class: Class,
    pid: u32,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the pointer is into the region, which the Arc keeps mapped; the bytes are immutable once published.
unsafe impl Send for SlotRef {}

impl AsRef<[u8]> for SlotRef {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is inside the region's data (checked when made) and is not written while a
        // reference is held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        // A copy inherited by a forked child (a parent's object collected there) is the parent's reference.
        if self.pid == pid() {
            self.region.release(self.first as usize, self.class);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_shared_adopted_and_freed_by_the_last_reference() {
        let r = SharedRegion::create(64 * GRANULE as u64).unwrap();
        assert_eq!(r.in_use(), 0);
        let mut s = r.alloc(3 * GRANULE - 5).unwrap();
        assert_eq!(s.capacity(), 3 * GRANULE);
        let pattern: Vec<u8> = (0..3 * GRANULE - 5).map(|i| (i % 253) as u8).collect();
        s.as_mut_slice()[..pattern.len()].copy_from_slice(&pattern);
        let b = s.freeze(pattern.len());
        assert_eq!(b.as_ref(), &pattern[..]);
        assert_eq!(r.in_use(), 3 * GRANULE as u64);
        // A sub-slice finds its slot; the handle carries a reference of its own.
        let part = b.slice(GRANULE + 7..2 * GRANULE + 100);
        let h = SharedRegion::share(&part).unwrap();
        assert_eq!(h.token, r.token());
        assert!(!h.adopted, "made by the producer");
        drop(b);
        drop(part);
        assert_eq!(r.in_use(), 3 * GRANULE as u64, "the handle keeps the slot");
        assert_eq!(
            r.held(),
            vec![Held {
                bytes: 3 * GRANULE as u64,
                producer: std::process::id(),
                producer_gone: false,
                producer_refs: 1,
                adopted_refs: 0,
            }]
        );
        let adopted = SharedRegion::adopt(h).unwrap();
        assert_eq!(adopted.as_ref(), &pattern[GRANULE + 7..2 * GRANULE + 100]);
        assert_eq!(
            (r.held()[0].producer_refs, r.held()[0].adopted_refs),
            (0, 1)
        );
        drop(adopted);
        assert_eq!(r.in_use(), 0, "the last reference freed it");
        assert!(r.held().is_empty());
        // Adopting again (a handle used twice) is refused: the slot is no longer live.
        assert!(SharedRegion::adopt(h).is_err());
        // The same place allocated again is another generation: the old handle does not name it.
        let again = r.alloc(10).unwrap().freeze(10);
        assert!(
            SharedRegion::adopt(Handle {
                len: 10,
                offset: 0,
                ..h
            })
            .is_err()
        );
        drop(again);
        // Foreign or malformed handles are refused.
        let s = r.alloc(10).unwrap();
        let b = s.freeze(10);
        let h = SharedRegion::share(&b).unwrap();
        for bad in [
            Handle {
                token: r.token() ^ 2,
                ..h
            },
            Handle { len: 0, ..h },
            Handle {
                offset: u64::MAX - 2,
                ..h
            },
            Handle {
                len: 2 * GRANULE as u64,
                ..h
            },
            Handle {
                slot: h.slot + 1,
                ..h
            },
            Handle {
                slot: u32::MAX,
                ..h
            },
            Handle {
                generation: h.generation + 1,
                ..h
            },
        ] {
            assert!(SharedRegion::adopt(bad).is_err(), "{bad:?}");
        }
        // An adopted holder sends on adopted references.
        let a = SharedRegion::adopt(h).unwrap();
        drop(b);
        let h2 = SharedRegion::share(&a).unwrap();
        drop(a);
        let a2 = SharedRegion::adopt(h2).unwrap();
        assert_eq!(a2.len(), 10);
        drop(a2);
        assert_eq!(r.in_use(), 0);
        // Memory that is not in a region is not shared.
        assert!(SharedRegion::share(b"plain").is_none());
    }

    #[test]
    fn a_full_region_refuses_and_first_fit_reuses_freed_runs() {
        let r = SharedRegion::create(8 * GRANULE as u64).unwrap();
        let a = r.alloc(4 * GRANULE).unwrap();
        let b = r.alloc(4 * GRANULE).unwrap();
        assert!(r.alloc(1).is_none(), "full");
        let a_addr = a.address();
        drop(a);
        let c = r.alloc(2 * GRANULE).unwrap();
        assert_eq!(c.address(), a_addr, "first fit");
        let d = r.alloc(2 * GRANULE).unwrap();
        assert!(r.alloc(1).is_none());
        assert!(r.alloc(9 * GRANULE).is_none(), "larger than the region");
        drop((b, c, d));
        assert_eq!(r.in_use(), 0);
        // A leaked slot stays allocated while its producer (this process) lives.
        r.alloc(GRANULE).unwrap().leak();
        assert!(r.reclaim());
        assert_eq!(r.in_use(), GRANULE as u64);
    }

    #[test]
    fn a_release_while_the_lock_is_busy_is_swept_later() {
        let r = SharedRegion::create(4 * GRANULE as u64).unwrap();
        let b = r.alloc(4 * GRANULE).unwrap().freeze(4 * GRANULE);
        {
            let _held = r.lock().unwrap();
            // Released while another holder has the lock: counted down, left allocated.
            let t = std::thread::spawn(move || drop(b));
            t.join().unwrap();
        }
        assert_eq!(r.in_use(), 4 * GRANULE as u64);
        // The next allocation that finds no room sweeps it.
        assert!(r.alloc(4 * GRANULE).is_some());
    }

    #[test]
    fn the_lock_of_a_dead_process_is_taken_over() {
        let r = SharedRegion::create(4 * GRANULE as u64).unwrap();
        // A process that exited holding the lock.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        r.lock_word().store(pid, Ordering::Relaxed);
        assert!(r.alloc(GRANULE).is_some());
        // A live holder is waited for, then given up on.
        r.lock_word().store(std::process::id(), Ordering::Relaxed);
        assert!(r.alloc(GRANULE).is_none());
    }

    /// Run `f` in a forked child (which must not allocate through locks another test thread may hold) and
    /// wait for it; its exit status.
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child runs `f` and leaves with _exit (no destructors of the parent's state).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = f();
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(code) };
        }
        // What `f` holds stays the parent's, unreleased (the child had its own copy).
        std::mem::forget(f);
        let mut status = 0;
        // SAFETY: waiting for (and reaping) our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_gone_producers_unadopted_slots_are_reclaimed_and_adopted_ones_kept() {
        let r = SharedRegion::create(16 * GRANULE as u64).unwrap();
        let report = r.data() as usize + 15 * GRANULE;
        // The child produces three slots: one it sends (a handle, adopted below), one it sends that nobody
        // adopts, and one whose read it abandoned. Then it dies holding its own references.
        let code = in_child(|| {
            let mut out = [0u64; 6];
            for (i, n) in [GRANULE + 1, 100, 200].into_iter().enumerate() {
                let Some(mut s) = r.alloc(n) else { return 1 };
                s.as_mut_slice()[..n].fill(0xA0 + i as u8);
                let first = s.first as usize;
                if i < 2 {
                    // share(), without its registry lookup: one more producer reference for the message.
                    r.refs(first).fetch_add(PRODUCER, Ordering::AcqRel);
                }
                out[2 * i] = (first * GRANULE) as u64;
                out[2 * i + 1] = u64::from(r.generation(first).load(Ordering::Relaxed));
                std::mem::forget(s);
            }
            // SAFETY: the last granule is not allocated in this test; 8-aligned.
            unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), report as *mut u64, 6) };
            0
        });
        assert_eq!(code, 0);
        // SAFETY: written by the child above.
        let out: [u64; 6] = unsafe { std::ptr::read(report as *const [u64; 6]) };
        let handle = |i: usize, len: u64| Handle {
            token: r.token(),
            offset: out[2 * i],
            len,
            slot: (out[2 * i] / GRANULE as u64) as u32,
            generation: out[2 * i + 1] as u32,
            adopted: false,
        };
        let b = SharedRegion::adopt(handle(0, GRANULE as u64 + 1)).unwrap();
        assert!(b.iter().all(|&x| x == 0xA0));
        assert_eq!(r.in_use(), 4 * GRANULE as u64);
        // The producer is gone: what only it held is freed, what was adopted stays.
        assert!(r.reclaim());
        assert_eq!(r.in_use(), 2 * GRANULE as u64);
        assert!(b.iter().all(|&x| x == 0xA0), "untouched");
        assert!(
            SharedRegion::adopt(handle(1, 100)).is_err(),
            "reclaimed: its handle no longer names it"
        );
        drop(b);
        assert_eq!(r.in_use(), 0, "the adopted reference was the last");
    }

    #[test]
    fn a_reference_inherited_by_a_forked_child_is_not_released_there() {
        let r = SharedRegion::create(4 * GRANULE as u64).unwrap();
        let b = r.alloc(100).unwrap().freeze(100);
        let first = SharedRegion::share(&b).unwrap().slot as usize;
        r.release(first, Class::Producer); // the handle above, never sent
        let code = in_child(move || {
            drop(b); // the parent's reference, copied by fork: the child must not release it
            0
        });
        assert_eq!(code, 0);
        assert_eq!(r.refs(first).load(Ordering::Acquire), PRODUCER);
        assert_eq!(r.in_use(), GRANULE as u64);
    }
}
