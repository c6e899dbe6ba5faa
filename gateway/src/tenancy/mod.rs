//! Who is calling and what they may spend: authentication ([`auth`]: hashed API keys and JWT),
//! tenants and plans (this file), limits ([`limits`]: request rates, token budgets,
//! concurrent streams) and per-model queue admission ([`queue`]).
//!
//! The seam is [`Principal`]: authentication turns a request's bearer credential into one, and
//! everything after it (limits, idempotency scoping, the engine's fair scheduling) reads only
//! that. The tenant directory (tenants, plans, keys) is plain data, validated once by
//! its [`settings`] and swapped whole when the keys file is reloaded, so a request sees one
//! consistent directory from start to end.

pub mod auth;
mod charge_plans;
pub mod jwt;
pub mod keys;
pub mod keys_file;
pub mod limits;
pub mod queue;
pub mod ratelimit_headers;
pub mod service;
pub mod settings;
mod spending;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::spend::budget::Budget;
use crate::store::Window;

pub use auth::{Authenticator, Caller};
pub use keys::KeyRecord;
pub use service::{Admission, AdmitRequest, Tenancy};

/// An API surface a key or token may be scoped to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
    /// `/v1/embeddings`.
    Embeddings,
    /// `/v1/responses`.
    Responses,
    /// `/v1/models`.
    Models,
    /// `/v1/messages` (Anthropic's Messages API).
    Messages,
    /// `POST /generate`, the token-level node endpoint. Never implied: a key or token reaches
    /// it only by naming it, as a fleet's front does for its nodes.
    Generate,
    /// `GET /v1/usage`, the tenant's own usage report. Never implied either.
    Usage,
    /// `/v1/files` and `/v1/batches`, the Batch API (its lines also need their endpoint's
    /// scope).
    Batches,
}

impl Endpoint {
    /// Every endpoint, with its scope name.
    pub const ALL: [(Endpoint, &'static str); 9] = [
        (Endpoint::Chat, "chat"),
        (Endpoint::Completions, "completions"),
        (Endpoint::Embeddings, "embeddings"),
        (Endpoint::Responses, "responses"),
        (Endpoint::Models, "models"),
        (Endpoint::Messages, "messages"),
        (Endpoint::Generate, "generate"),
        (Endpoint::Usage, "usage"),
        (Endpoint::Batches, "batches"),
    ];

    /// The endpoint a scope name names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(e, _)| *e)
    }

    /// Its scope name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(e, _)| *e == self)
            .map_or("", |(_, n)| n)
    }

    /// Whether a credential that names no endpoints may call it (every endpoint but the
    /// node's and the usage report).
    pub fn implied(self) -> bool {
        !matches!(self, Self::Generate | Self::Usage)
    }

    /// The endpoint a URL path belongs to.
    pub fn of_path(path: &str) -> Option<Self> {
        if path == "/generate" {
            return Some(Self::Generate);
        }
        let rest = path.strip_prefix("/v1/")?;
        let first = rest.split('/').next().unwrap_or("");
        match first {
            "chat" => Some(Self::Chat),
            "completions" => Some(Self::Completions),
            "embeddings" => Some(Self::Embeddings),
            "responses" => Some(Self::Responses),
            "models" => Some(Self::Models),
            "messages" => Some(Self::Messages),
            "usage" => Some(Self::Usage),
            "files" | "batches" => Some(Self::Batches),
            _ => None,
        }
    }
}

/// A set of names, or every name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NameSet {
    /// Everything.
    #[default]
    All,
    /// Only these.
    Only(BTreeSet<String>),
}

impl NameSet {
    /// From a list where `"*"` means everything.
    pub fn from_list(list: &[String]) -> Self {
        if list.iter().any(|m| m == "*") {
            Self::All
        } else {
            Self::Only(list.iter().cloned().collect())
        }
    }

    /// Whether any of `names` is in the set.
    pub fn allows_any<'a>(&self, mut names: impl Iterator<Item = &'a str>) -> bool {
        match self {
            Self::All => true,
            Self::Only(set) => names.any(|n| set.contains(n)),
        }
    }

    /// The names both sets hold.
    pub fn intersect(&self, other: &NameSet) -> NameSet {
        match (self, other) {
            (Self::All, x) | (x, Self::All) => x.clone(),
            (Self::Only(a), Self::Only(b)) => Self::Only(a.intersection(b).cloned().collect()),
        }
    }
}

/// What a key or token may do, within its tenant's plan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scopes {
    /// Models it may use.
    pub models: NameSet,
    /// Endpoints it may call (`None`: all that are [`Endpoint::implied`]).
    pub endpoints: Option<BTreeSet<Endpoint>>,
    /// Whether it may call the admin API. Never implied: a key gets it only by naming `admin`
    /// among its endpoints, a token by an `admin` scope item.
    pub admin: bool,
    /// The key's own spend budget, within its tenant's.
    pub budget: Option<Budget>,
}

/// A tenant's limits.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Request-rate windows (per second, minute, day).
    pub requests: Vec<Window>,
    /// Token windows (per minute, day), prompt plus completion.
    pub tokens: Vec<Window>,
    /// Most generations in flight at once.
    pub concurrent: Option<u64>,
    /// Most WebSocket connections open at once on one replica (`None`: the server's
    /// `websocket_max_per_tenant`).
    pub websockets: Option<u64>,
    /// Models the tenant may use.
    pub models: NameSet,
    /// Share of the engine under contention, relative to other tenants.
    pub weight: u32,
    /// Spend budget.
    pub budget: Option<Budget>,
}

impl Plan {
    /// The windows of a set of per-second, per-minute and per-day limits.
    pub fn windows(second: Option<u64>, minute: Option<u64>, day: Option<u64>) -> Vec<Window> {
        [(second, 1), (minute, 60), (day, 86_400)]
            .into_iter()
            .filter_map(|(cap, secs)| {
                cap.map(|capacity| Window {
                    capacity,
                    period: Duration::from_secs(secs),
                })
            })
            .collect()
    }
}

/// A tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Its name (also the scope of its idempotency keys and state).
    pub name: String,
    /// Its limits.
    pub plan: Plan,
}

/// Tenants and the keys that belong to them; replaced whole on reload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Directory {
    /// Tenants by name.
    pub tenants: HashMap<String, Arc<Tenant>>,
    /// API keys by their public id.
    pub keys: HashMap<String, KeyRecord>,
}

/// The caller of a request, authenticated.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// The API key's public id, or the token's subject.
    pub key_id: Option<String>,
    /// What this credential may do.
    pub scopes: Scopes,
}

impl Principal {
    /// The caller when authentication is off: one local tenant without limits.
    pub fn local() -> Self {
        Self {
            tenant: Arc::new(Tenant {
                name: "local".into(),
                plan: Plan {
                    weight: 1,
                    ..Plan::default()
                },
            }),
            key_id: None,
            scopes: Scopes {
                endpoints: Some(Endpoint::ALL.iter().map(|(e, _)| *e).collect()),
                ..Scopes::default()
            },
        }
    }

    /// Whether the caller may use a model known by any of `names`.
    pub fn may_use<'a>(&self, names: impl Iterator<Item = &'a str> + Clone) -> bool {
        self.tenant.plan.models.allows_any(names.clone()) && self.scopes.models.allows_any(names)
    }

    /// Whether the caller may call the admin API.
    pub fn is_admin(&self) -> bool {
        self.scopes.admin
    }

    /// Whether the caller may call `endpoint`.
    pub fn may_call(&self, endpoint: Endpoint) -> bool {
        match &self.scopes.endpoints {
            None => endpoint.implied(),
            Some(set) => set.contains(&endpoint),
        }
    }
}
