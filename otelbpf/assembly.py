"""Where a pipeline is put together: `otelbpf run`, `otelbpf demo` and `otelbpf replay` (and
the golden tests, the benchmarks) all build theirs here, so the three cannot drift apart.

A pipeline is the spine (otelbpf/pipeline.py) over the protocols of a registry
(otelbpf/registry.py: one line per protocol), wired to its source when the source is live,
plus the features that cut across protocols. Each feature attaches through the hooks the
pipeline declares, and only those:

=====================  ==========================================================
``add_handler``         a family of events of its own (profiles' stack samples)
``observe_progress``    the progress of one protocol's exchanges (GenAI on HTTP)
``add_calls``           the span semantics of a library's calls (CUDA, NCCL)
``wrap_consumer``       every finished span before it leaves (GPU launch counts)
``tick_hooks``          the event clock moving on, and the end (engine steps, intervals)
``exit_hooks``          a traced process exited
``finish_hooks``        the agent stops
``linker`` observers    windows closing and tasks answering (steps, profiles)
=====================  ==========================================================

The features, in the order they attach: GenAI spans on HTTP (otelbpf/semantics/genai.py,
always); GPU calls, launch counts and engine steps (otelbpf/semantics/gpu.py, unless
``gpu=None``: a capture has no library calls), with NCCL collectives in one trace per
instance across nodes (otelbpf/semantics/nccl_collectives.py); NCCL's RAS counts aligning
them (:func:`attach_nccl_ras`, once a live source runs its poller); profiles
(otelbpf/profiles/profiler.py, :func:`attach_profiles`, once a live source has started its
sampler).
"""

from __future__ import annotations

from dataclasses import dataclass

from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.pipeline import Pipeline, SpanConsumer
from otelbpf.registry import Registry, default_registry
from otelbpf.semantics import genai, gpu
from otelbpf.semantics.common import SpanOptions
from otelbpf.semantics.gpu_steps import StepOptions


@dataclass(frozen=True)
class GpuOptions:
    """The GPU feature's settings (``otelbpf run``'s --gpu-* options)."""

    #: Fold successful CUDA calls shorter than this into their request span (0: none).
    min_call_ns: int = 0
    #: Engine steps' options (None: otelbpf/semantics/gpu_steps.py's defaults).
    steps: StepOptions | None = None


def build_pipeline(
    consumer: SpanConsumer,
    resources: ProcessResources,
    counters: Counters,
    *,
    options: SpanOptions | None = None,
    registry: Registry | None = None,
    fast_path: bool | None = None,
    source=None,
    max_connections: int = 16384,
    gpu_options: GpuOptions | None = GpuOptions(),
) -> Pipeline:
    """A pipeline with its features.

    ``registry``: the protocols (default: every shipped one; ``fast_path`` as
    :func:`~otelbpf.registry.default_registry` takes it). ``source``: a live source
    (``EbpfSource`` or a wrapper of it) whose hooks the pipeline calls: muting a
    connection whose protocol is unknown, watching processes as they appear and exit,
    capturing an LLM call's connection whole. ``gpu_options=None`` leaves the GPU feature
    out (a replayed capture has no library calls)."""
    pipeline = Pipeline(
        consumer,
        resources,
        counters,
        options or SpanOptions(),
        max_connections=max_connections,
        registry=registry if registry is not None else default_registry(fast_path=fast_path),
        **_source_hooks(source),
    )
    genai.attach(pipeline)
    if gpu_options is not None:
        state = gpu.attach(pipeline, gpu_options.min_call_ns)
        if gpu_options.steps is not None and state.steps is not None:
            state.steps.options = gpu_options.steps
        if source is not None:  # which commHash a process's NCCL computes: its library's version
            state.nccl_version = lambda pid: _nccl_version(source, pid)
    return pipeline


def _nccl_version(source, pid: int):
    """The version of the NCCL library the live source probed in ``pid`` (None: not known)."""
    lookup = getattr(source, "nccl_version", None)
    return lookup(pid) if lookup is not None else None


def _source_hooks(source) -> dict:
    """The pipeline's callbacks into a live source (none for a replay)."""
    if source is None:
        return {}
    hooks = {
        "on_unrecognized": lambda conn: source.mute(conn.pid, conn.fd, conn.conn_id, conn.source),
        "on_new_process": source.watch_process,
        "on_process_exit": source.forget_process,
    }
    capture_whole = getattr(source, "capture_whole", None)  # once, here: a source may not capture whole
    if capture_whole is not None:
        hooks["on_wants_bodies"] = lambda conn: capture_whole(conn.pid, conn.fd, conn.conn_id, conn.source)
    return hooks


#: A RAS reply is applied once the events' clock is this far past its window (the reordering
#: window, and the drain after it: every call made before the window's end has been handled).
RAS_SETTLE_NS = 500_000_000


def attach_nccl_ras(pipeline: Pipeline, poller) -> None:
    """NCCL's own counts (``poller``: otelbpf/sources/nccl_ras.py ``RasPoller``) align the
    collective traces of communicators whose set-up the agent did not see
    (otelbpf/semantics/nccl_collectives.py), applied on the pipeline's thread once the events
    up to each reply's gathering are handled."""
    state = gpu.state_of(pipeline)
    if state is None:
        return

    def apply(now_ns: int, final: bool) -> None:
        for reply in poller.take_replies(now_ns - RAS_SETTLE_NS):
            state.collectives.align(reply.report, reply.window, reply.pids)

    pipeline.tick_hooks.append(apply)


def attach_profiles(pipeline: Pipeline, sampler, exporters, resources, counters, hz: int, interval_s: float = 10.0):
    """Stack samples from ``sampler`` (a started source's ``profiles``) become profiles linked
    to the pipeline's spans; returns the :class:`~otelbpf.profiles.profiler.Profiler`."""
    from otelbpf.profiles.profiler import Profiler  # the profiles' stack is loaded only where they are on

    profiler = Profiler(sampler, list(exporters), resources, counters, hz, interval_s=interval_s)
    profiler.attach(pipeline)
    return profiler
