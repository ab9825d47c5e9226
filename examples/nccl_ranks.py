"""One NCCL rank of a communicator: ncclCommInitRank, then --collectives training-like steps,
each some GPU work (kernel launches and a stream synchronisation of --sync-us) and an
ncclAllReduce. Runs on the stand-in libraries (examples/cuda_standin) with
NCCL_STANDIN_BARRIER=1, so ranks in separate processes (and network namespaces) wait for
each other like real ones.

One rank (--slow-rank) can be made slow by --delay-ms per step, in one of four ways
(--slow-kind):

* ``late``: it sleeps before the all-reduce (off the CPU: the rank enters late);
* ``compute``: its GPU work takes longer (a longer synchronisation wait);
* ``host``: its thread is busy on the CPU before launching the work;
* ``communication``: its all-reduce itself takes longer once every rank entered
  (NCCL_STANDIN_US of its process).

Prints "ready" once the libraries are loaded, waits for a line on stdin, runs, prints
"done". With --init-first, the line makes it create the communicator and run --before
collectives, print "initialised" and wait for another line before the rest: an agent
attached in between did not see the communicator created. The communicator is named by --id (hex, up to 128
bytes of the ncclUniqueId; the rest is zeros). With --count-by-iteration the n-th
all-reduce's element count is n (1-based), so a reader of the spans can tell which
instance each span is. With --id-by-reference it calls the stand-in built to take the id
by pointer, as an arm64 caller passes it (examples/cuda_standin/build/byref).
"""

import argparse
import ctypes
import os
import sys
import time

from cuda_api import DEFAULT_LIB_DIR, NCCL_FLOAT32, NCCL_SUM, UniqueId, load_driver, load_nccl, load_runtime

KINDS = ("late", "compute", "host", "communication")


def busy(seconds: float) -> None:
    """Keep this thread on the CPU for ``seconds``."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--nranks", type=int, required=True)
    parser.add_argument("--id", required=True, help="hex bytes starting the ncclUniqueId")
    parser.add_argument("--collectives", type=int, default=30)
    parser.add_argument("--count", type=int, default=1 << 20, help="float32 elements per all-reduce")
    parser.add_argument("--count-by-iteration", action="store_true", help="the n-th all-reduce has n elements")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-kind", choices=KINDS, default="late")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--sync-us", type=int, default=0, help="every rank's GPU wait per step (0: no GPU work)")
    parser.add_argument("--launches", type=int, default=4, help="kernel launches per step (with --sync-us)")
    parser.add_argument("--init-first", action="store_true", help="stop after set-up and --before collectives")
    parser.add_argument("--before", type=int, default=0, help="with --init-first: collectives before 'initialised'")
    parser.add_argument("--lib-dir", default=DEFAULT_LIB_DIR)
    parser.add_argument("--nccl-dir", default="", help="where libnccl.so.2 is (default: --lib-dir)")
    parser.add_argument("--id-by-reference", action="store_true", help="the arm64 way (the build/byref stand-in)")
    args = parser.parse_args()
    nccl_dir = args.nccl_dir or (os.path.join(args.lib_dir, "byref") if args.id_by_reference else args.lib_dir)
    os.environ.setdefault("NCCL_STANDIN_BARRIER", "1")
    slow = args.rank == args.slow_rank
    delay_s = args.delay_ms / 1000
    sync_us = args.sync_us + (int(args.delay_ms * 1000) if slow and args.slow_kind == "compute" else 0)
    if sync_us:
        os.environ["CUDA_STANDIN_SYNC_US"] = str(sync_us)
    if slow and args.slow_kind == "communication":
        base = int(os.environ.get("NCCL_STANDIN_US", "0") or 0)
        os.environ["NCCL_STANDIN_US"] = str(base + int(args.delay_ms * 1000))
    nccl = load_nccl(nccl_dir, args.id_by_reference)
    runtime = driver = None
    if args.sync_us:
        runtime, driver = load_runtime(args.lib_dir), load_driver(args.lib_dir)
    unique = UniqueId()
    ctypes.memmove(ctypes.addressof(unique), bytes.fromhex(args.id).ljust(128, b"\0"), 128)  # (c_char arrays stop at a NUL)
    comm = ctypes.c_void_p()
    passed = ctypes.byref(unique) if args.id_by_reference else unique

    def init() -> None:
        assert nccl.ncclCommInitRank(ctypes.byref(comm), args.nranks, passed, args.rank) == 0

    def step(n: int) -> None:
        if runtime is not None:
            for _ in range(args.launches):
                driver.cuLaunchKernel(None, 1, 1, 1, 128, 1, 1, 0, None, None, None)
            runtime.cudaStreamSynchronize(None)
        if slow and args.slow_kind == "late":
            time.sleep(delay_s)
        elif slow and args.slow_kind == "host":
            busy(delay_s)
        count = n + 1 if args.count_by_iteration else args.count
        assert nccl.ncclAllReduce(None, None, count, NCCL_FLOAT32, NCCL_SUM, comm, None) == 0

    print("ready", flush=True)
    sys.stdin.readline()
    init()
    done = 0
    if args.init_first:
        for n in range(args.before):
            step(n)
        done = args.before
        print("initialised", flush=True)
        sys.stdin.readline()
    for n in range(done, args.collectives):
        step(n)
    nccl.ncclCommDestroy(comm)
    print("done", flush=True)


if __name__ == "__main__":
    main()
