"""CPU per request of the HTTP/1 session alone (parsers + stitching), as the agent configures it.

Feeds the keep-alive GET/200 of ``pipeline_hot_path.py`` (nginx's 8-field
response with a 612-byte body, wrk's request) through one ``Http1Session``,
once per progress setting the agent uses:

* ``progress on, filtered out``: the default agent. GenAI observes progress,
  and its filter turns it down for anything that is not an LLM call;
* ``progress off``: no progress observer (a pipeline without the GenAI layer);
* ``progress on, every exchange``: as if every exchange were an LLM stream.

Prints the best and the median of ``--rounds`` runs, in CPU microseconds
per request (process time, garbage collector off). The session is a few
microseconds, so a change to it is lost in the noise of the whole chain
(``pipeline_stages.py``). Compare checkouts by alternated runs, best
against best::

    .venv/bin/python bench/http1_session.py [--requests N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pipeline_hot_path import REQUEST, RESPONSE  # noqa: E402
from protocols.base import Direction  # noqa: E402
from protocols.http1 import Http1Session  # noqa: E402

SETTINGS = (
    ("progress on, filtered out", {"progress": True, "progress_filter": lambda exchange: False}),
    ("progress off", {"progress": False}),
    ("progress on, every exchange", {"progress": True}),
)


def cpu_us_per_request(requests: int, settings: dict) -> float:
    session = Http1Session(Direction.INGRESS, body_limit=0, **settings)
    ts = 0
    started = time.process_time()
    for _ in range(requests):
        ts += 50_000
        session.feed(Direction.INGRESS, REQUEST, ts)
        session.feed(Direction.EGRESS, RESPONSE, ts + 20_000)
    return (time.process_time() - started) / requests * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.requests < 1 or args.rounds < 1:
        p.error("--requests and --rounds must be at least 1")
    gc.disable()
    print(f"{args.requests:,} requests x {args.rounds} rounds; CPU us per request")
    for name, settings in SETTINGS:
        runs = [cpu_us_per_request(args.requests, settings) for _ in range(args.rounds)]
        print(f"  {name:30s} best {min(runs):6.3f}   median {statistics.median(runs):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
