//! The default engine on the CPU, through its real plugin: prefill and decode throughput and
//! time to first token, with the same workloads as `bench/engine_peer.py` runs through Hugging
//! Face `transformers` on the same weights (the peer; `bench/run-engine.sh` runs both).
//!
//! Usage: `engine-bench PLUGIN MODEL_DIR OUT_JSON`. Workloads (token ids are random, so the
//! prefix cache only hits where a measurement asks for it):
//! - `prefill`: one 512-token prompt (`PROMPT_LEN` tokens where set: a length that is not a
//!   multiple of the block size shows partial-block reuse), one output token; prompt tokens
//!   per second;
//! - `decode_1`: one 16-token prompt, 128 output tokens; output tokens per second of the run;
//! - `decode_8` / `decode_16`: 8 or 16 such requests at once; output tokens per second of the run;
//! - `ttft_cold` / `ttft_prefix_hit`: a prompt of that length, then the same prompt again;
//! - `decode_1_json` / `decode_16_json`: as `decode_1` / `decode_16` under a JSON Schema grammar
//!   (a long array of records, so the grammar decides most tokens), with the tokens it forces
//!   fast-forwarded (the default); `..._json_masked`: the same with fast-forward off (a second
//!   engine on the same model), masking alone; `..._beside_json`: that engine unconstrained,
//!   interleaved with those runs (the base the cost of masking is taken against); and
//!   `grammar`: mask time
//!   per token and compile time per schema, measured on the engine's grammar module directly;
//! - `rss_after_load_mib` / `rss_load_peak_mib` / `rss_peak_mib`: this process's resident
//!   memory once the model is loaded, its high-water mark then (loading's peak), and its
//!   high-water mark at the end.
//!
//! `ENGINE_BENCH_QUICK=1` runs the first group alone (prefill, decode, time to first token,
//! memory), three times, and prints it without writing `OUT_JSON`: for trying a change.
//! `ENGINE_BENCH_PREFILL=N` runs the prefill workload alone, N times, and prints each rate: a
//! steady prompt load to profile (`perf record -p`), with no decoding steps mixed in.
//! `ENGINE_BENCH_WARM=N` prints a decoding step's time, then runs one prompt N times more and
//! prints each time to first token: a steady load of prefix hits, to compare with the step.

#![allow(clippy::print_stdout, clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;

// Shared with engine-gpu-bench, which uses more of it.
#[allow(dead_code)]
#[path = "engine_run.rs"]
mod engine_run;

mod grammar_timing;

use engine_run::{Prompts, Setup, median, params, run, run_with, setup};
use turnpike_engine_api::json::Grammar;

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
    let rss_after_load = status_mib("VmRSS");
    let rss_load_peak = status_mib("VmHWM");

    let mut prefill = Vec::new();
    let mut decode_1 = Vec::new();
    let mut decode_8 = Vec::new();
    let mut decode_16 = Vec::new();
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut decode_1_json = Vec::new();
    let mut decode_16_json = Vec::new();
    let json = {
        let mut p = params(128);
        p.grammar = Some(Grammar::JsonSchema {
            schema: grammar_timing::bench_schema(),
        });
        p
    };
    let prompt_len: usize = std::env::var("PROMPT_LEN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    if let Some(times) = count_from("ENGINE_BENCH_PREFILL") {
        for _ in 0..times {
            let t = rt.block_on(run(&engine, "bench", vec![prompts.next(prompt_len)], 1));
            println!("prefill_tokens_per_s {}", prompt_len as f64 / t.end);
        }
        return;
    }
    if let Some(times) = count_from("ENGINE_BENCH_WARM") {
        let prompt = prompts.next(prompt_len);
        rt.block_on(run(&engine, "bench", vec![prompt.clone()], 1));
        let t = rt.block_on(run(&engine, "bench", vec![prompts.next(16)], 64));
        println!("decode_1 step ms {}", t.end * 1000.0 / t.tokens as f64);
        for _ in 0..times {
            let t = rt.block_on(run(&engine, "bench", vec![prompt.clone()], 1));
            println!("warm ttft ms {}", t.earliest_first_token() * 1000.0);
        }
        return;
    }
    let quick = std::env::var_os("ENGINE_BENCH_QUICK").is_some();
    for _ in 0..if quick { 3 } else { RUNS } {
        let t = rt.block_on(run(&engine, "bench", vec![prompts.next(prompt_len)], 1));
        prefill.push(prompt_len as f64 / t.end);
        let t = rt.block_on(run(&engine, "bench", vec![prompts.next(16)], 128));
        decode_1.push(t.tokens as f64 / t.end);
        let batch = (0..8).map(|_| prompts.next(16)).collect();
        let t = rt.block_on(run(&engine, "bench", batch, 128));
        decode_8.push(t.tokens as f64 / t.end);
        let batch = (0..16).map(|_| prompts.next(16)).collect();
        let t = rt.block_on(run(&engine, "bench", batch, 128));
        decode_16.push(t.tokens as f64 / t.end);
        let prompt = prompts.next(prompt_len);
        let t = rt.block_on(run(&engine, "bench", vec![prompt.clone()], 1));
        cold.push(t.earliest_first_token() * 1000.0);
        let t = rt.block_on(run(&engine, "bench", vec![prompt], 1));
        warm.push(t.earliest_first_token() * 1000.0);
    }
    // Read before the bandwidth measurement, whose buffer would raise it.
    let rss_peak = status_mib("VmHWM");
    let core = json!({
        "prefill_tokens_per_s": median(prefill),
        "decode_1_tokens_per_s": median(decode_1),
        "decode_8_tokens_per_s": median(decode_8),
        "decode_16_tokens_per_s": median(decode_16),
        "ttft_cold_ms": median(cold),
        "ttft_prefix_hit_ms": median(warm),
        "rss_after_load_mib": rss_after_load,
        "rss_peak_mib": rss_peak,
    });
    if quick {
        println!("{core}");
        return;
    }
    // Under a grammar, after the peak is read: the peers run no such workload (their cached
    // blocks would not count against them).
    // The same model with grammar fast-forward off, in a second engine made only now: masking
    // alone, which is what a grammar costs where it forces nothing.
    let masked_config = json!({"seed": 1, "models": [{"id": "masked", "path": model, "device": "cpu",
        "max_batch_tokens": 1024, "max_running": 32, "grammar_fast_forward": false}]});
    let masked = plugin
        .create(&masked_config.to_string())
        .expect("create the second engine");
    rt.block_on(run(&masked, "masked", vec![prompts.next(64)], 4));
    let mut decode_1_masked = Vec::new();
    let mut decode_16_masked = Vec::new();
    // Unconstrained decoding again, interleaved with the constrained runs on the same engine,
    // so the cost of masking is a ratio of neighbours (the machine's speed drifts over a run).
    let mut decode_1_beside = Vec::new();
    let mut decode_16_beside = Vec::new();
    let plain = params(128);
    for _ in 0..RUNS {
        for (engine, id, p, one, sixteen) in [
            (
                &engine,
                "bench",
                &json,
                &mut decode_1_json,
                &mut decode_16_json,
            ),
            (
                &masked,
                "masked",
                &json,
                &mut decode_1_masked,
                &mut decode_16_masked,
            ),
            (
                &masked,
                "masked",
                &plain,
                &mut decode_1_beside,
                &mut decode_16_beside,
            ),
        ] {
            let t = rt.block_on(run_with(engine, id, vec![prompts.next(16)], p.clone()));
            one.push(t.tokens as f64 / t.end);
            let batch = (0..16).map(|_| prompts.next(16)).collect();
            let t = rt.block_on(run_with(engine, id, batch, p.clone()));
            sixteen.push(t.tokens as f64 / t.end);
        }
    }
    let bandwidth = read_bandwidth_gb_per_s();
    let mut results = json!({
        "runs": RUNS,
        "statistic": "median",
        "decode_1_json_tokens_per_s": median(decode_1_json),
        "decode_16_json_tokens_per_s": median(decode_16_json),
        "decode_1_json_masked_tokens_per_s": median(decode_1_masked),
        "decode_16_json_masked_tokens_per_s": median(decode_16_masked),
        "decode_1_beside_json_tokens_per_s": median(decode_1_beside),
        "decode_16_beside_json_tokens_per_s": median(decode_16_beside),
        "grammar": grammar_timing::measure(&model),
        "rss_load_peak_mib": rss_load_peak,
        "memory_read_gb_per_s": bandwidth,
        "prompt_len": prompt_len,
        "stats": engine.stats().map(|s| serde_json::to_value(s).unwrap_or_default()).unwrap_or_default(),
    });
    if let (Some(all), Some(core)) = (results.as_object_mut(), core.as_object()) {
        all.extend(core.clone());
    }
    std::fs::write(&out, serde_json::to_string_pretty(&results).expect("json")).expect("write");
    println!("{results}");
}

/// A memory figure of this process from `/proc/self/status`, in MiB (0 where unreadable).
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// This machine's memory read bandwidth with every core reading its part of a 512 MiB buffer
/// (best of three), for the bytes a decode step reads against what the memory can deliver.
fn read_bandwidth_gb_per_s() -> f64 {
    let words: usize = 64 << 20;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut best = 0.0f64;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let parts: Vec<_> = buffer
                .chunks(words.div_ceil(threads))
                .map(|part| s.spawn(move || part.iter().fold(0u64, |a, &b| a.wrapping_add(b))))
                .collect();
            parts
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max((words * 8) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// The count an environment variable sets, if it sets one.
fn count_from(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}
