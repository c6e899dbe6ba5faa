//! Admissions on Redis: token-bucket takes (request rates, token reservations) and budget
//! charges share one queue and one script, `admit.lua`, grouped (see [`super::batch`]). A
//! request asks for its token reservation and its budget charge at once; sharing the queue puts
//! both in the same call, so admitting it costs Redis one script call and the gateway one round
//! trip, where two queues cost two of each.

use std::time::Duration;

use redis::Value;

use super::batch::{Batch, Queue};
use super::{RedisStore, bucket_args, bucket_keys, integer};
use crate::tally::ttl_ms;
use crate::{Charge, StoreError, Take, Tally, Window, level_of};

/// What one request asks at admission.
pub(crate) enum Admit {
    /// Take `amount` from every window of the bucket `key`.
    Take {
        key: String,
        windows: Vec<Window>,
        amount: u64,
    },
    /// Add `amount` to every tally, unless one would pass its limit.
    Charge { tallies: Vec<Tally>, amount: u64 },
}

/// Its answer, of the same kind.
pub(crate) enum Admitted {
    Take(Take),
    Charge(Charge),
}

impl Admitted {
    fn mismatch() -> StoreError {
        StoreError("an admission answered with the wrong kind".into())
    }

    /// The take's answer.
    pub(crate) fn take(self) -> Result<Take, StoreError> {
        match self {
            Self::Take(take) => Ok(take),
            Self::Charge(_) => Err(Self::mismatch()),
        }
    }

    /// The charge's answer.
    pub(crate) fn charge(self) -> Result<Charge, StoreError> {
        match self {
            Self::Charge(charge) => Ok(charge),
            Self::Take(_) => Err(Self::mismatch()),
        }
    }
}

/// Requests' takes and charges.
pub(crate) struct Admits;

impl Batch for Admits {
    type Item = Admit;
    type Answer = Admitted;
    const NAME: &'static str = "admit";
    // A request's take and charge are asked for together: the first waits for the second.
    const GATHER: bool = true;

    fn queue(store: &RedisStore) -> &Queue<Self> {
        &store.batches.admits
    }

    async fn run(store: &RedisStore, items: Vec<Admit>) -> Result<Vec<Admitted>, StoreError> {
        let (keys, args, shapes) = invocation(items);
        let reply = store.run(&store.scripts.admit, &keys, args).await?;
        let Value::Array(numbers) = reply else {
            return Err(StoreError(format!("unexpected admit reply {reply:?}")));
        };
        let mut rest = numbers.as_slice();
        let mut answers = Vec::with_capacity(shapes.len());
        for shape in shapes {
            let width = match &shape {
                Shape::Take(windows) => 3 + windows.len(),
                Shape::Charge(n) => 1 + n,
            };
            if rest.len() < width {
                return Err(StoreError("a short admit reply".into()));
            }
            let (this, next) = rest.split_at(width);
            rest = next;
            answers.push(match shape {
                Shape::Take(windows) => Admitted::Take(take_answer(&windows, this)?),
                Shape::Charge(_) => Admitted::Charge(charge_answer(this)?),
            });
        }
        Ok(answers)
    }
}

/// What an item's answer looks like: a take's windows, or a charge's counter count.
enum Shape {
    Take(Vec<Window>),
    Charge(usize),
}

/// The keys and arguments of `admit.lua` for `items` (see its header).
fn invocation(items: Vec<Admit>) -> (Vec<String>, Vec<Vec<u8>>, Vec<Shape>) {
    let number = |n: u64| n.to_string().into_bytes();
    let (mut keys, mut args) = (Vec::new(), Vec::new());
    let mut shapes = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Admit::Take {
                key,
                windows,
                amount,
            } => {
                keys.extend(bucket_keys(&key, &windows));
                args.push(b"t".to_vec());
                args.push(number(windows.len() as u64));
                args.extend(bucket_args(amount, &windows));
                shapes.push(Shape::Take(windows));
            }
            Admit::Charge { tallies, amount } => {
                args.push(b"c".to_vec());
                args.extend([number(tallies.len() as u64), number(amount)]);
                for t in &tallies {
                    let limit = t.limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
                    args.push(limit.to_string().into_bytes());
                }
                for t in &tallies {
                    args.push(number(ttl_ms(t.lapses_at)));
                }
                shapes.push(Shape::Charge(tallies.len()));
                keys.extend(tallies.into_iter().map(|t| t.key));
            }
        }
    }
    (keys, args, shapes)
}

fn take_answer(windows: &[Window], this: &[Value]) -> Result<Take, StoreError> {
    let never = integer(&this[1])? == 1;
    let wait = Duration::from_millis(integer(&this[2])?.max(0).unsigned_abs());
    let mut levels = Vec::with_capacity(windows.len());
    for (w, item) in windows.iter().zip(&this[3..]) {
        levels.push(level_of(*w, integer(item)? as f64 / 1000.0));
    }
    Ok(Take {
        allowed: integer(&this[0])? == 1,
        levels,
        retry_after: if never { Duration::MAX } else { wait },
        never,
    })
}

fn charge_answer(this: &[Value]) -> Result<Charge, StoreError> {
    let numbers = this
        .iter()
        .map(|v| integer(v).map(|i| u64::try_from(i).unwrap_or(0)))
        .collect::<Result<Vec<u64>, _>>()?;
    Ok(Charge {
        allowed: numbers[0] == 1,
        totals: numbers[1..].to_vec(),
    })
}
