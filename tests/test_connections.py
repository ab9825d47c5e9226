"""The connection table on its own: keys per source and per datagram flow, the LRU
bound, detection by content, muting, closing and parse-error accounting."""

from __future__ import annotations

import socket

from otelbpf.core.connections import DETECT_MAX_EVENTS, ConnectionTable
from otelbpf.core.events import ConnOpen, DataEvent, DatagramEvent, RoleHint, Source
from otelbpf.core.selfmetrics import Counters
from protocols.base import Direction, ExchangeStarted, Outcome
from protocols.http1 import Http1Detector
from tests.toy_protocol.protocol import ToyDetector

IN, OUT = Direction.INGRESS, Direction.EGRESS
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[int, object, list]] = []
        self.ended: list[tuple[int, Outcome]] = []
        self.muted: list[tuple[int, int]] = []

    def on_events(self, conn, event, out) -> None:
        self.events.append((conn.conn_id, event, out))

    def on_ended(self, conn, ts_ns) -> None:
        self.ended.append((conn.conn_id, conn.end_outcome))

    def started(self) -> list:
        return [item.exchange for _, _, out in self.events for item in out if isinstance(item, ExchangeStarted)]


def table(max_connections: int = 16) -> tuple[ConnectionTable, Recorder, Counters]:
    recorder, counters = Recorder(), Counters()
    connections = ConnectionTable(
        [Http1Detector(), ToyDetector()],
        recorder.on_events,
        counters,
        max_connections=max_connections,
        on_unrecognized=lambda conn: recorder.muted.append((conn.conn_id, conn.source)),
        on_ended=recorder.on_ended,
    )
    return connections, recorder, counters


def opened(conn_id: int, pid: int = 1, fd: int = 5) -> ConnOpen:
    return ConnOpen(1, pid, pid, fd, conn_id, socket.AF_INET, "10.0.0.1", 80, "10.0.0.2", 5555, RoleHint.ACCEPTED)


def data(conn_id: int, payload: bytes, direction: Direction = IN, *, ts: int = 1, source: int = 0) -> DataEvent:
    return DataEvent(ts, 1, 1, 5, conn_id, direction, len(payload), payload, source=source)


def test_detection_by_content_starts_a_session_and_replays_the_buffered_bytes() -> None:
    connections, recorder, _ = table()
    connections.open(opened(1))
    connections.data(data(1, b"GET / HT"))  # not enough yet for a start line
    assert connections.get(1).session is None
    connections.data(data(1, b"TP/1.1\r\nHost: x\r\n\r\n", ts=2))
    conn = connections.get(1)
    assert conn.protocol == "http1" and len(recorder.started()) == 1


def test_a_connection_with_no_known_protocol_is_given_up_muted_and_skipped() -> None:
    connections, recorder, counters = table()
    connections.open(opened(1))
    for ts in range(DETECT_MAX_EVENTS):
        connections.data(data(1, b"\x00\x01binary", ts=ts))
    assert recorder.muted == [(1, Source.SOCKET)] and counters.get("otelbpf.connections.unrecognized") == 1
    connections.data(data(1, GET, ts=99))  # later bytes are skipped at once
    assert recorder.started() == []


def test_sources_of_one_socket_are_separate_entries_closed_together() -> None:
    connections, recorder, _ = table()
    connections.open(opened(1))
    connections.data(data(1, b"\x16\x03\x01\x00\x05hello"))
    connections.data(data(1, GET, source=Source.TLS))
    plaintext = connections.get(1, Source.TLS)
    assert plaintext is not None and plaintext.protocol == "http1"
    assert (plaintext.peer_addr, plaintext.local_port) == ("10.0.0.2", 80)  # the socket's tuple
    assert connections.get(1).session is None and len(connections) == 2
    connections.close(1, 50)
    assert len(connections) == 0 and recorder.ended == [(1, Outcome.CONNECTION_CLOSED)]


def test_the_table_is_bounded_and_evicts_the_least_recently_active() -> None:
    connections, recorder, counters = table(max_connections=2)
    for conn_id in (1, 2):
        connections.open(opened(conn_id, fd=conn_id))
        connections.data(data(conn_id, GET))
    connections.data(data(1, b"\r\n", ts=5))  # 1 is now the most recent
    connections.open(opened(3, fd=3))
    assert connections.get(2) is None and connections.get(1) is not None and len(connections) == 2
    assert counters.get("otelbpf.connections.evicted") == 1
    assert recorder.ended == [(2, Outcome.CONNECTION_EVICTED)]


def test_fd_reuse_with_the_same_conn_id_starts_afresh() -> None:
    connections, recorder, _ = table()
    connections.open(opened(1))
    connections.data(data(1, GET))
    first = connections.get(1)
    connections.open(opened(1))
    assert connections.get(1) is not first and recorder.ended == [(1, Outcome.CONNECTION_CLOSED)]


def test_process_exit_closes_every_connection_of_the_process_only() -> None:
    connections, recorder, _ = table()
    connections.open(opened(1, pid=7, fd=1))
    connections.open(opened(2, pid=7, fd=2))
    connections.open(opened(3, pid=8, fd=1))
    for conn_id, pid in ((1, 7), (2, 7), (3, 8)):
        connections.data(DataEvent(1, pid, pid, 1, conn_id, IN, len(GET), GET))
    connections.close_process(7, 10)
    assert sorted(recorder.ended) == [(1, Outcome.PROCESS_EXITED), (2, Outcome.PROCESS_EXITED)]
    assert connections.get(3) is not None


def test_parse_errors_are_counted_under_the_protocol_id() -> None:
    connections, _, counters = table()
    connections.open(opened(1))
    connections.data(data(1, GET))
    connections.data(data(1, b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", OUT, ts=2))
    assert counters.get("otelbpf.parse.errors", "http1") == 1


def datagram(conn_id: int, payload: bytes, peer_port: int, direction: Direction = IN) -> DatagramEvent:
    return DatagramEvent(1, 1, 1, 3, conn_id, direction, len(payload), payload, "10.0.0.2", peer_port, socket.AF_INET)


def test_each_datagram_peer_is_a_flow_and_only_datagram_detectors_are_asked() -> None:
    connections, recorder, _ = table()
    connections.open(ConnOpen(1, 1, 1, 3, 9, socket.AF_INET, "10.0.0.1", 6000))
    connections.datagram(datagram(9, b"REQ a get\n", 5000))
    connections.datagram(datagram(9, b"REQ a get\n", 5001))
    connections.datagram(datagram(9, GET, 5002))  # HTTP/1 is not a datagram protocol
    assert len(recorder.started()) == 2 and len(connections) == 4  # the socket + three flows
    flows = [c for c in connections.connections() if c.datagram]
    assert {(c.local_port, c.peer_port) for c in flows} == {(6000, 5000), (6000, 5001), (6000, 5002)}
    connections.close(9, 5)
    assert len(connections) == 0


def test_an_unrecognized_datagram_flow_does_not_mute_the_socket() -> None:
    connections, recorder, counters = table()
    for _ in range(DETECT_MAX_EVENTS):
        connections.datagram(datagram(9, b"\x00junk", 5000))
    connections.datagram(datagram(9, b"REQ a get\n", 5001))
    assert recorder.muted == [] and counters.get("otelbpf.connections.unrecognized") == 1
    assert len(recorder.started()) == 1
