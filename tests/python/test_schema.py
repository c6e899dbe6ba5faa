"""Schemathesis against OpenAI's OpenAPI spec: generated requests (valid and invalid) for
listModels, createChatCompletion, createCompletion, createEmbedding, createResponse and
Compactconversation must never get a server error, and every response must match the spec's
schema."""

import os
import subprocess
import sys
from pathlib import Path

# A subset of ../shared/reference/openai-openapi.yaml (see trim_spec.py), so the suite needs no
# file outside the repository.
SPEC = Path(__file__).with_name("openai-openapi-subset.json")
OPERATIONS = ["listModels", "createChatCompletion", "createCompletion", "createEmbedding", "createResponse",
              "Compactconversation"]


def test_the_gateway_conforms_to_the_openai_spec(gateway, tmp_path):
    spec = SPEC
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        str(spec),
        "--url",
        f"{gateway}/v1",
        "--checks",
        "not_a_server_error,response_schema_conformance",
        "--max-examples",
        "25",
        "--seed",
        "1",
        "--no-color",
        "--generation-database",
        "none",
    ]
    for operation in OPERATIONS:
        command += ["--include-operation-id", operation]
    env = dict(os.environ, SCHEMATHESIS_HOOKS="schemathesis_hooks", PYTHONPATH=str(Path(__file__).parent))
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "1 found" not in result.stdout and "passed" in result.stdout, result.stdout[-3000:]
