//! Charge plans: the budget counters a caller's requests are charged to, and what each is,
//! built once per caller and calendar day and shared by its requests. A counter's key names
//! its tenant, key and period (`tp:{acme}:sp:k:3f9a:d:20261201`), so building the lines means
//! formatting a dozen strings; a busy key would do that for every request of the day.
//!
//! A plan is found by the caller's key id (or tenant name) and used only while it still
//! describes the caller: the same tenant (a reload or an admin change makes a new one), the
//! same key budget, the same day. The table is bounded ([`MAX_PLANS`]); past it, it starts
//! again empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Principal, Tenant};
use crate::spend::budget::{Budget, Calendar, Line, charge_lines};
use crate::store::Tally;

/// Most plans kept (one per active key); past it the table is emptied.
pub(crate) const MAX_PLANS: usize = 4096;

/// What a caller's requests are charged to on one calendar day.
#[derive(Debug)]
pub(crate) struct ChargePlan {
    tenant: Arc<Tenant>,
    key: Option<String>,
    key_budget: Option<Budget>,
    /// The day it holds for: `[from, until)` in Unix seconds.
    from: i64,
    until: i64,
    /// The counters, each with its limit.
    pub(crate) tallies: Arc<[Tally]>,
    /// What each counter is, in the same order.
    pub(crate) lines: Arc<[Line]>,
}

impl ChargePlan {
    /// The plan of `p`'s requests at `now` (empty when neither its tenant nor its key has a
    /// budget).
    fn build(p: &Principal, now: i64) -> Self {
        let (mut tallies, mut lines) = (Vec::new(), Vec::new());
        let calendar = Calendar::at(now);
        let tenant = &p.tenant.name;
        let prefix = format!("tp:{{{tenant}}}:sp");
        if let Some(budget) = &p.tenant.plan.budget {
            let owner = format!("tenant `{tenant}`");
            charge_lines(&prefix, &owner, budget, &calendar, &mut tallies, &mut lines);
        }
        if let Some((budget, key)) = p.scopes.budget.as_ref().zip(p.key_id.as_ref()) {
            let (prefix, owner) = (format!("{prefix}:k:{key}"), format!("key `{key}`"));
            charge_lines(&prefix, &owner, budget, &calendar, &mut tallies, &mut lines);
        }
        let (from, until) = calendar.day_span();
        Self {
            tenant: Arc::clone(&p.tenant),
            key: p.key_id.clone(),
            key_budget: p.scopes.budget,
            from,
            until,
            tallies: tallies.into(),
            lines: lines.into(),
        }
    }

    /// Whether it is still the plan of `p` at `now`.
    fn fits(&self, p: &Principal, now: i64) -> bool {
        Arc::ptr_eq(&self.tenant, &p.tenant)
            && self.key == p.key_id
            && self.key_budget == p.scopes.budget
            && (self.from..self.until).contains(&now)
    }
}

/// The plans in use, by key id (or tenant name for a caller without one).
#[derive(Debug, Default)]
pub(crate) struct ChargePlans {
    plans: Mutex<HashMap<String, Arc<ChargePlan>>>,
}

impl ChargePlans {
    /// The plan of `p`'s requests at `now`, or `None` when nothing it does is budgeted.
    pub(crate) fn of(&self, p: &Principal, now: i64) -> Option<Arc<ChargePlan>> {
        if p.tenant.plan.budget.is_none() && (p.scopes.budget.is_none() || p.key_id.is_none()) {
            return None;
        }
        let name = p.key_id.as_deref().unwrap_or(&p.tenant.name);
        // A plan is replaced whole; a poisoned lock still holds whole plans.
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(plan) = plans.get(name)
            && plan.fits(p, now)
        {
            return Some(Arc::clone(plan));
        }
        let plan = Arc::new(ChargePlan::build(p, now));
        if plans.len() >= MAX_PLANS && !plans.contains_key(name) {
            plans.clear();
        }
        plans.insert(name.to_string(), Arc::clone(&plan));
        crate::observability::metrics::charge_plans(plans.len());
        Some(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spend::Money;
    use crate::tenancy::{Plan, Scopes};

    fn principal(tenant: &Arc<Tenant>, key: &str, budget: Option<Budget>) -> Principal {
        Principal {
            tenant: Arc::clone(tenant),
            key_id: Some(key.into()),
            scopes: Scopes {
                budget,
                ..Scopes::default()
            },
        }
    }

    fn tenant(per_day: u64) -> Arc<Tenant> {
        Arc::new(Tenant {
            name: "acme".into(),
            plan: Plan {
                budget: Some(Budget {
                    per_day: Some(Money(per_day)),
                    ..Budget::default()
                }),
                ..Plan::default()
            },
        })
    }

    #[test]
    fn a_plan_is_shared_within_a_day_and_rebuilt_when_its_caller_changes() {
        let plans = ChargePlans::default();
        let acme = tenant(5);
        let key_budget = Some(Budget {
            total: Some(Money(9)),
            ..Budget::default()
        });
        // 2026-12-01T10:00:00Z and later that day.
        let (morning, evening, tomorrow) = (1_796_119_200, 1_796_158_800, 1_796_169_600);
        let first = plans.of(&principal(&acme, "k1", key_budget), morning);
        let first = first.expect("a budgeted caller has a plan");
        assert_eq!(first.tallies.len(), 2);
        assert_eq!(first.tallies[0].key, "tp:{acme}:sp:d:20261201");
        assert_eq!(first.tallies[1].key, "tp:{acme}:sp:k:k1:t");
        assert_eq!(first.lines[1].owner, "key `k1`");
        let again = plans.of(&principal(&acme, "k1", key_budget), evening);
        assert!(Arc::ptr_eq(&first, &again.expect("still budgeted")));
        // A new day, a changed tenant, a changed key budget: each builds anew.
        let next = plans.of(&principal(&acme, "k1", key_budget), tomorrow);
        assert_eq!(
            next.expect("budgeted").tallies[0].key,
            "tp:{acme}:sp:d:20261202"
        );
        let raised = tenant(7);
        let changed = plans.of(&principal(&raised, "k1", key_budget), tomorrow);
        assert_eq!(changed.expect("budgeted").tallies[0].limit, Some(7));
        let keyless = plans.of(&principal(&raised, "k1", None), tomorrow);
        assert_eq!(keyless.expect("the tenant is budgeted").tallies.len(), 1);
        // Nothing budgeted: no plan.
        let free = Arc::new(Tenant {
            name: "free".into(),
            plan: Plan::default(),
        });
        assert!(plans.of(&principal(&free, "k2", None), morning).is_none());
    }
}
