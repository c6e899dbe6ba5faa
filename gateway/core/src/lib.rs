//! The gateway's core: what every layer above speaks and nothing of the gateway is needed
//! for. [`error::ApiError`] is the one error every request path ends in, with its one
//! exhaustive error → status match and its OpenAI-shaped body; [`ids`] makes response and
//! tool-call ids; [`clock`] writes time as the protocols do and beats the file watches.
//!
//! A crate of its own so the compiler keeps it at the bottom: it imports only the wire types
//! (`turnpike-wire`) and the engine ABI's status codes, and the gateway re-exports it under
//! the old paths (`crate::error`, `crate::ids`, `crate::clock`).

pub mod clock;
pub mod error;
pub mod ids;
