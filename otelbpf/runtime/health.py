"""The agent's health and self-metrics port, for Kubernetes probes and Prometheus.

``run --health-port PORT`` serves, on all addresses:

* ``/healthz`` (liveness): 200 while the drain loop reads the kernel ring
  buffer (it did within ``STALL_S``); 503 once it stalls, so the kubelet
  restarts an agent that hangs instead of letting the ring overflow forever.
* ``/readyz`` (readiness): 200 once the probes are attached.
* ``/metrics``: the self-metrics counters in the Prometheus text format
  (``otelbpf_events_total`` ...), for a ServiceMonitor or scrape annotations.
  The same counters go out over OTLP with the span metrics. With
  ``--prometheus-port`` (the same port or another), every metric the agent
  exports instead: span metrics, GPU and NCCL metrics, NCCL's RAS view and
  the self-metrics, named as OpenTelemetry's Prometheus compatibility says
  (otelbpf/metrics/prometheus.py).

A stdlib HTTP server on a daemon thread: a scrape costs one pass over the
counters; nothing here touches the pipeline.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otelbpf.metrics.selfmetrics import label_key

log = logging.getLogger("otelbpf")

#: /healthz fails when the drain loop has not read the ring buffer for this long.
STALL_S = 30.0
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


class Heartbeat:
    """Wraps the live source: every read() is a sign of life. Every other
    attribute is the wrapped source's."""

    def __init__(self, source) -> None:
        self._source = source
        self.last_read = time.monotonic()
        self.ready = False

    def __getattr__(self, name):
        return getattr(self._source, name)

    def read(self):
        self.last_read = time.monotonic()
        return self._source.read()

    def alive(self) -> bool:
        return time.monotonic() - self.last_read < STALL_S


def prometheus_text(counters, label_key) -> str:
    """Counters as Prometheus text: ``otelbpf.export.spans{sink}`` becomes
    ``otelbpf_export_spans_total{sink="otlp"}``."""
    lines: list[str] = []
    typed: set[str] = set()
    for name, label, value in counters.items():
        metric = _INVALID.sub("_", name) + "_total"
        if metric not in typed:
            typed.add(metric)
            lines.append(f"# TYPE {metric} counter")
        if label:
            escaped = label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            lines.append(f'{metric}{{{_INVALID.sub("_", label_key(name))}="{escaped}"}} {value}')
        else:
            lines.append(f"{metric} {value}")
    return "\n".join(lines) + "\n"


class HealthServer:
    """``metrics_text``: what ``/metrics`` serves (default: the self-metrics counters)."""

    def __init__(self, port: int, heartbeat: Heartbeat, counters, host: str = "0.0.0.0", metrics_text=None) -> None:
        self.heartbeat = heartbeat
        server = self
        if metrics_text is None:
            metrics_text = lambda: prometheus_text(counters, label_key)  # noqa: E731

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    ok = server.heartbeat.alive()
                    self._reply(200 if ok else 503, "ok\n" if ok else "drain loop stalled\n")
                elif path == "/readyz":
                    ok = server.heartbeat.ready
                    self._reply(200 if ok else 503, "ready\n" if ok else "attaching probes\n")
                elif path == "/metrics":
                    try:
                        text = metrics_text()
                    except Exception:  # noqa: BLE001 - a scrape never takes the agent down
                        log.exception("otelbpf: /metrics failed")
                        self._reply(500, "metrics collection failed\n")
                        return
                    self._reply(200, text, "text/plain; version=0.0.4; charset=utf-8")
                else:
                    self._reply(404, "not found\n")

            def _reply(self, status: int, body: str, content_type: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:  # probes every few seconds: not worth a log line
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="otelbpf-health", daemon=True)

    def start(self, what: str = "health and self-metrics") -> HealthServer:
        self._thread.start()
        log.info("otelbpf: %s on :%d (/healthz, /readyz, /metrics)", what, self.port)
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
