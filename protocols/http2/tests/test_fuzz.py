"""Property tests: arbitrary bytes never raise, every started exchange ends once,
and any split of a real capture gives the same exchanges."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.base import Direction, ExchangeAbandoned, ExchangeCompleted, ExchangeStarted
from protocols.http2.detect import Http2Detector
from protocols.http2.stitch import Http2Session
from protocols.http2.tests.traffic import GRPC_ALL, as_seen_by
from protocols.http2.types import PREFACE

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_FRAGMENTS = [data for _, _, data in GRPC_ALL] + [
    PREFACE,
    b"GET / HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"\x00\x00\x04\x03\x00\x00\x00\x00\x01\x00\x00\x00\x08",  # RST_STREAM 1
    b"\x00\x00\x08\x07\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # GOAWAY 0
    b"\x00\x00\x01\x01\x05\x00\x00\x00\x01\x3f",  # HEADERS with a size update prefix cut short
]
_CHUNK = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(_FRAGMENTS),
    st.sampled_from(_FRAGMENTS).flatmap(lambda f: st.integers(0, len(f)).map(lambda cut: f[cut:])),
)
_FEED = st.tuples(st.sampled_from(list(Direction)), _CHUNK, st.one_of(st.just(0), st.integers(0, 3000)))


@FUZZ
@given(st.lists(_FEED, max_size=30), st.booleans())
def test_arbitrary_input_never_raises_and_every_exchange_ends_once(feeds, progress):
    session = Http2Session(Direction.EGRESS, progress=progress)
    events = []
    errors = 0
    for ts, (direction, data, missing) in enumerate(feeds):
        events.extend(session.feed(direction, data, ts, missing))
        # a count: it never goes back (a reset on resync would hide errors from the self-metric)
        assert session.parse_errors >= errors
        errors = session.parse_errors
    events.extend(session.close(10_000))
    started = {id(e.exchange) for e in events if isinstance(e, ExchangeStarted)}
    ended = [id(e.exchange) for e in events if isinstance(e, (ExchangeCompleted, ExchangeAbandoned))]
    assert len(ended) == len(set(ended))
    assert set(ended) == started


@FUZZ
@given(st.binary(max_size=600), st.sampled_from(list(Direction)))
def test_detector_never_raises(data, direction):
    Http2Detector().detect(direction, data)


def _summary(events):
    out = []
    for event in events:
        if isinstance(event, (ExchangeCompleted, ExchangeAbandoned)):
            ex = event.exchange
            out.append((ex.stream_id, ex.kind, ex.outcome, ex.request.headers, ex.request.trailers,
                        ex.request.body_size, ex.request.grpc_messages, ex.response.headers,
                        ex.response.trailers, ex.response.body_size, ex.response.grpc_messages,
                        ex.hpack_incomplete))
    return out


@FUZZ
@given(st.data(), st.sampled_from(["client", "server"]), st.integers(0, 8))
def test_any_split_of_a_capture_gives_the_same_exchanges(data, side, skip):
    """Writes re-cut at random points (as reads of a socket may be) change nothing,
    from the start or joined late (``skip`` writes missed)."""
    capture = GRPC_ALL[skip:] if skip else GRPC_ALL
    whole = as_seen_by(capture, side)
    expected = _summary(_feed_all(whole))
    resplit = []
    for direction, chunk, ts in whole:
        cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(chunk) - 1)), max_size=3), label="cuts"))
        pieces = [chunk[a:b] for a, b in zip([0] + cuts, cuts + [len(chunk)]) if chunk[a:b]]
        resplit.extend((direction, piece, ts) for piece in pieces)
    assert _summary(_feed_all(resplit)) == expected


def _feed_all(chunks):
    session = Http2Session(Direction.EGRESS)
    events = []
    for direction, chunk, ts in chunks:
        events.extend(session.feed(direction, chunk, ts))
    return events


_HEADER = st.tuples(
    st.sampled_from([":path", ":authority", "content-type", "grpc-timeout", "x-trace", "user-agent"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/._-", max_size=40),
)


@FUZZ
@given(st.lists(st.lists(_HEADER, min_size=1, max_size=6), min_size=1, max_size=30),
       st.sampled_from([256, 4096]), st.integers(0, 29))
def test_tolerant_decoder_agrees_with_hpack_and_never_lies_when_late(blocks, table_size, join):
    """From the start it decodes exactly what hpack does; joined at block ``join`` it
    decodes each field either right or not at all, and is right again once trusted."""
    from hpack import Decoder, Encoder

    from protocols.http2.hpack_state import TolerantDecoder

    encoder = Encoder()
    encoder.header_table_size = table_size
    reference, fresh, late = Decoder(), TolerantDecoder(), TolerantDecoder(complete=False)
    for index, headers in enumerate(blocks):
        block = encoder.encode(headers)
        expected = [(n.decode() if isinstance(n, bytes) else n, v.decode() if isinstance(v, bytes) else v)
                    for n, v in reference.decode(block)]
        assert fresh.decode(block).headers == expected
        if index >= join:
            trusted = late.complete
            decoded = late.decode(block)
            assert not decoded.malformed
            got = iter(decoded.headers)
            expected_iter = iter(expected)
            for field in got:  # what decoded is a subsequence of the truth, in order
                assert any(field == truth for truth in expected_iter)
            if trusted:
                assert decoded.headers == expected and decoded.unknown == 0


_REPEATED_HEADER = st.tuples(st.sampled_from([":path", "x-tenant", "grpc-timeout"]), st.sampled_from(["a", "bb", "/c"]))


@FUZZ
@given(st.lists(st.lists(_REPEATED_HEADER, min_size=1, max_size=3), min_size=2, max_size=40),
       st.sampled_from([64, 256, 4096]), st.lists(st.integers(0, 39), max_size=3))
def test_tolerant_decoder_agrees_with_hpack_on_blocks_that_repeat(blocks, table_size, resizes):
    """Few distinct fields: the same block bytes recur (decoded once, then remembered)
    between insertions, evictions and size updates that move what they refer to."""
    from hpack import Decoder, Encoder

    from protocols.http2.hpack_state import TolerantDecoder

    encoder, reference, decoder = Encoder(), Decoder(), TolerantDecoder()
    encoder.header_table_size = table_size
    for index, headers in enumerate(blocks):
        if index in resizes:
            encoder.header_table_size = 64 if encoder.header_table_size != 64 else table_size
        block = encoder.encode(headers)
        expected = [(str(n), str(v)) for n, v in reference.decode(block)]
        decoded = decoder.decode(block)
        assert (decoded.headers, decoded.unknown, decoded.malformed) == (expected, 0, False)

