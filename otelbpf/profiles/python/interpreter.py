"""Find the CPython interpreter inside a process, and read its memory.

The interpreter is either the executable itself (Debian's static, non-PIE
``python3.11``) or ``libpython3.X.so`` (``--enable-shared`` builds such as
pyenv's). Either way the file exports ``_PyRuntime``; its address in the
process is the symbol plus the mapping's load bias. Everything version
specific comes from :mod:`.offsets`: the table for 3.10-3.12, the file's
own ``_Py_DebugOffsets`` for 3.13+. Files are read through
``/proc/PID/root`` so processes in other mount namespaces work, and parsed
once per (device, inode, mtime).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from otelbpf.host.procfs import Mapping, executable_mappings
from otelbpf.profiles.python import offsets as O

#: Names of files that may hold the interpreter.
_CANDIDATE = re.compile(r"^(lib)?python(\d)(?:\.(\d+))?")
_EVAL = "_PyEval_EvalFrameDefault"
_WANTED = ("_PyRuntime", "Py_Version", "PyCode_Type", _EVAL, _EVAL + ".cold")


class ProcMem:
    """Reads of another process's memory through /proc/PID/mem.

    Every failure (process gone, unmapped address, garbage pointer) is a
    ``None``: callers walk untrusted pointers and must never raise.
    """

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self._fd: int | None = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self, addr: int, size: int) -> bytes | None:
        """Exactly ``size`` bytes at ``addr``, or None."""
        if self._fd is None or not 0 < addr < 1 << 64 or not 0 < size <= 1 << 20:
            return None
        try:
            data = os.pread(self._fd, size, addr)
        except (OSError, OverflowError, ValueError):
            return None
        return data if len(data) == size else None

    def u64(self, addr: int) -> int | None:
        data = self.read(addr, 8)
        return None if data is None else struct.unpack("<Q", data)[0]

    def u32(self, addr: int) -> int | None:
        data = self.read(addr, 4)
        return None if data is None else struct.unpack("<I", data)[0]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class ElfInfo:
    """What one interpreter file says about itself (cached per file)."""

    is_pie: bool
    symbols: dict[str, tuple[int, int]]  # name -> (st_value, st_size)
    loads: list[tuple[int, int, int]]  # PT_LOAD (p_offset, p_vaddr, p_filesz)
    hexversion: int  # Py_Version, 0 when not exported (3.10)
    debug_offsets: bytes  # start of .PyRuntime, b"" when absent


@dataclass
class PythonProcess:
    """One CPython process as the profiler needs it.

    ``layout`` is None for versions without known offsets; ``reason`` then
    says why, in one line for the log and ``otelbpf doctor``.
    """

    pid: int
    path: str  # the interpreter file as the process maps it
    version: tuple[int, int]
    runtime_addr: int  # &_PyRuntime in the process
    code_type_addr: int  # &PyCode_Type in the process (0 if unknown)
    layout: O.PythonLayout | None
    reason: str = ""
    #: [start, end) of _PyEval_EvalFrameDefault (and its .cold part) in the process.
    eval_ranges: list[tuple[int, int]] = field(default_factory=list)
    #: glibc struct pthread -> tid offset, found on the first 3.10 thread walk.
    pthread_tid_offset: int | None = None
    #: process address minus file address of the interpreter file (0 for a non-PIE program)
    bias: int = 0

    @property
    def offsets(self) -> O.PyOffsets | None:
        return self.layout.bpf if self.layout else None


_elf_cache: dict[tuple[int, int, int], ElfInfo | None] = {}


def elf_info(path: str) -> ElfInfo | None:
    """Parse ``path`` once per file identity; None when it is not a usable ELF."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if key not in _elf_cache:
        try:
            with open(path, "rb") as f:
                _elf_cache[key] = _parse_elf(ELFFile(f), f)
        except (OSError, ELFError, ValueError, struct.error):
            _elf_cache[key] = None
    return _elf_cache[key]


def _parse_elf(elf: ELFFile, f) -> ElfInfo | None:
    """Symbols, load segments, Py_Version and _Py_DebugOffsets of one file."""
    symbols = _symbols(elf, ".dynsym")
    if "_PyRuntime" not in symbols:
        symbols = {**_symbols(elf, ".symtab"), **symbols}
    elif _EVAL + ".cold" not in symbols:
        cold = _symbols(elf, ".symtab").get(_EVAL + ".cold")
        if cold:
            symbols[_EVAL + ".cold"] = cold
    if "_PyRuntime" not in symbols:
        return None
    loads = [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
    info = ElfInfo(elf["e_type"] == "ET_DYN", symbols, loads, 0, b"")
    if "Py_Version" in symbols:
        raw = _read_vaddr(f, loads, symbols["Py_Version"][0], 4)
        info.hexversion = struct.unpack("<I", raw)[0] if raw else 0
    section = elf.get_section_by_name(".PyRuntime")
    if section is not None:
        f.seek(section["sh_offset"])
        info.debug_offsets = f.read(min(section["sh_size"], O.debug_offsets_size()))
    return info


def _symbols(elf: ELFFile, name: str) -> dict[str, tuple[int, int]]:
    """The wanted, defined symbols of one symbol table."""
    table = elf.get_section_by_name(name)
    if not isinstance(table, SymbolTableSection):
        return {}
    out = {}
    for sym in table.iter_symbols():
        if sym.name in _WANTED and sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
            out[sym.name] = (sym["st_value"], sym["st_size"])
    return out


def _read_vaddr(f, loads: list[tuple[int, int, int]], vaddr: int, size: int) -> bytes | None:
    """``size`` bytes of the file at virtual address ``vaddr``."""
    for offset, start, filesz in loads:
        if start <= vaddr and vaddr + size <= start + filesz:
            f.seek(offset + vaddr - start)
            return f.read(size)
    return None


def load_bias(info: ElfInfo, mapping: Mapping) -> int | None:
    """Process address minus file virtual address for this mapping's file."""
    if not info.is_pie:
        return 0
    for offset, vaddr, filesz in info.loads:
        if offset <= mapping.offset < offset + max(filesz, 1):
            return mapping.start - mapping.offset - (vaddr - offset)
    return None


def _candidates(pid: int) -> list[Mapping]:
    """First executable mapping of each file named like a Python; libpython first,
    because an ``--enable-shared`` executable only calls into it."""
    seen: dict[str, Mapping] = {}
    for m in executable_mappings(pid):
        if _CANDIDATE.match(os.path.basename(m.path)) and m.path not in seen:
            seen[m.path] = m
    return sorted(seen.values(), key=lambda m: not os.path.basename(m.path).startswith("lib"))


def find_python(pid: int) -> PythonProcess | None:
    """The CPython interpreter of ``pid``; None when the process has none (or is gone)."""
    for mapping in _candidates(pid):
        info = elf_info(f"/proc/{pid}/root{mapping.path}")
        if info is None:
            continue
        bias = load_bias(info, mapping)
        if bias is None:
            continue
        return _process(pid, mapping.path, info, bias)
    return None


def _version(info: ElfInfo, path: str) -> tuple[int, int] | None:
    """Py_Version where exported (3.11+), else the file name (libpython3.10.so)."""
    if info.hexversion:
        return info.hexversion >> 24, (info.hexversion >> 16) & 0xFF
    match = _CANDIDATE.match(os.path.basename(path))
    if match and match.group(3):
        return int(match.group(2)), int(match.group(3))
    if info.debug_offsets[:8] == O.DEBUG_COOKIE:
        hexversion = struct.unpack_from("<Q", info.debug_offsets, 8)[0]
        return hexversion >> 24, (hexversion >> 16) & 0xFF
    return None


def _layout(info: ElfInfo, version: tuple[int, int]) -> O.PythonLayout | str:
    """_Py_DebugOffsets for 3.13+, the table below that."""
    if version >= (3, 13):
        return O.from_debug_offsets(info.debug_offsets)
    return O.table_layout(version)


def _process(pid: int, path: str, info: ElfInfo, bias: int) -> PythonProcess:
    version = _version(info, path) or (0, 0)
    layout = _layout(info, version) if version != (0, 0) else "CPython: version unknown, native stacks only"
    ranges = [
        (bias + info.symbols[name][0], bias + info.symbols[name][0] + max(info.symbols[name][1], 1))
        for name in (_EVAL, _EVAL + ".cold") if name in info.symbols
    ]
    code_type = info.symbols.get("PyCode_Type")
    return PythonProcess(
        pid=pid, path=path, version=version,
        runtime_addr=bias + info.symbols["_PyRuntime"][0],
        code_type_addr=bias + code_type[0] if code_type else 0,
        layout=layout if isinstance(layout, O.PythonLayout) else None,
        reason="" if isinstance(layout, O.PythonLayout) else layout,
        eval_ranges=ranges, bias=bias,
    )


def describe(pid: int) -> str:
    """One line for ``otelbpf doctor``."""
    proc = find_python(pid)
    if proc is None:
        return "not a CPython process"
    if proc.layout is None:
        return proc.reason
    return f"CPython {proc.version[0]}.{proc.version[1]} (offsets known)"
