//! The usage journal: a local file each request's end (its [`Settlement`]: usage record,
//! unused tokens, unused spend) is appended to before its response completes, copied into the
//! file's end mapped in memory ([`tail`]); a shipper ([`super::ship`]) sends the settlements on
//! to Redis in order, many per script call, off the requests' path. A response so waits for a
//! copy into the page cache instead of a Redis round trip, and a replica killed with
//! settlements not yet shipped ships them when it starts again on the same file.
//!
//! Exactly once: every frame has a sequence number, and the script that applies a batch also
//! raises the journal's mark in Redis (`tp:{usage}:j:<id>`) in the same atomic step, skipping
//! any frame at or below it. A batch sent twice (an answer lost on the way) or a replay after a
//! restart therefore counts each record, and gives back each refund, once.
//!
//! The file: a header (magic, the journal's random id, the sequence number before its first
//! frame), then frames ([`frame`]). A frame cut short by a crash fails its length or checksum
//! and is cut off at open (as is anything else past the last whole frame; space reserved
//! ahead reads as zeros). Once everything is shipped the shipper starts the file again from a
//! new header carrying the last sequence number, so numbers never repeat. The file has a size
//! cap; a settlement that would pass it goes to Redis directly, as without a journal (counted).

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use crate::{Settlement, StoreError};

mod frame;
pub(crate) mod merge;
mod tail;

use frame::{FRAME_HEAD, decode, encode, read4, read8, seal};
use tail::Tail;

const MAGIC: &[u8; 4] = b"TPJ1";
/// Magic, 32 hex digits of id, the base sequence number.
pub(crate) const HEADER: u64 = 4 + 32 + 8;

/// A journal file, shared by the requests appending to it and the shipper.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    id: String,
    max_bytes: u64,
    writer: Mutex<Writer>,
    /// The highest sequence number Redis has.
    pub(crate) shipped: AtomicU64,
    /// Woken on every append.
    pub(crate) wake: tokio::sync::Notify,
    /// `turnpike_usage_journal_bytes`.
    bytes: metrics::Gauge,
    /// `<file>.lock`, locked while this process holds the journal: two processes appending to
    /// one file would interleave their frames.
    _lock: File,
}

#[derive(Debug)]
struct Writer {
    tail: Tail,
    /// Where the last whole frame ends.
    len: u64,
    last: u64,
}

/// One frame read back: its sequence number and settlement.
pub(crate) type Frame = (u64, Settlement);

impl Journal {
    /// Opens the journal at `path`, or starts one; cuts off a frame a crash left incomplete.
    pub(crate) fn open(path: &Path, max_bytes: u64) -> Result<Self, StoreError> {
        let fail = |e: std::io::Error| StoreError(format!("usage journal {}: {e}", path.display()));
        let lock = File::create(path.with_extension("lock")).map_err(fail)?;
        if let Err(e) = lock.try_lock() {
            return Err(StoreError(format!(
                "usage journal {}: in use by another process ({e}); give each replica its own file",
                path.display()
            )));
        }
        let (id, last, len) = if path.exists() {
            let bytes = std::fs::read(path).map_err(fail)?;
            let (id, base) = header(&bytes).ok_or_else(|| {
                StoreError(format!(
                    "usage journal {}: not a usage journal (wrong header)",
                    path.display()
                ))
            })?;
            let (mut at, mut last) = (HEADER as usize, base);
            while let Some((seq, _, end)) = decode(&bytes, at) {
                (at, last) = (end, seq);
            }
            if at < bytes.len() {
                // Zeros are space reserved ahead; anything else is a frame a crash cut short.
                if bytes[at..].iter().any(|&b| b != 0) {
                    tracing::warn!(
                        journal = %path.display(),
                        cut = bytes.len() - at,
                        "the usage journal ended in an incomplete record (a crash while writing); it is cut off"
                    );
                }
                let file = OpenOptions::new().write(true).open(path).map_err(fail)?;
                file.set_len(at as u64).map_err(fail)?;
            }
            (id, last, at as u64)
        } else {
            let id = new_id();
            start_file(path, &id, 0).map_err(fail)?;
            (id, 0, HEADER)
        };
        let tail = Tail::new(open_tail(path).map_err(fail)?).map_err(fail)?;
        let bytes = crate::gauges::usage_journal_bytes();
        bytes.set(len as f64);
        Ok(Self {
            path: path.to_path_buf(),
            id,
            max_bytes,
            writer: Mutex::new(Writer { tail, len, last }),
            shipped: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
            bytes,
            _lock: lock,
        })
    }

    /// The key of its mark in Redis.
    pub(crate) fn mark_key(&self) -> String {
        format!("tp:{{usage}}:j:{}", self.id)
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        // The writer's fields change together after a whole write; a poisoned lock is consistent.
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends `settlement`; `false` when the file is full or cannot be written (the caller
    /// sends it to Redis itself).
    pub(crate) fn append(&self, settlement: &Settlement) -> bool {
        let mut out = encode(settlement);
        let mut w = self.writer();
        if w.len + out.len() as u64 > self.max_bytes {
            crate::gauges::usage_journal_full();
            return false;
        }
        let seq = w.last + 1;
        seal(&mut out, seq);
        let at = w.len;
        if let Err(e) = w.tail.put(at, &out) {
            // A part copied stays past the last whole frame, for the next frame to overwrite.
            tracing::warn!(error = %e, journal = %self.path.display(), "cannot append to the usage journal; the settlement goes to Redis directly");
            return false;
        }
        w.len += out.len() as u64;
        w.last = seq;
        self.bytes.set(w.len as f64);
        drop(w);
        self.wake.notify_one();
        true
    }

    /// The last sequence number written.
    pub(crate) fn last(&self) -> u64 {
        self.writer().last
    }

    /// A handle to read the current file from.
    pub(crate) fn reader(&self) -> std::io::Result<File> {
        File::open(&self.path)
    }

    /// Up to `max` frames from `pos` on (a byte offset in the file `reader` reads), and the offset
    /// after them.
    pub(crate) fn read(
        &self,
        reader: &File,
        pos: u64,
        max: usize,
    ) -> std::io::Result<(Vec<Frame>, u64)> {
        let end = self.writer().len;
        let mut frames = Vec::new();
        let mut pos = pos;
        while frames.len() < max && pos < end {
            let want = usize::try_from((end - pos).min(256 * 1024)).unwrap_or(256 * 1024);
            let mut bytes = vec![0; want];
            reader.read_exact_at(&mut bytes, pos)?;
            let mut at = 0;
            while frames.len() < max {
                let Some((seq, settlement, next)) = decode(&bytes, at) else {
                    break;
                };
                frames.push((seq, settlement));
                at = next;
            }
            if at == 0 {
                // One frame larger than the window: read it whole.
                let body = u32::from_le_bytes(read4(&bytes, 8));
                let whole = FRAME_HEAD + body as usize;
                let mut bytes = vec![0; whole];
                reader.read_exact_at(&mut bytes, pos)?;
                let (seq, settlement, next) = decode(&bytes, 0)
                    .ok_or_else(|| std::io::Error::other("a journal frame fails its checksum"))?;
                frames.push((seq, settlement));
                at = next;
            }
            pos += at as u64;
        }
        Ok((frames, pos))
    }

    /// Starts the file again from a header carrying the last sequence number when everything up
    /// to `pos` is shipped, it is all there is, and the file has grown past `at_least` bytes; the
    /// new file's first frame offset, for the shipper to read on from with a new reader.
    pub(crate) fn restart_if_shipped(&self, pos: u64, at_least: u64) -> Option<u64> {
        let mut w = self.writer();
        if w.len != pos || pos < at_least {
            return None;
        }
        let fresh = self.path.with_extension("restart");
        let restarted = start_file(&fresh, &self.id, w.last)
            .and_then(|()| std::fs::rename(&fresh, &self.path))
            .and_then(|()| open_tail(&self.path))
            .and_then(Tail::new);
        match restarted {
            Ok(tail) => {
                (w.tail, w.len) = (tail, HEADER);
                self.bytes.set(HEADER as f64);
                Some(HEADER)
            }
            Err(e) => {
                tracing::warn!(error = %e, journal = %self.path.display(), "cannot start the shipped usage journal again; it keeps growing");
                None
            }
        }
    }
}

fn new_id() -> String {
    let random = std::collections::hash_map::RandomState::new();
    let mut high = random.build_hasher();
    high.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut low = random.build_hasher();
    low.write_u32(std::process::id());
    format!("{:016x}{:016x}", high.finish(), low.finish())
}

/// The file at `path`, opened to map its end.
fn open_tail(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Writes a file holding only a header.
fn start_file(path: &Path, id: &str, base: u64) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(HEADER as usize);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(id.as_bytes());
    head.extend_from_slice(&base.to_le_bytes());
    let mut file = File::create(path)?;
    file.write_all(&head)?;
    file.sync_all()
}

/// The id and base sequence number of a journal's bytes.
fn header(bytes: &[u8]) -> Option<(String, u64)> {
    let head = bytes.get(..HEADER as usize)?;
    if &head[..4] != MAGIC {
        return None;
    }
    let id = std::str::from_utf8(&head[4..36]).ok()?;
    id.bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then(|| (id.to_string(), u64::from_le_bytes(read8(head, 36))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u64) -> Settlement {
        let entry = crate::UsageEntry {
            record: format!("{{\"n\":{n}}}").into_bytes(),
            day: "20261130".into(),
            sums: vec![
                ("acme\tk\tm\trequests".into(), 1),
                ("acme\tk\tm\tinput".into(), n),
            ],
        };
        Settlement {
            record: Some(crate::Record {
                entry,
                keep_log: n.is_multiple_of(2),
            }),
            ..Settlement::default()
        }
    }

    fn remove(path: &Path) {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(path.with_extension("lock"));
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tp-journal-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn records_read_back_in_order_and_survive_a_reopen() {
        let path = temp("order");
        let journal = Journal::open(&path, 1 << 20).unwrap();
        let e = Journal::open(&path, 1 << 20).unwrap_err();
        assert!(e.0.contains("in use by another process"), "{e}");
        for n in 1..=5 {
            assert!(journal.append(&record(n)));
        }
        let reader = journal.reader().unwrap();
        let (frames, pos) = journal.read(&reader, HEADER, 3).unwrap();
        assert_eq!(frames.iter().map(|f| f.0).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(frames[1].1, record(2));
        let (rest, end) = journal.read(&reader, pos, 10).unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!(end, journal.writer().len);
        // Past the frames, space reserved ahead: zeros, which a reopen does not read as frames.
        assert!(std::fs::metadata(&path).unwrap().len() > end);
        drop(journal);
        let again = Journal::open(&path, 1 << 20).unwrap();
        assert_eq!(again.last(), 5);
        assert!(again.append(&record(6)));
        assert_eq!(again.last(), 6);
        remove(&path);
    }

    #[test]
    fn a_torn_frame_is_cut_off_and_numbers_go_on_after_a_restart() {
        let path = temp("torn");
        let journal = Journal::open(&path, 1 << 20).unwrap();
        for n in 1..=3 {
            assert!(journal.append(&record(n)));
        }
        let (id, len) = (journal.mark_key(), journal.writer().len);
        drop(journal);
        // A crash in the middle of the third frame.
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let journal = Journal::open(&path, 1 << 20).unwrap();
        assert_eq!((journal.last(), journal.mark_key()), (2, id));
        let reader = journal.reader().unwrap();
        let (frames, pos) = journal.read(&reader, HEADER, 10).unwrap();
        assert_eq!(frames.len(), 2);
        // Everything shipped: the file starts again, and the numbers go on from 2.
        assert_eq!(journal.restart_if_shipped(pos, 0), Some(HEADER));
        assert!(journal.append(&record(9)));
        drop(journal);
        let journal = Journal::open(&path, 1 << 20).unwrap();
        let (frames, _) = journal
            .read(&journal.reader().unwrap(), HEADER, 10)
            .unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!((frames[0].0, journal.last()), (3, 3));
        remove(&path);
    }

    #[test]
    fn a_full_journal_refuses_and_a_stranger_file_is_not_read() {
        let path = temp("full");
        let journal = Journal::open(&path, HEADER + 60).unwrap();
        assert!(!journal.append(&record(1)));
        drop(journal);
        std::fs::write(&path, b"something else entirely, at least forty-four bytes").unwrap();
        let e = Journal::open(&path, 1 << 20).unwrap_err();
        assert!(e.0.contains("not a usage journal"), "{e}");
        remove(&path);
    }
}
