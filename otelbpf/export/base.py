"""What the batch processor hands to sinks, and what a sink promises back.

A ``SpanBatch`` is shared by every sink that exports it, so its OTLP encoding
is built at most once (lazily: the console and JSON file sinks never need
it) and must be treated as read-only. The OTLP sinks send ``payload``, the
serialized request; ``request`` is the same parsed into a message, for
whoever wants one.

A ``SpanSink`` answers ``export`` with ``True`` (delivered) or ``False``
(failed, try again later). It never raises: the processor owns retries,
backoff and drop accounting, so a sink only has to report the outcome
honestly and say once, not a million times, what went wrong.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelbpf.export.encode import serialize_request
from otelbpf.model import ResourceLookup, SpanRecord


class SpanBatch:
    """Spans to export together, plus how to name their processes."""

    __slots__ = ("spans", "resources", "_payload", "_request", "_encode_lock")

    def __init__(self, spans: Sequence[SpanRecord], resources: ResourceLookup) -> None:
        self.spans: Sequence[SpanRecord] = spans
        self.resources = resources
        self._payload: bytes | None = None
        self._request: ExportTraceServiceRequest | None = None
        self._encode_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def payload(self) -> bytes:
        """The serialized OTLP ``ExportTraceServiceRequest``, built on first use and shared by all sinks."""
        if self._payload is None:
            with self._encode_lock:
                if self._payload is None:
                    self._payload = serialize_request(self.spans, self.resources)
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

    def without_oldest(self, count: int) -> SpanBatch:
        """A new batch lacking the first ``count`` spans (queue overflow evicts oldest first)."""
        return SpanBatch(self.spans[count:], self.resources)


class SpanSink(abc.ABC):
    """A destination for span batches (OTLP collector, JSON file, console)."""

    #: Label for this sink's ``otelbpf.export.*`` counters.
    name: str

    @abc.abstractmethod
    def export(self, batch: SpanBatch) -> bool:
        """Deliver ``batch``: True when delivered, False for a failure worth retrying. Never raises."""

    def flush(self) -> None:
        """Emit whatever the sink buffers on its own (the console holds traces until they settle)."""

    def shutdown(self) -> None:
        """Release resources; interrupts an export in progress where the transport allows. Idempotent."""


class FailureLog:
    """Logs each kind of export failure once, and the recovery after it.

    A collector that is down for a day must not write a line per retry; but
    after it recovered, a new outage is news again, so success re-arms it.
    """

    def __init__(self, logger: logging.Logger, sink_name: str) -> None:
        self._logger = logger
        self._sink_name = sink_name
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def failed(self, kind: str, detail: object) -> None:
        with self._lock:
            if kind in self._seen:
                return
            self._seen.add(kind)
        self._logger.warning(
            "sink %s: export failed (%s: %s); will retry, further %s failures not logged until it recovers",
            self._sink_name,
            kind,
            detail,
            kind,
        )

    def succeeded(self) -> None:
        with self._lock:
            if not self._seen:
                return
            self._seen.clear()
        self._logger.info("sink %s: export recovered", self._sink_name)
