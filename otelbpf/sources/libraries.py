"""Finding the libraries a traced process maps: shared by the TLS probes
(otelbpf/sources/tls.py) and the GPU probes (otelbpf/sources/gpu.py).

Both want the same thing: among a process's executable file mappings, the
files that export given functions, wherever they are and whatever they are
called (a wheel's bundled copy, a framework's private copy, a library
dlopen()ed late). Parsing every mapped ELF's ``.dynsym`` would be slow (torch
maps hundreds of files, some over a gigabyte), so a file is a candidate when
its name matches the library's usual name or when its bytes contain a
``hint`` (an exported name: ``SSL_write``, ``cudaMalloc``); only candidates
are parsed (:func:`otelbpf.sources.uprobes.resolve_symbols`). Both answers
are cached per file (device, inode, mtime): a file shared by a thousand
processes is searched once.

When to look again: :class:`MapsWatch` tells whether a process's executable
mappings changed since the last look (one read of /proc/PID/maps), which the
callers do when a process is first seen, when it opens a connection (at most
once a second) and every ``rescan_interval_s`` (5 s).
"""

from __future__ import annotations

import os
import re

from otelbpf.host.procfs import Mapping, executable_mappings

#: Files larger than this are not searched for a hint (only their name can make them candidates).
MAX_SEARCHED_BYTES = 256 * 1024 * 1024

#: (st_dev, st_ino, mtime, hint) -> whether the file contains the hint: each file is searched once per hint.
_searched: dict[tuple[int, int, int, bytes], bool] = {}


def file_contains(path: str, hint: bytes, max_bytes: int = MAX_SEARCHED_BYTES) -> bool:
    """Whether ``path`` contains ``hint`` (False for unreadable, empty or larger files). Cached per file."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, hint)
            if key in _searched:
                return _searched[key]
            found = False
            if 0 < st.st_size <= max_bytes:
                found = _stream_contains(f, hint)
    except (OSError, ValueError):
        return False
    if len(_searched) > 4096:
        _searched.clear()
    _searched[key] = found
    return found


#: Bytes read at a time when searching a file.
_SEARCH_CHUNK = 1 << 20


def _stream_contains(f, hint: bytes) -> bool:
    """Whether the rest of ``f`` contains ``hint``, read a MiB at a time. Not an mmap of
    the whole file: a search of every library a process maps (the agent's own 100 MB
    libLLVM included) would leave the pages it touched in the agent's peak RSS."""
    keep = len(hint) - 1
    tail = b""
    while True:
        chunk = f.read(_SEARCH_CHUNK)
        if not chunk:
            return False
        window = tail + chunk if tail else chunk  # a hint may straddle two reads
        if window.find(hint) >= 0:
            return True
        tail = chunk[-keep:] if keep > 0 else b""


def is_candidate(path: str, mapped: str, name: re.Pattern | None, hint: bytes = b"", max_bytes: int = MAX_SEARCHED_BYTES) -> bool:
    """Worth parsing: ``mapped`` (the path as the process maps it) matches
    ``name``, or the file (``path``, reachable from the agent) contains ``hint``."""
    if name is not None and name.search(mapped):
        return True
    return bool(hint) and file_contains(path, hint, max_bytes)


class MapsWatch:
    """Per process, the executable mappings seen at the last look, so a
    re-scan does nothing more than one /proc read when nothing was loaded."""

    def __init__(self) -> None:
        self._seen: dict[int, frozenset[tuple[int, str]]] = {}

    def changed(self, pid: int) -> list[Mapping] | None:
        """The process's executable mappings if they changed since the last call (or on the first), else None."""
        mappings = executable_mappings(pid)
        seen = frozenset((m.start, m.path) for m in mappings)
        if self._seen.get(pid) == seen:
            return None
        self._seen[pid] = seen
        return mappings

    def mark(self, pid: int, mappings: list[Mapping]) -> None:
        """Record ``mappings`` as seen (a caller that read them itself)."""
        self._seen[pid] = frozenset((m.start, m.path) for m in mappings)

    def seen(self, pid: int) -> bool:
        return pid in self._seen

    def pids(self) -> list[int]:
        return list(self._seen)

    def forget(self, pid: int) -> None:
        self._seen.pop(pid, None)

    def reset(self) -> None:
        """Look at every process afresh next time (a new probe spec was added)."""
        self._seen.clear()
