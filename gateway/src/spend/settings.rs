//! `[spend]` and the `budget` tables of tenants, plans and keys, as written and validated.
//!
//! ```toml
//! [spend]
//! currency = "USD"                # a label in messages and headers
//! usage_journal = "usage.journal" # optional, with Redis: records reach Redis through this file
//! [[spend.prices]]
//! model = "llama-3.1-8b"          # a configured id or alias
//! from = "2027-01-01"             # optional: a date (UTC midnight) or an RFC 3339 time
//! input = 0.15                    # per million tokens
//! cached_input = 0.075            # optional, default: input
//! output = 0.60
//! reasoning = 0.60                # optional, default: output
//! embedding = 0.02                # optional, default: input
//!
//! [tenants.acme.budget]
//! per_day = 5.0
//! per_month = 100.0
//! total = 1000.0
//! soft = 0.8                      # warn past 80% of a limit
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Money;
use super::budget::Budget;
use super::prices::{Price, PriceTable};

/// `[spend]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpend {
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    prices: Vec<RawPrice>,
    #[serde(default)]
    usage_records: Option<bool>,
    #[serde(default)]
    usage_file: Option<String>,
    #[serde(default)]
    usage_journal: Option<String>,
    #[serde(default)]
    usage_journal_max_mb: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    model: String,
    #[serde(default)]
    from: Option<String>,
    input: f64,
    #[serde(default)]
    cached_input: Option<f64>,
    output: f64,
    #[serde(default)]
    reasoning: Option<f64>,
    #[serde(default)]
    embedding: Option<f64>,
}

impl RawPrice {
    fn split(self) -> (String, RawModelPrice) {
        let price = RawModelPrice {
            from: self.from,
            input: self.input,
            cached_input: self.cached_input,
            output: self.output,
            reasoning: self.reasoning,
            embedding: self.embedding,
        };
        (self.model, price)
    }
}

/// One price of one model as written, without the model: an entry of the admin API's model
/// map (`PUT /admin/v1/models/prices/{model}` takes a list of them).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawModelPrice {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    input: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cached_input: Option<f64>,
    output: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reasoning: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    embedding: Option<f64>,
}

impl RawModelPrice {
    /// Its effective time (Unix seconds; the beginning of time when absent) and prices, or why
    /// it is invalid (`at` names it).
    pub fn validate(&self, at: &str) -> Result<(i64, Price), String> {
        let money = |value: f64, field: &str| Money::parse(value, &format!("{at}.{field}"));
        let input = money(self.input, "input")?;
        let output = money(self.output, "output")?;
        let price = Price {
            input,
            cached_input: self
                .cached_input
                .map_or(Ok(input), |v| money(v, "cached_input"))?,
            output,
            reasoning: self
                .reasoning
                .map_or(Ok(output), |v| money(v, "reasoning"))?,
            embedding: self
                .embedding
                .map_or(Ok(input), |v| money(v, "embedding"))?,
        };
        let from = match &self.from {
            Some(text) => effective(text, &format!("{at}.from"))?,
            None => i64::MIN,
        };
        Ok((from, price))
    }
}

/// The price table of `models` (model → its prices), validated; `at` names the table.
pub fn price_table<'a>(
    models: impl Iterator<Item = (&'a String, &'a Vec<RawModelPrice>)>,
    at: &str,
) -> Result<PriceTable, String> {
    let mut table = PriceTable::default();
    for (model, prices) in models {
        for (i, raw) in prices.iter().enumerate() {
            let at = format!("{at}.{model}[{i}]");
            let (from, price) = raw.validate(&at)?;
            table
                .insert(model, from, price)
                .map_err(|e| format!("{at}: {e}"))?;
        }
    }
    Ok(table)
}

/// Prices and the currency, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct SpendConfig {
    /// The currency's name (only a label).
    pub currency: String,
    /// Prices per model.
    pub prices: PriceTable,
    /// Whether every request writes a usage record (and adds to the daily sums).
    pub records: bool,
    /// The append-only JSONL file the records are exported to, when set.
    pub export: Option<PathBuf>,
    /// The local journal records go through on their way to Redis, and its size cap in bytes.
    pub journal: Option<(PathBuf, u64)>,
}

impl Default for SpendConfig {
    fn default() -> Self {
        Self {
            currency: "USD".into(),
            prices: PriceTable::default(),
            records: true,
            export: None,
            journal: None,
        }
    }
}

impl SpendConfig {
    /// Why a price names a model that is not served, if one does; `known` says whether a
    /// name is a served id or alias.
    pub fn check_models(&self, known: &dyn Fn(&str) -> bool) -> Result<(), String> {
        let mut unknown: Vec<&str> = self.prices.models().filter(|m| !known(m)).collect();
        unknown.sort_unstable();
        match unknown.first() {
            None => Ok(()),
            Some(model) => Err(format!(
                "spend.prices: no served model or alias `{model}` (a price names a model id or alias)"
            )),
        }
    }
}

/// A `from` as Unix seconds: `YYYY-MM-DD` (UTC midnight) or an RFC 3339 time.
fn effective(text: &str, at: &str) -> Result<i64, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t.unix_timestamp());
    }
    let date = || {
        let mut parts = text.splitn(3, '-');
        let year: i32 = parts.next()?.parse().ok()?;
        let month: u8 = parts.next()?.parse().ok()?;
        let day: u8 = parts.next()?.parse().ok()?;
        let month = time::Month::try_from(month).ok()?;
        time::Date::from_calendar_date(year, month, day).ok()
    };
    date()
        .filter(|_| text.len() == 10)
        .map(|d| d.midnight().assume_utc().unix_timestamp())
        .ok_or_else(|| {
            format!(
                "{at}: `{text}` is not a date like 2027-01-31 or a time like 2027-01-31T12:00:00Z"
            )
        })
}

impl RawSpend {
    /// Validates the prices (their models are checked against the served ones by
    /// [`SpendConfig::check_models`]); a relative `usage_file` is under `base`.
    pub fn validate(self, base: &Path) -> Result<SpendConfig, String> {
        let records = self.usage_records.unwrap_or(true);
        if !records && self.usage_file.is_some() {
            return Err(
                "spend.usage_file: usage records are off (spend.usage_records = false)".into(),
            );
        }
        if !records && self.usage_journal.is_some() {
            return Err(
                "spend.usage_journal: usage records are off (spend.usage_records = false)".into(),
            );
        }
        let max_mb = self.usage_journal_max_mb.unwrap_or(256);
        if max_mb == 0 || max_mb > 1 << 20 {
            return Err(format!(
                "spend.usage_journal_max_mb must be from 1 to 1048576 (got {max_mb})"
            ));
        }
        let journal = self.usage_journal.map(|f| (base.join(f), max_mb << 20));
        let export = self.usage_file.map(|f| base.join(f));
        let currency = self.currency.unwrap_or_else(|| "USD".into());
        let currency_ok = !currency.is_empty()
            && currency.len() <= 16
            && currency.bytes().all(|b| b.is_ascii_alphanumeric());
        if !currency_ok {
            return Err(format!(
                "spend.currency: `{currency}` is not a currency name like USD (1 to 16 letters or digits)"
            ));
        }
        let mut prices = PriceTable::default();
        for (i, raw) in self.prices.into_iter().enumerate() {
            let at = format!("spend.prices[{i}]");
            let (model, raw) = raw.split();
            let (from, price) = raw.validate(&at)?;
            prices
                .insert(&model, from, price)
                .map_err(|e| format!("{at}: {e}"))?;
        }
        Ok(SpendConfig {
            currency,
            prices,
            records,
            export,
            journal,
        })
    }
}

/// A `budget` table as written (a tenant's, a plan's or a key's); amounts in the currency.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_day: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    per_month: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    soft: Option<f64>,
}

impl RawBudget {
    /// The budget, or why it is invalid (`at` names the table).
    pub fn validate(&self, at: &str) -> Result<Budget, String> {
        let limit = |value: Option<f64>, field: &str| {
            value
                .map(|v| Money::parse(v, &format!("{at}.{field}")))
                .transpose()
        };
        let soft = match self.soft {
            None => None,
            Some(share) if (0.0..=1.0).contains(&share) => Some((share * 1000.0).round() as u16),
            Some(share) => {
                return Err(format!(
                    "{at}.soft must be a share from 0 to 1 (got {share})"
                ));
            }
        };
        Ok(Budget {
            per_day: limit(self.per_day, "per_day")?,
            per_month: limit(self.per_month, "per_month")?,
            total: limit(self.total, "total")?,
            soft,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(toml_text: &str) -> Result<SpendConfig, String> {
        let raw: RawSpend = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        let spend = raw.validate(Path::new("."))?;
        spend.check_models(&|m| m == "sim" || m == "sim-2026")?;
        Ok(spend)
    }

    #[test]
    fn prices_default_their_optional_parts_and_take_dates() {
        let s = spend(
            "[[prices]]\nmodel = \"sim\"\ninput = 0.15\noutput = 0.6\n\
             [[prices]]\nmodel = \"sim\"\nfrom = \"2027-01-01\"\ninput = 0.3\noutput = 1.2\n",
        )
        .unwrap();
        let old = s.prices.price(["sim", "sim"], 1_798_761_599).unwrap();
        assert_eq!(old.cached_input, Money(150_000_000));
        assert_eq!(old.reasoning, Money(600_000_000));
        let new = s.prices.price(["sim", "sim"], 1_798_761_600).unwrap();
        assert_eq!(new.input, Money(300_000_000));
    }

    #[test]
    fn bad_prices_and_budgets_name_the_field() {
        let e = spend("[[prices]]\nmodel = \"sim\"\ninput = -1\noutput = 1\n").unwrap_err();
        assert!(e.contains("spend.prices[0].input"), "{e}");
        let e = spend("[[prices]]\nmodel = \"nope\"\ninput = 1\noutput = 1\n").unwrap_err();
        assert!(e.contains("spend.prices") && e.contains("`nope`"), "{e}");
        let e = spend("[[prices]]\nmodel = \"sim\"\nfrom = \"soon\"\ninput = 1\noutput = 1\n")
            .unwrap_err();
        assert!(e.contains("spend.prices[0].from"), "{e}");
        let budget = RawBudget {
            per_day: Some(-2.0),
            ..RawBudget::default()
        };
        let e = budget.validate("tenants.acme.budget").unwrap_err();
        assert!(e.contains("tenants.acme.budget.per_day"), "{e}");
        let soft = RawBudget {
            soft: Some(1.5),
            ..RawBudget::default()
        };
        assert!(soft.validate("b").unwrap_err().contains("b.soft"));
    }
}
