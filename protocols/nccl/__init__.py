"""NCCL facts every node computes alike, and NCCL's own report of a job.

Pure and sans-IO like every package under ``protocols/``: no eBPF, no OpenTelemetry, no I/O.

* :mod:`protocols.nccl.comm_hash`: the communicator id NCCL derives from the 128-byte
  ``ncclUniqueId`` (``commHash``), per NCCL version: the same on every rank and node,
  and the ``hash`` NCCL's RAS reports;
* :mod:`protocols.nccl.ras`: the RAS client conversation and its ``STATUS`` reply (text
  or JSON, including the invalid JSON of 2.28.7-2.28.9) read into a :class:`RasReport`.
"""

from protocols.nccl.comm_hash import comm_hash, format_comm_hash
from protocols.nccl.ras import FUNCTIONS, RasCommunicator, RasParseError, RasReport, parse_report

__all__ = [
    "FUNCTIONS",
    "RasCommunicator",
    "RasParseError",
    "RasReport",
    "comm_hash",
    "format_comm_hash",
    "parse_report",
]
