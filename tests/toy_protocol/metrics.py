"""The toy protocol's metric instruments: one duration histogram per side."""

from otelbpf.core.model import SpanKind
from otelbpf.metrics.instruments import SpanHistogram, of_kind

INSTRUMENTS = (
    SpanHistogram(
        name="toy.server.duration",
        unit="s",
        description="Duration of toy requests served.",
        boundaries=(0.001, 0.01, 0.1),
        attributes=("toy.verb", "toy.status"),
        select=of_kind(SpanKind.SERVER),
    ),
    SpanHistogram(
        name="toy.client.duration",
        unit="s",
        description="Duration of toy requests made.",
        boundaries=(0.001, 0.01, 0.1),
        attributes=("toy.verb",),
        select=of_kind(SpanKind.CLIENT),
    ),
)
