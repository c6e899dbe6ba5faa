//! Settlements on Redis: `settle.lua`, grouped (see [`super::batch`]), and the usage journal's
//! merged batches (see [`super::journal`]), guarded by the journal's mark.

use super::batch::{Batch, Queue};
use super::{RedisStore, USAGE_LOG, bucket_args, bucket_keys};
use crate::usage::{KEEP_DAYS, MAX_LOG};
use crate::{Settlement, StoreError};

/// Requests' ends.
pub(crate) struct Settles;

impl Batch for Settles {
    type Item = Settlement;
    type Answer = ();
    const NAME: &'static str = "settle";

    fn queue(store: &RedisStore) -> &Queue<Self> {
        &store.batches.settles
    }

    async fn run(store: &RedisStore, items: Vec<Settlement>) -> Result<Vec<()>, StoreError> {
        let count = items.len();
        let (keys, args) = invocation(items, None);
        store.run(&store.scripts.settle, &keys, args).await?;
        Ok(vec![(); count])
    }
}

/// A journal's batch: its mark's key and the batch's first and last sequence numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guard {
    pub(crate) mark: String,
    pub(crate) first: u64,
    pub(crate) last: u64,
}

/// The keys and arguments of `settle.lua` for `settlements` (see its header), applied only
/// past `guard`'s mark when there is one.
pub(crate) fn invocation(
    settlements: Vec<Settlement>,
    guard: Option<Guard>,
) -> (Vec<String>, Vec<Vec<u8>>) {
    let number = |n: u64| n.to_string().into_bytes();
    let (mut keys, mut args) = (Vec::new(), Vec::new());
    match guard {
        Some(g) => {
            keys.push(g.mark);
            args.extend([number(g.first), number(g.last), number(KEEP_DAYS * 86_400)]);
        }
        None => args.push(number(0)),
    }
    for s in settlements {
        match s.give_back {
            Some(g) => {
                keys.extend(bucket_keys(&g.key, &g.windows));
                args.push(number(g.windows.len() as u64));
                args.extend(bucket_args(g.amount, &g.windows));
            }
            None => args.extend([number(0), number(0)]),
        }
        match s.refund {
            Some(r) => {
                args.extend([number(r.tallies.len() as u64), number(r.amount)]);
                keys.extend(r.tallies.iter().map(|t| t.key.clone()));
            }
            None => args.extend([number(0), number(0)]),
        }
        let Some(r) = s.record else {
            args.push(number(0));
            continue;
        };
        keys.push(USAGE_LOG.to_string());
        keys.push(format!("tp:{{usage}}:d:{}", r.entry.day));
        args.extend([
            number(1),
            r.entry.record,
            number(u64::from(r.keep_log)),
            number(MAX_LOG as u64),
            number(KEEP_DAYS * 86_400),
            number(r.entry.sums.len() as u64),
        ]);
        for (name, amount) in r.entry.sums {
            args.push(name.into_bytes());
            args.push(number(amount));
        }
    }
    (keys, args)
}
