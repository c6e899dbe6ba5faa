#!/usr/bin/env bash
# The CUDA device on a GPU machine with CUDA, PyTorch and transformers (no Rust toolchain, no
# network): run bench/gpu/prepare.sh first where Rust is, then this from the repository root.
#   1. correctness: the CUDA device against the CPU device and against transformers in bf16 on
#      the same random-weight models (bench/results/gpu-correctness.json), and grammar-
#      constrained answers through the real gateway (bench/results/gpu-grammar.json);
#   2. speed: decode tokens/s at 1, 8, 64 and 256 sequences and time to first token at 1k and
#      4k tokens on the Llama-3.2-1B- and Llama-3.1-8B-shaped presets, beside transformers and
#      the GPU's measured memory bandwidth (bench/results/gpu.{json,md});
#   3. speculative: drafts (prompt lookup, self-speculation, a draft model) and beams through the
#      real gateway: greedy answers equal plain decoding's, and batch-1 tokens/s with each
#      drafter over without (bench/results/gpu-speculative.json).
# PYTHON picks the interpreter that has torch (python3 by default); WORK, where models go.
# SPEED_PRESETS narrows the speed run (comma-separated presets); SPEED_PEER=0 skips transformers;
# SPEED_OUT writes the figures elsewhere than bench/results/gpu.{json,md}.
#   bench/gpu/run.sh [smoke|profile|correctness|speed|speculative|all]
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
work=${WORK:-$(mktemp -d)}
mkdir -p "$work" bench/results
# The plugin asks for libnvrtc.so / libcublas.so / libcublasLt.so or their CUDA 12 names; the
# wheels of a CUDA 13 PyTorch carry only `.so.13`. Give each found library its plain name.
links="$work/cuda-libs"
mkdir -p "$links"
for lib in nvrtc cublas cublasLt; do
  found=$(IFS=:; for d in $extra /usr/local/cuda/lib64; do ls "$d/lib$lib.so".* 2>/dev/null || true; done | sort -V | tail -1)
  [ -n "$found" ] && ln -sf "$found" "$links/lib$lib.so"
done
export LD_LIBRARY_PATH="${links}:${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
what=${1:-all}
status=0
if [ "$what" = smoke ]; then
  # One short prompt on each device of the smallest preset: fails fast when the GPU path breaks.
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  folder=$("$py" -c "import sys; sys.path.insert(0, 'bench/gpu'); import models, pathlib; print(models.make(pathlib.Path('$dist'), pathlib.Path('$work'), 'tiny'))")
  for device in cpu cuda; do
    echo "{\"model\": \"$folder\", \"device\": \"$device\", \"runs\": [{\"prompts\": [[5, 6, 7, 8, 9, 10, 11, 12, 13]], \"generate\": 8}]}" \
      | "$dist/turnpike-cuda-reference" | "$py" -c "import json, sys; r = json.load(sys.stdin)['runs'][0]['results'][0]; print('$device', r['tokens'], r['logits'][:4])"
  done
  exit 0
fi
if [ "$what" = profile ]; then
  # Where a decode step's time goes, per preset (SPEED_PRESETS), as JSON in bench/results/.
  for preset in $(echo "${SPEED_PRESETS:-llama-3.1-8b,llama-3.2-1b}" | tr , ' '); do
    folder=$("$py" -c "import sys; sys.path.insert(0, 'bench/gpu'); import models, pathlib; print(models.make(pathlib.Path('$dist'), pathlib.Path('$work'), '$preset'))")
    "$dist/turnpike-cuda-profile" "$folder" > "bench/results/gpu-profile-$preset.json"
  done
  exit 0
fi
if [ "$what" = correctness ] || [ "$what" = all ]; then
  # A failed check still lets the speed run record its figures; the exit status keeps it.
  "$py" bench/gpu/correctness.py --dist "$dist" --work "$work" --out bench/results/gpu-correctness.json || status=$?
  "$py" bench/gpu/grammar.py --dist "$PWD/$dist" --work "$work" --out bench/results/gpu-grammar.json || status=$?
fi
if [ "$what" = speed ] || [ "$what" = all ]; then
  flags=(--out "${SPEED_OUT:-bench/results/gpu}")
  [ -n "${SPEED_PRESETS:-}" ] && flags+=(--presets "$SPEED_PRESETS")
  [ "${SPEED_PEER:-1}" = 0 ] && flags+=(--no-peer)
  "$py" bench/gpu/speed.py --dist "$dist" --work "$work" "${flags[@]}"
fi
if [ "$what" = speculative ] || [ "$what" = all ]; then
  "$py" bench/gpu/speculative.py --dist "$dist" --work "$work" --out bench/results/gpu-speculative.json || status=$?
fi
exit "$status"
