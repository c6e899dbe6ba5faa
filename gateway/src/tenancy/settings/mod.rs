//! The tenancy sections of the configuration, as written and validated: `[auth]`, `[plans.*]`,
//! `[tenants.*]`, `[state]`, `[idempotency]` and `[queue]`. The keys file ([`super::keys_file`])
//! reuses the plan and tenant shapes. The configuration layer reads the file and hands these
//! sections here; what they mean is the tenancy's to say.

mod jwt;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::limits::{FailureMode, FailureModes};
use super::queue::QueueLimits;
use super::{Directory, Endpoint, KeyRecord, NameSet, Plan, Scopes, Tenant, keys};
use crate::idempotency::IdempotencySettings;
use crate::spend::settings::RawBudget;
use crate::store::memory::MemoryLimits;

/// Authentication, tenants, limits, state and idempotency, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TenancyConfig {
    /// Whether callers must authenticate (off only when configured so, or in the built-in
    /// default).
    pub auth_required: bool,
    /// Tenants and keys of the configuration file (the keys file adds to them).
    pub directory: Directory,
    /// Plans of the configuration file, for tenants of the keys file.
    pub(crate) plans: BTreeMap<String, RawLimits>,
    /// The keys file, re-read when it changes.
    pub keys_file: Option<PathBuf>,
    /// How often the keys file is checked for changes.
    pub reload_interval: Duration,
    /// Whether a reload may leave no tenant of the configuration and keys file while the
    /// running ones have keys (refused otherwise: an emptied or truncated file would lock
    /// every caller out).
    pub allow_empty_directory: bool,
    /// JWT verification.
    pub jwt: Option<SharedJwt>,
    /// The Redis URL; `None` keeps state in memory.
    pub redis_url: Option<String>,
    /// Longest wait for the state store.
    pub state_timeout: Duration,
    /// Time to live of a concurrency lease (renewed while held).
    pub lease_ttl: Duration,
    /// What each feature does when the store fails.
    pub failure: FailureModes,
    /// Limits of the in-memory store.
    pub memory: MemoryLimits,
    /// Idempotency, unless switched off.
    pub idempotency: Option<IdempotencySettings>,
    /// Per-model queue sizes.
    pub queue: QueueLimits,
    /// Prices and the currency (their models are checked against the served ones at start).
    pub spend: crate::spend::settings::SpendConfig,
}

/// A JWT verifier shared by clones of the configuration, with the fingerprint of the settings
/// and keys it was made from: two loads of the same `[auth.jwt]` and key files are equal, so a
/// reload does not report a change that did not happen.
#[derive(Debug, Clone)]
pub struct SharedJwt(
    pub std::sync::Arc<crate::tenancy::jwt::JwtVerifier>,
    pub [u8; 32],
);

impl PartialEq for SharedJwt {
    fn eq(&self, other: &Self) -> bool {
        self.1 == other.1
    }
}

/// Limits as written, in a plan or a tenant (the admin API takes and shows them as JSON).
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests_per_second: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests_per_day: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens_per_day: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    concurrent_streams: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_websockets: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    models: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    priority_weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<RawBudget>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    keys: Vec<RawEnvKey>,
}

/// A key given to a tenant through an environment variable.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawEnvKey {
    env: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    models: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoints: Option<Vec<String>>,
}

impl RawLimits {
    /// Whether it gives keys through environment variables (only a file can).
    pub fn has_env_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The plan it names.
    pub fn plan_name(&self) -> Option<&str> {
        self.plan.as_deref()
    }

    /// Fields set here win over the plan's.
    fn over(&self, plan: &RawLimits) -> RawLimits {
        RawLimits {
            plan: None,
            requests_per_second: self.requests_per_second.or(plan.requests_per_second),
            requests_per_minute: self.requests_per_minute.or(plan.requests_per_minute),
            requests_per_day: self.requests_per_day.or(plan.requests_per_day),
            tokens_per_minute: self.tokens_per_minute.or(plan.tokens_per_minute),
            tokens_per_day: self.tokens_per_day.or(plan.tokens_per_day),
            concurrent_streams: self.concurrent_streams.or(plan.concurrent_streams),
            max_websockets: self.max_websockets.or(plan.max_websockets),
            models: self.models.clone().or_else(|| plan.models.clone()),
            priority_weight: self.priority_weight.or(plan.priority_weight),
            budget: self.budget.clone().or_else(|| plan.budget.clone()),
            keys: self.keys.clone(),
        }
    }

    fn plan(&self, at: &str) -> Result<Plan, String> {
        let weight = self.priority_weight.unwrap_or(1);
        if !(1..=1000).contains(&weight) {
            return Err(format!("{at}.priority_weight must be 1 to 1000"));
        }
        Ok(Plan {
            requests: Plan::windows(
                self.requests_per_second,
                self.requests_per_minute,
                self.requests_per_day,
            ),
            tokens: Plan::windows(None, self.tokens_per_minute, self.tokens_per_day),
            concurrent: self.concurrent_streams,
            websockets: self.max_websockets,
            models: self
                .models
                .as_deref()
                .map_or(NameSet::All, NameSet::from_list),
            weight,
            budget: self
                .budget
                .as_ref()
                .map(|b| b.validate(&format!("{at}.budget")))
                .transpose()?,
        })
    }
}

/// A name usable in state keys and logs.
pub(crate) fn check_name(kind: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{kind} name `{name}`: use 1 to 64 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// The scopes of a key as written: a model list and endpoint names, where `admin` grants the
/// admin API (and nothing else unless other endpoints are named too).
pub(crate) fn scopes(
    models: Option<&[String]>,
    endpoints: Option<&[String]>,
    at: &str,
) -> Result<Scopes, String> {
    let mut admin = false;
    let endpoints = endpoints
        .map(|list| {
            list.iter()
                .filter(|name| {
                    let is_admin = name.as_str() == "admin";
                    admin |= is_admin;
                    !is_admin
                })
                .map(|name| {
                    Endpoint::parse(name).ok_or_else(|| {
                        let known: Vec<&str> = Endpoint::ALL.iter().map(|(_, n)| *n).collect();
                        format!(
                            "{at}: unknown endpoint `{name}` (known: {}, admin)",
                            known.join(", ")
                        )
                    })
                })
                .collect::<Result<BTreeSet<_>, _>>()
        })
        .transpose()?;
    Ok(Scopes {
        models: models.map_or(NameSet::All, NameSet::from_list),
        endpoints,
        admin,
        budget: None,
    })
}

/// Tenants from plans and tenant tables, keys from the environment (`vars`).
pub(crate) fn tenants(
    plans: &BTreeMap<String, RawLimits>,
    raw: &BTreeMap<String, RawLimits>,
    vars: &dyn Fn(&str) -> Option<String>,
    directory: &mut Directory,
) -> Result<(), String> {
    for (name, plan) in plans {
        check_name("plan", name)?;
        if plan.plan.is_some() || !plan.keys.is_empty() {
            return Err(format!("plans.{name}: a plan has no `plan` or `keys`"));
        }
    }
    for (name, t) in raw {
        check_name("tenant", name)?;
        let at = format!("tenants.{name}");
        if directory.tenants.contains_key(name) {
            return Err(format!("{at}: tenant defined twice"));
        }
        let limits = match &t.plan {
            Some(p) => t.over(
                plans
                    .get(p)
                    .ok_or_else(|| format!("{at}.plan: no plan `{p}`"))?,
            ),
            None => t.clone(),
        };
        let tenant = Tenant {
            name: name.clone(),
            plan: limits.plan(&at)?,
        };
        directory.tenants.insert(name.clone(), Arc::new(tenant));
        for (i, k) in t.keys.iter().enumerate() {
            let at = format!("{at}.keys[{i}]");
            let key = vars(&k.env)
                .ok_or_else(|| format!("{at}: environment variable {} is not set", k.env))?;
            let id = keys::parse_id(key.trim()).map_err(|_| {
                format!(
                    "{at}: {} does not hold a Turnpike API key (make one with `turnpike keys generate`)",
                    k.env
                )
            })?;
            let record = KeyRecord {
                id: id.to_string(),
                hash: keys::hash(key.trim()),
                tenant: name.clone(),
                expires_at: None,
                scopes: scopes(k.models.as_deref(), k.endpoints.as_deref(), &at)?,
                revoked: false,
            };
            if directory.keys.insert(record.id.clone(), record).is_some() {
                return Err(format!("{at}: key id {id} is used twice"));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAuth {
    mode: Option<String>,
    keys_file: Option<String>,
    reload_interval_ms: Option<u64>,
    #[serde(default)]
    allow_empty_directory: bool,
    jwt: Option<jwt::RawJwt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawState {
    backend: String,
    redis_url: Option<String>,
    timeout_ms: u64,
    lease_ms: u64,
    memory_max_records: usize,
    memory_max_bytes: usize,
    failure_mode: RawFailureModes,
}

impl Default for RawState {
    fn default() -> Self {
        Self {
            backend: "memory".into(),
            redis_url: None,
            timeout_ms: 250,
            lease_ms: 30_000,
            memory_max_records: 100_000,
            memory_max_bytes: 256 << 20,
            failure_mode: RawFailureModes::default(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailureModes {
    requests: Option<String>,
    tokens: Option<String>,
    concurrency: Option<String>,
    idempotency: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawIdempotency {
    enabled: bool,
    ttl_secs: u64,
    join: bool,
    max_record_bytes: usize,
    lease_ms: u64,
    resume_window_ms: u64,
}

impl Default for RawIdempotency {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl_secs: 86_400,
            join: true,
            max_record_bytes: 1 << 20,
            lease_ms: 60_000,
            resume_window_ms: 30_000,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawQueue {
    max_running: usize,
    max_waiting: usize,
}

impl Default for RawQueue {
    fn default() -> Self {
        Self {
            max_running: 256,
            max_waiting: 1024,
        }
    }
}

/// The tenancy sections as written.
#[derive(Debug, Default)]
pub(crate) struct RawTenancy {
    pub auth: Option<RawAuth>,
    pub plans: BTreeMap<String, RawLimits>,
    pub tenants: BTreeMap<String, RawLimits>,
    pub state: RawState,
    pub idempotency: RawIdempotency,
    pub queue: RawQueue,
    pub spend: crate::spend::settings::RawSpend,
}

fn mode(value: Option<&str>, default: FailureMode, at: &str) -> Result<FailureMode, String> {
    match value {
        None => Ok(default),
        Some("open") => Ok(FailureMode::Open),
        Some("closed") => Ok(FailureMode::Closed),
        Some(other) => Err(format!("{at}: `{other}` is not `open` or `closed`")),
    }
}

impl RawTenancy {
    /// Validates; `builtin` is the built-in local default (authentication off unless asked).
    pub(crate) fn validate(self, base: &Path, builtin: bool) -> Result<TenancyConfig, String> {
        let mode_text = self.auth.as_ref().and_then(|a| a.mode.clone());
        let required = match mode_text.as_deref() {
            Some("required") => true,
            Some("none") => false,
            Some(other) => {
                return Err(format!("auth.mode: `{other}` is not `required` or `none`"));
            }
            None if self.auth.is_some() || !self.tenants.is_empty() => true,
            None if builtin => false,
            None => {
                return Err("auth: say who may call this gateway: configure [tenants] (and [auth]), or set [auth] mode = \"none\" to serve without authentication".into());
            }
        };
        let auth = self.auth.unwrap_or_default();
        if !required && (auth.keys_file.is_some() || auth.jwt.is_some() || !self.tenants.is_empty())
        {
            return Err("auth.mode is `none`, but tenants, keys or JWT are configured".into());
        }
        let mut directory = Directory::default();
        let env = |name: &str| std::env::var(name).ok();
        tenants(&self.plans, &self.tenants, &env, &mut directory)?;
        let jwt = auth.jwt.map(|j| jwt::verifier(j, base)).transpose()?;
        let keys_file = auth.keys_file.map(|f| base.join(f));
        if required && directory.keys.is_empty() && keys_file.is_none() && jwt.is_none() {
            return Err("auth: authentication is required but no keys, keys_file or jwt are configured, so every request would be refused".into());
        }
        let state = &self.state;
        let backend = match (state.backend.as_str(), &state.redis_url) {
            ("memory", _) => None,
            ("redis", Some(url)) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Some(url.clone())
            }
            ("redis", _) => {
                return Err("state.redis_url: set a redis:// URL for the redis backend".into());
            }
            (other, _) => {
                return Err(format!(
                    "state.backend: `{other}` is not `memory` or `redis`"
                ));
            }
        };
        let spend = self.spend.validate(base)?;
        if backend.is_none() && spend.journal.is_some() {
            return Err("spend.usage_journal: a journal ships records to Redis; set state.backend = \"redis\"".into());
        }
        if state.timeout_ms == 0 || state.lease_ms < 1000 {
            return Err("state: timeout_ms must be > 0 and lease_ms at least 1000".into());
        }
        let fm = &state.failure_mode;
        let failure = FailureModes {
            requests: mode(
                fm.requests.as_deref(),
                FailureMode::Open,
                "state.failure_mode.requests",
            )?,
            tokens: mode(
                fm.tokens.as_deref(),
                FailureMode::Open,
                "state.failure_mode.tokens",
            )?,
            concurrency: mode(
                fm.concurrency.as_deref(),
                FailureMode::Open,
                "state.failure_mode.concurrency",
            )?,
            idempotency: mode(
                fm.idempotency.as_deref(),
                FailureMode::Closed,
                "state.failure_mode.idempotency",
            )?,
        };
        let i = &self.idempotency;
        if i.ttl_secs == 0 || i.lease_ms < 1000 || i.max_record_bytes == 0 {
            return Err(
                "idempotency: ttl_secs and max_record_bytes must be > 0, lease_ms at least 1000"
                    .into(),
            );
        }
        if self.queue.max_running == 0 {
            return Err("queue.max_running must be greater than 0".into());
        }
        Ok(TenancyConfig {
            auth_required: required,
            directory,
            plans: self.plans,
            keys_file,
            reload_interval: Duration::from_millis(
                auth.reload_interval_ms.unwrap_or(2000).max(100),
            ),
            allow_empty_directory: auth.allow_empty_directory,
            jwt: jwt.map(|(j, fingerprint)| SharedJwt(Arc::new(j), fingerprint)),
            redis_url: backend,
            state_timeout: Duration::from_millis(state.timeout_ms),
            lease_ttl: Duration::from_millis(state.lease_ms),
            failure,
            memory: MemoryLimits {
                max_records: state.memory_max_records.max(1),
                max_bytes: state.memory_max_bytes.max(1),
            },
            idempotency: i.enabled.then(|| IdempotencySettings {
                ttl: Duration::from_secs(i.ttl_secs),
                join: i.join,
                max_record_bytes: i.max_record_bytes,
                lease: Duration::from_millis(i.lease_ms),
                resume_window: Duration::from_millis(i.resume_window_ms),
            }),
            queue: QueueLimits {
                max_running: self.queue.max_running,
                max_waiting: self.queue.max_waiting,
            },
            spend,
        })
    }
}
