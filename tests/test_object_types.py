"""The per-request objects: slotted dataclasses as plain Python, extension types compiled.

Each is a ``@dataclass`` over an explicit ``__init__`` and ``__slots__`` (DEVELOPERS.md,
"The compiled hot path"), so a field lives in four places: the annotations, ``__slots__``,
``__init__`` and the ``.pxd``. These tests fail when they disagree, in either build, and
check that the compiled build really made each class an extension type with a C
``__init__``.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import inspect
import sys

import pytest

from otelbpf.core.events import DataEvent
from otelbpf.core.identity import SpanStart, TraceGroup
from otelbpf.core.model import SpanKind, SpanLink, SpanRecord
from protocols.base import Direction, ExchangeAbandoned, ExchangeCompleted, ExchangeProgress, ExchangeStarted, Phase
from protocols.http1.parse import BodyData, HeadComplete, MessageComplete
from protocols.http1.types import HttpExchange, HttpRequest, HttpResponse

# (class, the arguments a minimal instance needs)
CLASSES = [
    (HttpRequest, {}),
    (HttpResponse, {}),
    (HttpExchange, {"request": HttpRequest()}),
    (HeadComplete, {"message": HttpRequest()}),
    (BodyData, {"message": HttpRequest(), "data": b"x", "ts_ns": 1}),
    (MessageComplete, {"message": HttpRequest()}),
    (ExchangeStarted, {"exchange": None}),
    (ExchangeProgress, {"exchange": None, "phase": Phase.RESPONSE_START, "ts_ns": 1}),
    (ExchangeCompleted, {"exchange": None}),
    (ExchangeAbandoned, {"exchange": None}),
    (SpanLink, {"trace_id": b"t" * 16, "span_id": b"s" * 8}),
    (SpanRecord, {"trace_id": b"t" * 16, "span_id": b"s" * 8, "name": "GET", "kind": SpanKind.SERVER,
                  "start_ns": 1, "end_ns": 2, "pid": 3}),
    (SpanStart, {"group": TraceGroup(b"t" * 16), "span_id": b"s" * 8, "parent_span_id": b"",
                 "kind": SpanKind.SERVER, "pid": 3, "tid": 3}),
    (DataEvent, {"ts_ns": 1, "pid": 2, "tid": 2, "fd": 3, "conn_id": 4, "direction": Direction.INGRESS,
                 "total_len": 1, "data": b"x"}),
]
IDS = [cls.__name__ for cls, _ in CLASSES]


def _compiled(cls) -> bool:
    module = sys.modules[cls.__module__]
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def _all_slots(cls) -> list[str]:
    return [name for klass in reversed(cls.__mro__) for name in klass.__dict__.get("__slots__", ())]


@pytest.mark.parametrize(("cls", "args"), CLASSES, ids=IDS)
def test_fields_slots_and_init_agree(cls, args):
    names = [f.name for f in dataclasses.fields(cls)]
    assert names == _all_slots(cls)
    if not _compiled(cls):  # a C __init__ has no inspectable signature
        assert list(inspect.signature(cls.__init__).parameters)[1:] == names


@pytest.mark.parametrize(("cls", "args"), CLASSES, ids=IDS)
def test_every_field_settable_no_dict_and_dataclass_behaviour(cls, args):
    obj = cls(**args)
    assert not hasattr(obj, "__dict__")
    with pytest.raises(AttributeError):
        obj.not_a_field = 1
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        setattr(obj, f.name, value)  # declared in the .pxd (compiled) and in __slots__ (pure)
    copy = dataclasses.replace(obj)
    assert copy == obj and copy is not obj
    assert repr(obj).startswith(cls.__name__ + "(")


def test_fresh_containers_per_instance():
    assert HttpRequest().headers is not HttpRequest().headers
    a = SpanRecord(b"t" * 16, b"s" * 8, "GET", SpanKind.SERVER, 1, 2, 3)
    b = SpanRecord(b"t" * 16, b"s" * 8, "GET", SpanKind.SERVER, 1, 2, 3)
    assert a.attributes == {} and a.links == [] and a.attributes is not b.attributes and a.links is not b.links
    assert SpanStart(TraceGroup(b"t" * 16), b"s" * 8, b"", SpanKind.SERVER, 1, 1).links == ()


def test_span_start_repr_leaves_out_the_span():
    start = SpanStart(TraceGroup(b"t" * 16), b"s" * 8, b"", SpanKind.SERVER, 1, 1)
    start.span = SpanRecord(b"t" * 16, b"s" * 8, "GET", SpanKind.SERVER, 1, 2, 3)
    assert "span=" not in repr(start).replace("span_id=", "").replace("parent_span_id=", "")


@pytest.mark.parametrize(("cls", "args"), CLASSES, ids=IDS)
def test_compiled_build_makes_extension_types(cls, args):
    if not _compiled(cls):
        pytest.skip(f"{cls.__module__} runs as plain Python here")
    # an extension type's __init__ is a C slot, not a Python function
    assert not inspect.isfunction(cls.__init__), f"{cls.__name__}.__init__ is interpreted"


def test_trace_groups_merge_to_one_root_and_compile_to_an_extension_type():
    """TraceGroup (one per request) is an extension type when compiled, its parent link
    typed; merging keeps one root whose trace id every member reports, pending and held
    moved to it, and the walk halves paths."""
    a, b, c = TraceGroup(b"a" * 16, "x=1"), TraceGroup(b"b" * 16), TraceGroup(b"c" * 16)
    a.pending, a.held = 2, ["span-a"]
    assert a.merge_into(b) is b and b.merge_into(c) is c
    assert [g.trace_id for g in (a, b, c)] == [b"c" * 16] * 3 and a.trace_state == ""
    assert (c.pending, c.held, a.pending, a.held) == (2, ["span-a"], 0, [])
    assert a.root() is c and a._parent is c  # halved
    with pytest.raises(AttributeError):
        a.extra = 1
    if _compiled(TraceGroup):
        assert not inspect.isfunction(TraceGroup.__init__)


def test_connection_is_an_extension_type_when_compiled():
    """Connection (one per connection, read several times per request by the pipeline and
    the span semantics, which type it) is an extension type compiled, a slotted class pure:
    every slot settable, nothing else."""
    from otelbpf.core.connections import Connection

    conn = Connection(conn_id=1, pid=2, fd=3, opened_ns=4)
    for name in Connection.__slots__:
        setattr(conn, name, getattr(conn, name))
    with pytest.raises(AttributeError):
        conn.not_a_field = 1
    derived = conn.derived((1, 2), 1, 5)
    assert (derived.conn_id, derived.key, derived.source, derived.opened_ns) == (1, (1, 2), 1, 5)
    if _compiled(Connection):
        assert not inspect.isfunction(Connection.__init__)
