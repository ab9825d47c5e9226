"""Property tests: any datagram is survived, and every started exchange ends once."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.base import Direction, ExchangeCompleted, ExchangeStarted
from protocols.rtps import RtpsDetector, wire
from protocols.rtps.tests import build

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID = [
    build.announce_writer(build.PREFIX_A, build.USER_WRITER, "rt/chatter"),
    build.announce_reader(build.PREFIX_B, build.USER_READER, "rt/chatter", little=False),
    build.sample(build.PREFIX_A, build.USER_WRITER, 1, ts_ns=5),
    build.sample(build.PREFIX_A, build.USER_WRITER, 3, little=False),
    build.header() + build.data_frag(build.USER_WRITER, 4, 1, b"z" * 64, 64, 128),
    build.header() + build.data_frag(build.USER_WRITER, 4, 2, b"z" * 64, 64, 128, little=False),
    build.header() + build.heartbeat(build.USER_WRITER, 1, 9) + build.gap(build.USER_WRITER, 2, 3, [4]),
    build.header() + build.acknack(build.USER_WRITER, 1, [1, 2]) + build.info_dst(build.PREFIX_B),
]

datagram = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=200).map(lambda tail: build.header() + tail),
    st.tuples(st.sampled_from(VALID), st.integers(0, 400), st.binary(min_size=1, max_size=4)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + len(t[2]) :]  # a valid message with bytes overwritten
    ),
    st.tuples(st.sampled_from(VALID), st.integers(20, 400)).map(lambda t: t[0][: t[1]]),  # cut short
    st.sampled_from(VALID),
)
feeds = st.lists(
    st.tuples(st.sampled_from([Direction.INGRESS, Direction.EGRESS]), datagram, st.integers(0, 64)), max_size=30
)


@FUZZ
@given(feeds)
def test_any_datagrams_never_raise_and_every_exchange_ends_once(steps):
    detector = RtpsDetector()
    session = detector.new_session(Direction.INGRESS)
    started, ended = [], []
    ts = 0
    for direction, data, missing in steps:
        ts += 1_000
        for event in session.feed(direction, data, ts, missing):
            (started if type(event) is ExchangeStarted else ended).append(event.exchange)
    for event in session.close(ts + 1):
        assert type(event) is ExchangeCompleted
        ended.append(event.exchange)
    # the exchange objects stay referenced here, so their ids are unique
    assert sorted(map(id, started)) == sorted(map(id, ended))
    assert len(set(map(id, ended))) == len(ended)


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 100))
def test_decoder_raises_only_rtps_error(data, missing):
    try:
        wire.parse_message(data, missing)
    except wire.RtpsError:
        pass


@FUZZ
@given(st.binary(max_size=120), st.booleans())
def test_parameter_lists_raise_only_rtps_error(data, little):
    try:
        wire.parameters(data, little)
    except wire.RtpsError:
        pass
