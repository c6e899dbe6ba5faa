//! A minimal Turnpike engine plugin in Rust.
//!
//! It serves one model, `echo`, that repeats the prompt back one token at a time on a thread per
//! request, then ends with its end-of-sequence token. It honours `max_tokens`, `ignore_eos`,
//! `stop_token_ids` and `cancel`, and `destroy` waits for its threads. Everything else (panics
//! caught at the boundary, FINAL exactly once, release exactly once) comes from the SDK.
//!
//! Build it with `cargo build --release -p turnpike-example-engine`; the plugin is
//! `target/release/libturnpike_example_engine.so`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Deserialize;
use turnpike_engine_api::json::from_json_object;
use turnpike_engine_api::plugin::{Engine, Host, Request, Sink};
use turnpike_engine_api::{EngineError, Finish, ModelInfo, Usage};

const MODEL: &str = "echo";
const VOCAB: u32 = 32_000;
const EOS: u32 = 2;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Pause before each token.
    #[serde(default = "default_interval")]
    token_interval_ms: u64,
}

fn default_interval() -> u64 {
    1
}

struct Job {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

struct EchoEngine {
    interval: Duration,
    jobs: Mutex<HashMap<u64, Job>>,
    host: Host,
}

impl EchoEngine {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Job>> {
        self.jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn run(request: Request, mut sink: Sink, stop: &AtomicBool, interval: Duration) {
    let params = &request.params;
    let mut usage = Usage {
        prompt_tokens: request.prompt.len() as u32,
        ..Usage::default()
    };
    for i in 0..params.max_tokens as usize {
        if stop.load(Ordering::Acquire) {
            return sink.cancelled(usage);
        }
        std::thread::sleep(interval);
        let token = match request.prompt.get(i) {
            Some(&token) => token,
            None if params.ignore_eos && !request.prompt.is_empty() => {
                request.prompt[i % request.prompt.len()]
            }
            None => EOS,
        };
        usage.completion_tokens += 1;
        let is_eos = token == EOS && !params.ignore_eos;
        if is_eos || params.stop_token_ids.contains(&token) {
            return sink.complete(Finish::stop(token), usage);
        }
        sink.token(0, token);
    }
    sink.complete(Finish::length(), usage);
}

impl Engine for EchoEngine {
    fn create(host: Host, config: &str) -> Result<Self, EngineError> {
        let config: Config = from_json_object(config)
            .map_err(|e| EngineError::invalid_config(format!("echo engine config: {e}")))?;
        host.info("echo engine ready");
        let interval = Duration::from_millis(config.token_interval_ms);
        Ok(Self {
            interval,
            jobs: Mutex::default(),
            host,
        })
    }

    fn models(&self) -> Vec<ModelInfo> {
        vec![ModelInfo {
            id: MODEL.into(),
            owned_by: Some("turnpike-examples".into()),
            max_context: 4096,
            vocab_size: VOCAB,
            eos_token_ids: vec![EOS],
            tokenizer: None,
            embedding_dim: None,
            capabilities: Default::default(),
        }]
    }

    fn submit(&self, request: Request, sink: Sink) -> Result<(), EngineError> {
        if request.model != MODEL {
            return Err(EngineError::not_found(format!(
                "no model `{}`",
                request.model
            )));
        }
        if request.params.n != 1 {
            return Err(EngineError::unsupported(
                "the echo engine generates one choice",
            ));
        }
        if let Some(bad) = request.prompt.iter().find(|&&t| t >= VOCAB) {
            return Err(EngineError::invalid_request(format!(
                "token id {bad} is out of range"
            )));
        }
        let id = request.id;
        let stop = Arc::new(AtomicBool::new(false));
        let interval = self.interval;
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("echo-{id}"))
            .spawn(move || run(request, sink, &flag, interval))
            .map_err(|e| EngineError::internal(format!("cannot start a thread: {e}")))?;
        let mut jobs = self.jobs();
        jobs.retain(|_, job| !job.thread.is_finished());
        jobs.insert(id, Job { stop, thread });
        Ok(())
    }

    fn cancel(&self, request_id: u64) {
        if let Some(job) = self.jobs().get(&request_id) {
            job.stop.store(true, Ordering::Release);
        }
    }

    fn shutdown(&self) {
        let jobs: Vec<Job> = self.jobs().drain().map(|(_, job)| job).collect();
        for job in &jobs {
            job.stop.store(true, Ordering::Release);
        }
        for job in jobs {
            if job.thread.join().is_err() {
                self.host.error("an echo thread panicked");
            }
        }
    }
}

turnpike_engine_api::export_engine!(EchoEngine, "echo-rust");
