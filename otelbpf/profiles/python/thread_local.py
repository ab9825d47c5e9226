"""Where a thread's ``PyThreadState`` is, read from the thread itself: its thread-local storage.

BPF knows the sampled thread's pointer to its TLS (``task->thread.fsbase`` on x86-64, read
at an offset taken from the kernel's BTF). From there one or two reads give the thread's
state, so a thread's very first sample (and its first GPU call) carries its Python frames:
no thread list to walk, no tid -> state map to wait for. This module finds, per process,
which word of the TLS holds the state, and proves it on the process's own threads before
the kernel is told.

Which word, per version (the OpenTelemetry eBPF profiler reads the same ones):

- 3.10-3.13: the ``PyGILState`` key. ``_PyRuntime`` holds a ``Py_tss_t`` (3.10/3.11 in
  ``gilstate.autoTSSkey``, 3.12/3.13 in ``autoTSSkey``: :data:`KEY_OFFSETS`, checked against
  DWARF by tests/test_profiles_thread_local.py) whose pthread key names a slot of glibc's per-thread
  ``specific_1stblock``: the state is at ``fsbase + 0x310 + 16 * key + 8`` on glibc 2.26-2.38
  x86-64 (the constant is read from the process's own ``__pthread_getspecific`` where it
  decodes). This is the state bound to the thread for its life: unlike the "current" state
  (``_Py_tss_tstate``), it stays set while the thread waits without the GIL (in a CUDA
  synchronisation, an NCCL call, I/O), where GPU stacks are taken.
- 3.14: the key is gone; the bound state is the thread-local variable ``_Py_tss_gilstate``.
  In an interpreter linked into the executable it lies at a fixed offset below ``fsbase``
  (static TLS: the variable's offset in the TLS segment minus the segment's aligned size);
  in ``libpython3.14.so`` it is found through glibc's DTV: ``dtv = *(fsbase + 8)``, the
  module's block ``*(dtv + 16 * module)``, the variable at its offset in that block; the
  module id is the value the loader wrote into the library's ``R_X86_64_DTPMOD64`` GOT slot.
  The variable's offset comes from ``.symtab`` or, in a stripped build, from the TLS access
  in ``PyGILState_GetThisThreadState`` (its general-dynamic ``data16 lea GOT(%rip)`` or its
  static ``mov %fs:OFF``).

Nothing is trusted on faith: each candidate must give, for the process's listed threads (their
``pthread_t`` is their ``fsbase`` on glibc x86-64), the very ``PyThreadState`` the interpreter
lists for them. A process where no candidate proves out (musl, an unknown glibc, a thread list
not yet built) keeps the tid -> state map (otelbpf/profiles/sampler.py), as before.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from otelbpf.host.procfs import executable_mappings
from otelbpf.profiles.python.interpreter import ProcMem, PythonProcess

#: struct py_offsets' tstate_mode (bpf/profile.c)
MODE_NONE = 0  # the tid -> PyThreadState map only
MODE_FS = 1  # *(fsbase + offset)
MODE_DTV = 2  # *(*(*(fsbase + DTV_POINTER) + module * DTV_ENTRY) + offset)

#: Where glibc x86-64 keeps a thread's DTV pointer (tcbhead_t.dtv) and the size of a DTV entry.
DTV_POINTER = 8
DTV_ENTRY = 16
#: What an unallocated DTV slot holds (TLS_DTV_UNALLOCATED).
DTV_UNALLOCATED = (1 << 64) - 1

#: offsetof(_PyRuntimeState, [gilstate.]autoTSSkey) per version (x86-64 builds; the pyenv
#: builds' DWARF and Debian's python3.11 agree). A Py_tss_t is {int _is_initialized; pthread_key_t _key}.
KEY_OFFSETS = {(3, 10): 0x248, (3, 11): 0x250, (3, 12): 0x608, (3, 13): 0x870}
#: How far into _PyRuntime a key is looked for when the table's offset does not prove out
#: (another patch release, a distribution's build).
KEY_SCAN_BYTES = 4096
#: glibc's specific_1stblock holds keys below this; larger keys take a second-level array
#: the BPF side does not follow.
FIRST_BLOCK_KEYS = 32
#: offsetof(struct pthread, specific_1stblock[0].data) on glibc 2.26-2.38 x86-64 (0x310 + 8),
#: used when the process's __pthread_getspecific does not decode.
GLIBC_SPECIFIC_DATA = 0x318
#: __pthread_getspecific's fast path: add $IMM,%rax; shl $4,%rax; add %fs:0x10,%rax; mov DISP(%rax),%rdx
#: (glibc 2.26-2.38 x86-64): the key's data word is at THREAD_SELF + IMM * 16 + DISP.
_GETSPECIFIC = re.compile(rb"\x48\x83\xc0(.)\x48\xc1\xe0\x04\x64\x48\x03\x04\x25\x10\x00\x00\x00\x48\x8b\x50(.)", re.S)
#: The thread-local the bound state lives in from 3.14 on.
GILSTATE_TLS = "_Py_tss_gilstate"
#: The function that reads it (exported, so present in stripped builds).
GILSTATE_READER = "PyGILState_GetThisThreadState"
#: A general-dynamic TLS access: data16 lea GOT(%rip),%rdi; data16 data16 rex.W call __tls_get_addr.
_GENERAL_DYNAMIC = re.compile(rb"\x66\x48\x8d\x3d(.{4})\x66\x66\x48\xe8", re.S)
#: A local-exec access: mov %fs:DISP32,%reg (64 48 8b, modrm 04-3c with SIB 25).
_LOCAL_EXEC = re.compile(rb"\x64\x48\x8b[\x04\x0c\x14\x1c\x24\x2c\x34\x3c]\x25(.{4})", re.S)
#: Bytes of a function read to decode its TLS access.
_DECODE_BYTES = 96


@dataclass(frozen=True)
class TstateSource:
    """Which word of a thread's TLS holds its PyThreadState, as the BPF side reads it."""

    mode: int
    #: MODE_FS: from fsbase (negative for static TLS); MODE_DTV: within the module's TLS block
    offset: int
    #: MODE_DTV: the TLS module id of the interpreter's file
    module: int = 0
    #: how it was found, for the log and ``otelbpf doctor``
    how: str = ""

    def word(self, thread_pointer: int, mem: ProcMem) -> int | None:
        """The address of the state pointer for the thread whose TLS starts at
        ``thread_pointer``, read as the BPF side reads it (None where a read fails)."""
        if self.mode == MODE_FS:
            return thread_pointer + self.offset
        if self.mode == MODE_DTV:
            dtv = mem.u64(thread_pointer + DTV_POINTER)
            block = mem.u64(dtv + self.module * DTV_ENTRY) if dtv else None
            if not block or block == DTV_UNALLOCATED:
                return None
            return block + self.offset
        return None

    def read(self, thread_pointer: int, mem: ProcMem) -> int | None:
        """The PyThreadState this source gives for one thread."""
        word = self.word(thread_pointer, mem)
        return mem.u64(word) if word is not None else None


def find_tstate_source(proc: PythonProcess, threads: list[tuple[int, int]], mem: ProcMem, variable: str | None = None) -> TstateSource | str:
    """The TLS word holding each thread's PyThreadState in ``proc``, proven on ``threads``
    ((PyThreadState*, pthread_t) pairs: otelbpf.profiles.python.threads.thread_pointers),
    or why none (a string). ``variable``: read that thread-local instead of the version's
    own (tests use ``_Py_tss_tstate``, the current state of 3.12+, to exercise the DTV path)."""
    if proc.layout is None:
        return "no interpreter layout"
    if not threads:
        return "no thread listed yet"
    if variable is None and proc.version < (3, 14):
        return _from_pthread_key(proc, threads, mem)
    return _from_thread_local(proc, threads, mem, variable or GILSTATE_TLS)


def proves_out(source: TstateSource, threads: list[tuple[int, int]], mem: ProcMem) -> bool:
    """Every listed thread reads back its own state (or nothing yet: a state not bound to
    its thread), and at least one reads it: a wrong word would give another pointer."""
    matched = 0
    for tstate, thread_pointer in threads:
        found = source.read(thread_pointer, mem)
        if found == tstate:
            matched += 1
        elif found:
            return False
    return matched > 0


# -- 3.10-3.13: the PyGILState pthread key -------------------------------------------------------


def _from_pthread_key(proc: PythonProcess, threads: list[tuple[int, int]], mem: ProcMem) -> TstateSource | str:
    runtime = mem.read(proc.runtime_addr, KEY_SCAN_BYTES)
    if runtime is None:
        return "_PyRuntime unreadable"
    known = KEY_OFFSETS.get(proc.version)
    candidates = ([known] if known is not None else []) + [o for o in range(0, KEY_SCAN_BYTES - 8, 8) if o != known]
    data_offsets = specific_data_offsets(proc.pid)
    for offset in candidates:
        initialized, key = struct.unpack_from("<iI", runtime, offset)
        if initialized != 1 or key >= FIRST_BLOCK_KEYS:
            continue
        for data in data_offsets:
            source = TstateSource(MODE_FS, data + 16 * key, how=f"pthread key {key} (_PyRuntime+{offset:#x}), glibc specific data at {data:#x}")
            if proves_out(source, threads, mem):
                return source
    return "no PyGILState key proved out on the process's threads"


def specific_data_offsets(pid: int) -> list[int]:
    """Where glibc keeps pthread key 0's data word, from the thread pointer: decoded from
    the process's own ``__pthread_getspecific`` when it has the known shape, then the
    2.26-2.38 constant."""
    out = []
    for mapping in executable_mappings(pid):
        if re.search(r"/libc(\.so\.6|-2\.\d+\.so)$", mapping.path):
            decoded = decode_getspecific(function_bytes(f"/proc/{pid}/root{mapping.path}", ("__pthread_getspecific", "pthread_getspecific")))
            if decoded is not None:
                out.append(decoded)
            break
    if GLIBC_SPECIFIC_DATA not in out:
        out.append(GLIBC_SPECIFIC_DATA)
    return out


def decode_getspecific(code: bytes | None) -> int | None:
    """Key 0's data word, from the thread pointer, as glibc's ``__pthread_getspecific`` reads
    it (its key < 32 fast path: ``(key + IMM) * 16 + THREAD_SELF``, then ``DISP(%rax)``)."""
    match = _GETSPECIFIC.search(code or b"")
    return match.group(1)[0] * 16 + match.group(2)[0] if match else None


# -- 3.14: the _Py_tss_gilstate thread-local ----------------------------------------------------


@dataclass(frozen=True)
class TlsFacts:
    """What the interpreter file says about its thread-local storage (cached per file)."""

    #: the file is a program (PT_INTERP): its TLS block is static, right below fsbase
    is_program: bool
    #: PT_TLS p_memsz and p_align (0: the file has no TLS)
    tls_size: int
    tls_align: int
    #: STT_TLS symbols: name -> offset in the TLS segment
    variables: dict[str, int]
    #: R_X86_64_DTPMOD64 GOT slots (file addresses): the loader writes the module id there
    module_slots: tuple[int, ...]
    #: GOT pair address -> the DTPOFF64 word the link wrote there (the variable's offset)
    got_offsets: dict[int, int]
    #: exported function -> its first bytes (file address, bytes), for decoding a TLS access
    code: dict[str, tuple[int, bytes]]


def _from_thread_local(proc: PythonProcess, threads: list[tuple[int, int]], mem: ProcMem, variable: str) -> TstateSource | str:
    facts = tls_facts(f"/proc/{proc.pid}/root{proc.path}")
    if facts is None or not facts.tls_size:
        return f"{os.path.basename(proc.path)} has no thread-local storage"
    for source in _thread_local_candidates(proc, facts, mem, variable):
        if proves_out(source, threads, mem):
            return source
    return f"{variable}: no thread-local location proved out on the process's threads"


def _thread_local_candidates(proc: PythonProcess, facts: TlsFacts, mem: ProcMem, variable: str):
    """Where ``variable`` may be: its symbol, else what the reader function's TLS access says."""
    found: list[tuple[str, int, str]] = []
    if variable in facts.variables:
        found.append((SEGMENT, facts.variables[variable], f"{variable} (symbol)"))
    reader = facts.code.get(GILSTATE_READER) if variable == GILSTATE_TLS else None
    decoded = decode_tls_access(*reader, facts.got_offsets) if reader is not None else None
    if decoded is not None:
        found.append((*decoded, f"{variable} ({GILSTATE_READER}'s TLS access)"))
    for kind, offset, how in found:
        if kind == THREAD_POINTER:
            yield TstateSource(MODE_FS, offset, how=how + ", static TLS")
        elif facts.is_program:
            yield TstateSource(MODE_FS, static_tls_offset(facts, offset), how=how + ", static TLS")
        else:
            module = _module_id(proc, facts, mem)
            if module:
                yield TstateSource(MODE_DTV, offset, module, how=how + f", TLS module {module}")


#: What decode_tls_access's offset is relative to.
SEGMENT = "segment"  # the start of the file's TLS segment (its block)
THREAD_POINTER = "thread pointer"  # fsbase (static TLS: negative)


def static_tls_offset(facts: TlsFacts, segment_offset: int) -> int:
    """A program's thread-local at ``segment_offset`` in its TLS segment, from the thread
    pointer: x86-64 puts the program's block right below it, its size rounded up to its
    alignment (the offset the linker writes into local-exec accesses)."""
    return segment_offset - _align_up(facts.tls_size, facts.tls_align)


def decode_tls_access(address: int, code: bytes, got_offsets: dict[int, int]) -> tuple[str, int] | None:
    """What a function's first TLS access reads: (SEGMENT, offset) for a general-dynamic
    access (the DTPOFF word of the GOT pair its ``lea`` names), (THREAD_POINTER, offset) for
    a local-exec ``mov %fs:DISP``. ``code`` starts at file address ``address``. None when
    neither shape is there."""
    found = _GENERAL_DYNAMIC.search(code)
    if found is not None:
        rel = struct.unpack("<i", found.group(1))[0]
        pair = address + found.start(1) + 4 + rel  # RIP-relative: from the end of the lea
        offset = got_offsets.get(pair)
        return (SEGMENT, offset) if offset is not None else None
    found = _LOCAL_EXEC.search(code)
    if found is not None:
        return THREAD_POINTER, struct.unpack("<i", found.group(1))[0]
    return None


def _module_id(proc: PythonProcess, facts: TlsFacts, mem: ProcMem) -> int:
    """The TLS module id the loader gave the interpreter's file (any of its DTPMOD64 slots)."""
    for slot in facts.module_slots:
        value = mem.u64(proc.bias + slot)
        if value:
            return value
    return 0


def _align_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align if align > 1 else value


# -- ELF ------------------------------------------------------------------------------------------

_facts_cache: dict[tuple[int, int, int], TlsFacts | None] = {}


def tls_facts(path: str) -> TlsFacts | None:
    """Parse ``path``'s TLS facts once per file identity; None when it is not a usable ELF."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if key not in _facts_cache:
        try:
            with open(path, "rb") as f:
                _facts_cache[key] = _parse_tls(ELFFile(f), f)
        except (OSError, ELFError, ValueError, struct.error):
            _facts_cache[key] = None
        if len(_facts_cache) > 64:
            _facts_cache.pop(next(iter(_facts_cache)))
    return _facts_cache[key]


def _parse_tls(elf: ELFFile, f) -> TlsFacts:
    segments = list(elf.iter_segments())
    tls = next((s for s in segments if s["p_type"] == "PT_TLS"), None)
    loads = [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in segments if s["p_type"] == "PT_LOAD"]
    variables: dict[str, int] = {}
    exported: dict[str, int] = {}
    for name in (".dynsym", ".symtab"):
        table = elf.get_section_by_name(name)
        if not isinstance(table, SymbolTableSection):
            continue
        for sym in table.iter_symbols():
            kind = sym["st_info"]["type"]
            if kind == "STT_TLS" and sym["st_shndx"] != "SHN_UNDEF":
                variables.setdefault(sym.name, sym["st_value"])
            elif kind == "STT_FUNC" and sym.name == GILSTATE_READER and sym["st_value"]:
                exported[sym.name] = sym["st_value"]
    slots, got = [], {}
    for section in elf.iter_sections():
        if not isinstance(section, RelocationSection):
            continue
        for reloc in section.iter_relocations():
            if reloc["r_info_type"] == 16:  # R_X86_64_DTPMOD64
                slots.append(reloc["r_offset"])
                word = _read_vaddr(f, loads, reloc["r_offset"] + 8, 8)
                if word is not None:
                    got[reloc["r_offset"]] = struct.unpack("<Q", word)[0]
    code = {}
    for name, address in exported.items():
        data = _read_vaddr(f, loads, address, _DECODE_BYTES, partial=True)
        if data is not None:
            code[name] = (address, data)
    return TlsFacts(
        is_program=any(s["p_type"] == "PT_INTERP" for s in segments),
        tls_size=tls["p_memsz"] if tls is not None else 0,
        tls_align=tls["p_align"] if tls is not None else 0,
        variables=variables, module_slots=tuple(slots), got_offsets=got, code=code,
    )  # fmt: skip


def _read_vaddr(f, loads: list[tuple[int, int, int]], vaddr: int, size: int, partial: bool = False) -> bytes | None:
    """``size`` bytes at file address ``vaddr`` (``partial``: as many as its segment has)."""
    for offset, start, filesz in loads:
        if start <= vaddr < start + filesz and (partial or vaddr + size <= start + filesz):
            f.seek(offset + vaddr - start)
            data = f.read(min(size, start + filesz - vaddr))
            return data if partial or len(data) == size else None
    return None


_code_cache: dict[tuple, bytes | None] = {}


def function_bytes(path: str, names: tuple[str, ...], size: int = 64) -> bytes | None:
    """The first ``size`` bytes of the first of ``names`` ``path`` exports (cached per file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, names)
    if key in _code_cache:
        return _code_cache[key]
    data = None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            table = elf.get_section_by_name(".dynsym")
            loads = [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            if isinstance(table, SymbolTableSection):
                for name in names:
                    found = [s for s in table.get_symbol_by_name(name) or () if s["st_value"]]
                    if found:
                        data = _read_vaddr(f, loads, found[0]["st_value"], size, partial=True)
                        break
    except (OSError, ELFError, ValueError, struct.error):
        data = None
    if len(_code_cache) > 64:
        _code_cache.pop(next(iter(_code_cache)))
    _code_cache[key] = data
    return data

