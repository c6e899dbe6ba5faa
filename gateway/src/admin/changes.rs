//! The admin state ([`AdminDoc`]: plans, tenants and keys as a keys file holds them, and the
//! model map) and the changes the API makes to it. A change edits a copy; the service then
//! validates the whole copy the way the configuration is validated and commits it, so a change
//! that would leave an invalid state never lands.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::AdminError;
use crate::engine_host::ModelMap;
use crate::tenancy::keys;
use crate::tenancy::keys_file::{KeysDoc, StoredKey, format_time, parse_time};
use crate::tenancy::settings::RawLimits;

/// Everything the admin API manages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminDoc {
    /// Plans, tenants and keys.
    #[serde(default)]
    pub directory: KeysDoc,
    /// Aliases and shutdown dates.
    #[serde(default)]
    pub models: ModelMap,
}

/// A new key as the API takes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    /// Its tenant.
    pub tenant: String,
    /// Models it may use (all of its tenant's when absent).
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Endpoints it may call (all but `admin` when absent).
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    /// When it stops working (RFC 3339).
    #[serde(default)]
    pub expires: Option<String>,
    /// Its own spend budget.
    #[serde(default)]
    pub budget: Option<crate::spend::settings::RawBudget>,
}

/// One change.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Creates or replaces a plan.
    PutPlan(String, RawLimits),
    /// Removes a plan.
    DeletePlan(String),
    /// Creates or replaces a tenant.
    PutTenant(String, RawLimits),
    /// Removes a tenant and the keys the admin API made for it.
    DeleteTenant(String),
    /// Makes a key.
    CreateKey(KeySpec),
    /// Makes a key like `id`, which stops working after `grace`.
    RotateKey(String, Duration),
    /// Revokes a key.
    RevokeKey(String),
    /// Points an alias at a configured model id.
    PutAlias(String, String),
    /// Removes an alias.
    DeleteAlias(String),
    /// Announces a model's shutdown date.
    PutShutdownDate(String, String),
    /// Withdraws it.
    DeleteShutdownDate(String),
    /// Sets a model's (or alias's) prices, replacing the configuration's for it.
    PutPrices(String, Vec<crate::spend::settings::RawModelPrice>),
    /// Removes them (the configuration's apply again).
    DeletePrices(String),
}

/// What a change made that the caller needs to see once.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// Nothing beyond the new state.
    State,
    /// A new key: the whole key (shown once, never stored) and its record.
    Key(String, Box<StoredKey>),
}

/// Where a name the admin state lacks is defined instead, for a clear refusal.
pub trait Elsewhere {
    /// Whether the configuration or the keys file defines a tenant `name`.
    fn tenant(&self, name: &str) -> bool;
    /// Whether they define a key `id`.
    fn key(&self, id: &str) -> bool;
}

fn elsewhere(what: &str, name: &str) -> AdminError {
    AdminError::Conflict(format!(
        "{what} `{name}` is defined in the configuration or the keys file; change it there"
    ))
}

fn missing(what: &'static str, name: &str) -> AdminError {
    AdminError::NotFound {
        what,
        name: name.to_string(),
    }
}

impl Change {
    /// Its audit action name.
    pub fn action(&self) -> &'static str {
        match self {
            Self::PutPlan(..) => "plan.put",
            Self::DeletePlan(_) => "plan.delete",
            Self::PutTenant(..) => "tenant.put",
            Self::DeleteTenant(_) => "tenant.delete",
            Self::CreateKey(_) => "key.create",
            Self::RotateKey(..) => "key.rotate",
            Self::RevokeKey(_) => "key.revoke",
            Self::PutAlias(..) => "alias.put",
            Self::DeleteAlias(_) => "alias.delete",
            Self::PutShutdownDate(..) => "shutdown_date.put",
            Self::DeleteShutdownDate(_) => "shutdown_date.delete",
            Self::PutPrices(..) => "prices.put",
            Self::DeletePrices(_) => "prices.delete",
        }
    }

    /// What it acts on, for the audit log (a new key's target is filled in once made).
    pub fn target(&self) -> String {
        match self {
            Self::PutPlan(name, _)
            | Self::DeletePlan(name)
            | Self::PutTenant(name, _)
            | Self::DeleteTenant(name)
            | Self::RotateKey(name, _)
            | Self::RevokeKey(name)
            | Self::PutAlias(name, _)
            | Self::DeleteAlias(name)
            | Self::PutShutdownDate(name, _)
            | Self::DeleteShutdownDate(name)
            | Self::PutPrices(name, _)
            | Self::DeletePrices(name) => name.clone(),
            Self::CreateKey(spec) => spec.tenant.clone(),
        }
    }

    /// Applies the change to `doc` at `now` (Unix seconds).
    pub fn apply(
        &self,
        doc: &mut AdminDoc,
        now: i64,
        outside: &dyn Elsewhere,
    ) -> Result<Applied, AdminError> {
        let dir = &mut doc.directory;
        match self {
            Self::PutPlan(name, limits) | Self::PutTenant(name, limits) => {
                if limits.has_env_keys() {
                    return Err(AdminError::Invalid(format!(
                        "{name}.keys: the admin API gives keys with POST /admin/v1/keys, not environment variables"
                    )));
                }
                if matches!(self, Self::PutPlan(..)) {
                    dir.plans.insert(name.clone(), limits.clone());
                } else {
                    if outside.tenant(name) {
                        return Err(elsewhere("tenant", name));
                    }
                    dir.tenants.insert(name.clone(), limits.clone());
                }
            }
            Self::DeletePlan(name) => {
                dir.plans
                    .remove(name)
                    .ok_or_else(|| missing("plan", name))?;
            }
            Self::DeleteTenant(name) => {
                if dir.tenants.remove(name).is_none() {
                    return Err(if outside.tenant(name) {
                        elsewhere("tenant", name)
                    } else {
                        missing("tenant", name)
                    });
                }
                dir.keys.retain(|k| k.tenant != *name);
            }
            Self::CreateKey(spec) => {
                if let Some(expires) = &spec.expires {
                    parse_time(expires, "expires").map_err(AdminError::Invalid)?;
                }
                let (key, record) = new_key(
                    &spec.tenant,
                    spec.models.clone(),
                    spec.endpoints.clone(),
                    now,
                )?;
                let record = StoredKey {
                    expires: spec.expires.clone(),
                    budget: spec.budget.clone(),
                    ..record
                };
                dir.keys.push(record.clone());
                return Ok(Applied::Key(key, Box::new(record)));
            }
            Self::RotateKey(id, grace) => {
                let old = managed_key(dir, id, outside)?;
                if old.revoked {
                    return Err(AdminError::Conflict(format!(
                        "key {id} is revoked; create a new key instead"
                    )));
                }
                let grace_end =
                    now.saturating_add(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX));
                let ends = old
                    .expires
                    .as_deref()
                    .and_then(|t| parse_time(t, "expires").ok())
                    .map_or(grace_end, |at| at.min(grace_end));
                old.expires = Some(format_time(ends));
                let (tenant, models, endpoints) = (
                    old.tenant.clone(),
                    old.models.clone(),
                    old.endpoints.clone(),
                );
                let (key, record) = new_key(&tenant, models, endpoints, now)?;
                dir.keys.push(record.clone());
                return Ok(Applied::Key(key, Box::new(record)));
            }
            Self::RevokeKey(id) => managed_key(dir, id, outside)?.revoked = true,
            Self::PutAlias(alias, model) => {
                doc.models.aliases.insert(alias.clone(), model.clone());
            }
            Self::DeleteAlias(alias) => {
                doc.models
                    .aliases
                    .remove(alias)
                    .ok_or_else(|| missing("alias", alias))?;
                doc.models.shutdown_dates.remove(alias);
            }
            Self::PutShutdownDate(model, date) => {
                doc.models
                    .shutdown_dates
                    .insert(model.clone(), date.clone());
            }
            Self::DeleteShutdownDate(model) => {
                doc.models
                    .shutdown_dates
                    .remove(model)
                    .ok_or_else(|| missing("shutdown date of model", model))?;
            }
            Self::PutPrices(model, prices) => {
                doc.models.prices.insert(model.clone(), prices.clone());
            }
            Self::DeletePrices(model) => {
                doc.models
                    .prices
                    .remove(model)
                    .ok_or_else(|| missing("prices of model", model))?;
            }
        }
        Ok(Applied::State)
    }
}

fn managed_key<'a>(
    dir: &'a mut KeysDoc,
    id: &str,
    outside: &dyn Elsewhere,
) -> Result<&'a mut StoredKey, AdminError> {
    if let Some(key) = dir.keys.iter_mut().find(|k| k.id == id) {
        return Ok(key);
    }
    Err(if outside.key(id) {
        elsewhere("key", id)
    } else {
        missing("key", id)
    })
}

fn new_key(
    tenant: &str,
    models: Option<Vec<String>>,
    endpoints: Option<Vec<String>>,
    now: i64,
) -> Result<(String, StoredKey), AdminError> {
    let (key, id) = keys::generate()
        .map_err(|e| AdminError::Internal(format!("no randomness for a new key: {e}")))?;
    let record = StoredKey {
        hash: keys::hash_text(&keys::hash(&key)),
        id,
        tenant: tenant.to_string(),
        created: Some(format_time(now)),
        expires: None,
        models,
        endpoints,
        revoked: false,
        budget: None,
    };
    Ok((key, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Config;
    impl Elsewhere for Config {
        fn tenant(&self, name: &str) -> bool {
            name == "configured"
        }
        fn key(&self, id: &str) -> bool {
            id == "aaaaaaaaaaaa"
        }
    }

    fn tenant(doc: &mut AdminDoc, name: &str) {
        Change::PutTenant(name.into(), RawLimits::default())
            .apply(doc, 0, &Config)
            .unwrap();
    }

    #[test]
    fn a_rotated_key_ends_after_its_grace_and_keeps_its_scopes() {
        let mut doc = AdminDoc::default();
        tenant(&mut doc, "acme");
        let spec = KeySpec {
            tenant: "acme".into(),
            models: Some(vec!["sim".into()]),
            ..KeySpec::default()
        };
        let Applied::Key(first, old) = Change::CreateKey(spec)
            .apply(&mut doc, 100, &Config)
            .unwrap()
        else {
            panic!("no key made");
        };
        assert_eq!(keys::parse_id(&first).unwrap(), old.id);
        let rotate = Change::RotateKey(old.id.clone(), Duration::from_secs(60));
        let Applied::Key(_, new) = rotate.apply(&mut doc, 1000, &Config).unwrap() else {
            panic!("no key made");
        };
        assert_eq!(new.models, old.models);
        let old_now = doc.directory.keys.iter().find(|k| k.id == old.id).unwrap();
        assert_eq!(old_now.expires.as_deref(), Some(format_time(1060).as_str()));
        assert!(!doc.directory.keys.iter().any(|k| k.hash.contains(&first)));
    }

    #[test]
    fn names_defined_elsewhere_or_nowhere_are_refused_clearly() {
        let mut doc = AdminDoc::default();
        let err = |c: Change, doc: &mut AdminDoc| c.apply(doc, 0, &Config).unwrap_err();
        assert!(matches!(
            err(
                Change::PutTenant("configured".into(), RawLimits::default()),
                &mut doc
            ),
            AdminError::Conflict(_)
        ));
        assert!(matches!(
            err(Change::RevokeKey("aaaaaaaaaaaa".into()), &mut doc),
            AdminError::Conflict(_)
        ));
        assert!(matches!(
            err(Change::DeleteTenant("nobody".into()), &mut doc),
            AdminError::NotFound { .. }
        ));
        assert!(matches!(
            err(Change::DeleteAlias("x".into()), &mut doc),
            AdminError::NotFound { .. }
        ));
    }

    #[test]
    fn deleting_a_tenant_takes_its_keys() {
        let mut doc = AdminDoc::default();
        tenant(&mut doc, "acme");
        tenant(&mut doc, "beta");
        for t in ["acme", "beta"] {
            let spec = KeySpec {
                tenant: t.into(),
                ..KeySpec::default()
            };
            Change::CreateKey(spec).apply(&mut doc, 0, &Config).unwrap();
        }
        Change::DeleteTenant("acme".into())
            .apply(&mut doc, 0, &Config)
            .unwrap();
        assert_eq!(doc.directory.keys.len(), 1);
        assert_eq!(doc.directory.keys[0].tenant, "beta");
    }
}
