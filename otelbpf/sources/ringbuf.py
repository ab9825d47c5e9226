"""Reads a BPF ring buffer map directly from its memory mapping, no callback per record.

BCC's ``open_ring_buffer`` + ``ring_buffer_consume`` calls back into Python through
ctypes once per record (~4 us each). :class:`RingBufReader` maps the ring the way
libbpf does (``ring_buffer__add`` / ``ringbuf_process_ring`` in libbpf's ringbuf.c)
and :meth:`RingBufReader.drain` returns every committed record since the last call
as a ``list`` of ``bytes`` in one call: the list the record decoder already takes.

The protocol (kernel/bpf/ringbuf.c, include/uapi/linux/bpf.h):

* offset 0, one page, read-write: ``consumer_pos`` (u64), written only by us;
* offset page_size, one page, read-only: ``producer_pos`` (u64), written by the
  kernel with a release store once a record is *reserved*;
* then the data area, ``max_entries`` bytes (a power-of-two multiple of the page
  size), which the kernel maps twice back to back: map ``page + 2 * size`` bytes and
  a record that wraps past the end is contiguous in memory (Python's ``mmap`` can do
  this too: the doubling is done by the kernel's mapping, not by the caller).
* each record: an 8-byte header (u32 ``len``, u32 page offset) then ``len`` bytes,
  padded to 8. ``len`` carries BPF_RINGBUF_BUSY_BIT (reserved, not yet committed)
  and BPF_RINGBUF_DISCARD_BIT (discarded: skip it). Producers on several CPUs
  reserve in order but commit in any order, so the reader stops at the first busy
  record and resumes there next time.
* positions only grow; ``pos & (size - 1)`` is the offset in the data area.
* the consumer loads ``producer_pos`` and each ``len`` with acquire semantics, copies
  the record, and only then stores ``consumer_pos`` with release semantics (the
  kernel may reuse the space as soon as it sees it). We release every
  ``release_bytes`` consumed and at the end of each drain, rather than after every
  record as libbpf does: a store per record would bounce the cache line the
  producers read on every reserve.

One source, two builds: this file runs as plain Python (``mmap`` + ``struct``) and is
compiled by Cython (see setup.py; types in ringbuf.pxd) so that the loop is C with
real acquire/release atomics. The two differ only in the ``if cython.compiled``
branches that touch memory. The plain-Python build relies on x86's ordering (TSO) for
acquire/release; on weakly ordered CPUs use the compiled build.

Only one consumer may read a ring at a time (no BCC ``open_ring_buffer`` on the same map).
"""

from __future__ import annotations

import mmap
import struct

try:
    import cython
except ImportError:  # Cython not installed: run as plain Python

    class cython:  # type: ignore[no-redef]  # noqa: N801 - stands in for the module
        compiled = False


#: True when this module is the Cython-compiled extension (tests/test_compiled.py checks it).
COMPILED = cython.compiled

BPF_MAP_TYPE_RINGBUF = 27
BPF_RINGBUF_BUSY_BIT = 1 << 31
BPF_RINGBUF_DISCARD_BIT = 1 << 30
BPF_RINGBUF_HDR_SZ = 8

_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")


class RingBufError(OSError):
    """The fd is not a BPF ring buffer map, or it could not be mapped."""


def map_info(map_fd: int) -> dict[str, int]:
    """``/proc/self/fdinfo`` of a BPF map fd: map_type, max_entries, ..."""
    info: dict[str, int] = {}
    try:
        with open(f"/proc/self/fdinfo/{map_fd}") as f:
            for line in f:
                key, _, value = line.partition(":")
                value = value.strip()
                if value.isdigit():
                    info[key.strip()] = int(value)
    except OSError as exc:
        raise RingBufError(f"fd {map_fd}: cannot read its fdinfo: {exc}") from exc
    return info


class RingBufReader:
    """Consumer side of one BPF ring buffer map (``BPF_MAP_TYPE_RINGBUF``).

    ``RingBufReader(bpf["events"].map_fd)``; then :meth:`drain` on a timer. The size
    comes from the map's fdinfo unless ``data_size`` is given.
    """

    def __init__(self, map_fd: int, data_size: int = 0, release_bytes: int = 65536) -> None:
        page = mmap.PAGESIZE
        info = map_info(map_fd)
        if info.get("map_type", BPF_MAP_TYPE_RINGBUF) != BPF_MAP_TYPE_RINGBUF:
            raise RingBufError(f"fd {map_fd}: map type {info.get('map_type')} is not a ring buffer")
        size = data_size or info.get("max_entries", 0)
        if size <= 0 or size & (size - 1) or size % page:
            raise RingBufError(f"fd {map_fd}: ring size {size} is not a power-of-two multiple of {page}")
        self._viewing = False
        self.data_size = size
        self._mask = size - 1
        self._page = page
        self._release_bytes = max(8, min(release_bytes, size // 4))
        try:
            self._cons_map = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self._prod_map = mmap.mmap(map_fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        except (OSError, ValueError) as exc:
            raise RingBufError(f"fd {map_fd}: mmap of the ring buffer failed: {exc}") from exc
        if cython.compiled:
            PyObject_GetBuffer(self._cons_map, cython.address(self._cons_view), PyBUF_WRITABLE)
            try:
                PyObject_GetBuffer(self._prod_map, cython.address(self._prod_view), PyBUF_SIMPLE)
            except BaseException:
                PyBuffer_Release(cython.address(self._cons_view))
                raise
            self._viewing = True
            self._cons = cython.cast(cython.p_uchar, self._cons_view.buf)
            self._prod = cython.cast(cython.p_uchar, self._prod_view.buf)
            self._data = self._prod + self._page

    # -- memory access: the only code that differs between the two builds ---------

    def _load_producer(self) -> int:
        if cython.compiled:
            return rb_load_acquire_u64(self._prod)
        else:
            return _U64.unpack_from(self._prod_map, 0)[0]

    def _load_consumer(self) -> int:
        if cython.compiled:
            return rb_load_acquire_u64(self._cons)
        else:
            return _U64.unpack_from(self._cons_map, 0)[0]

    def _store_consumer(self, pos: int) -> None:
        if cython.compiled:
            rb_store_release_u64(self._cons, pos)
        else:
            _U64.pack_into(self._cons_map, 0, pos)

    def _load_len(self, offset: int) -> int:
        if cython.compiled:
            return rb_load_acquire_u32(self._data + offset)
        else:
            return _U32.unpack_from(self._prod_map, self._page + offset)[0]

    def _copy(self, offset: int, length: int) -> bytes:
        if cython.compiled:
            return PyBytes_FromStringAndSize(cython.cast(cython.p_char, self._data + offset), length)
        else:
            start = self._page + offset
            return self._prod_map[start : start + length]

    # -- the consumer loop ------------------------------------------------------

    def drain(self) -> list:
        """Every record committed since the last call, oldest first, as ``bytes``.

        Discarded records are skipped; the first record still busy (reserved, not yet
        committed: another CPU is writing it) ends the batch and is read next time.
        The producer position is read once per call, so one call reads at most one
        ring's worth; what is reserved after that is read by the next call.
        """
        out = []
        self._consume(out)
        return out

    def drain_decoded(self, decoder) -> list:
        """What ``decoder.decode(self.drain())`` returns (``decoder``: an
        ``ebpf_layout.RecordDecoder``), without the ``bytes`` copy of every record:
        compiled, each record is decoded where it lies in the ring, and a data record's
        payload is copied once, straight into its event. The space is released only
        after its record is decoded, as drain() releases it after the copy."""
        if cython.compiled:
            out = []
            self._consume(out, decoder)
            return out
        else:
            return decoder.decode(self.drain())

    def skip(self) -> int:
        """Consume what :meth:`drain` would return without copying it; how many records.

        For ``otelbpf run --discard-events``: the kernel capture's cost with a consumer
        that keeps up, and no per-record work of its own in the traced app's way."""
        return self._consume(None)

    def _consume(self, out: list | None, decoder=None) -> int:
        """The consumer loop: appends each committed record to ``out`` (None: copies
        nothing), or, given a ``decoder`` (compiled build only: drain_decoded), its
        events; releases the space, returns how many records it passed."""
        if not self._viewing and (self._prod_map is None or self._prod_map.closed):
            raise ValueError("ring buffer reader is closed")
        busy = BPF_RINGBUF_BUSY_BIT
        discard = BPF_RINGBUF_DISCARD_BIT
        hdr = BPF_RINGBUF_HDR_SZ
        mask = self._mask
        records = 0
        cons = self._load_consumer()
        released = cons
        prod = self._load_producer()
        while cons < prod:
            header = self._load_len(cons & mask)
            if header & busy:
                break
            length = header & ~(busy | discard)
            if not header & discard:
                records += 1
                if decoder is not None:
                    if cython.compiled:
                        decoder.decode_at(self._data + (cons & mask) + hdr, length, None, out)
                elif out is not None:
                    out.append(self._copy((cons & mask) + hdr, length))
            cons += (length + hdr + 7) & ~7
            if cons - released >= self._release_bytes:
                self._store_consumer(cons)
                released = cons
        if cons != released:
            self._store_consumer(cons)
        return records

    def pending_bytes(self) -> int:
        """Bytes reserved by producers and not yet consumed (committed or not)."""
        return self._load_producer() - self._load_consumer()

    def close(self) -> None:
        if cython.compiled:
            if self._viewing:
                self._viewing = False
                PyBuffer_Release(cython.address(self._prod_view))
                PyBuffer_Release(cython.address(self._cons_view))
        for m in (self._prod_map, self._cons_map):
            if m is not None:
                m.close()
        self._prod_map = None
        self._cons_map = None

    def __enter__(self) -> RingBufReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __dealloc__(self) -> None:  # compiled: C-level dealloc; plain Python: never called
        if cython.compiled:
            if self._viewing:
                self._viewing = False
                PyBuffer_Release(cython.address(self._prod_view))
                PyBuffer_Release(cython.address(self._cons_view))
