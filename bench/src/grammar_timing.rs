//! Grammar costs outside the engine's loop, with the engine's own grammar module: the time to
//! compute one token mask along a long JSON answer (p50/p99), and the time to compile a schema
//! (p50/p99 over distinct schemas; a repeated one comes from the cache).

use std::time::Instant;

use serde_json::{Value, json};
use turnpike_cuda::grammar::{Constraint, Grammars};
use turnpike_cuda::model::ModelFolder;
use turnpike_engine_api::json::Grammar;

/// The schema the decode workloads run under: a long array of small records, so structure
/// (not free text) decides most tokens and the answer never completes within the run.
pub(crate) fn bench_schema() -> Value {
    json!({
        "type": "array", "minItems": 500,
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                "tag": {"enum": ["alpha", "beta", "gamma"]},
                "ok": {"type": "boolean"},
            },
            "required": ["id", "tag", "ok"],
            "additionalProperties": false,
        }
    })
}

/// Distinct schemas to compile.
fn schemas() -> Vec<Value> {
    (0..40)
        .map(|i| {
            let mut properties = serde_json::Map::new();
            for p in 0..(1 + i % 6) {
                let leaf = match (i + p) % 4 {
                    0 => json!({"type": "string", "maxLength": 8 + p}),
                    1 => json!({"type": "integer", "minimum": 0, "maximum": 10 * (p + 1)}),
                    2 => json!({"enum": ["a", "b", format!("c{i}")]}),
                    _ => json!({"type": "array", "items": {"type": "boolean"}, "maxItems": 3}),
                };
                properties.insert(format!("f{i}_{p}"), leaf);
            }
            let required: Vec<&String> = properties.keys().collect();
            json!({"type": "object", "properties": properties, "required": required,
                   "additionalProperties": false})
        })
        .collect()
}

fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Mask and compile times for the model at `path`, in microseconds and milliseconds.
pub(crate) fn measure(path: &str) -> Value {
    let folder = ModelFolder::open(std::path::Path::new(path)).expect("open the model");
    let tokenizer = folder.tokenizer.as_ref().expect("a tokenizer");
    let vocab = folder.spec.vocab_size;
    let load = Instant::now();
    let grammars = Grammars::new(tokenizer, vocab, &folder.eos_token_ids);
    grammars.load().expect("grammar compiler");
    let load_ms = load.elapsed().as_secs_f64() * 1e3;

    let mut compile = Vec::new();
    for schema in schemas() {
        let t = Instant::now();
        grammars
            .constraint(&Grammar::JsonSchema { schema })
            .expect("compiles");
        compile.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let again = Instant::now();
    grammars
        .constraint(&Grammar::JsonSchema {
            schema: schemas()[0].clone(),
        })
        .expect("compiles");
    let cached_ms = again.elapsed().as_secs_f64() * 1e3;

    let mut c: Constraint = grammars
        .constraint(&Grammar::JsonSchema {
            schema: bench_schema(),
        })
        .expect("compiles");
    let mut masks = Vec::new();
    let mut state = 7u64;
    for _ in 0..1000 {
        let mut logits: Vec<f32> = (0..vocab)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 40) as f32
            })
            .collect();
        let t = Instant::now();
        c.mask(&mut logits).expect("a token is allowed");
        masks.push(t.elapsed().as_secs_f64() * 1e6);
        let token = (0..vocab)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .expect("a vocabulary") as u32;
        c.advance(token).expect("an allowed token");
    }
    json!({
        "grammar_load_ms": load_ms,
        "grammar_compile_ms_p50": percentile(compile.clone(), 0.5),
        "grammar_compile_ms_p99": percentile(compile, 0.99),
        "grammar_compile_cached_ms": cached_ms,
        "grammar_mask_us_p50": percentile(masks.clone(), 0.5),
        "grammar_mask_us_p99": percentile(masks, 0.99),
    })
}
