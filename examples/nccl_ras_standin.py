"""A stand-in for NCCL's RAS server: answers RAS clients on localhost:28028 (or --listen)
the way NCCL's ``rasClientEventLoop`` does (src/ras/client_support.cc), in text and JSON,
about the communicators of the stand-in NCCL (examples/cuda_standin/nccl.c) running on
this machine.

Where real NCCL gathers each process's communicator state over its RAS network, this
reads the stand-in's shared files (/dev/shm/nccl-standin-*: per rank its pid, node
address, status and collectives launched per function, under the communicator's
commHash). A rank whose process is stopped (SIGSTOP: state T) gives no data, like a hung
process: it is a missing, unresponsive rank and the gather records a timeout; a rank whose
process is gone is missing too, and considered dead after --dead-after seconds.

The conversation, as NCCL's: newline-terminated, case-insensitive commands, a trailing
``\\r`` ignored, no handshake required; ``CLIENT PROTOCOL <n>`` -> ``SERVER PROTOCOL 2``;
``TIMEOUT <s>`` -> ``OK``; ``SET FORMAT text|json`` -> ``OK`` (2.28.7+; older versions
answer ``ERROR: Unknown command set format json``); ``[VERBOSE] STATUS`` -> the report, then
the connection is closed (the report ends at end of file). The text report goes out in two
writes with a pause, as NCCL's does (its head before the gather, the rest after), so a
client must read to the end. --version picks the NCCL release imitated: 2.28.9 (default;
like 2.28.7, its JSON lacks a comma after "nvml_dev" in missing-rank entries), 2.29.2
(valid JSON), 2.25.1 (text only, one count for all functions, the old missing-rank line).

Usage: python3 nccl_ras_standin.py [--listen HOST:PORT] [--version V] [--dead-after S]
It prints "listening" once its sockets are bound.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
SHM_GLOB = "/dev/shm/nccl-standin-*"
# examples/cuda_standin/nccl.c: struct standin_shared (header) and struct standin_rank
HEADER = struct.Struct("<qQQii32x")
RANK = struct.Struct("<ii5Q48sii24x")
MAX_RANKS = 64
MAGIC = 0x4E49545344434E4E
STATUS_ABSENT, STATUS_RUNNING, STATUS_FINALIZE = 0, 1, 2
PAUSE_S = 0.05


@dataclass
class Rank:
    rank: int
    pid: int
    host: str
    status: str
    counts: list[int]
    cuda_dev: int
    #: "": reported; "unresponsive" (stopped) or "gone" (no such process)
    missing: str = ""


@dataclass
class Communicator:
    comm_hash: int
    nranks: int
    ranks: list[Rank] = field(default_factory=list)


def read_communicators(pattern: str = SHM_GLOB) -> list[Communicator]:
    """The stand-in NCCL's communicators, from their shared files."""
    out = []
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, "rb") as f:
                data = f.read(HEADER.size + RANK.size * MAX_RANKS)
        except OSError:
            continue
        if len(data) < HEADER.size:
            continue
        _arrivals, magic, comm_hash, nranks, _version = HEADER.unpack_from(data)
        if magic != MAGIC or not 0 < nranks <= MAX_RANKS:
            continue
        communicator = Communicator(comm_hash, nranks)
        for index in range(nranks):
            pid, status, *rest = RANK.unpack_from(data, HEADER.size + index * RANK.size)
            counts, host, cuda_dev = list(rest[:5]), rest[5].split(b"\0", 1)[0].decode(), rest[6]
            if status == STATUS_ABSENT:
                continue
            state = "FINALIZE" if status == STATUS_FINALIZE else "RUNNING"
            communicator.ranks.append(Rank(index, pid, host, state, counts, cuda_dev, process_state(pid)))
        out.append(communicator)
    return out


def process_state(pid: int) -> str:
    """"" for a live process, "unresponsive" for a stopped one, "gone" for none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return "unresponsive" if state in ("T", "t") else ""


class Server:
    def __init__(self, version: str, dead_after_s: float, pattern: str = SHM_GLOB) -> None:
        self.version = version
        self.code = tuple(int(part) for part in version.split("."))
        self.dead_after_s = dead_after_s
        self.pattern = pattern
        self.gone_since: dict[int, float] = {}

    # -- the conversation ---------------------------------------------------------------

    def serve(self, conn: socket.socket) -> None:
        with conn:
            fmt = "text"
            buffer = b""
            while True:
                try:
                    chunk = conn.recv(1024)
                except OSError:
                    return
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    command = line.rstrip(b"\r").decode("utf-8", "replace").strip()
                    words = command.lower().split()
                    if words[:2] == ["client", "protocol"]:
                        conn.sendall(b"SERVER PROTOCOL 2\n")
                    elif words[:1] == ["timeout"] and len(words) == 2:
                        ok = words[1].isdigit()
                        conn.sendall(b"OK\n" if ok else f"ERROR: Invalid timeout value {words[1]}\n".encode())
                    elif words[:2] == ["set", "format"] and self.code >= (2, 28, 7):
                        if len(words) == 3 and words[2] in ("text", "json"):
                            fmt = words[2]
                            conn.sendall(b"OK\n")
                        else:
                            conn.sendall(f"ERROR: Invalid format {' '.join(words[2:])}\n".encode())
                    elif words in (["status"], ["verbose", "status"]):
                        self.report(conn, fmt, verbose=words[0] == "verbose")
                        conn.shutdown(socket.SHUT_WR)
                        return
                    elif words:
                        conn.sendall(f"ERROR: Unknown command {command}\n".encode())

    def report(self, conn: socket.socket, fmt: str, verbose: bool) -> None:
        started = time.monotonic()
        communicators = read_communicators(self.pattern)
        now = time.monotonic()
        for communicator in communicators:
            for rank in communicator.ranks:
                if rank.missing == "gone":
                    self.gone_since.setdefault(rank.pid, now)
        if fmt == "json":
            conn.sendall(self.json_report(communicators, time.monotonic() - started).encode())
            return
        conn.sendall(self.text_head(communicators).encode())
        time.sleep(PAUSE_S)  # NCCL gathers here: the rest comes later
        conn.sendall(self.text_tail(communicators, time.monotonic() - started, verbose).encode())

    def dead(self, rank: Rank) -> bool:
        gone = self.gone_since.get(rank.pid)
        return rank.missing == "gone" and gone is not None and time.monotonic() - gone >= self.dead_after_s

    # -- text ------------------------------------------------------------------------------

    def text_head(self, communicators: list[Communicator]) -> str:
        pids = {rank.pid for c in communicators for rank in c.ranks}
        nodes = {rank.host for c in communicators for rank in c.ranks} or {""}
        gpus = len({(rank.host, rank.cuda_dev) for c in communicators for rank in c.ranks})
        return (
            f"NCCL version {self.version} compiled with CUDA 12.4\n"
            "CUDA runtime version 12040, driver version 12040\n\n"
            "Job summary\n===========\n\n"
            "  Nodes  Processes         GPUs  Processes     GPUs\n"
            "(total)   per node  per process    (total)  (total)\n"
            f"{len(nodes):7d}  {max(1, len(pids) // len(nodes)):9d}  {1:11d}  {len(pids):9d}  {gpus:7d}\n"
            "\nCommunicators..."
        )

    def text_tail(self, communicators: list[Communicator], elapsed_s: float, verbose: bool) -> str:
        timeouts = sum(1 for c in communicators for rank in c.ranks if rank.missing)
        out = [f" ({elapsed_s:.3f}s)\n=============\n\n"]
        if communicators:
            out.append("Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n")
            out.append("    #  in group  per comm  per node  per comm  in group\n")
            for group, communicator in enumerate(communicators):
                nodes = {rank.host for rank in communicator.ranks} or {""}
                per_node = [sum(1 for r in communicator.ranks if r.host == node) for node in nodes]
                per_node_text = str(per_node[0]) if min(per_node) == max(per_node) else f"{min(per_node)}-{max(per_node)}"
                out.append(
                    f"{group:5d}  {1:8d}  {len(nodes):8d}  {per_node_text:>8s}  {communicator.nranks:8d}  "
                    f"{communicator.nranks:8d}  {self._status(communicator):>8s}  {self._errors(communicator):>6s}\n"
                )
        else:
            out.append("No communicator data collected!\n")
        out.append("\nErrors\n======\n\n")
        dead = [rank for c in communicators for rank in c.ranks if self.dead(rank)]
        if dead:
            s = "es are" if len(dead) > 1 else " is"
            out.append(f"DEAD\n  {len(dead)} job process{s} considered dead (unreachable via the RAS network)\n")
            for rank in dead:
                out.append(f"  Process {rank.pid} on node {rank.host} managing GPU {rank.cuda_dev}\n")
            out.append("\n")
        for group, communicator in enumerate(communicators):
            missing = [rank for rank in communicator.ranks if rank.missing]
            absent = communicator.nranks - len(communicator.ranks)
            if missing or absent:
                count = len(missing) + absent
                out.append(f"#{group}-0 ({communicator.comm_hash:016x}) INCOMPLETE\n")
                out.append(f"  Missing communicator data from {count} rank{'s' if count > 1 else ''}\n")
                if self.code >= (2, 26, 0):
                    for rank in missing:
                        out.append(f"  Rank {rank.rank} -- GPU {rank.cuda_dev} managed by process {rank.pid} on node {rank.host}\n")
                else:
                    numbers = ", ".join(str(rank.rank) for rank in missing)
                    out.append(f"  The missing rank{'s' if len(missing) > 1 else ''}: {numbers}\n")
                out.append("\n")
        out.append("Warnings\n========\n\n")
        if timeouts:
            out.append(f"TIMEOUT\n  Encountered {timeouts} communication timeout{'s' if timeouts > 1 else ''} while gathering communicator data\n\n")
        for group, communicator in enumerate(communicators):
            out.append(self._mismatch(group, communicator, verbose))
        return "".join(out)

    def _mismatch(self, group: int, communicator: Communicator, verbose: bool) -> str:
        reporting = [rank for rank in communicator.ranks if not rank.missing]
        lines = []
        functions = [(name, i) for i, name in enumerate(FUNCTIONS)] if self.code >= (2, 26, 0) else [("collective", -1)]
        for name, index in functions:
            counts = {rank.rank: (sum(rank.counts) if index < 0 else rank.counts[index]) for rank in reporting}
            values = sorted(set(counts.values()))
            if len(values) < 2:
                continue
            what = f"{name} operation counts" if index >= 0 else "collective operation counts"
            lines.append(f"  Communicator ranks have different {what}\n")
            for value in sorted(values, reverse=True):
                ranks = [r for r in reporting if counts[r.rank] == value]
                if value:
                    lines.append(f"  {len(ranks)} rank{'s have' if len(ranks) > 1 else ' has'} launched up to operation {value}\n")
                else:
                    lines.append(f"  {len(ranks)} rank{'s have' if len(ranks) > 1 else ' has'} not launched any operations\n")
                outlier = len(ranks) == 1 or (len(ranks) * 2 < len(reporting) if verbose else len(ranks) <= 10 and len(ranks) * 4 <= len(reporting))
                if outlier:
                    for rank in ranks:
                        lines.append(
                            f"  Rank {rank.rank} has launched up to operation {value} -- GPU {rank.cuda_dev} managed by process"
                            f" {rank.pid} on node {rank.host}\n"
                        )
            lines.append("\n")
        if not lines:
            return ""
        return f"#{group}-0 ({communicator.comm_hash:016x}) MISMATCH\n" + "".join(lines)

    def _status(self, communicator: Communicator) -> str:
        statuses = {rank.status for rank in communicator.ranks if not rank.missing}
        return "FINALIZE" if "FINALIZE" in statuses else "RUNNING" if statuses else ("NOCOMM" if self.code >= (2, 26, 0) else "UNKNOWN")

    def _errors(self, communicator: Communicator) -> str:
        reporting = [rank for rank in communicator.ranks if not rank.missing]
        mismatch = len({tuple(rank.counts) for rank in reporting}) > 1
        incomplete = len(reporting) < communicator.nranks
        return ",".join(p for p, on in (("INCOMPLETE", incomplete), ("MISMATCH", mismatch)) if on) or "OK"

    # -- JSON ------------------------------------------------------------------------------

    def json_report(self, communicators: list[Communicator], elapsed_s: float) -> str:
        comms = []
        for communicator in communicators:
            reporting = [rank for rank in communicator.ranks if not rank.missing]
            missing = [rank for rank in communicator.ranks if rank.missing]
            comms.append({
                "hash": hex(communicator.comm_hash),
                "secondary_hash": f"{hex(communicator.comm_hash >> 32)}:{hex(communicator.comm_hash & 0xffff)}",
                "size": communicator.nranks,
                "ranks_count": len(reporting),
                "missing_ranks_count": communicator.nranks - len(reporting),
                "ranks": [{
                    "rank": rank.rank, "host": rank.host, "pid": rank.pid, "cuda_dev": rank.cuda_dev,
                    "nvml_dev": rank.cuda_dev,
                    "status": {"init_state": 0, "async_error": 0, "finalize_called": rank.status == "FINALIZE",
                               "destroy_flag": False, "abort_flag": False},
                    "collective_counts": dict(zip(FUNCTIONS, rank.counts)),
                } for rank in reporting],
                "missing_ranks": [{
                    "rank": rank.rank, "host": rank.host, "pid": rank.pid, "cuda_dev": rank.cuda_dev,
                    "nvml_dev": rank.cuda_dev,
                    "status": {"unresponsive": True, "considered_dead": self.dead(rank)},
                } for rank in missing],
            })  # fmt: skip
        document = {
            "nccl_version": self.version,
            "cuda_runtime_version": 12040,
            "cuda_driver_version": 12040,
            "timestamp": time.strftime("%F %T"),
            "communicators_count": len(comms),
            "communicators": comms,
            "ras": {"collection_time_sec": "@ELAPSED@", "timeouts_count": sum(c["missing_ranks_count"] for c in comms)},
        }
        text = json.dumps(document, indent=2).replace('"@ELAPSED@"', f"{elapsed_s:.3f}")
        if self.code in ((2, 28, 7), (2, 28, 9)):
            text = _without_comma_after_nvml_dev(text)
        return text + "\n"


def _without_comma_after_nvml_dev(text: str) -> str:
    """NCCL 2.28.7 and 2.28.9 write `"nvml_dev": N` with no comma in missing-rank entries."""
    out, in_missing = [], False
    for line in text.split("\n"):
        if '"missing_ranks"' in line:
            in_missing = True
        if in_missing and line.strip().startswith('"nvml_dev"') and line.endswith(","):
            line = line[:-1]
        out.append(line)
    return "\n".join(out)


def listen(address: str) -> list[socket.socket]:
    """Bound listening sockets for every address ``address`` resolves to (localhost: ::1 and
    127.0.0.1, as NCCL's clients try each)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "localhost"
    sockets = []
    for family, kind, proto, _name, sockaddr in socket.getaddrinfo(host, int(port), 0, socket.SOCK_STREAM):
        s = socket.socket(family, kind, proto)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            s.bind(sockaddr)
        except OSError:
            s.close()
            continue
        s.listen(64)
        sockets.append(s)
    if not sockets:
        raise OSError(f"cannot listen on {address}")
    return sockets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default=os.environ.get("NCCL_RAS_ADDR", "localhost:28028"))
    parser.add_argument("--version", default="2.28.9")
    parser.add_argument("--dead-after", type=float, default=60.0, help="seconds a gone process is missing before dead")
    parser.add_argument("--shm-glob", default=SHM_GLOB)
    args = parser.parse_args()
    server = Server(args.version, args.dead_after, args.shm_glob)
    sockets = listen(args.listen)
    for s in sockets:
        threading.Thread(target=_accept, args=(s, server), daemon=True).start()
    print("listening", flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin
    except KeyboardInterrupt:
        pass


def _accept(listener: socket.socket, server: Server) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=server.serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
