"""`turnpike serve --model org/name`: a Hub id the cache lacks is downloaded into the standard Hub
cache (`HF_HOME`) first, as `huggingface-cli download` would, from `HF_ENDPOINT`; with
`HF_HUB_OFFLINE` set, the cache is all there is. The Hub is a small server on loopback that
answers the Hub's own protocol (the repository listing, and ranged `resolve` downloads carrying
the commit and the blob's etag), so nothing leaves the machine."""

import hashlib
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import BIN
from test_gguf_model import GGUF, answers_paris, serve

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub(http.server.ThreadingHTTPServer):
    """Repositories (`org/name` → {file name: path}) at branch `main` = COMMIT."""

    def __init__(self, repos):
        super().__init__(("127.0.0.1", 0), Handler)
        self.repos = repos
        self.requests = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.server.requests.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and parts[4:5] == ["revision"]:
            files = self.server.repos.get("/".join(parts[2:4]))
            if files is None or parts[5] not in ("main", COMMIT):
                return self.reply(404, b'{"error":"Repository not found"}')
            listing = {"sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}
            return self.reply(200, json.dumps(listing).encode(), [("Content-Type", "application/json")])
        if parts[2:3] == ["resolve"] and len(parts) == 5:
            files = self.server.repos.get("/".join(parts[:2]), {})
            path = files.get(parts[4])
            if path is None or parts[3] not in ("main", COMMIT):
                return self.reply(404, b"Entry not found")
            data = Path(path).read_bytes()
            start, _, end = self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
            start, end = int(start), int(end) if end else len(data) - 1
            headers = [
                ("x-repo-commit", COMMIT),
                ("ETag", '"%s"' % hashlib.sha256(data).hexdigest()),
                ("Content-Range", f"bytes {start}-{end}/{len(data)}"),
            ]
            return self.reply(206, data[start : end + 1], headers)
        self.reply(404)


@pytest.fixture
def tiny(tmp_path):
    folder = tmp_path / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(folder)], check=True, capture_output=True)
    return folder


def test_a_gguf_file_the_cache_lacks_is_downloaded_then_served_from_the_cache(tmp_path):
    hub = Hub({"org/smol": {"model.Q4_1.gguf": GGUF, "README.md": GGUF}})
    home = tmp_path / "hf"
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "TURNPIKE_CACHE_DIR": str(tmp_path / "cache")}
    with serve(tmp_path, ["--model", "org/smol/model.Q4_1.gguf"], env) as client:
        answers_paris(client, "model.Q4_1")
    kept = home / "hub/models--org--smol/snapshots" / COMMIT / "model.Q4_1.gguf"
    assert kept.read_bytes() == Path(GGUF).read_bytes()
    assert (home / "hub/models--org--smol/refs/main").read_text() == COMMIT
    # Only the named file was fetched.
    assert not any("README" in r for r in hub.requests)
    # Served again from the cache, offline, without asking the Hub.
    hub.requests.clear()
    with serve(tmp_path, ["--model", "org/smol/model.Q4_1.gguf"], {**env, "HF_HUB_OFFLINE": "1"}) as client:
        answers_paris(client, "model.Q4_1")
    assert hub.requests == []
    hub.shutdown()


def test_a_model_folder_is_downloaded_file_by_file(tmp_path, tiny):
    files = {p.name: str(p) for p in tiny.iterdir()}
    # Other formats' copies of the weights, and files in sub-folders, are not fetched.
    listed = {**files, "pytorch_model.bin": str(tiny / "config.json"), "onnx/model.onnx": str(tiny / "config.json")}
    hub = Hub({"org/tiny": listed})
    home = tmp_path / "hf"
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home)}
    with serve(tmp_path, ["--model", "org/tiny"], env) as client:
        assert [m.id for m in client.models.list().data] == ["tiny"]
        r = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4
    snapshot = home / "hub/models--org--tiny/snapshots" / COMMIT
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(files)
    assert not any(r.endswith((".bin", ".onnx")) for r in hub.requests)
    hub.shutdown()


def test_offline_or_unknown_models_are_clear_errors(tmp_path):
    hub = Hub({})
    home = tmp_path / "hf"
    base = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home)}

    def refusal(spec, **env):
        out = subprocess.run(
            [str(BIN), "serve", "--listen", "127.0.0.1:0", "--model", spec],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        return out.stderr

    offline = refusal("org/smol/model.Q4_1.gguf", HF_HUB_OFFLINE="1")
    assert "HF_HUB_OFFLINE" in offline and "huggingface-cli download org/smol" in offline, offline
    assert hub.requests == []
    missing = refusal("org/missing")
    assert "cannot list `org/missing`" in missing, missing
    hub.shutdown()
