"""RTPS 2.x wire format: the message header, submessages and parameter lists.

Pure functions over bytes (OMG DDSI-RTPS 2.5, sections 8.3 and 9.4). A
message is ``RTPS`` + version + vendor id + GUID prefix, then submessages,
each with its own endianness flag (so one datagram may mix both). Only what
tracing needs is decoded: INFO_TS, INFO_DST, DATA, DATA_FRAG, HEARTBEAT,
ACKNACK and GAP; other submessages are skipped by their length.

Everything raises :class:`RtpsError` on malformed input; the session turns
that into a counted parse error, never an exception out of the protocol.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAGIC = b"RTPS"
HEADER_SIZE = 20

# Submessage ids (9.4.5.1.1)
PAD = 0x01
ACKNACK = 0x06
HEARTBEAT = 0x07
GAP = 0x08
INFO_TS = 0x09
INFO_SRC = 0x0C
INFO_DST = 0x0E
DATA = 0x15
DATA_FRAG = 0x16
#: Submessage ids from here up are vendor-specific (9.4.5.1.1): Fast DDS ends
#: every message with one (0x80, its statistics data); others skip them.
VENDOR_SPECIFIC = 0x80

FLAG_E = 0x01  # little-endian submessage
FLAG_DATA_Q = 0x02  # DATA/DATA_FRAG: inline QoS present
FLAG_DATA_D = 0x04  # DATA: serialized data present
FLAG_DATA_K = 0x08  # DATA: serialized key present
FLAG_INFO_TS_I = 0x02  # INFO_TS: no timestamp (invalidate)

PID_SENTINEL = 0x0001
PID_PAD = 0x0000
PID_TOPIC_NAME = 0x0005
PID_TYPE_NAME = 0x0007
PID_PARTICIPANT_GUID = 0x0050
PID_ENDPOINT_GUID = 0x005A
PID_KEY_HASH = 0x0070
PID_STATUS_INFO = 0x0071
PID_DEFAULT_UNICAST_LOCATOR = 0x0031
PID_METATRAFFIC_UNICAST_LOCATOR = 0x0032

#: Locator kinds (9.3.2): UDP/IPv4 and IPv6 are 1 and 2; Fast DDS announces its
#: shared-memory transport's locators as kind 16 (LOCATOR_KIND_SHM).
LOCATOR_KIND_FASTDDS_SHM = 16

#: Vendor ids of the RTPS header (the OMG's DDSI-RTPS vendor id list), for span attributes.
VENDORS = {
    b"\x01\x01": "RTI Connext DDS",
    b"\x01\x02": "ADLINK OpenSplice DDS",
    b"\x01\x03": "OCI OpenDDS",
    b"\x01\x06": "Twin Oaks CoreDX DDS",
    b"\x01\x0f": "eProsima Fast DDS",
    b"\x01\x10": "Eclipse Cyclone DDS",
    b"\x01\x11": "GurumNetworks GurumDDS",
    b"\x01\x12": "Atostek RustDDS",
}

#: Seconds between the NTP-like RTPS Time_t fraction and nanoseconds.
_FRACTION = 1 << 32


class RtpsError(ValueError):
    """Input that is not well-formed RTPS (counted by the session)."""


@dataclass(slots=True)
class Header:
    version: tuple[int, int]
    vendor_id: bytes  # 2 bytes
    guid_prefix: bytes  # 12 bytes


@dataclass(slots=True)
class DataSubmessage:
    """DATA or DATA_FRAG: one sample (or a fragment of one) from a writer."""

    reader_id: bytes
    writer_id: bytes
    sequence: int
    inline_qos: bytes  # raw parameter list, "" when absent
    little_endian: bool
    payload: bytes  # serialized payload (DATA) or fragment bytes (DATA_FRAG)
    #: DATA_FRAG only: first fragment number (1-based), fragments carried,
    #: fragment size and whole sample size; 0 for DATA.
    fragment_start: int = 0
    fragments: int = 0
    fragment_size: int = 0
    sample_size: int = 0
    #: Bytes of this submessage beyond what was captured (truncated datagram).
    missing: int = 0

    @property
    def fragmented(self) -> bool:
        return self.fragment_size > 0


@dataclass(slots=True)
class Heartbeat:
    reader_id: bytes
    writer_id: bytes
    first: int
    last: int
    count: int


@dataclass(slots=True)
class AckNack:
    reader_id: bytes
    writer_id: bytes
    base: int
    missing: list[int]
    count: int


@dataclass(slots=True)
class Gap:
    reader_id: bytes
    writer_id: bytes
    start: int
    #: Sequence numbers that will never come (irrelevant, not lost).
    irrelevant: list[int]


@dataclass(slots=True)
class InfoTimestamp:
    #: Unix time in nanoseconds, or None when the submessage invalidates it.
    time_ns: int | None


@dataclass(slots=True)
class InfoDestination:
    guid_prefix: bytes


@dataclass(slots=True)
class Message:
    header: Header
    submessages: list = field(default_factory=list)
    #: Submessages skipped because they were unknown or cut by truncation.
    skipped: int = 0


def parse_header(data: bytes) -> Header:
    if len(data) < HEADER_SIZE or data[:4] != MAGIC:
        raise RtpsError("not an RTPS message")
    major, minor = data[4], data[5]
    if major != 2:
        raise RtpsError(f"unsupported RTPS version {major}.{minor}")
    return Header((major, minor), bytes(data[6:8]), bytes(data[8:20]))


def parse_message(data: bytes, missing: int = 0) -> Message:
    """Decode one datagram. ``missing`` bytes followed ``data`` but were not
    captured: a submessage that runs into them is kept when its fixed part
    was captured (DATA headers), and counted as skipped otherwise."""
    message = Message(parse_header(data))
    offset = HEADER_SIZE
    end = len(data)
    while offset + 4 <= end:
        kind, flags = data[offset], data[offset + 1]
        little = bool(flags & FLAG_E)
        (length,) = struct.unpack_from("<H" if little else ">H", data, offset + 2)
        body_start = offset + 4
        if length == 0 and kind not in (PAD, INFO_TS):
            body_end = end + missing  # the last submessage: runs to the end of the message
        else:
            body_end = body_start + length
        cut = max(0, body_end - end)
        body = data[body_start : min(body_end, end)]
        try:
            item = _submessage(kind, flags, little, body, cut)
        except (struct.error, IndexError) as exc:
            if cut:
                message.skipped += 1
                break
            raise RtpsError(f"malformed submessage 0x{kind:02x}") from exc
        if item is None:
            message.skipped += kind not in (PAD, INFO_SRC) and kind < VENDOR_SPECIFIC
        else:
            message.submessages.append(item)
        if cut:
            break
        offset = body_end
    return message


def _submessage(kind: int, flags: int, little: bool, body: bytes, cut: int):
    e = "<" if little else ">"
    if kind == DATA:
        return _data(flags, little, body, cut)
    if kind == DATA_FRAG:
        return _data_frag(flags, little, body, cut)
    if kind == INFO_TS:
        if flags & FLAG_INFO_TS_I:
            return InfoTimestamp(None)
        seconds, fraction = struct.unpack_from(e + "iI", body, 0)
        return InfoTimestamp(seconds * 1_000_000_000 + (fraction * 1_000_000_000) // _FRACTION)
    if kind == INFO_DST:
        if len(body) < 12:
            raise IndexError
        return InfoDestination(bytes(body[:12]))
    if kind == HEARTBEAT:
        reader, writer = bytes(body[0:4]), bytes(body[4:8])
        first, last = _sequence(body, 8, e), _sequence(body, 16, e)
        (count,) = struct.unpack_from(e + "i", body, 24)
        return Heartbeat(reader, writer, first, last, count)
    if kind == ACKNACK:
        reader, writer = bytes(body[0:4]), bytes(body[4:8])
        base, members, after = _sequence_set(body, 8, e)
        (count,) = struct.unpack_from(e + "i", body, after)
        return AckNack(reader, writer, base, members, count)
    if kind == GAP:
        reader, writer = bytes(body[0:4]), bytes(body[4:8])
        start = _sequence(body, 8, e)
        base, members, _ = _sequence_set(body, 16, e)
        irrelevant = list(range(start, base)) if 0 < base - start <= 4096 else []
        return Gap(reader, writer, start, irrelevant + members)
    return None


def _sequence(body: bytes, offset: int, e: str) -> int:
    high, low = struct.unpack_from(e + "iI", body, offset)
    return (high << 32) | low


def _sequence_set(body: bytes, offset: int, e: str) -> tuple[int, list[int], int]:
    """A SequenceNumberSet: (bitmap base, members, offset after it)."""
    base = _sequence(body, offset, e)
    (bits,) = struct.unpack_from(e + "I", body, offset + 8)
    if bits > 256:
        raise RtpsError("sequence number set larger than 256")
    words = (bits + 31) // 32
    bitmap = struct.unpack_from(e + "%dI" % words, body, offset + 12)
    members = [base + i for i in range(bits) if bitmap[i // 32] & (1 << (31 - i % 32))]
    return base, members, offset + 12 + 4 * words


def _data_common(flags: int, little: bool, body: bytes, fixed: int):
    e = "<" if little else ">"
    (to_qos,) = struct.unpack_from(e + "H", body, 2)
    reader, writer = bytes(body[4:8]), bytes(body[8:12])
    sequence = _sequence(body, 12, e)
    if len(body) < fixed:
        raise IndexError
    position = 4 + to_qos
    inline_qos = b""
    if flags & FLAG_DATA_Q:
        qos_end = parameter_list_end(body, position, little)
        inline_qos = bytes(body[position:qos_end])
        position = qos_end
    return reader, writer, sequence, inline_qos, position


def _data(flags: int, little: bool, body: bytes, cut: int) -> DataSubmessage:
    reader, writer, sequence, qos, position = _data_common(flags, little, body, 20)
    payload = bytes(body[position:]) if flags & (FLAG_DATA_D | FLAG_DATA_K) else b""
    return DataSubmessage(reader, writer, sequence, qos, little, payload, missing=cut)


def _data_frag(flags: int, little: bool, body: bytes, cut: int) -> DataSubmessage:
    e = "<" if little else ">"
    reader, writer, sequence, qos, position = _data_common(flags, little, body, 32)
    start, count, size, sample = struct.unpack_from(e + "IHHI", body, 20)
    if start == 0 or size == 0 or count == 0:
        raise RtpsError("DATA_FRAG without fragments")
    return DataSubmessage(
        reader, writer, sequence, qos, little, bytes(body[position:]), start, count, size, sample, missing=cut
    )


def parameter_list_end(body: bytes, offset: int, little: bool) -> int:
    """Offset just after the PID_SENTINEL of the parameter list at ``offset``."""
    e = "<H" if little else ">H"
    while True:
        (pid,) = struct.unpack_from(e, body, offset)
        (length,) = struct.unpack_from(e, body, offset + 2)
        offset += 4
        if pid == PID_SENTINEL:
            return offset
        offset += length
        if offset > len(body):
            raise IndexError


def parameters(body: bytes, little: bool) -> list[tuple[int, bytes]]:
    """(pid, value) pairs of a parameter list (up to its sentinel or end)."""
    e = "<HH" if little else ">HH"
    out = []
    offset = 0
    while offset + 4 <= len(body):
        pid, length = struct.unpack_from(e, body, offset)
        offset += 4
        if pid == PID_SENTINEL:
            break
        value = body[offset : offset + length]
        if len(value) != length:
            raise RtpsError("parameter runs past the end")
        out.append((pid & 0x3FFF, bytes(value)))  # low 14 bits: the id (vendor/must-understand bits off)
        offset += length
    return out


def vendor_name(vendor_id: bytes) -> str:
    """The vendor's name, or its id in hex (``0x0abc``) when the list lacks it."""
    return VENDORS.get(vendor_id) or "0x" + vendor_id.hex()


def locator_kinds(parameter_list: list[tuple[int, bytes]], little: bool) -> set[int]:
    """Kinds of the unicast locators (user and discovery traffic) a participant announces."""
    e = "<i" if little else ">i"
    return {
        struct.unpack_from(e, value, 0)[0]
        for pid, value in parameter_list
        if pid in (PID_DEFAULT_UNICAST_LOCATOR, PID_METATRAFFIC_UNICAST_LOCATOR) and len(value) == 24
    }


def cdr_string(value: bytes, little: bool) -> str:
    """A CDR string parameter: uint32 length (with the NUL), then the bytes."""
    if len(value) < 4:  # an empty or cut parameter: malformed input, not a crash of the caller
        raise RtpsError("string parameter shorter than its length")
    (length,) = struct.unpack_from("<I" if little else ">I", value, 0)
    if length == 0 or length > len(value) - 4:
        raise RtpsError("bad string parameter")
    return value[4 : 4 + length].rstrip(b"\x00").decode("utf-8", "replace")


def encapsulation(payload: bytes) -> tuple[bool, bool]:
    """(is a parameter list, little-endian) from a serialized payload's 4-byte header."""
    if len(payload) < 4:
        raise RtpsError("serialized payload too short")
    scheme = payload[1] | (payload[0] << 8)
    if scheme not in (0, 1, 2, 3, 6, 7, 8, 9, 10, 11):
        raise RtpsError(f"unknown encapsulation 0x{scheme:04x}")
    return scheme in (2, 3, 10, 11), bool(scheme & 1)


def time_ns_to_rtps(ts_ns: int) -> tuple[int, int]:
    """(seconds, fraction) of an RTPS Time_t: for building test messages."""
    seconds, rest = divmod(ts_ns, 1_000_000_000)
    return seconds, (rest * _FRACTION + 999_999_999) // 1_000_000_000
