"""Which PyThreadState belongs to which kernel thread.

BPF only knows the sampled tid; it finds that thread's frames through a
tid -> PyThreadState* map that this walk fills. The walk follows
``_PyRuntime.interpreters.head -> next`` and each interpreter's
``threads.head -> next``. 3.11+ record the kernel tid (``native_thread_id``);
3.10 only has ``thread_id``, the ``pthread_t``, which is the address of
glibc's ``struct pthread`` whose ``tid`` field we read. Threads started
later are absent until the next walk: callers re-run it (rate-limited) when
BPF reports an unknown tid.
"""

from __future__ import annotations

import os

from otelbpf.profiles.python import offsets as O
from otelbpf.profiles.python.interpreter import ProcMem, PythonProcess

MAX_THREADS = 4096
MAX_INTERPRETERS = 64
#: offsetof(struct pthread, tid) on glibc x86-64 (2.26 onwards, 2.36 checked);
#: tried first, validated against /proc/PID/task like any other candidate.
GLIBC_PTHREAD_TID = 0x2D0
#: How far into struct pthread to search when the constant does not validate.
_PTHREAD_SCAN = 2048


def thread_states(proc: PythonProcess, mem: ProcMem | None = None) -> dict[int, int]:
    """tid -> PyThreadState* of every thread of every interpreter ({} on failure)."""
    if proc.layout is None:
        return {}
    own = mem is None
    mem = mem or ProcMem(proc.pid)
    try:
        pairs = list(_walk(proc.runtime_addr, proc.layout.threads, mem))
        if proc.layout.threads.tstate_native_thread_id != O.NONE:
            return {tid: ts for ts, tid in pairs if tid}
        return _by_pthread(proc, pairs, mem)
    finally:
        if own:
            mem.close()


def thread_pointers(proc: PythonProcess, mem: ProcMem) -> list[tuple[int, int]]:
    """(PyThreadState*, pthread_t) of every thread of every interpreter: on glibc x86-64 the
    pthread_t is the thread's struct pthread, which is also its thread pointer (fsbase), where
    its thread-local storage starts (otelbpf/profiles/python/thread_local.py checks the TLS path with it)."""
    if proc.layout is None:
        return []
    t = proc.layout.threads
    return [(tstate, pthread) for tstate, pthread in _walk(proc.runtime_addr, t, mem, t.tstate_thread_id) if pthread]


def _walk(runtime: int, t: O.ThreadOffsets, mem: ProcMem, id_field: int | None = None):
    """(tstate, id) pairs: id is native_thread_id (3.11+) or thread_id (3.10), or the
    field at ``id_field``. Bounded and cycle-safe: a torn list read while the process
    runs must not loop."""
    if id_field is None:
        id_field = t.tstate_native_thread_id if t.tstate_native_thread_id != O.NONE else t.tstate_thread_id
    seen: set[int] = set()
    interp = mem.u64(runtime + t.runtime_interpreters_head)
    for _ in range(MAX_INTERPRETERS):
        if not interp or interp in seen:
            return
        seen.add(interp)
        tstate = mem.u64(interp + t.interp_threads_head)
        while tstate and tstate not in seen and len(seen) < MAX_THREADS:
            seen.add(tstate)
            ident = mem.u64(tstate + id_field)
            if ident is not None:
                yield tstate, ident
            tstate = mem.u64(tstate + t.tstate_next)
        interp = mem.u64(interp + t.interp_next)


def _by_pthread(proc: PythonProcess, pairs: list[tuple[int, int]], mem: ProcMem) -> dict[int, int]:
    """3.10: map pthread_t -> tid through struct pthread's tid field."""
    tasks = _tasks(proc.pid)
    if proc.pthread_tid_offset is None:
        proc.pthread_tid_offset = _find_tid_offset([p for _, p in pairs], tasks, mem)
    if proc.pthread_tid_offset is None:
        return {}
    out = {}
    for tstate, pthread in pairs:
        tid = mem.u32(pthread + proc.pthread_tid_offset)
        if tid in tasks:
            out[tid] = tstate
    return out


def _find_tid_offset(pthreads: list[int], tasks: set[int], mem: ProcMem) -> int | None:
    """The offset at which every live pthread reads as a distinct tid of this process.
    The glibc constant is tried first, so a coincidental match elsewhere cannot win."""
    blobs = [b for b in (_pthread_bytes(mem, p) for p in pthreads if p) if b]
    if not blobs or not tasks:
        return None
    for offset in [GLIBC_PTHREAD_TID, *range(0, _PTHREAD_SCAN, 4)]:
        if any(len(b) < offset + 4 for b in blobs):
            continue
        tids = [int.from_bytes(b[offset:offset + 4], "little") for b in blobs]
        if len(set(tids)) == len(tids) and all(t in tasks for t in tids):
            return offset
    return None


def _pthread_bytes(mem: ProcMem, pthread: int) -> bytes | None:
    """The start of a struct pthread; shorter when the mapping ends sooner (the
    main thread's lives in static TLS, near the end of its mapping)."""
    return mem.read(pthread, _PTHREAD_SCAN) or mem.read(pthread, GLIBC_PTHREAD_TID + 4)


def _tasks(pid: int) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except (OSError, ValueError):
        return set()
