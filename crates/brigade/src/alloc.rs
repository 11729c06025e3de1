//! Bytes allocated per rank, from the allocator itself: `RankAlloc` (installed as the global
//! allocator by the `brigade` binary) tags every allocation with the rank of the thread that
//! makes it, so that ranks running as threads of one process each get their own live and peak
//! byte counts — parameters, gradients, optimizer state, activations, communication buffers.
//! A rank thread says who it is with `set_rank`; `with_threads` passes it on to its pool.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Tag 0: threads of no rank; tag r + 1: rank r.
const TAGS: usize = 257;

/// One tag's live and peak bytes, on a cache line of its own: ranks (and workers) allocating at
/// once on neighbouring tags would otherwise pass one line back and forth on every allocation
/// (two `brigade tokenize` workers ran slower than one).
#[repr(align(128))]
struct Count {
    live: AtomicUsize,
    peak: AtomicUsize,
}

static COUNTS: [Count; TAGS] = [const { Count { live: AtomicUsize::new(0), peak: AtomicUsize::new(0) } }; TAGS];
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static TAG: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as rank `rank`'s (`None`: no rank); ranks beyond 255 are not told apart.
pub fn set_rank(rank: Option<usize>) {
    TAG.with(|t| t.set(rank.filter(|&r| r + 1 < TAGS).map_or(0, |r| r + 1)));
}

/// The rank the calling thread works for, as `set_rank` set it.
pub fn current_rank() -> Option<usize> {
    TAG.with(|t| t.get().checked_sub(1))
}

/// Starts measuring rank `rank`'s peak from what it holds now.
pub fn reset_peak(rank: usize) {
    let t = (rank + 1).min(TAGS - 1);
    COUNTS[t].peak.store(COUNTS[t].live.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The most bytes rank `rank`'s allocations held at once since `reset_peak`; `None` when
/// `RankAlloc` is not the process's allocator (as in the library's own tests).
pub fn peak_bytes(rank: usize) -> Option<usize> {
    INSTALLED.load(Ordering::Relaxed).then(|| COUNTS[(rank + 1).min(TAGS - 1)].peak.load(Ordering::Relaxed))
}

/// Bytes rank `rank`'s allocations hold now (`None` as for `peak_bytes`).
pub fn live_bytes(rank: usize) -> Option<usize> {
    INSTALLED.load(Ordering::Relaxed).then(|| COUNTS[(rank + 1).min(TAGS - 1)].live.load(Ordering::Relaxed))
}

/// The system allocator with a small header before each block holding the tag of the thread
/// that allocated it, so the block is counted against the same rank when another thread frees
/// it.
pub struct RankAlloc;

/// Header bytes before a block of alignment `align` (the tag sits in the last 8 of them).
fn header(align: usize) -> usize {
    align.max(16)
}

fn add(tag: usize, n: usize) {
    let c = &COUNTS[tag];
    let now = c.live.fetch_add(n, Ordering::Relaxed) + n;
    // a read first: the line is written only when the peak moves
    if now > c.peak.load(Ordering::Relaxed) {
        c.peak.fetch_max(now, Ordering::Relaxed);
    }
}

fn sub(tag: usize, n: usize) {
    COUNTS[tag].live.fetch_sub(n, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for RankAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_with(layout, |l| System.alloc(l))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.alloc_with(layout, |l| System.alloc_zeroed(l))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout.align());
        let tag = (ptr.sub(8) as *const usize).read();
        sub(tag, layout.size());
        System.dealloc(ptr.sub(h), Layout::from_size_align_unchecked(layout.size() + h, h));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let h = header(layout.align());
        let tag = (ptr.sub(8) as *const usize).read();
        let base = System.realloc(ptr.sub(h), Layout::from_size_align_unchecked(layout.size() + h, h), new_size + h);
        if base.is_null() {
            return base;
        }
        if new_size >= layout.size() {
            add(tag, new_size - layout.size());
        } else {
            sub(tag, layout.size() - new_size);
        }
        base.add(h)
    }
}

impl RankAlloc {
    unsafe fn alloc_with(&self, layout: Layout, sys: impl FnOnce(Layout) -> *mut u8) -> *mut u8 {
        // written once: a store on every allocation kept the line moving between threads
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        let h = header(layout.align());
        let Some(size) = layout.size().checked_add(h) else { return std::ptr::null_mut() };
        let Ok(l) = Layout::from_size_align(size, h) else { return std::ptr::null_mut() };
        let base = sys(l);
        if base.is_null() {
            return base;
        }
        // a thread being torn down has no tag left to read: count it as no rank's
        let tag = TAG.try_with(|t| t.get()).unwrap_or(0);
        (base.add(h - 8) as *mut usize).write(tag);
        add(tag, layout.size());
        base.add(h)
    }
}

/// Long-lived buffers from this size up (the optimizer's moments) are backed by 2 MiB pages
/// where the kernel allows it (transparent huge pages in `madvise` mode, the common default):
/// their first touch then takes one page fault per 2 MiB instead of per 4 KiB — on a virtual
/// machine where a fault costs microseconds, the first AdamW step of a 135M-parameter model
/// spent 5 s faulting in its moments. Only on request ([`zeroed_huge`]): advising every large
/// block made a pipeline stage's per-micro-batch buffers (logits of 51 MB, mapped afresh each
/// time) fault in huge pages on every micro-batch — pp=2 lost 12% of its speed.
const HUGE_FROM: usize = 8 << 20;

/// `n` zeros, on huge pages where the kernel gives them (for buffers that live the whole run).
pub fn zeroed_huge(n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    // SAFETY: advice about the pages of a block this function owns; nothing is read or written.
    unsafe { huge_pages(v.as_mut_ptr().cast(), n * 4) };
    v
}

/// Advises the kernel to back the whole 2 MiB pages inside `[base, base + size)` with huge pages.
unsafe fn huge_pages(base: *mut u8, size: usize) {
    #[cfg(target_os = "linux")]
    if size >= HUGE_FROM {
        const HUGE: usize = 2 << 20;
        let start = (base as usize).next_multiple_of(HUGE);
        let end = (base as usize + size) / HUGE * HUGE;
        if end > start {
            // advice only: a kernel without transparent huge pages refuses it, and nothing changes
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (base, size);
}
