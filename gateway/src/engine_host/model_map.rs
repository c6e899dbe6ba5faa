//! The admin API's layer over the configured model namespace: more aliases (each naming a
//! configured id, such as a pinned `name-YYYY-MM-DD`, so clients can be moved between versions
//! without a restart), announced shutdown dates, and prices (a model's list here replaces the
//! configuration's `[[spend.prices]]` for it). It is plain data, checked against the
//! registry's configured ids, and swapped whole: a request resolves its model once, against one
//! map.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::settings::{MODEL_ID_RULE, is_date, is_model_id};
use crate::spend::prices::PriceTable;
use crate::spend::settings::{RawModelPrice, price_table};

/// Aliases and shutdown dates set while serving.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelMap {
    /// Alias → the configured id it names.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aliases: BTreeMap<String, String>,
    /// Public id (configured or alias) → `YYYY-MM-DD` it stops being served, shown as
    /// `shutdown_date`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shutdown_dates: BTreeMap<String, String>,
    /// Public id (configured or alias) → its prices, each from its effective time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Vec<RawModelPrice>>,
    /// `prices`, validated (set by the registry as it installs the map).
    #[serde(skip)]
    pub price_table: Arc<PriceTable>,
}

impl ModelMap {
    /// Why the map cannot stand over the configured ids `configured`, if it cannot.
    pub fn check(&self, configured: &dyn Fn(&str) -> bool) -> Result<(), String> {
        for (alias, target) in &self.aliases {
            let at = format!("models.aliases.{alias}");
            if !is_model_id(alias) {
                return Err(format!(
                    "{at}: `{alias}` is not a usable model name ({MODEL_ID_RULE})"
                ));
            }
            if configured(alias) {
                return Err(format!(
                    "{at}: `{alias}` is a configured model id; an alias cannot replace it"
                ));
            }
            if !configured(target) {
                return Err(format!(
                    "{at}: no configured model `{target}` (an alias names a configured id, not another alias)"
                ));
            }
        }
        for (id, date) in &self.shutdown_dates {
            let at = format!("models.shutdown_dates.{id}");
            if !configured(id) && !self.aliases.contains_key(id) {
                return Err(format!("{at}: no model or alias `{id}`"));
            }
            if !is_date(date) {
                return Err(format!("{at}: `{date}` is not a date like 2027-01-31"));
            }
        }
        for id in self.prices.keys() {
            if !configured(id) && !self.aliases.contains_key(id) {
                return Err(format!("models.prices.{id}: no model or alias `{id}`"));
            }
        }
        self.compile_prices().map(drop)
    }

    /// The prices as a table, or why one is invalid (named by its place).
    pub fn compile_prices(&self) -> Result<PriceTable, String> {
        price_table(self.prices.iter(), "models.prices")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(aliases: &[(&str, &str)], dates: &[(&str, &str)]) -> ModelMap {
        let own = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        ModelMap {
            aliases: own(aliases),
            shutdown_dates: own(dates),
            ..ModelMap::default()
        }
    }

    #[test]
    fn aliases_name_configured_ids_only() {
        let configured = |id: &str| matches!(id, "sim" | "sim-2026-01-01");
        assert!(
            map(&[("stable", "sim-2026-01-01")], &[("stable", "2027-01-31")])
                .check(&configured)
                .is_ok()
        );
        let errors = [
            map(&[("sim", "sim-2026-01-01")], &[]),
            map(&[("x", "nope")], &[]),
            map(&[("x", "sim"), ("y", "x")], &[]),
            map(&[("bad name", "sim")], &[]),
            map(&[], &[("nope", "2027-01-31")]),
            map(&[], &[("sim", "2027-02-30")]),
        ];
        for m in errors {
            assert!(m.check(&configured).is_err(), "{m:?}");
        }
    }
}
