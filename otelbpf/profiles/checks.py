"""`otelbpf doctor`'s profile checks: can this host take stack samples, read
the traced processes' memory, unwind native stacks, and read the Python
frames of the interpreters running here?

None of them fails the doctor: profiles are one signal of three, and each
check says what is lost and how to get it back (or ``--no-profiles``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

from otelbpf.host.checks import INFO, OK, WARN, Check, effective_capabilities

PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
CAP_SYS_PTRACE = 19
#: How many CPython processes the doctor describes (one line each).
MAX_PYTHON_PROCESSES = 12


def check_perf_events() -> Check:
    """Open the software CPU-clock event the sampler attaches to, on CPU 0."""
    name = "profiles: perf events"
    number = SYS_PERF_EVENT_OPEN.get(platform.machine())
    if number is None:
        return Check(name, WARN, f"{platform.machine()}: not supported by the profiler", "--no-profiles")
    attr = bytearray(128)
    struct.pack_into("<IIQQ", attr, 0, PERF_TYPE_SOFTWARE, len(attr), PERF_COUNT_SW_CPU_CLOCK, 1000)
    struct.pack_into("<Q", attr, 40, 1 | 1 << 10)  # disabled, freq (sample_period holds a frequency)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    fd = libc.syscall(number, buf, -1, 0, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        return Check(
            name,
            WARN,
            f"perf_event_open(CPU clock) failed: {os.strerror(err)}: no profiles",
            "run as root (or with CAP_PERFMON); check kernel.perf_event_paranoid; or --no-profiles",
        )
    os.close(fd)
    pmu = os.path.isdir("/sys/bus/event_source/devices/cpu")
    return Check(name, OK, "software CPU clock available" + ("" if pmu else " (no hardware PMU: the CPU clock is what samples)"))


def check_proc_mem() -> Check:
    """Python code objects are named from /proc/PID/mem, which needs ptrace access."""
    name = "profiles: /proc/PID/mem"
    if effective_capabilities() & (1 << CAP_SYS_PTRACE):
        return Check(name, OK, "CAP_SYS_PTRACE: Python frames of other processes can be named")
    return Check(
        name,
        WARN,
        "no CAP_SYS_PTRACE: Python frames of other users' processes stay unnamed",
        "run as root, or add CAP_SYS_PTRACE (the DaemonSet does)",
    )


def check_native_unwinder() -> Check:
    name = "profiles: native unwinder"
    try:
        from otelbpf.profiles.native import _dwunwind  # noqa: F401
    except ImportError as exc:
        return Check(name, WARN, f"not built ({exc}): Python frames only", "run scripts/install.sh (needs libdw-dev)")
    return Check(name, OK, "DWARF CFI unwinding with elfutils' libdw")


def check_python_processes(pids: list[int] | None = None) -> list[Check]:
    """Per running CPython process: its version, whether its frames can be read and where its
    threads' states are found (their TLS, or the interpreter's thread list)."""
    from otelbpf.profiles.python.interpreter import describe

    checks = []
    for pid in pids if pids is not None else _python_pids():
        try:
            detail = describe(pid)
            if detail.endswith("(offsets known)"):
                detail += f"; {_thread_states(pid)}"
        except Exception as exc:  # noqa: BLE001 - a process may exit or be unreadable
            detail = f"unreadable: {exc}"
        if detail == "not a CPython process":
            continue
        checks.append(Check(f"profiles: pid {pid}", INFO, detail))
        if len(checks) >= MAX_PYTHON_PROCESSES:
            break
    return checks


def _thread_states(pid: int) -> str:
    """Where the kernel would read this process's thread states (otelbpf/profiles/python/thread_local.py)."""
    from otelbpf.profiles.python.interpreter import ProcMem, find_python
    from otelbpf.profiles.python.thread_local import find_tstate_source
    from otelbpf.profiles.python.threads import thread_pointers

    proc = find_python(pid)
    mem = ProcMem(pid)
    try:
        found = find_tstate_source(proc, thread_pointers(proc, mem), mem)
    finally:
        mem.close()
    return f"thread states from the thread list ({found})" if isinstance(found, str) else f"thread states from TLS: {found.how}"


def _python_pids() -> list[int]:
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
        except OSError:
            continue
        if "python" in os.path.basename(exe):
            out.append(int(entry))
    return sorted(out)


def run_checks() -> list[Check]:
    return [check_perf_events(), check_proc_mem(), check_native_unwinder(), *check_python_processes()]
