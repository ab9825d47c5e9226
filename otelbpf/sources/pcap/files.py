"""Reading capture files: pcap and pcapng packet records, and file errors.

dpkt reads the file headers; the packet records are walked here instead,
because dpkt's readers turn timestamps into floats (losing nanoseconds) and
cannot tell a record cut short by the end of the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from os import PathLike
from typing import BinaryIO, Iterator

import dpkt

from otelbpf.sources.pcap.link import LINK_DECODERS


class PcapError(Exception):
    """The file cannot be replayed: not a capture, corrupt, or of a link type
    this source does not decode. The message names the file and the reason."""


#: One captured packet: (unix-epoch ns, link type, the bytes captured).
Frame = tuple[int, int, bytes]

_PCAP_MAGICS = frozenset(dpkt.pcap.MAGIC_TO_PKT_HDR)
_PCAP_NANO_MAGICS = frozenset((dpkt.pcap.TCPDUMP_MAGIC_NANO, dpkt.pcap.PMUDPCT_MAGIC_NANO))
_PCAP_LE_MAGICS = frozenset((dpkt.pcap.PMUDPCT_MAGIC, dpkt.pcap.PMUDPCT_MAGIC_NANO, dpkt.pcap.PACPDOM_MAGIC))
_PCAPNG_SHB_BYTES = struct.pack(">I", dpkt.pcapng.PCAPNG_BT_SHB)
#: libpcap's own sanity bound on a record's captured length.
_MAX_SNAPLEN = 262144
_MAX_PCAPNG_BLOCK = 16 * 1024 * 1024


class CaptureReader:
    """An open capture file; subclasses walk its packet records."""

    def __init__(self, file: BinaryIO, path: str, stats: dict[str, int]) -> None:
        self._file = file
        self._path = path
        self._stats = stats

    def frames(self) -> Iterator[Frame]:
        raise NotImplementedError

    def close(self) -> None:
        self._file.close()

    def _cut_short(self) -> None:
        """The file ends inside a record: a capture still being written, or
        copied while it was. Everything before it is good; stop there."""
        self._stats["incomplete_records"] = 1


class _PcapReader(CaptureReader):
    """Classic libpcap format: one link type, fixed-size record headers."""

    def __init__(self, file: BinaryIO, path: str, stats: dict[str, int]) -> None:
        super().__init__(file, path, stats)
        raw = file.read(dpkt.pcap.FileHdr.__hdr_len__)
        if len(raw) < dpkt.pcap.FileHdr.__hdr_len__:
            raise PcapError(f"{path}: pcap file header cut short ({len(raw)} bytes)")
        magic = dpkt.pcap.FileHdr(raw).magic
        header = dpkt.pcap.LEFileHdr(raw) if magic in _PCAP_LE_MAGICS else dpkt.pcap.FileHdr(raw)
        record_header = dpkt.pcap.MAGIC_TO_PKT_HDR[magic]
        self._record_size = record_header.__hdr_len__
        # Only the first three fields are needed: seconds, fraction, captured length.
        self._record = struct.Struct(record_header.__hdr_fmt__[0] + "III")
        self._fraction_ns = 1 if magic in _PCAP_NANO_MAGICS else 1000
        self._max_caplen = max(header.snaplen, _MAX_SNAPLEN)
        self.link_type = header.linktype
        require_supported(path, [self.link_type])

    def frames(self) -> Iterator[Frame]:
        read, unpack, size = self._file.read, self._record.unpack_from, self._record_size
        fraction_ns, max_caplen, link_type = self._fraction_ns, self._max_caplen, self.link_type
        while True:
            header = read(size)
            if len(header) < size:
                if header:
                    self._cut_short()
                return
            seconds, fraction, caplen = unpack(header)
            if caplen > max_caplen:
                offset = self._file.tell() - size
                raise PcapError(
                    f"{self._path}: corrupt record at byte {offset}: captured length {caplen} "
                    f"exceeds the snap length {max_caplen}"
                )
            frame = read(caplen)
            if len(frame) < caplen:
                self._cut_short()
                return
            yield seconds * 1_000_000_000 + fraction * fraction_ns, link_type, frame


@dataclass(slots=True)
class _Interface:
    """What a pcapng Interface Description Block says about its packets."""

    link_type: int
    #: Timestamp units per second (if_tsresol; microseconds by default).
    units_per_second: int = 1_000_000
    offset_ns: int = 0  # if_tsoffset


class _PcapngReader(CaptureReader):
    """pcapng: sections of blocks, each section with its own byte order and
    interfaces (and so link types and timestamp units). Packets are read from
    Enhanced Packet Blocks; other blocks (statistics, name resolution, the
    rare Simple and obsolete Packet Blocks) are skipped."""

    def __init__(self, file: BinaryIO, path: str, stats: dict[str, int]) -> None:
        super().__init__(file, path, stats)
        self._interfaces: list[_Interface] = []
        self._order = "<"
        self._check_leading_interfaces()

    def _check_leading_interfaces(self) -> None:
        """Fail now, not midway, if no interface described before the first
        packet has a link type we decode; then rewind for :meth:`frames`."""
        for block_type, head, body in self._blocks():
            if block_type == dpkt.pcapng.PCAPNG_BT_EPB:
                if not self._interfaces:
                    raise PcapError(f"{self._path}: corrupt pcapng: a packet before any interface description")
                break
            self._read_description(block_type, head + body)
        if self._interfaces:
            require_supported(self._path, [i.link_type for i in self._interfaces])
        self._file.seek(0)
        self._interfaces.clear()

    def frames(self) -> Iterator[Frame]:
        interfaces = self._interfaces  # cleared, not replaced, by a new section
        epb_fields = struct.Struct(self._order + "IIII")
        for block_type, head, body in self._blocks():
            if block_type != dpkt.pcapng.PCAPNG_BT_EPB:
                if self._read_description(block_type, head + body):
                    epb_fields = struct.Struct(self._order + "IIII")
                continue
            # Enhanced Packet Block body: interface, timestamp (high, low),
            # captured length, original length, data, options, block length.
            interface_id, ts_high, ts_low, caplen = epb_fields.unpack_from(body)
            if interface_id >= len(interfaces) or 20 + caplen > len(body) - 4:
                raise PcapError(
                    f"{self._path}: corrupt packet block (interface {interface_id} of "
                    f"{len(interfaces)}, captured length {caplen}, block length {8 + len(body)})"
                )
            interface = interfaces[interface_id]
            ts_ns = ((ts_high << 32) | ts_low) * 1_000_000_000 // interface.units_per_second + interface.offset_ns
            yield ts_ns, interface.link_type, body[20 : 20 + caplen]

    def _read_description(self, block_type: int, block: bytes) -> bool:
        """Take in a section or interface description block; True if it
        began a new section (byte order may have changed)."""
        try:
            if block_type == dpkt.pcapng.PCAPNG_BT_SHB:
                self._start_section(block)
                return True
            if block_type == dpkt.pcapng.PCAPNG_BT_IDB:
                self._interfaces.append(self._describe_interface(block))
        except (dpkt.UnpackError, struct.error, ValueError) as error:
            raise PcapError(f"{self._path}: corrupt pcapng block of type {block_type:#x}: {error}") from None
        return False

    def _start_section(self, block: bytes) -> None:
        big_endian = self._order == ">"
        shb = dpkt.pcapng.SectionHeaderBlock(block) if big_endian else dpkt.pcapng.SectionHeaderBlockLE(block)
        if shb.v_major != dpkt.pcapng.PCAPNG_VERSION_MAJOR:
            raise PcapError(f"{self._path}: pcapng version {shb.v_major}.{shb.v_minor} is not supported")
        self._interfaces.clear()

    def _describe_interface(self, block: bytes) -> _Interface:
        big_endian = self._order == ">"
        idb = dpkt.pcapng.InterfaceDescriptionBlock(block) if big_endian else dpkt.pcapng.InterfaceDescriptionBlockLE(block)
        interface = _Interface(idb.linktype)
        for option in idb.opts:
            if option.code == dpkt.pcapng.PCAPNG_OPT_IF_TSRESOL and option.data:
                exponent = option.data[0]
                base = 2 if exponent & 0x80 else 10
                interface.units_per_second = base ** (exponent & 0x7F)
            elif option.code == dpkt.pcapng.PCAPNG_OPT_IF_TSOFFSET and len(option.data) == 8:
                interface.offset_ns = struct.unpack(self._order + "q", option.data)[0] * 1_000_000_000
        return interface

    def _blocks(self) -> Iterator[tuple[int, bytes, bytes]]:
        """(type, head, body) of each block in file order: the head is the
        type and length (and, for a section header, the byte-order magic),
        the body the rest. A section header sets the byte order that its own
        length and the blocks after it are written in."""
        read = self._file.read
        head_fields = struct.Struct(self._order + "II")
        while True:
            head = read(8)
            if len(head) < 8:
                if head:
                    self._cut_short()
                return
            block_type, length = head_fields.unpack(head)
            if block_type == dpkt.pcapng.PCAPNG_BT_SHB:  # same bytes in either order
                byte_order_magic = read(4)
                if len(byte_order_magic) < 4:
                    self._cut_short()
                    return
                self._order = _section_byte_order(self._path, byte_order_magic)
                head_fields = struct.Struct(self._order + "II")
                length = head_fields.unpack(head)[1]
                head += byte_order_magic
            if length < 12 or length % 4 or length > _MAX_PCAPNG_BLOCK:
                offset = self._file.tell() - len(head)
                raise PcapError(f"{self._path}: corrupt pcapng block at byte {offset}: length {length}")
            body = read(length - len(head))
            if len(body) < length - len(head):
                self._cut_short()
                return
            yield block_type, head, body


def _section_byte_order(path: str, byte_order_magic: bytes) -> str:
    if byte_order_magic == struct.pack(">I", dpkt.pcapng.BYTE_ORDER_MAGIC):
        return ">"
    if byte_order_magic == struct.pack("<I", dpkt.pcapng.BYTE_ORDER_MAGIC):
        return "<"
    raise PcapError(f"{path}: corrupt pcapng section header: byte-order magic {byte_order_magic.hex()}")


def open_capture(path: str | PathLike[str], stats: dict[str, int]) -> CaptureReader:
    """Open a pcap or pcapng file (told apart by content, not name) and check
    that its header is sound and its link type is one we decode."""
    name = str(path)
    file = open(name, "rb")
    try:
        magic = file.read(4)
        file.seek(0)
        if magic == _PCAPNG_SHB_BYTES:
            return _PcapngReader(file, name, stats)
        if len(magic) == 4 and struct.unpack(">I", magic)[0] in _PCAP_MAGICS:
            return _PcapReader(file, name, stats)
        raise PcapError(f"{name}: not a pcap or pcapng capture (starts with {magic.hex() or 'nothing'})")
    except BaseException:
        file.close()
        raise



def require_supported(path: str, link_types: list[int]) -> None:
    if not any(t in LINK_DECODERS for t in link_types):
        names = ", ".join(str(t) for t in link_types)
        raise PcapError(
            f"{path}: link type {names} is not supported (supported: Ethernet, Linux cooked SLL/SLL2, "
            "raw IP, BSD loopback)"
        )
