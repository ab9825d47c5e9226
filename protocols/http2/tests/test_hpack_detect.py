"""The tolerant HPACK decoder's recovery rules, and the detector's three openings."""

from __future__ import annotations

from hpack import Encoder

from protocols.base import Direction
from protocols.http2.detect import Http2Detector
from protocols.http2.hpack_state import TolerantDecoder
from protocols.http2.tests.traffic import GRPC_ALL
from protocols.http2.types import PREFACE


def test_fresh_decoder_matches_hpack():
    encoder = Encoder()
    decoder = TolerantDecoder()
    for i in range(30):
        headers = [(":path", f"/svc/M{i % 4}"), ("x-id", str(i)), ("user-agent", "ua")]
        block = decoder.decode(encoder.encode(headers))
        assert block.headers == headers and block.unknown == 0 and not block.malformed


def test_a_repeated_block_is_decoded_against_the_table_as_it_is_now():
    """Decoded blocks are remembered by their bytes (gRPC repeats the same ones): the
    same bytes after an insertion refer to other entries, and must decode as hpack does."""
    from hpack import Decoder

    encoder, reference, decoder = Encoder(), Decoder(), TolerantDecoder()

    def both(block: bytes) -> list[tuple[str, str]]:
        expected = [(str(n), str(v)) for n, v in reference.decode(block)]
        got = decoder.decode(block)
        assert got.headers == expected and got.unknown == 0 and not got.malformed
        return got.headers

    call = [(":method", "POST"), (":path", "/pkg.Svc/Get"), ("x-tenant", "a")]
    both(encoder.encode(call))  # inserts: not remembered
    repeated = encoder.encode(call)  # references only, the same bytes every call from now
    assert repeated == encoder.encode(call)
    assert both(repeated) == call and both(repeated) == call
    first = both(repeated)
    first.append(("x-mutated", "by a consumer"))  # the caller's list is its own
    assert both(repeated) == call
    both(encoder.encode([("x-tenant", "b")]))  # a new entry: the old ones move one index down
    assert both(repeated) != call  # as hpack reads it now, not as remembered
    decoder.set_max_size(0)  # the table emptied: the remembered decode must not answer
    after = decoder.decode(repeated)
    assert after.headers == [(":method", "POST")] and after.unknown == 2


def test_late_decoder_reports_unknown_then_trusts_after_size_update_zero():
    encoder = Encoder()
    encoder.encode([("x-old", "value")])  # inserted before the agent joined
    decoder = TolerantDecoder(complete=False)
    block = decoder.decode(encoder.encode([("x-old", "value"), (":method", "GET")]))
    assert block.unknown == 1 and block.headers == [(":method", "GET")]
    encoder.header_table_size = 0  # the encoder empties its table: a size update leads the next block
    decoder.decode(encoder.encode([]))
    encoder.header_table_size = 4096
    block = decoder.decode(encoder.encode([("x-old", "value")]))
    assert decoder.complete and block.unknown == 0 and decoder.recoveries == 1
    assert decoder.decode(encoder.encode([("x-old", "value")])).headers == [("x-old", "value")]


def test_late_decoder_trusts_once_known_entries_fill_the_table():
    encoder = Encoder()
    encoder.encode([("x-old", "v")])
    decoder = TolerantDecoder(complete=False)
    for i in range(40):  # 40 entries of > 100 bytes push everything older out
        decoder.decode(encoder.encode([(f"x-new-{i}", "v" * 80)]))
    assert decoder.complete
    assert decoder.decode(encoder.encode([(f"x-new-39", "v" * 80)])).unknown == 0


def test_malformed_block_is_reported_not_raised():
    decoder = TolerantDecoder()
    assert decoder.decode(b"\x80").malformed  # index 0
    assert decoder.decode(b"\x40\x7f").malformed  # string length past the end
    assert TolerantDecoder().decode(b"\xff\xff\xff\xff\xff\xff\xff").malformed


def test_detector_openings():
    detector = Http2Detector()
    assert detector.detect(Direction.EGRESS, PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00") == Direction.EGRESS
    assert detector.detect(Direction.EGRESS, PREFACE[:10]) is None
    upgrade = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\r\n"
    assert detector.detect(Direction.INGRESS, upgrade) == Direction.INGRESS
    assert detector.detect(Direction.INGRESS, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") is None
    assert detector.detect(Direction.INGRESS, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03") is None  # TLS
    assert detector.detect(Direction.INGRESS, b"HTTP/1.1 200 OK\r\n\r\n") is None
    ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"x" * 8
    assert detector.detect(Direction.INGRESS, ping) == Direction.INGRESS  # a late connection, role unknown yet
    assert detector.detect(Direction.INGRESS, ping[:8] + b"\x01" + ping[9:]) is None  # PING on a stream


def test_detector_reads_the_role_of_a_late_connection_from_its_headers():
    detector = Http2Detector()
    requests = [data for d, _, data in GRPC_ALL if d == 0 and len(data) > 9 and data[3] == 1]
    responses = [data for d, _, data in GRPC_ALL if d == 1 and len(data) > 9 and data[3] == 1]
    # the client wrote a request (late: the last one is all dynamic indices but :method POST)
    assert detector.detect(Direction.EGRESS, requests[-1]) == Direction.EGRESS
    # the server read it
    assert detector.detect(Direction.INGRESS, requests[-1]) == Direction.INGRESS
    # the client read a response (":status 200", static): requests go the other way
    assert detector.detect(Direction.INGRESS, responses[1]) == Direction.EGRESS
