"""NCCL's communicator id (``commHash``), from the ``ncclUniqueId`` every rank passes.

``ncclCommInitRank(comm, nranks, id, rank)`` (and ``ncclCommInitRankConfig``) gets
the same 128 bytes on every rank of a communicator: the application broadcasts the
id that the root's ``ncclGetUniqueId`` made. NCCL hashes those bytes into
``comm->commHash`` (src/init.cc), the value its RAS reports as the communicator's
``hash`` and its profiler plugins receive. Computing it from the id read at the
call gives every rank, on every node, one name for the communicator, which is
NCCL's own.

The hash changed with NCCL 2.26: before, DJB2a over the bytes as C ``char``
(signed on x86-64, unsigned on arm64); from 2.26, a two-word accumulator fed 8
bytes at a time and folded. Communicators made by ``ncclCommSplit`` or grown
(2.29+) hash other inputs: they are not covered (their set-up call takes no id).
"""

from __future__ import annotations

UNIQUE_ID_BYTES = 128
_MASK = (1 << 64) - 1
#: The first NCCL version that hashes the id with the accumulator.
ACCUMULATOR_SINCE = (2, 26, 0)


def comm_hash(unique_id: bytes, version: tuple[int, int, int] | None = None, signed_char: bool = True) -> int:
    """``commHash`` of ``unique_id`` as NCCL ``version`` computes it (None: a current NCCL,
    2.26 or later). ``signed_char``: whether C ``char`` is signed on the job's machine
    (x86-64: yes, arm64: no), which only NCCL before 2.26 depends on."""
    if version is None or tuple(version) >= ACCUMULATOR_SINCE:
        return accumulator_hash(unique_id)
    return djb2a_hash(unique_id, signed_char)


def accumulator_hash(data: bytes) -> int:
    """NCCL >= 2.26's ``getHash`` (``eatHash`` into ``{1, 1}``, then ``digestHash``)."""
    a, b = 1 ^ len(data), 1
    for start in range(0, len(data), 8):
        a = (a + b) & _MASK
        b ^= a
        a ^= a >> 31
        a = (a * 0x9DE62BBC8CEF3CE3) & _MASK
        b ^= b >> 32
        b = (b * 0x485CD6311B599E79) & _MASK
        a = (a + int.from_bytes(data[start : start + 8], "little")) & _MASK
    h = a ^ (a >> 31)
    h = (h * 0xBAC3BD562846DE6B) & _MASK
    h = (h + b) & _MASK
    h ^= h >> 32
    return (h * 0x995A187A14E7B445) & _MASK


def djb2a_hash(data: bytes, signed_char: bool = True) -> int:
    """NCCL 2.19-2.25's ``getHash``: ``h = h * 33 ^ c`` from 5381, ``c`` a C ``char``
    widened to 64 bits (sign-extended where ``char`` is signed)."""
    h = 5381
    for byte in data:
        c = byte - 256 if signed_char and byte >= 128 else byte
        h = ((h * 33) & _MASK) ^ (c & _MASK)
    return h


def format_comm_hash(value: int) -> str:
    """The 16 hex digits RAS prints in its text report (``%016lx``, no ``0x``)."""
    return f"{value & _MASK:016x}"
