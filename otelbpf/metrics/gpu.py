"""Metric instruments of the GPU call spans (otelbpf/semantics/gpu_calls.py).

No semantic convention covers CUDA or NCCL calls yet, so the names are
otelbpf's own (otelbpf/semconv.py). From every CUDA runtime/driver call span:
its duration by function (``code.function.name``) and error; from every copy:
its size by direction and whether the host memory was pageable, so the count
is copies, the sum bytes per direction, and the pageable share is the ratio of
two sums. From every NCCL call: duration and bytes by operation; from every
collective matched across its ranks (otelbpf/semantics/nccl_lateness.py): how
late its rank entered it after the first rank, by communicator, rank and
operation. From every collective joined across nodes
(otelbpf/semantics/nccl_collectives.py): per rank and communicator, its time inside the
collective and, before it, waiting for the GPU, on and off the CPU (``otelbpf.nccl.time``
by ``otelbpf.nccl.state``). GPU memory reserved is a gauge per process (otelbpf/semantics/gpu_state.py
``memory_gauges``); kernel launches a Sum per process read from the kernel
(otelbpf/sources/gpu.py ``launch_sums``).
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import SpanRecord
from otelbpf.metrics.instruments import SpanHistogram, duration_seconds


def _always(span: SpanRecord) -> bool:
    return True


def _is_copy(span: SpanRecord) -> bool:
    return sc.OTELBPF_GPU_MEMCPY_BYTES in span.attributes


def _copy_bytes(span: SpanRecord) -> float:
    return float(span.attributes[sc.OTELBPF_GPU_MEMCPY_BYTES])  # type: ignore[arg-type]


def _is_sized_collective(span: SpanRecord) -> bool:
    return sc.OTELBPF_NCCL_BYTES in span.attributes


def _collective_bytes(span: SpanRecord) -> float:
    return float(span.attributes[sc.OTELBPF_NCCL_BYTES])  # type: ignore[arg-type]


def _is_matched_collective(span: SpanRecord) -> bool:
    return sc.OTELBPF_NCCL_LATENESS in span.attributes


def _lateness_seconds(span: SpanRecord) -> float:
    return span.attributes[sc.OTELBPF_NCCL_LATENESS] / 1e9  # type: ignore[operator]


def _is_joined_collective(span: SpanRecord) -> bool:
    return sc.OTELBPF_NCCL_COMM_HASH in span.attributes and sc.OTELBPF_NCCL_SEQUENCE in span.attributes


def _interval_part(key: str):
    """A joined collective's time in ``key`` (ns) before it, in seconds."""

    def select(span: SpanRecord) -> bool:
        return key in span.attributes and _is_joined_collective(span)

    def value(span: SpanRecord) -> float:
        return span.attributes[key] / 1e9  # type: ignore[operator]

    return select, value


def _host_select(span: SpanRecord) -> bool:
    """A joined collective's interval with no off-CPU clock: host time not split."""
    attrs = span.attributes
    return sc.OTELBPF_NCCL_INTERVAL_DURATION in attrs and sc.OTELBPF_NCCL_INTERVAL_ON_CPU not in attrs and _is_joined_collective(span)


def _host_seconds(span: SpanRecord) -> float:
    attrs = span.attributes
    return max(attrs[sc.OTELBPF_NCCL_INTERVAL_DURATION] - attrs[sc.OTELBPF_NCCL_INTERVAL_GPU_WAIT], 0) / 1e9  # type: ignore[operator]


#: Per rank and communicator, the same on every node: what the slow-rank rule compares
#: (deploy/prometheus/otelbpf-rules.yaml).
_RANK_ATTRIBUTES = (sc.OTELBPF_NCCL_COMM_HASH, sc.OTELBPF_NCCL_RANK, sc.OTELBPF_NCCL_NRANKS)
_RANK_TIME_DESCRIPTION = (
    "A rank's time per collective of a communicator, by state: inside the collective (its wait: the slow rank"
    " waits least), and since its previous one waiting for the GPU, on the CPU, off the CPU."
)


def _rank_time(state: str, select, value) -> SpanHistogram:
    return SpanHistogram(
        name=sc.OTELBPF_NCCL_TIME,
        unit="s",
        description=_RANK_TIME_DESCRIPTION,
        boundaries=sc.GPU_DURATION_BOUNDARIES,
        attributes=_RANK_ATTRIBUTES,
        select=select,
        value=value,
        fixed_attributes=((sc.OTELBPF_NCCL_STATE, state),),
        requires=sc.OTELBPF_NCCL_COMM_HASH,
    )


RANK_INSTRUMENTS: tuple[SpanHistogram, ...] = (
    _rank_time("collective", _is_joined_collective, duration_seconds),
    _rank_time("gpu_wait", *_interval_part(sc.OTELBPF_NCCL_INTERVAL_GPU_WAIT)),
    _rank_time("on_cpu", *_interval_part(sc.OTELBPF_NCCL_INTERVAL_ON_CPU)),
    _rank_time("off_cpu", *_interval_part(sc.OTELBPF_NCCL_INTERVAL_OFF_CPU)),
    _rank_time("host", _host_select, _host_seconds),
)

CUDA_INSTRUMENTS: tuple[SpanHistogram, ...] = (
    SpanHistogram(
        name=sc.OTELBPF_GPU_CALL_DURATION,
        unit="s",
        description="Duration of CUDA runtime and driver calls, by function.",
        boundaries=sc.GPU_DURATION_BOUNDARIES,
        attributes=(sc.CODE_FUNCTION_NAME, sc.ERROR_TYPE),
        select=_always,
        value=duration_seconds,
    ),
    SpanHistogram(
        name=sc.OTELBPF_GPU_MEMCPY_SIZE,
        unit="By",
        description="Bytes per CUDA copy, by direction and whether the host memory was pageable.",
        boundaries=sc.GPU_SIZE_BOUNDARIES,
        attributes=(sc.OTELBPF_GPU_MEMCPY_KIND, sc.OTELBPF_GPU_MEMCPY_PAGEABLE),
        select=_is_copy,
        value=_copy_bytes,
    ),
)

NCCL_INSTRUMENTS: tuple[SpanHistogram, ...] = (
    SpanHistogram(
        name=sc.OTELBPF_NCCL_CALL_DURATION,
        unit="s",
        description="Duration of NCCL calls, by operation.",
        boundaries=sc.GPU_DURATION_BOUNDARIES,
        attributes=(sc.OTELBPF_NCCL_OPERATION, sc.CODE_FUNCTION_NAME, sc.ERROR_TYPE),
        select=_always,
        value=duration_seconds,
    ),
    SpanHistogram(
        name=sc.OTELBPF_NCCL_CALL_SIZE,
        unit="By",
        description="Bytes per NCCL collective or point-to-point call, by operation.",
        boundaries=sc.GPU_SIZE_BOUNDARIES,
        attributes=(sc.OTELBPF_NCCL_OPERATION,),
        select=_is_sized_collective,
        value=_collective_bytes,
    ),
    SpanHistogram(
        name=sc.OTELBPF_NCCL_COLLECTIVE_LATENESS,
        unit="s",
        description="How late a rank entered an NCCL collective after the communicator's first rank on this node"
        " (0: it was first), by communicator (ncclUniqueId prefix), rank and operation.",
        boundaries=sc.NCCL_LATENESS_BOUNDARIES,
        attributes=(sc.OTELBPF_NCCL_UNIQUE_ID, sc.OTELBPF_NCCL_RANK, sc.OTELBPF_NCCL_OPERATION),
        select=_is_matched_collective,
        value=_lateness_seconds,
    ),
) + RANK_INSTRUMENTS
