//! The two phases of a budget: [`charge`] holds a request's most possible cost against every
//! budget counter it counts toward, or refuses it; the [`SpendHold`] it returns settles the
//! actual cost when the request ends (billed from its final usage, or, when it ends early,
//! from the tokens recorded so far) and gives the rest back. The same hold writes the
//! request's usage record as it settles, in one store step with the refund and the request's
//! unused tokens ([`Settlement`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::budget::Line;
use super::prices::Price;
use super::usage::{Outcome, RecordContext};
use super::{Money, Usage};
use crate::error::BudgetExceeded;
use crate::observability::metrics;
use crate::store::{GiveBack, Record, Refund, Settlement, Store, StoreError, Tally};

/// A request's cost held against its budgets.
#[derive(Debug)]
pub struct SpendHold {
    store: Arc<dyn Store>,
    /// The counters it is held on (none: it holds nothing).
    tallies: Option<Arc<[Tally]>>,
    tenant: String,
    price: Option<Price>,
    held: Money,
    prompt: AtomicU64,
    generated: AtomicU64,
    failed: AtomicBool,
    settled: bool,
    /// The request's usage record, when records are kept, and whether the log keeps it for
    /// export.
    record: Option<(Box<RecordContext>, bool)>,
    /// The soft threshold a charge passed: "tenant `acme`'s daily budget: 4.20 of 5.00 USD".
    pub warning: Option<String>,
}

/// What a charge is for.
#[derive(Debug, Clone)]
pub struct ChargeRequest {
    /// The tenant (metrics and logs).
    pub tenant: String,
    /// The counters, each with its limit.
    pub tallies: Arc<[Tally]>,
    /// What each counter is, in the same order.
    pub lines: Arc<[Line]>,
    /// The request's price.
    pub price: Price,
    /// Its most possible cost.
    pub most: Money,
    /// The currency's name, for messages.
    pub currency: String,
}

fn rfc3339(unix: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()?
        .format(&Rfc3339)
        .ok()
}

/// Holds `ask.most` against every counter, or refuses with the first budget it would pass.
pub async fn charge(
    store: &Arc<dyn Store>,
    ask: ChargeRequest,
    now: i64,
) -> Result<Result<SpendHold, BudgetExceeded>, StoreError> {
    let ChargeRequest {
        tenant,
        tallies,
        lines,
        price,
        most,
        currency,
    } = ask;
    let charged = if tallies.is_empty() {
        None
    } else {
        Some(store.charge(&tallies, most.0).await?)
    };
    if let Some(charge) = &charged
        && let Some(i) = charge.refused_by(&tallies, most.0)
    {
        let line = &lines[i];
        metrics::budget_refused(&tenant, line.period.as_str());
        let resets_at = line.resets_at.and_then(rfc3339);
        let retry_after = line
            .resets_at
            .map(|at| std::time::Duration::from_secs(u64::try_from(at - now).unwrap_or(0)));
        return Ok(Err(BudgetExceeded {
            budget: format!("{}'s {} budget", line.owner, line.period.as_str()),
            limit: format!("{} {currency}", line.limit),
            spent: format!("{} {currency}", Money(charge.totals[i])),
            requested: format!("{most} {currency}"),
            resets_at,
            retry_after,
        }));
    }
    let warning = charged.as_ref().and_then(|charge| {
        lines.iter().zip(&charge.totals).find_map(|(line, &total)| {
            let soft = line.soft?;
            (total >= soft.0).then(|| {
                format!(
                    "{}'s {} budget: {} of {} {currency}",
                    line.owner,
                    line.period.as_str(),
                    Money(total),
                    line.limit
                )
            })
        })
    });
    if let Some(w) = &warning {
        tracing::warn!(tenant, warning = %w, "a budget passed its soft threshold");
    }
    let mut hold = SpendHold::unbudgeted(store, &tenant, Some(price));
    if charged.is_some() {
        (hold.tallies, hold.held, hold.warning) = (Some(tallies), most, warning);
    }
    Ok(Ok(hold))
}

impl SpendHold {
    /// A hold on no budget: it only prices the usage (an unpriced model, no budget, or a store
    /// that failed open).
    pub fn unbudgeted(store: &Arc<dyn Store>, tenant: &str, price: Option<Price>) -> Self {
        Self {
            store: Arc::clone(store),
            tallies: None,
            tenant: tenant.to_string(),
            price,
            held: Money(0),
            prompt: AtomicU64::new(0),
            generated: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            settled: false,
            record: None,
            warning: None,
        }
    }

    /// The same hold, writing `context`'s usage record as it settles (`export`: the log keeps
    /// it for the export file).
    #[must_use]
    pub fn recorded(mut self, context: RecordContext, export: bool) -> Self {
        self.record = Some((Box::new(context), export));
        self
    }

    /// Marks the request as failed (its error was sent): its record says so.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Records the tokens used so far, for a settle on drop (the request ended early).
    pub fn record(&self, prompt: u64, generated: u64) {
        self.prompt.store(prompt, Ordering::Relaxed);
        self.generated.store(generated, Ordering::Relaxed);
    }

    /// Settles with the cost of `usage` (returned when the model has a price), in the same
    /// store step as `give_back` (the request's unused tokens), and gives that step to await
    /// when it writes a usage record, so a response is complete only once its record is.
    pub fn bill(
        mut self,
        usage: Usage,
        give_back: Option<GiveBack>,
    ) -> (Option<Money>, Option<RecordWrite>) {
        let cost = self.price.map(|p| p.cost(usage));
        let write = self.settle(usage, Outcome::Finished, give_back);
        (cost, write)
    }

    /// Gives back all that was held and writes no record: the request was refused by another
    /// limit after its cost was held.
    pub fn release(mut self) {
        self.record = None;
        if let Some(write) = self.settle(Usage::default(), Outcome::Cancelled, None) {
            spawn(write);
        }
    }

    fn settle(
        &mut self,
        usage: Usage,
        outcome: Outcome,
        give_back: Option<GiveBack>,
    ) -> Option<RecordWrite> {
        let mut settlement = Settlement {
            give_back,
            ..Settlement::default()
        };
        if !self.settled {
            self.settled = true;
            let cost = self.price.map_or(Money(0), |p| p.cost(usage));
            settlement.record = self.record.take().map(|(context, keep_log)| Record {
                entry: context.entry(
                    usage,
                    cost,
                    outcome,
                    crate::clock::unix_now() as i64,
                    keep_log,
                ),
                keep_log,
            });
            settlement.refund = self.refund_of(cost);
        }
        if settlement.is_empty() {
            return None;
        }
        let recorded = settlement.record.is_some();
        let store = Arc::clone(&self.store);
        let write = Box::pin(async move {
            if let Err(e) = store.settle(settlement).await {
                metrics::state_error(if recorded { "usage" } else { "spend" });
                tracing::warn!(error = %e, recorded, "cannot settle a request with the state store");
            }
        });
        if recorded {
            return Some(write);
        }
        spawn(write);
        None
    }

    /// What goes back to the budgets once the request cost `cost`. One that cost more than
    /// was held (an engine that passed its budget) is charged the difference: counted, never
    /// refused.
    fn refund_of(&mut self, cost: Money) -> Option<Refund> {
        if cost.0 > 0 {
            metrics::spent(&self.tenant, cost.0);
        }
        if cost == self.held {
            return None;
        }
        let (tallies, held) = (self.tallies.take()?, self.held);
        if cost < held {
            return Some(Refund {
                tallies,
                amount: held.0 - cost.0,
            });
        }
        let tallies: Vec<Tally> = tallies
            .iter()
            .map(|t| Tally {
                limit: None,
                ..t.clone()
            })
            .collect();
        let store = Arc::clone(&self.store);
        spawn(async move {
            if let Err(e) = store.charge(&tallies, cost.0 - held.0).await {
                metrics::state_error("spend");
                tracing::warn!(error = %e, held = held.0, cost = cost.0, "cannot settle a spend hold");
            }
        });
        None
    }
}

impl Drop for SpendHold {
    fn drop(&mut self) {
        let usage = Usage {
            prompt: self.prompt.load(Ordering::Relaxed),
            completion: self.generated.load(Ordering::Relaxed),
            ..Usage::default()
        };
        let outcome = if self.failed.load(Ordering::Relaxed) {
            Outcome::Failed
        } else {
            Outcome::Cancelled
        };
        if let Some(write) = self.settle(usage, outcome, None) {
            spawn(write);
        }
    }
}

/// The write of a usage record (it logs its own failure).
pub type RecordWrite = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `f` on the current runtime, if there is one (drops can happen outside it at shutdown):
/// how a hold dropped in synchronous code settles with the store.
pub(crate) fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(f);
    }
}
