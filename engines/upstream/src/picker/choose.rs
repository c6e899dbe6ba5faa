//! How the picker chooses: the servers a request may go to (the proxy's subset hint, breakers
//! closed), then the upstream plugin's own policy over them ([`crate::pool`]: prefix affinity
//! by rendezvous hashing, else the less loaded of two), avoiding servers that report themselves
//! busy (waiting queue or KV-cache use at their limits) while others are not. When every
//! server is busy, a tenant that already holds more than its fair share of the requests in
//! flight is shed (429) and the others still go to the least busy server. Fallbacks follow
//! the first choice in the same order the policy would take after it failed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cached::CacheView;
use crate::pool::{Pool, Replica};

use super::settings::Settings;

/// What a server last reported about its load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Reported {
    /// `vllm:num_requests_waiting`.
    pub waiting: f64,
    /// `vllm:kv_cache_usage_perc` (or `gpu_cache_usage_perc`), 0..1.
    pub kv_cache: f64,
}

/// What one request asks for.
#[derive(Debug, Default)]
pub(crate) struct Ask {
    /// The prompt as units for affinity (token ids, or four bytes of text each).
    pub prompt: Vec<u32>,
    /// Whether `prompt` is token ids (which KV events can be matched against).
    pub token_ids: bool,
    /// The proxy's subset hint: only these base URLs (`None`: any).
    pub subset: Option<Vec<String>>,
    /// Who asks (`x-gateway-inference-fairness-id`), for fairness when every server is busy.
    pub tenant: String,
}

/// The answer.
#[derive(Debug)]
pub(crate) enum Choice {
    /// The first server, then the fallbacks, in order.
    Route(Vec<Arc<Replica>>),
    /// No server may take it (503).
    Unavailable,
    /// Every server is busy and this tenant holds more than its share (429).
    Shed,
}

/// The picker's state: the pool, what the servers report, and who has what in flight.
#[derive(Debug)]
pub(crate) struct Picker {
    pub settings: Settings,
    pub pool: Pool,
    /// The servers' caches as their KV events tell (`kv_events`).
    pub cache_view: Option<Arc<CacheView>>,
    reported: Mutex<HashMap<String, Reported>>,
    tenants: Mutex<HashMap<String, u32>>,
    pub routed: AtomicU64,
    pub shed: AtomicU64,
    pub unavailable: AtomicU64,
}

impl Picker {
    pub(crate) fn new(settings: Settings, urls: &[String]) -> Self {
        Self {
            pool: Pool::new(
                urls,
                settings.affinity_tokens,
                settings.affinity_max_imbalance,
            ),
            cache_view: settings
                .kv_events
                .clone()
                .map(|k| Arc::new(CacheView::new(k))),
            settings,
            reported: Mutex::default(),
            tenants: Mutex::default(),
            routed: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
        }
    }

    /// Records what `url` reported.
    pub(crate) fn report(&self, url: &str, reported: Reported) {
        self.reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(url.to_string(), reported);
    }

    /// Forgets servers no longer in the pool.
    pub(crate) fn forget_gone(&self) {
        let replicas = self.pool.replicas();
        self.reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|url, _| replicas.iter().any(|r| r.url == *url));
    }

    /// What `url` last reported (zeros before its first report).
    pub(crate) fn reported(&self, url: &str) -> Reported {
        self.reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(url)
            .copied()
            .unwrap_or_default()
    }

    fn busy(&self, url: &str) -> bool {
        let reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        reported.get(url).is_some_and(|r| {
            r.waiting >= f64::from(self.settings.queue_limit)
                || r.kv_cache >= self.settings.kv_cache_limit
        })
    }

    /// Chooses for `ask`.
    pub(crate) fn choose(&self, ask: &Ask) -> Choice {
        let replicas = self.pool.replicas();
        let outside: Vec<Arc<Replica>> = replicas
            .iter()
            .filter(|r| {
                ask.subset.as_ref().is_some_and(|subset| {
                    !subset
                        .iter()
                        .any(|s| s.trim_end_matches('/') == r.url.as_str())
                })
            })
            .cloned()
            .collect();
        let mut avoid = outside.clone();
        avoid.extend(
            replicas
                .iter()
                .filter(|r| self.busy(&r.url) && !outside.iter().any(|o| Arc::ptr_eq(o, r)))
                .cloned(),
        );
        let wanted = 1 + self.settings.fallbacks;
        // The server that holds the prompt's first blocks, then the policy's order after it.
        let holder = match &self.cache_view {
            Some(view) if ask.token_ids => view.best(&self.pool, &ask.prompt, &avoid),
            _ => None,
        };
        let mut chosen = match holder {
            Some(first) => {
                let mut tried = avoid.clone();
                tried.push(Arc::clone(&first));
                let mut rest = self.pool.ranked(&ask.prompt, &tried, wanted - 1);
                rest.insert(0, first);
                rest
            }
            None => self.pool.ranked(&ask.prompt, &avoid, wanted),
        };
        if chosen.is_empty() {
            // Every eligible server is busy (or none is ready).
            chosen = self.pool.ranked(&ask.prompt, &outside, wanted);
            if chosen.is_empty() {
                self.unavailable.fetch_add(1, Ordering::Relaxed);
                return Choice::Unavailable;
            }
            if self.over_share(&ask.tenant) {
                chosen[0].released();
                self.shed.fetch_add(1, Ordering::Relaxed);
                return Choice::Shed;
            }
        } else if chosen.len() < wanted {
            // Busy servers still serve as fallbacks, after the others.
            let mut tried = outside.clone();
            tried.extend(chosen.iter().cloned());
            let more = self.pool.ranked(&ask.prompt, &tried, wanted - chosen.len());
            chosen.extend(more);
        }
        self.routed.fetch_add(1, Ordering::Relaxed);
        Choice::Route(chosen)
    }

    /// Whether `tenant` holds more than an equal share of the requests in flight.
    fn over_share(&self, tenant: &str) -> bool {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let total: u32 = tenants.values().sum();
        let mine = tenants.get(tenant).copied().unwrap_or(0);
        let active = tenants.len().max(1) as u32 + u32::from(mine == 0);
        total > 0 && mine * active > total
    }

    /// Counts a request in flight on `replica` for `tenant` until the lease drops.
    pub(crate) fn lease(self: &Arc<Self>, replica: Arc<Replica>, tenant: String) -> Lease {
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.requests.fetch_add(1, Ordering::Relaxed);
        *self
            .tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(tenant.clone())
            .or_insert(0) += 1;
        Lease {
            picker: Arc::clone(self),
            replica,
            tenant,
        }
    }

    /// The replica whose base URL is `url`.
    pub(crate) fn replica(&self, url: &str) -> Option<Arc<Replica>> {
        self.pool.member(url)
    }
}

/// A request in flight on a server.
#[derive(Debug)]
pub(crate) struct Lease {
    picker: Arc<Picker>,
    pub replica: Arc<Replica>,
    tenant: String,
}

impl Lease {
    /// The proxy says another server served it (a fallback): the load moves there.
    pub(crate) fn moved_to(&mut self, replica: Arc<Replica>) {
        if Arc::ptr_eq(&replica, &self.replica) {
            return;
        }
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.replica.released();
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        self.replica = replica;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        // A half-open probe that ended without an answer lets the next request probe.
        self.replica.released();
        let mut tenants = self
            .picker
            .tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = tenants.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                tenants.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn picker(n: usize) -> Arc<Picker> {
        let text = "listen = \"127.0.0.1:0\"\nendpoints = [\"10.0.0.1:1\", \"10.0.0.2:1\", \"10.0.0.3:1\"]\nqueue_limit = 2\naffinity_tokens = 4\nfallbacks = 1";
        let settings = Settings::parse(text).unwrap();
        let urls: Vec<String> = settings.members.endpoints[..n].to_vec();
        Arc::new(Picker::new(settings, &urls))
    }

    fn route(choice: Choice) -> Vec<String> {
        match choice {
            Choice::Route(r) => r.iter().map(|r| r.url.clone()).collect(),
            other => vec![format!("{other:?}")],
        }
    }

    #[test]
    fn the_subset_hint_bounds_the_choice_and_an_empty_one_is_unavailable() {
        let p = picker(3);
        let ask = |subset: Vec<&str>| Ask {
            prompt: vec![1, 2, 3, 4, 5],
            token_ids: true,
            subset: Some(subset.into_iter().map(String::from).collect()),
            tenant: "t".into(),
        };
        for _ in 0..5 {
            let chosen = route(p.choose(&ask(vec!["http://10.0.0.2:1"])));
            assert_eq!(chosen, ["http://10.0.0.2:1"]);
        }
        assert!(matches!(p.choose(&ask(vec![])), Choice::Unavailable));
        assert!(matches!(
            p.choose(&ask(vec!["http://10.9.9.9:1"])),
            Choice::Unavailable
        ));
    }

    #[test]
    fn busy_servers_are_avoided_then_fallbacks_and_fairness_decide() {
        let p = picker(2);
        let plain = |tenant: &str, k: u32| Ask {
            prompt: vec![k],
            tenant: tenant.into(),
            ..Ask::default()
        };
        p.report(
            "http://10.0.0.1:1",
            Reported {
                waiting: 2.0,
                kv_cache: 0.1,
            },
        );
        for k in 0..6 {
            // The idle server first, the busy one as the fallback.
            let chosen = route(p.choose(&plain("a", k)));
            assert_eq!(chosen, ["http://10.0.0.2:1", "http://10.0.0.1:1"]);
        }
        p.report(
            "http://10.0.0.2:1",
            Reported {
                waiting: 0.0,
                kv_cache: 0.99,
            },
        );
        // All busy: a tenant with nothing in flight still goes; one over its share is shed.
        let Choice::Route(first) = p.choose(&plain("a", 1)) else {
            panic!("routed")
        };
        let leases: Vec<Lease> = (0..3)
            .map(|_| p.lease(Arc::clone(&first[0]), "a".into()))
            .collect();
        let _b = p.lease(Arc::clone(&first[0]), "b".into());
        assert!(matches!(p.choose(&plain("a", 2)), Choice::Shed));
        assert!(matches!(p.choose(&plain("c", 3)), Choice::Route(_)));
        assert_eq!(first[0].in_flight.load(Ordering::Relaxed), 4);
        drop(leases);
        assert_eq!(first[0].in_flight.load(Ordering::Relaxed), 1);
        assert!(matches!(p.choose(&plain("a", 2)), Choice::Route(_)));
    }

    #[test]
    fn load_spreads_and_a_lease_moves_to_the_server_that_served() {
        let p = picker(3);
        let firsts: std::collections::HashSet<String> = (0..9u32)
            .map(|k| {
                route(p.choose(&Ask {
                    prompt: vec![k],
                    ..Ask::default()
                }))[0]
                    .clone()
            })
            .collect();
        assert_eq!(firsts.len(), 3);
        let [a, b] = [0, 1].map(|i| Arc::clone(&p.pool.replicas()[i]));
        let mut lease = p.lease(Arc::clone(&a), "t".into());
        lease.moved_to(Arc::clone(&b));
        assert_eq!(a.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(b.in_flight.load(Ordering::Relaxed), 1);
        drop(lease);
        assert_eq!(b.in_flight.load(Ordering::Relaxed), 0);
    }
}
