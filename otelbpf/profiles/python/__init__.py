"""CPython frames for CPU profiles.

BPF reads the sampled thread's frame chain at sample time (the frames of
3.11+ live in the interpreter's data stack and are gone a moment later);
this package gives it what it needs and names what it brings back:

- :mod:`.offsets`: ``struct py_offsets`` (the BPF contract) and the per-version layouts;
- :mod:`.interpreter`: find the interpreter, its version, ``_PyRuntime`` and offsets in a process;
- :mod:`.thread_local`: where each thread keeps its ``PyThreadState`` in its TLS, for BPF to read;
- :mod:`.threads`: tid -> ``PyThreadState*`` for the BPF map (where TLS cannot say);
- :mod:`.naming`: code object + instruction -> function, file, line;
- :mod:`.walk`: the same walk in user space, for tests and debugging.
"""

from otelbpf.profiles.python.naming import CodeNamer
from otelbpf.profiles.python.offsets import PyOffsets
from otelbpf.profiles.python.interpreter import PythonProcess, describe, find_python
from otelbpf.profiles.python.threads import thread_states
from otelbpf.profiles.python.walk import PyFrameRef, frames_from_bpf, walk_thread

__all__ = [
    "CodeNamer", "PyFrameRef", "PyOffsets", "PythonProcess", "describe", "find_python",
    "frames_from_bpf", "thread_states", "walk_thread",
]
