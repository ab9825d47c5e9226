"""Durations as the command line takes them: ``--gpu-min-call-duration 50us``, ``--off-cpu-min 1ms``.

Text to nanoseconds, for the options of ``otelbpf run`` that set a
threshold; a unit is optional (a bare number is microseconds). Here, not in
otelbpf/cli/, because the profile kinds' switches (otelbpf/profiles/kinds.py)
read durations too, and profiles/ imports nothing of cli/.
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ns|us|µs|ms|s)?\s*$")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, None: 1_000}


def parse_duration_ns(text: str) -> int:
    """``50us``, ``1ms``, ``0`` (a bare number is microseconds) -> nanoseconds; ValueError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 50us, 1ms or 0")
    return round(float(match.group(1)) * _UNIT_NS[match.group(2)])
