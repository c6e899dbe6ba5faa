//! Budget charges on Redis: `charge.lua`, grouped (see [`super::batch`]).

use redis::Value;

use super::batch::{Batch, Queue};
use super::{RedisStore, integer};
use crate::tally::ttl_ms;
use crate::{Charge, StoreError, Tally};

/// Requests' charges: the counters and the amount.
pub(crate) struct Charges;

impl Batch for Charges {
    type Item = (Vec<Tally>, u64);
    type Answer = Charge;
    const NAME: &'static str = "charge";

    fn queue(store: &RedisStore) -> &Queue<Self> {
        &store.batches.charges
    }

    async fn run(
        store: &RedisStore,
        items: Vec<(Vec<Tally>, u64)>,
    ) -> Result<Vec<Charge>, StoreError> {
        let number = |n: u64| n.to_string().into_bytes();
        let (mut keys, mut args) = (Vec::new(), Vec::new());
        let counts: Vec<usize> = items.iter().map(|(tallies, _)| tallies.len()).collect();
        for (tallies, amount) in items {
            args.extend([number(tallies.len() as u64), number(amount)]);
            for t in &tallies {
                let limit = t.limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
                args.push(limit.to_string().into_bytes());
            }
            for t in &tallies {
                args.push(number(ttl_ms(t.lapses_at)));
            }
            keys.extend(tallies.into_iter().map(|t| t.key));
        }
        let reply = store.run(&store.scripts.charge, &keys, args).await?;
        let Value::Array(items) = &reply else {
            return Err(StoreError(format!("unexpected script reply {reply:?}")));
        };
        let numbers = items
            .iter()
            .map(|v| integer(v).map(|i| u64::try_from(i).unwrap_or(0)))
            .collect::<Result<Vec<u64>, _>>()?;
        let mut rest = numbers.as_slice();
        let mut charges = Vec::with_capacity(counts.len());
        for n in counts {
            if rest.len() < n + 1 {
                return Err(StoreError("a short charge reply".into()));
            }
            let (this, next) = rest.split_at(n + 1);
            charges.push(Charge {
                allowed: this[0] == 1,
                totals: this[1..].to_vec(),
            });
            rest = next;
        }
        Ok(charges)
    }
}
