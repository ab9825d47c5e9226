"""Keeps the agent within a CPU budget (``--max-cpu``) by tracing fewer connections.

A production agent must never take more CPU than it was given, and must
never slow the traced application to keep up: the kernel side never blocks
(a full ring buffer drops and counts), and this controller sheds work in
user space. Every second it compares the agent's CPU time (all threads:
decoding, spans, export) with the budget. Over budget, it raises the share
of connections that are shed (``ConnectionTable.shed_permille``): a shed
connection is muted in the kernel, new ones at once, open ones as soon as no
exchange is open on them, so a span that started is always finished, never
cut. Well under budget, it lowers the share again for new connections.
Everything shed is counted (``otelbpf.budget.connections.shed``) and the
current share is exported as the gauge ``otelbpf.budget.shed_ratio``.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("otelbpf.budget")

#: How often the budget is checked.
WINDOW_S = 1.0
#: Below this share of the budget, shedding is eased.
EASE_BELOW = 0.7
#: Smallest step of the shed share, per mille.
STEP_PERMILLE = 50


class CpuBudget:
    """Decides the shed share from the agent's CPU use; ``max_cpu`` is in cores (0.5 = half a core)."""

    def __init__(self, max_cpu: float, table, clock=time.monotonic, cpu_clock=time.process_time) -> None:
        if not max_cpu > 0:
            raise ValueError(f"--max-cpu must be a positive number of cores, got {max_cpu!r}")
        self.max_cpu = max_cpu
        self.table = table
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._last_wall = clock()
        self._last_cpu = cpu_clock()
        self.last_usage = 0.0

    @property
    def shed_ratio(self) -> float:
        return self.table.shed_permille / 1000

    def tick(self) -> None:
        """Call often (every drain); acts once per window."""
        wall = self._clock()
        elapsed = wall - self._last_wall
        if elapsed < WINDOW_S:
            return
        cpu = self._cpu_clock()
        usage = (cpu - self._last_cpu) / elapsed
        self._last_wall, self._last_cpu = wall, cpu
        self.last_usage = usage
        self.table.shed_permille = self.next_permille(self.table.shed_permille, usage)

    def next_permille(self, current: int, usage: float) -> int:
        """Over budget: keep the traced share in proportion (budget / usage of what
        is still traced), at least one step more shed. Well under: shed less."""
        budget = self.max_cpu
        if usage > budget:
            kept = (1000 - current) * budget / usage
            new = min(1000, max(current + STEP_PERMILLE, round(1000 - kept)))
            if current == 0:
                log.warning(
                    "otelbpf: over the CPU budget (%.2f of %.2f cores): shedding %.0f%% of connections",
                    usage, budget, new / 10,
                )  # fmt: skip
            return new
        if current and usage < budget * EASE_BELOW:
            new = max(0, current - STEP_PERMILLE)
            if new == 0:
                log.info("otelbpf: back within the CPU budget (%.2f of %.2f cores): tracing every connection", usage, budget)
            return new
        return current
