//! Per-event cost of the sink -> stream bridge, on one core.
//!
//! Three measurements, each the median of several runs on a current-thread tokio runtime (run the
//! binary under `taskset -c 0` to hold everything, plugin threads included, to one core):
//! - `bridge`: token events delivered through the raw `on_event` callback, as a plugin calls it,
//!   and read back from the `EventReceiver` stream, in batches;
//! - `floor`, the peer: the same owned events sent through a plain tokio unbounded channel and
//!   read back the same way; the bridge's extra cost is the C boundary and the event conversion;
//! - `sim`: one long request through the real simulator plugin (its thread generating at zero
//!   latency, the consumer reading the stream), end to end.
//!
//! Usage: `bridge-bench SIM_PLUGIN_PATH OUT_DIR`. Writes `OUT_DIR/bridge.json` and prints a
//! Markdown table.

#![allow(clippy::print_stdout, clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use tokio::sync::mpsc::unbounded_channel;
use turnpike_engine_api::host::{EngineRequest, Plugin, sink_pair};
use turnpike_engine_api::{EngineEvent, GenerationParams, TokenEvent, TopLogprob};

const EVENTS: usize = 2_000_000;
const BATCH: usize = 64;
const RUNS: usize = 7;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn token(i: usize, top: &[TopLogprob]) -> TokenEvent {
    TokenEvent {
        choice: 0,
        token_id: i as u32,
        logprob: (!top.is_empty()).then_some(-0.5),
        top_logprobs: top.to_vec(),
    }
}

/// Nanoseconds per event through the bridge.
async fn bridge(top: &[TopLogprob]) -> f64 {
    let (sink, mut events) = sink_pair();
    let on_event = sink.on_event.expect("on_event");
    let start = Instant::now();
    let mut sent = 0;
    while sent < EVENTS {
        for _ in 0..BATCH {
            // The plugin side: a borrowed event, as `Sink::token_with_logprobs` builds it.
            EngineEvent::Token(token(sent, &[])).with_raw(|raw| {
                let mut raw = *raw;
                if !top.is_empty() {
                    raw.flags |= turnpike_engine_api::abi::TP_EVENT_FLAG_LOGPROB;
                    raw.top_logprobs = top.as_ptr();
                    raw.num_top_logprobs = top.len() as u32;
                }
                // SAFETY: `sink` is live until released below; `raw` is valid for the call.
                unsafe { on_event(sink.ctx, &raw) };
            });
            sent += 1;
        }
        for _ in 0..BATCH {
            std::hint::black_box(events.recv().await);
        }
    }
    let elapsed = start.elapsed().as_nanos() as f64 / EVENTS as f64;
    // SAFETY: released exactly once, after the last event.
    unsafe { sink.release.expect("release")(sink.ctx) };
    elapsed
}

/// Nanoseconds per event through a plain channel of the same owned events (the peer).
async fn floor(top: &[TopLogprob]) -> f64 {
    let (tx, mut rx) = unbounded_channel();
    let start = Instant::now();
    let mut sent = 0;
    while sent < EVENTS {
        for _ in 0..BATCH {
            tx.send(EngineEvent::Token(token(sent, top))).expect("send");
            sent += 1;
        }
        for _ in 0..BATCH {
            std::hint::black_box(rx.recv().await);
        }
    }
    start.elapsed().as_nanos() as f64 / EVENTS as f64
}

/// Events per second through the simulator plugin, end to end.
async fn through_sim(plugin: &Plugin) -> f64 {
    let config = json!({"models": [{"id": "bench", "max_context": 4_000_000}]});
    let engine = plugin.create(&config.to_string()).expect("create");
    let params = GenerationParams {
        max_tokens: EVENTS as u32,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    let request = EngineRequest {
        trace_context: None,
        model: "bench".into(),
        prompt: vec![1, 2, 3],
        params,
    };
    let start = Instant::now();
    let mut stream = engine.submit(&request).expect("submit");
    let mut events = 0usize;
    while let Some(event) = stream.recv().await {
        events += 1;
        std::hint::black_box(event);
    }
    events as f64 / start.elapsed().as_secs_f64()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let sim = PathBuf::from(args.next().expect("usage: bridge-bench SIM_PLUGIN OUT_DIR"));
    let out_dir = PathBuf::from(args.next().expect("usage: bridge-bench SIM_PLUGIN OUT_DIR"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let plugin = Plugin::load(&sim).expect("load the simulator");
    let top: Vec<TopLogprob> = (0..5)
        .map(|i| TopLogprob {
            token_id: i,
            logprob: -(i as f32) - 0.5,
        })
        .collect();

    // Bridge and peer run alternately, so drift in the machine's speed (a shared VM's is large)
    // hits both alike; each pair gives one ratio.
    let paired = |bridge_run: &dyn Fn() -> f64, peer_run: &dyn Fn() -> f64| {
        let pairs: Vec<(f64, f64)> = (0..RUNS).map(|_| (bridge_run(), peer_run())).collect();
        let ratios: Vec<f64> = pairs.iter().map(|(b, p)| b / p).collect();
        json!({
            "bridge_ns_per_event": median(pairs.iter().map(|p| p.0).collect()),
            "peer_ns_per_event": median(pairs.iter().map(|p| p.1).collect()),
            "ratio_bridge_to_peer": median(ratios.clone()),
            "ratio_min": ratios.iter().copied().fold(f64::INFINITY, f64::min),
            "ratio_max": ratios.iter().copied().fold(0.0, f64::max),
        })
    };
    let plain = paired(&|| runtime.block_on(bridge(&[])), &|| {
        runtime.block_on(floor(&[]))
    });
    let with_top = paired(&|| runtime.block_on(bridge(&top)), &|| {
        runtime.block_on(floor(&top))
    });
    let sim_rate = median(
        (0..RUNS)
            .map(|_| runtime.block_on(through_sim(&plugin)))
            .collect(),
    );

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let results = json!({
        "benchmark": "bridge",
        "events_per_run": EVENTS,
        "batch": BATCH,
        "runs": RUNS,
        "statistic": "median (ratios: median, min and max of per-pair ratios)",
        "cpu": cpu_model(),
        "cores_available": cores,
        "peer": "tokio unbounded channel carrying the same owned events",
        "token_events": plain,
        "token_events_with_5_top_logprobs": with_top,
        "sim_plugin_end_to_end_events_per_s": sim_rate,
    });
    std::fs::create_dir_all(&out_dir).expect("out dir");
    let path = out_dir.join("bridge.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&results).expect("json") + "\n",
    )
    .expect("write");

    println!("| path | ns/event | events/s | ratio to peer (min-max) |");
    println!("|---|---|---|---|");
    for (name, row) in [
        ("token events", &plain),
        ("tokens with 5 top logprobs", &with_top),
    ] {
        let ns = |key: &str| row[key].as_f64().unwrap_or(f64::NAN);
        let (b, p) = (ns("bridge_ns_per_event"), ns("peer_ns_per_event"));
        println!(
            "| bridge, {name} | {b:.1} | {:.2e} | {:.2}x ({:.2}-{:.2}) |",
            1e9 / b,
            ns("ratio_bridge_to_peer"),
            ns("ratio_min"),
            ns("ratio_max")
        );
        println!(
            "| peer: tokio channel, {name} | {p:.1} | {:.2e} | 1.00x |",
            1e9 / p
        );
    }
    println!(
        "| sim plugin thread -> bridge -> stream | {:.1} | {sim_rate:.2e} | |",
        1e9 / sim_rate
    );
    println!("\nwrote {}", path.display());
}
