//! A model's replicas and how a request picks one.
//!
//! - **Membership** changes while requests run ([`Pool::set_members`], from
//!   [`crate::discovery`]): a request works on a snapshot, and a replica that stays keeps its
//!   counters and breaker.
//! - **Prefix affinity**: a prompt's first `affinity_tokens` tokens hash to a replica by
//!   rendezvous hashing (the replica with the highest hash of key and replica URL wins; adding
//!   or removing a replica moves only its own keys), so repeated prefixes and continued conversations reach the
//!   replica whose KV cache holds them. Shorter prompts, and an affine replica that holds
//!   `affinity_max_imbalance` more requests than the least loaded, fall back on load.
//! - **Load**: power of two choices over the requests each replica has in flight from here.
//! - **Breakers**: `breaker_failures` consecutive failures open a replica's breaker; after
//!   `breaker_cooldown_ms` one request probes it (half-open), and its completion closes it. A
//!   replica with an open breaker is not picked while another can be. Health probes
//!   ([`crate::health`]) count toward it too, and a good probe closes it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Breaker {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out.
    HalfOpen,
}

/// One remote engine server.
#[derive(Debug)]
pub(crate) struct Replica {
    pub url: String,
    /// The URL's hash, for rendezvous hashing.
    key: u64,
    pub in_flight: AtomicU32,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Health probes that failed.
    pub probe_failures: AtomicU64,
    /// Sum of time to first token, microseconds (for the mean in `stats`).
    pub first_token_us: AtomicU64,
    breaker: Mutex<Breaker>,
}

impl Replica {
    fn new(url: String) -> Self {
        Self {
            key: fnv(url.bytes().map(u32::from)),
            url,
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            probe_failures: AtomicU64::new(0),
            first_token_us: AtomicU64::new(0),
            breaker: Mutex::new(Breaker::Closed { failures: 0 }),
        }
    }

    pub(crate) fn breaker(&self) -> Breaker {
        *self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a request may go here now (taking the half-open probe if it is due).
    fn admits(&self, now: Instant) -> bool {
        let mut b = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        match *b {
            Breaker::Closed { .. } => true,
            Breaker::Open { until } if now >= until => {
                *b = Breaker::HalfOpen;
                true
            }
            Breaker::Open { .. } | Breaker::HalfOpen => false,
        }
    }

    /// Whether a request may go here now, taking the half-open probe if it is due.
    pub(crate) fn admits_now(&self) -> bool {
        self.admits(Instant::now())
    }

    /// Whether a request could go here now, without taking the half-open probe.
    fn would_admit(&self, now: Instant) -> bool {
        match self.breaker() {
            Breaker::Closed { .. } => true,
            Breaker::Open { until } => now >= until,
            Breaker::HalfOpen => false,
        }
    }

    /// A request here completed well (a request that stalls or breaks after its first token
    /// is a failure, so its first token cannot count as a success).
    pub(crate) fn succeeded(&self) {
        *self.breaker.lock().unwrap_or_else(PoisonError::into_inner) =
            Breaker::Closed { failures: 0 };
    }

    /// A request here ended neither well nor by the replica's failure (cancelled): if it was
    /// the half-open probe, the next request probes instead.
    pub(crate) fn released(&self) {
        let mut b = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        if *b == Breaker::HalfOpen {
            *b = Breaker::Open {
                until: Instant::now(),
            };
        }
    }

    /// A health probe's answer: a good one closes the breaker; a bad one counts as a failure
    /// (without counting as a request's error).
    pub(crate) fn probed(&self, healthy: bool, threshold: u32, cooldown: Duration) {
        if healthy {
            let mut b = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
            if !matches!(*b, Breaker::Closed { .. }) {
                *b = Breaker::Closed { failures: 0 };
            }
            return;
        }
        self.probe_failures.fetch_add(1, Ordering::Relaxed);
        self.trip(threshold, cooldown);
    }

    /// A request here failed before its first token (connect error, refusal, timeout).
    pub(crate) fn failed(&self, threshold: u32, cooldown: Duration) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.trip(threshold, cooldown);
    }

    /// Counts a failure toward the breaker, opening it at `threshold`.
    fn trip(&self, threshold: u32, cooldown: Duration) {
        let mut b = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        *b = match *b {
            Breaker::Closed { failures } if failures + 1 < threshold => Breaker::Closed {
                failures: failures + 1,
            },
            _ => Breaker::Open {
                until: Instant::now() + cooldown,
            },
        };
    }
}

/// A model's replicas.
#[derive(Debug)]
pub(crate) struct Pool {
    replicas: RwLock<Arc<[Arc<Replica>]>>,
    affinity_tokens: usize,
    max_imbalance: u32,
    /// Requests routed by affinity (the rest by load).
    pub affine: AtomicU64,
    /// A counter that spreads the two choices.
    next: AtomicU64,
}

impl Pool {
    pub(crate) fn new(urls: &[String], affinity_tokens: usize, max_imbalance: u32) -> Self {
        Self {
            replicas: RwLock::new(
                urls.iter()
                    .cloned()
                    .map(Replica::new)
                    .map(Arc::new)
                    .collect(),
            ),
            affinity_tokens,
            max_imbalance,
            affine: AtomicU64::new(0),
            next: AtomicU64::new(0),
        }
    }

    /// The replicas now.
    pub(crate) fn replicas(&self) -> Arc<[Arc<Replica>]> {
        Arc::clone(&self.replicas.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The replica whose base URL is `url`.
    pub(crate) fn member(&self, url: &str) -> Option<Arc<Replica>> {
        self.replicas().iter().find(|r| r.url == url).cloned()
    }

    /// Makes `urls` the replicas: new ones start closed and idle, ones that stay keep their
    /// state, and requests on removed ones run to their end. Whether anything changed.
    pub(crate) fn set_members(&self, urls: &[String]) -> bool {
        let mut replicas = self
            .replicas
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if replicas.len() == urls.len() && replicas.iter().zip(urls).all(|(r, u)| r.url == *u) {
            return false;
        }
        let next: Arc<[Arc<Replica>]> = urls
            .iter()
            .map(|url| {
                replicas
                    .iter()
                    .find(|r| r.url == *url)
                    .map_or_else(|| Arc::new(Replica::new(url.clone())), Arc::clone)
            })
            .collect();
        *replicas = next;
        true
    }

    /// Whether some replica would take a request now (its breaker closed, or open with its
    /// cooldown over), without taking a probe.
    pub(crate) fn available(&self) -> bool {
        let now = Instant::now();
        self.replicas().iter().any(|r| r.would_admit(now))
    }

    /// The replica for a prompt, not one of `tried`; `None` when every other replica's breaker
    /// is open (or there is none).
    pub(crate) fn pick(&self, prompt: &[u32], tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        self.ranked(prompt, tried, 1).into_iter().next()
    }

    /// Up to `count` replicas for a prompt, not of `tried`, in the order the policy prefers
    /// them: the one [`Pool::pick`] would take (which may take a half-open probe), then the
    /// others that would admit a request now, without taking probes (fallbacks).
    pub(crate) fn ranked(
        &self,
        prompt: &[u32],
        tried: &[Arc<Replica>],
        count: usize,
    ) -> Vec<Arc<Replica>> {
        let now = Instant::now();
        let replicas = self.replicas();
        let open: Vec<&Arc<Replica>> = replicas
            .iter()
            .filter(|r| !tried.iter().any(|t| Arc::ptr_eq(t, r)))
            .collect();
        let load = |r: &Replica| r.in_flight.load(Ordering::Relaxed);
        let Some(least) = open.iter().map(|r| load(r)).min() else {
            return Vec::new();
        };
        let mut chosen: Vec<Arc<Replica>> = Vec::with_capacity(count);
        let take = |r: &Arc<Replica>, chosen: &mut Vec<Arc<Replica>>| {
            let admits = if chosen.is_empty() {
                r.admits(now)
            } else {
                r.would_admit(now)
            };
            if admits && !chosen.iter().any(|c| Arc::ptr_eq(c, r)) {
                chosen.push(Arc::clone(r));
            }
        };
        if self.affinity_tokens > 0 && prompt.len() >= self.affinity_tokens {
            let key = fnv(prompt[..self.affinity_tokens].iter().copied());
            if let Some(best) = open.iter().max_by_key(|r| mix(key, r.key))
                && load(best) <= least + self.max_imbalance
            {
                take(best, &mut chosen);
                if !chosen.is_empty() {
                    self.affine.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Two choices among the replicas that admit a request, the less loaded, then the rest.
        let n = open.len() as u64;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let a = (start % n) as usize;
        let b = (start.wrapping_mul(0x9E37_79B9).wrapping_add(1) % n) as usize;
        let mut order = if load(open[b]) < load(open[a]) {
            vec![b, a]
        } else {
            vec![a, b]
        };
        order.extend((0..open.len()).filter(|i| *i != a && *i != b));
        for i in order {
            if chosen.len() >= count {
                break;
            }
            take(open[i], &mut chosen);
        }
        chosen
    }
}

/// FNV-1a over token ids (or bytes).
fn fnv(tokens: impl Iterator<Item = u32>) -> u64 {
    tokens.fold(0xcbf2_9ce4_8422_2325, |h, t| {
        t.to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    })
}

/// A well-mixed hash of a key and a replica's (rendezvous hashing).
fn mix(key: u64, replica: u64) -> u64 {
    let mut z = key ^ replica.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pool(n: usize) -> Pool {
        let urls: Vec<String> = (0..n).map(|i| format!("http://r{i}")).collect();
        Pool::new(&urls, 4, 2)
    }

    fn url(r: Option<Arc<Replica>>) -> String {
        r.map_or_else(|| "none".into(), |r| r.url.clone())
    }

    #[test]
    fn a_prefix_sticks_to_one_replica_until_it_is_too_busy() {
        let p = pool(3);
        let prompt = [5, 6, 7, 8, 9];
        let first = p.pick(&prompt, &[]).unwrap();
        for _ in 0..10 {
            assert_eq!(url(p.pick(&prompt, &[])), first.url);
        }
        // Different prefixes spread.
        let picks: std::collections::HashSet<String> = (0..40u32)
            .map(|k| url(p.pick(&[k, k + 1, k + 2, k + 3], &[])))
            .collect();
        assert_eq!(picks.len(), 3);
        // Too busy: load decides.
        first.in_flight.store(5, Ordering::Relaxed);
        assert_ne!(url(p.pick(&prompt, &[])), first.url);
        // Tried replicas are skipped.
        first.in_flight.store(0, Ordering::Relaxed);
        assert_ne!(url(p.pick(&prompt, &[Arc::clone(&first)])), first.url);
    }

    #[test]
    fn a_breaker_opens_then_lets_one_probe_through() {
        let p = pool(2);
        let [r0, r1] = [0, 1].map(|i| Arc::clone(&p.replicas()[i]));
        for _ in 0..3 {
            r0.failed(3, Duration::from_millis(30));
        }
        assert!(matches!(r0.breaker(), Breaker::Open { .. }));
        for _ in 0..10 {
            assert_eq!(url(p.pick(&[1], &[])), r1.url);
        }
        let tried = [Arc::clone(&r1)];
        assert!(p.pick(&[1], &tried).is_none());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(url(p.pick(&[1], &tried)), r0.url);
        assert_eq!(r0.breaker(), Breaker::HalfOpen);
        assert!(p.pick(&[1], &tried).is_none());
        r0.succeeded();
        assert_eq!(url(p.pick(&[1], &tried)), r0.url);
    }

    #[test]
    fn probes_open_and_close_a_breaker() {
        let p = pool(2);
        let r0 = Arc::clone(&p.replicas()[0]);
        let cooldown = Duration::from_secs(60);
        r0.probed(false, 2, cooldown);
        assert_eq!(r0.breaker(), Breaker::Closed { failures: 1 });
        r0.probed(false, 2, cooldown);
        assert!(matches!(r0.breaker(), Breaker::Open { .. }));
        assert_eq!(r0.errors.load(Ordering::Relaxed), 0);
        r0.probed(true, 2, cooldown);
        assert_eq!(r0.breaker(), Breaker::Closed { failures: 0 });
    }

    #[test]
    fn members_change_and_the_ones_that_stay_keep_their_state_and_prefixes() {
        let p = pool(3);
        let prompts: Vec<[u32; 4]> = (0..60u32).map(|k| [k, k * 7, k + 3, 1]).collect();
        let before: Vec<String> = prompts.iter().map(|q| url(p.pick(q, &[]))).collect();
        let kept = Arc::clone(&p.replicas()[0]);
        kept.requests.store(9, Ordering::Relaxed);
        let urls: Vec<String> = ["http://r0", "http://r1", "http://r2", "http://r3"]
            .map(String::from)
            .into();
        assert!(p.set_members(&urls));
        assert!(!p.set_members(&urls));
        assert!(Arc::ptr_eq(&p.replicas()[0], &kept));
        // A new replica takes only prefixes it wins; the others stay where they were.
        for (q, old) in prompts.iter().zip(&before) {
            let now = url(p.pick(q, &[]));
            assert!(now == *old || now == "http://r3", "{now} {old}");
        }
        assert!(p.set_members(&urls[1..]));
        assert_eq!(p.replicas().len(), 3);
        assert!(p.replicas().iter().all(|r| r.url != "http://r0"));
        assert!(p.available());
        assert!(p.set_members(&[]));
        assert!(!p.available());
        assert!(p.pick(&[1, 2, 3, 4], &[]).is_none());
    }
}
