//! A model's replicas and how a request picks one.
//!
//! - **Prefix affinity**: a prompt's first `affinity_tokens` tokens hash to a replica by
//!   rendezvous hashing (the replica with the highest hash of key and replica wins; removing a
//!   replica moves only its own keys), so repeated prefixes and continued conversations reach the
//!   replica whose KV cache holds them. Shorter prompts, and an affine replica that holds
//!   `affinity_max_imbalance` more requests than the least loaded, fall back on load.
//! - **Load**: power of two choices over the requests each replica has in flight from here.
//! - **Breakers**: `breaker_failures` consecutive failures open a replica's breaker; after
//!   `breaker_cooldown_ms` one request probes it (half-open), and a success closes it. A
//!   replica with an open breaker is not picked while another can be. Health probes
//!   ([`crate::health`]) count toward it too, and a good probe closes it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
        *self
            .breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a request may go here now (taking the half-open probe if it is due).
    fn admits(&self, now: Instant) -> bool {
        let mut b = self
            .breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *b {
            Breaker::Closed { .. } => true,
            Breaker::Open { until } if now >= until => {
                *b = Breaker::HalfOpen;
                true
            }
            Breaker::Open { .. } | Breaker::HalfOpen => false,
        }
    }

    /// A request here reached its first token (or ended well).
    pub(crate) fn succeeded(&self) {
        *self
            .breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Breaker::Closed { failures: 0 };
    }

    /// A health probe's answer: a good one closes the breaker; a bad one counts as a failure
    /// (without counting as a request's error).
    pub(crate) fn probed(&self, healthy: bool, threshold: u32, cooldown: Duration) {
        if healthy {
            let mut b = self
                .breaker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let mut b = self
            .breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    pub replicas: Vec<Replica>,
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
            replicas: urls.iter().cloned().map(Replica::new).collect(),
            affinity_tokens,
            max_imbalance,
            affine: AtomicU64::new(0),
            next: AtomicU64::new(0),
        }
    }

    /// The replica for a prompt, not one of `tried`; `None` when every other replica's breaker
    /// is open.
    pub(crate) fn pick(&self, prompt: &[u32], tried: &[usize]) -> Option<usize> {
        let now = Instant::now();
        let open: Vec<usize> = (0..self.replicas.len())
            .filter(|i| !tried.contains(i))
            .collect();
        let load = |i: usize| self.replicas[i].in_flight.load(Ordering::Relaxed);
        let least = open.iter().map(|&i| load(i)).min()?;
        if self.affinity_tokens > 0 && prompt.len() >= self.affinity_tokens {
            let key = fnv(&prompt[..self.affinity_tokens]);
            if let Some(&best) = open.iter().max_by_key(|&&i| mix(key, i as u64))
                && load(best) <= least + self.max_imbalance
                && self.replicas[best].admits(now)
            {
                self.affine.fetch_add(1, Ordering::Relaxed);
                return Some(best);
            }
        }
        // Two choices among the replicas that admit a request, the less loaded.
        let n = open.len() as u64;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let a = open[(start % n) as usize];
        let b = open[(start.wrapping_mul(0x9E37_79B9).wrapping_add(1) % n) as usize];
        let mut order = if load(b) < load(a) {
            vec![b, a]
        } else {
            vec![a, b]
        };
        order.extend(open.iter().copied().filter(|i| *i != a && *i != b));
        order.into_iter().find(|&i| self.replicas[i].admits(now))
    }
}

/// FNV-1a over token ids.
fn fnv(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325, |h, &t| {
        t.to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    })
}

/// A well-mixed hash of a key and a replica index (rendezvous hashing).
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

    #[test]
    fn a_prefix_sticks_to_one_replica_until_it_is_too_busy() {
        let p = pool(3);
        let prompt = [5, 6, 7, 8, 9];
        let first = p.pick(&prompt, &[]).unwrap();
        for _ in 0..10 {
            assert_eq!(p.pick(&prompt, &[]), Some(first));
        }
        // Different prefixes spread.
        let picks: std::collections::HashSet<usize> = (0..40u32)
            .map(|k| p.pick(&[k, k + 1, k + 2, k + 3], &[]).unwrap())
            .collect();
        assert_eq!(picks.len(), 3);
        // Too busy: load decides.
        p.replicas[first].in_flight.store(5, Ordering::Relaxed);
        assert_ne!(p.pick(&prompt, &[]), Some(first));
        // Tried replicas are skipped.
        p.replicas[first].in_flight.store(0, Ordering::Relaxed);
        assert_ne!(p.pick(&prompt, &[first]), Some(first));
    }

    #[test]
    fn a_breaker_opens_then_lets_one_probe_through() {
        let p = pool(2);
        for _ in 0..3 {
            p.replicas[0].failed(3, Duration::from_millis(30));
        }
        assert!(matches!(p.replicas[0].breaker(), Breaker::Open { .. }));
        for _ in 0..10 {
            assert_eq!(p.pick(&[1], &[]), Some(1));
        }
        assert_eq!(p.pick(&[1], &[1]), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(p.pick(&[1], &[1]), Some(0));
        assert_eq!(p.replicas[0].breaker(), Breaker::HalfOpen);
        assert_eq!(p.pick(&[1], &[1]), None);
        p.replicas[0].succeeded();
        assert_eq!(p.pick(&[1], &[1]), Some(0));
    }

    #[test]
    fn probes_open_and_close_a_breaker() {
        let p = pool(2);
        let cooldown = Duration::from_secs(60);
        p.replicas[0].probed(false, 2, cooldown);
        assert_eq!(p.replicas[0].breaker(), Breaker::Closed { failures: 1 });
        p.replicas[0].probed(false, 2, cooldown);
        assert!(matches!(p.replicas[0].breaker(), Breaker::Open { .. }));
        assert_eq!(p.replicas[0].errors.load(Ordering::Relaxed), 0);
        p.replicas[0].probed(true, 2, cooldown);
        assert_eq!(p.replicas[0].breaker(), Breaker::Closed { failures: 0 });
    }
}
