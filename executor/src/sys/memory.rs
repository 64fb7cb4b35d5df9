//! The allocator's hold on freed memory.
//!
//! A run's stdout is gathered in memory up to its cap (16 MiB by default),
//! so a skill that floods its output makes the executor allocate buffers of
//! megabytes, and free them at the end of the run. glibc serves an
//! allocation this large with its own `mmap` and unmaps it when freed, but
//! only below its *dynamic* threshold, which each such free raises (up to
//! 32 MiB): after the first flood the next buffers come from the heap,
//! whose freed pages glibc keeps, and the executor's resident memory grows
//! with each flood by a few megabytes that stay (seen in a soak test). A
//! fixed threshold keeps every large buffer on its own
//! mapping, given back to the kernel when the run ends.

/// Allocations of this size or more get their own mapping, unmapped when
/// freed: output buffers; not the small allocations of a run.
pub const LARGE_ALLOCATION: usize = 256 << 10;

/// Serves every allocation of at least `bytes` with its own `mmap`, for
/// good (`mallopt(M_MMAP_THRESHOLD)`, which also stops glibc from raising
/// the threshold). Call it before the process starts threads. Returns
/// whether glibc took the setting.
pub fn map_large_allocations(bytes: usize) -> bool {
    let Ok(bytes) = libc::c_int::try_from(bytes) else { return false };
    // SAFETY: mallopt only sets a parameter of glibc's allocator, under its
    // own lock; no memory of ours is touched.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of the mapping of `/proc/self/maps` that holds `addr`.
    fn mapping_of(addr: usize) -> Option<usize> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().find_map(|l| {
            let (range, _) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
            (a <= addr && addr < b).then_some(a)
        })
    }

    /// Under the fixed threshold, a buffer as large as a flood's output
    /// lives on a mapping of its own (which starts right before it) while
    /// held, and the mapping goes with it, also after another one was
    /// freed (which would have raised glibc's dynamic threshold past it).
    /// Read from `/proc/self/maps`, so tests on other threads do not count.
    #[test]
    fn a_large_buffer_is_mapped_and_unmapped_each_time() {
        assert!(map_large_allocations(LARGE_ALLOCATION));
        for round in 0..3 {
            let buf = std::hint::black_box(vec![1u8; 4 << 20]);
            let addr = buf.as_ptr() as usize;
            let start = mapping_of(addr).expect("the buffer is mapped");
            // glibc's chunk header (16 bytes) starts the mapping.
            assert_eq!(addr - start, 16, "round {round}: not on a mapping of its own");
            drop(buf);
            assert_ne!(mapping_of(addr), Some(start), "round {round}: not unmapped");
        }
    }
}
