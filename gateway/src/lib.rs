//! Turnpike, the gateway: an OpenAI-compatible front door that authenticates callers, applies
//! their tenant's limits, translates every protocol into one generation request, and runs it on
//! an engine plugin.
//!
//! `main.rs` only parses the command line and calls [`cli::run`]; everything else lives here so
//! tests can drive it in-process. The library exports what the binary and the tests drive; the
//! rest is crate-private.
//!
//! # A request's path, top to bottom
//!
//! A streamed `POST /v1/chat/completions`, module by module (each line one job):
//!
//! | step | module | its one job |
//! |---|---|---|
//! | 1 | [`listener`], `body` | accept the connection (capped, TLS handshake when configured, header and body deadlines) |
//! | 2 | [`routes`] (`admission`) | authenticate ([`tenancy`]), check the endpoint scope and JSON body, count the request rate (limits, phase 1), then `idempotency`: replay, join or conflict |
//! | 3 | [`routes`] (`chat`) | the handler: extract the body, call its protocol, frame the reply |
//! | 4 | `protocols` (`chat`) | translate the wire request into the one `GenerationRequest` |
//! | 5 | `generation` | the facade: model lookup and the caller's scope, then the plan, admission, start |
//! | 5½ | [`plugins`] | the gateway plugins' guards attached to the model and tenant: allow, refuse or rewrite |
//! | 6 | `pipeline` (`plan`) | check parameters against the model, template and tokenize within the prompt budget |
//! | 7 | [`tenancy`] (`admit`) | reserve tokens on the exact prompt, take a concurrency lease and a queue place (limits, phase 2) |
//! | 8 | `pipeline` (`run`) | submit one engine request per prompt and merge their events into text, stops, tool calls, logprobs |
//! | 9 | [`engine_host`] | the plugin's `submit` through the C ABI, its events back as a tokio stream (a model with standbys or a canary picks its engine here, `engine_host::routed`) |
//!
//! Beside it, `/admin/v1` goes through `routes` (`admin`: an administrator's credential, a
//! client certificate when required) to [`admin`], which commits a change to the shared state
//! with its keyed audit entry and swaps [`tenancy`]'s directory and [`engine_host`]'s model map
//! (and puts the newest state back into a store that lost it).
//!
//! Back up: `protocols::render` drives the protocol's renderer over the generation into typed
//! items, or `protocols::deliver` folds it into one answer; `routes::sse` frames those as
//! server-sent events or one JSON body, `routes::websocket` as WebSocket messages. Dropping the
//! stream cancels the engine work and settles the tenant's tokens. The plugins' response
//! transforms sit between the merged events and the renderers (`generation::Generation`).
//!
//! # Layers
//!
//! Imports only point down: [`cli`] → [`server`] → [`config`] (composes the settings each
//! component owns) → [`routes`] → [`admin`] (beside the protocols) → `protocols` →
//! `generation` → [`tenancy`], `idempotency`, [`plugins`] → `pipeline` → [`engine_host`] →
//! [`spend`] (prices, budgets, costs) → [`text`] (the `turnpike-text` crate), [`observability`], [`lifecycle`] (serving, draining,
//! cut: set by the server on a stop signal, read by readiness and every generation stream) →
//! [`store`] (the `turnpike-store` crate) → at the bottom [`error`], [`ids`], [`clock`] (the
//! `turnpike-core` crate) and `openai` and `anthropic` (wire types, the `turnpike-wire` crate).
//! Below `config`, no module imports `routes`; protocols and routes reach the engine only
//! through `generation`, never `pipeline`; `tests/layers.rs` keeps it so. `missing_docs` and
//! `unreachable_pub` are set for the whole workspace (its `Cargo.toml`).

pub mod admin;
pub mod batches;
pub(crate) mod body;
pub mod cli;
pub mod config;
pub mod engine_host;
pub mod files;
pub(crate) mod generation;
pub(crate) mod idempotency;
pub mod lifecycle;
pub mod listener;
pub mod observability;
pub(crate) mod pipeline;
pub mod plugins;
pub(crate) mod protocols;
pub mod routes;
pub mod server;
pub mod spend;
pub mod tenancy;

// The bottom floors live in crates of their own (they import nothing of the gateway); their
// old paths stay: `crate::openai`, `crate::anthropic`, `crate::text`, `crate::store`,
// `crate::error`, `crate::ids`, `crate::clock` (and `turnpike::text`, `turnpike::store`).
pub use turnpike_core::{clock, error, ids};
pub use turnpike_store as store;
pub use turnpike_text as text;
pub(crate) use turnpike_wire::{anthropic, openai};
