"""The native unwinder against real processes.

Snapshots are taken the way BPF takes them, without BPF: the thread is stopped
with ptrace, its registers read (PTRACE_GETREGS, mapped to DWARF order) and up
to 32 KiB of its stack copied from the stack pointer through /proc/PID/mem.
Targets are small C/C++ programs (tests/profiles_targets) built here with gcc,
and CPython interpreters spinning in Python code.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ptrace_snapshot import snapshot

from otelbpf.profiles.model import FRAME_MARKER, FRAME_NATIVE

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="snapshots read x86-64 registers")

native = pytest.importorskip("otelbpf.profiles.native")
NativeUnwinder = native.NativeUnwinder

TARGETS = Path(__file__).parent / "profiles_targets"
PYTHONS = ["/usr/bin/python3", "/root/.pyenv/versions/3.12.1/bin/python3.12"]
PY_SPIN = "def spin():\n    while True:\n        pass\nspin()\n"

# --- targets --------------------------------------------------------------------


def _build(tmp: Path, source: str, *flags: str) -> Path:
    compiler = "g++" if source.endswith(".cpp") else "gcc"
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    out = tmp / Path(source).stem
    subprocess.run(
        [compiler, "-O2", "-fomit-frame-pointer", "-fno-inline", "-g", *flags, "-o", str(out),
         str(TARGETS / source), "-lpthread"],
        check=True,
    )
    return out


@pytest.fixture
def spawn():
    """Starts target processes and kills them at the end of the test."""
    procs: list[subprocess.Popen] = []

    def start(*argv: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        time.sleep(0.3)
        assert proc.poll() is None, f"{argv} exited"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("targets")
    return {
        "chain": _build(tmp, "chain.c"),
        "nocfi": _build(tmp, "nocfi.c"),
        "worker": _build(tmp, "worker.cpp"),
    }


def names(stack) -> list[str]:
    return [f.function for f in stack.frames]


def _other_thread(pid: int) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        if tids:
            return tids[0]
        time.sleep(0.05)
    raise AssertionError("the target started no thread")


# --- cases ----------------------------------------------------------------------


def test_chain_unwinds_completely_through_cfi(built, spawn):
    pid = spawn(str(built["chain"])).pid
    unwinder = NativeUnwinder()
    full = 0
    for _ in range(30):
        stack = unwinder.unwind(pid, *snapshot(pid))
        got = names(stack)
        if stack.complete and got[:4] == ["inner", "middle", "outer", "main"]:
            full += 1
        time.sleep(0.005)
    assert full >= 27, (full, got, stack.reason)
    assert "__libc_start_call_main" in got and all(f.kind == FRAME_NATIVE for f in stack.frames)
    leaf = stack.frames[0]
    assert leaf.mapping is not None and leaf.mapping.path == str(built["chain"])
    assert leaf.mapping.start <= leaf.address < leaf.mapping.end and len(leaf.mapping.build_id) == 40


def test_thread_chain_ends_at_thread_entry(built, spawn):
    pid = spawn(str(built["chain"]), "thread").pid
    stack = NativeUnwinder().unwind(pid, *snapshot(pid, _other_thread(pid)))
    assert stack.complete, (names(stack), stack.reason)
    assert names(stack)[:3] == ["inner", "middle", "outer"] and "start_thread" in names(stack)


@pytest.mark.parametrize("python", PYTHONS)
def test_cpython_reaches_main_through_eval_loop(python, spawn):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed")
    pid = spawn(python, "-c", PY_SPIN).pid
    unwinder = NativeUnwinder()
    stacks = [unwinder.unwind(pid, *snapshot(pid)) for _ in range(5)]
    for stack in stacks:
        assert stack.complete, (names(stack), stack.reason)
        assert any(native.is_eval_frame(f) for f in stack.frames), names(stack)
        # main tail-calls Py_BytesMain: the caller after Py_RunMain is glibc's
        assert "Py_RunMain" in names(stack) and names(stack)[-1] == "_start"


def test_cpp_symbols_are_demangled(built, spawn):
    pid = spawn(str(built["worker"])).pid
    stack = NativeUnwinder().unwind(pid, *snapshot(pid))
    assert names(stack)[:2] == ["ns::Worker<int>::spin(int)", "main"], names(stack)
    assert stack.complete


def test_code_without_cfi_ends_in_a_marker(built, spawn):
    pid = spawn(str(built["nocfi"])).pid
    stack = NativeUnwinder().unwind(pid, *snapshot(pid))
    assert names(stack) == ["nocfi_spin", "[unwind stopped: no CFI]"]
    assert not stack.complete and stack.reason == "no CFI"
    assert stack.frames[-1].kind == FRAME_MARKER


def test_truncated_copy_ends_in_a_marker(built, spawn):
    pid = spawn(str(built["chain"])).pid
    regs, sp, stack = snapshot(pid)
    unwinder = NativeUnwinder()
    cut = unwinder.unwind(pid, regs, sp, stack[:64])
    assert not cut.complete and cut.reason == "truncated stack copy", names(cut)
    assert names(cut)[0] == "inner" and names(cut)[-1] == "[unwind stopped: truncated stack copy]"
    assert unwinder.unwind(pid, regs, sp, stack).complete
    assert unwinder.stats["incomplete:truncated stack copy"] == 1


def test_max_frames_bounds_the_walk(built, spawn):
    pid = spawn(str(built["chain"])).pid
    stack = NativeUnwinder().unwind(pid, *snapshot(pid), max_frames=2)
    assert names(stack) == ["inner", "middle", "[unwind stopped: max frames]"]


def _code_ranges(pid: int) -> list[tuple[int, int]]:
    ranges = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if "x" in fields[1]:
                ranges.append(tuple(int(x, 16) for x in fields[0].split("-")))
    return ranges


@pytest.fixture(scope="module")
def fuzz_target(built):
    proc = subprocess.Popen([str(built["chain"])])
    time.sleep(0.3)
    yield proc.pid, _code_ranges(proc.pid), NativeUnwinder(), NativeUnwinder(fast=False)
    proc.kill()
    proc.wait()


_word = st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_garbage_never_crashes_or_runs_away(fuzz_target, data):
    """Random registers and stack bytes, with PCs and stack words often pointing
    into real code so that libdw actually evaluates CFI on them."""
    pid, ranges, unwinder, alone = fuzz_target
    code = st.sampled_from(ranges).flatmap(lambda r: st.integers(r[0], r[1] - 1))
    stack_addr = data.draw(_word | st.integers(0x7FF000000000, 0x7FFFFFFFF000))
    near = st.integers(stack_addr, min(stack_addr + 4096, 2**64 - 1))
    words = data.draw(st.lists(code | _word | near, max_size=512))
    stack = b"".join(w.to_bytes(8, "little") for w in words) + data.draw(st.binary(max_size=7))
    regs = data.draw(st.lists(_word, min_size=17, max_size=17))
    regs[16] = data.draw(code | _word)
    regs[7] = data.draw(near | _word)
    max_frames = data.draw(st.integers(1, 200))
    started = time.monotonic()
    result = unwinder.unwind(pid, regs, stack_addr, stack, max_frames)
    assert time.monotonic() - started < 1.0
    real = [f for f in result.frames if f.kind != FRAME_MARKER]
    assert len(real) <= max_frames and len(result.frames) - len(real) == (not result.complete)
    # the rule and symbol caches give what libdw alone gives, garbage included
    assert alone.unwind(pid, regs, stack_addr, stack, max_frames) == result


def _wait_mapped(pid: int, path: str) -> None:
    deadline = time.monotonic() + 5
    while path not in Path(f"/proc/{pid}/maps").read_text():
        assert time.monotonic() < deadline, f"{path} was never mapped"
        time.sleep(0.02)
    time.sleep(0.05)


def test_a_dlopened_library_is_found_after_a_refresh(tmp_path, spawn, monkeypatch):
    plugin = tmp_path / "libplugin.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(plugin), str(TARGETS / "plugin.c")], check=True)
    pid = spawn(str(_build(tmp_path, "dlopen.c", "-ldl")), str(plugin)).pid
    auto, explicit = NativeUnwinder(), NativeUnwinder()
    for unwinder in (auto, explicit):
        assert "main" in names(unwinder.unwind(pid, *snapshot(pid)))  # sleeping, before dlopen
    _wait_mapped(pid, str(plugin))
    monkeypatch.setattr(native.unwinder, "REFRESH_INTERVAL_S", 3600.0)
    stale = auto.unwind(pid, *snapshot(pid))
    assert stale.reason == "pc not in a module" and auto.stats.get("refreshes", 0) == 0  # rate-limited
    monkeypatch.setattr(native.unwinder, "REFRESH_INTERVAL_S", 0.0)
    fresh = auto.unwind(pid, *snapshot(pid))
    assert names(fresh)[:2] == ["plugin_spin", "main"] and fresh.complete, (names(fresh), fresh.reason)
    assert fresh.frames[0].mapping.path == str(plugin) and auto.stats["refreshes"] == 1
    explicit.refresh(pid)
    assert names(explicit.unwind(pid, *snapshot(pid)))[:2] == ["plugin_spin", "main"]


def test_process_lru_evicts_and_still_unwinds(built, spawn):
    pids = [spawn(str(built["chain"])).pid for _ in range(3)]
    unwinder = NativeUnwinder(max_processes=2)
    for pid in pids + pids[:1]:
        stack = unwinder.unwind(pid, *snapshot(pid))
        assert names(stack)[:4] == ["inner", "middle", "outer", "main"], (names(stack), stack.reason)
    assert unwinder.stats["evictions"] == 2 and unwinder.stats["processes"] == 2
    unwinder.forget(pids[0])
    assert unwinder.stats["processes"] == 1


def test_frame_cache_is_bounded(built, spawn):
    pid = spawn(str(built["chain"])).pid
    unwinder = NativeUnwinder(max_symbols=2)
    for _ in range(3):
        assert names(unwinder.unwind(pid, *snapshot(pid)))[:4] == ["inner", "middle", "outer", "main"]
    assert unwinder.stats["frame_cache_resets"] >= 1


def test_a_dead_process_gives_a_marker(built):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stack = NativeUnwinder().unwind(proc.pid, [0] * 17, 0, b"")
    assert not stack.complete and stack.reason == "process gone"


# --- the caches against libdw alone -----------------------------------------------------


def _differential(pid: int, snapshots, tids=None) -> NativeUnwinder:
    """Each snapshot unwound by the cached unwinder (twice: first sight, then from its
    caches) and by libdw alone (fast=False: libdw's walk and its symbol look-ups)
    gives the same frames, names and stop reason."""
    cached, alone = NativeUnwinder(), NativeUnwinder(fast=False)
    for snap in snapshots:
        expected = alone.unwind(pid, *snap)
        assert cached.unwind(pid, *snap) == expected, (names(expected), expected.reason)
    for snap in snapshots:
        assert cached.unwind(pid, *snap) == alone.unwind(pid, *snap)
    assert alone.stats["walks:fast"] == 0 and alone.stats.get("walks:symbol_index_hits", 0) == 0
    return cached


def _snapshots(pid: int, count: int, tid: int | None = None) -> list:
    out = []
    for _ in range(count):
        out.append(snapshot(pid, tid))
        time.sleep(0.003)
    return out


def test_cached_unwinder_gives_libdws_frames_for_c_and_cpp(built, spawn):
    for argv, tid in (([str(built["chain"])], None), ([str(built["chain"]), "thread"], "other"),
                      ([str(built["worker"])], None), ([str(built["nocfi"])], None)):  # fmt: skip
        pid = spawn(*argv).pid
        snaps = _snapshots(pid, 20, _other_thread(pid) if tid else None)
        cached = _differential(pid, snaps)
        assert cached.stats["walks:fast"] >= 20, cached.stats  # the walks ran on the rule cache


@pytest.mark.parametrize("python", PYTHONS)
def test_cached_unwinder_gives_libdws_frames_for_cpython(python, spawn):
    """A stripped interpreter (Debian's python3: .dynsym only) has unnamed functions: the
    symbol index answers "no symbol" for them as libdw does, and names the rest."""
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed")
    pid = spawn(python, "-c", PY_SPIN).pid
    cached = _differential(pid, _snapshots(pid, 40))
    stats = cached.stats
    assert stats["complete"] == 80 and stats["walks:fast"] == 80, stats
    assert stats["walks:symbol_index_hits"] + stats["walks:symbol_range_hits"] > 0, stats


def test_same_walk_same_tuple_and_verify_counts(built, spawn):
    pid = spawn(str(built["chain"])).pid
    snap = snapshot(pid)
    unwinder = NativeUnwinder(verify=True)
    first, again = unwinder.unwind(pid, *snap), unwinder.unwind(pid, *snap)
    assert first.frames is again.frames  # interned: the encoders count it by identity
    assert unwinder.stats["verified"] == 2 and unwinder.stats.get("verify_mismatches", 0) == 0


def test_pt_regs_bytes_are_read_like_dwarf_registers(built, spawn):
    """The decoder hands the unwinder struct pt_regs as BPF copied it (bytes)."""
    import struct

    from otelbpf.profiles.records import _X86_64_PT_REGS_TO_DWARF

    pid = spawn(str(built["chain"])).pid
    regs, sp, stack = snapshot(pid)
    pt_regs = [0] * 21
    for word, dwarf in _X86_64_PT_REGS_TO_DWARF.items():
        pt_regs[word] = regs[dwarf]
    unwinder = NativeUnwinder()
    assert unwinder.unwind(pid, struct.pack("<21Q", *pt_regs), sp, stack) == unwinder.unwind(pid, regs, sp, stack)
    with pytest.raises(ValueError):
        unwinder.unwind(pid, b"\0" * 8, sp, stack)


def test_refresh_drops_the_rule_and_symbol_caches(built, spawn):
    pid = spawn(str(built["chain"])).pid
    snap = snapshot(pid)
    unwinder = NativeUnwinder()
    before = unwinder.unwind(pid, *snap)
    misses = unwinder.stats["walks:rule_misses"]
    unwinder.unwind(pid, *snap)
    assert unwinder.stats["walks:rule_misses"] == misses  # cached
    unwinder.refresh(pid)
    after = unwinder.unwind(pid, *snap)
    assert unwinder.stats["walks:rule_misses"] == 2 * misses and after == before and after.frames is not before.frames
