"""One span consumer for the Pipeline that feeds both the span processor and the span metrics."""

from __future__ import annotations

import time
from typing import Protocol

from otelbpf.core.model import SpanRecord
from otelbpf.metrics.exporter import MetricsExporter
from otelbpf.metrics.histograms import SpanMetrics


class SpanProcessor(Protocol):
    def on_end(self, span: SpanRecord) -> None: ...
    def shutdown(self, timeout_s: float = ...) -> None: ...


class MeteredProcessor:
    """``on_end`` hands a finished span to ``processor`` and records it in ``span_metrics``;
    ``shutdown`` stops the span processor, then the metrics exporter, within one timeout.

    The span processor goes first so that the final metrics export carries
    the final ``otelbpf.export.*`` counts; it gets at most
    ``1 - metrics_share`` of the timeout, so that the metrics exporter keeps
    at least ``metrics_share`` of it even when the span export hangs.
    """

    def __init__(
        self,
        processor: SpanProcessor,
        span_metrics: SpanMetrics,
        exporter: MetricsExporter,
        *,
        metrics_share: float = 0.25,
    ) -> None:
        if not 0.0 < metrics_share < 1.0:
            raise ValueError(f"metrics_share must be between 0 and 1, got {metrics_share!r}")
        self.processor = processor
        self.span_metrics = span_metrics
        self.exporter = exporter
        self._metrics_share = metrics_share
        self._processor_on_end = processor.on_end
        self._record = span_metrics.record

    def on_end(self, span: SpanRecord) -> None:
        """Hot path: both calls are O(1) and never raise."""
        self._processor_on_end(span)
        self._record(span)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        self.processor.shutdown(timeout_s * (1.0 - self._metrics_share))
        self.exporter.shutdown(max(0.0, deadline - time.monotonic()))
