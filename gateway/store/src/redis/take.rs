//! Token-bucket takes on Redis (request rates and token reservations): `take.lua`, grouped
//! (see [`super::batch`]).

use std::time::Duration;

use redis::Value;

use super::batch::{Batch, Queue};
use super::{RedisStore, bucket_args, bucket_keys, integer};
use crate::{StoreError, Take, Window, level_of};

/// Requests' takes: the bucket's key, its windows and the amount.
pub(crate) struct Takes;

impl Batch for Takes {
    type Item = (String, Vec<Window>, u64);
    type Answer = Take;
    const NAME: &'static str = "take";

    fn queue(store: &RedisStore) -> &Queue<Self> {
        &store.batches.takes
    }

    async fn run(
        store: &RedisStore,
        items: Vec<(String, Vec<Window>, u64)>,
    ) -> Result<Vec<Take>, StoreError> {
        let (mut keys, mut args) = (Vec::new(), Vec::new());
        for (key, windows, amount) in &items {
            keys.extend(bucket_keys(key, windows));
            args.push(windows.len().to_string().into_bytes());
            args.extend(bucket_args(*amount, windows));
        }
        let reply = store.run(&store.scripts.take, &keys, args).await?;
        let Value::Array(numbers) = reply else {
            return Err(StoreError(format!("unexpected take reply {reply:?}")));
        };
        let mut rest = numbers.as_slice();
        let mut takes = Vec::with_capacity(items.len());
        for (_, windows, _) in &items {
            if rest.len() < 3 + windows.len() {
                return Err(StoreError("a short take reply".into()));
            }
            let (this, next) = rest.split_at(3 + windows.len());
            rest = next;
            let never = integer(&this[1])? == 1;
            let wait = Duration::from_millis(integer(&this[2])?.max(0).unsigned_abs());
            let mut levels = Vec::with_capacity(windows.len());
            for (w, item) in windows.iter().zip(&this[3..]) {
                levels.push(level_of(*w, integer(item)? as f64 / 1000.0));
            }
            takes.push(Take {
                allowed: integer(&this[0])? == 1,
                levels,
                retry_after: if never { Duration::MAX } else { wait },
                never,
            });
        }
        Ok(takes)
    }
}
