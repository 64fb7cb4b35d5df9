//! The main thread's stack, made resident at start.
//!
//! QEMU's TCG emulation of x86-64 (7.2, Debian 12's, in system and user
//! mode alike) loses the arithmetic flags when an instruction that reads
//! them faults on its own memory operand: a `seto` whose store meets a
//! page not yet mapped is restarted, once the guest kernel mapped the
//! page, with flags recomputed from a state that pairs the flags already
//! computed with the operation that set them, and after a `neg` of
//! `i64::MIN` the overflow flag comes back clear. LLVM tells the variants
//! of a niche-tagged enum apart that way (`neg`, `seto` to the stack,
//! `cmovo`): in Debian 12 guests under TCG, about one one-shot run in a
//! hundred (4 of 392) read its `ManifestSource::Path` as the other variant
//! and died in `Path::parent`, on the path's length taken as its pointer,
//! when that `seto` was the first write to a page of the main thread's
//! stack (none of 392 with this module). A
//! native CPU, or one under KVM, has no such defect.
//!
//! So the binary writes the part of its main thread's stack that its work
//! uses once, at start ([`prefault_main`]): none of the instructions that
//! come later on that thread meets a page of it not yet mapped. The faults
//! move to start-up (a one-shot run takes most of them anyway, on the
//! run's path); the pages stay resident (the stack would keep them too).

use nix::sys::resource::{getrlimit, Resource};

/// Bytes of the main thread's stack made resident: more than the deepest a
/// one-shot run goes (64 KiB of a release build's stack are resident at
/// its exit, 156 KiB of a debug build's).
pub const MAIN_STACK_BYTES: usize = 256 << 10;

/// The stack is written in frames of this size.
const FRAME_BYTES: usize = 16 << 10;

/// Writes [`MAIN_STACK_BYTES`] of the calling thread's stack below the
/// caller's frame, at most half the soft `RLIMIT_STACK` (the main
/// thread's bound). Call it from `main`, before the work.
pub fn prefault_main() {
    let limit = getrlimit(Resource::RLIMIT_STACK).map_or(0, |(soft, _)| soft);
    let bound = usize::try_from(limit / 2).unwrap_or(usize::MAX);
    prefault(MAIN_STACK_BYTES.min(bound));
}

/// Writes at least `bytes` of the calling thread's stack below the
/// caller's frame, which must have that much room.
fn prefault(bytes: usize) {
    write_frames(bytes.div_ceil(FRAME_BYTES));
}

/// `frames` nested frames of [`FRAME_BYTES`], each written whole.
#[inline(never)]
fn write_frames(frames: usize) {
    if frames == 0 {
        return;
    }
    let mut frame = [0u8; FRAME_BYTES];
    std::hint::black_box(&mut frame);
    write_frames(frames - 1);
    // Read after the call, so the frame lives across it (the call is not
    // made a jump that reuses it).
    std::hint::black_box(&frame);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom};

    use super::*;

    /// Whether each page of `[start, end)` is present, from
    /// `/proc/self/pagemap` (bit 63 of each page's entry, readable
    /// without privileges).
    fn present(start: usize, end: usize) -> Vec<bool> {
        const PAGE: usize = 4096;
        let first = start / PAGE;
        let pages = end.div_ceil(PAGE) - first;
        let mut map = std::fs::File::open("/proc/self/pagemap").unwrap();
        map.seek(SeekFrom::Start(u64::try_from(first * 8).unwrap())).unwrap();
        let mut raw = vec![0u8; pages * 8];
        map.read_exact(&mut raw).unwrap();
        raw.chunks_exact(8).map(|e| u64::from_le_bytes(e.try_into().unwrap()) >> 63 == 1).collect()
    }

    /// On a fresh thread, whose stack below its first frames the thread
    /// never wrote, every page of the range below the caller is present
    /// after the call, and most of them were not before it (unless
    /// transparent huge pages back every anonymous mapping).
    #[test]
    fn the_stack_below_the_caller_is_mapped() {
        let seen = std::thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(|| {
                let here = 0u8;
                let top = std::ptr::from_ref(std::hint::black_box(&here)) as usize;
                // Clear of the frames of the calls and of the test itself.
                let (start, end) = (top - MAIN_STACK_BYTES + FRAME_BYTES, top - FRAME_BYTES);
                let before = present(start, end);
                prefault(MAIN_STACK_BYTES);
                (before, present(start, end))
            })
            .unwrap()
            .join()
            .unwrap();
        let (before, after) = seen;
        let missing = after.iter().filter(|p| !**p).count();
        assert_eq!(missing, 0, "{missing} of {} pages still absent", after.len());
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if !thp.is_ok_and(|t| t.contains("[always]")) {
            let already = before.iter().filter(|p| **p).count();
            assert!(already < before.len() / 2, "{already} of {} present before", before.len());
        }
    }
}
