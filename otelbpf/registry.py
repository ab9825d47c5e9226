"""The protocols and call families the agent knows: one registration line each.

Adding a protocol (DEVELOPERS.md, "Adding a protocol") touches its own folder
``protocols/<id>/``, its span semantics ``otelbpf/semantics/<id>.py``, its
metric instruments ``otelbpf/metrics/<id>.py``, and one line in
:func:`default_registry`. The pipeline, the metric aggregator and the
encoders look everything up here; none of them names a protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from otelbpf import fastpath, semconv as sc
from otelbpf.metrics import (
    genai as genai_metrics,
    gpu as gpu_metrics,
    http1 as http1_metrics,
    http2 as http2_metrics,
    rtps as rtps_metrics,
)
from otelbpf.metrics.instruments import SpanHistogram
from otelbpf.semantics import http1 as http1_semantics, http2 as http2_semantics, rtps as rtps_semantics
from otelbpf.semantics.common import CallSemantics, SpanSemantics
from protocols.base import Detector, Transport
from protocols.http1 import Http1Detector
from protocols.http2 import Http2Detector
from protocols.rtps import RtpsDetector


@dataclass(frozen=True, slots=True)
class RegisteredProtocol:
    detector: Detector
    semantics: SpanSemantics
    instruments: tuple[SpanHistogram, ...]

    @property
    def id(self) -> str:
        return self.detector.protocol


class Registry:
    """Protocols by id (in detection order) and call semantics by library."""

    def __init__(self) -> None:
        self._protocols: dict[str, RegisteredProtocol] = {}
        self._calls: dict[str, CallSemantics] = {}
        self._call_instruments: dict[str, tuple[SpanHistogram, ...]] = {}

    def register(self, detector: Detector, semantics: SpanSemantics, instruments: Sequence[SpanHistogram] = ()) -> None:
        """Add a protocol: its detector (tried in registration order), its span
        semantics and its metric instruments. The three must name the same id."""
        if not isinstance(detector, Detector):
            raise TypeError(
                f"{type(detector).__name__} must subclass protocols.base.Detector (its optional capabilities have their defaults there)"
            )
        protocol = detector.protocol
        if semantics.protocol != protocol:
            raise ValueError(f"detector is for {protocol!r} but semantics for {semantics.protocol!r}")
        if protocol in self._protocols:
            raise ValueError(f"protocol {protocol!r} is registered twice")
        self._protocols[protocol] = RegisteredProtocol(detector, semantics, tuple(instruments))

    def register_calls(self, semantics: CallSemantics) -> None:
        """Add the span semantics of a library's calls (``CallEvent.library``)."""
        if not isinstance(semantics, CallSemantics):
            raise TypeError(
                f"{type(semantics).__name__} must subclass otelbpf.semantics.common.CallSemantics (its optional capabilities have their defaults there)"
            )
        if semantics.library in self._calls:
            raise ValueError(f"call library {semantics.library!r} is registered twice")
        self._calls[semantics.library] = semantics

    def register_call_instruments(self, library: str, instruments: Sequence[SpanHistogram]) -> None:
        """Metric instruments fed by the spans of ``library``'s calls (their span
        ``protocol`` is the library id). Separate from ``register_calls``: the call
        semantics are attached per pipeline, the instruments are known up front."""
        self._call_instruments[library] = tuple(instruments)

    @property
    def protocols(self) -> list[RegisteredProtocol]:
        return list(self._protocols.values())

    def detectors(self, transport: Transport | None = None) -> list[Detector]:
        """Detectors in registration order; only those that can appear on ``transport`` if given."""
        return [
            entry.detector
            for entry in self._protocols.values()
            if transport is None or entry.detector.transports & transport
        ]

    def notices(self) -> list[str]:
        """Lines for the agent's log from the detectors (``Detector.take_notices``), each once."""
        out: list[str] = []
        for entry in self._protocols.values():
            out += entry.detector.take_notices()
        return out

    def take_counts(self) -> list[tuple[str, int, str]]:
        """Self-metric increments the detectors counted since the last call
        (``Detector.take_counts``: the fast path's share of the traffic), as (name, amount, label)."""
        out: list[tuple[str, int, str]] = []
        for entry in self._protocols.values():
            out += entry.detector.take_counts()
        return out

    def semantics(self, protocol: str) -> SpanSemantics | None:
        entry = self._protocols.get(protocol)
        return entry.semantics if entry is not None else None

    def call_semantics(self, library: str) -> CallSemantics | None:
        return self._calls.get(library)

    def instruments(self) -> dict[str, tuple[SpanHistogram, ...]]:
        """Metric instruments by protocol id (what the metric aggregator iterates over)."""
        found = {entry.id: entry.instruments for entry in self._protocols.values() if entry.instruments}
        found.update(self._call_instruments)
        return found


def default_registry(fast_path: bool | None = None) -> Registry:
    """Every protocol otelbpf ships, in detection order. ``fast_path``: HTTP/1 on the
    compiled fast path (otelbpf.fastpath); None: wherever it is built and not turned off."""
    registry = Registry()
    # Semantics per registry: a pipeline may attach its GenAI layer to HTTP/1's and
    # HTTP/2's (otelbpf.semantics.genai.attach); LLM calls are HTTP spans, so the
    # GenAI instruments are theirs too (they select spans with gen_ai.* attributes).
    # Before HTTP/1: an HTTP/1.1 request with "Upgrade: h2c" opens an HTTP/2 connection.
    registry.register(
        Http2Detector(), http2_semantics.Http2Semantics(), http2_metrics.INSTRUMENTS + genai_metrics.INSTRUMENTS
    )
    if fast_path is None:
        fast_path = fastpath.enabled()
    http1_detector = fastpath.FastHttp1Detector() if fast_path else Http1Detector()
    registry.register(http1_detector, http1_semantics.Http1Semantics(), http1_metrics.INSTRUMENTS + genai_metrics.INSTRUMENTS)
    registry.register(RtpsDetector(), rtps_semantics.SEMANTICS, rtps_metrics.INSTRUMENTS)
    # CUDA and NCCL call spans (their semantics attach per pipeline: otelbpf.semantics.gpu)
    registry.register_call_instruments(sc.OTELBPF_SCOPE_CUDA, gpu_metrics.CUDA_INSTRUMENTS)
    registry.register_call_instruments(sc.OTELBPF_SCOPE_NCCL, gpu_metrics.NCCL_INSTRUMENTS)
    return registry


def default_instruments() -> dict[str, tuple[SpanHistogram, ...]]:
    """The metric instruments of every shipped protocol, by protocol id."""
    return default_registry().instruments()
