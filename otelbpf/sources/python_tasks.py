"""The asyncio task probes: CPython's PyIter_Send, as a generic uprobe spec.

An asyncio event loop serves many requests on one thread, so the thread ID
cannot say which request a backend call belongs to. CPython's ``_asyncio``
runs each task step through the exported C function ``PyIter_Send`` (3.10+);
bpf/pytasks.c probes it to learn which coroutine is running when a syscall
happens. :data:`SPEC` says where it lives (the python executable, or
libpython when the interpreter is built shared); otelbpf/sources/uprobes.py
finds it in a process's maps, resolves it with pyelftools and attaches by pid.
"""

from __future__ import annotations

from otelbpf.host.procfs import executable_mappings
from otelbpf.sources.uprobes import ProbeSpec, resolve_symbols

SYMBOL = "PyIter_Send"

SPEC = ProbeSpec(
    name="python-asyncio-tasks",
    library=r"/(python3?[\d.]*[a-z]*|libpython3[\d.]*[a-z]*\.so[\d.]*)$",
    symbols=(SYMBOL,),
    entry="py_send_enter",
    ret="py_send_return",
)


def python_with_tasks(pid: int) -> str | None:
    """Path (through /proc/PID/root, so containers work) of the file in which
    ``pid`` runs PyIter_Send, or None if it is not a CPython >= 3.10."""
    for mapped in dict.fromkeys(m.path for m in executable_mappings(pid)):
        if not SPEC.matches(mapped):
            continue
        path = f"/proc/{pid}/root{mapped}"
        if resolve_symbols(path, SPEC.symbols):
            return path
    return None
