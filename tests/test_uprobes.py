"""The generic uprobe attacher (otelbpf/sources/uprobes.py).

Symbol resolution runs on the host's real ELF files (libc, the python
binary) and needs no root; the last tests attach real probes (marker ebpf).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from otelbpf.host.procfs import Mapping, executable_mappings, parse_maps
from otelbpf.sources import python_tasks
from otelbpf.sources.uprobes import ProbeSpec, UprobeAttacher, resolve_symbols, runtime_address


def _mapped(pattern: str) -> str:
    for m in executable_mappings(os.getpid()):
        if re.search(pattern, m.path):
            return m.path
    pytest.skip(f"nothing matching {pattern} mapped in this process")


@pytest.fixture(scope="module")
def libc() -> str:
    return _mapped(r"/libc\.so")


def test_aliases_at_one_address_resolve_to_one_symbol(libc):
    symbols = resolve_symbols(libc, ["malloc", "__libc_malloc", "getpid", "__getpid"])
    by_name = {name: s for s in symbols for name in s.names}
    assert by_name["malloc"] is by_name["__libc_malloc"]  # one address, attached once
    assert by_name["getpid"].vaddr == by_name["__getpid"].vaddr
    assert len({s.vaddr for s in symbols}) == len(symbols)
    # the file offset is what the bytes are at: the function's code starts there
    with open(libc, "rb") as f:
        f.seek(by_name["getpid"].file_offset)
        assert f.read(4) != b"\0\0\0\0"


def test_versioned_names(libc):
    default, old = None, None
    for s in resolve_symbols(libc, ["pthread_cond_wait", "pthread_cond_wait@@GLIBC_2.3.2", "pthread_cond_wait@GLIBC_2.2.5"]):
        if "pthread_cond_wait" in s.names:
            default = s
        if "pthread_cond_wait@GLIBC_2.2.5" in s.names:
            old = s
    if default is None or old is None:
        pytest.skip("this libc has no two versions of pthread_cond_wait")
    assert "pthread_cond_wait@@GLIBC_2.3.2" in default.names  # a bare name is the default version
    assert default.vaddr != old.vaddr


def test_missing_undefined_and_non_functions_are_not_resolved(libc):
    assert resolve_symbols(libc, ["no_such_function_here", "stdout", "environ"]) == []
    assert resolve_symbols("/etc/hostname", ["main"]) == []
    assert resolve_symbols("/nonexistent/lib.so", ["main"]) == []
    # PyIter_Send is imported, not defined, by libc-using extension modules; libc does not define it
    assert resolve_symbols(libc, ["PyIter_Send"]) == []


def test_python_binary_or_libpython_defines_pyiter_send():
    if sys.version_info < (3, 10):
        pytest.skip("PyIter_Send is CPython >= 3.10")
    path = python_tasks.python_with_tasks(os.getpid())
    assert path is not None and path.startswith(f"/proc/{os.getpid()}/root/")
    [symbol] = resolve_symbols(path, python_tasks.SPEC.symbols)
    assert symbol.names == ("PyIter_Send",)
    assert python_tasks.SPEC.matches(path.split("/root", 1)[1])


def test_runtime_address_of_a_libc_function_is_where_ctypes_finds_it(libc):
    [getpid] = [s for s in resolve_symbols(libc, ["getpid"])]
    addr = runtime_address(executable_mappings(os.getpid()), libc, getpid.file_offset)
    real = ctypes.cast(ctypes.CDLL(libc).getpid, ctypes.c_void_p).value
    assert addr == real


def test_parse_maps_keeps_executable_file_mappings():
    text = textwrap.dedent(
        """\
        55d0c0000000-55d0c0001000 r--p 00000000 08:01 1 /usr/bin/x
        55d0c0001000-55d0c0005000 r-xp 00001000 08:01 1 /usr/bin/x
        7f0000000000-7f0000021000 rw-p 00000000 00:00 0
        7f1000000000-7f1000100000 r-xp 00028000 08:01 2 /usr/lib/libc.so.6
        7f2000000000-7f2000001000 r-xp 00000000 08:01 3 /tmp/gone.so (deleted)
        7ffc00000000-7ffc00021000 r-xp 00000000 00:00 0 [vdso]
        """
    )
    maps = parse_maps(text)
    assert maps == [
        Mapping(0x55D0C0001000, 0x55D0C0005000, 0x1000, "/usr/bin/x"),
        Mapping(0x7F1000000000, 0x7F1000100000, 0x28000, "/usr/lib/libc.so.6"),
    ]
    assert runtime_address(maps, "/usr/lib/libc.so.6", 0x28010) == 0x7F1000000010
    assert runtime_address(maps, "/usr/lib/libc.so.6", 0x10) == 0


class FakeBPF:
    def __init__(self):
        self.calls = []

    def attach_uprobe(self, **kw):
        self.calls.append(("p", kw["name"], kw["addr"], kw["fn_name"], kw["pid"]))

    def attach_uretprobe(self, **kw):
        self.calls.append(("r", kw["name"], kw["addr"], kw["fn_name"], kw["pid"]))

    def detach_uprobe(self, **kw):
        self.calls.append(("-p", kw["name"], kw["addr"], kw["pid"]))

    def detach_uretprobe(self, **kw):
        self.calls.append(("-r", kw["name"], kw["addr"], kw["pid"]))


def test_attacher_attaches_once_per_address_returns_first_and_rescans_cheaply(libc):
    bpf = FakeBPF()
    seen = []
    spec = ProbeSpec("libc-test", r"/libc\.so", ("malloc", "__libc_malloc", "getpid"), entry="call_enter", ret="call_return")
    attacher = UprobeAttacher(bpf, [spec], on_attach=seen.append)
    new = attacher.scan(os.getpid())
    assert len(new) == 2 and len(seen) == 2  # malloc and its alias are one address
    kinds = [c[0] for c in bpf.calls]
    assert kinds == ["r", "p", "r", "p"]  # the return probe first
    assert all(c[4] == os.getpid() and c[1] == f"/proc/{os.getpid()}/root{libc}" for c in bpf.calls)
    assert all(a.runtime_addr for a in new)
    assert attacher.rescan(os.getpid()) == []  # maps unchanged: nothing new, nothing re-attached
    assert attacher.scan(os.getpid()) == []  # even a full scan does not attach twice
    attacher.forget(os.getpid())
    assert sorted(c[0] for c in bpf.calls[4:]) == ["-p", "-p", "-r", "-r"]


def test_rescan_finds_a_library_loaded_later(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "late.c"
    src.write_text("int otelbpf_late_function(int x) { return x + 1; }\n")
    lib = tmp_path / "libotelbpflate.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    child = subprocess.Popen(
        [sys.executable, "-c", f"import ctypes, sys, time; sys.stdin.readline(); ctypes.CDLL({str(lib)!r}); print('loaded', flush=True); time.sleep(30)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        bpf = FakeBPF()
        attacher = UprobeAttacher(bpf, [ProbeSpec("late", r"/libotelbpflate\.so$", ("otelbpf_late_function",), entry="call_enter")])
        time.sleep(0.3)
        assert attacher.scan(child.pid) == []
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "loaded"
        [attached] = attacher.rescan(child.pid)
        assert attached.symbol.names == ("otelbpf_late_function",) and attached.mapped == str(lib)
        assert [c[0] for c in bpf.calls] == ["p"]
    finally:
        child.kill()
        child.wait()


# -- real probes -----------------------------------------------------------


@pytest.mark.ebpf
def test_call_probe_reports_args_return_and_names():
    from otelbpf.core.events import CallEvent
    from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

    libc_path = _mapped(r"/libc\.so")
    source = EbpfSource(CaptureConfig(pids=[os.getpid()], python_tasks=False))
    source.start()
    try:
        source.watch_process(os.getpid())
        source.add_call_probe("libc-abs", r"/libc\.so", ("labs",), returns=True, label="libc")
        source.add_call_probe("libc-getppid", r"/libc\.so", ("getppid",), returns=False)
        libc = ctypes.CDLL(libc_path)
        libc.labs.argtypes = [ctypes.c_long]
        libc.labs.restype = ctypes.c_long
        assert libc.labs(-42) == 42
        libc.getppid()
        events = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len([e for e in events if type(e) is CallEvent]) < 2:
            events += source.read()
            time.sleep(0.02)
    finally:
        source.close()
    calls = {e.function: e for e in events if type(e) is CallEvent}
    labs = calls["labs"]
    assert (labs.library, labs.args[0] & 0xFFFFFFFFFFFFFFFF, labs.ret, labs.pid, labs.tid) == (
        "libc",
        (-42) & 0xFFFFFFFFFFFFFFFF,
        42,
        os.getpid(),
        __import__("threading").get_native_id(),
    )
    assert labs.end_ns >= labs.ts_ns
    getppid = calls["getppid"]
    assert getppid.library == os.path.basename(libc_path) and getppid.end_ns == getppid.ts_ns and getppid.ret == 0
