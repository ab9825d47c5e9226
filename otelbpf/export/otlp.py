"""The OTLP span sink: the traces signal on the shared OTLP transports (``otelbpf.otlp.transport``)."""

from __future__ import annotations

from otelbpf.otlp.signals import TRACES
from otelbpf.otlp.transport import OtlpSink
from otelbpf.otlp.transport import make_otlp_sink as _make_signal_sink


def make_otlp_sink(endpoint: str | None = None, protocol: str | None = None, *, timeout_s: float | None = None) -> OtlpSink:
    """The OTLP span sink for ``protocol`` (else OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL, else grpc); see ``otelbpf.otlp.transport.make_otlp_sink``."""
    return _make_signal_sink(TRACES, endpoint, protocol, timeout_s=timeout_s)
