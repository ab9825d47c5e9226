"""A CPython process whose busy thread starts only when told (a line on stdin), after the
agent attached: a thread the agent never saw listed. Its first samples have Python frames
when the kernel reads the thread's state from its TLS (otelbpf/profiles/python/thread_local.py);
from the thread list, only once the list is re-read.

With an argument, the thread spins for that many seconds of its own CPU time and ends (the
per-interpreter copies of the profile tests), else for ever.
"""

import sys
import threading
import time


def late_spinner(cpu_s):
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        x += 1


print("ready", flush=True)
sys.stdin.readline()
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
threading.Thread(target=late_spinner, args=(seconds,), name="late", daemon=True).start()
print("started", flush=True)
threading.Event().wait()
