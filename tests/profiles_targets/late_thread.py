"""A CPython process whose busy thread starts only when told (a line on stdin),
after the agent attached: its Python frames need the thread list re-read."""

import sys
import threading


def late_spinner():
    x = 0
    while True:
        x += 1


print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=late_spinner, name="late", daemon=True).start()
print("started", flush=True)
threading.Event().wait()
