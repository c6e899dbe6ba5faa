//! Numbers a JSON answer may write: no more than a double holds. A JSON Schema's `number` (and
//! an unbounded `integer`) is a regular language of any length, and a small model that starts
//! writing digits may never stop: hundreds of digits until `max_tokens`. The same goes for the
//! fractional seconds of a `date-time`. The guard follows the answer's text as a JSON lexer
//! (inside a string or not, inside a number's mantissa or exponent) and, once a number holds
//! [`MAX_SIGNIFICANT`] significant digits ([`MAX_MANTISSA`] in all, [`MAX_EXPONENT`] in its
//! exponent) or fractional seconds [`MAX_SECOND_FRACTION`], bans the tokens that would write
//! more: those that begin with a digit (or `.`, which needs a digit after it). A ban the grammar
//! leaves nothing after (a pattern that demands more digits) is not applied: the grammar's own
//! rule wins.

/// Significant digits a double holds (what it prints back exactly).
pub(crate) const MAX_SIGNIFICANT: u32 = 17;
/// Digits of a mantissa in all (leading zeros of a small fraction included).
pub(crate) const MAX_MANTISSA: u32 = 24;
/// Digits of an exponent (a double's reaches 308).
pub(crate) const MAX_EXPONENT: u32 = 3;
/// Digits of a time's fractional seconds (nanoseconds).
pub(crate) const MAX_SECOND_FRACTION: u32 = 9;

/// What the guard bans next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ban {
    /// Nothing.
    None,
    /// Tokens that begin with a digit.
    Digits,
    /// Tokens that begin with a digit or `.`.
    DigitsAndDot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The integer part and the fraction: digits so far, significant ones so far.
    Mantissa { digits: u32, significant: u32 },
    /// The exponent: its digits so far (and the mantissa's, for the ban on `.`).
    Exponent { digits: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Between values.
    Outside,
    /// In a number.
    Number(Part),
    /// In a string; `tail` holds the last characters, to know a time's `hh:mm:ss.`, and
    /// `fraction` the digits after one.
    String {
        escaped: bool,
        tail: [u8; 9],
        fraction: Option<u32>,
    },
}

/// One choice's lexer over its JSON answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NumberGuard {
    lex: Lex,
}

impl Default for NumberGuard {
    fn default() -> Self {
        Self { lex: Lex::Outside }
    }
}

/// Whether `tail` ends with `hh:mm:ss.`.
fn after_seconds(tail: &[u8; 9]) -> bool {
    let d = |b: u8| b.is_ascii_digit();
    d(tail[0])
        && d(tail[1])
        && tail[2] == b':'
        && d(tail[3])
        && d(tail[4])
        && tail[5] == b':'
        && d(tail[6])
        && d(tail[7])
        && tail[8] == b'.'
}

impl NumberGuard {
    /// Follows the bytes the answer wrote.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        self.lex = match self.lex {
            Lex::Outside => Self::start(b),
            Lex::Number(part) => match (part, b) {
                (
                    Part::Mantissa {
                        digits,
                        significant,
                    },
                    b'0'..=b'9',
                ) => Lex::Number(Part::Mantissa {
                    digits: digits + 1,
                    significant: significant + u32::from(significant > 0 || b != b'0'),
                }),
                (Part::Mantissa { .. }, b'.' | b'-') => Lex::Number(part),
                (Part::Mantissa { .. }, b'e' | b'E') => Lex::Number(Part::Exponent { digits: 0 }),
                (Part::Exponent { digits }, b'0'..=b'9') => {
                    Lex::Number(Part::Exponent { digits: digits + 1 })
                }
                (Part::Exponent { .. }, b'+' | b'-') => Lex::Number(part),
                _ => Self::start(b),
            },
            Lex::String {
                escaped: true,
                tail,
                ..
            } => Lex::String {
                escaped: false,
                tail,
                fraction: None,
            },
            Lex::String { tail, fraction, .. } => match b {
                b'"' => Lex::Outside,
                b'\\' => Lex::String {
                    escaped: true,
                    tail,
                    fraction: None,
                },
                _ => {
                    let mut next = [0u8; 9];
                    next[..8].copy_from_slice(&tail[1..]);
                    next[8] = b;
                    let fraction = match (fraction, b) {
                        (Some(n), b'0'..=b'9') => Some(n + 1),
                        _ if after_seconds(&next) => Some(0),
                        _ => None,
                    };
                    Lex::String {
                        escaped: false,
                        tail: next,
                        fraction,
                    }
                }
            },
        };
    }

    fn start(b: u8) -> Lex {
        match b {
            b'"' => Lex::String {
                escaped: false,
                tail: [0; 9],
                fraction: None,
            },
            b'-' => Lex::Number(Part::Mantissa {
                digits: 0,
                significant: 0,
            }),
            b'0'..=b'9' => Lex::Number(Part::Mantissa {
                digits: 1,
                significant: u32::from(b != b'0'),
            }),
            _ => Lex::Outside,
        }
    }

    /// What the next token may not begin with.
    pub(crate) fn ban(&self) -> Ban {
        match self.lex {
            Lex::Number(Part::Mantissa {
                digits,
                significant,
            }) if significant >= MAX_SIGNIFICANT || digits >= MAX_MANTISSA => Ban::DigitsAndDot,
            Lex::Number(Part::Exponent { digits }) if digits >= MAX_EXPONENT => Ban::Digits,
            Lex::String {
                fraction: Some(n), ..
            } if n >= MAX_SECOND_FRACTION => Ban::Digits,
            _ => Ban::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(text: &str) -> Ban {
        let mut g = NumberGuard::default();
        g.push(text.as_bytes());
        g.ban()
    }

    #[test]
    fn a_number_stops_at_what_a_double_holds() {
        assert_eq!(after("{\"a\": 12345"), Ban::None);
        assert_eq!(after("{\"a\": 12345678901234567"), Ban::DigitsAndDot);
        assert_eq!(after("{\"a\": -1234567890.1234567"), Ban::DigitsAndDot);
        // Leading zeros are not significant, but a mantissa is bounded in all.
        assert_eq!(after("[0.0000000000001234"), Ban::None);
        assert_eq!(after("[0.00000000000000000000001"), Ban::DigitsAndDot);
        assert_eq!(after("[1.5e30"), Ban::None);
        assert_eq!(after("[1.5e-308"), Ban::Digits);
        // A number that ended, and digits in strings, are not numbers.
        assert_eq!(after("[12345678901234567890, "), Ban::None);
        assert_eq!(after("{\"id\": \"1234567890123456789012345"), Ban::None);
        assert_eq!(after("{\"id\": \"a\\\"123456789012345678901"), Ban::None);
    }

    #[test]
    fn a_times_fractional_seconds_stop_at_nanoseconds() {
        assert_eq!(after("{\"at\": \"2026-11-27T12:30:45.12345678"), Ban::None);
        assert_eq!(
            after("{\"at\": \"2026-11-27T12:30:45.123456789"),
            Ban::Digits
        );
        assert_eq!(
            after("{\"at\": \"2026-11-27T12:30:45.123456789Z\", \"n\": 1"),
            Ban::None
        );
        assert_eq!(after("{\"v\": \"version 1.2345678901"), Ban::None);
    }
}
