//! Turnpike, the gateway: configuration, engine hosting, protocol translation, HTTP routes and
//! the command line.
//!
//! `main.rs` only parses the command line and calls [`cli::run`]; everything else lives here so
//! tests can drive it in-process.

pub mod body;
pub mod cli;
pub mod clock;
pub mod config;
pub mod engine_host;
pub mod error;
pub mod generation;
pub mod idempotency;
pub mod ids;
pub mod listener;
pub mod observability;
pub mod openai;
pub mod pipeline;
pub mod protocols;
pub mod routes;
pub mod server;
pub mod store;
pub mod tenancy;
pub mod text;
