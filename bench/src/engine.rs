//! The default engine on the CPU, through its real plugin: prefill and decode throughput and
//! time to first token, with the same workloads as `bench/engine_peer.py` runs through Hugging
//! Face `transformers` on the same weights (the peer; `bench/run-engine.sh` runs both).
//!
//! Usage: `engine-bench PLUGIN MODEL_DIR OUT_JSON`. Workloads (token ids are random, so the
//! prefix cache only hits where a measurement asks for it):
//! - `prefill`: one 512-token prompt, one output token; prompt tokens per second;
//! - `decode_1`: one 16-token prompt, 128 output tokens; output tokens per second of the run;
//! - `decode_16`: 16 such requests at once; output tokens per second of the run;
//! - `ttft_cold` / `ttft_prefix_hit`: a 512-token prompt, then the same prompt again.

#![allow(clippy::print_stdout, clippy::expect_used, clippy::unwrap_used)]

use std::time::Instant;

use serde_json::json;
use turnpike_engine_api::host::{EngineHandle, EngineRequest, Plugin};
use turnpike_engine_api::{EngineEvent, GenerationParams};

const RUNS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Prompts(u64);

impl Prompts {
    /// Random ids among the tokenizer's ordinary tokens (5..668).
    fn next(&mut self, len: usize) -> Vec<u32> {
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

fn params(max_tokens: u32) -> GenerationParams {
    GenerationParams {
        max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        ..GenerationParams::default()
    }
}

/// Runs requests at once; returns (seconds to the first token of the first request, seconds to
/// the last FINAL, output tokens).
async fn run(engine: &EngineHandle, prompts: Vec<Vec<u32>>, max_tokens: u32) -> (f64, f64, usize) {
    let start = Instant::now();
    let mut streams: Vec<_> = prompts
        .into_iter()
        .map(|prompt| {
            let request = EngineRequest {
                model: "bench".into(),
                prompt,
                params: params(max_tokens),
            };
            engine.submit(&request).expect("submit")
        })
        .collect();
    let mut first = None;
    let mut tokens = 0;
    for stream in &mut streams {
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
    }
    (first.unwrap_or(0.0), start.elapsed().as_secs_f64(), tokens)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: engine-bench PLUGIN MODEL_DIR OUT_JSON";
    let plugin = args.next().expect(usage);
    let model = args.next().expect(usage);
    let out = args.next().expect(usage);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let plugin = Plugin::load(&plugin).expect("load the plugin");
    let config = json!({"seed": 1, "models": [{"id": "bench", "path": model, "device": "cpu",
        "max_batch_tokens": 1024, "max_running": 32}]});
    let engine = plugin
        .create(&config.to_string())
        .expect("create the engine");
    let mut prompts = Prompts(7);
    // Warm up: page in the weights, start the threads.
    rt.block_on(run(&engine, vec![prompts.next(64)], 4));

    let mut prefill = Vec::new();
    let mut decode_1 = Vec::new();
    let mut decode_16 = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..RUNS {
        let (_, secs, _) = rt.block_on(run(&engine, vec![prompts.next(512)], 1));
        prefill.push(512.0 / secs);
        let (_, secs, tokens) = rt.block_on(run(&engine, vec![prompts.next(16)], 128));
        decode_1.push(tokens as f64 / secs);
        let batch = (0..16).map(|_| prompts.next(16)).collect();
        let (_, secs, tokens) = rt.block_on(run(&engine, batch, 128));
        decode_16.push(tokens as f64 / secs);
        let prompt = prompts.next(512);
        let (first, _, _) = rt.block_on(run(&engine, vec![prompt.clone()], 1));
        cold.push(first * 1000.0);
        let (first, _, _) = rt.block_on(run(&engine, vec![prompt], 1));
        warm.push(first * 1000.0);
    }
    let results = json!({
        "runs": RUNS,
        "statistic": "median",
        "prefill_tokens_per_s": median(prefill),
        "decode_1_tokens_per_s": median(decode_1),
        "decode_16_tokens_per_s": median(decode_16),
        "ttft_cold_ms": median(cold),
        "ttft_prefix_hit_ms": median(warm),
        "stats": engine.stats().map(|s| serde_json::to_value(s).unwrap_or_default()).unwrap_or_default(),
    });
    std::fs::write(&out, serde_json::to_string_pretty(&results).expect("json")).expect("write");
    println!("{results}");
}
