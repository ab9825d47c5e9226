"""The dynamic loader's debugger hook, so a library loaded late is probed at once.

GPU and TLS libraries are found in a traced process's /proc/PID/maps. A library
``dlopen()``ed while the agent runs (``import torch`` in a request handler, a
plugin, ctypes) used to be found when the process next opened a connection (at
most once a second) or at the periodic re-scan (5 s): a server that loads
``libcudart`` and allocates its weights in the same second showed no allocation.

Every dynamic loader tells debuggers when it changes the link map by calling
``_dl_debug_state()`` (glibc's and musl's ``ld.so``; ``r_debug.r_brk``): as a
``dlopen`` or ``dlclose`` starts, and again once the new libraries are mapped
and relocated, before their constructors run. bpf/loader.c's entry probe there
(:data:`SPEC`, attached per traced process like the other per-process probes)
sends a ``LibraryLoad`` event (otelbpf/core/events.py), which wakes the agent; the eBPF source then reads
that process's maps and attaches what is new (otelbpf/sources/ebpf.py), a few
milliseconds after the load (bench/README.md, "Loader watch"). Calls made in
between, such as the library's own constructors, are not seen.
"""

from __future__ import annotations

from otelbpf.sources.uprobes import ProbeSpec

#: The debugger hook, a no-op function every ld.so calls on each link-map change.
HOOK = "_dl_debug_state"

SPEC = ProbeSpec(
    name="loader",
    library=r"/ld-(linux|musl)[^/]*\.so[\d.]*$",
    symbols=(HOOK,),
    entry="lib_loaded",
)

