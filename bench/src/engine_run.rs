//! What the engine benchmarks share: deterministic prompts and one run of concurrent requests
//! through a plugin, timed from the host's side.

use std::time::Instant;

use turnpike_engine_api::host::{EngineHandle, EngineRequest, Plugin};
use turnpike_engine_api::{EngineEvent, GenerationParams};

/// What every engine benchmark starts from: `NAME PLUGIN MODEL_DIR OUT_JSON` on the command
/// line, the loaded plugin and a runtime to drive it.
pub(crate) struct Setup {
    pub rt: tokio::runtime::Runtime,
    pub plugin: Plugin,
    pub model: String,
    pub out: String,
}

/// Reads the arguments of benchmark `name` and loads its plugin.
pub(crate) fn setup(name: &str) -> Setup {
    let mut args = std::env::args().skip(1);
    let usage = format!("usage: {name} PLUGIN MODEL_DIR OUT_JSON");
    let plugin = args.next().expect(&usage);
    let model = args.next().expect(&usage);
    let out = args.next().expect(&usage);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let plugin = Plugin::load(&plugin).expect("load the plugin");
    Setup {
        rt,
        plugin,
        model,
        out,
    }
}

/// The median of `v` (the upper one for an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Deterministic pseudo-random prompts.
pub(crate) struct Prompts(pub u64);

impl Prompts {
    /// Random ids among the project tokenizer's ordinary tokens (5..668), so the prefix cache
    /// only hits where a measurement asks for it.
    pub(crate) fn next(&mut self, len: usize) -> Vec<u32> {
        (0..len)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                5 + ((self.0 >> 33) % 663) as u32
            })
            .collect()
    }
}

/// Greedy, exactly `max_tokens` tokens.
pub(crate) fn params(max_tokens: u32) -> GenerationParams {
    GenerationParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        ..GenerationParams::default()
    }
}

/// Timings of one run, in seconds from its start.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timings {
    /// Per request, when its first token came.
    pub first_token: Vec<f64>,
    /// When the last request ended.
    pub end: f64,
    /// Output tokens of every request.
    pub tokens: usize,
}

impl Timings {
    /// The first token of the first request.
    pub(crate) fn earliest_first_token(&self) -> f64 {
        self.first_token
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// Decode tokens per second once every request has its first token: the tokens after the
    /// first of each, over the time from the last first token to the end.
    pub(crate) fn decode_tokens_per_s(&self) -> f64 {
        let started = self.first_token.iter().copied().fold(0.0, f64::max);
        let decoded = self.tokens.saturating_sub(self.first_token.len());
        decoded as f64 / (self.end - started).max(1e-9)
    }
}

/// Sends every prompt at once to model `model` and reads every stream concurrently.
pub(crate) async fn run(
    engine: &EngineHandle,
    model: &str,
    prompts: Vec<Vec<u32>>,
    max_tokens: u32,
) -> Timings {
    run_with(engine, model, prompts, params(max_tokens)).await
}

/// [`run`] with every request's parameters `params`.
pub(crate) async fn run_with(
    engine: &EngineHandle,
    model: &str,
    prompts: Vec<Vec<u32>>,
    params: GenerationParams,
) -> Timings {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for prompt in prompts {
        let request = EngineRequest {
            trace_context: None,
            model: model.into(),
            prompt,
            params: params.clone(),
        };
        let mut stream = engine.submit(&request).expect("submit");
        tasks.spawn(async move {
            let mut first = None;
            let mut tokens = 0;
            while let Some(event) = stream.recv().await {
                match event {
                    EngineEvent::Token(_) => {
                        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
                        tokens += 1;
                    }
                    EngineEvent::Final(f) => {
                        assert_eq!(f.status, turnpike_engine_api::Status::Ok, "{}", f.message);
                        break;
                    }
                    _ => {}
                }
            }
            (first.unwrap_or(0.0), tokens)
        });
    }
    let mut timings = Timings::default();
    while let Some(done) = tasks.join_next().await {
        let (first, tokens) = done.expect("a stream reader panicked");
        timings.first_token.push(first);
        timings.tokens += tokens;
    }
    timings.end = start.elapsed().as_secs_f64();
    timings
}
