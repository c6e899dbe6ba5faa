//! Stop strings, matched across token boundaries.
//!
//! Text goes through the matcher before it is sent. It holds back only what could still be the
//! start of a stop string (the longest suffix that is a prefix of one), so text is delayed no more
//! than needed, and on a match everything from the match on is cut.

/// What the matcher lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Send this text (possibly empty) and go on.
    Text(String),
    /// A stop string matched (its index among those given): send this text, then end the
    /// choice.
    Stopped(String, usize),
}

/// Per-choice matcher state.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    /// The stop strings, with their index among those given.
    stops: Vec<(usize, String)>,
    pending: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .map(|(i, s)| (i, s.clone()))
                .collect(),
            pending: String::new(),
        }
    }

    /// Adds text; returns what may be sent now.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Text(text.to_string());
        }
        self.pending.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, *i)))
            .min();
        if let Some((at, index)) = first_match {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return StopOutcome::Stopped(out, index);
        }
        let hold = self.held_suffix();
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutcome::Text(out)
    }

    /// Everything held back, when the stream ends without a match.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_suffix(&self) -> usize {
        let mut best = 0;
        for (_, stop) in &self.stops {
            let longest = stop.len().saturating_sub(1).min(self.pending.len());
            for len in (best + 1..=longest).rev() {
                if stop.is_char_boundary(len) && self.pending.ends_with(&stop[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Text(t) => out.push_str(&t),
                StopOutcome::Stopped(t, _) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn matches_across_pieces_and_cuts() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".into(), true)
        );
        assert_eq!(
            run(&["\n\n", "###"], &["one\n", "\ntwo"]),
            ("one".into(), true)
        );
        assert_eq!(
            run(&["stop"], &["no match here"]),
            ("no match here".into(), false)
        );
        assert_eq!(run(&["xyz"], &["abx", "y"]), ("abxy".into(), false));
    }

    #[test]
    fn holds_back_only_a_possible_start() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("hello E"), StopOutcome::Text("hello ".into()));
        assert_eq!(m.push("X"), StopOutcome::Text("EX".into()));
        assert_eq!(m.push("café"), StopOutcome::Text("café".into()));
    }

    #[test]
    fn earliest_match_wins_and_multibyte_stops_work() {
        assert_eq!(run(&["b", "a"], &["xab"]), ("x".into(), true));
        assert_eq!(run(&["日本"], &["to 日", "本 now"]), ("to ".into(), true));
    }
}
