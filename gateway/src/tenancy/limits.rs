//! Per-tenant limits on a [`Store`]: request rates (counted on arrival), token budgets
//! (reserved before dispatch as exact prompt tokens plus the most the request may generate,
//! settled with what it used when it ends, however it ends) and concurrent generations (a lease
//! held for the generation's life). Holds give themselves back when dropped, so every path
//! (finish, error, cancel, client disconnect) returns what it took.
//!
//! When the store fails, each feature follows its configured [`FailureMode`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{ApiError, LimitKind, RateLimited};
use crate::observability::metrics;
use crate::spend::hold::spawn;
use crate::store::{GiveBack, Level, Store, StoreError, Take, Window};

use super::Principal;

pub use crate::store::{FailureMode, FailureModes};

/// The limit levels a request saw, sent back as `x-ratelimit-*` headers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitReport {
    /// The tightest request-rate window.
    pub requests: Option<Level>,
    /// The tightest token window.
    pub tokens: Option<Level>,
    /// Place in the model's queue on arrival, when it had to wait.
    pub queue_position: Option<usize>,
    /// For a routed model, the route and engine that took it (`x-turnpike-route`).
    pub route: Option<String>,
    /// The settled cost (`x-turnpike-cost`), once known before the response's head is sent.
    pub cost: Option<crate::spend::Money>,
    /// A budget past its soft threshold (`x-turnpike-budget-warning`).
    pub budget_warning: Option<String>,
}

/// Limits of every tenant, on one store.
#[derive(Debug, Clone)]
pub struct Limiter {
    store: Arc<dyn Store>,
    modes: FailureModes,
    lease_ttl: Duration,
    retry_after: Duration,
}

/// The level with the least room left, relative to its capacity.
fn tightest(levels: &[Level]) -> Option<Level> {
    levels.iter().copied().min_by(|a, b| {
        let ra = a.remaining as f64 / a.window.capacity.max(1) as f64;
        let rb = b.remaining as f64 / b.window.capacity.max(1) as f64;
        ra.total_cmp(&rb)
            .then(a.window.period.cmp(&b.window.period))
    })
}

fn refusal(kind: LimitKind, take: &Take, tenant: &str, amount: u64) -> ApiError {
    metrics::rate_limited(tenant, kind.as_str());
    // The window that refused: the one with too little room.
    let level = take
        .levels
        .iter()
        .copied()
        .filter(|l| l.remaining < amount || amount > l.window.capacity)
        .min_by_key(|l| l.window.period)
        .or_else(|| tightest(&take.levels));
    ApiError::RateLimited(Box::new(RateLimited {
        kind,
        limit: level.map_or(0, |l| l.window.capacity),
        period: level.map_or(Duration::ZERO, |l| l.window.period),
        requested: amount,
        retry_after: take.retry_after,
        never: take.never,
    }))
}

impl Limiter {
    /// Limits on `store`; leases of concurrent generations last `lease_ttl` unless renewed.
    pub fn new(
        store: Arc<dyn Store>,
        modes: FailureModes,
        lease_ttl: Duration,
        retry_after: Duration,
    ) -> Self {
        Self {
            store,
            modes,
            lease_ttl,
            retry_after,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The failure modes.
    pub fn modes(&self) -> FailureModes {
        self.modes
    }

    /// What `retry-after` says when a limit or queue refuses.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// Counts one request against the caller's request-rate windows.
    pub async fn hit(&self, p: &Principal, report: &mut LimitReport) -> Result<(), ApiError> {
        let windows = &p.tenant.plan.requests;
        if windows.is_empty() {
            return Ok(());
        }
        let key = format!("tp:{{{}}}:rq", p.tenant.name);
        match self.store.hit(&key, windows).await {
            Ok(take) => {
                report.requests = tightest(&take.levels);
                if take.allowed {
                    Ok(())
                } else {
                    Err(refusal(LimitKind::Requests, &take, &p.tenant.name, 1))
                }
            }
            Err(e) => self.on_failure("requests", self.modes.requests, &e),
        }
    }

    /// What a failed store means for `feature` under `mode`: nothing (open) or a 503.
    pub(super) fn on_failure(
        &self,
        feature: &'static str,
        mode: FailureMode,
        e: &StoreError,
    ) -> Result<(), ApiError> {
        metrics::state_error(feature);
        tracing::warn!(feature, error = %e, mode = ?mode, "state store failed");
        match mode {
            FailureMode::Open => Ok(()),
            FailureMode::Closed => Err(ApiError::StateUnavailable {
                detail: e.to_string(),
                retry_after: self.retry_after,
            }),
        }
    }

    /// Reserves `amount` tokens; the hold gives back what goes unused.
    pub async fn reserve(
        &self,
        p: &Principal,
        amount: u64,
        report: &mut LimitReport,
    ) -> Result<Option<TokenHold>, ApiError> {
        let windows = p.tenant.plan.tokens.clone();
        if windows.is_empty() {
            return Ok(None);
        }
        let key = format!("tp:{{{}}}:tk", p.tenant.name);
        match self.store.take(&key, &windows, amount).await {
            Ok(take) => {
                report.tokens = tightest(&take.levels);
                if !take.allowed {
                    return Err(refusal(LimitKind::Tokens, &take, &p.tenant.name, amount));
                }
                Ok(Some(TokenHold {
                    store: Arc::clone(&self.store),
                    key,
                    windows,
                    reserved: amount,
                    used: AtomicU64::new(0),
                    settled: false,
                }))
            }
            Err(e) => self
                .on_failure("tokens", self.modes.tokens, &e)
                .map(|()| None),
        }
    }

    /// Holds one of the caller's concurrent-generation leases.
    pub async fn acquire(&self, p: &Principal) -> Result<Option<StreamPermit>, ApiError> {
        let Some(limit) = p.tenant.plan.concurrent else {
            return Ok(None);
        };
        let key = format!("tp:{{{}}}:cc", p.tenant.name);
        let lease = crate::ids::new_id("lease-");
        match self
            .store
            .acquire(&key, &lease, limit, self.lease_ttl)
            .await
        {
            Ok(true) => Ok(Some(StreamPermit::new(
                Arc::clone(&self.store),
                key,
                lease,
                self.lease_ttl,
            ))),
            Ok(false) => {
                metrics::rate_limited(&p.tenant.name, LimitKind::Concurrency.as_str());
                Err(ApiError::RateLimited(Box::new(RateLimited {
                    kind: LimitKind::Concurrency,
                    limit,
                    period: Duration::ZERO,
                    requested: 1,
                    retry_after: self.retry_after,
                    never: limit == 0,
                })))
            }
            Err(e) => self
                .on_failure("concurrency", self.modes.concurrency, &e)
                .map(|()| None),
        }
    }
}

/// Reserved tokens; settles on [`TokenHold::settle`] or, with what was recorded, on drop.
#[derive(Debug)]
pub struct TokenHold {
    store: Arc<dyn Store>,
    key: String,
    windows: Vec<Window>,
    reserved: u64,
    used: AtomicU64,
    settled: bool,
}

impl TokenHold {
    /// Records tokens used so far (prompt and generated), for a settle on drop.
    pub fn record(&self, used: u64) {
        self.used.store(used, Ordering::Relaxed);
    }

    /// Gives back what `used` left of the reservation.
    pub fn settle(mut self, used: u64) {
        self.used.store(used, Ordering::Relaxed);
        self.give_back();
    }

    /// What `used` left of the reservation, for the caller to give back as part of a larger
    /// settlement (the hold is settled: dropping it gives nothing back).
    pub fn into_give_back(mut self, used: u64) -> Option<GiveBack> {
        self.used.store(used, Ordering::Relaxed);
        self.unused()
    }

    fn unused(&mut self) -> Option<GiveBack> {
        if self.settled {
            return None;
        }
        self.settled = true;
        let unused = self
            .reserved
            .saturating_sub(self.used.load(Ordering::Relaxed));
        (unused > 0).then(|| GiveBack {
            key: std::mem::take(&mut self.key),
            windows: std::mem::take(&mut self.windows),
            amount: unused,
        })
    }

    fn give_back(&mut self) {
        let Some(give_back) = self.unused() else {
            return;
        };
        let store = Arc::clone(&self.store);
        spawn(async move {
            let (key, unused) = (give_back.key.clone(), give_back.amount);
            if let Err(e) = store.settle(give_back.into()).await {
                metrics::state_error("tokens");
                tracing::warn!(error = %e, key, unused, "cannot give back unused tokens");
            }
        });
    }
}

impl Drop for TokenHold {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// A concurrent-generation lease, renewed while held and returned on drop.
#[derive(Debug)]
pub struct StreamPermit {
    store: Arc<dyn Store>,
    key: String,
    lease: String,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl StreamPermit {
    fn new(store: Arc<dyn Store>, key: String, lease: String, ttl: Duration) -> Self {
        let renewer = store.shared().then(|| {
            let (store, key, lease) = (Arc::clone(&store), key.clone(), lease.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(ttl / 3);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if let Err(e) = store.renew(&key, &lease, ttl).await {
                        tracing::warn!(error = %e, key, "cannot renew a concurrency lease");
                    }
                }
            })
        });
        metrics::active_leases(1.0);
        Self {
            store,
            key,
            lease,
            renewer,
        }
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        metrics::active_leases(-1.0);
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let (store, key, lease) = (
            Arc::clone(&self.store),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.lease),
        );
        spawn(async move {
            if let Err(e) = store.release(&key, &lease).await {
                // The lease lapses by itself after its time to live.
                metrics::state_error("concurrency");
                tracing::warn!(error = %e, key, "cannot release a concurrency lease");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::{MemoryLimits, MemoryStore};
    use crate::tenancy::{Plan, Scopes, Tenant};

    fn principal(plan: Plan) -> Principal {
        Principal {
            tenant: Arc::new(Tenant {
                name: "acme".into(),
                plan,
            }),
            key_id: None,
            scopes: Scopes::default(),
        }
    }

    fn limiter() -> Limiter {
        let store = Arc::new(MemoryStore::new(MemoryLimits {
            max_records: 10,
            max_bytes: 1000,
        }));
        let open = FailureMode::Open;
        Limiter::new(
            store,
            FailureModes {
                requests: open,
                tokens: open,
                concurrency: open,
                idempotency: open,
            },
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
    }

    #[tokio::test]
    async fn request_rates_refuse_past_the_burst() {
        let l = limiter();
        let p = principal(Plan {
            requests: Plan::windows(Some(3), None, Some(100)),
            ..Plan::default()
        });
        let mut report = LimitReport::default();
        for _ in 0..3 {
            l.hit(&p, &mut report).await.unwrap();
        }
        let err = l.hit(&p, &mut report).await.unwrap_err();
        let ApiError::RateLimited(r) = err else {
            panic!("{err:?}")
        };
        assert_eq!((r.kind, r.limit), (LimitKind::Requests, 3));
        assert!(r.retry_after > Duration::ZERO && r.retry_after <= Duration::from_secs(1));
        assert!(!r.never);
    }

    #[tokio::test]
    async fn tokens_are_reserved_and_unused_ones_come_back() {
        let l = limiter();
        let p = principal(Plan {
            tokens: Plan::windows(None, Some(1000), None),
            ..Plan::default()
        });
        let mut report = LimitReport::default();
        let hold = l.reserve(&p, 800, &mut report).await.unwrap().unwrap();
        assert!(report.tokens.unwrap().remaining <= 200);
        assert!(l.reserve(&p, 300, &mut report).await.is_err());
        hold.settle(100); // 700 come back
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        let again = l.reserve(&p, 800, &mut report).await.unwrap().unwrap();
        drop(again); // nothing recorded: everything comes back
        tokio::time::sleep(Duration::from_millis(10)).await;
        let err = l.reserve(&p, 5000, &mut report).await.unwrap_err();
        let ApiError::RateLimited(r) = err else {
            panic!("{err:?}")
        };
        assert!(r.never, "more than the capacity can never fit");
    }

    #[tokio::test]
    async fn concurrency_permits_come_back_on_drop() {
        let l = limiter();
        let p = principal(Plan {
            concurrent: Some(2),
            ..Plan::default()
        });
        let a = l.acquire(&p).await.unwrap();
        let _b = l.acquire(&p).await.unwrap();
        assert!(l.acquire(&p).await.is_err());
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(l.acquire(&p).await.unwrap().is_some());
    }
}
