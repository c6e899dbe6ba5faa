"""Extracts from OpenAI's OpenAPI spec the operations the gateway is tested against
(listModels, createChatCompletion, createCompletion, createEmbedding, createResponse,
Compactconversation) and every component they reference, into `openai-openapi-subset.json`.

    python tests/python/trim_spec.py ../shared/reference/openai-openapi.yaml
"""

import json
import sys
from pathlib import Path

import yaml

OPERATIONS = {"listModels", "createChatCompletion", "createCompletion", "createEmbedding", "createResponse",
              "Compactconversation"}


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


def map_discriminators(node, components):
    """Gives every `oneOf` discriminator without a mapping the one its variants mean. OpenAPI
    reads a missing mapping as "the value is the schema's name", but the spec's variants carry
    their own value in the property's one-value `enum` (`compaction` for `CompactionBody`), so
    a correct response would fail the check without it."""
    if isinstance(node, dict):
        found = node.get("discriminator")
        if isinstance(found, dict) and "mapping" not in found and isinstance(node.get("oneOf"), list):
            prop, mapping = found.get("propertyName"), {}
            for variant in node["oneOf"]:
                ref = variant.get("$ref", "") if isinstance(variant, dict) else ""
                section, _, name = ref.removeprefix("#/components/").partition("/")
                schema = components.get(section, {}).get(name, {})
                values = schema.get("properties", {}).get(prop, {}).get("enum", [])
                if len(values) == 1:
                    mapping[values[0]] = ref
            if mapping:
                found["mapping"] = mapping
        for value in node.values():
            map_discriminators(value, components)
    elif isinstance(node, list):
        for value in node:
            map_discriminators(value, components)


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
    map_discriminators(components, components)
    map_discriminators(paths, components)
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
