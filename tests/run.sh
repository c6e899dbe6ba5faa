#!/usr/bin/env bash
# Runs the tests, after tests/setup.sh has installed what they need (tests/README.md maps each
# suite to its folder):
#   tests/run.sh [rust|python|js|numerics|kernels|all]...   (default: all, in that order)
#   rust      the Rust workspace: unit tests, in-process router tests, the plugin conformance kit
#             over every shipped plugin, ABI compatibility, black-box tests of the real binary,
#             and every CUDA kernel compiled by NVRTC for sm_80 and sm_90 (warnings fail);
#   python    the official OpenAI SDK suite against the real binary under both SDK majors (the
#             simulator, the default engine's CPU device, a real llama.cpp `llama-server` as an
#             upstream, Redis), the official `anthropic` SDK, and schemathesis against OpenAI's
#             OpenAPI spec;
#   js        Anthropic's TypeScript SDK against the Messages API;
#   numerics  the default engine against Hugging Face transformers, ggml's `gguf` package and
#             llama.cpp on the same weights;
#   kernels   the CUDA kernels run on the CPU (g++ and an emulation of CUDA's built-ins) against
#             NumPy.
# Installs nothing: a missing or stale prerequisite stops the run and names tests/setup.sh.
# Nothing leaves loopback. No GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/lib.sh
# One build mode for the whole run: the black-box tests build the workspace again to find its
# plugins (tests/support), and an incremental setting other than this run's would rebuild it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

missing() { echo "tests/run.sh: $1; run tests/setup.sh first" >&2; exit 2; }
need_venv() { venv_current "$1" "${VENVS[$1]}" || missing "target/py/$1 is missing or out of date"; }
need_file() { [ -e "$1" ] || missing "$1 is missing"; }

export TURNPIKE_BIN="$PWD/target/debug/turnpike" TURNPIKE_SIM="$PWD/target/debug/libturnpike_sim.so"
export TURNPIKE_CUDA="$PWD/target/debug/libturnpike_cuda.so" TURNPIKE_UPSTREAM="$PWD/target/debug/libturnpike_upstream.so"
export TURNPIKE_SMOLLM2_GGUF="$PWD/$SMOLLM2_GGUF" TURNPIKE_LLAMA_SERVER="$PWD/$LLAMA_SERVER"
export TURNPIKE_GROUP_BEAMS_REFERENCE="$PWD/$GROUP_BEAMS" TURNPIKE_JS="$PWD/$JS"

pytest() { # pytest VENV ARGS...: run pytest from target/py/VENV
  # A test that hangs fails after 15 minutes with every thread's stack, instead of holding the
  # run until CI's own limit kills it with nothing said.
  "target/py/$1/bin/python" -m pytest -q -p no:cacheprovider --timeout=900 "${@:2}"
}

stage_rust() ( # a subshell: NVRTC's library path stays with this stage
  # NVRTC from PyPI, so the Rust tests compile every kernel (engines/cuda/tests/kernels.rs).
  need_venv nvrtc
  nvrtc_lib=$(target/py/nvrtc/bin/python -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(nvidia.cuda_nvrtc.__path__[0], "lib"))')
  export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TURNPIKE_REQUIRE_NVRTC=1
  cargo build --workspace
  cargo test --workspace
)

stage_python() {
  need_venv openai3
  need_venv openai2
  need_file "$SMOLLM2_GGUF"
  need_file "$LLAMA_SERVER"
  command -v redis-server >/dev/null || missing "redis-server is not installed"
  cargo build --workspace
  pytest openai3 tests/python -m "not js"
  pytest openai2 tests/python/test_sdk.py
}

stage_js() {
  need_venv openai3
  need_file "$JS/node_modules"
  command -v node >/dev/null || missing "node is not installed"
  cargo build --workspace
  pytest openai3 tests/python/test_anthropic.py -m js
}

stage_numerics() {
  need_venv numerics
  need_file "$GROUP_BEAMS/requirements.installed"
  need_file "$SMOLLM2_GGUF"
  need_file "$LLAMA_SERVER"
  cargo build --workspace
  pytest numerics tests/numerics
}

stage_kernels() {
  need_venv numerics
  pytest numerics tests/kernels
}

timed() { # timed STAGE: run the stage and say how long it took
  local start=$SECONDS
  "stage_$1"
  echo "tests/run.sh: $1 passed in $((SECONDS - start)) s" >&2
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(all)
for stage in "${stages[@]}"; do
  case "$stage" in
    all) for each in rust python js numerics kernels; do timed "$each"; done ;;
    rust | python | js | numerics | kernels) timed "$stage" ;;
    *) echo "usage: tests/run.sh [rust|python|js|numerics|kernels|all]..." >&2; exit 2 ;;
  esac
done
