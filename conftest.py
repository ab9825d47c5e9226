"""Settings shared by every test directory.

Hypothesis' per-example deadline (200 ms) turns a busy CI machine into
flaky failures that say nothing about the code; the properties are what
the tests assert, so the deadline is off everywhere.

`make test` spreads the suite over pytest-xdist workers (``-n``,
``--dist loadgroup``). Each test file is one group, so a file runs on one
worker from start to end: its module-scoped fixtures (the two nodes and
their agents of the cross-node and slow-rank tests) start once, and its
tests keep their order. The eBPF tests of different files already share
the host with one another (each agent traces only its own test's
processes, network namespaces and ports are made per run), which is what
lets them run side by side.
"""

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("otelbpf", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("otelbpf")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """One xdist group per test file, unless a test names its own."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
