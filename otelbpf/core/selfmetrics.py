"""The agent's own counters (``otelbpf.*``): honest about loss.

Every drop, truncation, parse error and eviction in the pipeline increments a
counter here. They are logged at exit (and on an interval when asked) and
exported as OTLP metrics. Increments come from the pipeline thread and the
export threads, so updates take a lock; they happen per batch or per
anomaly, not per byte, so the lock is cheap.
"""

from __future__ import annotations

import threading
from typing import Iterator

# Names and what they count. Keep in sync with README "Self-metrics".
DESCRIPTIONS: dict[str, str] = {
    "otelbpf.events": "events received from the source",
    "otelbpf.events.lost": "events the kernel could not deliver (ring buffer full)",
    "otelbpf.events.discarded": "records read and dropped undecoded (--discard-events, a benchmarking aid)",
    "otelbpf.agent.idle_sleeps": "times the agent, idle, slept until the kernel's next record instead of draining on its timer",
    "otelbpf.payload.truncated": "data events whose payload exceeded --capture-bytes",
    "otelbpf.connections.opened": "connections seen",
    "otelbpf.connections.evicted": "connections dropped because the table was full",
    "otelbpf.connections.unrecognized": "connections whose protocol was not recognized",
    "otelbpf.parse.errors": "malformed protocol input skipped",
    "otelbpf.exchanges.incomplete": "exchanges that ended without a complete response",
    "otelbpf.exchanges.evicted": "exchanges dropped because too many were outstanding",
    "otelbpf.exchanges.unended": "exchanges their session left open, ended by the pipeline (by protocol)",
    "otelbpf.protocol.violations": "session events that broke the exchange lifecycle (ended twice, never started)",
    "otelbpf.spans.unmapped": "exchanges of a protocol with no registered span semantics",
    "otelbpf.spans.failed": "exchanges whose span semantics raised (a bug, logged once per occurrence)",
    "otelbpf.calls.unhandled": "library calls of a library with no registered call semantics",
    "otelbpf.events.unknown": "events of a type the pipeline has no handler for",
    "otelbpf.budget.connections.shed": "connections no longer traced to keep the agent within --max-cpu",
    "otelbpf.spans.created": "spans built from exchanges",
    "otelbpf.export.spans": "spans handed to a sink successfully",
    "otelbpf.export.dropped": "spans dropped at export (queue full, or never delivered)",
    "otelbpf.export.failures": "failed export attempts (retried while the queue allows)",
    "otelbpf.association.ambiguous": "spans left without a parent because the evidence was ambiguous",
    "otelbpf.association.pending_evicted": "client spans not offered for connection pairing (too many waiting)",
    "otelbpf.association.messages_evicted": "sent messages (DDS samples) forgotten before their readers linked to them (bound)",
    "otelbpf.association.late_clients": "server spans linked to a client span on their connection that was stamped after the server read the request (loopback)",
    "otelbpf.profiles.cpu_time": "the agent's own CPU on profiles, microseconds, by stage: pipeline (decode, link, build stacks), export (encode, send)",
    "otelbpf.association.orphans_evicted": "server spans without a client span forgotten before a late one could link them (bound)",
    "otelbpf.propagation.contexts.written": "trace contexts written on the wire: TCP options on a request's first segment (retransmits count again)",
    "otelbpf.propagation.contexts.read": "trace contexts read from the wire: TCP options on traced servers' segments",
    "otelbpf.propagation.contexts.stripped": "requests that came without a context on a connection whose earlier requests carried one (a path that strips it, or a sender that skipped it)",
    "otelbpf.propagation.contexts.no_space": "requests whose TCP option found no room in the header (SACK blocks, MD5) or was refused: not written",
    "otelbpf.propagation.contexts.unplaced": "TCP options that came on no request's first byte (requests pipelined into one read): not adopted",
    "otelbpf.propagation.adopted": "server spans made children of another node's client span (TCP option)",
    "otelbpf.propagation.conflicts": "client spans whose context on the wire named another trace than their parent's: a root of that trace, linked to the parent",
    "otelbpf.propagation.unclaimed": "contexts written on the wire for a request no client span took (the other node's span names a parent not exported here)",
}


class Counters:
    """Thread-safe monotonic counters keyed by name and optional label."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, str], int] = {}

    def add(self, name: str, amount: int = 1, label: str = "") -> None:
        if amount == 0:
            return
        key = (name, label)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def get(self, name: str, label: str | None = None) -> int:
        """Value for ``name``; with ``label=None`` the sum over all labels."""
        with self._lock:
            if label is not None:
                return self._values.get((name, label), 0)
            return sum(v for (n, _), v in self._values.items() if n == name)

    def items(self) -> Iterator[tuple[str, str, int]]:
        with self._lock:
            snapshot = sorted(self._values.items())
        for (name, label), value in snapshot:
            yield name, label, value

    def as_dict(self) -> dict[str, int]:
        """Flat view for logs and tests: ``name`` or ``name{label}`` -> value."""
        out: dict[str, int] = {}
        for name, label, value in self.items():
            out[f"{name}{{{label}}}" if label else name] = value
        return out
