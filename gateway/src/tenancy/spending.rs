//! The tenancy's side of spend: which budgets a caller's request counts toward (its tenant's
//! and its key's), the price of the model it called, and the hold admission takes on them
//! (see [`crate::spend`] for the two phases).

use std::sync::Arc;

use super::Caller;
use super::service::Tenancy;
use crate::error::ApiError;
use crate::spend::hold::{ChargeRequest, SpendHold, charge};
use crate::spend::prices::Price;
use crate::spend::settings::SpendConfig;
use crate::spend::usage::RecordContext;

impl Tenancy {
    /// Prices and the currency in force.
    pub fn spend(&self) -> Arc<SpendConfig> {
        Arc::clone(
            &self
                .spend_config()
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The price in effect now of a model called `asked` and served as `id`.
    pub fn price(&self, asked: &str, id: &str) -> Option<Price> {
        let spend = self.spend();
        if spend.prices.is_empty() {
            return None;
        }
        spend.prices.price([asked, id], now())
    }

    /// The hold that prices a request and writes its usage record (none when its model has
    /// no price and records are off).
    pub(super) async fn hold_spend(
        &self,
        caller: &Caller,
        price: Option<Price>,
        prompt: u64,
        most_new: u64,
        record: RecordContext,
    ) -> Result<Option<SpendHold>, ApiError> {
        let spend = self.spend();
        let hold = match price {
            Some(price) => {
                self.charge_budgets(caller, price, prompt, most_new, &spend.currency)
                    .await?
            }
            None if spend.records => {
                SpendHold::unbudgeted(self.store(), &caller.principal.tenant.name, None)
            }
            None => return Ok(None),
        };
        Ok(Some(if spend.records {
            hold.recorded(record, spend.export.is_some())
        } else {
            hold
        }))
    }

    /// Holds the most a request of `prompt` tokens that may make `most_new` can cost against
    /// the caller's budgets, or refuses it (429 `budget_exceeded`). When the store fails the
    /// token limits' failure mode decides, and an open failure holds nothing.
    async fn charge_budgets(
        &self,
        caller: &Caller,
        price: Price,
        prompt: u64,
        most_new: u64,
        currency: &str,
    ) -> Result<SpendHold, ApiError> {
        let p = &caller.principal;
        let tenant = &p.tenant.name;
        let now = now();
        let store = self.store();
        let Some(plan) = self.charge_plans().of(p, now) else {
            return Ok(SpendHold::unbudgeted(store, tenant, Some(price)));
        };
        let ask = ChargeRequest {
            tenant: tenant.clone(),
            tallies: Arc::clone(&plan.tallies),
            lines: Arc::clone(&plan.lines),
            price,
            most: price.most(prompt, most_new),
            currency: currency.to_string(),
        };
        match charge(store, ask, now).await {
            Ok(Ok(hold)) => {
                if let Some(warning) = &hold.warning {
                    caller.report(|r| r.budget_warning = Some(warning.clone()));
                }
                Ok(hold)
            }
            Ok(Err(refusal)) => Err(ApiError::BudgetExceeded(Box::new(refusal))),
            Err(e) => {
                self.limiter
                    .on_failure("spend", self.limiter.modes().tokens, &e)?;
                Ok(SpendHold::unbudgeted(store, tenant, Some(price)))
            }
        }
    }
}

fn now() -> i64 {
    i64::try_from(crate::clock::unix_now()).unwrap_or(i64::MAX)
}
