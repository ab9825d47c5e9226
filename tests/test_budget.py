"""The CPU budget: how the shed share follows the agent's CPU use, and that shedding
mutes connections only between exchanges (a started span is always finished)."""

from __future__ import annotations

import pytest

from otelbpf.core.events import ConnClose, Source
from otelbpf.core.model import SpanKind
from otelbpf.runtime.budget import STEP_PERMILLE, CpuBudget
from tests.test_pipeline import GET, IN, OK, OUT, accepted, data, make_pipeline


class Clocks:
    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def spend(self, seconds: float, cores: float) -> None:
        self.wall += seconds
        self.cpu += seconds * cores


def budget_with(max_cpu: float):
    pipeline, out, counters = make_pipeline()
    clocks = Clocks()
    budget = CpuBudget(max_cpu, pipeline.table, clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu)
    return budget, clocks, pipeline, out, counters


def test_over_budget_sheds_in_proportion_and_eases_back_when_well_under() -> None:
    budget, clocks, pipeline, _, _ = budget_with(0.5)
    clocks.spend(1.0, 0.4)
    budget.tick()
    assert pipeline.table.shed_permille == 0  # within budget
    clocks.spend(1.0, 1.0)  # twice the budget: keep half of what is traced
    budget.tick()
    assert pipeline.table.shed_permille == 500
    clocks.spend(1.0, 0.55)  # still a little over: at least one step more
    budget.tick()
    assert pipeline.table.shed_permille == 500 + STEP_PERMILLE
    clocks.spend(1.0, 0.45)  # under, but not well under: hold
    budget.tick()
    assert pipeline.table.shed_permille == 500 + STEP_PERMILLE
    clocks.spend(1.0, 0.1)
    budget.tick()
    assert pipeline.table.shed_permille == 500
    clocks.spend(0.5, 5.0)  # less than a window: nothing decided
    budget.tick()
    assert pipeline.table.shed_permille == 500


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="--max-cpu"):
        CpuBudget(0, object())


def test_shedding_waits_for_the_open_exchange_to_finish_then_mutes_the_connection() -> None:
    muted = []
    pipeline, out, counters = make_pipeline(on_unrecognized=lambda conn: muted.append((conn.conn_id, conn.source)))
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, GET)])  # a request is being served
    pipeline.table.shed_permille = 1000
    assert muted == []  # never mid-exchange
    pipeline.handle([data(20, 1, 100, OUT, OK)])
    [span] = out.spans
    assert span.kind == SpanKind.SERVER and "otelbpf.exchange.end_reason" not in span.attributes
    assert muted == [(1, Source.SOCKET)] and counters.get("otelbpf.budget.connections.shed") == 1
    pipeline.handle([data(30, 1, 100, IN, GET), data(40, 1, 100, OUT, OK), ConnClose(50, 100, 100, 5, 1)])
    assert len(out.spans) == 1  # nothing more from the shed connection, and nothing cut


def test_new_connections_are_shed_at_once_at_the_current_share() -> None:
    muted = []
    pipeline, out, _ = make_pipeline(on_unrecognized=lambda conn: muted.append(conn.conn_id))
    pipeline.table.shed_permille = 500
    events = []
    for conn_id in range(1, 201):
        events += [accepted(conn_id, 100, fd=conn_id), data(conn_id, conn_id, 100, IN, GET, fd=conn_id)]
        events += [data(conn_id + 1000, conn_id, 100, OUT, OK, fd=conn_id)]
    pipeline.handle(events)
    assert 60 <= len(muted) <= 140  # about half, chosen by a hash of the connection id
    assert len(out.spans) == 200 - len(muted)
    assert all("otelbpf.exchange.end_reason" not in s.attributes for s in out.spans)
