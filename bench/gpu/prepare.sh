#!/usr/bin/env bash
# Builds what bench/gpu/run.sh needs on a GPU machine that has no Rust toolchain: the gateway
# (for `make-model`), the engine plugin, the reference tool and the GPU benchmark, stripped,
# into bench/gpu/dist/ (ignored by git; about 30 MB).
#   bench/gpu/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p turnpike -p turnpike-cuda -p turnpike-bench
dist=bench/gpu/dist
rm -rf "$dist"
mkdir -p "$dist"
for file in turnpike libturnpike_cuda.so turnpike-cuda-reference turnpike-cuda-profile engine-gpu-bench; do
  objcopy --strip-debug "target/release/$file" "$dist/$file"
done
du -sh "$dist"
