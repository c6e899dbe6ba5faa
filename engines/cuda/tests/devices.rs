//! Device selection where there is no GPU (every CI machine): `device = "cuda"` is a
//! configuration error that names what is missing, never a panic, and `auto` serves on the CPU.
//! On a machine with a usable GPU the test has nothing to check and says so.

use serde_json::json;
use turnpike_cuda::DefaultEngine;
use turnpike_engine_api::Status;
use turnpike_engine_api::plugin::{Engine, Host};
use turnpike_tools::model::{MakeOptions, preset, write_model};

#[test]
fn cuda_without_a_gpu_is_a_clear_error_and_auto_falls_back_to_the_cpu() {
    if let Ok(found) = turnpike_cuda::gpu::probe::probe() {
        eprintln!("a GPU is present ({found:?}); bench/gpu/run.sh covers this machine");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let folder = dir.path().join("tiny");
    let tiny = preset("tiny").unwrap_or_else(|| panic!("no tiny preset"));
    write_model(
        &tiny,
        &folder,
        MakeOptions {
            seed: 1,
            dtype: None,
            shard_bytes: None,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let config = |device: &str| {
        json!({"models": [{"id": "m", "path": folder, "device": device}]}).to_string()
    };

    let refused = DefaultEngine::create(Host::detached(), &config("cuda")).err();
    let refused = refused.unwrap_or_else(|| panic!("device cuda started without a GPU"));
    assert_eq!(refused.status, Status::InvalidConfig);
    assert!(
        refused.message.contains("device `cuda`") && refused.message.contains("not found"),
        "{}",
        refused.message
    );

    let engine = DefaultEngine::create(Host::detached(), &config("auto"))
        .unwrap_or_else(|e| panic!("{}", e.message));
    assert_eq!(engine.models()[0].id, "m");
    engine.shutdown();
}
