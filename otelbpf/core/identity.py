"""A span's identity, fixed when its request starts, and the trace it belongs to.

Most parents are known at a request's start. One is not: an asyncio task's
backend call, whose request is known only when the task writes a response.
So a span does not hold its trace ID directly but a :class:`TraceGroup`,
shared by every span known to be in the same trace. When a deferred decision
links a call to its request, the call's group merges into the request's
(union-find), and the call's whole subtree, including spans in other
processes linked to it meanwhile, moves into that trace. Spans of a group
with decisions pending are held back, then exported with the final trace ID.
"""

from __future__ import annotations

from dataclasses import dataclass

from otelbpf.core.model import SpanKind, SpanRecord


class TraceGroup:
    __slots__ = ("_trace_id", "_trace_state", "_parent", "pending", "held", "wired")

    def __init__(self, trace_id: bytes, trace_state: str = "") -> None:
        self._trace_id = trace_id
        self._trace_state = trace_state
        self._parent: TraceGroup | None = None
        #: Parent decisions still open for spans of this group (on the root).
        self.pending = 0
        #: Finished spans waiting for those decisions (on the root).
        self.held: list[SpanRecord] = []
        #: Its trace id went on the wire (a CLIENT span of it carried the kernel's
        #: context to another node): it must keep it, so it joins no other trace.
        self.wired = False

    def root(self) -> "TraceGroup":
        group = self
        while group._parent is not None:
            if group._parent._parent is not None:
                group._parent = group._parent._parent  # path halving
            group = group._parent
        return group

    @property
    def trace_id(self) -> bytes:
        return self.root()._trace_id

    @property
    def trace_state(self) -> str:
        return self.root()._trace_state

    def merge_into(self, other: "TraceGroup") -> "TraceGroup":
        """This group's spans join ``other``'s trace. Returns the common root."""
        mine, theirs = self.root(), other.root()
        if mine is theirs:
            return theirs
        mine._parent = theirs
        theirs.wired = theirs.wired or mine.wired
        theirs.pending += mine.pending
        theirs.held.extend(mine.held)
        mine.pending = 0
        mine.held = []
        return theirs

    def can_join(self, other: "TraceGroup") -> bool:
        """May this group's spans move into ``other``'s trace? Not when its trace id is
        on the wire and differs: the other node's spans already name it."""
        mine = self.root()
        return mine is other.root() or not mine.wired or mine._trace_id == other.root()._trace_id


@dataclass(repr=False)
class SpanStart:
    """Identity and placement of a span, fixed when its request starts.

    Built per request: a dataclass over an explicit ``__init__`` and ``__slots__``
    (a slotted dataclass as plain Python, an extension type with a C ``__init__``
    compiled; identity.pxd declares its fields). Its repr leaves out ``span``.
    """

    __slots__ = ("group", "span_id", "parent_span_id", "kind", "pid", "tid", "association", "task_id",
                 "start_ns", "links", "span", "awaits_client")
    group: TraceGroup
    span_id: bytes
    parent_span_id: bytes
    kind: SpanKind
    pid: int
    tid: int
    #: Which rule chose the parent (otelbpf.association), "" for a plain root.
    association: str
    #: asyncio task (coroutine) that started the request, 0 if none.
    task_id: int
    start_ns: int
    #: Spans this one is linked to (not parented by): a received message's
    #: sending span (otelbpf.association, rule ``message``).
    #: A shared empty tuple until one is added (no allocation per span).
    links: "tuple[SpanStart, ...] | list[SpanStart]"
    #: The finished span while it is held for a deferred decision of its
    #: trace (which may still amend it); None otherwise.
    span: SpanRecord | None
    #: The connection pair key under which this SERVER span, which found no
    #: CLIENT span, waits for a late one while it is open (otelbpf.association,
    #: LATE_CLIENT_WINDOW_NS); None otherwise.
    awaits_client: tuple | None

    def __init__(self, group, span_id, parent_span_id, kind, pid, tid, association="", task_id=0, start_ns=0,
                 links=(), span=None, awaits_client=None) -> None:
        self.group = group
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.kind = kind
        self.pid = pid
        self.tid = tid
        self.association = association
        self.task_id = task_id
        self.start_ns = start_ns
        self.links = links
        self.span = span
        self.awaits_client = awaits_client

    def __repr__(self) -> str:
        return (f"SpanStart(group={self.group!r}, span_id={self.span_id!r}, parent_span_id={self.parent_span_id!r}, "
                f"kind={self.kind!r}, pid={self.pid!r}, tid={self.tid!r}, association={self.association!r}, "
                f"task_id={self.task_id!r}, start_ns={self.start_ns!r}, links={self.links!r})")

    @property
    def trace_id(self) -> bytes:
        return self.group.trace_id

    @property
    def trace_state(self) -> str:
        return self.group.trace_state
