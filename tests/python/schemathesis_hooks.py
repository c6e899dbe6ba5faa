"""Schemathesis hooks for the gateway suite.

- Generated requests name a model the gateway serves, so fuzzing reaches the endpoints' logic
  instead of stopping at 404.
- Embeddings are asked for as floats: the OpenAPI spec describes only the float list, while a
  base64 request (the SDKs' default) rightly returns a string; the SDK suite covers that path.
"""

import schemathesis


@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict):
        if "model" in body:
            body["model"] = "chat"
        if "input" in body and "encoding_format" in body:
            body["encoding_format"] = "float"
    return body
