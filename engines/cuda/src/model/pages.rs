//! Memory-mapped model files, given back page by page as loading copies them out: each
//! tensor's pages leave the process's resident memory once its values are held in the form
//! the device keeps, so loading never holds the whole file and the whole model at once.

use memmap2::{Mmap, UncheckedAdvice};

/// Drops the pages under `bytes` (a slice of `map`) from this process's memory; they read back
/// from the file if touched again. Best effort: where the kernel refuses, they stay.
pub(super) fn release(map: &Mmap, bytes: &[u8]) {
    let start = (bytes.as_ptr() as usize).wrapping_sub(map.as_ptr() as usize);
    if bytes.is_empty() || start >= map.len() || start + bytes.len() > map.len() {
        return;
    }
    // SAFETY: the map is a read-only mapping of a file the engine never writes; dropped pages
    // of such a mapping read back the same bytes from the file when touched again, so every
    // reference into the range stays valid.
    let _ = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, bytes.len()) };
}
