"""Property tests: whatever bytes come back from a RAS port, the reader answers with a report or
a RasParseError, never anything else."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.nccl import ras
from protocols.nccl.tests.test_ras import JSON_2_28_9, JSON_2_29, TEXT_2_25, TEXT_2_28

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID = [JSON_2_29, JSON_2_28_9, TEXT_2_28, TEXT_2_25]

reply = st.one_of(
    st.binary(max_size=400),
    st.tuples(st.sampled_from(VALID), st.integers(0, 2000), st.binary(min_size=1, max_size=6)).map(
        lambda t: (t[0][: t[1]].encode() + t[2] + t[0][t[1] + len(t[2]) :].encode())  # bytes overwritten
    ),
    st.tuples(st.sampled_from(VALID), st.integers(0, 3000)).map(lambda t: t[0][: t[1]].encode()),  # cut short
)


@FUZZ
@given(reply)
def test_any_reply_is_a_report_or_a_clear_error(data):
    try:
        report = ras.parse_report(data)
    except ras.RasParseError:
        return
    for communicator in report.communicators:
        communicator.spread()
        communicator.counts_by_function()


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["rank", "host", "pid", "status", "collective_counts", "AllReduce", "hash", "ranks", "missing_ranks",
         "init_state", "unresponsive", "considered_dead", "size", "x"]), inner, max_size=5),
    max_leaves=20,
)


@FUZZ
@given(st.lists(json_value, max_size=3), json_value)
def test_any_json_shape_is_a_report_or_a_clear_error(communicators, ras_section):
    import json

    document = {"nccl_version": "2.29.2", "communicators": communicators, "ras": ras_section}
    try:
        ras.parse_report(json.dumps(document).encode())
    except ras.RasParseError:
        pass
