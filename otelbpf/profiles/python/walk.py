"""The BPF frame walk, redone in user space: for tests and debugging.

:func:`read_frame_records` follows one thread's frame chain with the same
:class:`~.offsets.PyOffsets` and emits the same (code, instr, flags) records
the BPF program does, so tests check the offsets and the record semantics
without BPF. :func:`frames_from_bpf` turns records (from either source) into
:class:`PyFrameRef`; :func:`walk_thread` names them. The thread runs on
while we read unless it is stopped, so this is not the per-sample path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from otelbpf.profiles.model import FRAME_PYTHON, Frame
from otelbpf.profiles.python import offsets as O
from otelbpf.profiles.python.naming import CodeNamer
from otelbpf.profiles.python.interpreter import ProcMem, PythonProcess

#: As deep as the BPF walk goes.
MAX_FRAMES = 64


@dataclass(frozen=True, slots=True)
class PyFrameRef:
    """One Python frame of a sample, before naming."""

    code: int
    instr: int
    #: The last Python frame (leaf to root) of one _PyEval_EvalFrameDefault call:
    #: where merging with native frames moves on to the next eval frame.
    ends_eval: bool


def frames_from_bpf(records: Iterable[tuple[int, int, int]], owner_kind: int) -> list[PyFrameRef]:
    """(code, instr, flags) records, leaf first -> frames, shims dropped.

    A frame ends its eval call when flagged so, when the next record (towards
    the root) is a shim (BPF need not look back to flag it), or always on
    3.10 (OWNER_NONE)."""
    records = list(records)
    every = owner_kind == O.OWNER_NONE
    out = []
    for i, (code, instr, flags) in enumerate(records):
        if flags & O.FLAG_SHIM or not code:
            continue
        before_shim = i + 1 < len(records) and records[i + 1][2] & O.FLAG_SHIM
        out.append(PyFrameRef(code, instr, every or bool(flags & O.FLAG_ENDS_EVAL or before_shim)))
    return out


def read_frame_records(proc: PythonProcess, tstate: int, mem: ProcMem) -> list[tuple[int, int, int]]:
    """What the BPF walk emits for ``tstate``, leaf first (cycle-safe, bounded):
    each frame's own flags; the frame before a shim is left to frames_from_bpf."""
    b = proc.layout.bpf
    frame = mem.u64(tstate + b.tstate_frame)
    if frame and b.cframe_current_frame != O.NONE:
        frame = mem.u64(frame + b.cframe_current_frame)
    records: list[tuple[int, int, int]] = []
    seen: set[int] = set()
    while frame and frame not in seen and len(records) < MAX_FRAMES:
        seen.add(frame)
        code = mem.u64(frame + b.frame_code)
        instr = mem.u32(frame + b.frame_instr) if b.owner_kind == O.OWNER_NONE else mem.u64(frame + b.frame_instr)
        if code is None or instr is None:
            break
        records.append((code, instr, _flags(b, mem, frame)))
        frame = mem.u64(frame + b.frame_previous)
    return records


def _flags(b: O.PyOffsets, mem: ProcMem, frame: int) -> int:
    """This frame's own flags: is_entry (3.11), shim (3.12+), always ends (3.10)."""
    if b.owner_kind == O.OWNER_NONE:
        return O.FLAG_ENDS_EVAL
    owner = mem.read(frame + b.frame_owner, 1)
    if owner is None:
        return O.FLAG_SHIM
    if b.owner_kind == O.OWNER_IS_ENTRY:
        return O.FLAG_ENDS_EVAL if owner[0] else 0
    return O.FLAG_SHIM if owner[0] >= b.shim_owner else 0


def walk_thread(proc: PythonProcess, tstate: int, namer: CodeNamer | None = None) -> list[Frame]:
    """The named Python stack of one thread, leaf first. Unnameable frames
    show as ``<unknown>`` so the depth stays right."""
    if proc.layout is None:
        return []
    if namer is None:
        namer = CodeNamer()
        namer.attach(proc)
    mem = ProcMem(proc.pid)
    try:
        refs = frames_from_bpf(read_frame_records(proc, tstate, mem), proc.layout.bpf.owner_kind)
    finally:
        mem.close()
    return [namer.name(proc.pid, r.code, r.instr) or Frame(kind=FRAME_PYTHON, function="<unknown>") for r in refs]
