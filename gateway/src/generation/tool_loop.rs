//! The server-tool loop: a request offered the gateway's own tools (gateway plugins' server
//! tools) runs in rounds. When a round ends with calls of those tools only, the gateway runs
//! them, appends the calls and their results to the conversation, and starts the next round on
//! the same stream; the client sees one answer. The loop ends when a round answers without
//! calling a server tool, when it calls a client tool (that round is returned as it is, less
//! its server calls), or after `MAX_ROUNDS` rounds (the last round's calls then come back to
//! the client like any call).
//!
//! Each round is prepared like a request of its own (the guards see the whole conversation, the
//! tenant's token budget is charged per round, the model's queue is joined again), within the
//! request's one deadline. Usage is the sum of the rounds. Dropping the stream drops the round
//! under way: its engine work and any tool call still running are cancelled.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use serde_json::{Value, json};

use super::{Generation, Generator};
use crate::error::ApiError;
use crate::pipeline::request::{GenerationRequest, Prompt, ToolChoice, template_tool};
use crate::pipeline::run::{Finished, GenEvent, ServerToolRun, Totals};
use crate::plugins::ServerTool;
use crate::tenancy::Caller;

/// Most rounds of one request.
pub(crate) const MAX_ROUNDS: u32 = 8;

/// The next round: its generation, the tool runs to show first, and the conversation so far.
type NextRound = Pin<
    Box<
        dyn Future<Output = Result<(Generation, Vec<GenEvent>, GenerationRequest), ApiError>>
            + Send,
    >,
>;

/// A started round and the tool runs to show before it.
pub(crate) type Continued = (Generation, Vec<GenEvent>);

/// What one round has shown so far (choice 0; the loop serves `n` = 1).
#[derive(Debug, Default)]
struct Round {
    text: String,
    server_calls: Vec<(String, String, String)>,
    client_call: bool,
    /// `max_tokens` cut it: its calls may be cut short, so none runs.
    cut: bool,
}

/// The loop's state, held by the generation's stream.
pub(crate) struct ToolLoop {
    generator: Generator,
    caller: Caller,
    request: GenerationRequest,
    id: String,
    endpoint: &'static str,
    started: Instant,
    tools: Arc<Vec<ServerTool>>,
    rounds_left: u32,
    round: Round,
    totals: Totals,
    next: Option<NextRound>,
}

impl std::fmt::Debug for ToolLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolLoop")
            .field("id", &self.id)
            .field("rounds_left", &self.rounds_left)
            .field("next", &self.next.is_some())
            .finish_non_exhaustive()
    }
}

/// `request` offering `tools` beside its own (in the template's shape and the pipeline's).
pub(crate) fn offer(request: &GenerationRequest, tools: &[ServerTool]) -> GenerationRequest {
    let mut out = request.clone();
    if let Prompt::Chat { tools: shown, .. } = &mut out.prompt {
        let mut list = match shown.take() {
            Some(Value::Array(list)) => list,
            _ => Vec::new(),
        };
        list.extend(
            tools
                .iter()
                .map(|t| template_tool(&t.spec.name, &t.spec.description, &t.spec.parameters)),
        );
        *shown = Some(Value::Array(list));
    }
    for tool in tools {
        out.tools.names.push(tool.spec.name.clone());
        out.tools.schemas.push(tool.spec.parameters.clone());
        out.tools.strict.push(false);
    }
    out
}

fn add(totals: &mut Totals, more: Totals) {
    totals.prompt += more.prompt;
    totals.completion += more.completion;
    totals.cached += more.cached;
    totals.reasoning += more.reasoning;
    totals.cost = match (totals.cost, more.cost) {
        (Some(a), Some(b)) => Some(crate::spend::Money(a.0 + b.0)),
        (a, b) => a.or(b),
    };
}

impl ToolLoop {
    /// A loop for `request` (already offering `tools`), as started by `caller`.
    pub(crate) fn new(
        generator: Generator,
        caller: Caller,
        request: GenerationRequest,
        id: String,
        endpoint: &'static str,
        started: Instant,
        tools: Vec<ServerTool>,
    ) -> Self {
        Self {
            generator,
            caller,
            request,
            id,
            endpoint,
            started,
            tools: Arc::new(tools),
            rounds_left: MAX_ROUNDS - 1,
            round: Round::default(),
            totals: Totals::default(),
            next: None,
        }
    }

    fn is_server_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.spec.name == name)
    }

    /// Whether this round goes on to another.
    fn continues(&self) -> bool {
        !self.round.server_calls.is_empty() && !self.round.client_call && !self.round.cut
    }

    /// Whether a next round is being prepared.
    pub(crate) fn has_next_round(&self) -> bool {
        self.next.is_some()
    }

    /// Takes in one event of the round; what the client sees goes to `out`.
    pub(crate) fn observe(&mut self, event: GenEvent, out: &mut VecDeque<GenEvent>) {
        match event {
            GenEvent::Text {
                choice: 0,
                ref text,
                ..
            } => {
                self.round.text.push_str(text);
                out.push_back(event);
            }
            GenEvent::ToolCall {
                choice: 0,
                ref id,
                ref name,
                ref arguments,
                ..
            } if self.rounds_left > 0 && self.is_server_tool(name) => {
                self.round
                    .server_calls
                    .push((id.clone(), name.clone(), arguments.clone()));
            }
            GenEvent::ToolCall { .. } => {
                self.round.client_call = true;
                out.push_back(event);
            }
            GenEvent::Finish {
                reason: Finished::Length,
                ..
            } => {
                self.round.cut = true;
                out.push_back(event);
            }
            GenEvent::Finish { .. } if self.continues() => {}
            GenEvent::Usage(totals) if self.continues() => {
                add(&mut self.totals, totals);
                self.start_next_round();
            }
            GenEvent::Usage(totals) => {
                let mut all = self.totals;
                add(&mut all, totals);
                out.push_back(GenEvent::Usage(all));
            }
            other => out.push_back(other),
        }
    }

    /// Polls the next round's preparation, if one is under way.
    pub(crate) fn poll_next_round(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Option<Poll<Result<Continued, ApiError>>> {
        let next = self.next.as_mut()?;
        let polled = next.as_mut().poll(cx);
        Some(match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(done) => {
                self.next = None;
                Poll::Ready(done.map(|(generation, events, request)| {
                    self.request = request;
                    (generation, events)
                }))
            }
        })
    }

    fn start_next_round(&mut self) {
        self.rounds_left -= 1;
        let round = std::mem::take(&mut self.round);
        let generator = self.generator.clone();
        let caller = self.caller.clone();
        let tools = Arc::clone(&self.tools);
        let (id, endpoint, started) = (self.id.clone(), self.endpoint, self.started);
        let mut request = self.request.clone();
        // The conversation grows by this round's calls and their results.
        let calls: Vec<Value> = round
            .server_calls
            .iter()
            .map(|(id, name, arguments)| {
                let arguments = serde_json::from_str::<Value>(arguments)
                    .unwrap_or_else(|_| Value::String(arguments.clone()));
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        if let Prompt::Chat { messages, .. } = &mut request.prompt {
            messages.push(json!({"role": "assistant", "content": round.text, "tool_calls": calls}));
        }
        // The server tools are offered already (as `allowed_tools` narrowed them); a later round
        // names no server, so it adds none, nor starts a loop of its own.
        request.tools.hosted = Some(Vec::new());
        if matches!(
            request.tools.choice,
            ToolChoice::Required | ToolChoice::Named(_)
        ) {
            // A forced call was made; the next rounds choose for themselves.
            request.tools.choice = ToolChoice::Auto;
        }
        let pending: Vec<usize> = (0..round.server_calls.len()).collect();
        let future = async move {
            let host = generator.plugins();
            let tenant = caller.principal.tenant.name.clone();
            // Each answer as the model is shown it: at most its plugin's token budget.
            let tokenizer = &generator.model_for(&caller, &request.model)?.tokenizer;
            let runs = pending.iter().map(|&i| {
                let (call_id, name, arguments) = &round.server_calls[i];
                let tool = tools.iter().find(|t| &t.spec.name == name);
                let (host, tenant, model) = (&host, &tenant, &request.model);
                async move {
                    let output = match tool {
                        Some(tool) => {
                            host.run_tool(tool, arguments, tenant, model)
                                .await
                                .map(|text| {
                                    let budget = host.result_tokens(tool);
                                    super::tool_result::bounded(text, budget, tokenizer)
                                })
                        }
                        None => Err(format!("no server tool `{name}`")),
                    };
                    ServerToolRun {
                        choice: 0,
                        call_id: call_id.clone(),
                        server: tool
                            .map(|t| host.server_of(t).to_string())
                            .unwrap_or_default(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                        output,
                    }
                }
            });
            let results: Vec<ServerToolRun> = futures_util::future::join_all(runs).await;
            let mut request = request;
            if let Prompt::Chat { messages, .. } = &mut request.prompt {
                for run in &results {
                    let content = match &run.output {
                        Ok(text) => text.clone(),
                        Err(why) => format!("error: {why}"),
                    };
                    messages.push(
                        json!({"role": "tool", "tool_call_id": run.call_id, "content": content}),
                    );
                }
            }
            let prepared = generator
                .prepare(&caller, &request, &id, endpoint, started, true)
                .await?;
            let generation = prepared.start()?;
            let events = results
                .into_iter()
                .map(|run| GenEvent::ServerTool(Box::new(run)))
                .collect();
            Ok((generation, events, request))
        };
        self.next = Some(Box::pin(future));
    }
}
