"""Publishes which span each thread serves, in OBI's pinned ``traces_ctx_v1``
map (bpf/tracectx.c), so an OpenTelemetry eBPF profiler beside the agent
tags its samples with otelbpf's spans (``--publish-trace-context``).

A window observer of the linker: an entry is written when a request window
opens on a thread (SERVER or CONSUMER span) and deleted when it closes, if it
still names that span (a thread with nested windows keeps the newest). Off by
default: two map updates per request, and the entries trail the kernel by the
agent's drain interval.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess

log = logging.getLogger("otelbpf.profiles")

PIN_DIR = "/sys/fs/bpf"
PIN_PATH = f"{PIN_DIR}/traces_ctx_v1"


def ensure_bpffs() -> None:
    """The pin needs a BPF filesystem at /sys/fs/bpf: mount one if absent (root)."""
    if _is_bpffs(PIN_DIR):
        return
    os.makedirs(PIN_DIR, exist_ok=True)
    done = subprocess.run(["mount", "-t", "bpf", "bpf", PIN_DIR], capture_output=True, text=True)
    if done.returncode != 0 or not _is_bpffs(PIN_DIR):
        raise OSError(f"--publish-trace-context: no BPF filesystem at {PIN_DIR} and mounting one failed: {done.stderr.strip()}")


def _is_bpffs(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1:3] == [path, "bpf"] for line in mounts)
    except OSError:
        return False


class TraceContextPublisher:
    """Keeps ``traces_ctx_v1`` in step with the linker's request windows."""

    def __init__(self, table) -> None:
        self.table = table
        self.errors = 0

    def attach(self, linker) -> None:
        linker.window_observers.append(self)

    def opened(self, start) -> None:
        key = self.table.Key((start.pid << 32) | start.tid)
        value = self.table.Leaf()
        ctypes.memmove(value.trace_id, start.trace_id, 16)
        ctypes.memmove(value.span_id, start.span_id, 8)
        try:
            self.table[key] = value
        except Exception:  # noqa: BLE001 - a full or removed map costs the link, not the agent
            self.errors += 1

    def closed(self, start, _end_ns: int) -> None:
        key = self.table.Key((start.pid << 32) | start.tid)
        try:
            current = self.table[key]
        except KeyError:
            return
        if bytes(current.span_id) == start.span_id:
            try:
                del self.table[key]
            except KeyError:
                pass
