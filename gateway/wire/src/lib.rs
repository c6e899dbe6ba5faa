//! `turnpike-wire`: the wire types of the protocols the gateway speaks, serde only, no
//! behaviour: [`openai`] (chat, legacy completions, embeddings, models, the Responses API, the
//! error body) and [`anthropic`] (the Messages API).
//!
//! They are the gateway's bottom floor: this crate depends on nothing of the gateway, so no wire
//! type can reach up into it, and the gateway's own layering test (`gateway/tests/layers.rs`)
//! keeps the routes and protocols the only modules that import them. Each type mirrors the
//! protocol's JSON as clients send and read it; checks beyond the shape live in the protocol
//! translators.

pub mod anthropic;
pub mod openai;
