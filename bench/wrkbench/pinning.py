"""Which CPU runs what: nginx, the load generator (wrk and the receiver) and the agent apart.

On loopback the client's kernel work is as large as the server's, so an unpinned run measures a
tangle of both. By default nginx gets the first CPU and the client the others; the agent runs
either on nginx's core (its CPU comes from the traced service) or on its own (bench/README.md).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from .console import BenchError, say


@dataclass
class Layout:
    server: str | None  # nginx (master and workers)
    client: str | None  # wrk and the OTLP receiver
    agent: str | None   # otelbpf, "on nginx's core" (modes on, idle, kstop)
    agent_own: str | None = None  # otelbpf, "on its own core" (mode own): not nginx's

    def describe(self) -> str:
        if not (self.server or self.client or self.agent):
            return "no pinning (every process may run on every CPU)"
        own = f"; mode 'own': agent on CPU {self.agent_own or 'any'}" + (" (shared with wrk + receiver)" if self.agent_own and self.agent_own == self.client else "")
        return f"nginx on CPU {self.server or 'any'}, wrk + OTLP receiver on CPU {self.client or 'any'}, agent on CPU {self.agent or 'any'}{own}"


def parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def choose_layout(args: argparse.Namespace) -> Layout:
    available = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(available) < 2:
        if not args.no_pin:
            say(f"note: only {len(available)} CPU(s) available: not pinning")
        return Layout(None, None, None)
    server = args.server_cpus or str(available[0])
    client = args.client_cpus or ",".join(str(c) for c in available[1:])
    agent = {"server": server, "client": client, "any": None}.get(args.agent_cpus, args.agent_cpus)
    for name, value in (("--server-cpus", server), ("--client-cpus", client), ("--agent-cpus", agent)):
        if value and not parse_cpu_list(value) <= set(available):
            raise BenchError(f"{name} {value}: not among the CPUs this process may use ({available})")
    own = args.agent_own_cpus or client
    if own and not parse_cpu_list(own) <= set(available):
        raise BenchError(f"--agent-own-cpus {own}: not among the CPUs this process may use ({available})")
    if own and server and parse_cpu_list(own) & parse_cpu_list(server):
        raise BenchError(f"--agent-own-cpus {own} overlaps nginx's CPUs {server}")
    return Layout(server, client, agent, own)
