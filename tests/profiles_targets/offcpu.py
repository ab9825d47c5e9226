"""Off-CPU target: one thread sleeping, one blocked on a lock another holds.

sleeper_fn sleeps in 100 ms steps (off CPU nearly all the time); holder_fn
holds LOCK for 300 ms at a time; waiter_fn blocks on LOCK.acquire() (line
WAITER_ACQUIRE_LINE) meanwhile, then lets go at once.
"""

import threading
import time

LOCK = threading.Lock()


def sleeper_fn():
    while True:
        time.sleep(0.1)


def holder_fn():
    while True:
        with LOCK:
            time.sleep(0.3)
        time.sleep(0.01)


def waiter_fn():
    time.sleep(0.05)
    while True:
        LOCK.acquire()
        LOCK.release()
        time.sleep(0.02)


for target in (holder_fn, waiter_fn, sleeper_fn):
    threading.Thread(target=target, name=target.__name__, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
