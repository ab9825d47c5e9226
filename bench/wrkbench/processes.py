"""The child processes a bench starts (nginx, wrk, the agent, the receiver), and their lifetime.

Every child is tracked and runs in its own session, so Ctrl-C reaches only the bench, which then
stops each one in order; each also gets SIGTERM if the bench dies without cleaning up
(PR_SET_PDEATHSIG). Nothing is left running after a run, however it ends.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess

from .console import BenchError, say

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Children:
    def __init__(self) -> None:
        self._procs: list[tuple[str, subprocess.Popen, int]] = []

    def start(self, name: str, argv: list[str], stop_signal: int = signal.SIGTERM, **kwargs) -> subprocess.Popen:
        try:
            proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent, **kwargs)
        except OSError as exc:
            raise BenchError(f"cannot start {name} ({argv[0]}): {exc}") from exc
        self._procs.append((name, proc, stop_signal))
        return proc

    def forget(self, proc: subprocess.Popen) -> None:
        self._procs = [entry for entry in self._procs if entry[1] is not proc]

    def stop(self, proc: subprocess.Popen, timeout: float = 15.0, sig: int | None = None) -> int | None:
        """Signal ``proc`` (its stop signal), wait, SIGKILL after ``timeout``. Returns its exit code."""
        entry = next((e for e in self._procs if e[1] is proc), None)
        if sig is None:
            sig = entry[2] if entry else signal.SIGTERM
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                name = entry[0] if entry else str(proc.args)
                say(f"  ! {name} (pid {proc.pid}) did not exit within {timeout:.0f}s of signal {sig}: killing it")
                proc.kill()
                proc.wait(5)
        self.forget(proc)
        return proc.returncode

    def stop_all(self) -> None:
        for _name, proc, _sig in reversed(list(self._procs)):
            self.stop(proc, timeout=20.0)


def taskset(cpus: str | None, argv: list[str]) -> list[str]:
    """``argv`` pinned to ``cpus`` (a taskset list), or unchanged when ``cpus`` is None."""
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server the bench starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
