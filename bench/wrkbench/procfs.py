"""CPU and memory of processes and of the machine, read from /proc.

The bench charges CPU to nginx, wrk, the agent and the receiver from their own counters, and
calls whatever else the machine did in a window noise: a window whose other processes used more
than ``NOISY_CORES`` is repeated or flagged.
"""

from __future__ import annotations

import os
import time
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: CPU used by processes outside the benchmark above which a window is flagged as noisy
NOISY_CORES = 0.15


def proc_cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process (all its threads), in clock ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5), counted after the comm


def proc_status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def cpu_busy_snapshot() -> dict[str, tuple[int, int]]:
    """Per CPU (and 'cpu' for all): (busy ticks, total ticks) from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *values = line.split()
            numbers = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            idle = numbers[3] + numbers[4]
            total = sum(numbers)
            out[name] = (total - idle, total)
    return out


def cpu_busy_between(before: dict, after: dict) -> dict[str, float]:
    """Busy fraction of each CPU between two snapshots (1.0 = that CPU fully busy)."""
    out = {}
    for name, (busy0, total0) in before.items():
        busy1, total1 = after.get(name, (busy0, total0))
        out[name] = round((busy1 - busy0) / (total1 - total0), 3) if total1 > total0 else 0.0
    return out


def system_busy_check(seconds: float = 1.0) -> float:
    """Busy share of the whole machine over ``seconds``."""
    before = cpu_busy_snapshot()
    time.sleep(seconds)
    return cpu_busy_between(before, cpu_busy_snapshot())["cpu"]


class CpuMeter:
    """CPU seconds used by a set of processes over a window, via /proc/PID/stat."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.start = {name: self._ticks(p) for name, p in pids.items()}
        self.system0 = cpu_busy_snapshot()

    @staticmethod
    def _ticks(pids: list[int]) -> int:
        return sum(proc_cpu_ticks(pid) or 0 for pid in pids)

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        out: dict[str, Any] = {"wall_s": round(wall, 3)}
        for name, pids in self.pids.items():
            used = (self._ticks(pids) - self.start[name]) / CLK_TCK
            out[f"{name}_cpu_s"] = round(used, 2)
            out[f"{name}_cores"] = round(used / wall, 3) if wall > 0 else 0.0
        system1 = cpu_busy_snapshot()
        out["cpu_busy"] = cpu_busy_between(self.system0, system1)
        out["busy_cores"] = round((system1["cpu"][0] - self.system0["cpu"][0]) / CLK_TCK / wall, 3) if wall > 0 else 0.0
        return out
