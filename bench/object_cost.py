"""What a per-request object costs to build and read, by how its class is written.

The agent builds ~12 small objects per traced request (messages, exchanges,
session events, span identity and record). This compiles one module per way of
writing such a class with Cython (as setup.py does, pure-Python mode) and times,
from compiled code, building ``--count`` of them with the call shapes the agent
uses (SpanRecord: 7 positional + 4 keyword arguments, two default factories;
HttpExchange: 2 keyword arguments) and reading a few attributes back::

    .venv/bin/python bench/object_cost.py [--count N] [--rounds R]

Ways: ``slotted`` ``@dataclass(slots=True)`` (a Python class; its generated
``__init__`` is interpreted bytecode even in a compiled module); ``dataclass``
``@dataclass`` made a ``cdef class`` by an augmenting ``.pxd`` (Cython's
dataclass: C ``__init__``, C fields); ``plain`` an explicit ``__init__`` and
``__slots__`` made a ``cdef class`` by a ``.pxd``; ``hybrid`` the same
under ``@dataclass`` with bare annotations (the decorator adds ``__eq__``,
``__repr__``, ``fields()``/``replace()`` and keeps the explicit ``__init__``:
what otelbpf uses); ``pure`` the slotted
dataclass not compiled at all. Needs Cython and a C compiler; no root.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

FIELDS = """\
    trace_id: bytes
    span_id: bytes
    name: str
    kind: int
    start_ns: int
    end_ns: int
    pid: int
    parent_span_id: bytes = b""
    attributes: dict = field(default_factory=dict)
    status_code: int = 0
    status_message: str = ""
    trace_state: str = ""
    links: list = field(default_factory=list)
    scope: str = "otelbpf"
    protocol: str = ""
"""

EXCHANGE_FIELDS = """\
    request: object
    response: object = None
    kind: int = 2
    outcome: str = "complete"
    protocol: str = "http1"
    abandoned_ns: int = 0
    correlation_key: object = None
    reports_progress: bool = False
"""

DRIVER = """

def build(n):
    out = None
    for i in range(n):
        out = Record(b"t" * 16, b"s" * 8, "GET", 2, i, i + 1, 42,
                     parent_span_id=b"", attributes={}, status_code=0, protocol="http1")
    return out


def build_exchange(n):
    out = None
    for i in range(n):
        out = Exchange(request=i, kind=2)
    return out


def read(objs):
    total = 0
    for o in objs:
        total += o.start_ns + o.end_ns + o.pid + len(o.name)
    return total
"""


def _dataclass_module(slots: bool) -> str:
    deco = "@dataclass(slots=True)" if slots else "@dataclass"
    return (
        "from dataclasses import dataclass, field\n\n\n"
        f"{deco}\nclass Record:\n{FIELDS}\n\n{deco}\nclass Exchange:\n{EXCHANGE_FIELDS}" + DRIVER
    )


def _annotations(fields: str) -> str:
    """The fields as bare annotations (no defaults: those live in ``__init__``)."""
    return "".join(line.split('=')[0].rstrip() + "\n" for line in fields.splitlines())


def _body(text: str) -> str:
    return textwrap.indent(textwrap.dedent(text), "    ")


def _plain_module(decorated: bool = False) -> str:
    names = [line.split(":")[0].strip() for line in FIELDS.splitlines()]
    xnames = [line.split(":")[0].strip() for line in EXCHANGE_FIELDS.splitlines()]
    deco = "@dataclass\n" if decorated else ""
    record_fields = _annotations(FIELDS) if decorated else ""
    exchange_fields = _annotations(EXCHANGE_FIELDS) if decorated else ""
    return "from dataclasses import dataclass\n\n\n" + deco + "class Record:\n" + record_fields + _body(f"""\
            __slots__ = {tuple(names)!r}

            def __init__(self, trace_id, span_id, name, kind, start_ns, end_ns, pid, parent_span_id=b"",
                         attributes=None, status_code=0, status_message="", trace_state="", links=None,
                         scope="otelbpf", protocol=""):
                self.trace_id = trace_id
                self.span_id = span_id
                self.name = name
                self.kind = kind
                self.start_ns = start_ns
                self.end_ns = end_ns
                self.pid = pid
                self.parent_span_id = parent_span_id
                self.attributes = {{}} if attributes is None else attributes
                self.status_code = status_code
                self.status_message = status_message
                self.trace_state = trace_state
                self.links = [] if links is None else links
                self.scope = scope
                self.protocol = protocol


        """) + "\n\n" + deco + "class Exchange:\n" + exchange_fields + _body(f"""\
            __slots__ = {tuple(xnames)!r}

            def __init__(self, request, response=None, kind=2, outcome="complete", protocol="http1",
                         abandoned_ns=0, correlation_key=None, reports_progress=False):
                self.request = request
                self.response = response
                self.kind = kind
                self.outcome = outcome
                self.protocol = protocol
                self.abandoned_ns = abandoned_ns
                self.correlation_key = correlation_key
                self.reports_progress = reports_progress
        """) + DRIVER


def _pxd() -> str:
    names = [line.split(":")[0].strip() for line in FIELDS.splitlines()]
    xnames = [line.split(":")[0].strip() for line in EXCHANGE_FIELDS.splitlines()]
    record = "".join(f"    cdef public object {n}\n" for n in names)
    exchange = "".join(f"    cdef public object {n}\n" for n in xnames)
    return f"cdef class Record:\n{record}\n\ncdef class Exchange:\n{exchange}"


def build_variants(where: Path) -> dict[str, object]:
    from Cython.Build import cythonize
    from setuptools import Extension
    from setuptools.dist import Distribution

    sources = {
        "objcost_slotted": (_dataclass_module(True), None),
        "objcost_dataclass": (_dataclass_module(False), _pxd()),
        "objcost_plain": (_plain_module(), _pxd()),
        "objcost_hybrid": (_plain_module(decorated=True), _pxd()),
    }
    exts = []
    for name, (py, pxd) in sources.items():
        (where / f"{name}.py").write_text(py)
        if pxd:
            (where / f"{name}.pxd").write_text(pxd)
        exts.append(Extension(name, [str(where / f"{name}.py")]))
    (where / "objcost_pure.py").write_text(_dataclass_module(True))
    dist = Distribution({"ext_modules": cythonize(exts, quiet=True, compiler_directives={
        "language_level": 3, "annotation_typing": False})})
    cmd = dist.get_command_obj("build_ext")
    cmd.inplace = False
    cmd.build_lib = str(where)
    cmd.build_temp = str(where / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    sys.path.insert(0, str(where))
    modules = {name.split("_", 1)[1]: importlib.import_module(name) for name in sources}
    modules["pure"] = importlib.import_module("objcost_pure")
    return modules


def _time(fn, arg) -> float:
    started = time.perf_counter()
    fn(arg)
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="objcost") as tmp:
        modules = build_variants(Path(tmp))
        print(f"ns per object, median of {args.rounds} rounds x {args.count:,} (compiled caller unless 'pure')")
        print(f"{'way':<10} {'SpanRecord':>11} {'HttpExchange':>13} {'read 4 attrs':>13}")
        for way, mod in modules.items():
            objs = [mod.build(1) for _ in range(10_000)]
            build = statistics.median(_time(mod.build, args.count) for _ in range(args.rounds))
            exch = statistics.median(_time(mod.build_exchange, args.count) for _ in range(args.rounds))
            read = statistics.median(_time(mod.read, objs * (args.count // 10_000)) for _ in range(args.rounds))
            scale = 1e9 / args.count
            print(f"{way:<10} {build * scale:>11.1f} {exch * scale:>13.1f} {read * scale:>13.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
