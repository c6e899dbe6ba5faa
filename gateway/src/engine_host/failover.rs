//! A routed model's request that goes on when its engine fails after it started (its worker
//! died, a pool lost every replica): the next target, a standby, takes each unfinished choice
//! from exactly the tokens it delivered (`turnpike_engine_api::resume`), and the caller's
//! stream goes on with no gap, repeat or error event.
//!
//! The events of every leg come out as one run's: a resumed choice's events are renumbered
//! back to its own index, CHOICE_END is sent for a choice only while others go on, and the one
//! FINAL carries the whole request's usage (the first leg's prompt, every leg's completion).
//! A target whose model declares `resume` continues penalties, grammar and the seeded random
//! stream exactly; another gets the same prompt and budget without it. A request that did not
//! fail is passed through untouched.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use turnpike_engine_api::host::EngineRequest;
use turnpike_engine_api::resume::{Outputs, continuation};
use turnpike_engine_api::{
    EngineError, EngineEvent, FinalEvent, Finish, Status, TokenEvent, Usage,
};

use super::backend::EngineRun;
use super::routed::Target;

/// One engine request of a client request: the original choice of each of its choices.
struct Leg {
    choices: Vec<u32>,
    request: EngineRequest,
}

/// Where the current leg's run is kept, so the caller's cancel reaches it.
type Slot = Arc<Mutex<Option<EngineRun>>>;

/// `first`, started on the first of the targets, going on on `rest` when it fails.
pub(super) fn resuming(
    model: &str,
    request: &EngineRequest,
    mut first: EngineRun,
    rest: Vec<Target>,
) -> EngineRun {
    let route = first.route.take();
    let current = std::mem::replace(&mut first.events, Box::pin(futures_util::stream::empty()));
    let slot: Slot = Arc::new(Mutex::new(Some(first)));
    let cancelled = Arc::new(AtomicBool::new(false));
    let n = request.params.n.max(1);
    let state = Resuming {
        model: model.to_string(),
        original: request.clone(),
        targets: rest.into(),
        target: None,
        current,
        leg: (0..n).collect(),
        leg_tokens: 0,
        legs: VecDeque::new(),
        outputs: Outputs::new(n),
        prompt: Usage {
            prompt_tokens: request.prompt.len() as u32,
            ..Usage::default()
        },
        completion: 0,
        out: VecDeque::new(),
        done: false,
        slot: Arc::clone(&slot),
        cancelled: Arc::clone(&cancelled),
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        s.next().await.map(|event| (event, s))
    });
    let mut run = EngineRun::new(Box::pin(events), move || {
        cancelled.store(true, Ordering::Relaxed);
        if let Some(run) = slot.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            run.cancel();
        }
    });
    run.route = route;
    run
}

struct Resuming {
    /// The public model, for logs and metrics.
    model: String,
    original: EngineRequest,
    /// Targets not tried yet, in order.
    targets: VecDeque<Target>,
    /// The target serving since the last failure; none while the first leg runs (its run came
    /// made).
    target: Option<Target>,
    current: BoxStream<'static, EngineEvent>,
    /// The current leg's choices.
    leg: Vec<u32>,
    /// Tokens the current leg delivered.
    leg_tokens: u32,
    /// Legs still to run, on the current target, one after the other.
    legs: VecDeque<Leg>,
    outputs: Outputs,
    /// The first leg's prompt and cached tokens.
    prompt: Usage,
    /// Completion tokens of every leg that ended.
    completion: u32,
    /// Events ready to go out.
    out: VecDeque<EngineEvent>,
    done: bool,
    slot: Slot,
    cancelled: Arc<AtomicBool>,
}

impl Resuming {
    async fn next(&mut self) -> Option<EngineEvent> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            let event = self.current.next().await.unwrap_or_else(|| {
                EngineEvent::Final(FinalEvent::failed(
                    Status::Internal,
                    "the engine's stream ended without its end",
                    Usage::default(),
                ))
            });
            match event {
                EngineEvent::Token(token) => return Some(self.token(token)),
                EngineEvent::ChoiceEnd { choice, finish } => {
                    let c = self.original_choice(choice);
                    self.end(c, finish);
                }
                EngineEvent::Final(end) => self.leg_ended(end),
            }
        }
    }

    fn original_choice(&self, choice: u32) -> u32 {
        self.leg.get(choice as usize).copied().unwrap_or(choice)
    }

    fn token(&mut self, mut token: TokenEvent) -> EngineEvent {
        token.choice = self.original_choice(token.choice);
        self.outputs.push(token.choice, token.token_id);
        self.leg_tokens += 1;
        EngineEvent::Token(token)
    }

    /// Ends choice `c`: a CHOICE_END while others go on, else the FINAL's finish.
    fn end(&mut self, c: u32, finish: Finish) {
        if self.outputs.end(c, finish) && !self.outputs.finished() {
            self.out
                .push_back(EngineEvent::ChoiceEnd { choice: c, finish });
        }
    }

    /// Whether the first leg is the one running (no failure yet).
    fn first_leg(&self) -> bool {
        self.target.is_none()
    }

    fn usage(&self) -> Usage {
        Usage {
            completion_tokens: self.completion,
            ..self.prompt
        }
    }

    /// The one FINAL; `finish` is for the choices without a CHOICE_END.
    fn finish(&mut self, status: Status, message: String, finish: Finish) {
        self.done = true;
        self.out.push_back(EngineEvent::Final(FinalEvent {
            status,
            message,
            finish,
            usage: self.usage(),
        }));
    }

    fn complete(&mut self) {
        self.finish(Status::Ok, String::new(), self.outputs.last());
    }

    fn fail(&mut self, status: Status, message: String) {
        self.finish(status, message, self.outputs.last());
    }

    fn leg_ended(&mut self, end: FinalEvent) {
        if self.first_leg() {
            self.prompt.prompt_tokens = end.usage.prompt_tokens;
            self.prompt.cached_prompt_tokens = end.usage.cached_prompt_tokens;
        }
        self.completion += end.usage.completion_tokens;
        match end.status {
            Status::Ok => {
                for c in self.outputs.open(&self.leg) {
                    self.end(c, end.finish);
                }
                match self.legs.pop_front() {
                    Some(leg) => self.start(leg),
                    None => self.complete(),
                }
            }
            Status::Internal | Status::Unavailable | Status::Unknown(_)
                if !self.cancelled.load(Ordering::Relaxed) && !self.targets.is_empty() =>
            {
                self.fail_over(&end.message);
            }
            status => self.finish(status, end.message, end.finish),
        }
    }

    /// The current leg failed: its open choices go to the next target that takes them.
    fn fail_over(&mut self, why: &str) {
        let restart = self.first_leg() && self.leg_tokens == 0;
        let open = self.outputs.open(&self.leg);
        while let Some(target) = self.targets.pop_front() {
            let exact = declares_resume(&target);
            let mut legs = VecDeque::new();
            if restart {
                let mut request = self.original.clone();
                request.model.clone_from(&target.engine_model);
                legs.push_back(Leg {
                    choices: open.clone(),
                    request,
                });
            } else {
                for &c in &open {
                    let output = self.outputs.of(c);
                    let next = continuation(
                        &self.original.prompt,
                        &self.original.params,
                        c,
                        output,
                        exact,
                    );
                    match next {
                        Some((prompt, params)) => legs.push_back(Leg {
                            choices: vec![c],
                            request: EngineRequest {
                                model: target.engine_model.clone(),
                                prompt,
                                params,
                                trace_context: self.original.trace_context.clone(),
                            },
                        }),
                        None => self.end(c, Finish::length()),
                    }
                }
            }
            tracing::warn!(
                model = %self.model,
                engine = %target.engine,
                request_id = self.original.params.request_id.as_deref().unwrap_or_default(),
                delivered = self.completion,
                error = why,
                "engine failed mid-request; resuming on the next"
            );
            metrics::counter!("turnpike_model_resumed_total", "model" => self.model.clone(), "engine" => target.engine.clone())
                .increment(1);
            let Some(leg) = legs.pop_front() else {
                return self.complete();
            };
            self.target = Some(target);
            self.legs = legs;
            match self.submit(leg) {
                Ok(()) => return,
                Err(e) if e.status == Status::Unavailable => {}
                Err(e) => return self.fail(e.status, e.message),
            }
        }
        self.fail(
            Status::Internal,
            format!("the engine failed mid-request: {why}"),
        )
    }

    /// Starts the next leg on the current target.
    fn start(&mut self, leg: Leg) {
        if self.cancelled.load(Ordering::Relaxed) {
            return self.fail(Status::Cancelled, "cancelled".into());
        }
        if let Err(e) = self.submit(leg) {
            self.fail(e.status, e.message);
        }
    }

    fn submit(&mut self, leg: Leg) -> Result<(), EngineError> {
        let target = self
            .target
            .as_ref()
            .ok_or_else(|| EngineError::internal("no target to resume on"))?;
        let mut run = target.backend.submit(&leg.request)?;
        self.current = std::mem::replace(&mut run.events, Box::pin(futures_util::stream::empty()));
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(run);
        self.leg = leg.choices;
        self.leg_tokens = 0;
        Ok(())
    }
}

/// Whether the target's model continues a resumed choice exactly.
fn declares_resume(target: &Target) -> bool {
    target.backend.models().is_ok_and(|models| {
        models
            .iter()
            .any(|m| m.id == target.engine_model && m.capabilities.resume)
    })
}
