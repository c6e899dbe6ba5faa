//! Settlements on Redis: `settle.lua`, grouped (see [`super::batch`]), and the usage journal's
//! batches of records (see [`super::journal`]), each with the journal's mark.

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
        let (keys, args) = invocation(items.into_iter().map(|s| (s, None)));
        store.run(&store.scripts.settle, &keys, args).await?;
        Ok(vec![(); count])
    }
}

/// A journaled record's place: the journal's mark key and the record's sequence number.
pub(crate) type Mark = Option<(String, u64)>;

/// The keys and arguments of `settle.lua` for `settlements` (see its header).
pub(crate) fn invocation(
    settlements: impl IntoIterator<Item = (Settlement, Mark)>,
) -> (Vec<String>, Vec<Vec<u8>>) {
    let number = |n: u64| n.to_string().into_bytes();
    let (mut keys, mut args) = (Vec::new(), Vec::new());
    for (s, mark) in settlements {
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
                keys.extend(r.tallies.into_iter().map(|t| t.key));
            }
            None => args.extend([number(0), number(0)]),
        }
        let Some(r) = s.record else {
            args.push(number(0));
            continue;
        };
        keys.push(USAGE_LOG.to_string());
        keys.push(format!("tp:{{usage}}:d:{}", r.entry.day));
        let seq = match mark {
            Some((key, seq)) => {
                keys.push(key);
                seq
            }
            None => 0,
        };
        args.extend([
            number(1),
            r.entry.record,
            number(u64::from(r.keep_log)),
            number(MAX_LOG as u64),
            number(KEEP_DAYS * 86_400),
            number(seq),
            number(r.entry.sums.len() as u64),
        ]);
        for (name, amount) in r.entry.sums {
            args.push(name.into_bytes());
            args.push(number(amount));
        }
    }
    (keys, args)
}
