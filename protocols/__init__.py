"""Pure protocol parsers: bytes and timestamps in, messages and exchanges out.

Nothing here imports eBPF, OpenTelemetry or does I/O (see protocols/base.py).
One package per protocol, named by its protocol id (``http1``); the agent
registers each one in ``otelbpf/registry.py``.
"""

from protocols import _fresh

_fresh.install()  # before any compiled module of protocols/ or otelbpf/ is imported

from protocols.base import (  # noqa: E402
    Detector,
    Direction,
    Exchange,
    ExchangeAbandoned,
    ExchangeCompleted,
    ExchangeKind,
    ExchangeProgress,
    ExchangeStarted,
    Outcome,
    Phase,
    Session,
    Transport,
)

__all__ = [
    "Detector",
    "Direction",
    "Exchange",
    "ExchangeAbandoned",
    "ExchangeCompleted",
    "ExchangeKind",
    "ExchangeProgress",
    "ExchangeStarted",
    "Outcome",
    "Phase",
    "Session",
    "Transport",
]
