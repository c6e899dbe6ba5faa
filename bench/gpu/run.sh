#!/usr/bin/env bash
# The CUDA device on a GPU machine with CUDA, PyTorch and transformers (no Rust toolchain, no
# network): run bench/gpu/prepare.sh first where Rust is, then this from the repository root.
#   1. correctness: the CUDA device against the CPU device and against transformers in bf16 on
#      the same random-weight models (bench/results/gpu-correctness.json), and grammar-
#      constrained answers through the real gateway (bench/results/gpu-grammar.json);
#   2. speed: decode tokens/s at 1, 8, 64 and 256 sequences and time to first token at 1k and
#      4k tokens on the Llama-3.2-1B- and Llama-3.1-8B-shaped presets, beside transformers and
#      the GPU's measured memory bandwidth (bench/results/gpu.{json,md}).
# PYTHON picks the interpreter that has torch (python3 by default); WORK, where models go.
#   bench/gpu/run.sh [correctness|speed|all]
set -euo pipefail
cd "$(dirname "$0")/../.."
dist=bench/gpu/dist
[ -x "$dist/turnpike" ] || { echo "no $dist: run bench/gpu/prepare.sh where Rust is first"; exit 1; }
py=${PYTHON:-python3}
# The CUDA libraries that come with PyTorch's wheels (cuBLAS, NVRTC), for the plugin's dlopen.
extra=$("$py" - <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "nvidia", "*", "lib", "*.so*"))})
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=${WORK:-$(mktemp -d)}
mkdir -p "$work" bench/results
what=${1:-all}
status=0
if [ "$what" = correctness ] || [ "$what" = all ]; then
  # A failed check still lets the speed run record its figures; the exit status keeps it.
  "$py" bench/gpu/correctness.py --dist "$dist" --work "$work" --out bench/results/gpu-correctness.json || status=$?
  "$py" bench/gpu/grammar.py --dist "$PWD/$dist" --work "$work" --out bench/results/gpu-grammar.json || status=$?
fi
if [ "$what" = speed ] || [ "$what" = all ]; then
  "$py" bench/gpu/speed.py --dist "$dist" --work "$work" --out bench/results/gpu
fi
exit "$status"
