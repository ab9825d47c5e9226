"""The plain profile data every part of otelbpf/profiles shares.

A :class:`Sample` is one observation of one thread: where it was (a stack of
:class:`Frame`, leaf first, as OTLP lists locations), what it weighs (one
value per sample type of its :class:`ProfileType`), when, and which span the
thread was serving then. The sampler and the GPU call probes produce them;
the aggregator groups them per export interval and the encoders (OTLP, pprof,
the flame graph) read them. Nothing here knows BPF or protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Frame kinds, as the OTLP profiles' ``profile.frame.type`` attribute spells
#: them (the OpenTelemetry eBPF profiler's values, so backends colour alike).
FRAME_NATIVE = "native"
FRAME_PYTHON = "cpython"
FRAME_KERNEL = "kernel"
#: A GPU kernel, on top of the stack that launched it (otelbpf/profiles/gpu_kernels.py).
FRAME_CUDA = "cuda"
#: Not a frame of the program: where unwinding had to stop, and why.
FRAME_MARKER = "abort-marker"


@dataclass(frozen=True, slots=True)
class Mapping:
    """One mapped file of a process (a line of /proc/PID/maps that holds code)."""

    path: str
    start: int = 0
    end: int = 0
    #: File offset of ``start``.
    file_offset: int = 0
    #: GNU build-id as lower-case hex, "" when the file has none.
    build_id: str = ""
    #: The hash of the fields above, computed on first use and kept (mappings and frames key
    #: every encoder's tables: hashing them field by field per sample was a cost of its own).
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        value = self._hash
        if not value:
            value = hash((self.path, self.start, self.end, self.file_offset, self.build_id)) or 1
            object.__setattr__(self, "_hash", value)
        return value

    def __reduce__(self):
        return Mapping, (self.path, self.start, self.end, self.file_offset, self.build_id)


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a stack.

    Python frames carry ``function`` (the code object's qualified name),
    ``file`` and ``line``; native frames the symbol (C++ demangled), the
    ``mapping`` and the ``address`` (the instruction's virtual address in the
    process); kernel frames the kernel symbol. A marker frame's ``function``
    says why the stack stops there (``[unwind stopped: no CFI]``).
    """

    kind: str
    function: str
    file: str = ""
    line: int = 0
    address: int = 0
    mapping: Mapping | None = None
    #: The hash of the fields above, computed on first use and kept (see Mapping).
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        value = self._hash
        if not value:
            value = hash((self.kind, self.function, self.file, self.line, self.address, self.mapping)) or 1
            object.__setattr__(self, "_hash", value)
        return value

    def __reduce__(self):
        return Frame, (self.kind, self.function, self.file, self.line, self.address, self.mapping)


@dataclass(frozen=True, slots=True)
class ProfileType:
    """What a profile measures: OTLP's ``sample_type`` and ``period_type``.

    ``sample_types`` lists (type, unit) pairs; each sample of this profile
    has one value per pair, in that order.
    """

    #: Short id used by selectors and file names: ``cpu``, ``offcpu``, ...
    id: str
    sample_types: tuple[tuple[str, str], ...]
    period_type: tuple[str, str] = ("", "")
    #: Sampling period in ``period_type`` units (0 when not periodic).
    period: int = 0


@dataclass(slots=True)
class Sample:
    """One observation of one thread."""

    profile: ProfileType
    pid: int
    tid: int
    #: CLOCK_REALTIME nanoseconds (exported as is).
    time_unix_nano: int
    #: Leaf first.
    frames: tuple[Frame, ...]
    #: One per ``profile.sample_types`` entry.
    values: tuple[int, ...]
    thread_name: str = ""
    #: The span the thread (or its asyncio task) was serving, or empty.
    trace_id: bytes = b""
    span_id: bytes = b""
    #: Extra sample attributes (low cardinality: direction, pageable, ...).
    attributes: dict[str, object] = field(default_factory=dict)
