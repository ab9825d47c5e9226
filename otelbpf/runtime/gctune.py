"""Cyclic garbage collection set for the agent's steady state.

Each traced request allocates a few dozen short-lived container objects
(messages, exchanges, span records, attribute dicts). Reference counting
frees them; almost none are in cycles. With CPython's default thresholds
(700, 10, 10) the cycle collector still runs every ~25 requests, and every
few thousand requests it walks the whole heap, which after start-up holds
BCC, gRPC, protobuf and OpenTelemetry: ~3 us of CPU per request of the ~18
the user-space hot path costs (``bench/pipeline_hot_path.py --gc default``
reports it). Once start-up is over, :func:`tune`:

* freezes what exists (``gc.freeze``): objects made at start-up are never
  walked again (they are not freed either, as nearly all live to the end);
* raises the youngest generation's threshold to :data:`GEN0_THRESHOLD`, so
  collections run ~30x less often and find most young objects already gone.

Cycles are still collected, after at most that many more allocations than
deallocations: memory stays bounded.
"""

from __future__ import annotations

import gc

#: Net container allocations between two collections of the youngest generation.
GEN0_THRESHOLD = 20_000
#: Collections of one generation between two of the next (CPython's default is 10).
OLDER_THRESHOLD = 20


def tune() -> tuple[int, int, int]:
    """Freeze the start-up heap and collect less often. Returns the thresholds it replaced."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, OLDER_THRESHOLD, OLDER_THRESHOLD)
    return previous
