//! Usage reports: the daily sums of a range of days, filtered by tenant, key and model and
//! grouped by any of them and the day, as rows for JSON or CSV. Plain data in and out; the
//! admin API and the tenant's own `GET /v1/usage` translate their query strings into a
//! [`UsageQuery`].

use std::collections::BTreeMap;

use serde::Serialize;
use time::{Date, Duration as Days};

use super::Money;
use super::usage::METRICS;
use crate::store::{Store, StoreError};

/// The longest range one report reads.
pub const MAX_DAYS: i64 = 400;

/// What a report covers and how it adds up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    /// First day (UTC).
    pub from: Date,
    /// Last day, included.
    pub to: Date,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this key id.
    pub key: Option<String>,
    /// Only this model (as called).
    pub model: Option<String>,
    /// The columns rows are grouped by, of `day`, `tenant`, `key`, `model`.
    pub group_by: Vec<Group>,
}

/// A grouping column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// The day.
    Day,
    /// The tenant.
    Tenant,
    /// The key id.
    Key,
    /// The model as called.
    Model,
}

impl Group {
    /// From its name in a query string.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "day" => Some(Self::Day),
            "tenant" => Some(Self::Tenant),
            "key" => Some(Self::Key),
            "model" => Some(Self::Model),
            _ => None,
        }
    }
}

/// One row: its group's values and its sums.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageRow {
    /// `YYYY-MM-DD`, when grouped by day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<String>,
    /// When grouped by tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// When grouped by key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// When grouped by model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Requests.
    pub requests: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Of them, cached.
    pub cached_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Of them, reasoning.
    pub reasoning_tokens: u64,
    /// Cost in currency units.
    pub cost: f64,
    /// Cost in nano-units (exact).
    pub cost_nanos: u64,
    /// Requests that failed or were cancelled.
    pub failed: u64,
    /// Of the requests, lines of batches.
    pub batch_requests: u64,
    /// Of the prompt tokens, batch lines'.
    pub batch_input_tokens: u64,
    /// Of the generated tokens, batch lines'.
    pub batch_output_tokens: u64,
}

impl UsageRow {
    fn add(&mut self, metric: &str, amount: u64) {
        let field = match metric {
            "requests" => &mut self.requests,
            "input_tokens" => &mut self.input_tokens,
            "cached_tokens" => &mut self.cached_tokens,
            "output_tokens" => &mut self.output_tokens,
            "reasoning_tokens" => &mut self.reasoning_tokens,
            "cost_nanos" => &mut self.cost_nanos,
            "failed" => &mut self.failed,
            "batch_requests" => &mut self.batch_requests,
            "batch_input_tokens" => &mut self.batch_input_tokens,
            "batch_output_tokens" => &mut self.batch_output_tokens,
            _ => return,
        };
        *field += amount;
        self.cost = Money(self.cost_nanos).units();
    }
}

fn label(d: Date) -> (String, String) {
    let (y, m, day) = (d.year(), u8::from(d.month()), d.day());
    (super::day_key(d), format!("{y:04}-{m:02}-{day:02}"))
}

/// The rows of `query`, ordered by their group values.
pub async fn report(store: &dyn Store, query: &UsageQuery) -> Result<Vec<UsageRow>, StoreError> {
    let mut rows: BTreeMap<[Option<String>; 4], UsageRow> = BTreeMap::new();
    let mut day = query.from;
    while day <= query.to {
        let (stored, shown) = label(day);
        for (name, amount) in store.usage_sums(&stored).await? {
            let mut parts = name.split('\t');
            let (Some(tenant), Some(key), Some(model), Some(metric)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let wanted =
                |filter: &Option<String>, value: &str| filter.as_deref().is_none_or(|f| f == value);
            if !(wanted(&query.tenant, tenant)
                && wanted(&query.key, key)
                && wanted(&query.model, model))
            {
                continue;
            }
            let pick =
                |g: Group, value: &str| query.group_by.contains(&g).then(|| value.to_string());
            let group = [
                pick(Group::Day, &shown),
                pick(Group::Tenant, tenant),
                pick(Group::Key, key),
                pick(Group::Model, model),
            ];
            let row = rows.entry(group.clone()).or_insert_with(|| {
                let [day, tenant, key, model] = group;
                UsageRow {
                    day,
                    tenant,
                    key,
                    model,
                    ..UsageRow::default()
                }
            });
            row.add(metric, amount);
        }
        day = day.saturating_add(Days::days(1));
    }
    Ok(rows.into_values().collect())
}

/// The rows as CSV, with a header line; the group columns asked for come first.
pub fn csv(rows: &[UsageRow], group_by: &[Group]) -> String {
    let mut groups = group_by.to_vec();
    groups.sort_unstable();
    groups.dedup();
    let names = ["day", "tenant", "key", "model"];
    let mut out = String::new();
    let header: Vec<&str> = groups
        .iter()
        .map(|g| names[*g as usize])
        .chain(METRICS.iter().copied().filter(|m| *m != "cost_nanos"))
        .chain(["cost", "cost_nanos"])
        .collect();
    out.push_str(&header.join(","));
    out.push('\n');
    for row in rows {
        let values = [&row.day, &row.tenant, &row.key, &row.model];
        let mut cells: Vec<String> = groups
            .iter()
            .map(|g| values[*g as usize].clone().unwrap_or_default())
            .collect();
        cells.extend(
            [
                row.requests,
                row.input_tokens,
                row.cached_tokens,
                row.output_tokens,
                row.reasoning_tokens,
                row.failed,
                row.batch_requests,
                row.batch_input_tokens,
                row.batch_output_tokens,
            ]
            .map(|n| n.to_string()),
        );
        cells.push(Money(row.cost_nanos).to_string());
        cells.push(row.cost_nanos.to_string());
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// A report's query string as sent.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUsageQuery {
    from: Option<String>,
    to: Option<String>,
    tenant: Option<String>,
    key: Option<String>,
    model: Option<String>,
    group_by: Option<String>,
    /// `json` (the default) or `csv`.
    pub format: Option<String>,
}

fn date(text: &str, param: &'static str) -> Result<Date, (&'static str, String)> {
    let bad = || (param, format!("`{text}` is not a date like 2026-11-29"));
    let mut parts = text.splitn(3, '-');
    let mut next = || parts.next().and_then(|p| p.parse::<i32>().ok());
    let (Some(y), Some(m), Some(d)) = (next(), next(), next()) else {
        return Err(bad());
    };
    let month = u8::try_from(m)
        .ok()
        .and_then(|m| time::Month::try_from(m).ok())
        .ok_or_else(bad)?;
    let day = u8::try_from(d).map_err(|_| bad())?;
    Date::from_calendar_date(y, month, day).map_err(|_| bad())
}

impl RawUsageQuery {
    /// The query it asks for, or the parameter at fault and why; days default to `today`.
    pub fn validate(self, today: Date) -> Result<UsageQuery, (&'static str, String)> {
        let from = self.from.as_deref().map(|t| date(t, "from")).transpose()?;
        let to = self.to.as_deref().map(|t| date(t, "to")).transpose()?;
        let to = to.unwrap_or(today);
        let from = from.unwrap_or(to);
        if from > to {
            return Err(("from", "`from` is after `to`".into()));
        }
        if (to - from).whole_days() >= MAX_DAYS {
            return Err(("to", format!("a report covers at most {MAX_DAYS} days")));
        }
        let group_by = match self.group_by.as_deref() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|name| {
                    Group::parse(name.trim()).ok_or_else(|| {
                        (
                            "group_by",
                            format!("`{name}` is not one of day, tenant, key, model"),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        match self.format.as_deref() {
            None | Some("json" | "csv") => {}
            Some(other) => return Err(("format", format!("`{other}` is not json or csv"))),
        }
        Ok(UsageQuery {
            from,
            to,
            tenant: self.tenant,
            key: self.key,
            model: self.model,
            group_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::UsageEntry;
    use crate::store::memory::{MemoryLimits, MemoryStore};

    fn entry(day: &str, tenant: &str, model: &str, cost: u64) -> UsageEntry {
        let name = |metric: &str| super::super::usage::sum_name(tenant, "k1", model, metric);
        UsageEntry {
            record: Vec::new(),
            day: day.into(),
            sums: vec![(name("requests"), 1), (name("cost_nanos"), cost)],
        }
    }

    #[tokio::test]
    async fn reports_filter_and_group_the_daily_sums() {
        let store = MemoryStore::new(MemoryLimits {
            max_records: 10,
            max_bytes: 1000,
        });
        for e in [
            entry("20261128", "acme", "m1", 10),
            entry("20261129", "acme", "m1", 20),
            entry("20261129", "acme", "m2", 5),
            entry("20261129", "beta", "m1", 7),
        ] {
            let record = Some(crate::store::Record {
                entry: e,
                keep_log: false,
            });
            let settlement = crate::store::Settlement {
                record,
                ..Default::default()
            };
            store.settle(settlement).await.unwrap();
        }
        let today = Date::from_calendar_date(2026, time::Month::November, 29).unwrap();
        let raw = RawUsageQuery {
            from: Some("2026-11-28".into()),
            tenant: Some("acme".into()),
            group_by: Some("day".into()),
            ..RawUsageQuery::default()
        };
        let rows = report(&store, &raw.validate(today).unwrap()).await.unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[1].day.as_deref(), rows[1].requests),
            (Some("2026-11-29"), 2)
        );
        assert_eq!(rows[1].cost_nanos, 25);
        let all = UsageQuery {
            from: today,
            to: today,
            tenant: None,
            key: None,
            model: None,
            group_by: vec![Group::Tenant, Group::Model],
        };
        let rows = report(&store, &all).await.unwrap();
        assert_eq!(rows.len(), 3);
        let text = csv(&rows, &all.group_by);
        assert!(text.starts_with("tenant,model,requests,"), "{text}");
        assert!(
            text.contains("beta,m1,1,0,0,0,0,0,0,0,0,0.000000007,7"),
            "{text}"
        );
        let bad = RawUsageQuery {
            group_by: Some("week".into()),
            ..RawUsageQuery::default()
        };
        assert_eq!(bad.validate(today).unwrap_err().0, "group_by");
    }
}
