//! A `/generate` answer as the engine's events form it: each choice's tokens, log
//! probabilities and finish, what of them a stream has sent, and the chunks still to send.

use serde_json::{Value, json};
use turnpike_engine_api::{EngineError, EngineEvent, Finish, FinishReason, Status, Usage};

use crate::error::ApiError;

/// What an event did to the answer.
pub(super) enum Taken {
    Going,
    /// The engine's FINAL came: every choice has ended.
    Ended,
    Failed(ApiError),
}

#[derive(Default)]
struct Choice {
    ids: Vec<u32>,
    logprobs: Vec<Value>,
    top: Vec<Value>,
    finish: Option<Finish>,
    /// Tokens already sent in chunks.
    sent: usize,
    /// Its finish has been sent.
    finish_sent: bool,
}

pub(super) struct Answer {
    id: String,
    prompt_tokens: u32,
    choices: Vec<Choice>,
    usage: Usage,
    ended: bool,
}

impl Answer {
    pub(super) fn new(id: String, n: u32, prompt_tokens: u32) -> Self {
        Self {
            id,
            prompt_tokens,
            choices: (0..n).map(|_| Choice::default()).collect(),
            usage: Usage::default(),
            ended: false,
        }
    }

    /// Whether the engine's FINAL has come.
    pub(super) fn ended(&self) -> bool {
        self.ended
    }

    pub(super) fn take(&mut self, event: EngineEvent) -> Taken {
        match event {
            EngineEvent::Token(t) => {
                if let Some(c) = self.choices.get_mut(t.choice as usize) {
                    c.ids.push(t.token_id);
                    if let Some(lp) = t.logprob {
                        c.logprobs.push(json!([lp, t.token_id, null]));
                        let top: Vec<Value> = t
                            .top_logprobs
                            .iter()
                            .map(|a| json!([a.logprob, a.token_id, null]))
                            .collect();
                        c.top.push(Value::Array(top));
                    }
                }
                Taken::Going
            }
            EngineEvent::ChoiceEnd { choice, finish } => {
                if let Some(c) = self.choices.get_mut(choice as usize) {
                    c.finish = Some(finish);
                }
                Taken::Going
            }
            EngineEvent::Final(fin) => {
                self.usage = fin.usage;
                self.ended = true;
                if fin.status != Status::Ok {
                    return Taken::Failed(ApiError::from_engine(
                        EngineError::new(fin.status, fin.message),
                        std::time::Duration::from_secs(1),
                    ));
                }
                // The last open choice ends with the request.
                if let Some(open) = self.choices.iter_mut().find(|c| c.finish.is_none()) {
                    open.finish = Some(fin.finish);
                }
                Taken::Ended
            }
        }
    }

    /// The chunks not sent yet: per choice, its new tokens and, once it has one, its finish.
    pub(super) fn flush(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        for i in 0..self.choices.len() {
            let c = &self.choices[i];
            let new = c.ids.len() > c.sent;
            let finish = c.finish.is_some() && !c.finish_sent;
            if !new && !finish {
                continue;
            }
            let from = c.sent;
            let lp_from = from.min(c.logprobs.len());
            out.push(json!({
                "text": "",
                "output_ids": c.ids[from..],
                "index": i,
                "meta_info": self.meta(c, &c.logprobs[lp_from..], &c.top[lp_from..]),
            }));
            let c = &mut self.choices[i];
            c.sent = c.ids.len();
            c.finish_sent = c.finish.is_some();
        }
        out
    }

    fn meta(&self, c: &Choice, logprobs: &[Value], top: &[Value]) -> Value {
        let finish = c.finish.map(|f| match (f.reason, f.stop_token) {
            (Some(FinishReason::Length), _) => json!({"type": "length", "length": c.ids.len()}),
            (_, Some(id)) => json!({"type": "stop", "matched": id}),
            _ => json!({"type": "stop", "matched": null}),
        });
        json!({
            "id": self.id,
            "finish_reason": finish,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c.ids.len(),
            "cached_tokens": self.usage.cached_prompt_tokens,
            "output_token_logprobs": logprobs,
            "output_top_logprobs": top,
        })
    }

    /// Every choice whole (a non-streamed answer).
    pub(super) fn whole(&self) -> Vec<Value> {
        self.choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "text": "",
                    "output_ids": c.ids,
                    "index": i,
                    "meta_info": self.meta(c, &c.logprobs, &c.top),
                })
            })
            .collect()
    }
}
