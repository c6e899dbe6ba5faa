//! The Turnpike gateway plugin contract: what an operator or vendor writes to guard requests,
//! transform response text and run tools for the model, as a shared library loaded at run time.
//!
//! - [`abi`]: the `#[repr(C)]` types and `extern "C"` signatures of ABI v1, from which
//!   `include/turnpike_gateway_plugin.h` is generated for C and C++ plugins;
//! - [`json`]: the JSON documents hooks read and write;
//! - [`plugin`]: a safe [`plugin::GatewayPlugin`] trait and [`export_gateway_plugin!`] for
//!   plugins written in Rust;
//! - `host` (feature `host`): loading and calling plugins;
//! - `conformance` (feature `conformance`): checks any plugin can be run through.
//!
//! # Why this shape
//!
//! It is the engine ABI's sibling (`turnpike-engine-api`), for the same reasons: a plain C ABI
//! serves C, C++ and Rust with any compiler, and a table that grows only at its end lets old
//! plugins run in new hosts and the other way round. Hooks exchange small JSON documents rather
//! than structs, so a request or a tool call can gain fields without an ABI change; the only
//! per-token hook (`transform_feed`) passes plain text.
//!
//! # The contract (ABI v1)
//!
//! 1. **Discovery.** The library exports `const TgPluginApiV1 *turnpike_gateway_plugin_v1(void)`
//!    returning a static table that starts with `struct_size`, `abi_major` and `abi_minor`.
//! 2. **Growth.** Minors append fields and entries; the host reads what both sides know
//!    (`turnpike_engine_api::layout::read_prefix`) and calls an entry only when the table covers
//!    it and it is not NULL. `create` and `destroy` are required, every hook optional.
//! 3. **No memory crosses to be freed.** Inputs are borrowed for one call; outputs go through
//!    the host's `TgWriter`; a transform's state and an instance are the plugin's, freed by
//!    `transform_close` and `destroy`.
//! 4. **Panics never cross.** Every entry catches panics (and C++ exceptions) and returns a
//!    status; the SDK does this for Rust plugins.
//! 5. **Hooks never block.** `guard` and `transform_feed` run on the request path and return
//!    promptly; `transform_feed` is called once per streamed piece of text.
//! 6. **Transforms do not depend on chunking.** The text a transform writes over all its feeds
//!    is the same however the output was cut, so a streamed answer equals the same answer not
//!    streamed. A transform may hold back a tail (to match across pieces) and flushes it when
//!    `last` is set.
//! 7. **Tool calls answer exactly once.** An accepted call (`tool_call` returned OK) gets exactly
//!    one `done`, from any thread, also after `tool_cancel` or during `destroy`; a refused call
//!    gets none. The host waits at most the call's `deadline_ms`, then cancels it.
//! 8. **Thread safety.** Every entry except `create` and `destroy` may be called concurrently;
//!    one transform is fed from one thread at a time.
//!
//! The conformance kit checks rules 4, 6 and 7 and the documents on any plugin.

pub mod abi;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod json;

/// The earlier name of [`json`] (a module of JSON documents, not of documentation), kept so a
/// plugin written against it still builds.
#[deprecated(note = "renamed `json`")]
#[doc(hidden)]
pub mod docs {
    pub use crate::json::*;
}
#[cfg(feature = "host")]
pub mod host;
pub mod plugin;

/// A borrowed `TgStr` of `text`, valid while `text` is.
pub fn tg_str(text: &str) -> abi::TgStr {
    abi::TgStr {
        ptr: text.as_ptr().cast(),
        len: text.len(),
    }
}
