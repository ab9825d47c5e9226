"""One NCCL rank of a communicator: ncclCommInitRank, then --collectives
ncclAllReduce calls, each after --delay-ms when this rank is --slow-rank (a
rank that enters late and holds the others back). Runs on the stand-in
libnccl.so.2 (examples/cuda_standin) with NCCL_STANDIN_BARRIER=1, so ranks in
separate processes wait for each other like real ones.

Prints "ready" once the library is loaded, waits for a line on stdin, runs,
prints "done". The communicator is named by --id (hex, up to 16 bytes: the
start of the 128-byte ncclUniqueId; the rest is zeros). With --id-by-reference
it calls the stand-in built to take the id by pointer, as an arm64 caller
passes it (examples/cuda_standin/build/byref).
"""

import argparse
import ctypes
import os
import sys
import time

from cuda_api import DEFAULT_LIB_DIR, NCCL_FLOAT32, NCCL_SUM, UniqueId, load_nccl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--nranks", type=int, required=True)
    parser.add_argument("--id", required=True, help="hex bytes starting the ncclUniqueId")
    parser.add_argument("--collectives", type=int, default=30)
    parser.add_argument("--count", type=int, default=1 << 20, help="float32 elements per all-reduce")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--lib-dir", default=DEFAULT_LIB_DIR)
    parser.add_argument("--id-by-reference", action="store_true", help="the arm64 way (the build/byref stand-in)")
    args = parser.parse_args()
    if args.id_by_reference:
        args.lib_dir = os.path.join(args.lib_dir, "byref")
    os.environ.setdefault("NCCL_STANDIN_BARRIER", "1")
    nccl = load_nccl(args.lib_dir, args.id_by_reference)
    print("ready", flush=True)
    sys.stdin.readline()
    unique = UniqueId()
    ctypes.memmove(ctypes.addressof(unique), bytes.fromhex(args.id).ljust(128, b"\0"), 128)  # (c_char arrays stop at a NUL)
    comm = ctypes.c_void_p()
    passed = ctypes.byref(unique) if args.id_by_reference else unique
    assert nccl.ncclCommInitRank(ctypes.byref(comm), args.nranks, passed, args.rank) == 0
    for _ in range(args.collectives):
        if args.rank == args.slow_rank:
            time.sleep(args.delay_ms / 1000)
        assert nccl.ncclAllReduce(None, None, args.count, NCCL_FLOAT32, NCCL_SUM, comm, None) == 0
    nccl.ncclCommDestroy(comm)
    print("done", flush=True)


if __name__ == "__main__":
    main()
