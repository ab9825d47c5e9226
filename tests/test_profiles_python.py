"""CPython frames for CPU profiles (otelbpf/profiles/python), against real interpreters.

Each interpreter found on the machine runs a known call chain; the test stops
it at random moments and checks what find_python + thread_states +
walk_thread see. The offset tables are checked against the builds' DWARF
with gdb: pyenv's 3.10.13, 3.11.7, 3.12.1 (tables) and 3.13.0 (parsed
_Py_DebugOffsets) carry it; Debian's 3.11.2 has none here (debuglink only),
so it is covered by the live walk, which uses the 3.11 table. 3.14 is not
installed: its _Py_DebugOffsets layout is untested.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otelbpf.profiles.python import offsets as O
from otelbpf.profiles.python.naming import CodeNamer, line_locations, line_pep626, read_bytes, read_str
from otelbpf.profiles.python.interpreter import ProcMem, describe, elf_info, find_python
from otelbpf.profiles.python.threads import thread_states
from otelbpf.profiles.python.walk import frames_from_bpf, read_frame_records, walk_thread

PYENV = Path("/root/.pyenv/versions")
SUPPORTED = {
    "debian-3.11": Path("/usr/bin/python3.11"),
    "3.10": PYENV / "3.10.13/bin/python3.10",
    "3.11": PYENV / "3.11.7/bin/python3.11",
    "3.12": PYENV / "3.12.1/bin/python3.12",
    "3.13": PYENV / "3.13.0/bin/python3.13",
}
UNSUPPORTED = {"3.9": PYENV / "3.9.18/bin/python3.9", "3.8": PYENV / "3.8.18/bin/python3.8"}
LIBPYTHON = {v: PYENV / f"{full}/lib/libpython{v}.so.1.0"
             for v, full in {"3.10": "3.10.13", "3.11": "3.11.7", "3.12": "3.12.1", "3.13": "3.13.0"}.items()}

TARGET = '''\
import signal, threading, time
class Worker:
    def run(self):
        outer()
def outer():
    middle()
def middle():
    any(map(inner, [0]))
def inner(_):
    x = 0
    while True:
        x += 1
def spin():
    while True:
        time.sleep(0.005)
def late(*_):
    threading.Thread(target=spin, daemon=True).start()
signal.signal(signal.SIGUSR1, late)
print("ready", flush=True)
Worker().run()
'''
INNER_LOOP_LINES = {11, 12}
#: middle calls inner through C (map), so inner starts a second eval call:
#: leaf to root, inner and <module> end one.
ENDS_EVAL = [True, False, False, False, True]


def _params(table: dict[str, Path]) -> list:
    """One param per interpreter, skipped where it is not installed."""
    return [pytest.param(path, id=name, marks=[] if path.exists() else pytest.mark.skip(reason=f"{path} absent"))
            for name, path in table.items()]


@pytest.fixture
def child(request, tmp_path):
    """A stopped-on-demand child running TARGET under the given interpreter."""
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([str(request.param), str(script)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        yield proc, str(script)
    finally:
        proc.kill()
        proc.wait()


def _stopped(pid: int) -> None:
    """Block until the kernel reports the process stopped (SIGSTOP is asynchronous)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.001)
    raise AssertionError("child did not stop")


def _refs(python, tstate):
    mem = ProcMem(python.pid)
    try:
        return frames_from_bpf(read_frame_records(python, tstate, mem), python.layout.bpf.owner_kind)
    finally:
        mem.close()


@pytest.mark.parametrize("child", _params(SUPPORTED), indirect=True)
def test_walks_known_chain(child):
    proc, script = child
    python = find_python(proc.pid)
    assert python is not None and python.layout is not None, python
    assert "offsets known" in describe(proc.pid)
    assert python.eval_ranges and all(a < b for a, b in python.eval_ranges)
    qualname = "run" if python.version == (3, 10) else "Worker.run"
    namer = CodeNamer()
    namer.attach(python)
    for _ in range(10):
        time.sleep(random.uniform(0.005, 0.04))
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            _stopped(proc.pid)
            states = thread_states(python)
            assert list(states) == [proc.pid]
            frames = walk_thread(python, states[proc.pid], namer)
            refs = _refs(python, states[proc.pid])
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert [f.function for f in frames] == ["inner", "middle", "outer", qualname, "<module>"]
        assert all(f.file == script for f in frames)
        assert frames[0].line in INNER_LOOP_LINES
        assert [f.line for f in frames[1:]] == [8, 6, 4, 20]
        assert [r.ends_eval for r in refs] == (ENDS_EVAL if python.version > (3, 10) else [True] * 5)
    assert namer.stats["hits"] > namer.stats["misses"] > 0


@pytest.mark.parametrize("child", _params(SUPPORTED), indirect=True)
def test_late_thread_appears(child):
    proc, _ = child
    python = find_python(proc.pid)
    assert list(thread_states(python)) == [proc.pid]
    os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while len(states := thread_states(python)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(states) == 2 and set(states) <= {int(t) for t in os.listdir(f"/proc/{proc.pid}/task")}
    (late,) = set(states) - {proc.pid}
    for _ in range(20):  # it may be between frames (starting, or in sleep's C code)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            _stopped(proc.pid)
            names = [f.function for f in walk_thread(python, states[late])]
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        if "spin" in names:
            return
        time.sleep(0.01)
    pytest.fail(f"late thread never showed spin: {names}")


@pytest.mark.parametrize("child", _params(UNSUPPORTED), indirect=True)
def test_unknown_version_gives_reason(child):
    proc, _ = child
    python = find_python(proc.pid)
    assert python is not None and python.layout is None and python.offsets is None
    assert "no offsets" in python.reason and "native stacks only" in describe(proc.pid)
    assert thread_states(python) == {} and walk_thread(python, 0) == []
    assert CodeNamer().name(proc.pid, 0x1000, 0) is None


def test_not_python():
    sleeper = subprocess.Popen(["sleep", "5"])
    try:
        assert find_python(sleeper.pid) is None
        assert describe(sleeper.pid) == "not a CPython process"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert find_python(2**22 + 7) is None


# --- DWARF cross-check ---

def _gdb(lib: Path, exprs: list[str]) -> list[int | None]:
    """Evaluate integer expressions against the library's DWARF (None where gdb cannot)."""
    args = ["gdb", "-batch", "-nx"]
    for e in exprs:
        args += ["-ex", f"print (long)({e})"]
    out = subprocess.run(args + [str(lib)], capture_output=True, text=True, timeout=120)
    values: list[int | None] = []
    lines = iter((out.stdout + out.stderr).splitlines())
    for line in lines:
        if line.startswith("$"):
            values.append(int(line.split("=", 1)[1]))
        elif "No symbol" in line or "no member" in line or "There is no member" in line:
            values.append(None)
    return values


def _off(typ: str, member: str) -> str:
    return f"&(({typ} *)0)->{member}"


def _expected(version: str, layout: O.PythonLayout) -> dict[str, tuple[int, str]]:
    """(our value, C expression) for every offset the layout holds."""
    b, t, c = layout.bpf, layout.threads, layout.code
    old, cframe = version == "3.10", version in ("3.11", "3.12")
    frame = "PyFrameObject" if old else "_PyInterpreterFrame"
    tstate_frame = "frame" if old else "cframe" if cframe else "current_frame"
    instr = "f_lasti" if old else "prev_instr" if cframe else "instr_ptr"
    threads_head = "tstate_head" if old else "threads.head"
    checks = {
        "tstate_frame": (b.tstate_frame, _off("PyThreadState", tstate_frame)),
        "frame_previous": (b.frame_previous, _off(frame, "f_back" if old else "previous")),
        "frame_code": (b.frame_code, _off(frame, "f_executable" if version >= "3.13" else "f_code")),
        "frame_instr": (b.frame_instr, _off(frame, instr)),
        "interpreters_head": (t.runtime_interpreters_head, _off("_PyRuntimeState", "interpreters.head")),
        "interp_next": (t.interp_next, _off("PyInterpreterState", "next")),
        "interp_threads_head": (t.interp_threads_head, _off("PyInterpreterState", threads_head)),
        "tstate_next": (t.tstate_next, _off("PyThreadState", "next")),
        "tstate_thread_id": (t.tstate_thread_id, _off("PyThreadState", "thread_id")),
        "ob_type": (c.ob_type, _off("PyObject", "ob_type")),
        "tp_name": (c.tp_name, _off("PyTypeObject", "tp_name")),
        "co_filename": (c.co_filename, _off("PyCodeObject", "co_filename")),
        "co_name": (c.co_name, _off("PyCodeObject", "co_name")),
        "co_firstlineno": (c.co_firstlineno, _off("PyCodeObject", "co_firstlineno")),
        "co_argcount": (c.co_argcount, _off("PyCodeObject", "co_argcount")),
        "co_linetable": (c.co_linetable, _off("PyCodeObject", "co_linetable")),
        "bytes_size": (c.bytes_size, _off("PyVarObject", "ob_size")),
        "bytes_data": (c.bytes_data, _off("PyBytesObject", "ob_sval")),
        "str_length": (c.str_length, _off("PyASCIIObject", "length")),
        "str_ascii_data": (c.str_ascii_data, "sizeof(PyASCIIObject)"),
        "str_compact_data": (c.str_compact_data, "sizeof(PyCompactUnicodeObject)"),
    }
    if not old:
        checks |= {
            "tstate_native_thread_id": (t.tstate_native_thread_id, _off("PyThreadState", "native_thread_id")),
            "frame_owner": (b.frame_owner, _off(frame, "is_entry" if version == "3.11" else "owner")),
            "co_qualname": (c.co_qualname, _off("PyCodeObject", "co_qualname")),
            "co_code_adaptive": (c.co_code_adaptive, _off("PyCodeObject", "co_code_adaptive")),
        }
    if cframe:
        checks["cframe_current_frame"] = (b.cframe_current_frame, _off("_PyCFrame", "current_frame"))
    if version >= "3.12":
        checks["shim_owner"] = (b.shim_owner, "FRAME_OWNED_BY_CSTACK")
    return checks


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
@pytest.mark.parametrize("version", sorted(LIBPYTHON))
def test_offsets_match_dwarf(version):
    lib = LIBPYTHON[version]
    if not lib.exists():
        pytest.skip(f"{lib} absent")
    if version >= "3.13":
        layout = O.from_debug_offsets(elf_info(str(lib)).debug_offsets)
    else:
        layout = O.TABLES[tuple(map(int, version.split(".")))]
    assert isinstance(layout, O.PythonLayout), layout
    checks = _expected(version, layout)
    values = _gdb(lib, [expr for _, expr in checks.values()])
    if len(values) != len(checks) or values[0] is None:
        pytest.skip(f"no usable DWARF in {lib}")
    wrong = {name: (ours, dwarf) for (name, (ours, _)), dwarf in zip(checks.items(), values) if ours != dwarf}
    assert not wrong, f"ours vs DWARF: {wrong}"


def test_py_offsets_bytes():
    data = O.PY311.bpf.to_bytes()
    assert len(data) == 56
    assert struct.unpack("<9IIIIq", data) == (0x030B, 56, 8, 48, 32, 56, 68, O.OWNER_IS_ENTRY, O.NONE, 0, 0, 0, 0)
    tls = O.PY311.bpf.with_tstate(2, -24, 3).to_bytes()
    assert struct.unpack("<9IIIIq", tls)[9:] == (2, 3, 0, -24) and tls[:36] == data[:36]


def test_debug_offsets_rejects_garbage():
    assert isinstance(O.from_debug_offsets(b""), str)
    assert isinstance(O.from_debug_offsets(b"x" * O.debug_offsets_size()), str)
    future = O.DEBUG_COOKIE + struct.pack("<Q", 0x030F00A0) + bytes(O.debug_offsets_size() - 16)
    assert "unknown _Py_DebugOffsets layout" in O.from_debug_offsets(future)


def test_frames_from_bpf():
    records = [(0x10, 1, 0), (0x20, 2, O.FLAG_ENDS_EVAL), (0x30, 3, O.FLAG_SHIM), (0x40, 4, 0)]
    refs = frames_from_bpf(records, O.OWNER_SHIM)
    assert [(r.code, r.ends_eval) for r in refs] == [(0x10, False), (0x20, True), (0x40, False)]
    assert all(r.ends_eval for r in frames_from_bpf(records[:2], O.OWNER_NONE))
    unflagged = [(0x10, 1, 0), (0x20, 2, 0), (0x30, 3, O.FLAG_SHIM), (0x40, 4, 0), (0, 0, O.FLAG_SHIM)]
    assert [r.ends_eval for r in frames_from_bpf(unflagged, O.OWNER_SHIM)] == [False, True, True]


# --- line tables ---

def _code_objects(root):
    stack = [root]
    while stack:
        code = stack.pop()
        yield code
        stack.extend(c for c in code.co_consts if hasattr(c, "co_lines"))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="needs a 3.11+ host interpreter")
def test_location_table_matches_co_lines():
    import inspect
    import json as module

    for code in _code_objects(compile(inspect.getsource(module), "json", "exec")):
        for start, end, line in code.co_lines():
            for unit in range(start // 2, end // 2):
                assert line_locations(code.co_linetable, code.co_firstlineno, unit) == line, (code, unit)


@pytest.mark.skipif(not SUPPORTED["3.10"].exists(), reason="no 3.10 interpreter")
def test_pep626_table_matches_co_lines():
    dump = ("import json, inspect, json.decoder as m\n"
            "def walk(c):\n"
            "    yield c\n"
            "    for k in c.co_consts:\n"
            "        if hasattr(k, 'co_lines'): yield from walk(k)\n"
            "print(json.dumps([(c.co_linetable.hex(), c.co_firstlineno, list(c.co_lines()))"
            " for c in walk(compile(inspect.getsource(m), 'm', 'exec'))]))\n")
    out = subprocess.run([str(SUPPORTED["3.10"]), "-c", dump], capture_output=True, text=True, check=True)
    import json

    for table, first, lines in json.loads(out.stdout):
        for start, end, line in lines:
            for offset in range(start, end, 2):
                assert line_pep626(bytes.fromhex(table), first, offset) == line


# --- garbage never raises ---

def _own():
    python = find_python(os.getpid())
    if python is None or python.layout is None:
        pytest.skip("the test interpreter is not a supported CPython")
    return python


#: Live objects of this process: pointers near them are readable but rarely what is expected.
_LIVE = [_own.__code__, "naïve ☃", b"bytes", [1, 2], 3.5, test_py_offsets_bytes]
u64 = st.one_of(st.integers(0, 2**64 - 1), st.integers(0x1000, 0x7FFF_FFFF_FFFF),
                st.sampled_from([0, 1, 2**63, 2**64 - 1]),
                st.tuples(st.sampled_from(_LIVE), st.integers(-64, 256)).map(lambda t: id(t[0]) + t[1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(code=u64, instr=u64, tstate=u64)
def test_garbage_never_raises(code, instr, tstate):
    python = _own()
    namer = CodeNamer(max_codes=8)
    namer.attach(python)
    frame = namer.name(python.pid, code, instr)
    assert frame is None or isinstance(frame.function, str)
    mem = ProcMem(python.pid)
    try:
        read_frame_records(python, tstate, mem)
        read_str(mem, code, python.layout.code)
        read_bytes(mem, code, python.layout.code)
    finally:
        mem.close()


@settings(max_examples=300, deadline=None)
@given(table=st.binary(max_size=64), first=st.integers(-2**31, 2**31 - 1), offset=st.integers(-10, 200))
def test_line_tables_never_raise(table, first, offset):
    line_locations(table, first, offset)
    line_pep626(table, first, offset)


def test_names_real_code_objects_in_own_process():
    """Pointers into live objects of this process: names match what Python says."""
    python = _own()
    namer = CodeNamer()
    namer.attach(python)
    code = test_names_real_code_objects_in_own_process.__code__
    frame = namer.name(python.pid, id(code), 0)
    assert frame is not None and frame.file == code.co_filename
    assert frame.function == getattr(code, "co_qualname", code.co_name) and frame.line == code.co_firstlineno
    assert namer.name(python.pid, id("not a code object"), 0) is None


@pytest.mark.parametrize("text", ["plain", "", "café", "naïve ☃", "𝔘nicode", "x" * 1000])
def test_reads_compact_strings(text):
    """Compact ASCII and the three compact non-ASCII kinds (1, 2, 4 bytes a character)."""
    python = _own()
    mem = ProcMem(python.pid)
    try:
        assert read_str(mem, id(text), python.layout.code) == text
        assert read_bytes(mem, id(text.encode()), python.layout.code) == text.encode()
    finally:
        mem.close()
