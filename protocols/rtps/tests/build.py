"""Builds RTPS messages byte by byte (either endianness) for the tests, from the spec."""

from __future__ import annotations

import struct

from protocols.rtps import wire
from protocols.rtps.discovery import SEDP_PUBLICATIONS_WRITER, SEDP_SUBSCRIPTIONS_WRITER

PREFIX_A = bytes.fromhex("0110aaaa000000000000000a")
PREFIX_B = bytes.fromhex("0110bbbb000000000000000b")
USER_WRITER = bytes.fromhex("00000103")
USER_READER = bytes.fromhex("00000104")
CYCLONE = b"\x01\x10"


def header(prefix: bytes = PREFIX_A, vendor: bytes = CYCLONE) -> bytes:
    return wire.MAGIC + bytes([2, 1]) + vendor + prefix


def submessage(kind: int, body: bytes, little: bool = True, flags: int = 0) -> bytes:
    flags |= wire.FLAG_E if little else 0
    return struct.pack("<BBH" if little else ">BBH", kind, flags, len(body)) + body


def sn(value: int, little: bool) -> bytes:
    return struct.pack("<iI" if little else ">iI", value >> 32, value & 0xFFFFFFFF)


def info_ts(ts_ns: int, little: bool = True) -> bytes:
    seconds, fraction = wire.time_ns_to_rtps(ts_ns)
    return submessage(wire.INFO_TS, struct.pack("<iI" if little else ">iI", seconds, fraction), little)


def info_dst(prefix: bytes, little: bool = True) -> bytes:
    return submessage(wire.INFO_DST, prefix, little)


def data(writer: bytes, seq: int, payload: bytes, little: bool = True, qos: bytes = b"", reader: bytes = b"\0" * 4) -> bytes:
    e = "<H" if little else ">H"
    body = b"\0\0" + struct.pack(e, 16) + reader + writer + sn(seq, little) + qos + payload
    flags = wire.FLAG_DATA_D | (wire.FLAG_DATA_Q if qos else 0)
    return submessage(wire.DATA, body, little, flags)


def data_frag(writer: bytes, seq: int, first: int, chunk: bytes, fragment_size: int, sample_size: int, little: bool = True) -> bytes:
    e = "<" if little else ">"
    count = max(1, -(-len(chunk) // fragment_size))
    body = (
        b"\0\0" + struct.pack(e + "H", 28) + b"\0" * 4 + writer + sn(seq, little)
        + struct.pack(e + "IHHI", first, count, fragment_size, sample_size) + chunk
    )  # fmt: skip
    return submessage(wire.DATA_FRAG, body, little)


def heartbeat(writer: bytes, first: int, last: int, little: bool = True) -> bytes:
    body = b"\0" * 4 + writer + sn(first, little) + sn(last, little) + struct.pack("<i" if little else ">i", 1)
    return submessage(wire.HEARTBEAT, body, little)


def sequence_set(base: int, members: list[int], little: bool) -> bytes:
    bits = max((m - base + 1 for m in members), default=0)
    words = [0] * ((bits + 31) // 32)
    for m in members:
        i = m - base
        words[i // 32] |= 1 << (31 - i % 32)
    e = "<" if little else ">"
    return sn(base, little) + struct.pack(e + "I", bits) + b"".join(struct.pack(e + "I", w) for w in words)


def acknack(writer: bytes, base: int, missing: list[int], little: bool = True) -> bytes:
    body = USER_READER + writer + sequence_set(base, missing, little) + struct.pack("<i" if little else ">i", 3)
    return submessage(wire.ACKNACK, body, little)


def gap(writer: bytes, start: int, base: int, members: list[int], little: bool = True) -> bytes:
    body = USER_READER + writer + sn(start, little) + sequence_set(base, members, little)
    return submessage(wire.GAP, body, little)


def parameter(pid: int, value: bytes, little: bool) -> bytes:
    value += b"\0" * (-len(value) % 4)
    return struct.pack("<HH" if little else ">HH", pid, len(value)) + value


def cdr_string(text: str, little: bool) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<I" if little else ">I", len(raw)) + raw


def announcement(guid: bytes, topic: str, type_name: str, little: bool = True) -> bytes:
    """A SEDP serialized payload (PL_CDR) announcing an endpoint."""
    params = (
        parameter(wire.PID_ENDPOINT_GUID, guid, little)
        + parameter(wire.PID_TOPIC_NAME, cdr_string(topic, little), little)
        + parameter(wire.PID_TYPE_NAME, cdr_string(type_name, little), little)
        + struct.pack("<HH" if little else ">HH", wire.PID_SENTINEL, 0)
    )
    return (b"\x00\x03" if little else b"\x00\x02") + b"\0\0" + params


def announce_writer(prefix: bytes, writer: bytes, topic: str, type_name: str = "T_", little: bool = True, seq: int = 1) -> bytes:
    payload = announcement(prefix + writer, topic, type_name, little)
    return header(prefix) + data(SEDP_PUBLICATIONS_WRITER, seq, payload, little)


def announce_reader(prefix: bytes, reader: bytes, topic: str, type_name: str = "T_", little: bool = True, seq: int = 1) -> bytes:
    payload = announcement(prefix + reader, topic, type_name, little)
    return header(prefix) + data(SEDP_SUBSCRIPTIONS_WRITER, seq, payload, little)


def sample(prefix: bytes, writer: bytes, seq: int, size: int = 16, ts_ns: int = 0, little: bool = True) -> bytes:
    payload = b"\x00\x01\x00\x00" + b"x" * size
    return header(prefix) + (info_ts(ts_ns, little) if ts_ns else b"") + data(writer, seq, payload, little)
