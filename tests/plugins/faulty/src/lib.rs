//! A plugin that misbehaves on request, so tests can check that the SDK turns every fault into a
//! status or a FINAL event and that the host survives.
//!
//! Without faults it is a correct engine that generates synchronously inside `submit` (tokens
//! `1, 2, 3, ...` up to `max_tokens`), which also shows that a FINAL may come before `submit`
//! returns. Its configuration (`{"fault": ...}`) picks one fault:
//! - `panic_in_create`, `panic_in_models`, `panic_in_submit`, `panic_in_cancel`,
//!   `panic_in_stats`, `panic_in_health`, `panic_in_embed`, `panic_in_shutdown`: panic there;
//! - `panic_after_handoff`: move the sink to a thread that finishes it later, then panic in
//!   `submit` (the late events must not reach the host);
//! - `panic_in_worker`: a worker thread holding the sink panics mid-generation;
//! - `drop_sink`: accept, then drop the sink without finishing it;
//! - `final_then_error`: finish the request, then return an error from `submit`;
//! - `token_then_error`: send a token, then return an error from `submit`;
//! - `finish_late`: hand the sink to a detached thread that finishes it 100 ms later, also
//!   after `destroy` has begun;
//! - `leak_on_destroy`: keep sinks unfinished until the engine is destroyed.

use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use turnpike_engine_api::json::from_json_object;
use turnpike_engine_api::plugin::{EmbedRequest, Engine, Host, Request, Sink};
use turnpike_engine_api::{EngineError, Finish, ModelInfo, Stats, Usage};

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Fault {
    #[default]
    None,
    PanicInCreate,
    PanicInModels,
    PanicInSubmit,
    PanicInCancel,
    PanicInStats,
    PanicInHealth,
    PanicInEmbed,
    PanicInShutdown,
    PanicAfterHandoff,
    PanicInWorker,
    DropSink,
    FinalThenError,
    TokenThenError,
    FinishLate,
    LeakOnDestroy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    fault: Fault,
}

struct Faulty {
    fault: Fault,
    kept: Mutex<Vec<Sink>>,
}

fn usage(request: &Request, completion: u32) -> Usage {
    Usage {
        prompt_tokens: request.prompt.len() as u32,
        cached_prompt_tokens: 0,
        completion_tokens: completion,
    }
}

impl Engine for Faulty {
    fn create(_host: Host, config: &str) -> Result<Self, EngineError> {
        let config: Config = from_json_object(config)
            .map_err(|e| EngineError::invalid_config(format!("faulty config: {e}")))?;
        if config.fault == Fault::PanicInCreate {
            panic!("injected panic in create");
        }
        Ok(Self {
            fault: config.fault,
            kept: Mutex::default(),
        })
    }

    fn models(&self) -> Vec<ModelInfo> {
        if self.fault == Fault::PanicInModels {
            panic!("injected panic in models");
        }
        vec![ModelInfo {
            id: "faulty".into(),
            owned_by: None,
            max_context: 64,
            vocab_size: 100,
            eos_token_ids: vec![0],
            tokenizer: None,
            embedding_dim: Some(4),
            capabilities: Default::default(),
        }]
    }

    fn submit(&self, request: Request, mut sink: Sink) -> Result<(), EngineError> {
        if request.model != "faulty" {
            return Err(EngineError::not_found("unknown model"));
        }
        let tokens = request.params.max_tokens;
        match self.fault {
            Fault::PanicInSubmit => panic!("injected panic in submit"),
            Fault::PanicAfterHandoff => {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    sink.token(0, 1);
                    sink.complete(Finish::length(), usage(&request, 1));
                });
                panic!("injected panic after handing the sink to a thread");
            }
            Fault::PanicInWorker => {
                std::thread::spawn(move || {
                    sink.token(0, 1);
                    let _keep_sink_alive_while_panicking = &sink;
                    panic!("injected panic in a worker");
                });
                Ok(())
            }
            Fault::DropSink => {
                sink.token(0, 1);
                Ok(())
            }
            Fault::LeakOnDestroy => {
                sink.token(0, 1);
                self.kept
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(sink);
                Ok(())
            }
            Fault::TokenThenError => {
                sink.token(0, 1);
                Err(EngineError::internal("an error after a token"))
            }
            Fault::FinishLate => {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    sink.token(0, 1);
                    sink.complete(Finish::length(), usage(&request, 1));
                });
                Ok(())
            }
            Fault::FinalThenError => {
                sink.complete(Finish::length(), usage(&request, 0));
                Err(EngineError::internal("an error after the final event"))
            }
            _ => {
                for t in 0..tokens {
                    sink.token(0, 1 + t % 99);
                }
                sink.complete(Finish::length(), usage(&request, tokens));
                Ok(())
            }
        }
    }

    fn cancel(&self, _request_id: u64) {
        if self.fault == Fault::PanicInCancel {
            panic!("injected panic in cancel");
        }
    }

    fn stats(&self, base: Stats) -> Stats {
        if self.fault == Fault::PanicInStats {
            panic!("injected panic in stats");
        }
        base
    }

    fn health(&self) -> Result<(), EngineError> {
        if self.fault == Fault::PanicInHealth {
            panic!("injected panic in health");
        }
        Ok(())
    }

    const EMBEDDINGS: bool = true;

    fn embed(&self, request: EmbedRequest) -> Result<Vec<Vec<f32>>, EngineError> {
        if self.fault == Fault::PanicInEmbed {
            panic!("injected panic in embed");
        }
        if request.model != "faulty" {
            return Err(EngineError::not_found("unknown model"));
        }
        Ok(request.inputs.iter().map(|_| vec![0.5; 4]).collect())
    }

    fn shutdown(&self) {
        if self.fault == Fault::PanicInShutdown {
            panic!("injected panic in shutdown");
        }
    }
}

turnpike_engine_api::export_engine!(Faulty, "turnpike-faulty");
