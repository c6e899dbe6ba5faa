//! Reading growable ABI structs across minor versions.
//!
//! A struct that may grow starts with `struct_size`, the size its writer knew. A reader copies the
//! part both sides know and leaves the rest zeroed, so a field appended in a later minor reads as
//! zero ("absent") when the writer is older, and a newer writer's extra fields are ignored. This
//! one mechanism gives "the host calls a function only if the plugin's `struct_size` covers it":
//! a function pointer beyond `struct_size` reads as `None`.

use std::mem::{MaybeUninit, offset_of, size_of};

use crate::abi::{
    TpEmbedRequestV1, TpEngineApiV1, TpEventV1, TpHostV1, TpRequestV1, TpStr, TpTokens,
};

/// An ABI struct that starts with a `u32 struct_size` and whose all-zero bit pattern is a valid
/// value (integers, floats, raw pointers and `Option<fn>` only).
///
/// # Safety
/// Implement only for `#[repr(C)]` types that satisfy the above.
pub unsafe trait Growable: Copy {}

// SAFETY: each type below is #[repr(C)], starts with `struct_size: u32`, and holds only integers,
// floats, raw pointers and optional function pointers, for which zero is valid.
unsafe impl Growable for TpEngineApiV1 {}
// SAFETY: as above.
unsafe impl Growable for TpHostV1 {}
// SAFETY: as above.
unsafe impl Growable for TpRequestV1 {}
// SAFETY: as above.
unsafe impl Growable for TpEmbedRequestV1 {}
// SAFETY: as above.
unsafe impl Growable for TpEventV1 {}

/// The `struct_size` the writer declared.
///
/// # Safety
/// `ptr` must be non-null and point to at least four readable bytes.
pub unsafe fn declared_size<T: Growable>(ptr: *const T) -> u32 {
    // SAFETY: the caller guarantees four readable bytes; the read need not be aligned.
    unsafe { ptr.cast::<u32>().read_unaligned() }
}

/// Copies the part of `*ptr` that both the writer (by its `struct_size`) and `T` know; the rest
/// of the result is zero.
///
/// The copied length is rounded down to a multiple of eight. Every growable struct holds a
/// pointer, so an honest `struct_size` already is one; the rounding only guarantees that a
/// dishonest one cannot leave half of a pointer behind.
///
/// # Safety
/// `ptr` must be non-null and point to at least `min(struct_size, size_of::<T>())` readable bytes.
pub unsafe fn read_prefix<T: Growable>(ptr: *const T) -> T {
    // SAFETY: forwarded from the caller.
    let declared = unsafe { declared_size(ptr) } as usize;
    if declared >= size_of::<T>() {
        // The common case, the writer knows at least as much as `T`: one fixed-size copy.
        // SAFETY: `size_of::<T>()` bytes are readable (caller); any bit pattern of a `T` written
        // by the other side is valid for `T: Growable`.
        return unsafe { ptr.read_unaligned() };
    }
    let len = declared & !7;
    let mut out = MaybeUninit::<T>::zeroed();
    // SAFETY: `len` bytes are readable at `ptr` (caller) and writable in `out` (len <= size_of T);
    // the regions cannot overlap since `out` is a fresh local.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), out.as_mut_ptr().cast::<u8>(), len) };
    // SAFETY: `T: Growable` makes the all-zero pattern valid, and the copied prefix came from a
    // valid `T` written by the other side.
    unsafe { out.assume_init() }
}

/// Reads a growable struct the other side passed, refusing NULL and a `struct_size` below `min`
/// (the v1.0 size: every v1.0 field is required). The error names the struct as `what`.
///
/// # Safety
/// `ptr` must be NULL or point to a struct valid for its declared `struct_size`.
pub unsafe fn read_at_least<T: Growable>(ptr: *const T, min: u32, what: &str) -> Result<T, String> {
    if ptr.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null; forwarded from the caller.
    let declared = unsafe { declared_size(ptr) };
    if declared < min {
        return Err(format!(
            "{what} struct_size {declared} is smaller than v1.0's {min}"
        ));
    }
    // SAFETY: at least `min` bytes are readable, as the caller vouches.
    Ok(unsafe { read_prefix(ptr) })
}

/// The smallest `struct_size` a v1 function table may have: through `cancel`, the last required
/// entry.
pub const ENGINE_API_V1_MIN_SIZE: u32 =
    (offset_of!(TpEngineApiV1, cancel) + size_of::<usize>()) as u32;
/// Size of a v1.0 host table, the smallest a plugin accepts.
pub const HOST_V1_0_SIZE: u32 = (offset_of!(TpHostV1, log) + size_of::<usize>()) as u32;
/// Size of a v1.0 request, the smallest a plugin accepts (minor 1 appended `trace_context`).
pub const REQUEST_V1_0_SIZE: u32 =
    (offset_of!(TpRequestV1, params_json) + size_of::<TpStr>()) as u32;
/// Size of a v1.0 embeddings request, the smallest a plugin accepts.
pub const EMBED_REQUEST_V1_0_SIZE: u32 =
    (offset_of!(TpEmbedRequestV1, params_json) + size_of::<TpStr>()) as u32;
/// Size of a v1.0 event, the smallest a host accepts.
pub const EVENT_V1_0_SIZE: u32 = (offset_of!(TpEventV1, message) + size_of::<TpStr>()) as u32;

/// A `TpStr` borrowing `s`.
pub fn tp_str(s: &str) -> TpStr {
    TpStr {
        ptr: s.as_ptr().cast(),
        len: s.len(),
    }
}

/// A `TpTokens` borrowing `tokens`.
pub fn tp_tokens(tokens: &[u32]) -> TpTokens {
    TpTokens {
        ptr: tokens.as_ptr(),
        len: tokens.len(),
    }
}

/// The bytes of a `TpStr` (empty for NULL).
///
/// # Safety
/// `s.ptr` must be NULL or point to `s.len` readable bytes that outlive `'a`.
pub unsafe fn str_bytes<'a>(s: TpStr) -> &'a [u8] {
    if s.ptr.is_null() || s.len == 0 {
        return &[];
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) }
}

/// The text of a `TpStr`, with invalid UTF-8 replaced.
///
/// # Safety
/// As for [`str_bytes`].
pub unsafe fn str_lossy(s: TpStr) -> String {
    // SAFETY: forwarded from the caller.
    String::from_utf8_lossy(unsafe { str_bytes(s) }).into_owned()
}

/// The token ids of a `TpTokens` (empty for NULL).
///
/// # Safety
/// `t.ptr` must be NULL or point to `t.len` readable `u32`s that outlive `'a`, suitably aligned.
pub unsafe fn tokens<'a>(t: TpTokens) -> &'a [u32] {
    if t.ptr.is_null() || t.len == 0 {
        return &[];
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(t.ptr, t.len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Wider {
        api: TpEngineApiV1,
        extra: Option<unsafe extern "C" fn()>,
    }
    // SAFETY: repr(C), starts with struct_size via `api`, and only holds zero-valid fields.
    unsafe impl Growable for Wider {}

    unsafe extern "C" fn poison() {}

    fn empty_api(struct_size: u32) -> TpEngineApiV1 {
        TpEngineApiV1 {
            struct_size,
            abi_major: 1,
            abi_minor: 0,
            name: std::ptr::null(),
            version: std::ptr::null(),
            create: None,
            destroy: None,
            models: None,
            submit: None,
            cancel: None,
            stats: None,
            health: None,
            embed: None,
        }
    }

    #[test]
    fn fields_beyond_struct_size_read_as_absent() {
        // A v1.0 writer followed in memory by a non-null pointer that a newer reader must not see.
        let older = Wider {
            api: empty_api(size_of::<TpEngineApiV1>() as u32),
            extra: Some(poison),
        };
        // SAFETY: `older` is a live, fully initialised `Wider`.
        let read: Wider = unsafe { read_prefix(&older) };
        assert!(read.extra.is_none());
        assert_eq!(read.api.struct_size, older.api.struct_size);
    }

    #[test]
    fn newer_writer_fields_are_ignored() {
        let newer = Wider {
            api: empty_api(size_of::<Wider>() as u32),
            extra: Some(poison),
        };
        // SAFETY: a `Wider` starts with a `TpEngineApiV1` and is at least as large.
        let read: TpEngineApiV1 = unsafe { read_prefix(&newer.api) };
        assert_eq!(read.struct_size as usize, size_of::<Wider>());
    }

    #[test]
    fn a_ragged_struct_size_never_keeps_half_a_pointer() {
        let mut api = empty_api(0);
        api.stats = Some({
            unsafe extern "C" fn s(_: *mut crate::abi::TpEngine, _: crate::abi::TpWriter) -> u32 {
                0
            }
            s
        });
        api.struct_size = (offset_of!(TpEngineApiV1, stats) + 4) as u32;
        // SAFETY: `api` is a live, fully initialised table.
        let read: TpEngineApiV1 = unsafe { read_prefix(&api) };
        assert!(read.stats.is_none());
    }

    #[test]
    fn v1_0_sizes_are_the_structs_of_minor_0() {
        // Minor 1 appended `trace_context` to the request; a v1.0 request stops before it.
        assert_eq!(
            REQUEST_V1_0_SIZE as usize,
            offset_of!(TpRequestV1, trace_context)
        );
        assert_eq!(
            REQUEST_V1_0_SIZE as usize + size_of::<TpStr>(),
            size_of::<TpRequestV1>()
        );
        assert_eq!(EVENT_V1_0_SIZE as usize, size_of::<TpEventV1>());
        assert_eq!(HOST_V1_0_SIZE as usize, size_of::<TpHostV1>());
        assert_eq!(
            EMBED_REQUEST_V1_0_SIZE as usize,
            size_of::<TpEmbedRequestV1>()
        );
        assert!(ENGINE_API_V1_MIN_SIZE as usize <= size_of::<TpEngineApiV1>());
    }
}
