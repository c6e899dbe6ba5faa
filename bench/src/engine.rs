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

use serde_json::json;

// Shared with engine-gpu-bench, which uses more of it.
#[allow(dead_code)]
#[path = "engine_run.rs"]
mod engine_run;

use engine_run::{Prompts, Setup, median, run, setup};

const RUNS: usize = 5;

fn main() {
    let Setup {
        rt,
        plugin,
        model,
        out,
    } = setup("engine-bench");
    let config = json!({"seed": 1, "models": [{"id": "bench", "path": model, "device": "cpu",
        "max_batch_tokens": 1024, "max_running": 32}]});
    let engine = plugin
        .create(&config.to_string())
        .expect("create the engine");
    let mut prompts = Prompts(7);
    // Warm up: page in the weights, start the threads.
    rt.block_on(run(&engine, "bench", vec![prompts.next(64)], 4));

    let mut prefill = Vec::new();
    let mut decode_1 = Vec::new();
    let mut decode_16 = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..RUNS {
        let t = rt.block_on(run(&engine, "bench", vec![prompts.next(512)], 1));
        prefill.push(512.0 / t.end);
        let t = rt.block_on(run(&engine, "bench", vec![prompts.next(16)], 128));
        decode_1.push(t.tokens as f64 / t.end);
        let batch = (0..16).map(|_| prompts.next(16)).collect();
        let t = rt.block_on(run(&engine, "bench", batch, 128));
        decode_16.push(t.tokens as f64 / t.end);
        let prompt = prompts.next(512);
        let t = rt.block_on(run(&engine, "bench", vec![prompt.clone()], 1));
        cold.push(t.earliest_first_token() * 1000.0);
        let t = rt.block_on(run(&engine, "bench", vec![prompt], 1));
        warm.push(t.earliest_first_token() * 1000.0);
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
