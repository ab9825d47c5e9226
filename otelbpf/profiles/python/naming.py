"""Name the code objects BPF saw: function, file and line, read from /proc/PID/mem.

A code object's address is all a sample carries. Naming it costs a few
reads, so names are cached per (pid, address). Addresses are reused once a
code object is freed, so every lookup re-reads the object's header (one
``pread``) and compares a fingerprint: ``co_firstlineno``, ``co_argcount`` and
the pointers to ``co_linetable`` and ``co_filename`` (the new object at a
reused address would need the same line, arity and the very same table and
file objects to pass). The cache is an LRU of ``max_codes`` code objects;
each keeps at most ``MAX_LINES`` resolved (offset -> Frame) entries and
starts over when full (hot loops touch few offsets).

Every pointer here is untrusted (a sample races with the program, BPF may
read a half-built frame): reads that fail or decode to nonsense give
``None`` and a counter in :attr:`CodeNamer.stats`, never an exception.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from otelbpf.profiles.model import FRAME_PYTHON, Frame
from otelbpf.profiles.python import offsets as O
from otelbpf.profiles.python.interpreter import ProcMem, PythonProcess, find_python

#: Longest name or file name we read; longer ones are garbage or not worth it.
MAX_STR = 4096
#: Largest line table we read (a 10k-line function has ~40 KiB).
MAX_LINETABLE = 256 * 1024
MAX_LINES = 512
#: A cached code object is re-checked against the process (one read of its
#: header: was it freed and its address reused?) at most this often. Code
#: objects live as long as their functions; within this window a reused
#: address could name a frame after the code object that held it before.
REVERIFY_S = 1.0


def read_str(mem: ProcMem, addr: int, co: O.CodeOffsets) -> str | None:
    """A compact ``str`` (ASCII or not) in the other process, or None."""
    head = mem.read(addr, co.str_state + 4)
    if head is None:
        return None
    length = struct.unpack_from("<q", head, co.str_length)[0]
    state = struct.unpack_from("<I", head, co.str_state)[0]
    kind, compact, ascii = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or kind not in (1, 2, 4) or not 0 <= length <= MAX_STR or (ascii and kind != 1):
        return None
    data = mem.read(addr + (co.str_ascii_data if ascii else co.str_compact_data), length * kind) if length else b""
    if data is None:
        return None
    encoding = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return data.decode(encoding, errors="replace")


def read_bytes(mem: ProcMem, addr: int, co: O.CodeOffsets, limit: int = MAX_LINETABLE) -> bytes | None:
    """A ``bytes`` object's contents, or None."""
    size = mem.read(addr + co.bytes_size, 8)
    if size is None:
        return None
    n = struct.unpack("<q", size)[0]
    if not 0 <= n <= limit:
        return None
    return mem.read(addr + co.bytes_data, n) if n else b""


def line_pep626(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.10 co_linetable: (unsigned byte delta, signed line delta) pairs; a line
    delta of -128 means "no line". ``offset`` is in bytes."""
    line, end = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        start, end = end, end + table[i]
        delta = table[i + 1] - 256 if table[i + 1] > 127 else table[i + 1]
        if delta != -128:
            line += delta
        current = None if delta == -128 else line
        if start <= offset < end:
            return current
    return None


def line_locations(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.11+ location table (Objects/locations.md); ``offset`` in code units."""
    line, addr, pos, n = firstlineno, 0, 0, len(table)
    while pos < n:
        first = table[pos]
        pos += 1
        if not first & 0x80:
            return None
        code, length = (first >> 3) & 15, (first & 7) + 1
        current: int | None = line
        if code == 15:
            current = None
        elif code in (13, 14):
            delta, pos = _svarint(table, pos)
            line += delta
            current = line
            if code == 14:
                for _ in range(3):
                    _, pos = _varint(table, pos)
        elif code >= 10:
            line += code - 10
            current = line
            pos += 2
        else:
            pos += 1
        if addr <= offset < addr + length:
            return current
        addr += length
    return None


def _varint(table: bytes, pos: int) -> tuple[int, int]:
    """6-bit little-endian chunks; 0x40 says another chunk follows."""
    value = shift = 0
    while pos < len(table):
        b = table[pos]
        pos += 1
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            break
    return value, pos


def _svarint(table: bytes, pos: int) -> tuple[int, int]:
    value, pos = _varint(table, pos)
    return (-(value >> 1) if value & 1 else value >> 1), pos


@dataclass(slots=True)
class _Code:
    """What we know of one code object."""

    fingerprint: tuple[int, int, int, int]
    function: str
    file: str
    firstlineno: int
    linetable: bytes
    frames: dict[int, Frame] = field(default_factory=dict)
    #: When the fingerprint was last checked against the process (monotonic seconds).
    checked: float = 0.0


@dataclass(slots=True)
class _Pid:
    proc: PythonProcess | None
    mem: ProcMem


#: Entries of a process's (code, instr) -> frame table before it starts over.
MAX_TABLE = 65536


class CodeNamer:
    """Code object address (+ instruction) -> Python :class:`Frame`, cached.

    :meth:`table` is the per-sample fast path: (code, instr) as BPF reported
    them -> (Frame, its code object's entry), filled by :meth:`name`; a caller
    may use a hit while ``entry.checked`` is less than :data:`REVERIFY_S` old
    (the bound :meth:`name` keeps) and calls :meth:`name` otherwise."""

    def __init__(self, max_codes: int = 16384):
        self.max_codes = max_codes
        self._codes: OrderedDict[tuple[int, int], _Code] = OrderedDict()
        self._pids: dict[int, _Pid] = {}
        self._tables: dict[int, dict[tuple[int, int], tuple[Frame, _Code]]] = {}
        self.stats = {"hits": 0, "misses": 0, "reused": 0, "failed": 0}

    def table(self, pid: int) -> dict[tuple[int, int], tuple[Frame, _Code]]:
        """``pid``'s (code, instr) -> (Frame, code entry) table (see the class)."""
        table = self._tables.get(pid)
        if table is None:
            table = self._tables[pid] = {}
        return table

    def attach(self, proc: PythonProcess) -> None:
        """Use this already found interpreter for its pid (else name() finds it)."""
        self.forget(proc.pid)
        self._pids[proc.pid] = _Pid(proc, ProcMem(proc.pid))

    def forget(self, pid: int) -> None:
        """Drop a process (it exited: its pid and code addresses will be reused)."""
        state = self._pids.pop(pid, None)
        self._tables.pop(pid, None)
        if state is not None:
            state.mem.close()
        for key in [k for k in self._codes if k[0] == pid]:
            del self._codes[key]

    def name(self, pid: int, code_addr: int, instr: int) -> Frame | None:
        """The frame for one (code, instr) record of ``pid``, or None if unreadable."""
        state = self._pids.get(pid)
        if state is None:
            self._pids[pid] = state = _Pid(find_python(pid), ProcMem(pid))
        layout = state.proc.layout if state.proc else None
        if layout is None:
            return None
        reported = code_addr
        code_addr &= ~layout.code_tag_mask
        entry = self._codes.get((pid, code_addr))
        now = time.monotonic()
        if entry is not None and now - entry.checked < REVERIFY_S:
            self.stats["hits"] += 1
        else:
            entry = self._entry(state, layout, code_addr)
            if entry is None:
                self.stats["failed"] += 1
                return None
        frame = self._frame(entry, layout, code_addr, instr)
        table = self.table(pid)
        if len(table) >= MAX_TABLE:
            table.clear()
        table[(reported, instr)] = (frame, entry)
        return frame

    def _entry(self, state: _Pid, layout: O.PythonLayout, addr: int) -> _Code | None:
        """The cached code object if its fingerprint still matches, else read it anew."""
        co = layout.code
        head = state.mem.read(addr, co.header_size())
        if head is None:
            return None
        if state.proc.code_type_addr and _u64(head, co.ob_type) != state.proc.code_type_addr:
            return None
        fingerprint = (_i32(head, co.co_firstlineno), _i32(head, co.co_argcount),
                       _u64(head, co.co_linetable), _u64(head, co.co_filename))
        key = (state.mem.pid, addr)
        entry = self._codes.get(key)
        if entry is not None and entry.fingerprint == fingerprint:
            self.stats["hits"] += 1
            self._codes.move_to_end(key)
            entry.checked = time.monotonic()
            return entry
        self.stats["reused" if entry is not None else "misses"] += 1
        entry = self._read_code(state.mem, co, head, fingerprint)
        if entry is not None:
            entry.checked = time.monotonic()
            self._codes[key] = entry
            if len(self._codes) > self.max_codes:
                self._codes.popitem(last=False)
        return entry

    @staticmethod
    def _read_code(mem: ProcMem, co: O.CodeOffsets, head: bytes, fingerprint) -> _Code | None:
        """Names and line table of a code object whose header is ``head``."""
        name_field = co.co_qualname if co.co_qualname != O.NONE else co.co_name
        function = read_str(mem, _u64(head, name_field), co)
        file = read_str(mem, fingerprint[3], co)
        table = read_bytes(mem, fingerprint[2], co)
        if function is None or file is None or table is None:
            return None
        return _Code(fingerprint, function, file, fingerprint[0], table)

    def _frame(self, entry: _Code, layout: O.PythonLayout, addr: int, instr: int) -> Frame:
        """The Frame at one instruction, through the per-code line cache."""
        offset = _offset(layout, addr, instr)
        frame = entry.frames.get(offset)
        if frame is None:
            if len(entry.frames) >= MAX_LINES:
                entry.frames.clear()
            if layout.code.linetable == O.LINETABLE_PEP626:
                line = line_pep626(entry.linetable, entry.firstlineno, offset * 2)
            else:
                line = line_locations(entry.linetable, entry.firstlineno, offset)
            frame = Frame(kind=FRAME_PYTHON, function=entry.function, file=entry.file, line=line or 0)
            entry.frames[offset] = frame
        return frame


def _offset(layout: O.PythonLayout, addr: int, instr: int) -> int:
    """Instruction index (code units) from BPF's instr: 3.10's f_lasti as is,
    3.11+'s pointer relative to co_code_adaptive. Before the first
    instruction (3.11/3.12 prev_instr starts one unit early) counts as 0."""
    if layout.code.co_code_adaptive == O.NONE:
        lasti = instr & 0xFFFFFFFF
        return max(lasti - (1 << 32) if lasti >= 1 << 31 else lasti, 0)
    return max((instr - addr - layout.code.co_code_adaptive) // 2, 0)


def _u64(data: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", data, offset)[0]


def _i32(data: bytes, offset: int) -> int:
    return struct.unpack_from("<i", data, offset)[0]
