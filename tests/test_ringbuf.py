"""otelbpf.sources.ringbuf: the ring buffer read through its mapping, compiled and pure.

* A file laid out like the kernel's mapping (consumer page, producer page, data area
  twice) exercises the protocol without root: wrap-around, discarded and busy records,
  compiled and pure builds giving the same records.
* A real BPF program (marker ebpf) submits records of varied sizes from a tracepoint,
  more than the ring holds in total, from one and from two CPUs at once; every record's
  content and per-producer order is checked, and the reader returns exactly what BCC's
  own open_ring_buffer/ring_buffer_consume path returns for the same input.
"""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "otelbpf" / "sources" / "ringbuf.py"
PAGE = mmap.PAGESIZE
BUSY = 1 << 31
DISCARD = 1 << 30


def load_pure():
    """ringbuf.py itself, never the extension beside it."""
    spec = importlib.util.spec_from_file_location("otelbpf_ringbuf_pure", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not module.COMPILED
    return module


def load_compiled():
    import otelbpf.sources.ringbuf as module

    if not module.COMPILED:
        pytest.skip("ringbuf extension not built (tests/test_compiled.py says why)")
    return module


@pytest.fixture(params=["compiled", "pure"])
def ringbuf(request):
    return load_compiled() if request.param == "compiled" else load_pure()


# -- the protocol, on a file laid out like the kernel's mapping ------------------------


class FakeRing:
    """A producer writing the kernel's layout into a file: [consumer page][producer
    page][data][data again] so that mapping ``page + 2 * size`` at ``page`` behaves as
    the kernel's double mapping does."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.file = tempfile.TemporaryFile()
        self.file.truncate(2 * PAGE + 2 * size)
        self.mem = mmap.mmap(self.file.fileno(), 2 * PAGE + 2 * size)
        self.prod = 0

    @property
    def fd(self) -> int:
        return self.file.fileno()

    @property
    def cons(self) -> int:
        return struct.unpack_from("=Q", self.mem, 0)[0]

    def _write(self, pos: int, data: bytes) -> None:
        for i in range(len(data)):  # both copies of the data area, byte by byte (wraps)
            off = (pos + i) % self.size
            self.mem[2 * PAGE + off] = data[i]
            self.mem[2 * PAGE + self.size + off] = data[i]

    def reserve(self, payload: bytes, *, discard: bool = False, busy: bool = False) -> int:
        total = (len(payload) + 8 + 7) & ~7
        assert self.prod + total - self.cons <= self.size, "fake ring full"
        pos = self.prod
        flags = (BUSY if busy else 0) | (DISCARD if discard else 0)
        self._write(pos, struct.pack("=II", len(payload) | flags, 0) + payload)
        self.prod += total
        struct.pack_into("=Q", self.mem, PAGE, self.prod)
        return pos

    def commit(self, pos: int) -> None:
        length = struct.unpack_from("=I", self.mem, 2 * PAGE + pos % self.size)[0]
        self._write(pos, struct.pack("=I", length & ~BUSY))

    def close(self) -> None:
        self.mem.close()
        self.file.close()


def _script(seed: int, size: int, count: int):
    """A deterministic mix: payload sizes 0..900, some discarded, some committed late."""
    rng = random.Random(seed)
    return [(bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 900))), rng.random() < 0.1) for _ in range(count)]


def run_fake(module, seed: int, size: int = 4 * PAGE, count: int = 400) -> tuple[list[bytes], list[bytes]]:
    """Feed ``count`` records through a fake ring in batches; returns (expected, drained)."""
    ring = FakeRing(size)
    reader = module.RingBufReader(ring.fd, data_size=size, release_bytes=512)
    expected: list[bytes] = []
    drained: list[bytes] = []
    rng = random.Random(seed + 1)
    try:
        script = _script(seed, size, count)
        i = 0
        while i < len(script):
            pending_busy = None
            while i < len(script):
                payload, discard = script[i]
                if ring.prod + ((len(payload) + 15) & ~7) - ring.cons > size:
                    break
                late = not discard and rng.random() < 0.05 and pending_busy is None
                pos = ring.reserve(payload, discard=discard, busy=late)
                if late:
                    pending_busy = pos
                if not discard:
                    expected.append(payload)
                i += 1
            drained += reader.drain()  # stops at the busy record, if any
            if pending_busy is not None:
                assert ring.cons <= pending_busy
                ring.commit(pending_busy)
            drained += reader.drain()
            assert ring.cons == ring.prod
        assert reader.drain() == []
        assert reader.pending_bytes() == 0
    finally:
        reader.close()
        ring.close()
    return expected, drained


def test_fake_ring_wraps_skips_discarded_and_stops_at_busy(ringbuf):
    expected, drained = run_fake(ringbuf, seed=7)
    assert sum(len(p) + 8 for p in expected) > 4 * 4 * PAGE  # wrapped several times
    assert drained == expected


def test_busy_record_blocks_later_committed_ones(ringbuf):
    ring = FakeRing(PAGE)
    reader = ringbuf.RingBufReader(ring.fd, data_size=PAGE)
    try:
        ring.reserve(b"first")
        held = ring.reserve(b"second", busy=True)
        ring.reserve(b"third")
        assert reader.drain() == [b"first"]
        assert reader.drain() == []
        assert ring.cons == held
        ring.commit(held)
        assert reader.drain() == [b"second", b"third"]
        assert ring.cons == ring.prod
    finally:
        reader.close()
        ring.close()


def test_skip_consumes_what_drain_would_return_without_copying_it(ringbuf):
    """--discard-events: the same records pass (discarded ones not counted, a busy one
    stops it), the space is released, and a drain after it starts where it stopped."""
    ring = FakeRing(PAGE)
    reader = ringbuf.RingBufReader(ring.fd, data_size=PAGE)
    try:
        ring.reserve(b"a" * 100)
        ring.reserve(b"gone", discard=True)
        ring.reserve(b"b" * 7)
        held = ring.reserve(b"held", busy=True)
        ring.reserve(b"after")
        assert reader.skip() == 2
        assert ring.cons == held
        assert reader.skip() == 0
        ring.commit(held)
        ring.reserve(b"c" * 3000)  # wraps the one-page ring
        assert reader.skip() == 3
        assert ring.cons == ring.prod and reader.pending_bytes() == 0
        ring.reserve(b"next")
        assert reader.drain() == [b"next"]
    finally:
        reader.close()
        ring.close()


def test_rejects_a_size_that_is_not_a_power_of_two_pages(ringbuf):
    ring = FakeRing(PAGE)
    try:
        with pytest.raises(ringbuf.RingBufError):
            ringbuf.RingBufReader(ring.fd, data_size=3 * PAGE)
    finally:
        ring.close()


def test_closed_reader_raises(ringbuf):
    ring = FakeRing(PAGE)
    reader = ringbuf.RingBufReader(ring.fd, data_size=PAGE)
    reader.close()
    with pytest.raises(ValueError):
        reader.drain()
    reader.close()  # twice is fine
    ring.close()


# -- a real BPF ring buffer -------------------------------------------------------------

BPF_PROGRAM = r"""
BPF_RINGBUF_OUTPUT(events, RB_PAGES);

struct scratch_t { u32 len; u32 cpu; u8 data[4096]; };
BPF_PERCPU_ARRAY(scratch, struct scratch_t, 1);
BPF_ARRAY(counts, u64, 2);          /* 0: submitted, 1: lost (ring full) */
BPF_HASH(tgids, u32, u8, 64);
struct discarded_t { u64 a; u64 b; };

TRACEPOINT_PROBE(syscalls, sys_enter_getcwd) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!tgids.lookup(&tgid))
        return 0;
    u64 size = args->size;
    int zero = 0, one = 1;
    if (size & 0x10000) {           /* a record reserved, then discarded */
        struct discarded_t *d = events.ringbuf_reserve(sizeof(struct discarded_t));
        if (!d)
            return 0;
        d->a = 0xdead;
        d->b = size;
        events.ringbuf_discard(d, BPF_RB_NO_WAKEUP);
        return 0;
    }
    struct scratch_t *s = scratch.lookup(&zero);
    if (!s)
        return 0;
    u32 len = size & 0xfff;
    s->len = len;
    s->cpu = bpf_get_smp_processor_id();
    if (bpf_probe_read_user(s->data, len, args->buf))
        return 0;
    u64 *n = counts.lookup(events.ringbuf_output(s, 8 + len, BPF_RB_NO_WAKEUP) == 0 ? &zero : &one);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}
"""

# A producer: getcwd(buf, size) with buf = [u32 producer][u32 seq][pattern...]; the
# probe copies size & 0xfff bytes of it. Runs in-process or as a child process.
PRODUCER = r"""
import ctypes, random, struct
def produce(ident, count, seed, discard_every=0, wait=None):
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(1 << 17)
    pattern = bytes(range(256)) * 17
    rng = random.Random(seed)
    for seq in range(count):
        length = rng.randrange(8, 4096)
        data = struct.pack("=II", ident, seq) + pattern[seq % 251 : seq % 251 + length - 8]
        ctypes.memmove(buf, data, length)
        libc.getcwd(buf, length)
        if discard_every and seq % discard_every == 0:
            libc.getcwd(buf, 0x10000 | length)
        if wait is not None:
            wait(seq)
"""
_ns: dict = {}
exec(PRODUCER, _ns)
produce = _ns["produce"]


def expected_record(ident: int, seq: int, length: int) -> bytes:
    pattern = bytes(range(256)) * 17
    return struct.pack("=II", ident, seq) + pattern[seq % 251 : seq % 251 + length - 8]


def check_records(records: list[bytes], cpus: dict[int, int] | None = None) -> dict[int, list[int]]:
    """Every record's content; returns producer -> seqs in drained order."""
    seqs: dict[int, list[int]] = {}
    for raw in records:
        length, cpu = struct.unpack_from("=II", raw)
        assert len(raw) == 8 + length
        ident, seq = struct.unpack_from("=II", raw, 8)
        assert raw[8:] == expected_record(ident, seq, length)
        if cpus is not None:
            assert cpu == cpus[ident]
        seqs.setdefault(ident, []).append(seq)
    return seqs


@pytest.fixture(scope="module")
def bpf():
    if os.geteuid() != 0:
        pytest.skip("not root")  # marker ebpf turns this into a failure under CI
    from bcc import BPF

    prog = BPF(text=BPF_PROGRAM.encode(), cflags=["-DRB_PAGES=4", "-Wno-macro-redefined"])
    prog[b"tgids"][ctypes.c_uint(os.getpid())] = ctypes.c_ubyte(1)
    yield prog
    prog.cleanup()


def counts(prog) -> tuple[int, int]:
    table = prog[b"counts"]
    return int(table[ctypes.c_int(0)].value), int(table[ctypes.c_int(1)].value)


def pin(cpu: int) -> set[int]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    return before


@pytest.mark.ebpf
def test_real_ring_wraps_and_keeps_every_record(bpf, ringbuf):
    size = 4 * PAGE
    reader = ringbuf.RingBufReader(bpf[b"events"].map_fd)
    assert reader.data_size == size
    submitted0, lost0 = counts(bpf)
    got: list[bytes] = []
    before = pin(0)
    try:
        # drain every 3 records (< 3 * 4104 bytes < ring size): nothing lost, the ring wraps
        produce(1, 600, seed=3, discard_every=5, wait=lambda seq: seq % 3 == 2 and got.extend(reader.drain()))
        got += reader.drain()
    finally:
        os.sched_setaffinity(0, before)
        reader.close()
    submitted, lost = counts(bpf)
    assert lost == lost0
    assert submitted - submitted0 == 600
    assert sum(len(r) for r in got) > 10 * size
    assert check_records(got) == {1: list(range(600))}


@pytest.mark.ebpf
def test_same_records_as_bcc_callback_path(bpf):
    module = load_compiled() if _compiled_built() else load_pure()
    before = pin(0)
    try:
        bcc_records: list[bytes] = []

        def on_record(_ctx, data, size):
            bcc_records.append(ctypes.string_at(data, size))
            return 0

        bpf[b"events"].open_ring_buffer(on_record)
        produce(2, 300, seed=11, discard_every=4, wait=lambda seq: seq % 3 == 2 and bpf.ring_buffer_consume())
        bpf.ring_buffer_consume()

        ours: list[bytes] = []
        reader = module.RingBufReader(bpf[b"events"].map_fd)
        try:
            produce(2, 300, seed=11, discard_every=4, wait=lambda seq: seq % 3 == 2 and ours.extend(reader.drain()))
            ours += reader.drain()
        finally:
            reader.close()
    finally:
        os.sched_setaffinity(0, before)
    assert len(bcc_records) == 300
    assert ours == bcc_records
    check_records(ours)


def _compiled_built() -> bool:
    import otelbpf.sources.ringbuf as module

    return bool(module.COMPILED)


@pytest.mark.ebpf
def test_two_cpus_producing_at_once(bpf, ringbuf):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    cpu_a, cpu_b = sorted(os.sched_getaffinity(0))[:2]
    count = 3000
    child = PRODUCER + (
        "import os, sys\n"
        "ident, cpu, count = map(int, sys.argv[1:4])\n"
        "os.sched_setaffinity(0, {cpu})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "produce(ident, count, seed=ident)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", child, str(ident), str(cpu), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for ident, cpu in ((10, cpu_a), (11, cpu_b))
    ]
    reader = ringbuf.RingBufReader(bpf[b"events"].map_fd)
    got: list[bytes] = []
    try:
        for p in procs:  # traced once started (Python's start-up calls getcwd too)
            assert p.stdout.readline() == b"ready\n"
            bpf[b"tgids"][ctypes.c_uint(p.pid)] = ctypes.c_ubyte(1)
        submitted0, lost0 = counts(bpf)
        for p in procs:
            p.stdin.write(b"go\n")
            p.stdin.flush()
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            got += reader.drain()
        for p in procs:
            assert p.wait(timeout=10) == 0
        got += reader.drain()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        reader.close()
    submitted, lost = counts(bpf)
    seqs = check_records(got, cpus={10: cpu_a, 11: cpu_b})
    # A 16 KiB ring, two producers and a reader on two CPUs: under load one producer can
    # find the ring full for every one of its records. What must hold either way: each
    # producer's records in order and once, every submitted record drained, the rest
    # counted lost, and nothing lost means everything from both.
    for ident in (10, 11):
        mine = seqs.get(ident, [])
        assert mine == sorted(mine)  # per producer (per CPU): in order
        assert len(set(mine)) == len(mine)
        if lost == lost0:
            assert mine == list(range(count))
    assert len(got) == submitted - submitted0  # everything submitted was drained once
    assert (submitted - submitted0) + (lost - lost0) == 2 * count
    assert len(got) > 0
