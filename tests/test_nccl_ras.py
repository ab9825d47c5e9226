"""The agent's RAS client (otelbpf/sources/nccl_ras.py) against the stand-in RAS server
(examples/nccl_ras_standin.py, answering as NCCL's does) about communicators laid out in the
stand-in NCCL's shared files: JSON, JSON with 2.28.9's missing comma, the text fallback of an
NCCL before 2.28.7, localhost on IPv6 or IPv4, a server inside the process's network
namespace only, the one line when nothing answers, what a stall and missing ranks log, and the
metrics. Needs root for the network namespace (no eBPF)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
from conftest import EXAMPLES, wait_until

from otelbpf.core.selfmetrics import Counters
from otelbpf.sources.nccl_ras import ERRORS, RasPoller, parse_address, procfs_nspid
from protocols.nccl.ras import FUNCTIONS

# examples/cuda_standin/nccl.c: struct standin_shared / standin_rank (the stand-in server reads them)
HEADER = struct.Struct("<qQQii32x")
RANK = struct.Struct("<ii5Q48sii24x")
MAGIC = 0x4E49545344434E4E


def free_port(family=socket.AF_INET, host="127.0.0.1") -> int:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture
def shm(tmp_path):
    """A directory of stand-in communicator files, and a writer of them."""
    prefix = f"nccl-standin-{os.urandom(4).hex()}"

    def write(comm_hash: int, ranks: list[tuple[int, list[int], str]], nranks: int | None = None) -> None:
        """ranks: (pid, AllReduce-and-others counts in FUNCTIONS order, status 'RUNNING'/'FINALIZE')."""
        data = HEADER.pack(0, MAGIC, comm_hash, nranks or len(ranks), 22909)
        for index, (pid, counts, status) in enumerate(ranks):
            data += RANK.pack(pid, 2 if status == "FINALIZE" else 1, *counts, f"10.0.0.{index + 1}".encode(), index, 0)
        (tmp_path / f"{prefix}-{comm_hash:x}").write_bytes(data.ljust(16384, b"\0"))

    write.glob = str(tmp_path / f"{prefix}-*")
    return write


@contextlib.contextmanager
def ras_server(shm_glob: str, listen: str, version: str = "2.29.2", prefix: list[str] = (), dead_after: float = 0.0):
    proc = subprocess.Popen(
        [*prefix, sys.executable, str(EXAMPLES / "nccl_ras_standin.py"), "--listen", listen, "--version", version,
         "--shm-glob", shm_glob, "--dead-after", str(dead_after)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "listening"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def counts(allreduce: int) -> list[int]:
    return [0, 0, 3, 0, allreduce]  # Broadcast, Reduce, AllGather, ReduceScatter, AllReduce


def poller(pids, **kwargs) -> RasPoller:
    return RasPoller(lambda: list(pids), Counters(), interval_s=3600, **kwargs)


@pytest.fixture
def sleeper():
    """A process standing for a rank (alive, its pid in the report)."""
    procs = []

    def start(env=None, prefix=()):
        proc = subprocess.Popen([*prefix, "sleep", "600"], env={**os.environ, **(env or {})})
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("version, fmt", [("2.29.2", "json"), ("2.28.9", "json"), ("2.28.3", "text"), ("2.25.1", "text")])
def test_every_format_is_read(shm, sleeper, version, fmt):
    """JSON where the server offers it (2.28.9's invalid JSON repaired), text before 2.28.7 (the
    server answers SET FORMAT with ERROR: Unknown command)."""
    rank = sleeper(env={"NCCL_RAS_ADDR": f"127.0.0.1:{(port := free_port())}"})
    shm(0xAB, [(rank.pid, counts(40), "RUNNING"), (os.getpid(), counts(39), "RUNNING")])
    with ras_server(shm.glob, f"127.0.0.1:{port}", version):
        [reply] = poller([rank.pid]).poll_once()
    report = reply.report
    assert report.format == fmt and report.nccl_version == version
    [comm] = report.communicators
    assert comm.comm_hash == 0xAB
    if fmt == "json":
        assert comm.counts_by_function()["AllReduce"] == {0: 40, 1: 39}
    elif version >= "2.26":
        assert {(g.function, g.count) for g in comm.count_groups} == {("AllReduce", 40), ("AllReduce", 39)}
    else:  # one count for every function together
        assert {(g.function, g.count) for g in comm.count_groups} == {("collective", 43), ("collective", 42)}
    assert reply.window[0] <= reply.window[1] and reply.pids == {rank.pid: rank.pid}


@pytest.mark.parametrize("listen", ["[::1]", "127.0.0.1"])
def test_localhost_is_tried_on_ipv6_and_ipv4(shm, sleeper, listen):
    if listen == "[::1]" and not socket.has_ipv6:
        pytest.skip("no IPv6")
    family, host = (socket.AF_INET6, "::1") if listen == "[::1]" else (socket.AF_INET, "127.0.0.1")
    port = free_port(family, host)
    rank = sleeper(env={"NCCL_RAS_ADDR": f"localhost:{port}"})
    shm(0xCD, [(rank.pid, counts(5), "RUNNING")])
    with ras_server(shm.glob, f"{listen}:{port}"):
        [reply] = poller([rank.pid]).poll_once()
    assert reply.report.communicators[0].comm_hash == 0xCD


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    name = f"otelbpf-ras-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False)


def test_ras_is_asked_inside_the_jobs_network_namespace(shm, sleeper, netns, caplog):
    """The server listens on the namespace's own localhost:28028 (nothing there from the agent's
    namespace): the poller enters the rank's namespace for the connection, and says which one
    answers."""
    rank = sleeper(prefix=["ip", "netns", "exec", netns])
    assert wait_until(lambda: os.stat(f"/proc/{rank.pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino)
    shm(0xEF, [(rank.pid, counts(7), "RUNNING")])
    with ras_server(shm.glob, "127.0.0.1:28028", prefix=["ip", "netns", "exec", netns]):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", 28028), timeout=1).close()  # not from here (unless a real NCCL runs here)
        ras = poller([rank.pid])
        [reply] = ras.poll_once()
    assert reply.report.communicators[0].comm_hash == 0xEF


def test_no_answer_is_said_once_and_counted(sleeper, caplog):
    rank = sleeper(env={"NCCL_RAS_ADDR": f"127.0.0.1:{free_port()}"})
    ras = poller([rank.pid])
    with caplog.at_level(logging.WARNING, logger="otelbpf"):
        assert ras.poll_once() == [] and ras.poll_once() == []
    said = [r.getMessage() for r in caplog.records if "no answer" in r.getMessage()]
    assert len(said) == 1 and f"network namespace of pid {rank.pid}" in said[0]
    assert ras.counters.get(ERRORS, "no_answer") == 2


def test_ras_turned_off_is_not_asked(sleeper, caplog):
    rank = sleeper(env={"NCCL_RAS_ENABLE": "0"})
    ras = poller([rank.pid])
    with caplog.at_level(logging.WARNING, logger="otelbpf"):
        assert ras.poll_once() == [] and ras.poll_once() == []
    assert sum("NCCL_RAS_ENABLE=0" in r.getMessage() for r in caplog.records) == 1
    assert ras.counters.get("otelbpf.nccl.ras.polls") == 0


def test_a_stall_and_missing_ranks_are_logged_on_change_and_the_metrics(shm, sleeper, caplog):
    """Rank 1 stays at 39 all-reduces while rank 0 reached 40, two replies running: stopped
    progressing (once). Then rank 2's process stops (SIGSTOP): missing, unresponsive; then it is
    gone: dead. Metrics: spread per function, missing and dead ranks, counts and lag of the
    traced ranks."""
    port = free_port()
    ranks = [sleeper(env={"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}) for _ in range(3)]
    traced = [ranks[0].pid, ranks[1].pid]
    layout = lambda a, b: [(ranks[0].pid, counts(a), "RUNNING"), (ranks[1].pid, counts(b), "RUNNING"),  # noqa: E731
                           (ranks[2].pid, counts(a), "RUNNING")]  # fmt: skip
    ras = poller(traced)
    with ras_server(shm.glob, f"127.0.0.1:{port}", dead_after=0.0), caplog.at_level(logging.INFO, logger="otelbpf"):
        shm(0x1234, layout(40, 39))
        ras.poll_once()
        ras.poll_once()
        ras.poll_once()
        stalled = [r.getMessage() for r in caplog.records if "stopped progressing" in r.getMessage()]
        assert stalled == ["NCCL RAS: communicator 0000000000001234 stopped progressing on rank 1: AllReduce at"
                           " operation 39, other ranks at 40"]  # fmt: skip
        shm(0x1234, layout(41, 41))
        ras.poll_once()
        assert any("progressing on every rank again" in r.getMessage() for r in caplog.records)
        points = {name: values for name, _d, _u, _k, values in ras.metric_points()}
        assert ({k: v for k, v in points["otelbpf.nccl.ras.collectives.spread"][0][0].items()},
                points["otelbpf.nccl.ras.collectives.spread"][4][1]) == (
            {"otelbpf.nccl.comm_hash": "0000000000001234", "otelbpf.nccl.nranks": 3, "otelbpf.nccl.operation": "AllGather"}, 0)
        behind = {attrs["otelbpf.nccl.rank"]: value for attrs, value in points["otelbpf.nccl.ras.rank.behind"]}
        replies = {attrs["otelbpf.nccl.rank"]: value for attrs, value in points["otelbpf.nccl.ras.replies"]}
        assert behind == {0: 0, 1: 3} and replies == {0: 4, 1: 4}  # rank 2 is not traced here: another agent's
        mine = {(a["otelbpf.nccl.rank"], a["otelbpf.nccl.operation"]): v for a, v in points["otelbpf.nccl.ras.rank.collectives"]}
        assert mine[(0, "AllReduce")] == 41 and mine[(1, "AllGather")] == 3 and (2, "AllReduce") not in mine
        os.kill(ranks[2].pid, signal.SIGSTOP)
        ras.poll_once()
        points = {name: values for name, _d, _u, _k, values in ras.metric_points()}
        assert points["otelbpf.nccl.ras.ranks.missing"][0][1] == 1 and points["otelbpf.nccl.ras.ranks.dead"][0][1] == 0
        missing = [r.getMessage() for r in caplog.records if "gave no data" in r.getMessage()]
        assert missing == [f"NCCL RAS: communicator 0000000000001234: 1 of 3 ranks gave no data: rank 2 (process"
                           f" {ranks[2].pid} on node 10.0.0.3)"]  # fmt: skip
        ranks[2].kill()
        ranks[2].wait()
        ras.poll_once()  # first seen gone
        ras.poll_once()
        points = {name: values for name, _d, _u, _k, values in ras.metric_points()}
        assert points["otelbpf.nccl.ras.ranks.dead"][0][1] == 1
        assert any("considered dead" in r.getMessage() for r in caplog.records)


def test_the_address_and_own_pid():
    assert parse_address("") == ("localhost", 28028)
    assert parse_address("[::1]:28100") == ("::1", 28100) and parse_address("10.0.0.5:1234") == ("10.0.0.5", 1234)
    assert parse_address("nonsense") == ("localhost", 28028)
    assert procfs_nspid(os.getpid()) == os.getpid()  # the tests run in the host's pid namespace
    assert FUNCTIONS[4] == "AllReduce"
    assert time.monotonic() > 0
