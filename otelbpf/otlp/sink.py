"""What every sink promises, whatever signal it carries.

A ``Sink`` answers ``export`` with ``True`` (delivered) or ``False``
(failed, try again later). It never raises: whoever feeds it (the span
``BatchQueue``, the metrics exporter) owns retries, backoff and drop
accounting, so a sink only has to report the outcome honestly and say once,
not a million times, what went wrong (``FailureLog``).
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class Sink(abc.ABC, Generic[T]):
    """A destination for one signal's exports (an OTLP collector, a JSON-lines file, the console)."""

    #: Label for this sink's export counters.
    name: str
    #: ``export`` reads nothing of a batch but ``payload`` and ``len()`` (the
    #: OTLP sinks): the span processor may then encode spans as it seals a
    #: batch and hand ``EncodedSpanBatch`` es, which hold no records.
    reads_payload_only: bool = False

    @abc.abstractmethod
    def export(self, item: T) -> bool:
        """Deliver ``item``: True when delivered, False for a failure worth retrying. Never raises."""

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
            "sink %s: export failed (%s: %s); retrying while the agent runs, further %s failures not logged until it recovers",
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
