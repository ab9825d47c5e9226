"""Pure protocol parsers: bytes and timestamps in, messages and exchanges out.

Nothing here imports eBPF, OpenTelemetry or does I/O (see protocols/base.py).
"""

from protocols.base import Detector, Direction, ExchangeCompleted, ExchangeStarted, Session


def detectors() -> list[Detector]:
    """All protocol detectors, in the order they are tried."""
    from protocols.http1 import HTTP1_DETECTOR

    return [HTTP1_DETECTOR]


__all__ = ["Detector", "Direction", "ExchangeCompleted", "ExchangeStarted", "Session", "detectors"]
