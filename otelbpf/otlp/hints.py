"""One line with the fix for OTLP mistakes users make on the first run.

* A backend that stores traces only (Jaeger, Tempo, Phoenix) answers the
  metrics export with gRPC UNIMPLEMENTED or HTTP 404: the official exporters
  log a failure, and the agent would call it "unreachable or refusing" every
  interval. ``MetricsRefusedHint`` watches the exporters' log records and
  says once to set ``OTEL_METRICS_EXPORTER=none``.
* An endpoint whose port speaks the other OTLP transport: HTTP/protobuf sent
  to a gRPC port fails with raw HTTP/2 bytes (``BadStatusLine('\\x00\\x00\\x18...')``),
  gRPC sent to an HTTP/1 port with a protocol error. ``wrong_transport``
  asks the port once, after the first failure, what it speaks.
* The official exporters log each internal retry ("Transient error ...
  retrying in 0.9s", "Shutdown in progress, aborting retry."), between the
  agent's own lines: ``LibraryChatter`` keeps those for ``--log-level debug``;
  the sink's one line per kind of failure and the count at exit say it.
"""

from __future__ import annotations

import logging
import socket
import threading
from urllib.parse import urlsplit

log = logging.getLogger("otelbpf")

METRICS_REFUSED_HINT = (
    "otelbpf: the OTLP backend does not accept metrics ({why}): set OTEL_METRICS_EXPORTER=none "
    "to send traces only, or send metrics to a Collector or a metrics store"
)
#: HTTP statuses of an OTLP/HTTP server without a metrics endpoint.
NO_METRICS_HTTP = (404, 405, 501)


class MetricsRefusedHint(logging.Filter):
    """Reads the official exporters' failure records; never drops one."""

    def __init__(self) -> None:
        super().__init__()
        self._said = threading.Event()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._said.is_set():
            why = self._refusal(record)
            if why:
                self._said.set()
                log.warning(METRICS_REFUSED_HINT.format(why=why))
        return True

    @staticmethod
    def _refusal(record: logging.LogRecord) -> str | None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 3 or args[0] != "metrics":
            return None
        # gRPC: "Failed to export %s to %s, error code: %s, ..." (metrics, endpoint, StatusCode)
        if getattr(args[2], "name", None) == "UNIMPLEMENTED":
            return "gRPC UNIMPLEMENTED"
        # HTTP: "Failed to export %s batch code: %s, reason: %s" (metrics, status, reason)
        if args[1] in NO_METRICS_HTTP:
            return f"HTTP {args[1]}"
        return None


metrics_refused_hint = MetricsRefusedHint()


def speaks(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """What a TCP port answers to an HTTP/1.1 request: "http/1", "http/2"
    (a cleartext HTTP/2 server such as an OTLP/gRPC receiver sends a SETTINGS
    frame), or None (no answer, TLS, or unreachable)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: otelbpf\r\nConnection: close\r\n\r\n")
            head = conn.recv(16)
    except OSError:
        return None
    if head.startswith(b"HTTP/1."):
        return "http/1"
    if len(head) >= 9 and head[3] in (0x04, 0x07):  # SETTINGS or GOAWAY frame header
        return "http/2"
    return None


def wrong_transport(target: str, transport: str) -> str | None:
    """The fix, when the endpoint's port speaks the other OTLP transport."""
    parts = urlsplit(target if "://" in target else f"//{target}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or not port or parts.scheme == "https":
        return None
    answer = speaks(host, port)
    if transport == "http/protobuf" and answer == "http/2":
        return f"{host}:{port} speaks HTTP/2 (an OTLP/gRPC port, usually 4317): use --otlp-protocol grpc, or the HTTP port (usually 4318)"
    if transport == "grpc" and answer == "http/1":
        return f"{host}:{port} speaks HTTP/1 (an OTLP/HTTP port, usually 4318): use --otlp-protocol http/protobuf, or the gRPC port (usually 4317)"
    return None


#: How the official exporters' per-retry lines start.
CHATTER = ("Transient error", "Shutdown in progress")


class LibraryChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(CHATTER):
            return log.isEnabledFor(logging.DEBUG)
        return True


library_chatter = LibraryChatter()
