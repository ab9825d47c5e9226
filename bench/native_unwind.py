#!/usr/bin/env python3
"""What the native unwinder (otelbpf/profiles/native) costs per stack sample.

A CPython interpreter spins in Python code; its main thread is snapshotted with ptrace
as bpf/profile.c would take it (registers + a copy of the stack, tests/ptrace_snapshot.py),
and the snapshots are unwound by DWARF CFI through libdw: once cold (the first sample
of a process opens its modules and reads their CFI) and many times warm (from the
unwinder's rule and symbol caches). Prints the figures; asserts nothing.

    sudo .venv/bin/python bench/native_unwind.py                  # Debian's python3
    sudo .venv/bin/python bench/native_unwind.py --python /root/.pyenv/versions/3.12.1/bin/python3.12
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ptrace_snapshot import snapshot  # noqa: E402

from otelbpf.profiles.native import NativeUnwinder  # noqa: E402

PY_SPIN = "def spin():\n    while True:\n        pass\nspin()\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter to spin (default Debian's)")
    p.add_argument("--snapshots", type=int, default=20, help="distinct snapshots to unwind")
    p.add_argument("--rounds", type=int, default=200, help="warm passes over them")
    args = p.parse_args()
    target = subprocess.Popen([args.python, "-c", PY_SPIN])
    try:
        time.sleep(0.3)
        samples = [snapshot(target.pid) for _ in range(args.snapshots)]
        cold_unwinder = NativeUnwinder()
        started = time.perf_counter()
        first = cold_unwinder.unwind(target.pid, *samples[0])
        cold = time.perf_counter() - started
        warm = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            for sample in samples:
                cold_unwinder.unwind(target.pid, *sample)
            warm.append((time.perf_counter() - started) / len(samples))
    finally:
        target.kill()
        target.wait()
    print(f"native unwind, {args.python} ({len(first.frames)} frames): cold {cold * 1e3:.1f} ms, "
          f"warm {statistics.median(warm) * 1e6:.1f} us/sample (median of {args.rounds} passes, min "
          f"{min(warm) * 1e6:.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
