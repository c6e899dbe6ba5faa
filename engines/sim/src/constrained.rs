//! Random output inside a grammar: the simulator's answer to a request with a JSON Schema,
//! regex or Lark grammar, drawn through the same grammar library as the default engine, so
//! gateway tests and load tests see grammar-valid output without a model.
//!
//! The output mode's own token (echo, script, random word, or the end) is kept wherever the
//! grammar allows it, so a scripted answer that fits the grammar comes out as written; a
//! script that strays is bent back into it. Otherwise each token is a draw from the tokens
//! the grammar allows next: a word-like token where one
//! is allowed (so strings read as text), else any allowed token that opens no object or array
//! (nesting only where the schema asks for it), else any allowed token. Once the choice's length
//! budget is spent it *finishes*: it prefers end-of-sequence, then `"` (which ends a string,
//! or makes the next key or value the empty string), then the closing `}` and `]`, then `,`
//! (where no closer is allowed yet, the next required item is the way out), then `0` (a whole
//! JSON number), which closes any JSON value in a few steps; the
//! grammar forces what a schema requires (keys, enum values, minimum items) whatever is
//! preferred.

use std::sync::Arc;

use turnpike_grammar::{Allowed, Constraint, Grammars};

use crate::rng::Rng;
use crate::vocab::Vocab;

/// Tries at a word-like token before drawing from the allowed set itself.
const WORD_TRIES: usize = 32;

/// A choice's grammar and the tokens it prefers when finishing.
pub(crate) struct Constrained {
    constraint: Constraint,
    grammars: Arc<Grammars>,
    closers: Arc<[u32]>,
}

/// The tokens that end an output or a JSON value soonest, in order of preference.
fn closers(grammars: &Grammars, eos: u32) -> Arc<[u32]> {
    let mut ids = vec![eos];
    ids.extend(
        [&b"\""[..], b"}", b"]", b",", b"0"]
            .iter()
            .filter_map(|text| grammars.token_of(text)),
    );
    ids.into()
}

impl Constrained {
    pub(crate) fn new(constraint: Constraint, grammars: Arc<Grammars>, eos: u32) -> Self {
        Self {
            constraint,
            closers: closers(&grammars, eos),
            grammars,
        }
    }

    /// An independent copy for another choice.
    pub(crate) fn fork(&self) -> Self {
        Self {
            constraint: self.constraint.fork(),
            grammars: Arc::clone(&self.grammars),
            closers: Arc::clone(&self.closers),
        }
    }

    /// The next token, already consumed by the grammar: `wanted` (the output mode's token)
    /// where the grammar allows it, else a draw; an error when the grammar allows none.
    pub(crate) fn draw(
        &mut self,
        vocab: &Vocab,
        rng: &mut Rng,
        finishing: bool,
        wanted: u32,
    ) -> Result<u32, String> {
        let allowed = self.constraint.allowed()?;
        let preferred = if allowed.contains(wanted) {
            Some(wanted)
        } else {
            finishing
                .then(|| self.closers.iter().copied().find(|&t| allowed.contains(t)))
                .flatten()
        };
        let token = match preferred {
            Some(token) => token,
            None => match (0..WORD_TRIES)
                .map(|_| vocab.draw(rng))
                .find(|&t| allowed.contains(t))
            {
                Some(word) => word,
                None => self
                    .any_flat(&allowed, rng)
                    .ok_or("the output's grammar allows no token here")?,
            },
        };
        self.constraint.advance(token)?;
        Ok(token)
    }

    /// A uniform draw from the allowed tokens that open no object or array, or from all of
    /// them when each does.
    fn any_flat(&self, allowed: &Allowed, rng: &mut Rng) -> Option<u32> {
        let flat: Vec<u32> = allowed
            .ids()
            .filter(|&id| {
                !self
                    .grammars
                    .token_bytes(id)
                    .iter()
                    .any(|b| matches!(b, b'{' | b'['))
            })
            .collect();
        if flat.is_empty() {
            let at = rng.below(allowed.count() as u64) as usize;
            allowed.ids().nth(at)
        } else {
            flat.get(rng.below(flat.len() as u64) as usize).copied()
        }
    }
}
