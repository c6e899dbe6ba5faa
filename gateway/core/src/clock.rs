//! Time as the protocols write it: whole seconds since the Unix epoch, and waits as OpenAI's
//! rate-limit headers and messages spell them (`250ms`, `1.5s`, `6m0s`); and the beat file
//! watches reload on ([`ReloadBeat`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `250ms`, `1.5s`, `6m0s`, `2h3m0s`.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        let text = format!("{secs:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        return format!("{text}s");
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else {
        format!("{m}m{s}s")
    }
}

/// The beat of a file watch: a tick every interval, or at once on SIGHUP (the operator's "reload
/// now"). Each watch (TLS files, the configuration) holds its own; every one of them hears the
/// signal.
#[derive(Debug)]
pub struct ReloadBeat {
    tick: tokio::time::Interval,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl ReloadBeat {
    /// Ticks every `every` (the first at once); listens for SIGHUP where there is one.
    pub fn new(every: Duration) -> Self {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            tick,
            #[cfg(unix)]
            hangup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Waits for the next beat; `true` when it was SIGHUP.
    pub async fn next(&mut self) -> bool {
        #[cfg(unix)]
        if let Some(signal) = self.hangup.as_mut() {
            return tokio::select! {
                _ = self.tick.tick() => false,
                _ = signal.recv() => true,
            };
        }
        self.tick.tick().await;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_like_openai_durations() {
        assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
        assert_eq!(format_reset(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_secs(7380)), "2h3m0s");
    }
}
