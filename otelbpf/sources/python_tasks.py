"""Finding CPython's PyIter_Send in a traced process, for the asyncio task probes.

An asyncio event loop serves many requests on one thread, so the thread ID
cannot say which request a backend call belongs to. CPython's ``_asyncio``
runs each task step through the exported C function ``PyIter_Send`` (3.10+);
bpf/capture.c probes it to learn which coroutine is running when a syscall
happens. This module finds the file that exports it (the python executable,
or libpython when the interpreter is built shared) from /proc/PID/maps, and
checks the symbol with pyelftools. Results are cached per file.
"""

from __future__ import annotations

import os
import re

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

SYMBOL = "PyIter_Send"
_CANDIDATE = re.compile(r"/(python3?[\d.]*[a-z]*|libpython3[\d.]*[a-z]*\.so[\d.]*)$")


def _mapped_files(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    seen: list[str] = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/") and parts[5] not in seen:
            seen.append(parts[5])
    return seen


#: (st_dev, st_ino, mtime) of a file -> whether it defines SYMBOL.
_checked: dict[tuple[int, int, int], bool] = {}


def _exports_symbol(path: str, identity: tuple[int, int, int]) -> bool:
    """Does the ELF file define (not just import) SYMBOL in .dynsym? Cached by file identity."""
    known = _checked.get(identity)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            dynsym = ELFFile(f).get_section_by_name(".dynsym")
            symbols = dynsym.get_symbol_by_name(SYMBOL) if dynsym is not None else None
            found = any(sym["st_shndx"] != "SHN_UNDEF" for sym in symbols or [])
    except (OSError, ELFError):
        found = False
    if len(_checked) > 1024:
        _checked.clear()
    _checked[identity] = found
    return found


def python_with_tasks(pid: int) -> str | None:
    """Path (through /proc/PID/root, so containers work) of the file in which
    ``pid`` runs PyIter_Send, or None if it is not a CPython >= 3.10."""
    for mapped in _mapped_files(pid):
        if not _CANDIDATE.search(mapped):
            continue
        path = f"/proc/{pid}/root{mapped}"
        try:
            st = os.stat(path)
        except OSError:
            continue
        if _exports_symbol(path, (st.st_dev, st.st_ino, int(st.st_mtime))):
            return path
    return None
