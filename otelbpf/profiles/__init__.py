"""Profiles: stack samples of traced processes (CPU, off-CPU, GPU calls),
each linked to the span its thread was serving, exported as OTLP profiles,
pprof and a flame graph (docs/profiles.md).

Where a sample goes: bpf/profile.c takes it; ``sampler`` attaches the
programs and drains the ring into ``records`` events; the pipeline hands each
to ``profiler``, which links it to a span (the same association state as the
spans), builds its stack with ``stacks`` (``python/`` for CPython frames read
in the kernel, ``native/`` for DWARF unwinding of the copied stack, kernel
symbols) and hands batches to ``export`` (``encode``: OTLP, ``pprof``,
``flamegraph``).
"""
