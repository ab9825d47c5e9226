"""HTTP/2 sessions on real grpcio bytes and on built frames: streams, roles, ends, late joins."""

from __future__ import annotations

from hpack import Encoder

from protocols.base import Direction, ExchangeKind, Outcome
from protocols.http2.stitch import Http2Session
from protocols.http2.tests.traffic import (
    GRPC_ALL,
    GRPC_REQUEST,
    Conversation,
    as_seen_by,
    exchanges,
    grpc_message,
    run,
    started,
)

PATHS = [
    "/demo.Inference/Predict",
    "/demo.Inference/StreamTokens",
    "/demo.Inference/Upload",
    "/demo.Inference/Chat",
    "/demo.Inference/Predict",
]


def _status(exchange) -> str | None:
    return exchange.response.header("grpc-status")


def test_grpcio_capture_from_the_client_gives_one_exchange_per_call():
    session = Http2Session(Direction.EGRESS)
    ended = exchanges(run(session, as_seen_by(GRPC_ALL, "client")))
    assert [e.request.header(":path") for e in ended] == PATHS
    assert [e.stream_id for e in ended] == [1, 3, 5, 7, 9]
    assert all(e.kind == ExchangeKind.CLIENT and e.outcome == Outcome.COMPLETE for e in ended)
    assert [_status(e) for e in ended] == ["0", "0", "0", "0", "5"]
    assert not any(e.hpack_incomplete for e in ended)
    # message counts: unary 1/1, server-streaming 1/3, client-streaming 3/1, bidi 2/2
    counts = [(e.request.grpc_messages, e.response.grpc_messages) for e in ended]
    assert counts == [(1, 1), (1, 3), (3, 1), (2, 2), (1, 0)]
    trailers_only = ended[4].response
    assert trailers_only.trailers == [] and trailers_only.header("grpc-message") == "no such item"
    assert session.parse_errors == 0


def test_grpcio_capture_from_the_server_gives_server_exchanges():
    session = Http2Session(Direction.INGRESS)
    ended = exchanges(run(session, as_seen_by(GRPC_ALL, "server")))
    assert [e.request.header(":path") for e in ended] == PATHS
    assert all(e.kind == ExchangeKind.SERVER for e in ended)


def test_a_wrong_hint_is_corrected_by_the_preface():
    session = Http2Session(Direction.INGRESS)  # the detector guessed wrong
    ended = exchanges(run(session, as_seen_by(GRPC_ALL, "client")))
    assert all(e.kind == ExchangeKind.CLIENT for e in ended) and len(ended) == 5


def _from_stream(stream_id: int):
    """The capture from the client's HEADERS of ``stream_id`` on (the agent joined there)."""
    first = next(
        i for i, (d, _, data) in enumerate(GRPC_ALL)
        if d == 0 and len(data) > 9 and data[3] == 1 and int.from_bytes(data[5:9], "big") == stream_id
    )
    return GRPC_ALL[first:]


def test_joining_late_marks_unknown_fields_and_recovers_literals():
    session = Http2Session(Direction.EGRESS)
    ended = exchanges(run(session, as_seen_by(_from_stream(3), "client")))
    assert [e.stream_id for e in ended] == [3, 5, 7, 9]
    assert all(e.joined_late and e.hpack_incomplete for e in ended)
    # grpcio sends each new :path as a literal: those decode although the table is partial
    assert [e.request.header(":path") for e in ended[:3]] == PATHS[1:4]
    assert ended[0].request.header(":method") == "POST"  # static table
    # stream 9 reuses Predict's entry, inserted before the agent joined: unknown, never wrong
    assert ended[3].request.header(":path") is None
    assert ended[3].request.unknown_fields > 0
    assert _status(ended[3]) == "5"  # trailers decode: literal grpc-status
    assert all(e.kind == ExchangeKind.CLIENT for e in ended)


def test_joining_late_on_the_server_side_learns_the_role_from_headers():
    session = Http2Session(Direction.EGRESS)  # wrong guess: no preface to correct it
    ended = exchanges(run(session, as_seen_by(_from_stream(5), "server")))
    assert [e.stream_id for e in ended] == [5, 7, 9]
    assert all(e.kind == ExchangeKind.SERVER for e in ended)


def test_streams_interleave_and_end_independently():
    conv = Conversation()
    conv.request(1, GRPC_REQUEST)
    conv.request(3, GRPC_REQUEST)
    conv.data(True, 3, grpc_message(b"b"), end_stream=True)
    conv.data(True, 1, grpc_message(b"a"), end_stream=True)
    conv.response(3, [(":status", "200"), ("content-type", "application/grpc")])
    conv.response(1, [(":status", "200"), ("content-type", "application/grpc")])
    conv.data(False, 1, grpc_message(b"x"))
    conv.response(1, [("grpc-status", "0")], end_stream=True)
    conv.response(3, [("grpc-status", "14")], end_stream=True)
    session = Http2Session(Direction.EGRESS)
    events = run(session, [(Direction.EGRESS, bytes(conv.client), 1), (Direction.INGRESS, bytes(conv.server), 2)])
    assert [e.stream_id for e in started(events)] == [1, 3]
    ended = exchanges(events)
    assert [(e.stream_id, _status(e)) for e in ended] == [(1, "0"), (3, "14")]


def test_reset_and_goaway_cancel_and_close_abandons():
    conv = Conversation()
    for stream_id in (1, 3, 5, 7):
        conv.request(stream_id, GRPC_REQUEST)
    conv.reset(True, 1)
    conv.goaway(last_stream_id=3)
    session = Http2Session(Direction.EGRESS)
    events = run(session, [(Direction.EGRESS, bytes(conv.client), 1), (Direction.INGRESS, bytes(conv.server), 2)], 9)
    ended = {e.stream_id: e for e in exchanges(events)}
    assert ended[1].outcome == Outcome.CANCELLED and ended[1].reset_code == 8
    assert ended[5].outcome == Outcome.CANCELLED and ended[7].outcome == Outcome.CANCELLED
    assert ended[3].outcome == Outcome.CONNECTION_CLOSED and ended[3].abandoned_ns == 9
    assert len(started(events)) == len(ended) == 4


def test_continuation_frames_and_plain_http():
    conv = Conversation()
    conv.request(1, [(":method", "GET"), (":scheme", "http"), (":path", "/items/7"), (":authority", "h")],
                 end_stream=True, split=5)
    conv.response(1, [(":status", "404"), ("content-length", "2")])
    conv.data(False, 1, b"no", end_stream=True)
    session = Http2Session(Direction.INGRESS)
    server_view = [(Direction.INGRESS, bytes(conv.client), 1), (Direction.EGRESS, bytes(conv.server), 2)]
    (exchange,) = exchanges(run(session, server_view))
    assert exchange.kind == ExchangeKind.SERVER
    assert exchange.request.header(":path") == "/items/7" and exchange.response.header(":status") == "404"
    assert exchange.response.body_size == 2 and exchange.request.ended


def test_uncaptured_bytes_inside_data_are_counted_not_fatal():
    conv = Conversation()
    conv.request(1, GRPC_REQUEST)
    big = grpc_message(b"z" * 5000)
    conv.data(True, 1, big, end_stream=True)
    conv.response(1, [(":status", "200")])
    conv.response(1, [("grpc-status", "0")], end_stream=True)
    client = bytes(conv.client)
    cut = len(client) - len(big) + 100  # the capture kept 100 bytes of the payload
    session = Http2Session(Direction.EGRESS)
    events = session.feed(Direction.EGRESS, client[:cut], 1, missing=len(client) - cut)
    events += session.feed(Direction.INGRESS, bytes(conv.server), 2)
    (exchange,) = exchanges(events)
    assert exchange.request.body_size == len(big) and exchange.request.body_truncated
    assert exchange.request.grpc_messages == 1 and _status(exchange) == "0"


def test_upgrade_h2c_request_is_stream_one():
    encoder = Encoder()
    request = b"GET /hello HTTP/1.1\r\nHost: h:80\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
    switching = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame

    from protocols.http2.types import PREFACE

    server = SettingsFrame(0).serialize()
    server += HeadersFrame(1, encoder.encode([(":status", "200")]), flags=["END_HEADERS"]).serialize()
    server += DataFrame(1, b"hi", flags=["END_STREAM"]).serialize()
    client_after = PREFACE + SettingsFrame(0).serialize()
    session = Http2Session(Direction.EGRESS)
    events = session.feed(Direction.EGRESS, request, 1)
    events += session.feed(Direction.INGRESS, switching + server, 2)
    events += session.feed(Direction.EGRESS, client_after, 3)
    (exchange,) = exchanges(events)
    assert exchange.upgraded and exchange.stream_id == 1 and exchange.kind == ExchangeKind.CLIENT
    assert exchange.request.header(":path") == "/hello" and exchange.request.header(":authority") == "h:80"
    assert exchange.response.header(":status") == "200" and exchange.response.body_size == 2


def test_declined_upgrade_stays_http1():
    request = b"GET /x HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    session = Http2Session(Direction.EGRESS)
    events = session.feed(Direction.EGRESS, request, 1) + session.feed(Direction.INGRESS, response, 2)
    (exchange,) = exchanges(events)
    assert exchange.protocol == "http1" and exchange.response.status == 200


def test_a_request_lost_with_uncaptured_bytes_still_gives_its_exchange():
    """grpcio's first write gathers 25 iovecs; a capture limited to fewer loses the
    HEADERS of stream 1 at its end. Its response still makes the exchange, marked."""
    conv = Conversation()
    opening = len(conv.client)  # preface + SETTINGS
    conv.request(1, GRPC_REQUEST)
    conv.data(True, 1, grpc_message(b"a"), end_stream=True)
    first_write = bytes(conv.client)
    conv.client.clear()
    conv.request(3, GRPC_REQUEST, end_stream=True)
    conv.response(1, [(":status", "200"), ("content-type", "application/grpc")])
    conv.response(1, [("grpc-status", "0")], end_stream=True)
    conv.response(3, [(":status", "200"), ("grpc-status", "0")], end_stream=True)
    cut = opening + 4  # the capture kept the preface, SETTINGS and 4 bytes of HEADERS
    session = Http2Session(Direction.EGRESS)
    events = session.feed(Direction.EGRESS, first_write[:cut], 1, missing=len(first_write) - cut)
    events += session.feed(Direction.EGRESS, bytes(conv.client), 2)
    events += session.feed(Direction.INGRESS, bytes(conv.server), 3)
    lost, later = exchanges(events)
    assert lost.stream_id == 1 and lost.kind == ExchangeKind.CLIENT and lost.start_ns == 1
    assert lost.hpack_incomplete and lost.request.header(":path") is None
    assert lost.response.header("grpc-status") == "0"
    # stream 3 refers to entries stream 1 inserted in the lost bytes: unknown, not wrong
    assert later.stream_id == 3 and later.hpack_incomplete and later.request.header(":path") is None
    assert later.request.header(":method") == "POST"


def test_server_settings_seen_before_the_preface_still_means_a_fresh_connection():
    view = as_seen_by(GRPC_ALL, "server")
    server_settings = next(i for i, (d, _, _) in enumerate(view) if d == Direction.EGRESS)
    reordered = [view[server_settings]] + view[:server_settings] + view[server_settings + 1 :]
    ended = exchanges(run(Http2Session(Direction.INGRESS), reordered))
    assert len(ended) == 5 and not any(e.hpack_incomplete or e.joined_late for e in ended)
