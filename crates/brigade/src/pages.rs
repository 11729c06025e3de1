//! Large buffers that a serving step reads end to end (packed weights), on the machine's huge
//! pages where it has them. A decode step reads every weight once: on 4 KiB pages that is a
//! TLB miss every 4 KiB and a stream the hardware prefetcher restarts every 4 KiB. A buffer of 2 MiB
//! or more is mapped on its own (`mmap`), aligned to 2 MiB and asked for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`, which the common `madvise` setting of Linux grants only to who
//! asks) before anything touches it; its pages are the kernel's zeros, faulted in by whoever
//! writes them first — as a `vec![0; n]` of that size would be (zeroing them here, in one
//! pass or in parallel, measured slower products afterwards: see docs/serving.md). Smaller
//! buffers, and every buffer off Unix, come from the global allocator; the mapped ones are not
//! in `alloc`'s per-rank counts (serving holds them, not training).

use std::alloc::Layout;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A huge page (x86-64 and aarch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;

/// Types whose every bit pattern of zeros is a valid zero value.
///
/// # Safety
/// An all-zero `Self` must be a valid value.
pub unsafe trait Zeroable: Copy {}
// SAFETY: zero bits are 0 in each of these types
unsafe impl Zeroable for f32 {}
unsafe impl Zeroable for i8 {}
unsafe impl Zeroable for u8 {}

/// `len` zeroed values of `T`, 2 MiB-aligned and on huge pages where the buffer spans one.
pub struct Pages<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    from: Source,
}

/// Where a buffer's memory came from, and how to give it back.
#[derive(Clone, Copy)]
enum Source {
    /// Nothing (`len == 0`).
    Nothing,
    /// The global allocator, with this layout.
    Heap(Layout),
    /// A mapping of its own, of this many bytes (from `ptr`).
    #[cfg_attr(not(unix), allow(dead_code))]
    Map(usize),
}

// SAFETY: `Pages` owns its values as a `Vec` would
unsafe impl<T: Zeroable + Send> Send for Pages<T> {}
unsafe impl<T: Zeroable + Sync> Sync for Pages<T> {}

impl<T: Zeroable> Pages<T> {
    /// `len` zeros. Buffers of 2 MiB or more are mapped on their own, 2 MiB-aligned, and asked
    /// for huge pages; smaller ones come from the global allocator.
    pub fn zeroed(len: usize) -> Pages<T> {
        let bytes = len.checked_mul(size_of::<T>()).expect("a buffer of fewer than 2^64 bytes");
        if bytes == 0 {
            return Pages { ptr: NonNull::dangling(), len, from: Source::Nothing };
        }
        #[cfg(unix)]
        if bytes >= HUGE {
            if let Some((ptr, mapped)) = map_huge(bytes) {
                return Pages { ptr: ptr.cast(), len, from: Source::Map(mapped) };
            }
        }
        let layout = Layout::from_size_align(bytes, align_of::<T>()).expect("a valid layout");
        // SAFETY: the layout's size is not zero
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<T>()) else { std::alloc::handle_alloc_error(layout) };
        Pages { ptr, len, from: Source::Heap(layout) }
    }

    /// Bytes of the buffer on huge pages, and whether the kernel holds all of it eligible for
    /// them (Linux: the `AnonHugePages` and `THPeligible` of its mappings in
    /// `/proc/self/smaps`); `None` where it cannot tell.
    pub fn huge_pages(&self) -> Option<(usize, bool)> {
        huge_pages_at(self.ptr.as_ptr() as usize, self.len * size_of::<T>())
    }
}

impl<T: Zeroable> Deref for Pages<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised values (dangling and 0 when empty)
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> DerefMut for Pages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, and `&mut self` is the only borrow
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> Drop for Pages<T> {
    fn drop(&mut self) {
        match self.from {
            Source::Nothing => {}
            // SAFETY: allocated with this layout in `zeroed`
            Source::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) },
            #[cfg(unix)]
            // SAFETY: mapped with this length in `map_huge`, and nothing borrows it now
            Source::Map(mapped) => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), mapped);
            },
            #[cfg(not(unix))]
            Source::Map(_) => unreachable!("no mapping off Unix"),
        }
    }
}

impl<T: Zeroable> Default for Pages<T> {
    fn default() -> Pages<T> {
        Pages::zeroed(0)
    }
}

/// A fresh anonymous mapping of at least `bytes` bytes starting on a 2 MiB boundary, asked for
/// huge pages (Linux), and the bytes mapped from that start; `None` if the kernel refuses.
#[cfg(unix)]
fn map_huge(bytes: usize) -> Option<(NonNull<u8>, usize)> {
    let page = 4096;
    let mapped = bytes.div_ceil(page) * page;
    // SAFETY: a new private anonymous mapping; nothing else refers to it
    unsafe {
        let raw = libc::mmap(
            std::ptr::null_mut(),
            mapped + HUGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if raw == libc::MAP_FAILED {
            return None;
        }
        // the 2 MiB-aligned start, and what lies before and after the buffer given back
        let at = (raw as usize).next_multiple_of(HUGE);
        let head = at - raw as usize;
        if head > 0 {
            libc::munmap(raw, head);
        }
        let tail = HUGE - head;
        if tail > 0 {
            libc::munmap((at + mapped) as *mut libc::c_void, tail);
        }
        #[cfg(target_os = "linux")]
        // a kernel without transparent huge pages answers EINVAL: 4 KiB pages, nothing to do
        libc::madvise(at as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE);
        Some((NonNull::new(at as *mut u8)?, mapped))
    }
}

/// Bytes of `[start, start + bytes)` on huge pages, summed over the mappings of
/// `/proc/self/smaps` that overlap it (a mapping's `AnonHugePages`, prorated by the overlap),
/// and whether every one of those mappings is `THPeligible`.
#[cfg(target_os = "linux")]
fn huge_pages_at(start: usize, bytes: usize) -> Option<(usize, bool)> {
    huge_pages_in(&std::fs::read_to_string("/proc/self/smaps").ok()?, start, bytes)
}

/// `huge_pages_at` over the text of an `smaps` file; `None` if a figure it needs does not parse.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn huge_pages_in(smaps: &str, start: usize, bytes: usize) -> Option<(usize, bool)> {
    let end = start + bytes;
    let (mut total, mut eligible, mut overlap) = (0usize, true, None::<(usize, usize)>);
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                let (lo, hi) = (a.max(start), b.min(end));
                overlap = (lo < hi).then(|| (hi - lo, b - a));
                continue;
            }
        }
        let Some((o, size)) = overlap else { continue };
        match first {
            "AnonHugePages:" => {
                let kib: usize = parts.next()?.parse().ok()?;
                total += ((kib << 10) as u128 * o as u128 / size as u128) as usize;
            }
            "THPeligible:" => eligible &= parts.next() == Some("1"),
            _ => {}
        }
    }
    Some((total, eligible))
}

#[cfg(not(target_os = "linux"))]
fn huge_pages_at(_: usize, _: usize) -> Option<(usize, bool)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_buffers_hold_zeros_and_keep_what_is_written() {
        for len in [0usize, 1, 7, 4096, (3 << 20) / 4 + 5] {
            let mut p = Pages::<f32>::zeroed(len);
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|&v| v == 0.0));
            for (i, v) in p.iter_mut().enumerate() {
                *v = i as f32;
            }
            assert!(p.iter().enumerate().all(|(i, &v)| v == i as f32));
            if len * 4 >= HUGE {
                assert_eq!(p.as_ptr() as usize % HUGE, 0, "a large buffer starts on a huge page");
            }
        }
    }

    /// Three mappings as `/proc/self/smaps` writes them (4 MiB with 4 MiB on huge pages,
    /// eligible; 4 MiB with 2 MiB, not eligible; then one that starts where a query ends): a
    /// query's huge pages are each overlapped mapping's prorated by the overlap, and it is
    /// eligible only if every overlapped mapping is; one that only touches it counts for nothing.
    #[test]
    fn huge_pages_are_read_off_the_mappings_a_range_overlaps() {
        let smaps = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      4096 kB
THPeligible:    1
7f0000400000-7f0000800000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      2048 kB
THPeligible:    0
7f0000800000-7f0000a00000 rw-p 00000000 00:00 0
Size:               2048 kB
AnonHugePages:      2048 kB
THPeligible:    0
";
        let mib = 1usize << 20;
        let base = 0x7f00_0000_0000usize;
        // the first mapping's second half alone
        assert_eq!(huge_pages_in(smaps, base + 2 * mib, 2 * mib), Some((2 * mib, true)));
        // its second half and the second mapping's first: 2 MiB + half of 2 MiB
        assert_eq!(huge_pages_in(smaps, base + 2 * mib, 4 * mib), Some((3 * mib, false)));
        // a quarter of the first: 1 MiB, whichever way round the proration goes
        assert_eq!(huge_pages_in(smaps, base + mib, mib), Some((mib, true)));
        // the whole of the second, ending where the third begins
        assert_eq!(huge_pages_in(smaps, base + 4 * mib, 4 * mib), Some((2 * mib, false)));
        // the first whole, ending where the second (not eligible) begins
        assert_eq!(huge_pages_in(smaps, base, 4 * mib), Some((4 * mib, true)));
        // nothing mapped there
        assert_eq!(huge_pages_in(smaps, base + 16 * mib, mib), Some((0, true)));
        // a figure that does not parse, in a mapping the range overlaps: no answer
        let bad = smaps.replace(
            "AnonHugePages:      2048 kB\nTHPeligible:    0\n7f0000800000",
            "AnonHugePages:      x kB\nTHPeligible:    0\n7f0000800000",
        );
        assert_eq!(huge_pages_in(&bad, base + 4 * mib, mib), None);
        assert_eq!(huge_pages_in(&bad, base, mib), Some((mib, true)), "the bad figure is in another mapping");
    }

    #[test]
    fn a_large_buffer_is_eligible_for_huge_pages_where_the_kernel_has_them() {
        // 8 MiB: whole huge pages, whatever the kernel does
        let mut p = Pages::<f32>::zeroed(2 << 20);
        p.fill(1.0); // faulted in
        let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        let offered = enabled.contains("[always]") || enabled.contains("[madvise]");
        match p.huge_pages() {
            Some((huge, eligible)) if offered => {
                // eligible: asked for (under `madvise` only `MADV_HUGEPAGE` makes it so); the
                // huge pages themselves depend on free memory, so a zero is only reported
                assert!(eligible, "an 8 MiB buffer not eligible for huge pages (THP: {})", enabled.trim());
                if huge == 0 {
                    eprintln!("no free huge page for an eligible 8 MiB buffer (fragmented memory?)");
                }
            }
            None if offered => panic!("huge pages offered ({}) but /proc/self/smaps not read", enabled.trim()),
            h => eprintln!("transparent huge pages not offered here ({}): {h:?}", enabled.trim()),
        }
    }

    /// The process's address space in bytes (`VmSize` of `/proc/self/status`).
    #[cfg(target_os = "linux")]
    fn vm_size() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() << 10
    }

    /// A mapped buffer takes exactly its own pages of address space — the 2 MiB over-allocation
    /// that finds an aligned start is given back before and after it — and `Drop` gives them
    /// all back. Run in a child process of its own (this test binary, this test alone, one
    /// thread): another test's mappings would move `VmSize` in between.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_buffer_takes_its_own_pages_and_gives_them_back() {
        const CHILD: &str = "BRIGADE_PAGES_VM_CHILD";
        let name = "pages::tests::a_mapped_buffer_takes_its_own_pages_and_gives_them_back";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "the child failed:\n{text}");
            assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
            return;
        }
        let page = 4096;
        // SAFETY: sysconf reads a constant of the system
        if unsafe { libc::sysconf(libc::_SC_PAGESIZE) } != page as libc::c_long {
            eprintln!("not run: this kernel's base pages are not 4 KiB, which `map_huge` is written for");
            return;
        }
        // the reading itself allocates: once first, so its heap is there before the measures
        let _ = vm_size();
        let mut kept = Vec::with_capacity(16);
        for (i, floats) in
            [(2usize << 20) / 4, (3 << 20) / 4 + 5, (5 << 20) / 4 + 1000, 1 << 22].into_iter().enumerate()
        {
            let before = vm_size();
            let p = Pages::<f32>::zeroed(floats);
            let mapped = (floats * 4).div_ceil(page) * page;
            assert_eq!(vm_size() - before, mapped, "buffer {i}: {floats} floats take {} bytes", vm_size() - before);
            assert_eq!(p.as_ptr() as usize % HUGE, 0);
            // an unaligned mapping left between them, so the next one's start moves
            let odd = Pages::<u8>::zeroed(HUGE + 3 * page + i * page);
            let with_odd = vm_size();
            drop(p);
            assert_eq!(with_odd - vm_size(), mapped, "buffer {i}: dropped, not all given back");
            kept.push(odd);
        }
    }
}
