"""Generic uprobe attachment: probe specs resolved per process through
/proc/PID/maps and pyelftools, attached with BCC by address.

A :class:`ProbeSpec` names a library (a regex searched in the path of each
executable file mapping), the symbols to probe and the BPF programs to run at
entry and/or return. :class:`UprobeAttacher` finds, for one process, every
mapped file matching a spec, resolves the symbols in its ``.dynsym``
(defined functions only; ``name@@VERSION`` / ``name@VERSION`` understood;
GNU indirect functions are skipped: their address is the resolver's, which
runs once at load time, not the function's),
attaches once per address (several names may alias one function), and keeps
what it did so it can detach when the process goes. Libraries loaded later
(dlopen) are found by :meth:`UprobeAttacher.rescan`, which re-reads the maps
file and does nothing more when the set of executable mappings is unchanged.

Nothing here needs root except the attaching itself; the symbol resolution is
unit-tested on the host's own ELF files (tests/test_uprobes.py).
"""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from otelbpf.host.procfs import Mapping, executable_mappings
from otelbpf.sources.libraries import MapsWatch, is_candidate

log = logging.getLogger("otelbpf.uprobes")

#: Threads detaching uprobes at once when the agent stops (UprobeAttacher.close).
DETACH_THREADS = 32


@dataclass(frozen=True)
class ProbeSpec:
    """What to probe in which library.

    ``library`` is a regex searched in the mapped file's path (e.g.
    ``r"/libssl\\.so"``); ``symbols`` are names as exported, optionally with a
    version (``"cudaMalloc@@libcudart.so.12"``); a bare name matches the
    unversioned or default (``@@``) version. ``entry``/``ret`` are BPF
    program names (either may be None). ``hint`` (optional): a file whose
    name does not match is still a candidate when it contains these bytes (an
    exported name), so a renamed or bundled copy is probed too
    (otelbpf.sources.libraries).
    """

    name: str
    library: str
    symbols: tuple[str, ...]
    entry: str | None = None
    ret: str | None = None
    hint: bytes = b""

    def matches(self, mapped: str, path: str | None = None) -> bool:
        """``mapped`` (as the process maps it) is worth parsing; ``path``: where the agent reads it."""
        return is_candidate(path or mapped, mapped, re.compile(self.library), self.hint)


@dataclass(frozen=True)
class Symbol:
    """One probe-able address in an ELF file: its virtual address (st_value),
    file offset, and every requested name that resolves to it."""

    vaddr: int
    file_offset: int
    names: tuple[str, ...]


@dataclass
class Attachment:
    pid: int
    spec: ProbeSpec
    path: str  # as attached (through /proc/PID/root)
    mapped: str  # as the process maps it
    symbol: Symbol
    #: where the function is in the process (for programs that key on the IP); 0 if not mapped
    runtime_addr: int = 0
    programs: list[tuple[str, str]] = field(default_factory=list)  # ("entry"|"ret", fn_name)


def _split_version(name: str) -> tuple[str, str | None, bool]:
    """'f@@V' -> ('f', 'V', True); 'f@V' -> ('f', 'V', False); 'f' -> ('f', None, True)."""
    if "@@" in name:
        base, version = name.split("@@", 1)
        return base, version, True
    if "@" in name:
        base, version = name.split("@", 1)
        return base, version, False
    return name, None, True


def _symbol_versions(elf: ELFFile) -> Callable[[int], tuple[str | None, bool]]:
    """index in .dynsym -> (version name or None, is default)."""
    versym = elf.get_section_by_name(".gnu.version")
    verdef = elf.get_section_by_name(".gnu.version_d")
    names: dict[int, str] = {}
    if verdef is not None:
        for entry, auxiliaries in verdef.iter_versions():
            first = next(iter(auxiliaries), None)
            if first is not None:
                names[entry["vd_ndx"]] = first.name

    def lookup(index: int) -> tuple[str | None, bool]:
        if versym is None:
            return None, True
        ndx = versym.get_symbol(index)["ndx"]
        if isinstance(ndx, str):  # VER_NDX_LOCAL / VER_NDX_GLOBAL
            return None, True
        hidden = bool(ndx & 0x8000)
        return names.get(ndx & 0x7FFF), not hidden

    return lookup


def _vaddr_to_offset(elf: ELFFile, vaddr: int) -> int | None:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
            return vaddr - seg["p_vaddr"] + seg["p_offset"]
    return None


#: (path identity, wanted names) -> resolved symbols; files rarely change, processes share them.
_cache: dict[tuple, list[Symbol]] = {}


def resolve_symbols(path: str, wanted: Iterable[str]) -> list[Symbol]:
    """The defined functions among ``wanted`` in ``path``'s .dynsym, one
    :class:`Symbol` per address (aliases merged), sorted by address.
    Unreadable or non-ELF files give []. Cached by (dev, inode, mtime)."""
    wanted = tuple(wanted)
    try:
        st = os.stat(path)
    except OSError:
        return []
    key = (st.st_dev, st.st_ino, int(st.st_mtime_ns), wanted)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    requests = [_split_version(name) for name in wanted]
    by_base: dict[str, list[tuple[str, str | None, bool]]] = {}
    for original, request in zip(wanted, requests):
        by_base.setdefault(request[0], []).append((original, request[1], request[2]))
    found: dict[int, list[str]] = {}
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynsym = elf.get_section_by_name(".dynsym")
            if dynsym is not None:
                version_of = _symbol_versions(elf)
                for index, sym in enumerate(dynsym.iter_symbols()):
                    asks = by_base.get(sym.name)
                    if not asks or sym["st_shndx"] == "SHN_UNDEF" or sym["st_info"]["type"] != "STT_FUNC":
                        continue
                    if not sym["st_value"]:
                        continue
                    version, default = version_of(index)
                    for original, want_version, want_default in asks:
                        if want_version is None:
                            ok = default  # bare name: unversioned or the default version
                        else:
                            ok = version == want_version and default == want_default
                        if ok and original not in found.setdefault(sym["st_value"], []):
                            found[sym["st_value"]].append(original)
                offsets = {vaddr: _vaddr_to_offset(elf, vaddr) for vaddr in found}
    except (OSError, ELFError, ValueError) as exc:
        log.debug("cannot read symbols of %s: %s", path, exc)
        found, offsets = {}, {}
    result = [
        Symbol(vaddr, offsets[vaddr], tuple(names))
        for vaddr, names in sorted(found.items())
        if names and offsets.get(vaddr) is not None
    ]
    if len(_cache) > 512:
        _cache.clear()
    _cache[key] = result
    return result


def runtime_address(mappings: Iterable[Mapping], mapped_path: str, file_offset: int) -> int:
    """Where the byte at ``file_offset`` of ``mapped_path`` is in the process (0: not mapped executable)."""
    for m in mappings:
        if m.path == mapped_path and m.offset <= file_offset < m.offset + (m.end - m.start):
            return m.start + file_offset - m.offset
    return 0


class UprobeAttacher:
    """Attaches :class:`ProbeSpec` programs to processes with a BCC ``BPF`` object.

    ``on_attach(attachment)`` runs after a symbol is attached (e.g. to
    register its runtime address in a map), ``on_detach(attachment)`` before
    it is detached. Return probes are attached before entry probes, so a call
    in flight while attaching is never seen entering without returning.
    """

    def __init__(
        self,
        bpf,
        specs: Iterable[ProbeSpec] = (),
        on_attach: Callable[[Attachment], None] | None = None,
        on_detach: Callable[[Attachment], None] | None = None,
    ) -> None:
        self.bpf = bpf
        self.specs: list[ProbeSpec] = list(specs)
        self.on_attach = on_attach
        self.on_detach = on_detach
        #: pid -> attachments
        self.attached: dict[int, list[Attachment]] = {}
        #: the executable mappings of each process at its last scan (cheap change test)
        self._maps = MapsWatch()

    def add_spec(self, spec: ProbeSpec) -> None:
        self.specs.append(spec)
        self._maps.reset()  # the next rescan looks at every process again

    def scan(self, pid: int) -> list[Attachment]:
        """Attach every spec to what ``pid`` maps now that is not attached yet; returns the new attachments."""
        mappings = executable_mappings(pid)
        self._maps.mark(pid, mappings)
        return self._scan_mappings(pid, mappings)

    def _scan_mappings(self, pid: int, mappings: list[Mapping]) -> list[Attachment]:
        done = {(a.spec, a.mapped, a.symbol.vaddr) for a in self.attached.get(pid, ())}
        new: list[Attachment] = []
        files = list(dict.fromkeys(m.path for m in mappings))
        for spec in self.specs:
            for mapped in files:
                path = f"/proc/{pid}/root{mapped}"
                if not spec.matches(mapped, path):
                    continue
                for symbol in resolve_symbols(path, spec.symbols):
                    if (spec, mapped, symbol.vaddr) in done:
                        continue
                    attachment = Attachment(
                        pid, spec, path, mapped, symbol, runtime_address(mappings, mapped, symbol.file_offset)
                    )
                    if self._attach(attachment):
                        new.append(attachment)
                        done.add((spec, mapped, symbol.vaddr))
        if new:
            self.attached.setdefault(pid, []).extend(new)
        return new

    def rescan(self, pid: int) -> list[Attachment]:
        """Like :meth:`scan`, but only if the process's executable mappings changed since the last look."""
        mappings = self._maps.changed(pid)
        if mappings is None:
            return []
        return self._scan_mappings(pid, mappings)

    def pids(self) -> list[int]:
        return self._maps.pids()

    def forget(self, pid: int) -> None:
        self._maps.forget(pid)
        for attachment in self.attached.pop(pid, []):
            self._detach(attachment)

    def close(self) -> None:
        """Detach everything (the agent stops). Each uprobe's removal waits for an RCU grace
        period in the kernel (~0.3 s each on a busy 2-vCPU VM: a GPU process has ~60 probes);
        removals from several threads share grace periods: ~3x sooner (DETACH_THREADS)."""
        attachments = [a for pid in list(self.attached) for a in self.attached.pop(pid)]
        self._maps.reset()
        if len(attachments) < 2:
            for attachment in attachments:
                self._detach(attachment)
            return
        with ThreadPoolExecutor(min(DETACH_THREADS, len(attachments)), thread_name_prefix="otelbpf-detach") as pool:
            list(pool.map(self._detach, attachments))

    # -- BCC -----------------------------------------------------------------

    def _attach(self, a: Attachment) -> bool:
        try:
            if a.spec.ret:
                self.bpf.attach_uretprobe(name=a.path, addr=a.symbol.vaddr, fn_name=a.spec.ret, pid=a.pid)
                a.programs.append(("ret", a.spec.ret))
            if self.on_attach is not None:
                self.on_attach(a)
            if a.spec.entry:
                self.bpf.attach_uprobe(name=a.path, addr=a.symbol.vaddr, fn_name=a.spec.entry, pid=a.pid)
                a.programs.append(("entry", a.spec.entry))
        except Exception as exc:  # noqa: BLE001 - the process may be gone; BCC raises plain Exception
            log.debug("%s: %s in pid %d not attached: %s", a.spec.name, a.symbol.names, a.pid, exc)
            self._detach(a)
            return False
        log.debug("%s: attached %s at %#x in pid %d (%s)", a.spec.name, "/".join(a.symbol.names), a.symbol.vaddr, a.pid, a.mapped)
        return True

    def _detach(self, a: Attachment) -> None:
        if self.on_detach is not None:
            try:
                self.on_detach(a)
            except Exception:  # noqa: BLE001
                pass
        for kind, _fn in a.programs:
            detach = self.bpf.detach_uretprobe if kind == "ret" else self.bpf.detach_uprobe
            try:
                detach(name=a.path, addr=a.symbol.vaddr, pid=a.pid)
            except Exception:  # noqa: BLE001 - already gone with the process
                pass
        a.programs.clear()
