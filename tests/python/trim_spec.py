"""Extracts from OpenAI's OpenAPI spec the operations the gateway is tested against
(listModels, createChatCompletion, createCompletion, createEmbedding, createResponse) and every component they
reference, into `openai-openapi-subset.json`.

    python tests/python/trim_spec.py ../shared/reference/openai-openapi.yaml
"""

import json
import sys
from pathlib import Path

import yaml

OPERATIONS = {"listModels", "createChatCompletion", "createCompletion", "createEmbedding", "createResponse"}


def refs(node, found):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            found.add(ref)
        for value in node.values():
            refs(value, found)
    elif isinstance(node, list):
        for value in node:
            refs(value, found)


def main(source: Path, target: Path) -> None:
    spec = yaml.safe_load(source.read_text())
    paths = {}
    for path, methods in spec["paths"].items():
        kept = {m: op for m, op in methods.items() if isinstance(op, dict) and op.get("operationId") in OPERATIONS}
        if kept:
            paths[path] = kept
    components = {}
    pending, seen = set(), set()
    refs(paths, pending)
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, _, section, name = ref.split("/", 3)
        node = spec["components"][section][name]
        components.setdefault(section, {})[name] = node
        refs(node, pending)
    subset = {
        "openapi": spec["openapi"],
        "info": {**spec["info"], "description": "Subset of OpenAI's OpenAPI spec, made by tests/python/trim_spec.py."},
        "servers": spec.get("servers", []),
        "paths": paths,
        "components": {section: dict(sorted(items.items())) for section, items in sorted(components.items())},
    }
    target.write_text(json.dumps(subset, indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).with_name("openai-openapi-subset.json"))
