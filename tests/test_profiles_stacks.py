"""The stack builder's per-sample path, without BPF: merging, the memo of recent
samples and its expiry, interning, and the record decoder's raw fields.

The native unwinder and the code namer are stand-ins with the real ones'
interfaces (the real ones are tested against live processes in
test_profiles_native.py and test_profiles_python.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from otelbpf.profiles import stacks
from otelbpf.profiles.model import FRAME_KERNEL, FRAME_MARKER, FRAME_NATIVE, FRAME_PYTHON, Frame
from otelbpf.profiles.native.unwinder import UnwoundStack
from otelbpf.profiles.python import offsets as O
from otelbpf.profiles.records import (
    EV_PROFILE,
    PF_PY_TRUNCATED,
    PROFILE_INFO_FIELDS,
    PROFILE_INFO_SIZE,
    PROFILE_STACK_BYTES,
    PY_FRAME,
    ProfileRecordDecoder,
    StackSampleEvent,
    dwarf_registers,
    py_frame_records,
)
from otelbpf.sources.ebpf_layout import HEADER

PID = 4242
LEAF = Frame(FRAME_NATIVE, "memcpy", address=0x1000)
EVAL = Frame(FRAME_NATIVE, "_PyEval_EvalFrameDefault", address=0x2000)
CALL = Frame(FRAME_NATIVE, "PyObject_Call", address=0x3000)
MAIN = Frame(FRAME_NATIVE, "main", address=0x4000)
NATIVE = (LEAF, EVAL, CALL, EVAL, MAIN)  # interned by the unwinder: one tuple object


class FakeUnwinder:
    def __init__(self, frames=NATIVE) -> None:
        self.frames = frames
        self.calls = 0

    def unwind(self, pid, regs, stack_addr, stack, max_frames=127):
        self.calls += 1
        return UnwoundStack(self.frames, True)

    def forget(self, pid) -> None:
        pass


@dataclass
class Entry:
    checked: float


class FakeNamer:
    """CodeNamer's interface: name() names a (code, instr) and fills table(); entries
    carry when their code object was last checked."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.names: dict[int, str | None] = {}
        self.calls = 0
        self._table: dict = {}

    def attach(self, proc) -> None:
        pass

    def forget(self, pid) -> None:
        self._table.clear()

    def table(self, pid):
        return self._table

    def name(self, pid, code, instr):
        self.calls += 1
        function = self.names.get(code, f"f{code:x}")
        if function is None:
            return None
        frame = Frame(FRAME_PYTHON, function, "/app/x.py", instr // 2)
        self._table[(code, instr)] = (frame, Entry(self.clock.now))
        return frame


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Proc:
    """runtime.PythonProcess as the builder reads it: proc.layout.bpf.owner_kind."""

    class layout:  # noqa: N801
        class bpf:  # noqa: N801
            owner_kind = O.OWNER_SHIM


class FakeSampler:
    def python_process(self, pid):
        return Proc()

    def kernel_symbol(self, address):
        return f"k{address:x}"


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(stacks.time, "monotonic", clock.monotonic)
    return clock


def records(*frames: tuple[int, int, int]) -> bytes:
    return b"".join(PY_FRAME.pack(*frame) for frame in frames)


#: leaf first: two frames of the inner evaluation call, a shim, one of the outer one
PY = records((0xA0, 4, 0), (0xB0, 8, 0), (0, 0, O.FLAG_SHIM), (0xC0, 12, O.FLAG_ENDS_EVAL))


def event(py_frames=PY, flags=0, kernel=(), regs=b"\0" * 168) -> StackSampleEvent:
    ev = StackSampleEvent(1, PID, PID, 0, 0, flags, "t", -1, regs, 0x7000, memoryview(b"\0" * 64), py_frames)
    ev.kernel_addrs = kernel
    return ev


def builder(clock, native=NATIVE):
    namer = FakeNamer(clock)
    return stacks.StackBuilder(FakeSampler(), FakeUnwinder(native), namer), namer


def names(frames) -> list[str]:
    return [f.function for f in frames]


def test_python_frames_replace_each_evaluation_call_leaf_first(clock):
    b, _ = builder(clock)
    frames = b.frames(event(flags=PF_PY_TRUNCATED, kernel=(0xFFFF1,)))
    assert names(frames) == ["kffff1", "memcpy", "fa0", "fb0", "PyObject_Call", "fc0", "main",
                             "[python frames truncated]"]  # fmt: skip
    assert frames[0].kind == FRAME_KERNEL and frames[-1].kind == FRAME_MARKER


def test_python_frames_left_over_follow_a_stopped_native_stack(clock):
    stopped = (LEAF, Frame(FRAME_MARKER, "[unwind stopped: no CFI]"))
    b, _ = builder(clock, stopped)
    assert names(b.frames(event())) == ["memcpy", "[unwind stopped: no CFI]", "fa0", "fb0", "fc0"]


def test_the_same_sample_again_is_the_same_tuple_without_naming(clock):
    b, namer = builder(clock)
    first = b.frames(event())
    calls = namer.calls
    again = b.frames(event(py_frames=bytes(PY)))
    assert again is first and namer.calls == calls and b.counters["memo_hits"] == 1
    assert b.frames(event(py_frames=list(PY_FRAME.iter_unpack(PY)))) == first  # the decoder-less form


def test_a_remembered_stack_expires_with_its_oldest_code_check(clock):
    b, namer = builder(clock)
    first = b.frames(event())
    clock.now += stacks.REVERIFY_S - 0.01
    assert b.frames(event()) is first
    calls = namer.calls
    clock.now += 0.02  # the code objects are due a check: named again (the namer re-reads them)
    assert b.frames(event()) == first and namer.calls == calls + 3


def test_an_unnamed_python_frame_is_asked_again_next_sample(clock):
    b, namer = builder(clock)
    namer.names[0xB0] = None
    assert "[unknown python frame]" in names(b.frames(event()))
    namer.names[0xB0] = "now_readable"
    assert "now_readable" in names(b.frames(event()))


def test_equal_stacks_from_different_records_are_one_tuple(clock):
    b, _ = builder(clock)
    # instr 4 and 5 name the same line (instr // 2): other records, the same frames
    one = b.frames(event(records((0xA0, 4, 0), (0xC0, 12, O.FLAG_ENDS_EVAL))))
    two = b.frames(event(records((0xA0, 5, 0), (0xC0, 12, O.FLAG_ENDS_EVAL))))
    assert one is two


def test_memos_are_bounded_and_forget_drops_a_process(clock, monkeypatch):
    monkeypatch.setattr(stacks, "MAX_MEMO", 4)
    b, _ = builder(clock)
    for instr in range(10):
        b.frames(event(records((0xA0, 2 * instr, 0), (0xC0, 12, O.FLAG_ENDS_EVAL))))
    assert len(b._stacks) <= 4 and len(b._pythons) <= 4 and len(b._interned) <= 4
    b.forget(PID)
    assert not b._stacks and not b._pythons


def test_decoder_keeps_registers_frames_and_stack_as_bytes():
    regs = list(range(100, 121))
    py = records((0xA0, 4, 0), (0xC0, 12, 1))
    stack = bytes(range(256)) * 4
    info = PROFILE_INFO_FIELDS.pack(0x7000, -1, 2, 0, 0, b"worker\0", 0, 0) + struct.pack("<21Q", *regs) + py
    info += bytes(PROFILE_INFO_SIZE - len(info))
    raw = HEADER.pack(5, 0, PID, PID + 1, 0, EV_PROFILE, 0, 0, 0, 0, len(stack), 9) + info + stack
    ev = ProfileRecordDecoder(clock_offset_ns=10).decode(raw)
    assert (ev.ts_ns, ev.pid, ev.tid, ev.task_id, ev.comm, ev.stack_addr) == (15, PID, PID + 1, 9, "worker", 0x7000)
    assert isinstance(ev.regs, bytes) and dwarf_registers(ev.regs) == dwarf_registers(tuple(regs))
    assert py_frame_records(ev.py_frames) == [(0xA0, 4, 0), (0xC0, 12, 1)] == py_frame_records(py_frame_records(py))
    assert isinstance(ev.stack, memoryview) and bytes(ev.stack) == stack  # a view of the record: no copy


class FakeStackMap:
    """BCC's StackTrace table as the sampler uses it: Key, lookup (a leaf with ``ip``), pop."""

    class Key(int):
        pass

    def __init__(self, stacks: dict[int, list[int]]) -> None:
        self.stacks = stacks
        self.popped: list[int] = []

    def __getitem__(self, key):
        if int(key) not in self.stacks:
            raise KeyError(key)

        class Leaf:
            ip = self.stacks[int(key)] + [0] * (127 - len(self.stacks[int(key)]))

        return Leaf()

    def pop(self, key, default=None):
        self.popped.append(key.value)
        return self.stacks.pop(key.value, default)


def test_kernel_stacks_are_read_whole_and_released_after_their_last_use():
    from otelbpf.profiles.sampler import KERNEL_STACK_HOLD_DRAINS, KERNEL_STACK_HOLD_S, ProfileConfig, ProfileSampler

    table = FakeStackMap({1: [0xA, 0xB], 2: [0xC], 3: []})
    sampler = ProfileSampler({"kernel_stacks": table}, ProfileConfig(), 0)
    clock = [100.0]
    sampler._clock = lambda: clock[0]

    def drain(*ids, after_s: float = KERNEL_STACK_HOLD_S):
        clock[0] += after_s
        seen: dict = {}
        got = [sampler._kernel_stack(i, seen) for i in ids]
        sampler._release_kernel_stacks(seen)
        return got

    assert drain(1, 2, 3, 9) == [(0xA, 0xB), (0xC,), (), ()]
    for _ in range(KERNEL_STACK_HOLD_DRAINS - 1):
        drain(2)  # 2 stays in use; 1 ages
    assert table.popped == []
    drain()
    assert table.popped == [1]  # not named for KERNEL_STACK_HOLD_DRAINS drains
    assert drain(2) == [(0xC,)] and table.popped == [1]  # still held: read from memory
    for _ in range(KERNEL_STACK_HOLD_DRAINS):
        drain()
    assert table.popped == [1, 2] and not sampler._held_stacks


def test_kernel_stacks_are_held_a_second_however_often_the_agent_drains():
    """An agent busy with traffic drains every few milliseconds: a sleeper's stack, named
    again every 50 ms, must not expire between two of its samples (a sample taken just
    before the delete and read after it would lose its kernel frames)."""
    from otelbpf.profiles.sampler import KERNEL_STACK_HOLD_DRAINS, KERNEL_STACK_HOLD_S, ProfileConfig, ProfileSampler

    table = FakeStackMap({1: [0xA, 0xB]})
    sampler = ProfileSampler({"kernel_stacks": table}, ProfileConfig(), 0)
    clock = [100.0]
    sampler._clock = lambda: clock[0]

    def drain(*ids):
        clock[0] += 0.002
        seen: dict = {}
        got = [sampler._kernel_stack(i, seen) for i in ids]
        sampler._release_kernel_stacks(seen)
        return got

    for _ in range(40):  # 2 s of drains every 2 ms, the sleeper's sample every 25th
        for _ in range(24):
            drain()
        assert drain(1) == [(0xA, 0xB)]
    assert table.popped == []
    while clock[0] < 102.0 + KERNEL_STACK_HOLD_S:  # it stops sleeping: released a second later
        drain()
    assert table.popped == [1] and not sampler._held_stacks
    assert 24 > KERNEL_STACK_HOLD_DRAINS  # the drain count alone would have released it


def test_the_profile_ring_is_read_before_busy_cpus_could_fill_it(monkeypatch):
    """On-CPU samples never wake a sleeping agent (bpf/profile.c): its sleep is cut to half
    the time every CPU, busy at hz with whole stack copies, takes to fill the ring."""
    from otelbpf.profiles.kinds import OFF_CPU_UNREAD_LIMIT_S
    from otelbpf.profiles.sampler import ProfileConfig, ProfileSampler

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    record = HEADER.size + PROFILE_INFO_SIZE + PROFILE_STACK_BYTES + 8

    def limit(**config) -> float:
        return ProfileSampler(None, ProfileConfig(**config), 0).unread_limit_s

    assert limit(hz=19) == pytest.approx(4 * 2**20 / (19 * 2 * record) / 2)
    assert 1.0 < limit(hz=19) < 2.0 and 0.2 < limit(hz=99) < 0.4
    assert limit(hz=99, ring_mb=16) == pytest.approx(4 * limit(hz=99))
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert limit(hz=19) < 0.1
    assert limit(hz=1, off_cpu=True) == OFF_CPU_UNREAD_LIMIT_S  # blocks come at no rate
