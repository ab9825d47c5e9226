"""Memory the agent gives back once its BPF programs are compiled.

BCC compiles with clang and LLVM inside the agent. The compile leaves two things
behind that count in the agent's RSS for the rest of its life, though it never uses
them again (until another compile; bench/README.md, "Agent memory", has the figures):

* pages of libLLVM, libclang and libbcc's code and read-only data, read in from the
  files (~70 MB). They are clean file pages: dropping them from this process
  (``madvise(MADV_DONTNEED)``) only unmaps them here, and a later compile faults back
  in what it needs from the page cache. Only mappings that are not writable and hold
  no anonymous page are touched: a read-only segment that the loader relocated (RELRO)
  holds the relocations in anonymous copy-on-write pages, which dropping would lose.
* malloc's free memory at the top of its heaps, left by clang's allocations (~60 MB):
  ``malloc_trim(0)`` returns it to the kernel.

Both are Linux and glibc only; elsewhere they do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("otelbpf.sources.memory")

#: The compiler's libraries, by the names their mappings carry.
COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc.so")
_MADV_DONTNEED = 4

_libc = None


def _c_library():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name, use_errno=True) if name else False
        if _libc:
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc.madvise.restype = ctypes.c_int
    return _libc


def read_only_file_mappings(names: tuple[str, ...], smaps: str = "/proc/self/smaps") -> list[tuple[int, int, int]]:
    """(start, end, resident kB) of the mappings of files whose path contains one of
    ``names``, not writable, with resident pages and no anonymous page."""
    found: list[tuple[int, int, int]] = []
    current: list | None = None  # [start, end, rss_kb, anonymous_kb]
    try:
        with open(smaps) as f:
            for line in f:
                head = line.split(None, 5)
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    if current is not None and current[2] and not current[3]:
                        found.append((current[0], current[1], current[2]))
                    current = None
                    path = head[5].strip() if len(head) > 5 else ""
                    if "w" not in head[1] and any(name in path for name in names):
                        start, end = head[0].split("-")
                        current = [int(start, 16), int(end, 16), 0, 0]
                elif current is not None and head[0] in ("Rss:", "Anonymous:"):
                    current[2 if head[0] == "Rss:" else 3] = int(head[1])
    except OSError:
        return []
    if current is not None and current[2] and not current[3]:
        found.append((current[0], current[1], current[2]))
    return found


def release_compiler_memory() -> int:
    """Drop the compiler libraries' clean pages and trim malloc's heaps (module
    docstring); returns the kB of library pages dropped (0 where not supported)."""
    libc = _c_library()
    if not libc:
        return 0
    dropped = 0
    for start, end, rss_kb in read_only_file_mappings(COMPILER_LIBRARIES):
        if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
            dropped += rss_kb
    trim_heap()
    return dropped


def trim_heap() -> None:
    """Return malloc's free memory to the kernel (glibc's ``malloc_trim(0)``)."""
    libc = _c_library()
    trim = getattr(libc, "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)
