//! What a request has sent its caller, choice by choice, across every replica that served it:
//! the tokens (so a choice can be resumed elsewhere with exactly these), which choices ended and
//! how, and the usage. A [`Leg`] is one node request: all the choices at first, one choice of
//! the original when it is a resumption; its chunks' choice indices map back to the original's.

use std::time::Instant;

use bytes::Bytes;
use turnpike_engine_api::plugin::{Request, Sink};
use turnpike_engine_api::resume::Outputs;
use turnpike_engine_api::{Finish, TopLogprob, Usage};

use crate::wire;

/// One node request of a client request.
pub(crate) struct Leg {
    /// The original choice of each of its choices.
    pub choices: Vec<u32>,
    /// The body sent.
    pub body: Bytes,
    /// What makes it a resumption, when it is one.
    pub resumed: Option<Resumed>,
}

/// A leg that resumes a choice.
pub(crate) struct Resumed {
    /// The original prompt followed by the choice's output.
    pub prompt: Vec<u32>,
    /// When the failure it follows was seen.
    pub at: Instant,
}

impl Leg {
    /// The first leg: every choice of `req`.
    pub(crate) fn first(req: &Request, body: Bytes) -> Self {
        Self {
            choices: (0..req.params.n.max(1)).collect(),
            body,
            resumed: None,
        }
    }

    /// Its prompt, which picks a replica: the request's, or the resumption's.
    pub(crate) fn prompt<'a>(&'a self, req: &'a Request) -> &'a [u32] {
        self.resumed.as_ref().map_or(&req.prompt, |r| &r.prompt)
    }
}

/// A leg's own progress on the replica serving it.
pub(crate) struct LegProgress {
    /// Tokens read per leg choice (cumulative chunk formats need it).
    pub seen: Vec<usize>,
    /// Tokens it delivered, stop tokens included.
    pub tokens: u32,
    /// Some choice ended here on a stop token, not by the node.
    pub stopped_here: bool,
    /// How the last of its choices to end ended.
    pub last: Finish,
}

impl LegProgress {
    pub(crate) fn new(leg: &Leg) -> Self {
        Self {
            seen: vec![0; leg.choices.len()],
            tokens: 0,
            stopped_here: false,
            last: Finish::default(),
        }
    }
}

/// A request's output so far.
pub(crate) struct Delivered {
    /// Tokens sent per original choice (stop tokens excluded: they are not sent), which
    /// choices ended, and how the last one did (the FINAL's finish).
    pub outputs: Outputs,
    pub usage: Usage,
    /// Tokens that end a choice when a node streams one.
    stops: Vec<u32>,
    /// Alternatives asked for per token.
    top_logprobs: usize,
}

impl Delivered {
    pub(crate) fn new(req: &Request, eos: &[u32]) -> Self {
        let mut stops = req.params.stop_token_ids.clone();
        if !req.params.ignore_eos {
            stops.extend(eos);
        }
        Self {
            outputs: Outputs::new(req.params.n),
            usage: Usage {
                prompt_tokens: req.prompt.len() as u32,
                ..Usage::default()
            },
            stops,
            top_logprobs: req.params.top_logprobs as usize,
        }
    }

    /// Whether any token was sent.
    pub(crate) fn started(&self) -> bool {
        self.usage.completion_tokens > 0
    }

    /// The leg's choices that have not ended.
    pub(crate) fn open_choices(&self, leg: &Leg) -> Vec<u32> {
        self.outputs.open(&leg.choices)
    }

    /// Ends choice `c` with `finish`: a CHOICE_END while others go on, else the FINAL's finish.
    pub(crate) fn end(&mut self, c: u32, finish: Finish, sink: &mut Sink) {
        if self.outputs.end(c, finish) && !self.outputs.finished() {
            sink.end_choice(c, finish);
        }
    }

    /// Sends a chunk's tokens under their original choice and ends the choice when it says
    /// so; whether it held tokens.
    pub(crate) fn deliver(
        &mut self,
        leg: &Leg,
        progress: &mut LegProgress,
        sink: &mut Sink,
        chunk: wire::Chunk,
    ) -> bool {
        if leg.resumed.is_none() {
            // Usage may come on its own, after every choice ended (vLLM). A resumption's
            // prompt holds output: the first leg's prompt is the request's.
            self.usage.prompt_tokens = chunk.prompt_tokens.max(self.usage.prompt_tokens);
            self.usage.cached_prompt_tokens =
                chunk.cached_tokens.max(self.usage.cached_prompt_tokens);
        }
        let local = chunk.index as usize;
        let Some(&c) = leg.choices.get(local) else {
            return false;
        };
        if self.outputs.ended(c) {
            return false;
        }
        let any = !chunk.tokens.is_empty();
        let mut finish = chunk.finish;
        for token in chunk.tokens {
            progress.seen[local] += 1;
            progress.tokens += 1;
            if self.stops.contains(&token.id) {
                finish = Some(Finish::stop(token.id));
                progress.stopped_here = true;
                break;
            }
            let top: Vec<TopLogprob> = token
                .top
                .into_iter()
                .take(self.top_logprobs)
                .map(|(token_id, logprob)| TopLogprob { token_id, logprob })
                .collect();
            sink.token_with_logprobs(c, token.id, token.logprob, &top);
            self.outputs.push(c, token.id);
            self.usage.completion_tokens += 1;
        }
        if let Some(finish) = finish {
            progress.last = finish;
            self.end(c, finish, sink);
        }
        any
    }
}
