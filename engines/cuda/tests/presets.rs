//! Every preset of the project's model maker (`turnpike make-model`) is a folder this engine
//! reads: its `config.json` validates, and sharded weights read the same as one file.

use turnpike_cuda::model::{ModelSpec, Weights};
use turnpike_tools::model::{MakeOptions, preset, presets, write_model};

#[test]
fn presets_are_valid_models() {
    for p in presets() {
        let spec = ModelSpec::from_json(&p.config().to_string());
        assert!(spec.is_ok(), "{}: {spec:?}", p.name);
    }
}

#[test]
fn sharded_weights_read_the_same_as_one_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let tiny = preset("tiny").unwrap_or_else(|| panic!("no tiny preset"));
    let (one, sharded) = (dir.path().join("one"), dir.path().join("sharded"));
    let written = write_model(&tiny, &one, MakeOptions::default()).and_then(|()| {
        let options = MakeOptions {
            shard_bytes: Some(64 * 1024),
            ..MakeOptions::default()
        };
        write_model(&tiny, &sharded, options)
    });
    written.unwrap_or_else(|e| panic!("{e}"));
    let open = |path: &std::path::Path| Weights::open(path).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (open(&one), open(&sharded));
    let name = "model.layers.1.mlp.down_proj.weight";
    let read = |w: &Weights| w.read(name).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read(&a), read(&b));
}
