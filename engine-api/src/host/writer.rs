//! A host-owned output buffer handed to plugins as a `TpWriter`, with a size cap so a faulty
//! plugin cannot grow host memory without bound.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::abi::TpWriter;

/// Cap for messages, model lists and stats.
pub(crate) const SMALL_LIMIT: usize = 16 << 20;
/// Cap for embeddings output.
pub(crate) const EMBED_LIMIT: usize = 512 << 20;
/// Longest error message kept.
const MESSAGE_LIMIT: usize = 4096;

#[derive(Debug)]
pub(crate) struct OutBuf {
    bytes: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl OutBuf {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            limit,
            truncated: false,
        }
    }

    /// A writer appending to this buffer; valid while `self` is neither moved nor dropped.
    pub(crate) fn writer(&mut self) -> TpWriter {
        TpWriter {
            ctx: (self as *mut Self).cast::<c_void>(),
            write: Some(out_write),
        }
    }

    pub(crate) fn bytes(&self) -> Result<&[u8], String> {
        if self.truncated {
            Err(format!("plugin wrote more than {} bytes", self.limit))
        } else {
            Ok(&self.bytes)
        }
    }

    /// The text written, as an error message: lossy UTF-8, trimmed, capped.
    pub(crate) fn message(&self, fallback: &str) -> String {
        let end = self.bytes.len().min(MESSAGE_LIMIT);
        let text = String::from_utf8_lossy(&self.bytes[..end]);
        let text = text.trim();
        if text.is_empty() {
            fallback.to_string()
        } else {
            text.to_string()
        }
    }
}

unsafe extern "C" fn out_write(ctx: *mut c_void, data: *const u8, len: usize) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the `OutBuf` that built this writer, alive for the call in progress.
        let Some(buf) = (unsafe { ctx.cast::<OutBuf>().as_mut() }) else {
            return;
        };
        if data.is_null() || len == 0 {
            return;
        }
        if buf.bytes.len().saturating_add(len) > buf.limit {
            buf.truncated = true;
            return;
        }
        // SAFETY: the ABI says `data` holds `len` readable bytes for the call.
        buf.bytes
            .extend_from_slice(unsafe { std::slice::from_raw_parts(data, len) });
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(w: TpWriter, bytes: &[u8]) {
        let f = w.write.expect("writer has a callback");
        // SAFETY: the writer's buffer is alive in the calling test.
        unsafe { f(w.ctx, bytes.as_ptr(), bytes.len()) };
    }

    #[test]
    fn appends_and_caps() {
        let mut buf = OutBuf::new(8);
        let w = buf.writer();
        write(w, b"abc");
        write(w, b"def");
        assert_eq!(buf.bytes().map(<[u8]>::to_vec), Ok(b"abcdef".to_vec()));
        write(w, b"ghi");
        assert!(buf.bytes().is_err());
    }

    #[test]
    fn message_falls_back_when_empty() {
        let buf = OutBuf::new(8);
        assert_eq!(buf.message("no reason given"), "no reason given");
    }
}
