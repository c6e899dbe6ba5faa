//! The default engine's CUDA device through its real plugin: decode throughput at several
//! concurrencies and time to first token for long prompts. `bench/gpu/run.sh` runs it on the
//! Llama-3.2-1B- and Llama-3.1-8B-shaped presets beside `transformers` and the GPU's measured
//! memory bandwidth.
//!
//! Usage: `engine-gpu-bench PLUGIN MODEL_DIR OUT_JSON`. Workloads (random prompt ids):
//! - `decode_C` for C in 1, 8, 64, 256: C requests of 128 prompt tokens and 256 output tokens
//!   at once; decode tokens per second once every request has its first token;
//! - `ttft_1k`, `ttft_4k`: one prompt of 1024 or 4096 tokens, one output token; medians of 5.

#![allow(clippy::print_stdout, clippy::expect_used, clippy::unwrap_used)]

#[path = "engine_run.rs"]
mod engine_run;

use serde_json::{Value, json};

use engine_run::{Prompts, Setup, median, run, setup};

const CONCURRENCY: &[usize] = &[1, 8, 64, 256];
const PROMPT: usize = 128;
const OUTPUT: u32 = 256;
const RUNS: usize = 5;

fn main() {
    let Setup {
        rt,
        plugin,
        model,
        out,
    } = setup("engine-gpu-bench");
    let config = json!({"seed": 1, "models": [{"id": "bench", "path": model, "device": "cuda",
        "max_batch_tokens": 8192, "max_running": 256, "max_n": 1, "max_context": 8192}]});
    let engine = plugin
        .create(&config.to_string())
        .expect("create the engine");
    let mut prompts = Prompts(11);
    let mut results = serde_json::Map::new();
    for &c in CONCURRENCY {
        // Twice first: a bucket runs eagerly once, is captured the next time, then replays.
        for _ in 0..2 {
            let warm = (0..c).map(|_| prompts.next(PROMPT)).collect();
            rt.block_on(run(&engine, "bench", warm, 8));
        }
        let mut rates = Vec::new();
        for _ in 0..3 {
            let batch = (0..c).map(|_| prompts.next(PROMPT)).collect();
            rates.push(
                rt.block_on(run(&engine, "bench", batch, OUTPUT))
                    .decode_tokens_per_s(),
            );
        }
        let rate = median(rates);
        println!("decode at {c}: {rate:.1} tokens/s");
        results.insert(format!("decode_{c}_tokens_per_s"), json!(rate));
    }
    for (name, len) in [("ttft_1k_ms", 1024), ("ttft_4k_ms", 4096)] {
        rt.block_on(run(&engine, "bench", vec![prompts.next(len)], 1));
        let times = (0..RUNS)
            .map(|_| {
                let t = rt.block_on(run(&engine, "bench", vec![prompts.next(len)], 1));
                t.earliest_first_token() * 1000.0
            })
            .collect();
        let ms = median(times);
        println!("{name}: {ms:.1}");
        results.insert(name.into(), json!(ms));
    }
    results.insert("prompt_tokens".into(), json!(PROMPT));
    results.insert("output_tokens".into(), json!(OUTPUT));
    let stats = engine
        .stats()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or(Value::Null);
    results.insert("stats".into(), stats);
    let text = serde_json::to_string_pretty(&Value::Object(results)).expect("json");
    std::fs::write(&out, text).expect("write");
}
