"""The agent under test, started and stopped as a user would: ``otelbpf run ...``, then SIGINT.

The bench knows the agent only by its command line and two log lines: ``otelbpf: tracing, N
probes attached (Xs)`` once attached and ``otelbpf: stats {json}`` at exit. That keeps it able to
measure any version of the agent, another checkout's included (``AgentCommand``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkout import ROOT, git_state
from .console import BenchError, say
from .processes import Children, taskset
from .procfs import CLK_TCK, proc_cpu_ticks

TRACING_PREFIX = "otelbpf: tracing"
STATS_PREFIX = "otelbpf: stats "

@dataclass
class AgentRun:
    proc: subprocess.Popen
    started: float
    attached_after_s: float | None = None
    self_reported_s: float | None = None
    lines: deque = field(default_factory=lambda: deque(maxlen=400))
    stats: dict[str, int] | None = None
    tracing: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self, n: int = 30) -> str:
        return "\n".join(list(self.lines)[-n:]) or "(no output)"

@dataclass
class AgentCommand:
    """How to start the agent under test: ``argv`` + ``run ...`` in ``cwd``.

    Default: this interpreter, ``-m otelbpf``, in this checkout. ``--repo PATH`` runs another
    checkout (its ``.venv/bin/python`` if it has one, else this interpreter; ``-m`` imports the
    package from the working directory first, so PATH's code runs even from this venv).
    ``--otelbpf-cmd`` gives the whole prefix (e.g. ``/opt/x/.venv/bin/otelbpf``).
    """

    argv: list[str]
    cwd: Path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "AgentCommand":
        cwd = Path(args.repo).resolve() if args.repo else ROOT
        if args.otelbpf_cmd:
            return cls(shlex.split(args.otelbpf_cmd), cwd)
        python = args.agent_python
        if python is None:
            venv = cwd / ".venv" / "bin" / "python"
            python = str(venv) if args.repo and venv.exists() else sys.executable
        return cls([python, "-m", "otelbpf"], cwd)

    def describe(self) -> dict[str, Any]:
        return {"argv": self.argv, "cwd": str(self.cwd), **git_state(self.cwd)}

class AgentLauncher:
    def __init__(self, children: Children, cpus: str | None, extra_args: list[str], command: AgentCommand | None = None) -> None:
        self.children = children
        self.cpus = cpus
        self.extra_args = extra_args
        self.command = command or AgentCommand([sys.executable, "-m", "otelbpf"], ROOT)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        self.env["PYTHONUNBUFFERED"] = "1"

    def start(self, targets: list[str], outputs: list[str], timeout: float = 90.0, cpus: str | None | bool = False) -> AgentRun:
        """Start ``otelbpf run`` and wait for its 'tracing' line. ``cpus``: override the pinning (None = unpinned)."""
        cpus = self.cpus if cpus is False else cpus
        argv = taskset(cpus, [*self.command.argv, "run", *targets, *outputs, *self.extra_args])
        started = time.monotonic()
        proc = self.children.start(
            "otelbpf agent", argv, stop_signal=signal.SIGINT, cwd=self.command.cwd, env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1,
        )
        run = AgentRun(proc=proc, started=started)
        run.reader = threading.Thread(target=self._read_stderr, args=(run,), daemon=True)
        run.reader.start()
        deadline = started + timeout
        while not run.tracing.wait(0.05):
            if proc.poll() is not None:
                run.reader.join(2)
                raise BenchError(f"the agent exited with {proc.returncode} before attaching:\n  {' '.join(argv)}\n{run.stderr_tail()}")
            if time.monotonic() > deadline:
                self.stop(run)
                raise BenchError(f"the agent did not report '{TRACING_PREFIX}' within {timeout:.0f}s:\n{run.stderr_tail()}")
        return run

    @staticmethod
    def _read_stderr(run: AgentRun) -> None:
        for line in run.proc.stderr:
            line = line.rstrip("\n")
            run.lines.append(line)
            if line.startswith(TRACING_PREFIX) and not run.tracing.is_set():
                run.attached_after_s = time.monotonic() - run.started
                try:
                    run.self_reported_s = float(line.rsplit("(", 1)[1].rstrip(")s"))
                except (IndexError, ValueError):
                    pass
                run.tracing.set()
            elif line.startswith(STATS_PREFIX):
                try:
                    run.stats = json.loads(line[len(STATS_PREFIX) :])
                except ValueError:
                    pass

    def stop(self, run: AgentRun, timeout: float = 120.0) -> dict[str, Any]:
        """SIGINT (flush and detach, as a user's Ctrl-C), wait; the final stats line."""
        try:
            os.kill(run.pid, signal.SIGCONT)  # in case it was stopped (mode 'kstop')
        except ProcessLookupError:
            pass
        t0 = time.monotonic()
        code = self.children.stop(run.proc, timeout=timeout)
        stopped_s = time.monotonic() - t0
        if run.reader is not None:
            run.reader.join(5)
        run.proc.stderr.close()
        if code != 0:
            say(f"  ! the agent exited with {code}; last lines:\n{run.stderr_tail(10)}")
        if run.stats is None:
            raise BenchError(f"the agent printed no final '{STATS_PREFIX.strip()}' line (exit {code}):\n{run.stderr_tail()}")
        return {"exit_code": code, "stop_s": round(stopped_s, 2), "stats": run.stats, "warnings": warnings_in(run.lines)}

    @staticmethod
    def wait_idle(run: AgentRun, max_wait_s: float = 10.0, idle_cores: float = 0.15, window_s: float = 0.5) -> float:
        """Wait until the agent has caught up with its backlog (uses < idle_cores for window_s). Seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_wait_s:
            a = proc_cpu_ticks(run.pid)
            time.sleep(window_s)
            b = proc_cpu_ticks(run.pid)
            if a is None or b is None or (b - a) / CLK_TCK / window_s < idle_cores:
                break
        return round(time.monotonic() - t0, 2)

def warnings_in(lines) -> list[str]:
    keys = ("warning", "error", "Traceback", "dropped", "not delivered")
    return [l for l in lines if any(k in l for k in keys) and not l.startswith(STATS_PREFIX)][-10:]

def stat(stats: dict[str, int], name: str) -> int:
    """A counter summed over its labels (name or name{label})."""
    return sum(v for k, v in stats.items() if k == name or k.startswith(name + "{"))

