//! `turnpike-grammar`: grammar-constrained decoding for Turnpike's engines (the default engine
//! masks its logits with it; the simulator draws grammar-valid output through it).
//!
//! A request's [`Grammar`] (any JSON object, a JSON Schema, a
//! regular expression or a Lark grammar) limits each token a choice may sample to those that
//! keep the output inside the grammar, with `llguidance` (the library OpenAI's Structured
//! Outputs and most serving engines use) over the model's own vocabulary.
//!
//! [`Grammars`] is built once per model, on first use, from its `tokenizer.json` (each token's
//! bytes in a trie) and compiles a request's grammar when the request is submitted, on the
//! caller's thread; compiled grammars are kept in a small cache keyed by the grammar, so a repeated
//! schema costs a clone. Each choice then holds a [`Constraint`]: before sampling it bans every
//! token the grammar does not allow next (their logits become −∞, so no sampler setting can
//! pick one), and after sampling it advances with the token. Once the grammar is complete, only
//! end-of-sequence is allowed. A grammar that allows nothing (it cannot be completed under the
//! request's other rules) ends the request with an error rather than sampling a banned token.
//!
//! Where the grammar forces the next text (a JSON key, the rest of an enum value),
//! [`Constraint::fast_forward`] hands the engine those tokens, tokenized as the model's own
//! tokenizer would, to append without a forward pass per token.
//!
//! A JSON answer's numbers (and a time's fractional seconds) are held to what a double holds
//! ([`number_guard`]): a small model need not write digits until `max_tokens`.
//!
//! The seam is plain data: [`Constraint::allowed`] answers an [`Allowed`] bitmask (one bit per
//! vocabulary id, 32 ids to a word), which a host sampler applies to its logits
//! ([`Allowed::apply`]) and a device uploads as it is.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

mod number_guard;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use turnpike_engine_api::EngineError;
use turnpike_engine_api::json::Grammar;

use number_guard::{Ban, NumberGuard};

/// Why a grammar cannot constrain a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarError {
    /// The model's vocabulary cannot be read as the grammar library needs (the model's fault).
    Unavailable(String),
    /// The request's grammar does not compile (the request's fault).
    Invalid(String),
}

impl std::fmt::Display for GrammarError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(why) => write!(f, "the grammar compiler cannot load: {why}"),
            Self::Invalid(why) => write!(f, "the grammar does not compile: {why}"),
        }
    }
}

impl std::error::Error for GrammarError {}

impl From<GrammarError> for EngineError {
    fn from(e: GrammarError) -> Self {
        match e {
            GrammarError::Unavailable(_) => EngineError::internal(e.to_string()),
            GrammarError::Invalid(_) => EngineError::invalid_request(e.to_string()),
        }
    }
}

/// Compiled grammars kept per model.
pub const CACHED: usize = 64;

/// The model's vocabulary as the grammar library reads it, with the model's own tokenizer for
/// text the grammar forces (so fast-forwarded tokens are the ones the model would have read).
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Option<tokenizers::Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // The tokenizer's own split where it reproduces the bytes exactly (a tokenizer that
        // adds a prefix space or normalises does not), else the longest tokens in order.
        if let (Some(tokenizer), Ok(text)) = (&self.tokenizer, std::str::from_utf8(s))
            && let Ok(encoding) = tokenizer.encode(text, false)
            && self.trie.decode_raw(encoding.get_ids()) == s
        {
            return encoding.get_ids().to_vec();
        }
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.tokenizer.is_some()
    }
}

/// A model's grammar compiler, built on first use (its vocabulary trie takes tens of
/// megabytes, which a deployment that never constrains output should not pay).
pub struct Grammars {
    tokenizer: PathBuf,
    vocab: usize,
    eos: Vec<u32>,
    compiler: OnceLock<Result<Compiler, String>>,
}

impl Grammars {
    /// The compiler for a model whose logits have `vocab` entries and whose end-of-sequence
    /// ids are `eos`, over the tokens of `tokenizer` (a `tokenizer.json`), loaded on first use.
    pub fn new(tokenizer: &Path, vocab: usize, eos: &[u32]) -> Self {
        Self {
            tokenizer: tokenizer.to_path_buf(),
            vocab,
            eos: eos.to_vec(),
            compiler: OnceLock::new(),
        }
    }

    /// Builds the compiler now (else the first grammar does).
    pub fn load(&self) -> Result<(), GrammarError> {
        self.compiler().map(|_| ())
    }

    fn compiler(&self) -> Result<&Compiler, GrammarError> {
        self.compiler
            .get_or_init(|| Compiler::load(&self.tokenizer, self.vocab, &self.eos))
            .as_ref()
            .map_err(|why| GrammarError::Unavailable(why.clone()))
    }

    /// A fresh constraint for `grammar`, compiled or from the cache; the error carries the
    /// compiler's one-line reason.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        self.compiler()?
            .constraint(grammar)
            .map_err(GrammarError::Invalid)
    }

    /// The id of the single token whose text is `bytes`, if the vocabulary has one.
    pub fn token_of(&self, bytes: &[u8]) -> Option<u32> {
        let compiler = self.compiler().ok()?;
        match compiler.factory.tok_env().tok_trie().greedy_tokenize(bytes)[..] {
            [id] => Some(id),
            _ => None,
        }
    }

    /// The text of token `id` (empty for ids the tokenizer does not name, or before load).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        match self.compiler() {
            Ok(compiler) => compiler.factory.tok_env().tok_trie().token(id),
            Err(_) => &[],
        }
    }

    /// `(compiled, cache hits, cached)` so far.
    pub fn counts(&self) -> (u64, u64, usize) {
        match self.compiler.get() {
            Some(Ok(compiler)) => compiler.counts(),
            _ => (0, 0, 0),
        }
    }
}

/// The grammar library's parser factory over a model's vocabulary, and its cache of compiled
/// grammars.
struct Compiler {
    factory: ParserFactory,
    cache: Mutex<Cache>,
    starts: Arc<Starts>,
}

/// The tokens a number's guard may ban: those whose text begins with a digit, and those that
/// begin with a digit or `.`.
struct Starts {
    env: TokEnv,
    digit: SimpleVob,
    digit_or_dot: SimpleVob,
}

impl Starts {
    fn new(env: TokEnv, words: &[Vec<u8>]) -> Self {
        let mut digit = SimpleVob::alloc(words.len());
        let mut digit_or_dot = SimpleVob::alloc(words.len());
        for (id, word) in words.iter().enumerate() {
            match word.first() {
                Some(b'0'..=b'9') => {
                    digit.set(id, true);
                    digit_or_dot.set(id, true);
                }
                Some(b'.') => digit_or_dot.set(id, true),
                _ => {}
            }
        }
        Self {
            env,
            digit,
            digit_or_dot,
        }
    }
}

#[derive(Default)]
struct Cache {
    /// Most recently used last.
    entries: VecDeque<(String, Matcher)>,
    hits: u64,
    compiled: u64,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("tokenizer", &self.tokenizer)
            .finish_non_exhaustive()
    }
}

impl Compiler {
    fn load(tokenizer: &Path, vocab: usize, eos: &[u32]) -> Result<Self, String> {
        let fail = |e: String| format!("{}: {e}", tokenizer.display());
        let text = std::fs::read(tokenizer).map_err(|e| fail(e.to_string()))?;
        let json: Value = serde_json::from_slice(&text).map_err(|e| fail(e.to_string()))?;
        let mut words =
            llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| fail(e.to_string()))?;
        if words.len() > vocab {
            return Err(fail(format!(
                "{} tokens, more than the model's {vocab} logits",
                words.len()
            )));
        }
        // Ids the tokenizer does not name (padding rows of the logits) are never allowed.
        words.resize(vocab, Vec::new());
        let Some(&first) = eos.first() else {
            return Err("the model names no end-of-sequence token".into());
        };
        if let Some(bad) = eos.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!(
                "end-of-sequence id {bad} is outside the vocabulary"
            ));
        }
        let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, first), &words).with_eos_tokens(eos);
        // Without the tokenizer (a format this build cannot read), nothing is fast-forwarded.
        let tokenizer = tokenizers::Tokenizer::from_bytes(&text).ok();
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| fail(e.to_string()))?;
        factory.set_stderr_log_level(0);
        Ok(Self {
            factory,
            cache: Mutex::new(Cache::default()),
            starts: Arc::new(Starts::new(env, &words)),
        })
    }

    /// A JSON grammar's numbers are guarded; other grammars say what they mean themselves.
    fn guard(&self, grammar: &Grammar) -> Option<(NumberGuard, Arc<Starts>)> {
        matches!(grammar, Grammar::JsonObject | Grammar::JsonSchema { .. })
            .then(|| (NumberGuard::default(), Arc::clone(&self.starts)))
    }

    fn constraint(&self, grammar: &Grammar) -> Result<Constraint, String> {
        let key = serde_json::to_string(grammar).map_err(|e| e.to_string())?;
        if let Ok(mut cache) = self.cache.lock()
            && let Some(at) = cache.entries.iter().position(|(k, _)| *k == key)
            && let Some(entry) = cache.entries.remove(at)
        {
            let matcher = entry.1.deep_clone();
            cache.entries.push_back(entry);
            cache.hits += 1;
            return Ok(Constraint {
                matcher,
                guard: self.guard(grammar),
            });
        }
        let parser = self
            .factory
            .create_parser(top_level(grammar))
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(error);
        }
        if let Ok(mut cache) = self.cache.lock() {
            cache.compiled += 1;
            if cache.entries.len() >= CACHED {
                cache.entries.pop_front();
            }
            cache.entries.push_back((key, matcher.deep_clone()));
        }
        Ok(Constraint {
            matcher,
            guard: self.guard(grammar),
        })
    }

    fn counts(&self) -> (u64, u64, usize) {
        self.cache
            .lock()
            .map(|c| (c.compiled, c.hits, c.entries.len()))
            .unwrap_or_default()
    }
}

/// The library's form of a grammar. JSON is compact (no whitespace between tokens beyond
/// what a schema's strings hold), as OpenAI's Structured Outputs write it, so a model cannot
/// spend its tokens on indentation.
fn top_level(grammar: &Grammar) -> TopLevelGrammar {
    let compact = |mut schema: Value| {
        if let Value::Object(map) = &mut schema {
            map.entry("x-guidance")
                .or_insert_with(|| json!({"whitespace_flexible": false}));
        }
        TopLevelGrammar::from_json_schema(schema)
    };
    match grammar {
        Grammar::JsonObject => compact(json!({"type": "object"})),
        Grammar::JsonSchema { schema } => compact(schema.clone()),
        Grammar::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
        Grammar::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
    }
}

/// One choice's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    /// A JSON answer's number guard, and the tokens it may ban.
    guard: Option<(NumberGuard, Arc<Starts>)>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").finish_non_exhaustive()
    }
}

impl Constraint {
    /// An independent copy at the same place (for another choice).
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            guard: self.guard.clone(),
        }
    }

    /// Follows `tokens` the answer wrote with the number guard.
    fn follow(&mut self, tokens: &[u32]) {
        if let Some((guard, starts)) = &mut self.guard {
            let trie = starts.env.tok_trie();
            for &token in tokens {
                guard.push(trie.token(token));
            }
        }
    }

    /// The tokens the grammar allows next (end-of-sequence alone once it is complete); an
    /// error when it allows none.
    pub fn allowed(&mut self) -> Result<Allowed, String> {
        let mut vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        if let Some((guard, starts)) = &self.guard {
            let banned = match guard.ban() {
                Ban::None => None,
                Ban::Digits => Some(&starts.digit),
                Ban::DigitsAndDot => Some(&starts.digit_or_dot),
            };
            if let Some(banned) = banned {
                let mut kept = vob.clone();
                kept.sub(banned);
                // A grammar that demands more digits has the last word.
                if !kept.is_zero() {
                    vob = kept;
                }
            }
        }
        let allowed = Allowed { vob };
        if allowed.words().iter().all(|&w| w == 0) {
            return Err("the output's grammar allows no token here".into());
        }
        Ok(allowed)
    }

    /// Sets the logit of every token the grammar does not allow next to −∞. An error when it
    /// allows none of them (within `logits`).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        self.allowed()?.apply(logits)
    }

    /// The tokens the grammar forces next (at most `limit`), already consumed: the engine
    /// appends them without sampling. Empty where the next token is a choice, or where the
    /// forced text's tokenization is not known to be the model's own.
    pub fn fast_forward(&mut self, limit: usize) -> Result<Vec<u32>, String> {
        if limit == 0 || self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        let mut forced = self.matcher.compute_ff_tokens();
        forced.truncate(limit);
        self.matcher
            .consume_tokens(&forced)
            .map_err(|e| e.to_string())?;
        self.follow(&forced);
        Ok(forced)
    }

    /// Whether the output so far is a complete sentence of the grammar (it may still go on).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Moves past `token` (one the last [`Constraint::mask`] allowed).
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        if self.matcher.is_stopped() {
            // Complete: the token is end-of-sequence, which ends the choice.
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        self.follow(&[token]);
        Ok(())
    }
}

/// The set of token ids a grammar allows next: bit `id % 32` of word `id / 32`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The library's own bit vector, kept as it came (no copy per token).
    vob: SimpleVob,
}

impl Allowed {
    /// The bitmask, 32 ids to a word (the layout a device kernel reads).
    pub fn words(&self) -> &[u32] {
        self.vob.as_slice()
    }

    /// Whether `id` is allowed.
    pub fn contains(&self, id: u32) -> bool {
        self.words()
            .get(id as usize / 32)
            .is_some_and(|w| w >> (id % 32) & 1 == 1)
    }

    /// The allowed ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.words().iter().enumerate().flat_map(|(w, &bits)| {
            (0..32u32)
                .filter(move |b| bits >> b & 1 == 1)
                .map(move |b| w as u32 * 32 + b)
        })
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets every disallowed logit to −∞; an error when none of `logits` is allowed.
    pub fn apply(&self, logits: &mut [f32]) -> Result<(), String> {
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = self.words().get(w).copied().unwrap_or(0);
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            if bits == u32::MAX {
                any = true;
                continue;
            }
            for (b, logit) in chunk.iter_mut().enumerate() {
                if bits >> b & 1 == 0 {
                    *logit = f32::NEG_INFINITY;
                } else {
                    any = true;
                }
            }
        }
        if any {
            Ok(())
        } else {
            Err("the output's grammar allows no token here".into())
        }
    }
}

#[cfg(test)]
mod tests;
