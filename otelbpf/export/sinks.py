"""What the batch processor hands to sinks, and what a sink promises back.

A ``SpanBatch`` is shared by every sink that exports it, so its OTLP encoding
is built at most once (lazily: the console and JSON file sinks never need
it) and must be treated as read-only. The OTLP sinks send ``payload``, the
serialized request; ``request`` is the same parsed into a message, for
whoever wants one.

An ``EncodedSpanBatch`` holds each span's bytes instead of its record
(encoded when the batch was sealed): the processor makes those when every sink
says it reads only ``payload`` and ``len()`` (``Sink.reads_payload_only``,
the OTLP sinks).

A ``SpanSink`` is an ``otelbpf.otlp.Sink`` of span batches: ``export``
answers ``True`` (delivered) or ``False`` (failed, try again later) and
never raises; the processor owns retries, backoff and drop accounting.
``make_otlp_span_sink`` is the OTLP one (the traces signal on the transports
every signal shares, ``otelbpf.otlp.transport``), as ``make_otlp_metric_sink``
(otelbpf/metrics/sinks.py) and ``make_otlp_profile_sink`` are for theirs.
"""

from __future__ import annotations

import threading
from typing import Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelbpf.core.model import ResourceLookup, SpanRecord
from otelbpf.export.encode import serialize_parts, serialize_request
from otelbpf.otlp.signals import TRACES
from otelbpf.otlp.sink import FailureLog, Sink
from otelbpf.otlp.transport import OtlpSink, make_otlp_sink

__all__ = ["EncodedSpanBatch", "FailureLog", "SpanBatch", "SpanSink", "make_otlp_span_sink"]


class _Encoded:
    """Items exported together and their OTLP request, built once on first use
    (``_serialize``) and shared by the batch's sinks."""

    __slots__ = ("_items", "resources", "_payload", "_request", "_encode_lock")

    def __init__(self, items: Sequence, resources: ResourceLookup) -> None:
        self._items = items
        self.resources = resources
        self._payload: bytes | None = None
        self._request: ExportTraceServiceRequest | None = None
        self._encode_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def without_oldest(self, count: int):
        """A new batch lacking the first ``count`` spans (queue overflow evicts oldest first)."""
        return type(self)(self._items[count:], self.resources)

    def _serialize(self) -> bytes:
        raise NotImplementedError

    @property
    def payload(self) -> bytes:
        """The serialized OTLP ``ExportTraceServiceRequest``, built on first use and shared by all sinks."""
        if self._payload is None:
            with self._encode_lock:
                if self._payload is None:
                    self._payload = self._serialize()
        return self._payload

    @property
    def request(self) -> ExportTraceServiceRequest:
        """``payload`` as a message, parsed on first use and shared (do not modify)."""
        if self._request is None:
            payload = self.payload
            with self._encode_lock:
                if self._request is None:
                    self._request = ExportTraceServiceRequest.FromString(payload)
        return self._request


class SpanBatch(_Encoded):
    """Spans to export together, plus how to name their processes."""

    __slots__ = ()

    def __init__(self, spans: Sequence[SpanRecord], resources: ResourceLookup) -> None:
        super().__init__(spans, resources)

    @property
    def spans(self) -> Sequence[SpanRecord]:
        return self._items

    def _serialize(self) -> bytes:
        return serialize_request(self._items, self.resources)


class EncodedSpanBatch(_Encoded):
    """Spans already encoded when their batch was sealed (``wire_part``: pid, scope and
    Span bytes each), for sinks that read only ``payload`` and ``len()``
    (``reads_payload_only``). It has no records: the processor hands these
    only when every sink says so."""

    __slots__ = ()

    def __init__(self, parts: list, resources: ResourceLookup) -> None:
        super().__init__(parts, resources)

    @property
    def parts(self) -> list:
        return self._items

    def _serialize(self) -> bytes:
        return serialize_parts(self._items, self.resources)


#: A destination for span batches (OTLP collector, JSON file, console).
SpanSink = Sink["SpanBatch"]


def make_otlp_span_sink(endpoint: str | None = None, protocol: str | None = None, *, timeout_s: float | None = None) -> OtlpSink:
    """The OTLP span sink for ``protocol`` (else OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL, else grpc); see ``otelbpf.otlp.transport.make_otlp_sink``."""
    return make_otlp_sink(TRACES, endpoint, protocol, timeout_s=timeout_s)
