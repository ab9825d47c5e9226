"""A thread's PyThreadState found in its own TLS (otelbpf/profiles/python/thread_local.py), on every
interpreter here: Debian's static python3.11 and pyenv's shared 3.10-3.13.

The key offsets are checked against the builds' DWARF (gdb); the sources found are checked on
live children, thread by thread, against the interpreter's own thread list; the DTV path (3.14's
shared libpython) is driven with 3.12/3.13's ``_Py_tss_tstate``, the same kind of thread-local;
the static-TLS arithmetic and the TLS-access decoders against a C program whose thread-local
addresses it prints itself. The BPF side of it runs in tests/test_ebpf_profiles.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_profiles_python import LIBPYTHON, SUPPORTED, _gdb, _params, _stopped

from otelbpf.profiles.python import thread_local as tls
from otelbpf.profiles.python.interpreter import ProcMem, find_python
from otelbpf.profiles.python.threads import thread_pointers, thread_states

THREADS = '''\
import sys, threading, time
def spin():
    x = 0
    while True:
        x += 1
def sleep():
    while True:
        time.sleep(0.01)
for target in (spin, sleep, sleep):
    threading.Thread(target=target, daemon=True).start()
time.sleep(0.1)
print("ready", flush=True)
for line in sys.stdin:  # each line starts one more sleeper
    threading.Thread(target=sleep, daemon=True).start()
    time.sleep(0.05)
    print("started", flush=True)
'''


@pytest.fixture
def threaded(request, tmp_path):
    """A child running four threads (the main one, a spinner, two sleepers) under the given interpreter."""
    proc = subprocess.Popen([str(request.param), "-c", THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _each_thread_reads_its_state(python, source, mem) -> dict[int, int]:
    """tid -> what ``source`` reads for it: every listed thread, through its thread pointer."""
    pairs = dict(thread_pointers(python, mem))
    return {tid: source.read(pairs[tstate], mem) for tid, tstate in thread_states(python, mem).items()}


@pytest.mark.parametrize("threaded", _params(SUPPORTED), indirect=True)
def test_the_gilstate_key_gives_every_thread_its_state(threaded):
    python = find_python(threaded.pid)
    mem = ProcMem(threaded.pid)
    try:
        source = tls.find_tstate_source(python, thread_pointers(python, mem), mem)
        assert isinstance(source, tls.TstateSource), source
        assert source.mode == tls.MODE_FS and f"_PyRuntime+{tls.KEY_OFFSETS[python.version]:#x}" in source.how
        states = thread_states(python, mem)
        assert len(states) == 4
        # sleepers hold no GIL: the bound state is still theirs (what GPU waits need)
        assert _each_thread_reads_its_state(python, source, mem) == states
    finally:
        mem.close()


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_a_shared_libpython_thread_local_through_the_dtv(version, tmp_path):
    """3.14's _Py_tss_gilstate is a thread-local of libpython: the same kind as 3.12+'s
    _Py_tss_tstate (the *current* state: set while the thread holds the GIL), read through
    glibc's DTV with the module id the loader wrote into the library's GOT."""
    interpreter = SUPPORTED[version]
    if not interpreter.exists():
        pytest.skip(f"{interpreter} absent")
    child = subprocess.Popen([str(interpreter), "-c", THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        python = find_python(child.pid)
        mem = ProcMem(child.pid)
        for _attempt in range(20):  # stopped while no thread held the GIL (a hand-over): again
            os.kill(child.pid, signal.SIGSTOP)
            _stopped(child.pid)
            source = tls.find_tstate_source(python, thread_pointers(python, mem), mem, variable="_Py_tss_tstate")
            if isinstance(source, tls.TstateSource):
                break
            os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.01)
        try:
            assert isinstance(source, tls.TstateSource), source
            assert source.mode == tls.MODE_DTV and source.module >= 1
            facts = tls.tls_facts(str(LIBPYTHON[version]))
            assert source.offset == facts.variables["_Py_tss_tstate"]
            reads = _each_thread_reads_its_state(python, source, mem)
            states = thread_states(python, mem)
            holders = [tid for tid, found in reads.items() if found]
            assert len(holders) == 1 and reads[holders[0]] == states[holders[0]]  # one thread holds the GIL
        finally:
            os.kill(child.pid, signal.SIGCONT)
            mem.close()
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
@pytest.mark.parametrize("version", sorted(LIBPYTHON))
def test_key_offsets_match_dwarf(version):
    lib = LIBPYTHON[version]
    if not lib.exists():
        pytest.skip(f"{lib} absent")
    member = "gilstate.autoTSSkey" if version in ("3.10", "3.11") else "autoTSSkey"
    values = _gdb(lib, [f"&((_PyRuntimeState *)0)->{member}", "&((Py_tss_t *)0)->_key"])
    if values[0] is None:
        pytest.skip(f"no usable DWARF in {lib}")
    assert values == [tls.KEY_OFFSETS[tuple(map(int, version.split(".")))], 4]


def test_glibc_specific_data_decoded_from_this_libc():
    libc = next(m.path for m in _maps(os.getpid()) if m.path.endswith("/libc.so.6"))
    code = tls.function_bytes(libc, ("__pthread_getspecific", "pthread_getspecific"))
    assert tls.decode_getspecific(code) == tls.GLIBC_SPECIFIC_DATA  # 0x310 + 8 on Debian 12's glibc 2.36
    assert tls.specific_data_offsets(os.getpid()) == [tls.GLIBC_SPECIFIC_DATA]
    assert tls.decode_getspecific(b"\x90" * 64) is None and tls.decode_getspecific(None) is None


def _maps(pid):
    from otelbpf.host.procfs import executable_mappings

    return executable_mappings(pid)


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_general_dynamic_access_decoded_from_libpython(version):
    """_PyThreadState_GetCurrent reads _Py_tss_tstate through __tls_get_addr: the decoder finds
    the GOT pair its lea names and the variable's offset the link wrote there."""
    lib = LIBPYTHON[version]
    if not lib.exists():
        pytest.skip(f"{lib} absent")
    facts = tls.tls_facts(str(lib))
    assert not facts.is_program and facts.tls_size and facts.module_slots
    from elftools.elf.elffile import ELFFile

    with open(lib, "rb") as f:
        address = ELFFile(f).get_section_by_name(".dynsym").get_symbol_by_name("_PyThreadState_GetCurrent")[0]["st_value"]
    code = tls.function_bytes(str(lib), ("_PyThreadState_GetCurrent",), 96)
    assert tls.decode_tls_access(address, code, facts.got_offsets) == (tls.SEGMENT, facts.variables["_Py_tss_tstate"])


PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
__thread long first = 1;
__thread char pad[40];
__thread long second = 2;
__attribute__((noinline)) long read_second(void) { return second; }
int main(void) {
    char *tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    printf("%ld %ld %ld %ld\n", (long)((char *)&first - tp), (long)((char *)&second - tp), (long)(tp - (char *)pthread_self()), read_second());
    return 0;
}
"""


def test_static_tls_arithmetic_and_local_exec_decoding(tmp_path: Path):
    """A program's thread-locals sit below the thread pointer at (offset in segment) - (aligned
    segment size): what static_tls_offset computes from the ELF, what the program prints, and
    what the local-exec ``mov %fs:DISP`` of its reader decodes to."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "tls.c").write_text(PROGRAM)
    binary = tmp_path / "tls"
    subprocess.run([cc, "-O2", "-rdynamic", "-o", str(binary), str(tmp_path / "tls.c"), "-lpthread"], check=True)
    first, second, tp_vs_self, value = map(int, subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.split())
    assert tp_vs_self == 0 and value == 2  # pthread_self() is the thread pointer (what thread_pointers relies on)
    facts = tls.tls_facts(str(binary))
    assert facts.is_program
    assert tls.static_tls_offset(facts, facts.variables["first"]) == first
    assert tls.static_tls_offset(facts, facts.variables["second"]) == second
    from elftools.elf.elffile import ELFFile

    with open(binary, "rb") as f:
        address = ELFFile(f).get_section_by_name(".dynsym").get_symbol_by_name("read_second")[0]["st_value"]
    code = tls.function_bytes(str(binary), ("read_second",), 32)
    assert tls.decode_tls_access(address, code, facts.got_offsets) == (tls.THREAD_POINTER, second)


def test_nothing_proves_out_on_garbage(tmp_path):
    """Wrong thread pointers and states: a reason, never a source (nor an exception)."""
    python = find_python(os.getpid())
    if python is None or python.layout is None:
        pytest.skip("the test interpreter has no known layout")
    mem = ProcMem(os.getpid())
    try:
        assert isinstance(tls.find_tstate_source(python, [], mem), str)
        assert isinstance(tls.find_tstate_source(python, [(0xDEAD0000, 0x10), (1, 2)], mem), str)
        assert isinstance(tls.find_tstate_source(python, [(123, 0)], mem, variable="no_such_variable"), str)
        assert not tls.proves_out(tls.TstateSource(tls.MODE_DTV, 8, 99999), [(1, 0x1000)], mem)
    finally:
        mem.close()


@pytest.mark.parametrize("threaded", _params(SUPPORTED), indirect=True)
def test_a_thread_started_later_reads_its_state_through_the_same_source(threaded):
    """The source is per process, not per thread: a thread started after it was found reads its
    own state through it (what gives a new thread's first sample its Python frames in BPF)."""
    python = find_python(threaded.pid)
    mem = ProcMem(threaded.pid)
    try:
        source = tls.find_tstate_source(python, thread_pointers(python, mem), mem)
        assert isinstance(source, tls.TstateSource), source
        before = thread_states(python, mem)
        threaded.stdin.write(b"one more\n")
        threaded.stdin.flush()
        assert threaded.stdout.readline().strip() == b"started"
        after = thread_states(python, mem)
        new = set(after) - set(before)
        assert len(new) == 1
        assert _each_thread_reads_its_state(python, source, mem) == after
    finally:
        mem.close()
