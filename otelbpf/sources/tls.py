"""TLS plaintext probes: find OpenSSL in traced processes, attach bpf/tls.c.

Which files: every executable mapping of a traced process whose name looks
like libssl (``libssl.so.3``, ``libssl.so.1.1``...) or that contains the
string ``SSL_write`` (a program or library with OpenSSL built in and its
symbols exported), confirmed by its ``.dynsym`` exporting ``SSL_read`` and
``SSL_write`` (:func:`otelbpf.sources.uprobes.resolve_symbols`).

How often: with ``--comm`` or ``--all`` (processes started later are traced
by name), the probes are attached **once per file** (device + inode), for
every process (pid -1); the kernel side filters the traced ones first. So
the host's own libssl (from ``ldconfig -p``), attached at start, covers every
process started later from its first call, even one that lives for a few
milliseconds (curl). With ``--pid`` only, once per (file, process), so that
untraced processes take no uprobe trap (see :class:`TlsProbes`). Other copies (a wheel's bundled libssl, a dlopen()ed
one) are found when the agent first sees a traced process (its exec, or its
first connection), when a traced process opens a connection (its maps are
read again, at most once a second: ``EbpfSource._look_for_libraries_again``) and by the
periodic re-scan (``CaptureConfig.rescan_interval_s``, 5 s); a re-read does
nothing more when the executable mappings did not change.

Not covered: TLS libraries linked statically without exported symbols
(BoringSSL inside grpcio, Go's crypto/tls, rustls, Java's JSSE).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass, field

from otelbpf.sources.libraries import MAX_SEARCHED_BYTES, MapsWatch, is_candidate
from otelbpf.sources.uprobes import resolve_symbols

log = logging.getLogger("otelbpf.tls")

#: (symbol, entry program, return program) of bpf/tls.c
TLS_FUNCTIONS = (
    ("SSL_read", "tls_read_enter", "tls_read_return"),
    ("SSL_write", "tls_write_enter", "tls_write_return"),
    ("SSL_read_ex", "tls_read_ex_enter", "tls_read_return"),
    ("SSL_write_ex", "tls_write_ex_enter", "tls_write_return"),
    ("SSL_free", "tls_free_enter", None),
)
REQUIRED = ("SSL_read", "SSL_write")
LIBSSL_NAME = re.compile(r"/libssl[^/]*\.so")
#: A file without libssl's name is searched for this string before its ELF is parsed
#: (files over otelbpf.sources.libraries.MAX_SEARCHED_BYTES, CUDA and torch libraries, are not).
EXPORT_HINT = b"SSL_write"
#: What the probes cannot see yet (doctor, README).
NOT_COVERED = (
    "statically linked TLS without exported symbols: BoringSSL inside grpcio, Go crypto/tls, rustls, Java JSSE"
)


@dataclass
class TlsLibrary:
    """One probed file (all processes mapping it are covered)."""

    path: str
    flavour: str
    functions: tuple[str, ...]


@dataclass
class TlsProbes:
    """Attaches the TLS programs of a BCC ``BPF`` object to OpenSSL files.

    ``host_wide`` (``run --comm`` / ``--all``: processes started later must be
    covered from their first call): once per file for every process (pid -1),
    the host's libssl at start. Otherwise (``--pid`` only) once per (file,
    process): processes the agent does not trace take no uprobe trap
    (bench/tls_probe_tax.py measured a host-wide probe costing an untraced
    TLS-heavy process ~0.4x of its round trips on a 2-vCPU VM), and a process
    forked later is covered from the agent's first sight of it.
    """

    bpf: object
    host_wide: bool = True
    #: (st_dev, st_ino, pid or -1) -> what was attached there (None: looked at, nothing to probe)
    files: dict[tuple[int, int, int], TlsLibrary | None] = field(default_factory=dict)
    #: the executable mappings of each process at its last scan
    _maps: MapsWatch = field(default_factory=MapsWatch)
    #: pid -> library paths reported for it (the start-up log says it once per process and library)
    reported: dict[int, set[str]] = field(default_factory=dict)
    #: pid -> (path, address, kind) attached for that process only (detached when it goes)
    _per_process: dict[int, list[tuple[str, int, str]]] = field(default_factory=dict)

    def attach_system(self) -> list[TlsLibrary]:
        """Probe the host's own libssl files (ldconfig) for every process, so later ones are covered at once."""
        found = []
        if not self.host_wide:
            return found
        for path in system_libssl_paths():
            library = self._probe_file(path, path, -1)
            if library is not None:
                found.append(library)
                log.info("TLS: probing %s (%s) for every traced process", path, library.flavour)
        return found

    def scan(self, pid: int) -> list[TlsLibrary]:
        """Probe the OpenSSL files ``pid`` maps (if not done already); log once per process what covers it."""
        mappings = self._maps.changed(pid)
        if mappings is None:
            return []
        paths = frozenset(m.path for m in mappings)
        covering = []
        for mapped in sorted(paths):
            path = f"/proc/{pid}/root{mapped}"
            if not candidate(path, mapped):
                continue
            library = self._probe_file(path, mapped, -1 if self.host_wide else pid)
            if library is not None:
                covering.append(library)
        told = self.reported.setdefault(pid, set())
        for library in covering:
            if library.path not in told:
                told.add(library.path)
                log.info("TLS: pid %d: plaintext of %s (%s: %s)", pid, library.path, library.flavour, ", ".join(library.functions))
        return covering

    def forget(self, pid: int) -> None:
        """The process is gone: detach what was attached for it alone."""
        self._maps.forget(pid)
        self.reported.pop(pid, None)
        for path, addr, kind in self._per_process.pop(pid, []):
            detach = self.bpf.detach_uretprobe if kind == "ret" else self.bpf.detach_uprobe
            try:
                detach(name=path, addr=addr, pid=pid)
            except Exception:  # noqa: BLE001 - gone with the process
                pass
        for identity in [key for key in self.files if key[2] == pid]:
            del self.files[identity]

    def _probe_file(self, path: str, mapped: str, pid: int) -> TlsLibrary | None:
        """Attach to ``path`` for ``pid`` (-1: every process), once per (inode, pid)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        identity = (st.st_dev, st.st_ino, pid)
        if identity in self.files:
            return self.files[identity]
        self.files[identity] = None
        symbols = resolve_symbols(path, [name for name, _e, _r in TLS_FUNCTIONS])
        by_name = {name: symbol for symbol in symbols for name in symbol.names}
        if not all(name in by_name for name in REQUIRED):
            return None
        attached = []
        for name, entry, ret in TLS_FUNCTIONS:
            symbol = by_name.get(name)
            if symbol is not None and self._attach(path, symbol.vaddr, entry, ret, pid, mapped, name):
                attached.append(name)
        if not all(name in attached for name in REQUIRED):
            return None
        library = TlsLibrary(mapped, flavour(mapped, by_name), tuple(attached))
        self.files[identity] = library
        return library

    def _attach(self, path: str, addr: int, entry: str, ret: str | None, pid: int, mapped: str, name: str) -> bool:
        done = []
        try:
            if ret:  # the return first: a call in flight is never seen entering only
                self.bpf.attach_uretprobe(name=path, addr=addr, fn_name=ret, pid=pid)
                done.append((path, addr, "ret"))
            self.bpf.attach_uprobe(name=path, addr=addr, fn_name=entry, pid=pid)
            done.append((path, addr, "entry"))
        except Exception as exc:  # noqa: BLE001 - BCC raises plain Exception
            log.warning("TLS: cannot probe %s in %s: %s", name, mapped, exc)
            for _path, _addr, kind in done:
                detach = self.bpf.detach_uretprobe if kind == "ret" else self.bpf.detach_uprobe
                try:
                    detach(name=path, addr=addr, pid=pid)
                except Exception:  # noqa: BLE001
                    pass
            return False
        if pid > 0:
            self._per_process.setdefault(pid, []).extend(done)
        return True


def candidate(path: str, mapped: str) -> bool:
    """Worth parsing as a TLS library: named libssl, or containing ``SSL_write`` (not too large)."""
    return is_candidate(path, mapped, LIBSSL_NAME, EXPORT_HINT, MAX_SEARCHED_BYTES)


def flavour(path: str, by_name: dict) -> str:
    """A human name for the library (the log and doctor)."""
    name = os.path.basename(path)
    if "libssl.so.3" in name:
        return "OpenSSL 3"
    if "libssl.so.1.1" in name:
        return "OpenSSL 1.1"
    if name.startswith("libssl"):
        return "OpenSSL-compatible libssl"
    return "OpenSSL exported by " + name + ("" if "SSL_read_ex" in by_name else " (no _ex functions)")


def system_libssl_paths() -> list[str]:
    """The host's libssl files, from the dynamic linker's cache (ldconfig -p), real paths, deduplicated."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    paths = []
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if target and name.startswith("libssl.so"):
            real = os.path.realpath(target)
            if real not in paths and os.path.exists(real):
                paths.append(real)
    return paths
