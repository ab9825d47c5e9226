"""OTLP plumbing shared by every signal (traces, metrics, profiles).

* ``signals``: ``Signal`` (HTTP path, gRPC method, env-var infix, request
  message) and ``TRACES``, ``METRICS``, ``PROFILES``;
* ``transport``: ``OtlpGrpcSink`` / ``OtlpHttpSink`` for any signal, built on
  the official exporters; ``make_otlp_sink``, ``resolve_transport``,
  ``OTLP_TRANSPORTS``, ``signal_url``;
* ``sink``: ``Sink`` (the interface every sink keeps) and ``FailureLog``;
* ``jsonlines``: ``JsonLinesSink`` and ``read_json_lines``, generic over a
  per-signal line renderer / parser;
* ``queue``: ``BatchQueue``, the bounded per-sink queue with batching and
  retries (``RetryPolicy``), generic over what it carries;
* ``wire``: protobuf wire helpers (varints, attributes, resource, scope)
  that the signal encoders share.

The signal packages keep only their encoders and glue: ``otelbpf.export``
(spans), ``otelbpf.metrics``.

Importing this package is cheap (the CLI reads ``OTLP_TRANSPORTS`` before
anything is exported); the names below load their module (and with it
grpc, protobuf, the official exporters) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
#: The OTLP transports (``--otlp-protocol`` values; "protocol" in the OTel variables' sense).
OTLP_TRANSPORTS = (GRPC, HTTP_PROTOBUF)

_LAZY = {
    "otelbpf.otlp.jsonlines": ("JsonLinesSink", "go_escaped", "read_json_lines"),
    "otelbpf.otlp.queue": ("BatchQueue", "CounterNames", "RetryPolicy"),
    "otelbpf.otlp.signals": ("METRICS", "PROFILES", "SIGNALS", "TRACES", "Signal"),
    "otelbpf.otlp.sink": ("FailureLog", "Sink"),
    "otelbpf.otlp.transport": (
        "OtlpGrpcSink", "OtlpHttpSink", "OtlpSink", "SerializedRequest", "make_otlp_sink", "resolve_transport",
        "signal_url",
    ),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'otelbpf.otlp' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["GRPC", "HTTP_PROTOBUF", "OTLP_TRANSPORTS", *_MODULE_OF]
