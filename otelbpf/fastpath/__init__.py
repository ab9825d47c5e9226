"""The compiled fast path: common traffic in C-typed code, the reference for the rest.

The reference parsers and sessions (``protocols/``) are the specification. A fast-path
module takes the common shapes of one protocol's traffic in C-typed Cython and hands a
connection to the reference, at a message boundary, as soon as it sees anything else;
it takes the connection back when the reference is at rest again. Differential tests
(tests/test_fastpath_http1.py) demand the very same exchanges and spans from both.
docs/fastpath.md says what each module covers and what it costs.

It is on wherever it was built; ``otelbpf run --no-fast-path`` (or
``OTELBPF_FAST_PATH=0``) sends all traffic through the reference. The share of traffic
it took is a self-metric: ``otelbpf.fastpath.exchanges{protocol}`` against
``otelbpf.fastpath.handoffs{protocol}`` and ``otelbpf.spans.created``.
"""

from __future__ import annotations

import os

from protocols.base import Direction
from protocols.http1.detect import Http1Detector

#: Why the fast path is not available here, or "" when it is.
UNAVAILABLE = ""
try:
    from otelbpf.fastpath.http1 import FastCounts, FastHttp1Session
except ImportError:  # not built (no compiler): the reference takes all traffic
    FastCounts = FastHttp1Session = None  # type: ignore[assignment,misc]
    UNAVAILABLE = "the compiled fast path is not built (make install, or setup.py build_ext --inplace)"
except (ValueError, TypeError) as exc:
    # Built against the compiled reference types (protocols/http1/types), and those
    # imported are not them: OTELBPF_PURE=1, or a reference module edited since its
    # extension was built (protocols/_fresh.py then loads its .py). Cython says
    # "... size changed, may indicate binary incompatibility".
    FastCounts = FastHttp1Session = None  # type: ignore[assignment,misc]
    UNAVAILABLE = (
        "the compiled fast path does not match the reference modules imported (OTELBPF_PURE=1, or a stale "
        f"build: make install) ({exc})"
    )

#: Set to "0" to send every connection through the reference.
ENV = "OTELBPF_FAST_PATH"

_enabled = True


def available() -> bool:
    """Whether the fast path's modules are built and importable."""
    return FastHttp1Session is not None


def set_enabled(enabled: bool) -> None:
    """Turn the fast path on or off for the registries made from now on (``--no-fast-path``)."""
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    """On when built, unless turned off by ``set_enabled(False)`` or ``OTELBPF_FAST_PATH=0``."""
    return _enabled and available() and os.environ.get(ENV, "1") != "0"


def describe() -> str:
    """Where HTTP/1 goes, and why when not on the fast path: said once at start-up
    (with the self-metric ``otelbpf.fastpath.unavailable``) and by ``otelbpf doctor``."""
    if not available():
        return f"through the reference parsers only: {UNAVAILABLE}"
    if not enabled():
        return f"through the reference parsers only (--no-fast-path or {ENV}=0)"
    return "on the compiled fast path"


class FastHttp1Detector(Http1Detector):
    """The HTTP/1 detector whose sessions run on the fast path (``FastHttp1Session``).

    Detection is the reference's. Sessions whose every exchange reports progress (no
    filter) gain nothing from the fast path, which leaves those exchanges to the
    reference: they get a reference session from the start."""

    def __init__(self, body_limit: int = 0, report_progress: bool = False, progress_filter=None) -> None:
        if not available():
            raise RuntimeError(UNAVAILABLE)
        super().__init__(body_limit, report_progress, progress_filter)
        self.counts = FastCounts()

    def new_session(self, request_direction: Direction):
        if self.report_progress and self.progress_filter is None:
            return super().new_session(request_direction)
        return FastHttp1Session(
            request_direction,
            body_limit=self.body_limit,
            progress=self.report_progress,
            progress_filter=self.progress_filter,
            counts=self.counts,
        )

    def take_counts(self) -> list[tuple[str, int, str]]:
        """Self-metric increments since the last call: exchanges the fast path
        completed, and connections it handed to the reference."""
        exchanges, handoffs = self.counts.take()
        return [("otelbpf.fastpath.exchanges", exchanges, self.protocol), ("otelbpf.fastpath.handoffs", handoffs, self.protocol)]

