"""Traces from the real binary to a real OTLP/HTTP receiver started here, which decodes the
protobuf off the wire (`opentelemetry-proto`): one trace per request with the named spans, the
caller's W3C `traceparent` honoured, the trace carried through the upstream plugin to a node
(two gateways, one trace), sampling, and `X-Request-Trace` echoed and logged."""

import json
import os
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from conftest import config_text
from tenancy_support import Gateway
from test_upstream import UPSTREAM, front_config

# The batch exporter's delay; the default (5 s) would only slow the tests down.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "RUST_LOG": "warn,turnpike::request=info"}
# The root span is named as OpenTelemetry's HTTP conventions say: method and route.
ROOT = "POST /v1/chat/completions"
REQUEST_SPANS = {ROOT, "auth", "limits", "tokenize", "queue_wait", "engine", "prefill", "decode", "render"}


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback; `spans` holds (service, span) as they arrive."""

    def __init__(self):
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                assert self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    for resource_spans in request.resource_spans:
                        service = next(a.value.string_value for a in resource_spans.resource.attributes
                                       if a.key == "service.name")
                        for scope in resource_spans.scope_spans:
                            receiver.spans.extend((service, span) for span in scope.spans)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str) -> list[tuple[str, object]]:
        with self.lock:
            return [(s, span) for s, span in self.spans if span.trace_id.hex() == trace_id]

    def wait_for(self, condition, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if condition(list(self.spans)):
                    return True
            time.sleep(0.05)
        return False

    def stop(self):
        self.server.shutdown()


def tracing(receiver: Receiver, service: str, ratio: float = 1.0) -> str:
    return f'\n[tracing]\notlp_endpoint = "{receiver.url}"\nservice_name = "{service}"\nsample_ratio = {ratio}\n'


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def names(spans) -> set[str]:
    return {span.name for _, span in spans}


def chat(base: str, headers: dict | None = None, stream: bool = False) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hello traces"}], "max_tokens": 8, "stream": stream}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers or {}, timeout=10)


def test_one_trace_per_request_under_the_callers_parent(tmp_path, receiver):
    gateway = Gateway(tmp_path, config_text() + tracing(receiver, "gw"), FAST_EXPORT)
    try:
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        answer = chat(gateway.base, {"traceparent": f"00-{trace_id}-{parent}-01", "x-request-trace": "order-77"})
        assert answer.status_code == 200
        assert answer.headers["x-request-trace"] == "order-77"
        assert receiver.wait_for(lambda spans: REQUEST_SPANS <= names(s for s in spans if s[1].trace_id.hex() == trace_id))
        spans = receiver.trace(trace_id)
        by_name = {span.name: span for _, span in spans}
        root = by_name[ROOT]
        assert root.parent_span_id.hex() == parent
        assert root.kind == 2  # SPAN_KIND_SERVER
        ids = {span.span_id for _, span in spans}
        for name in REQUEST_SPANS - {ROOT}:
            assert by_name[name].parent_span_id in ids, name
        assert by_name["prefill"].parent_span_id == by_name["engine"].span_id
        assert by_name["decode"].parent_span_id == by_name["engine"].span_id
        attributes = {a.key: a.value for a in by_name["engine"].attributes}
        assert attributes["prompt_tokens"].int_value > 0 and attributes["completion_tokens"].int_value > 0
        assert all(service == "gw" for service, _ in spans)

        # A streamed request without a parent starts a trace of its own, which lasts the stream.
        streamed = chat(gateway.base, stream=True)
        assert streamed.status_code == 200 and "x-request-trace" not in streamed.headers
        assert receiver.wait_for(lambda spans: sum(1 for _, s in spans if s.name == ROOT) >= 2)
        roots = [span for _, span in receiver.spans if span.name == ROOT]
        second = next(r for r in roots if r.trace_id.hex() != trace_id)
        assert second.parent_span_id == b""
        render = next(span for _, span in receiver.trace(second.trace_id.hex()) if span.name == "render")
        assert second.end_time_unix_nano >= render.end_time_unix_nano
    finally:
        gateway.stop()
    # The request's log line carries both ids.
    lines = [json.loads(l) for l in gateway.log.read_text().splitlines() if "request finished" in l]
    assert any(l.get("correlation_id") == "order-77" and l.get("trace_id") == trace_id for l in lines), lines


def test_one_trace_through_the_upstream_plugin_to_a_node(tmp_path, receiver):
    assert UPSTREAM.exists()
    node = Gateway(tmp_path / "node", config_text() + tracing(receiver, "node"), FAST_EXPORT, name="node")
    front = Gateway(tmp_path / "front", front_config([node], health_ms=60000) + tracing(receiver, "front"), FAST_EXPORT, name="front")
    try:
        trace_id = secrets.token_hex(16)
        assert chat(front.base, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}).status_code == 200
        assert receiver.wait_for(
            lambda spans: {("front", "engine"), ("node", "POST /generate"), ("node", "engine")}
            <= {(svc, s.name) for svc, s in spans if s.trace_id.hex() == trace_id})
        spans = receiver.trace(trace_id)
        front_engine = next(s for svc, s in spans if svc == "front" and s.name == "engine")
        node_root = next(s for svc, s in spans if svc == "node" and s.name == "POST /generate")
        # The node's request is the child of the front's engine span, and its engine span the
        # child of its request.
        assert node_root.parent_span_id == front_engine.span_id
        node_engine = next(s for svc, s in spans if svc == "node" and s.name == "engine")
        assert node_engine.parent_span_id == node_root.span_id
        counts = {a.key: a.value.int_value for a in node_engine.attributes}
        assert counts["prompt_tokens"] > 0 and counts["completion_tokens"] > 0
    finally:
        front.stop()
        node.stop()


def test_sampling_keeps_a_share_of_new_traces_and_follows_sampled_parents(tmp_path, receiver):
    gateway = Gateway(tmp_path, config_text() + tracing(receiver, "gw", ratio=0.0), FAST_EXPORT)
    try:
        for _ in range(3):
            assert chat(gateway.base).status_code == 200
        followed = secrets.token_hex(16)
        assert chat(gateway.base, {"traceparent": f"00-{followed}-{secrets.token_hex(8)}-01"}).status_code == 200
        assert receiver.wait_for(lambda spans: any(s.trace_id.hex() == followed and s.name == ROOT for _, s in spans))
        time.sleep(0.5)
        assert {span.trace_id.hex() for _, span in receiver.spans} == {followed}
    finally:
        gateway.stop()


@pytest.mark.parametrize(("value", "says"), [
    ('otlp_endpoint = "grpc://collector:4317"', "http://"),
    ('otlp_endpoint = "http://127.0.0.1:4318/v1/traces"\nsample_ratio = 2', "sample_ratio"),
    ('otlp_endpoint = "http://127.0.0.1:4318/v1/traces"\nheaders = 1', "headers"),
])
def test_a_bad_tracing_section_is_refused_at_startup(tmp_path, value, says):
    import subprocess

    from conftest import BIN

    path = tmp_path / "bad.toml"
    path.write_text(config_text() + f"\n[tracing]\n{value}\n")
    done = subprocess.run([str(BIN), "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and says in done.stderr, done.stderr
