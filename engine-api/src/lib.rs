//! The Turnpike engine plugin contract.
//!
//! Everything in Turnpike that produces tokens is an engine plugin: a shared library loaded at run
//! time and driven through a plain C ABI. This crate is that contract and its tooling:
//!
//! - [`abi`]: the `#[repr(C)]` types and `extern "C"` signatures of ABI v1, from which
//!   `include/turnpike_engine.h` is generated for C and C++ vendors;
//! - [`plugin`] (always on): a safe [`plugin::Engine`] trait and [`export_engine!`] for plugins
//!   written in Rust;
//! - `host` (feature `host`): the loader, a safe engine handle, and the bridge that turns a
//!   request's sink into a tokio `Stream` which cancels the request when dropped;
//! - `conformance` (feature `conformance`): checks any plugin can be run through.
//!
//! # Why a plain C ABI
//!
//! A C ABI lets vendors build plugins in C, C++ or Rust with any compiler version, and lets a
//! plugin built for an older minor version keep working in a newer host and the other way round.
//! Rust-specific layers (`abi_stable`) serve only Rust and reject older plugins in newer hosts.
//! The shape follows Triton Inference Server's backend API: one entry symbol per major version,
//! a function table that grows only at its end, and data that crosses the boundary either
//! borrowed for one call or written through a host callback.
//!
//! # The contract (ABI v1)
//!
//! **Discovery.** The library exports `const TpEngineApiV1 *turnpike_engine_v1(void)`, returning a
//! static table that starts with `struct_size`, `abi_major`, `abi_minor`. A new major version gets
//! a new symbol (`turnpike_engine_v2`), so a host can tell "wrong major" from "not a plugin".
//!
//! **Growth.** Minor versions only append fields to the end of a struct and entries to the end of
//! the table. Every growable struct starts with `struct_size`; the reader uses the part both sides
//! know and treats the rest as zero ([`layout::read_prefix`]). The host calls an entry only when
//! the plugin's `struct_size` covers it and it is not NULL. `create`, `destroy`, `models`,
//! `submit` and `cancel` are required; `stats`, `health` and `embed` are optional, and a NULL
//! `embed` says the plugin serves no embeddings.
//!
//! **Requests.** `submit` gets the prompt as token ids and the generation parameters as a JSON
//! object ([`json::GenerationParams`]), so parameters can be added without an ABI change. The host
//! only sends a parameter that the model's capabilities ([`json::Capabilities`]) declare; a plugin
//! ignores keys it does not know.
//!
//! **Events.** A request's events go to its sink `{ctx, on_event, release}`: TOKEN events (token
//! id, log probability, alternatives, choice index), optional CHOICE_END events when one of `n`
//! choices ends, and a FINAL event with the finish reason, a status, a message and usage.
//!
//! **The rules.**
//! 1. *FINAL exactly once.* An accepted request (submit returned `TP_STATUS_OK`) gets exactly one
//!    FINAL event, after all its other events, whether it completes, fails, is cancelled, or the
//!    engine is destroyed. A refused request (any other status) gets no event.
//! 2. *Release exactly once.* `submit` takes ownership of the sink whatever it returns; the plugin
//!    calls `release` exactly once, after its last `on_event`, and never touches `ctx` again.
//! 3. *Any thread, never blocking.* `on_event` may be called from any plugin thread (never
//!    concurrently for one request) and never blocks: the host queues the event and returns,
//!    without calling back into the engine (so an engine may emit while holding its own locks).
//!    The engine bounds what it sends by `max_tokens`.
//!    Events, the FINAL included, may arrive before `submit` returns, on the thread calling it: a
//!    host holds no lock across `submit` that `on_event` takes.
//! 4. *Cancel is idempotent and asynchronous.* `cancel(id)` may be called any number of times,
//!    before the first token, during generation, or after the FINAL event; unknown ids are
//!    ignored, and so may be an id whose `submit` has not yet returned. The FINAL event (status
//!    `TP_STATUS_CANCELLED`, or `TP_STATUS_OK` if generation won the race) may come later, from
//!    another thread.
//! 5. *Destroy finishes everything.* Before `destroy` returns, every accepted request has had its
//!    FINAL event and its `release`, and the plugin has stopped calling the host's log. The host
//!    calls nothing on an engine during or after its `destroy`, and never unloads the library.
//! 6. *No memory freed across the boundary.* Inputs (strings, token arrays, requests, events) are
//!    borrowed for the duration of one call; copy what you keep. Variable-size outputs (model
//!    lists, stats, embeddings, error messages) go through a host-provided `TpWriter`.
//! 7. *Panics never cross.* Every entry point catches panics (and C++ exceptions) and returns a
//!    status, `TP_STATUS_INTERNAL` for a caught panic; plugins are never built with
//!    `panic = "abort"`. Anything that may be missing at run time (a GPU driver) is probed and
//!    reported as an error status, never a crash.
//! 8. *Thread safety.* Every entry except `create` and `destroy` may be called concurrently from
//!    any host thread.
//!
//! The conformance kit checks rules 1, 2, 4 and 5 on any plugin; the SDK's wrappers make a Rust
//! plugin keep rules 1, 2 and 7 even when its engine code forgets or panics.

pub mod abi;
pub mod json;

/// The earlier name of [`json`] (a module of JSON documents, not of documentation), kept so a
/// plugin written against it still builds.
#[deprecated(note = "renamed `json`")]
#[doc(hidden)]
pub mod docs {
    pub use crate::json::*;
}
pub mod event;
pub mod layout;
pub mod plugin;
pub mod resume;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "host")]
pub mod host;

pub use event::{
    EngineError, EngineEvent, FinalEvent, Finish, FinishReason, Status, TokenEvent, TopLogprob,
    Usage,
};
pub use json::{Capabilities, EmbedParams, GenerationParams, Grammar, ModelInfo, Stats};
