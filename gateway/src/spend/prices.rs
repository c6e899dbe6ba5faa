//! Prices per model, each from an effective time: the price of a request is the newest one
//! in effect when it was admitted, so a change applies from its date and earlier requests keep
//! the price they were admitted at.

use std::collections::HashMap;

use super::{Money, Usage};

/// Prices per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    /// Prompt tokens not served from the cache.
    pub input: Money,
    /// Prompt tokens served from the prefix cache.
    pub cached_input: Money,
    /// Generated tokens that are not reasoning.
    pub output: Money,
    /// Generated reasoning tokens.
    pub reasoning: Money,
    /// Input tokens of an embedding request.
    pub embedding: Money,
}

const MILLION: u128 = 1_000_000;

/// `sum(tokens * per_million) / 1e6`, rounded to the nearest nano-unit once.
fn priced(parts: &[(u64, Money)]) -> Money {
    let total: u128 = parts
        .iter()
        .map(|&(tokens, per_million)| u128::from(tokens) * u128::from(per_million.0))
        .sum();
    Money(u64::try_from((total + MILLION / 2) / MILLION).unwrap_or(u64::MAX))
}

impl Price {
    /// What `usage` of a generation costs.
    pub fn cost(&self, usage: Usage) -> Money {
        let cached = usage.cached.min(usage.prompt);
        let reasoning = usage.reasoning.min(usage.completion);
        priced(&[
            (usage.prompt - cached, self.input),
            (cached, self.cached_input),
            (usage.completion - reasoning, self.output),
            (reasoning, self.reasoning),
        ])
    }

    /// The most a generation of `prompt` tokens that may produce `most_new` can cost: every
    /// prompt token at the dearer of the two input prices, every new one at the dearer output.
    pub fn most(&self, prompt: u64, most_new: u64) -> Money {
        priced(&[
            (prompt, self.input.max(self.cached_input)),
            (most_new, self.output.max(self.reasoning)),
        ])
    }

    /// The price of an embedding request, as a generation's: every input token at the
    /// embedding price.
    #[must_use]
    pub fn for_embeddings(self) -> Self {
        Self {
            input: self.embedding,
            cached_input: self.embedding,
            output: Money(0),
            reasoning: Money(0),
            embedding: self.embedding,
        }
    }
}

/// Prices of every priced model: name (a configured id or alias) → prices by effective time
/// (Unix seconds), oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    models: HashMap<String, Vec<(i64, Price)>>,
}

impl PriceTable {
    /// Adds `price` for `model` from `from` (Unix seconds).
    pub fn insert(&mut self, model: &str, from: i64, price: Price) -> Result<(), String> {
        let list = self.models.entry(model.to_string()).or_default();
        if list.iter().any(|(at, _)| *at == from) {
            return Err(format!(
                "two prices for `{model}` from the same time; give each its own `from`"
            ));
        }
        list.push((from, price));
        list.sort_by_key(|(at, _)| *at);
        Ok(())
    }

    /// Whether no model is priced.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The models priced.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// The price in effect at `now` of the first of `names` (the name called, then the id
    /// served) that has one in effect.
    pub fn price(&self, names: [&str; 2], now: i64) -> Option<Price> {
        names.iter().find_map(|name| {
            self.models
                .get(*name)?
                .iter()
                .rev()
                .find(|(from, _)| *from <= now)
                .map(|(_, price)| *price)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(input: u64, cached: u64, output: u64, reasoning: u64) -> Price {
        let m = |units: u64| Money(units * 1_000_000); // 0.001 per million per unit
        Price {
            input: m(input),
            cached_input: m(cached),
            output: m(output),
            reasoning: m(reasoning),
            embedding: m(1),
        }
    }

    #[test]
    fn cached_and_reasoning_tokens_take_their_own_prices() {
        // 0.15 / 0.075 / 0.60 / 0.80 per million.
        let p = price(150, 75, 600, 800);
        let usage = Usage {
            prompt: 1000,
            cached: 400,
            completion: 500,
            reasoning: 100,
        };
        // 600*0.15 + 400*0.075 + 400*0.6 + 100*0.8 = 90 + 30 + 240 + 80 = 440 per million.
        assert_eq!(p.cost(usage), Money(440_000));
        assert!(p.most(1000, 500) >= p.cost(usage));
        assert_eq!(p.most(1000, 500), Money(150_000 + 400_000));
        let e = p.for_embeddings();
        assert_eq!(
            e.cost(Usage {
                prompt: 3,
                ..Usage::default()
            }),
            Money(3)
        );
    }

    #[test]
    fn the_price_in_effect_is_the_newest_one_started() {
        let mut t = PriceTable::default();
        t.insert("m", 0, price(1, 1, 1, 1)).unwrap();
        t.insert("m", 100, price(2, 2, 2, 2)).unwrap();
        t.insert("alias", 0, price(9, 9, 9, 9)).unwrap();
        assert!(t.insert("m", 100, Price::default()).is_err());
        assert_eq!(t.price(["x", "m"], 99), Some(price(1, 1, 1, 1)));
        assert_eq!(t.price(["x", "m"], 100), Some(price(2, 2, 2, 2)));
        assert_eq!(t.price(["alias", "m"], 100), Some(price(9, 9, 9, 9)));
        assert_eq!(t.price(["x", "y"], 100), None);
    }
}
