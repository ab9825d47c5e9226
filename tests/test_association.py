"""The linking rules on their own (no kernel): each rule's evidence, its refusals, and
the deferred asyncio decisions with held spans."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from otelbpf.core.association import TASK_DECISION_TIMEOUT_NS, Linker, hold_or_release, release
from otelbpf.core.connections import Connection
from otelbpf.core.model import SpanKind, SpanRecord
from otelbpf.core.propagation import extract_parent
from otelbpf.core.selfmetrics import Counters
from protocols.http1.parse import HeadComplete, HttpParser
from protocols.http1.types import FieldBlock

SERVER, CLIENT = SpanKind.SERVER, SpanKind.CLIENT
TRACEPARENT = ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def Conn(  # noqa: N802 - reads as the connection it makes
    local_addr: str = "",
    local_port: int = 0,
    peer_addr: str = "",
    peer_port: int = 0,
    sock_id: int = 0,
    peer_sock_id: int = 0,
    datagram: bool = False,
) -> Connection:
    """A connection table entry with the fields the linker reads (it types them: association.pxd)."""
    conn = Connection(conn_id=1, pid=1, fd=3, opened_ns=0)
    conn.local_addr, conn.local_port, conn.peer_addr, conn.peer_port = local_addr, local_port, peer_addr, peer_port
    conn.sock_id, conn.peer_sock_id, conn.datagram = sock_id, peer_sock_id, datagram
    return conn


@dataclass
class Exchange:
    """The part of an exchange the linker reads: its trace-context carrier and correlation key."""

    headers: list = field(default_factory=list)
    correlation_key: object = None
    message_key: object = None

    def carrier(self) -> list:
        return self.headers


NO_HEADERS = Exchange()


INBOUND = Conn("10.0.0.1", 8080, "10.0.0.9", 40000)  # gateway's accepted connection
OUTBOUND = Conn("10.0.0.1", 50000, "10.0.0.2", 8081)  # gateway -> backend
BACKEND_SIDE = Conn("10.0.0.2", 8081, "10.0.0.1", 50000)  # the same connection seen by the backend


def linker() -> Linker:
    return Linker(Counters())


def span_for(start) -> SpanRecord:
    return SpanRecord(start.trace_id, start.span_id, "x", start.kind, 0, 1, start.pid, start.parent_span_id)


def test_thread_rule_links_the_one_request_the_thread_serves():
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110)
    assert call.parent_span_id == server.span_id and call.trace_id == server.trace_id
    assert call.association == "thread"


def test_two_requests_on_one_thread_without_task_evidence_is_ambiguous():
    link = linker()
    link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    link.start(Conn("10.0.0.1", 8080, "10.0.0.9", 40001), NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=101)
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110)
    assert call.parent_span_id == b"" and call.association == "ambiguous"
    assert link.counters.get("otelbpf.association.ambiguous") == 1


def test_process_rule_links_a_hand_off_thread_but_never_a_background_thread():
    link = linker()
    background = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=99, ts_ns=50)  # calls while nothing is served
    assert background.parent_span_id == b""
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    worker = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=12, ts_ns=110)
    assert worker.parent_span_id == server.span_id and worker.association == "process"
    again = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=99, ts_ns=120)
    assert again.parent_span_id == b"" and again.association == ""


def test_process_rule_refuses_when_several_requests_are_open():
    link = linker()
    link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    link.start(Conn("10.0.0.1", 8080, "10.0.0.9", 40001), NO_HEADERS, SERVER, pid=1, tid=13, ts_ns=101)
    worker = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=12, ts_ns=110)
    assert worker.parent_span_id == b"" and worker.association == "ambiguous"


def test_window_closes_when_the_request_completes():
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    link.end(server, 200)
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=210)
    assert call.parent_span_id == b""


def test_connection_pair_links_server_to_the_client_of_that_connection_in_order():
    link = linker()
    first = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=100)
    second = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=101)  # pipelined
    served_first = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=102)
    served_second = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=103)
    assert served_first.parent_span_id == first.span_id and served_first.association == "connection"
    assert served_second.parent_span_id == second.span_id
    other = link.start(Conn("10.0.0.2", 8081, "10.0.0.1", 50001), NO_HEADERS, SERVER, pid=2, tid=22, ts_ns=104)
    assert other.parent_span_id == b""  # a different connection


def test_a_client_stamped_after_its_server_read_the_request_still_becomes_its_parent():
    """On loopback a send can be stamped after the receiver read it (its wake-up
    ran elsewhere): the server started first, with no client to claim."""
    link = linker()
    server = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=1_000)
    assert server.parent_span_id == b""
    # the server's own call, linked to it by the thread rule before the client shows up
    backend_call = link.start(Conn("10.0.0.2", 50500, "10.0.0.3", 9000), NO_HEADERS, CLIENT, pid=2, tid=21, ts_ns=1_002)
    client = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=1_005)
    assert server.parent_span_id == client.span_id and server.association == "connection"
    assert server.trace_id == client.trace_id == backend_call.trace_id
    assert link.counters.get("otelbpf.association.late_clients") == 1
    assert link.pending_clients == 1  # the backend's own call; the adopting client is not left to claim
    link.end(server, 2_000)
    # the next request on the connection pairs the normal way
    second = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=3_000)
    served = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=3_001)
    assert served.parent_span_id == second.span_id


def test_a_late_client_never_adopts_a_server_span_that_ended_or_began_long_before():
    link = linker()
    ended = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=1_000)
    link.end(ended, 2_000)
    client = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=3_000)
    assert ended.parent_span_id == b"" and link.pending_clients == 1
    link.end(client, 4_000)

    link = linker()
    old = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=1_000)
    link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=1_000 + 60_000_000)  # 60 ms later
    assert old.parent_span_id == b""
    assert link.counters.get("otelbpf.association.late_clients") == 0


def test_a_server_span_that_found_no_client_is_let_go_of_when_it_ends():
    """A server traced without its clients (or whose clients connect once each)
    leaves nothing behind per connection: an ended span, which holds its finished
    record, must not wait for the connection's next request to be freed."""
    link = linker()
    for port in range(1000):  # a thousand one-request connections
        server = link.start(Conn("10.0.0.2", 8081, "10.0.0.1", 40000 + port), NO_HEADERS, SERVER, pid=2, tid=21,
                            ts_ns=1_000 + port)
        assert link.servers_awaiting_clients == 1
        hold_or_release(span_for(server), server)
        link.end(server, 2_000 + port)
        assert server.awaits_client is None
    assert link.servers_awaiting_clients == 0
    # pipelined: the first ends while the second waits on the same pair; the second stays adoptable
    first = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=10_000)
    second = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=10_001)
    link.end(first, 10_002)
    assert link.servers_awaiting_clients == 1
    client = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=10_003)
    assert second.parent_span_id == client.span_id
    assert link.servers_awaiting_clients == 0


def test_unix_sockets_pair_by_socket_identity():
    link = linker()
    client = link.start(Conn(peer_sock_id=0xBEEF, sock_id=0xCAFE), NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=100)
    server = link.start(Conn(sock_id=0xBEEF), NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=101)
    assert server.parent_span_id == client.span_id


def test_propagated_header_wins_and_consumes_the_pair():
    link = linker()
    link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=100)
    server = link.start(BACKEND_SIDE, Exchange([TRACEPARENT]), SERVER, pid=2, tid=21, ts_ns=101)
    assert server.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert server.parent_span_id.hex() == "00f067aa0ba902b7" and server.association == "propagated"
    assert link.pending_clients == 0


def test_task_call_is_decided_when_its_task_answers_and_moves_its_subtree():
    link = linker()
    request_a = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    link.start(Conn("10.0.0.1", 8080, "10.0.0.9", 40001), NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=101)
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110, task_id=0xA)
    assert call.group.root().pending == 1
    downstream = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=111)  # linked under the call
    assert downstream.trace_id == call.trace_id
    held = hold_or_release(span_for(downstream), downstream)
    assert held == []  # its trace waits for the decision
    link.end(downstream, 120)
    assert link.end(call, 130) == []
    held += hold_or_release(span_for(call), call)
    assert held == []
    settled = link.end(request_a, 140, task_id=0xA)  # task A writes request A's response
    [group] = settled
    released = release(group)
    assert {s.span_id for s in released} == {call.span_id, downstream.span_id}
    assert all(s.trace_id == request_a.trace_id for s in released)
    call_span = next(s for s in released if s.span_id == call.span_id)
    assert call_span.parent_span_id == request_a.span_id
    assert call_span.attributes["otelbpf.association"] == "task"


def test_a_span_that_leaves_at_once_is_not_kept_by_its_identity():
    """Identities outlive their spans (a sent message's, kept for its readers; a
    server's awaiting a late client): only a span held for a pending decision,
    which may amend it, stays referenced (the test above)."""
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    span = span_for(server)
    assert hold_or_release(span, server) == [span]
    assert server.span is None


def test_task_call_never_links_to_a_request_that_started_after_it():
    link = linker()
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=100, task_id=0xA)
    later = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=105)
    assert link.end(later, 140, task_id=0xA) == []
    link.end(call, 150)
    [group] = link.expire(150 + TASK_DECISION_TIMEOUT_NS + 1)
    assert call.parent_span_id == b"" and call.association == "ambiguous"
    assert group is call.group.root()


def test_task_call_of_another_task_is_not_taken():
    link = linker()
    request = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110, task_id=0xB)
    assert link.end(request, 140, task_id=0xA) == []
    assert call.group.root().pending == 1
    assert link.pending_task_calls == 1


def test_undecided_task_calls_are_released_when_the_process_exits():
    link = linker()
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110, task_id=0xA)
    assert hold_or_release(span_for(call), call) == []
    [group] = link.forget_process(1)
    [span] = release(group)
    assert span.span_id == call.span_id and span.attributes["otelbpf.association"] == "ambiguous"
    assert link.counters.get("otelbpf.association.ambiguous") == 1


def test_correlation_key_pairs_concurrent_exchanges_of_one_connection_out_of_order():
    link = linker()
    first = link.start(OUTBOUND, Exchange(correlation_key=1), CLIENT, pid=1, tid=11, ts_ns=100)
    second = link.start(OUTBOUND, Exchange(correlation_key=3), CLIENT, pid=1, tid=11, ts_ns=101)
    served_3 = link.start(BACKEND_SIDE, Exchange(correlation_key=3), SERVER, pid=2, tid=21, ts_ns=102)
    served_1 = link.start(BACKEND_SIDE, Exchange(correlation_key=1), SERVER, pid=2, tid=22, ts_ns=103)
    assert served_3.parent_span_id == second.span_id and served_1.parent_span_id == first.span_id
    assert link.start(BACKEND_SIDE, Exchange(correlation_key=1), SERVER, pid=2, tid=23, ts_ns=104).parent_span_id == b""


def test_producer_and_consumer_pair_like_client_and_server_and_consumers_open_windows():
    link = linker()
    produced = link.start(OUTBOUND, Exchange(correlation_key="w1:7"), SpanKind.PRODUCER, pid=1, tid=11, ts_ns=100)
    consumed = link.start(BACKEND_SIDE, Exchange(correlation_key="w1:7"), SpanKind.CONSUMER, pid=2, tid=21, ts_ns=101)
    assert consumed.parent_span_id == produced.span_id and consumed.association == "connection"
    # a callback publishing from the consuming thread is the consumer's child
    republished = link.start(OUTBOUND, NO_HEADERS, SpanKind.PRODUCER, pid=2, tid=21, ts_ns=102)
    assert republished.parent_span_id == consumed.span_id and republished.association == "thread"


def test_a_library_call_is_placed_by_the_thread_and_time_rules():
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100)
    call = link.start_call(pid=1, tid=11, ts_ns=110)
    assert call.kind == SpanKind.INTERNAL and call.parent_span_id == server.span_id
    link.end(server, 200)
    assert link.start_call(pid=1, tid=11, ts_ns=210).parent_span_id == b""


@dataclass
class Message:
    """An exchange naming its message agent-wide (an RTPS sample: writer GUID + sequence number)."""

    message_key: tuple
    sole_reader: bool = True
    correlation_key: object = None

    def carrier(self) -> list:
        return []


def test_message_rule_links_every_reader_and_parents_only_a_sole_reader():
    link = linker()
    sent = link.start(OUTBOUND, Message(("rtps", b"w", 1)), SpanKind.PRODUCER, pid=1, tid=11, ts_ns=100)
    link.end(sent, 100)  # the sending span has ended before anyone received it
    # other sockets than the sender's: the message key alone pairs them
    only = link.start(INBOUND, Message(("rtps", b"w", 1)), SpanKind.CONSUMER, pid=2, tid=21, ts_ns=101)
    assert only.parent_span_id == sent.span_id and only.trace_id == sent.trace_id
    assert only.links == [sent] and only.association == "message"
    # a second reader of the same sample may claim it too
    many = link.start(BACKEND_SIDE, Message(("rtps", b"w", 1), sole_reader=False), SpanKind.CONSUMER, pid=3, tid=31, ts_ns=102)
    assert many.links == [sent] and many.parent_span_id == b"" and many.trace_id != sent.trace_id
    # a message never seen sent is a root with no link
    stray = link.start(INBOUND, Message(("rtps", b"w", 2)), SpanKind.CONSUMER, pid=2, tid=22, ts_ns=103)
    assert not stray.links and stray.parent_span_id == b"" and stray.association == ""
    # the receiving span opens a window: the callback's next publish is its child
    republished = link.start(OUTBOUND, Message(("rtps", b"v", 1)), SpanKind.PRODUCER, pid=2, tid=21, ts_ns=104)
    assert republished.parent_span_id == only.span_id and republished.association == "thread"


def test_a_message_received_before_its_send_was_seen_is_linked_and_parented_when_it_comes():
    """On loopback the receiver can read a datagram on another CPU before the
    sender's syscall returned, so the receive reaches the linker first."""
    link = linker()
    got = link.start(INBOUND, Message(("rtps", b"w", 1)), SpanKind.CONSUMER, pid=2, tid=21, ts_ns=101)
    assert got.parent_span_id == b"" and not got.links
    # the callback publishes on the receiving thread before the sender shows up
    republished = link.start(OUTBOUND, Message(("rtps", b"v", 1)), SpanKind.PRODUCER, pid=2, tid=21, ts_ns=102)
    shared = link.start(INBOUND, Message(("rtps", b"w", 1), sole_reader=False), SpanKind.CONSUMER, pid=3, tid=31, ts_ns=103)
    sent = link.start(OUTBOUND, Message(("rtps", b"w", 1)), SpanKind.PRODUCER, pid=1, tid=11, ts_ns=100)
    assert got.parent_span_id == sent.span_id and got.links == [sent] and got.association == "message"
    assert got.trace_id == sent.trace_id == republished.trace_id  # what was placed under it follows
    assert shared.links == [sent] and shared.parent_span_id == b"" and shared.trace_id != sent.trace_id
    assert link.counters.get("otelbpf.association.messages_parented_late") == 1
    assert link.counters.get("otelbpf.association.messages_linked_late") == 1


def test_a_late_sender_only_links_a_receive_whose_span_has_ended():
    link = linker()
    got = link.start(INBOUND, Message(("rtps", b"w", 1)), SpanKind.CONSUMER, pid=2, tid=21, ts_ns=101)
    trace_id = got.trace_id
    link.end(got, 150)  # its span may have left already: its trace and parent stay as they were
    sent = link.start(OUTBOUND, Message(("rtps", b"w", 1)), SpanKind.PRODUCER, pid=1, tid=11, ts_ns=100)
    assert got.links == [sent] and got.parent_span_id == b"" and got.trace_id == trace_id
    assert link.counters.get("otelbpf.association.messages_linked_late") == 1



@pytest.mark.parametrize(
    ("lines", "linked"),
    [
        (["traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "TraceState: k=v"], True),
        (["Uber-Trace-Id: 4bf92f3577b34da6a3ce929d0e0e4736:00f067aa0ba902b7:0:1"], True),
        (["b3: 4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1"], True),
        (["X-B3-TraceId: 4bf92f3577b34da6a3ce929d0e0e4736", "X-B3-SpanId: 00f067aa0ba902b7", "X-B3-Sampled: 1"], True),
        (["traceparent: 00-not-a-valid-context"], False),
        (["tracestate: k=v"], False),
        (["Accept: */*"], False),
    ],
    ids=["w3c", "jaeger", "b3-single", "b3-multi", "invalid", "state-only", "none"],
)
def test_trace_context_from_parsed_fields_is_what_the_pairs_give(lines, linked):
    """The parser keeps a head's fields as text (FieldBlock); trace context is looked
    up by name there. It must name the same parent as the pairs would."""
    head = ("GET / HTTP/1.1\r\nHost: h\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode()
    (message,) = [e.message for e in HttpParser("request").feed(head, 1) if isinstance(e, HeadComplete)]
    assert type(message.headers) is FieldBlock
    from_block, from_pairs = extract_parent(message.headers), extract_parent(list(message.headers))
    assert from_block == from_pairs and (from_block is not None) == linked
    if linked:
        assert from_block.trace_id == bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")


# -- profile samples: which request a thread serves at an instant -----------------


def test_a_sample_is_linked_to_the_one_window_open_on_its_thread():
    links = linker()
    server = links.start(INBOUND, NO_HEADERS, SERVER, pid=7, tid=70, ts_ns=100)
    assert links.serving(7, 70) is server
    assert links.serving(7, 71) is None  # another thread's request is no evidence
    assert links.serves_requests(7) and not links.serves_requests(8)
    links.end(server, 200)
    assert links.serving(7, 70) is None and not links.serves_requests(7)


def test_two_windows_on_one_thread_link_no_sample_by_the_thread_rule():
    links = linker()
    links.start(INBOUND, NO_HEADERS, SERVER, pid=7, tid=70, ts_ns=100)
    links.start(Conn("10.0.0.1", 8080, "10.0.0.9", 40001), NO_HEADERS, SERVER, pid=7, tid=70, ts_ns=110)
    assert links.serving(7, 70) is None


def test_a_task_sample_goes_to_the_request_its_task_read_or_waits_for_the_answer():
    links = linker()
    first = links.start(INBOUND, NO_HEADERS, SERVER, pid=7, tid=70, ts_ns=100, task_id=0xA)
    second = links.start(Conn("10.0.0.1", 8080, "10.0.0.9", 40001), NO_HEADERS, SERVER, pid=7, tid=70, ts_ns=110)
    assert links.serving(7, 70, task_id=0xA) is first
    assert links.serving(7, 70, task_id=0xB) is None  # read outside a task: known when task B answers

    answers = []

    class Observer:
        def answered(self, start, ts_ns, task_id):
            answers.append((start, ts_ns, task_id))

    links.answer_observers.append(Observer())
    links.end(second, 300, task_id=0xB)
    assert answers == [(second, 300, 0xB)]


# -- across nodes: the ids the kernel fixed for a request (docs/cross-node.md) -------------------

from otelbpf.core.events import ContextOrigin, WireContext  # noqa: E402 - this section's own imports

UPSTREAM_TRACE, UPSTREAM_SPAN = bytes(range(1, 17)), bytes(range(40, 48))


def option(trace_id: bytes = UPSTREAM_TRACE, span_id: bytes = UPSTREAM_SPAN) -> WireContext:
    """A server's read that came with another node's TCP option."""
    return WireContext(trace_id, span_id, 1, ContextOrigin.TCP_OPTION)


def fresh(trace_id: bytes = bytes(range(100, 116))) -> WireContext:
    """A server's read with no context: the trace the kernel chose for it."""
    return WireContext(trace_id, bytes(8), 1, ContextOrigin.FRESH)


def sent(trace_id: bytes, span_id: bytes = bytes(range(60, 68)), rule: int = 1) -> WireContext:
    """A client's write: the ids it carried on the wire."""
    return WireContext(trace_id, span_id, 1, ContextOrigin.CLIENT, rule, 1)


def test_a_server_span_whose_request_came_with_an_option_is_the_upstream_client_spans_child():
    link = linker()
    server = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=100, wire=option())
    assert (server.trace_id, server.parent_span_id) == (UPSTREAM_TRACE, UPSTREAM_SPAN)
    assert server.association == "tcp_option"
    assert link.counters.get("otelbpf.propagation.adopted") == 1


def test_a_header_and_a_same_host_client_still_win_over_the_option():
    link = linker()
    headed = link.start(INBOUND, Exchange([TRACEPARENT]), SERVER, pid=1, tid=11, ts_ns=100, wire=option())
    assert headed.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736" and headed.association == "propagated"
    client = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=3, tid=31, ts_ns=200)
    paired = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=210, wire=option())
    assert paired.parent_span_id == client.span_id and paired.association == "connection"


def test_a_server_span_with_no_context_on_the_wire_takes_the_trace_the_kernel_chose():
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100, wire=fresh())
    assert server.trace_id == bytes(range(100, 116)) and server.parent_span_id == b""


def test_a_client_span_takes_the_wire_ids_under_the_request_its_thread_serves():
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100, wire=fresh())
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110, wire=sent(server.trace_id))
    assert call.span_id == bytes(range(60, 68)) and call.parent_span_id == server.span_id
    assert call.trace_id == server.trace_id and call.association == "thread"
    assert server.group.root().wired


def test_a_client_span_whose_wire_trace_is_not_its_parents_is_a_root_of_it_linked_to_the_parent():
    """The kernel took another trace than the linker's parent (it could not see the request):
    the other node names the wire's ids, so the span keeps them, with a span link."""
    link = linker()
    server = link.start(INBOUND, Exchange([TRACEPARENT]), SERVER, pid=1, tid=11, ts_ns=100)
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110, wire=sent(bytes(range(200, 216))))
    assert call.trace_id == bytes(range(200, 216)) and call.span_id == bytes(range(60, 68))
    assert call.parent_span_id == b"" and call.association == "conflict" and call.links == [server]
    assert link.counters.get("otelbpf.propagation.conflicts") == 1


def test_a_root_client_span_takes_the_wire_ids():
    link = linker()
    call = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=5, tid=51, ts_ns=110, wire=sent(bytes(range(200, 216)), rule=0))
    assert (call.trace_id, call.span_id, call.parent_span_id) == (bytes(range(200, 216)), bytes(range(60, 68)), b"")


def test_an_asyncio_call_on_the_wire_joins_its_request_only_in_the_wire_trace():
    link = linker()
    server = link.start(INBOUND, NO_HEADERS, SERVER, pid=1, tid=11, ts_ns=100, task_id=7, wire=fresh())
    same = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=110, task_id=7, wire=sent(server.trace_id))
    other_trace = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=1, tid=11, ts_ns=120, task_id=7,
                             wire=sent(bytes(range(200, 216)), span_id=bytes(range(70, 78))))  # fmt: skip
    held_span = span_for(other_trace)
    assert hold_or_release(held_span, other_trace) == []
    link.end(same, 130)
    link.end(other_trace, 140)
    link.end(server, 150, task_id=7)  # the task answers: its calls are decided
    assert same.parent_span_id == server.span_id and same.association == "task"
    assert other_trace.parent_span_id == b"" and other_trace.association == "conflict"
    assert other_trace.trace_id == bytes(range(200, 216))  # it kept the trace the other node names
    assert [(l.trace_id, l.span_id) for l in held_span.links] == [(server.trace_id, server.span_id)]


def test_a_server_span_whose_trace_went_on_the_wire_is_not_moved_by_a_late_client():
    link = linker()
    server = link.start(BACKEND_SIDE, NO_HEADERS, SERVER, pid=2, tid=21, ts_ns=100, wire=fresh())
    link.start(Conn("10.0.0.2", 50001, "10.0.0.3", 9000), NO_HEADERS, CLIENT, pid=2, tid=21, ts_ns=105,
               wire=sent(server.trace_id))  # fmt: skip
    late = link.start(OUTBOUND, NO_HEADERS, CLIENT, pid=3, tid=31, ts_ns=110)  # its same-host client, stamped late
    assert server.parent_span_id == b"" and server.trace_id == bytes(range(100, 116))
    assert late.trace_id != server.trace_id
    assert link.counters.get("otelbpf.propagation.conflicts") == 1
