//! Spend: what a request costs and the budgets that stop a caller before it overspends.
//!
//! Three pieces of plain data and one hold:
//! - [`prices::PriceTable`]: per model (a configured id or alias), prices per million input,
//!   cached input, output, reasoning and embedding tokens, each from an effective time, so a
//!   price change applies from its date and earlier requests keep their price;
//! - [`budget::Budget`]: a limit in money per calendar day, per calendar month (UTC) and in
//!   total, for a tenant or one of its keys, with an optional soft threshold;
//! - [`Usage`]: the token counts a cost is computed from;
//! - [`hold::SpendHold`]: budgets are enforced in two phases, as token limits are. Admission
//!   charges the request's worst case (its prompt at the dearer input price, every token it may
//!   generate at the dearer output price) to every budget counter at once, on the state store,
//!   so replicas sharing Redis can never pass a budget together; the end of the request settles
//!   the actual cost and gives the rest back.
//!
//! Money is whole nano-units of the configured currency ([`Money`]), so costs add exactly.
//! This layer sits beside `tenancy` (which holds budgets in its directory and the hold in its
//! admission) and imports only the store, the errors and the clock below it.

pub mod budget;
pub mod export;
pub mod hold;
pub mod prices;
pub mod report;
pub mod settings;
pub mod usage;

use std::fmt;

/// An amount in nano-units of the currency (1e-9), so sums are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Money(pub u64);

/// A day's key in the state store's counters and sums: `YYYYMMDD` (UTC).
pub fn day_key(date: time::Date) -> String {
    let (y, m, d) = (date.year(), u8::from(date.month()), date.day());
    format!("{y:04}{m:02}{d:02}")
}

/// Nano-units per unit of currency.
pub const NANOS: u64 = 1_000_000_000;

impl Money {
    /// From an amount written in the configuration (a non-negative finite number of currency
    /// units), or why it is not one.
    pub fn parse(amount: f64, at: &str) -> Result<Self, String> {
        if !amount.is_finite() || amount < 0.0 {
            return Err(format!(
                "{at} must be a number of at least 0 (got {amount})"
            ));
        }
        let nanos = (amount * NANOS as f64).round();
        if nanos >= u64::MAX as f64 {
            return Err(format!("{at} is too large (got {amount})"));
        }
        Ok(Self(nanos as u64))
    }

    /// In currency units, for JSON and metrics.
    pub fn units(self) -> f64 {
        self.0 as f64 / NANOS as f64
    }
}

impl fmt::Display for Money {
    /// Exact decimal, trailing zeros dropped, at least two decimals (`0.000123`, `5.00`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every priced response prints one (`x-turnpike-cost`): digits on the stack.
        let (whole, mut frac) = (self.0 / NANOS, self.0 % NANOS);
        let mut digits = [b'0'; 9];
        for d in digits.iter_mut().rev() {
            *d = b'0' + (frac % 10) as u8;
            frac /= 10;
        }
        let shown = 2 + digits[2..]
            .iter()
            .rposition(|&d| d != b'0')
            .map_or(0, |i| i + 1);
        let shown = std::str::from_utf8(&digits[..shown]).map_err(|_| fmt::Error)?;
        write!(f, "{whole}.{shown}")
    }
}

/// The tokens a request's cost is computed from (OpenAI's convention: `cached` is part of
/// `prompt`, `reasoning` part of `completion`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Of them, served from the prefix cache.
    pub cached: u64,
    /// Generated tokens.
    pub completion: u64,
    /// Of them, reasoning.
    pub reasoning: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_parses_and_prints_exactly() {
        assert_eq!(Money::parse(5.0, "x").unwrap().to_string(), "5.00");
        assert_eq!(Money::parse(0.15, "x").unwrap(), Money(150_000_000));
        assert_eq!(Money(123_450).to_string(), "0.00012345");
        assert_eq!(Money(1_500_000_000).to_string(), "1.50");
        assert!(
            Money::parse(-1.0, "prices[0].input")
                .unwrap_err()
                .contains("prices[0].input")
        );
        assert!(Money::parse(f64::NAN, "x").is_err());
    }
}
