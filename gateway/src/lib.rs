//! Turnpike, the gateway: configuration, engine hosting, protocol translation, HTTP routes and
//! the command line.
//!
//! `main.rs` only parses the command line and calls [`cli::run`]; everything else lives here so
//! tests can drive it in-process.

#![warn(missing_docs, unreachable_pub)]

pub(crate) mod body;
pub mod cli;
pub(crate) mod clock;
pub mod config;
pub mod engine_host;
pub(crate) mod error;
pub(crate) mod generation;
pub(crate) mod idempotency;
pub(crate) mod ids;
pub mod listener;
pub mod observability;
pub(crate) mod openai;
pub(crate) mod pipeline;
pub(crate) mod protocols;
pub mod routes;
pub mod server;
pub(crate) mod store;
pub mod tenancy;
pub mod text;
