//! Budgets in money: per calendar day and month (UTC) and in total, for a tenant or one of its
//! keys, each a [`Tally`] on the state store whose key names its period (so a new day starts
//! from zero without anyone resetting it).

use time::{Date, Month, OffsetDateTime, Time};

use super::Money;
use crate::store::Tally;

/// A budget's limits; any may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Most spent in one calendar day (UTC).
    pub per_day: Option<Money>,
    /// Most spent in one calendar month (UTC).
    pub per_month: Option<Money>,
    /// Most spent ever.
    pub total: Option<Money>,
    /// The share of a limit, in thousandths, past which responses carry a warning and a log
    /// line.
    pub soft: Option<u16>,
}

/// Which period a budget line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// The calendar day.
    Day,
    /// The calendar month.
    Month,
    /// Ever.
    Total,
}

impl Period {
    /// Its name in errors, headers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "daily",
            Self::Month => "monthly",
            Self::Total => "total",
        }
    }
}

/// One limit of one budget, as charged.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Whose budget: "tenant `acme`" or "key `3f9a…`".
    pub owner: String,
    /// Which period.
    pub period: Period,
    /// Its limit.
    pub limit: Money,
    /// Unix seconds when it starts again from zero (`None`: never).
    pub resets_at: Option<i64>,
    /// Its soft threshold, in money.
    pub soft: Option<Money>,
}

/// The periods in force at one moment: the next midnight and the next first of a month (Unix
/// seconds, UTC), and the labels of the current day and month. A request computes it once for
/// all of its budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    next_day: i64,
    next_month: i64,
    day: String,
    month: String,
}

impl Calendar {
    /// The calendar at `now` (Unix seconds).
    pub fn at(now: i64) -> Self {
        let today = OffsetDateTime::from_unix_timestamp(now)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
            .date();
        let midnight = |d: Date| d.with_time(Time::MIDNIGHT).assume_utc().unix_timestamp();
        let (year, month) = match today.month() {
            Month::December => (today.year() + 1, Month::January),
            m => (today.year(), m.next()),
        };
        Self {
            next_day: today.next_day().map_or(i64::MAX, midnight),
            next_month: Date::from_calendar_date(year, month, 1).map_or(i64::MAX, midnight),
            day: super::day_key(today),
            month: format!("{:04}{:02}", today.year(), u8::from(today.month())),
        }
    }

    /// The day it is at: from its midnight to the next (Unix seconds, UTC).
    pub fn day_span(&self) -> (i64, i64) {
        (self.next_day.saturating_sub(86_400), self.next_day)
    }
}

/// A counter outlives its period by a day, so a request admitted just before a period ends
/// still gives back what it did not use to the period it was charged in.
const GRACE: i64 = 86_400;

/// Appends the tallies and lines of `budget`, whose counters live under `prefix` (a state key
/// in the tenant's hash slot), in the periods of `calendar`.
pub fn charge_lines(
    prefix: &str,
    owner: &str,
    budget: &Budget,
    calendar: &Calendar,
    tallies: &mut Vec<Tally>,
    lines: &mut Vec<Line>,
) {
    let periods = [
        (
            budget.per_day,
            Period::Day,
            "d:",
            calendar.day.as_str(),
            Some(calendar.next_day),
        ),
        (
            budget.per_month,
            Period::Month,
            "m:",
            calendar.month.as_str(),
            Some(calendar.next_month),
        ),
        (budget.total, Period::Total, "t", "", None),
    ];
    for (limit, period, label, label_date, resets_at) in periods {
        let Some(limit) = limit else { continue };
        tallies.push(Tally {
            key: format!("{prefix}:{label}{label_date}"),
            limit: Some(limit.0),
            lapses_at: resets_at.map(|at| u64::try_from(at.saturating_add(GRACE)).unwrap_or(0)),
        });
        lines.push(Line {
            owner: owner.to_string(),
            period,
            limit,
            resets_at,
            soft: budget.soft.map(|permille| {
                Money(
                    limit.0 / 1000 * u64::from(permille)
                        + limit.0 % 1000 * u64::from(permille) / 1000,
                )
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_end_at_utc_midnight_and_the_first_of_the_month() {
        // 2026-12-31T23:00:00Z
        let now = 1_798_758_000;
        let calendar = Calendar::at(now);
        assert_eq!(calendar.day, "20261231");
        assert_eq!(calendar.month, "202612");
        assert_eq!(calendar.next_day, 1_798_761_600); // 2027-01-01T00:00:00Z
        assert_eq!(calendar.next_month, calendar.next_day);
        let budget = Budget {
            per_day: Some(Money(5)),
            total: Some(Money(50)),
            soft: Some(800),
            ..Budget::default()
        };
        let (mut tallies, mut lines) = (Vec::new(), Vec::new());
        charge_lines(
            "tp:{acme}:sp",
            "tenant `acme`",
            &budget,
            &calendar,
            &mut tallies,
            &mut lines,
        );
        assert_eq!(tallies[0].key, "tp:{acme}:sp:d:20261231");
        assert_eq!(tallies[1].key, "tp:{acme}:sp:t");
        assert_eq!(tallies[1].lapses_at, None);
        assert_eq!(lines[0].period, Period::Day);
        assert_eq!(lines[1].soft, Some(Money(40)));
    }
}
