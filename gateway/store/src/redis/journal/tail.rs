//! The journal file's growing end, mapped into memory: a frame is copied into the page cache
//! with no system call, and outlives the process (a kill -9) as a `write` would. An append
//! under load so costs a copy instead of a `write` through the file system (measured on the
//! spend bench: about 4 µs per request, the largest single cost of usage records on Redis).
//!
//! Space is reserved a [`CHUNK`] at a time with `posix_fallocate`, so a full disk is an error
//! when a chunk is reserved (the settlement then goes to Redis directly), never a fault while
//! copying. One chunk is mapped at a time; a frame that crosses into the next chunk is copied in
//! two parts. Reserved space past the last frame reads as zeros, which never decode as a frame.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use memmap2::{MmapMut, MmapOptions};

/// Bytes reserved, and mapped, at a time.
pub(super) const CHUNK: u64 = 1 << 20;

/// The writable end of a journal file.
#[derive(Debug)]
pub(super) struct Tail {
    file: File,
    /// The file's length: what is reserved.
    reserved: u64,
    /// The mapped chunk: its offset in the file and the mapping.
    window: Option<(u64, MmapMut)>,
}

impl Tail {
    /// The end of `file` (opened for reading and writing), whose length is where its last
    /// frame ends.
    pub(super) fn new(file: File) -> io::Result<Self> {
        let reserved = file.metadata()?.len();
        Ok(Self {
            file,
            reserved,
            window: None,
        })
    }

    /// Copies `bytes` into the file at offset `at`, reserving space first. A failure may leave
    /// part of them in the file past the last whole frame, where the next frame overwrites
    /// them (and a reopen cuts them off, as a torn frame).
    pub(super) fn put(&mut self, at: u64, bytes: &[u8]) -> io::Result<()> {
        let end = at + bytes.len() as u64;
        if end > self.reserved {
            let to = end.div_ceil(CHUNK) * CHUNK;
            reserve(&self.file, self.reserved, to - self.reserved)?;
            self.reserved = to;
        }
        let mut done = 0;
        while done < bytes.len() {
            let pos = at + done as u64;
            let start = pos - pos % CHUNK;
            let map = self.window_at(start)?;
            let from = usize::try_from(pos - start).unwrap_or(usize::MAX);
            let n = (bytes.len() - done).min(map.len().saturating_sub(from));
            if n == 0 {
                return Err(io::Error::other("a journal chunk is shorter than reserved"));
            }
            map[from..from + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// The mapping of the chunk at `start`, mapped now if another one is.
    fn window_at(&mut self, start: u64) -> io::Result<&mut MmapMut> {
        if !matches!(&self.window, Some((s, _)) if *s == start) {
            self.window = None;
            // SAFETY: the file belongs to this process while it holds the journal's lock file
            // (see `Journal::open`): no other process writes or truncates it, and this process
            // only shortens it at open and replaces it at a restart, both before a chunk is
            // mapped (a restart makes a new `Tail`). The chunk lies within the reserved length,
            // so every byte of the mapping is backed by the file.
            let map = unsafe {
                MmapOptions::new()
                    .offset(start)
                    .len(CHUNK as usize)
                    .map_mut(&self.file)?
            };
            self.window = Some((start, map));
        }
        self.window
            .as_mut()
            .map(|(_, map)| map)
            .ok_or_else(|| io::Error::other("no journal chunk is mapped"))
    }
}

/// Allocates `len` bytes of `file` from `offset` (zeros), growing it.
fn reserve(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::other("a journal offset out of range"));
    };
    // SAFETY: a system call on a descriptor `file` keeps open; it touches no memory of ours.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_across_chunks_lands_whole_and_the_rest_reads_as_zeros() {
        let path = std::env::temp_dir().join(format!("tp-tail-{}", std::process::id()));
        std::fs::write(&path, b"head").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut tail = Tail::new(file).unwrap();
        let frame: Vec<u8> = (0..100u8).collect();
        let at = CHUNK - 40;
        tail.put(4, b"abc").unwrap();
        tail.put(at, &frame).unwrap();
        drop(tail);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, 2 * CHUNK);
        assert_eq!(&bytes[..7], b"headabc");
        assert_eq!(&bytes[at as usize..at as usize + 100], &frame[..]);
        assert!(bytes[7..at as usize].iter().all(|&b| b == 0));
        assert!(bytes[at as usize + 100..].iter().all(|&b| b == 0));
        let _ = std::fs::remove_file(&path);
    }
}
