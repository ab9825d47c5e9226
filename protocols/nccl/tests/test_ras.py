"""NCCL RAS replies, in the formats NCCL's client_support.cc writes (docs: ras.rst), read into
reports: JSON (valid, and 2.28.7-2.28.9's with a missing comma), text (2.26+ and 2.24/2.25
forms), and what is not a report."""

from __future__ import annotations

import json

import pytest

from protocols.nccl import ras

JSON_2_29 = """{
  "nccl_version": "2.29.1",
  "cuda_runtime_version": 13000,
  "cuda_driver_version": 13000,
  "timestamp": "2025-12-19 13:06:53",
  "communicators_count": 1,
  "communicators": [
    {
      "hash": "0xae94423cfbb2ef4a",
      "secondary_hash": "0xb7e7187447156001:0xb8242ed28a71381e",
      "size": 3,
      "ranks_count": 2,
      "missing_ranks_count": 1,
      "ranks": [
        {
          "rank": 0,
          "host": "172.16.64.245",
          "pid": 1524344,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {"init_state": 0, "async_error": 0, "finalize_called": false, "destroy_flag": false, "abort_flag": false},
          "collective_counts": {"Broadcast": 0, "Reduce": 0, "AllGather": 4, "ReduceScatter": 0, "AllReduce": 120}
        },
        {
          "rank": 1,
          "host": "172.16.64.246",
          "pid": 77,
          "cuda_dev": 1,
          "nvml_dev": 1,
          "status": {"init_state": 0, "async_error": 3, "finalize_called": true, "destroy_flag": false, "abort_flag": false},
          "collective_counts": {"Broadcast": 0, "Reduce": 0, "AllGather": 4, "ReduceScatter": 0, "AllReduce": 117}
        }
      ],
      "missing_ranks": [
        {
          "rank": 2,
          "host": "172.16.64.247",
          "pid": 1524345,
          "cuda_dev": 2,
          "nvml_dev": 2,
          "status": {"unresponsive": true, "considered_dead": true}
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 0.012,
    "timeouts_count": 1
  }
}
"""

#: 2.28.7 and 2.28.9: no comma after "nvml_dev" in missing-rank entries
JSON_2_28_9 = """{
  "nccl_version": "2.28.9",
  "communicators": [
    {
      "hash": "0x1f",
      "size": 2,
      "ranks": [
        {"rank": 0, "host": "10.0.0.1", "pid": 5, "cuda_dev": 0, "nvml_dev": 0,
         "status": {"init_state": 0, "async_error": 0, "finalize_called": false, "destroy_flag": false, "abort_flag": false},
         "collective_counts": {"Broadcast": 0, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0, "AllReduce": 9}}
      ],
      "missing_ranks": [
        {
          "rank": 1,
          "host": "10.0.0.2",
          "pid": 6,
          "cuda_dev": 0,
          "nvml_dev": 0
          "status": {
            "unresponsive": true,
            "considered_dead": false
          }
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 5.002,
    "timeouts_count": 1
  }
}
"""

TEXT_2_28 = """NCCL version 2.28.9+cuda12.9 compiled with CUDA 12.9
CUDA runtime version 12090, driver version 12090

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      4          8            1         32       32

Communicators... (5.012s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        32   RUNNING  INCOMPLETE,MISMATCH

Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 3487984 on node 172.16.64.213 managing GPU 5

#0-0 (cf264af53edbe986) INCOMPLETE
  Missing communicator data from 1 rank
  Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213

Warnings
========

TIMEOUT
  Encountered 2 communication timeouts while gathering communicator data

#0-0 (cf264af53edbe986) MISMATCH
  Communicator ranks have different AllReduce operation counts
  30 ranks have launched up to operation 6650
  1 rank has launched up to operation 6649
  Rank 3 has launched up to operation 6649 -- GPU 3 managed by process 483075 on node 172.16.64.210

  Communicator ranks have different AllGather operation counts
  30 ranks have launched up to operation 12
  1 rank has not launched any operations
  Rank 3 has launched up to operation 0 -- GPU 3 (NVML 4) managed by process 483075 on node 172.16.64.210

"""

TEXT_2_25 = """NCCL version 2.25.1+cuda12.8 compiled with CUDA 12.8
CUDA runtime version 12080, driver version 12080

Communicators... (2.05s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        32   RUNNING  INCOMPLETE

Errors
======

#0-0 (00000000000000ab) INCOMPLETE
  Missing communicator data from 2 ranks
  The missing ranks: 21, 22

Warnings
========

#0-0 (00000000000000ab) MISMATCH
  Communicator ranks have different collective operation counts
  26 ranks have launched up to operation 6650
  6 ranks have launched up to operation 6649

"""


def test_json_every_rank_with_its_counts_and_the_missing_ones():
    report = ras.parse_report(JSON_2_29.encode())
    assert (report.format, report.nccl_version, report.timeouts, report.collection_time_s) == ("json", "2.29.1", 1, 0.012)
    [comm] = report.communicators
    assert (comm.comm_hash, comm.size, comm.complete_counts) == (0xAE94423CFBB2EF4A, 3, True)
    assert comm.secondary == "0xb7e7187447156001:0xb8242ed28a71381e"
    first, second = comm.ranks
    assert (first.rank, first.host, first.pid, first.status, first.error) == (0, "172.16.64.245", 1524344, "RUNNING", False)
    assert (second.status, second.error) == ("FINALIZE", True)  # finalize called; async error 3
    assert comm.counts_by_function()["AllReduce"] == {0: 120, 1: 117}
    assert comm.spread() == {"Broadcast": 0, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0, "AllReduce": 3}
    [missing] = comm.missing
    assert (missing.rank, missing.host, missing.pid, missing.unresponsive, missing.dead) == (2, "172.16.64.247", 1524345, True, True)
    assert report.dead_processes == [(1524345, "172.16.64.247")]
    assert report.communicator(0xAE94423CFBB2EF4A) is comm and report.communicator(1) is None


def test_json_of_2_28_9_without_its_comma_is_repaired():
    with pytest.raises(ValueError):
        json.loads(JSON_2_28_9)  # invalid as NCCL writes it
    report = ras.parse_report(JSON_2_28_9.encode())
    [comm] = report.communicators
    assert comm.comm_hash == 0x1F  # "0x%lx": no zero padding
    [missing] = comm.missing
    assert (missing.rank, missing.unresponsive, missing.dead) == (1, True, False)
    assert json.loads(ras.repair_json(JSON_2_29)) == json.loads(JSON_2_29)  # valid JSON is left as it is


def test_json_with_no_communicators():
    report = ras.parse_report(b'{\n  "nccl_version": "2.28.9",\n  "communicators": [\n\n  ],\n  "ras": {}\n}\n')
    assert report.communicators == [] and report.format == "json"


def test_text_names_the_problem_communicators_their_missing_ranks_and_count_groups():
    report = ras.parse_report(TEXT_2_28.encode())
    assert (report.format, report.nccl_version, report.collection_time_s, report.timeouts) == ("text", "2.28.9", 5.012, 2)
    assert report.dead_processes == [(3487984, "172.16.64.213")]
    [comm] = report.communicators  # one communicator, named in both sections
    assert comm.comm_hash == 0xCF264AF53EDBE986 and comm.problems == {"INCOMPLETE", "MISMATCH"}
    [missing] = comm.missing
    assert (missing.rank, missing.pid, missing.host) == (21, 3487984, "172.16.64.213")
    assert [(g.function, g.ranks, g.count) for g in comm.count_groups] == [
        ("AllReduce", 30, 6650), ("AllReduce", 1, 6649), ("AllGather", 30, 12), ("AllGather", 1, 0),
    ]  # fmt: skip
    [outlier] = comm.ranks
    assert (outlier.rank, outlier.pid, outlier.host, outlier.counts) == (3, 483075, "172.16.64.210", {"AllReduce": 6649, "AllGather": 0})
    assert comm.spread() == {"AllReduce": 1, "AllGather": 12} and not comm.complete_counts


def test_text_of_2_25_one_count_for_every_function_and_the_old_missing_line():
    report = ras.parse_report(TEXT_2_25.encode())
    [comm] = report.communicators
    assert comm.comm_hash == 0xAB
    assert [m.rank for m in comm.missing] == [21, 22]
    assert [(g.function, g.count) for g in comm.count_groups] == [(ras.ALL_FUNCTIONS, 6650), (ras.ALL_FUNCTIONS, 6649)]


def test_a_healthy_text_report_names_no_communicator():
    head, _, _ = TEXT_2_28.partition("\nErrors\n")
    report = ras.parse_report((head + "\nErrors\n======\n\nWarnings\n========\n\n").encode())
    assert report.communicators == [] and report.dead_processes == []


@pytest.mark.parametrize("reply", [b"", b"ERROR: Unknown command STATUS\n", b"garbage\x00\xff", b"[1, 2]", b'{"nccl_version": 1}', b"{not json"])
def test_what_is_not_a_report_is_a_clear_error(reply):
    with pytest.raises(ras.RasParseError):
        ras.parse_report(reply)


def test_the_conversation():
    assert ras.hello() == b"CLIENT PROTOCOL 2\n"
    assert ras.server_protocol(b"SERVER PROTOCOL 2") == 2 and ras.server_protocol(b"HTTP/1.1 400") is None
    assert ras.timeout_command(5) == b"TIMEOUT 5\n" and ras.format_command("json") == b"SET FORMAT json\n"
    assert ras.status_command() == b"VERBOSE STATUS\n" and ras.status_command(False) == b"STATUS\n"
    assert ras.accepted(b"OK") and not ras.accepted(b"ERROR: Unknown command set format json")
