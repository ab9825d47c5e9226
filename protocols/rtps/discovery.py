"""What discovery says: which topic and type each writer and reader GUID serves.

SEDP (the builtin publications and subscriptions writers) announces every
user endpoint with PID_ENDPOINT_GUID, PID_TOPIC_NAME and PID_TYPE_NAME; SPDP
announces participants. Both are re-sent periodically, so an agent started
after a writer was created learns its topic at the next resend.

One :class:`Directory` is shared by every RTPS session of the agent (the
announcement of a writer crosses other sockets than its data), so it is
bounded: the oldest entries go first. Pure: fed decoded submessages, no I/O.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

from protocols.rtps import wire

# Builtin entity ids (9.3.1.4): the SEDP writers whose DATA announce endpoints.
SPDP_WRITER = bytes.fromhex("000100c2")
SEDP_PUBLICATIONS_WRITER = bytes.fromhex("000003c2")
SEDP_SUBSCRIPTIONS_WRITER = bytes.fromhex("000004c2")

MAX_ENDPOINTS = 16384
MAX_PARTICIPANTS = 4096

#: PID_STATUS_INFO bits: the endpoint was disposed / unregistered (it is gone).
_STATUS_GONE = 0x3


def is_builtin(entity_id: bytes) -> bool:
    """Builtin entities (discovery, liveliness) have the 0xc0 kind bits set."""
    return len(entity_id) == 4 and (entity_id[3] & 0xC0) == 0xC0


def guid_text(guid: bytes) -> str:
    """A GUID as Wireshark and the DDS tools print it: prefix words, then entity id."""
    h = guid.hex()
    return ".".join(h[i : i + 8] for i in range(0, len(h), 8))


@dataclass(slots=True)
class Endpoint:
    guid: bytes
    topic: str
    type_name: str
    writer: bool


class Directory:
    """GUID -> topic and type, readers per topic, participants seen (bounded)."""

    def __init__(self) -> None:
        self._endpoints: OrderedDict[bytes, Endpoint] = OrderedDict()
        self._readers: dict[str, set[bytes]] = {}
        #: Participants announced by SPDP (GUID prefix -> last seen time).
        self.participants: OrderedDict[bytes, int] = OrderedDict()
        #: Participants whose SPDP announced a shared-memory locator (GUID prefixes).
        self._shared_memory: OrderedDict[bytes, None] = OrderedDict()
        #: Discovery submessages that could not be decoded.
        self.errors = 0

    def endpoint(self, guid: bytes) -> Endpoint | None:
        return self._endpoints.get(guid)

    def readers(self, topic: str) -> int:
        """How many readers of ``topic`` discovery has announced."""
        return len(self._readers.get(topic, ()))

    def has_reader_outside(self, topic: str, prefix: bytes) -> bool:
        """Does a participant other than ``prefix`` read ``topic``?"""
        return any(guid[:12] != prefix for guid in self._readers.get(topic, ()))

    def __len__(self) -> int:
        return len(self._endpoints)

    def learn(self, writer_prefix: bytes, data: wire.DataSubmessage, payload: bytes, ts_ns: int) -> Endpoint | None:
        """Take in a builtin DATA (whole serialized payload); the endpoint it announced, if any."""
        writer_id = data.writer_id
        if writer_id == SPDP_WRITER:
            self._remember_participant(writer_prefix, ts_ns)
            self._note_shared_memory(writer_prefix, payload)
            return None
        if writer_id not in (SEDP_PUBLICATIONS_WRITER, SEDP_SUBSCRIPTIONS_WRITER):
            return None
        try:
            return self._learn_endpoint(data, payload, writer_id == SEDP_PUBLICATIONS_WRITER)
        except (wire.RtpsError, IndexError, ValueError):
            self.errors += 1
            return None

    def _remember_participant(self, prefix: bytes, ts_ns: int) -> None:
        self.participants[prefix] = ts_ns
        self.participants.move_to_end(prefix)
        if len(self.participants) > MAX_PARTICIPANTS:
            self.participants.popitem(last=False)

    def _note_shared_memory(self, prefix: bytes, payload: bytes) -> None:
        """Remember whether a participant announces a shared-memory locator (Fast DDS's
        default transport): its samples to local peers that have one too skip sockets.
        A cut announcement (b"") says nothing: what was known stays."""
        if not payload:
            return
        try:
            is_list, little = wire.encapsulation(payload)
            kinds = wire.locator_kinds(wire.parameters(payload[4:], little), little) if is_list else set()
        except (wire.RtpsError, struct.error):
            kinds = set()  # a disposal (key only): no locators
        if wire.LOCATOR_KIND_FASTDDS_SHM in kinds:
            self._shared_memory[prefix] = None
            self._shared_memory.move_to_end(prefix)
            if len(self._shared_memory) > MAX_PARTICIPANTS:
                self._shared_memory.popitem(last=False)
        else:
            self._shared_memory.pop(prefix, None)

    def announces_shared_memory(self, prefix: bytes) -> bool:
        return prefix in self._shared_memory

    def shared_memory_peers(self, prefix: bytes) -> int:
        """Participants other than ``prefix`` that announce a shared-memory locator."""
        return len(self._shared_memory) - (prefix in self._shared_memory)

    def _learn_endpoint(self, data: wire.DataSubmessage, payload: bytes, writer: bool) -> Endpoint | None:
        gone = False
        key_hash = b""
        for pid, value in wire.parameters(data.inline_qos, data.little_endian):
            if pid == wire.PID_STATUS_INFO and len(value) == 4 and value[3] & _STATUS_GONE:
                gone = True
            elif pid == wire.PID_KEY_HASH and len(value) == 16:
                key_hash = value
        if gone:  # disposal: the key is in PID_KEY_HASH (Fast DDS) or the payload (Cyclone DDS)
            guid = key_hash or (self._announced_guid(payload) if payload else b"")
            self._forget(guid)
            return None
        if not payload:
            return None
        guid, topic, type_name = key_hash, "", ""
        parameters, little = self._announcement(payload)
        for pid, value in parameters:
            if pid == wire.PID_ENDPOINT_GUID and len(value) == 16:
                guid = value
            elif pid == wire.PID_TOPIC_NAME:
                topic = wire.cdr_string(value, little)
            elif pid == wire.PID_TYPE_NAME:
                type_name = wire.cdr_string(value, little)
        if len(guid) != 16 or not topic:
            raise wire.RtpsError("SEDP announcement without endpoint GUID or topic")
        endpoint = Endpoint(guid, topic, type_name, writer)
        self.add(endpoint)
        return endpoint

    @staticmethod
    def _announcement(payload: bytes) -> tuple[list[tuple[int, bytes]], bool]:
        """The parameters of a SEDP serialized payload (PL_CDR) and their endianness."""
        is_list, little = wire.encapsulation(payload)
        if not is_list:
            raise wire.RtpsError("SEDP payload is not a parameter list")
        return wire.parameters(payload[4:], little), little

    def _announced_guid(self, payload: bytes) -> bytes:
        """PID_ENDPOINT_GUID of a serialized key (a disposal without PID_KEY_HASH)."""
        for pid, value in self._announcement(payload)[0]:
            if pid == wire.PID_ENDPOINT_GUID and len(value) == 16:
                return value
        return b""

    def add(self, endpoint: Endpoint) -> None:
        old = self._endpoints.pop(endpoint.guid, None)
        if old is not None and not old.writer:
            self._drop_reader(old)
        self._endpoints[endpoint.guid] = endpoint
        if not endpoint.writer:
            self._readers.setdefault(endpoint.topic, set()).add(endpoint.guid)
        if len(self._endpoints) > MAX_ENDPOINTS:
            _, oldest = self._endpoints.popitem(last=False)
            if not oldest.writer:
                self._drop_reader(oldest)

    def _forget(self, guid: bytes) -> None:
        old = self._endpoints.pop(guid, None)
        if old is not None and not old.writer:
            self._drop_reader(old)

    def _drop_reader(self, endpoint: Endpoint) -> None:
        readers = self._readers.get(endpoint.topic)
        if readers is not None:
            readers.discard(endpoint.guid)
            if not readers:
                del self._readers[endpoint.topic]
