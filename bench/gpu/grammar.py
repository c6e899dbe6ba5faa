"""Grammar-constrained decoding on the CUDA device, end to end: the real gateway with the
engine plugin on the `tiny` preset (random weights, so nothing but the grammar keeps the output
in shape), JSON-schema answers sampled at temperature 1 with n = 2, and forced tool calls in
the `hermes` envelope. Each answer must parse and meet its schema (checked here by hand: the
GPU machine has no `jsonschema`). The device masks in its sampling kernel; this is the check
that the mask, its upload and the constraint's advance agree on real hardware.
  python bench/gpu/grammar.py --dist bench/gpu/dist --work DIR --out bench/results/gpu-grammar.json
For a dry run without a GPU: --device cpu."""

import argparse
import json
import pathlib
import re
import subprocess
import urllib.request

import models

parser = argparse.ArgumentParser()
parser.add_argument("--dist", type=pathlib.Path, required=True)
parser.add_argument("--work", type=pathlib.Path, required=True)
parser.add_argument("--out", type=pathlib.Path, required=True)
parser.add_argument("--device", default="cuda")
args = parser.parse_args()

SCHEMAS = {
    "enum and range": ({"type": "object", "properties": {"colour": {"enum": ["red", "green"]},
                                                          "count": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["colour", "count"], "additionalProperties": False},
                       lambda v: v["colour"] in ("red", "green") and 0 <= v["count"] <= 9),
    "pattern": ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                 "required": ["code"], "additionalProperties": False},
                lambda v: re.fullmatch("[A-Z]{3}", v["code"]) is not None),
    "array": ({"type": "object", "properties": {"flags": {"type": "array", "items": {"type": "boolean"},
                                                          "minItems": 1, "maxItems": 3}},
               "required": ["flags"], "additionalProperties": False},
              lambda v: 1 <= len(v["flags"]) <= 3 and all(isinstance(f, bool) for f in v["flags"])),
}
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
           "additionalProperties": False}


def post(base, body):
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def main():
    folder = models.make(args.dist, args.work, "tiny")
    config = args.work / "grammar.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
        f'plugin = "{args.dist / "libturnpike_cuda.so"}"', "[engines.config]", "seed = 7",
        "[[engines.config.models]]", 'id = "tiny"', f'path = "{folder}"', f'device = "{args.device}"',
        "[[models]]", 'name = "tiny"', 'engine = "default"', f'folder = "{folder}"', 'tool_call_parser = "hermes"',
    ]) + "\n")
    server = subprocess.Popen([str(args.dist / "turnpike"), "serve", "--config", str(config)],
                              stdout=subprocess.PIPE, text=True)
    results, failures = [], 0
    try:
        line = server.stdout.readline()
        found = re.match(r"turnpike listening on (http://\S+)", line)
        if not found:
            raise SystemExit(f"the gateway did not start: {line!r}")
        base = found.group(1)
        messages = [{"role": "user", "content": "Fill in the form."}]
        for name, (schema, holds) in SCHEMAS.items():
            for seed in range(4):
                reply = post(base, {"model": "tiny", "messages": messages, "max_tokens": 200, "n": 2, "seed": seed,
                                    "temperature": 1.0, "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "form", "schema": schema, "strict": True}}})
                for choice in reply["choices"]:
                    text = choice["message"]["content"]
                    try:
                        ok = choice["finish_reason"] == "stop" and holds(json.loads(text))
                    except (ValueError, KeyError, TypeError):
                        ok = False
                    failures += not ok
                    results.append({"schema": name, "seed": seed, "ok": ok, "text": text})
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
        for seed in range(4):
            reply = post(base, {"model": "tiny", "messages": messages, "max_tokens": 200, "seed": seed,
                                "temperature": 1.0, "tools": tools, "tool_choice": "required",
                                "parallel_tool_calls": False})
            choice = reply["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            ok = choice["finish_reason"] == "tool_calls" and bool(calls) and all(
                json.loads(c["function"]["arguments"])["city"] in ("Paris", "Oslo") for c in calls)
            failures += not ok
            results.append({"schema": "forced call", "seed": seed, "ok": ok, "calls": calls})
    finally:
        server.terminate()
        server.wait(timeout=30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": args.device, "answers": len(results), "failures": failures,
                                    "results": results}, indent=1) + "\n")
    print(f"grammar on {args.device}: {len(results) - failures}/{len(results)} answers valid")
    raise SystemExit(1 if failures else 0)


main()
