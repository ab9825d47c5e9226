"""What a host check found, in the words ``otelbpf doctor`` prints, and the process's capabilities.

Each layer that needs something of the host (the eBPF capture, the profiles' sampler)
describes its own checks; ``otelbpf.cli.doctor`` gathers them into one report, and
``otelbpf run`` refuses to start on a ``FAIL``. Every check says what it found and,
when something is missing, what to do about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: A check's status: ``FAIL`` stops ``otelbpf run``; ``WARN`` says what is lost.
OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def effective_capabilities() -> int:
    """This process's effective capability bits (``CapEff`` of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0
