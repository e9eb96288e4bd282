//! The process allocator of `mimic` (and of this crate's examples): mimalloc, entered through
//! its plain `mi_malloc`/`mi_realloc`/`mi_zalloc` where the requested alignment is one every
//! mimalloc block has anyway.
//!
//! The `mimalloc` crate's `MiMalloc` passes every request to the `*_aligned` entry points. In
//! mimalloc v3 those take a slower path than `mi_malloc` for anything but small blocks on a
//! page with a free block at the right alignment (`mi_theap_malloc_zero_aligned_at_generic`),
//! and `mi_realloc_aligned` always does: on the analysis benchmark that was 3–4% of the
//! analysis thread's instructions (callgrind), most of it the growth of per-connection logs.
//! Rust's own `System` allocator makes the same choice (plain `malloc` when the alignment is
//! at most the platform's guaranteed one and not more than the size).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every `mi_malloc` block of at least this size has (`MI_MAX_ALIGN_SIZE`,
/// `sizeof(max_align_t)` on the 64-bit targets we build for). Smaller blocks are aligned to
/// their size rounded to a word, which a Rust layout never exceeds (its size is a multiple
/// of its alignment).
const MI_MAX_ALIGN_SIZE: usize = 16;

/// mimalloc as the global allocator (`#[global_allocator] static A: Allocator = Allocator;`).
pub struct Allocator;

#[inline]
fn plain(layout: &Layout) -> bool {
    layout.align() <= MI_MAX_ALIGN_SIZE && layout.align() <= layout.size()
}

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free` takes blocks of the
// plain and the aligned entry points alike); a plain entry point is used only where its
// alignment guarantee covers the layout's (`plain`), otherwise the aligned one.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            mi::mi_malloc(layout.size()) as *mut u8
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            mi::mi_zalloc(layout.size()) as *mut u8
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MI_MAX_ALIGN_SIZE && layout.align() <= new_size {
            mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment up to 4 KiB and sizes around it: aligned, writable, reallocated with
    /// the contents kept.
    #[test]
    fn blocks_are_aligned_and_keep_their_contents() {
        let a = Allocator;
        for shift in 0..=12 {
            let align = 1usize << shift;
            for size in [align, 2 * align, 3 * align, 40 * align] {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    for i in 0..size {
                        *p.add(i) = i as u8;
                    }
                    let q = a.realloc(p, layout, size * 3);
                    assert_eq!(q as usize % align, 0, "realloc: size {size} align {align}");
                    for i in 0..size {
                        assert_eq!(*q.add(i), i as u8);
                    }
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
