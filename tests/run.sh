#!/usr/bin/env bash
# Runs every test:
#   1. the Rust workspace: unit tests, in-process router tests, the plugin conformance kit over
#      every shipped plugin, ABI compatibility, and black-box tests of the real binary;
#   2. the official OpenAI SDK suite against the real binary, under both SDK majors (the
#      simulator and the default engine's CPU device on a model the tests make);
#   3. schemathesis against OpenAI's OpenAPI spec;
#   4. the default engine's numerics against Hugging Face transformers on the same weights.
# The Python packages are installed into virtual environments under target/py (network is used
# only for that); nothing else leaves loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --workspace
cargo test --workspace

venv() { # venv NAME REQUIREMENTS: create or refresh target/py/NAME
  local dir="target/py/$1" requirements="$2"
  if [ ! -x "$dir/bin/python" ] || ! cmp -s "$requirements" "$dir/requirements.installed"; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$dir/requirements.installed"
  fi
}
venv openai3 tests/python/requirements.txt
venv openai2 tests/python/requirements-openai2.txt
venv numerics tests/numerics/requirements.txt

# The Redis tests (tests/python/test_redis.py) start their own redis-server.
if ! command -v redis-server >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q redis-server || { $sudo apt-get update -q && $sudo apt-get install -y -q redis-server; }
fi

export TURNPIKE_BIN="$PWD/target/debug/turnpike" TURNPIKE_SIM="$PWD/target/debug/libturnpike_sim.so"
export TURNPIKE_CUDA="$PWD/target/debug/libturnpike_cuda.so"
target/py/openai3/bin/python -m pytest -q -p no:cacheprovider tests/python
# The default engine against Hugging Face transformers (torch on the CPU) on the same weights.
target/py/numerics/bin/python -m pytest -q -p no:cacheprovider tests/numerics
target/py/openai2/bin/python -m pytest -q -p no:cacheprovider tests/python/test_sdk.py
