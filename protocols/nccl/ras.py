"""NCCL's RAS (reliability, availability, serviceability) report: the client's side of the
conversation, and the ``STATUS`` reply read into a :class:`RasReport`, from either format.

Since 2.24, every NCCL process listens on ``localhost:28028`` (``NCCL_RAS_ADDR``) in its
network namespace once it created a communicator; whichever process accepts a connection
gathers every process's view over NCCL's own RAS network and answers for the whole job.
The conversation (src/ras/client_support.cc): the client may say ``CLIENT PROTOCOL 2``
(answered ``SERVER PROTOCOL 2``), ``TIMEOUT <s>`` and, since 2.28.7, ``SET FORMAT json``
(each answered ``OK`` or ``ERROR: ...``: an older server answers ``ERROR: Unknown command``,
so the client falls back to text), then ``STATUS`` or ``VERBOSE STATUS``, after which the
server writes its report and closes the connection: the report ends at end of file.

What the two formats carry:

* **JSON** (2.28.7+): every communicator by its ``hash`` (``"0x%lx"``), its size, every
  reporting rank with its host, pid, status and launched collective counts per function
  (``Broadcast``, ``Reduce``, ``AllGather``, ``ReduceScatter``, ``AllReduce``), and the
  missing ranks (``unresponsive``, ``considered_dead``). NCCL 2.28.7 and 2.28.9 omit a
  comma after ``"nvml_dev"`` in missing-rank entries: such a document is repaired
  (:func:`repair_json`) before it is read.
* **Text**: a table per *group* of similar communicators, then ``Errors`` and ``Warnings``
  sections naming only the communicators with a problem (``#0-0 (cf264af53edbe986)
  MISMATCH``, the hash as 16 hex digits): their missing ranks, and for a count mismatch
  how many ranks launched up to which operation, with the outlier ranks by name. A
  healthy communicator's counts are not printed, so per-rank counts of every rank come
  only from JSON.

Pure and sans-IO: bytes in, a report out. A reply that is neither format raises
:class:`RasParseError` (the caller counts it); nothing else escapes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

#: The client protocol NCCL 2.24 to 2.30 speak (src/ras/ras_internal.h).
CLIENT_PROTOCOL = 2
DEFAULT_PORT = 28028
#: ncclFunc_t order: the functions whose launches RAS counts (send/recv are not counted).
FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
#: The name 2.24 and 2.25 give their single count (of every function together).
ALL_FUNCTIONS = "collective"
STATUSES = ("NOCOMM", "UNKNOWN", "INIT", "RUNNING", "FINALIZE", "ABORT")
#: ncclResult_t: 0 success, 7 in progress; anything else is an error
RESULT_IN_PROGRESS = 7


class RasParseError(ValueError):
    """A reply that is not a RAS report (the message says what was wrong)."""


# -- the conversation ------------------------------------------------------------------------


def hello() -> bytes:
    return f"CLIENT PROTOCOL {CLIENT_PROTOCOL}\n".encode()


def timeout_command(seconds: int) -> bytes:
    return f"TIMEOUT {int(seconds)}\n".encode()


def format_command(name: str) -> bytes:
    return f"SET FORMAT {name}\n".encode()


def status_command(verbose: bool = True) -> bytes:
    return b"VERBOSE STATUS\n" if verbose else b"STATUS\n"


def server_protocol(line: bytes) -> int | None:
    """The server's protocol number from its answer to :func:`hello` (None: not a RAS server)."""
    match = re.match(rb"SERVER PROTOCOL (\d+)\s*$", line)
    return int(match[1]) if match else None


def accepted(line: bytes) -> bool:
    """Whether a ``TIMEOUT`` or ``SET FORMAT`` was accepted (``OK``); an ``ERROR: ...`` is not."""
    return line.strip() == b"OK"


# -- the report --------------------------------------------------------------------------------


@dataclass
class RasRank:
    """A rank that reported its communicator's state."""

    rank: int
    host: str = ""
    pid: int = -1
    cuda_dev: int = -1
    status: str = "RUNNING"
    #: init_state/async_error: an ncclResult_t other than success or in-progress
    error: bool = False
    #: function -> collectives launched (JSON: every function; text: the outliers' mismatching ones)
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class RasMissingRank:
    """A rank of the communicator whose process gave no data in this gather."""

    rank: int
    host: str = ""
    pid: int = -1
    #: not reached during this gather
    unresponsive: bool = True
    #: no contact for RAS's dead timeout (60 s by default): in NCCL's dead list
    dead: bool = False


@dataclass
class CountGroup:
    """Text form: ``N ranks have launched up to operation X`` of one function."""

    function: str
    ranks: int
    count: int


@dataclass
class RasCommunicator:
    comm_hash: int
    #: JSON: "hostHash:pidHash" of rank 0 (with the hash, NCCL's unique key); "" in text
    secondary: str = ""
    #: ranks in the communicator (0: not said, as in a text entry)
    size: int = 0
    ranks: list[RasRank] = field(default_factory=list)
    missing: list[RasMissingRank] = field(default_factory=list)
    #: text: the problems its entries name (MISMATCH, ERROR, INCOMPLETE)
    problems: set[str] = field(default_factory=set)
    #: text: the count groups of a mismatch
    count_groups: list[CountGroup] = field(default_factory=list)
    #: whether every rank's counts are known (JSON: the reporting ranks carry all of theirs)
    complete_counts: bool = False

    def counts_by_function(self) -> dict[str, dict[int, int]]:
        """function -> rank -> launched count, for the ranks whose counts are known."""
        out: dict[str, dict[int, int]] = {}
        for rank in self.ranks:
            for function, count in rank.counts.items():
                out.setdefault(function, {})[rank.rank] = count
        return out

    def spread(self) -> dict[str, int]:
        """function -> highest minus lowest launched count among the ranks: 0 when every rank
        launched as many (a lasting spread is a communicator some ranks stopped on). From JSON,
        every reporting rank; from text, the count groups of a mismatch (0 when none is named)."""
        out: dict[str, int] = {}
        if self.complete_counts:
            for function, by_rank in self.counts_by_function().items():
                if by_rank:
                    out[function] = max(by_rank.values()) - min(by_rank.values())
            return out
        groups: dict[str, list[int]] = {}
        for group in self.count_groups:
            groups.setdefault(group.function, []).append(group.count)
        return {function: max(counts) - min(counts) for function, counts in groups.items()}


@dataclass
class RasReport:
    """One ``STATUS`` reply."""

    format: str  # "json" or "text"
    nccl_version: str = ""
    communicators: list[RasCommunicator] = field(default_factory=list)
    #: (pid, host) of job processes in NCCL's dead list (text: the DEAD section)
    dead_processes: list[tuple[int, str]] = field(default_factory=list)
    #: communication timeouts while gathering (the gather is incomplete when > 0)
    timeouts: int = 0
    collection_time_s: float = 0.0

    def communicator(self, comm_hash: int) -> RasCommunicator | None:
        for communicator in self.communicators:
            if communicator.comm_hash == comm_hash:
                return communicator
        return None


def parse_report(data: bytes) -> RasReport:
    """A ``STATUS`` reply, JSON or text (which one is told by its first character)."""
    text = data.decode("utf-8", "replace")
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return parse_json_report(stripped)
    if stripped.startswith("NCCL version") or "Communicators..." in text or "\nErrors\n" in text:
        return parse_text_report(text)
    raise RasParseError(f"not a RAS report: {stripped[:60]!r}")


# -- JSON --------------------------------------------------------------------------------------

#: A value's last character, the line break, then the next key: where 2.28.7/2.28.9 left out a comma.
_MISSING_COMMA = re.compile(r'([\d"el])(\s*\n\s*)("[^"\n]*"\s*:)')


def repair_json(text: str) -> str:
    """Put back the commas NCCL 2.28.7 and 2.28.9 leave out between a value and the next key
    on the next line (valid JSON is left as it is)."""
    return _MISSING_COMMA.sub(r"\1,\2\3", text)


def parse_json_report(text: str) -> RasReport:
    try:
        document = json.loads(text)
    except ValueError:
        try:
            document = json.loads(repair_json(text))
        except ValueError as exc:
            raise RasParseError(f"RAS JSON: {exc}") from None
    if not isinstance(document, dict):
        raise RasParseError("RAS JSON: not an object")
    report = RasReport("json", nccl_version=str(document.get("nccl_version", "")))
    ras = document.get("ras")
    if isinstance(ras, dict):
        report.timeouts = _int(ras.get("timeouts_count"), 0)
        report.collection_time_s = _float(ras.get("collection_time_sec"))
    communicators = document.get("communicators")
    if not isinstance(communicators, list):
        raise RasParseError("RAS JSON: no communicators list")
    dead: set[tuple[int, str]] = set()
    for entry in communicators:
        if not isinstance(entry, dict):
            continue
        comm_hash = _hash(entry.get("hash"))
        if comm_hash is None:
            continue
        communicator = RasCommunicator(
            comm_hash, secondary=str(entry.get("secondary_hash", "")), size=_int(entry.get("size"), 0),
            complete_counts=True,
        )  # fmt: skip
        for item in _list(entry.get("ranks")):
            if isinstance(item, dict) and _int(item.get("rank"), -1) >= 0:
                communicator.ranks.append(_json_rank(item))
        for item in _list(entry.get("missing_ranks")):
            if isinstance(item, dict) and _int(item.get("rank"), -1) >= 0:
                status = item.get("status") if isinstance(item.get("status"), dict) else {}
                missing = RasMissingRank(
                    item["rank"], str(item.get("host", "")), _int(item.get("pid"), -1),
                    unresponsive=bool(status.get("unresponsive", True)), dead=bool(status.get("considered_dead", False)),
                )  # fmt: skip
                communicator.missing.append(missing)
                if missing.dead:
                    dead.add((missing.pid, missing.host))
        report.communicators.append(communicator)
    report.dead_processes = sorted(dead)
    return report


def _json_rank(item: dict) -> RasRank:
    status = item.get("status") if isinstance(item.get("status"), dict) else {}
    init_state = _int(status.get("init_state"), 0)
    async_error = _int(status.get("async_error"), 0)
    if status.get("abort_flag"):
        state = "ABORT"
    elif status.get("finalize_called") or status.get("destroy_flag"):
        state = "FINALIZE"
    elif init_state == 0:
        state = "RUNNING"
    else:
        state = "INIT"
    counts = item.get("collective_counts") if isinstance(item.get("collective_counts"), dict) else {}
    return RasRank(
        item["rank"], str(item.get("host", "")), _int(item.get("pid"), -1), _int(item.get("cuda_dev"), -1), state,
        error=init_state not in (0, RESULT_IN_PROGRESS) or async_error not in (0, RESULT_IN_PROGRESS),
        counts={str(name): value for name, value in counts.items() if _int(value, -1) >= 0},
    )  # fmt: skip


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _hash(value) -> int | None:
    if isinstance(value, str):
        try:
            return int(value, 16) & ((1 << 64) - 1)
        except ValueError:
            return None
    return None


def _int(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


# -- text --------------------------------------------------------------------------------------

_ENTRY = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]{1,16})\) (\S+)\s*$")
_PLAIN_ENTRY = re.compile(r"^(INCOMPLETE|DEAD|TIMEOUT)\s*$")
_COUNT_GROUP = re.compile(r"^  (\d+) ranks? ha(?:s|ve) launched up to operation (\d+)")
_NO_COUNT_GROUP = re.compile(r"^  (\d+) ranks? ha(?:s|ve) not launched any operations")
_RANK_COUNT = re.compile(r"^  Rank (\d+) has launched up to operation (\d+)(?: -- GPU (\S+).*? process (-?\d+) on node (\S+))?")
_FUNCTION = re.compile(r"^  Communicator ranks have different (\w+) operation counts")
_MISSING_RANK = re.compile(r"^  Rank (\d+) -- GPU (\S+)(?: \(NVML \d+\))? managed by process (-?\d+) on node (\S+)")
_MISSING_RANKS_OLD = re.compile(r"^  The missing ranks?: ([\d, ]+)")
_PROCESS = re.compile(r"^  Process (-?\d+) on node (\S+)")
_TIMEOUTS = re.compile(r"^  Encountered (\d+) communication timeouts?")
_VERSION = re.compile(r"^NCCL version (\S+)")
_COLLECTION = re.compile(r"Communicators\.\.\. \((\d+(?:\.\d+)?)s\)")


def parse_text_report(text: str) -> RasReport:
    report = RasReport("text")
    lines = text.splitlines()
    if lines:
        version = _VERSION.match(lines[0])
        if version:
            report.nccl_version = version[1].split("+", 1)[0]
    collection = _COLLECTION.search(text)
    if collection:
        report.collection_time_s = float(collection[1])
    if "\nErrors\n" not in text and "Communicators..." not in text and not report.nccl_version:
        raise RasParseError("RAS text: no report sections")
    by_hash: dict[int, RasCommunicator] = {}
    section = ""
    current: RasCommunicator | None = None
    block = ""
    function = ALL_FUNCTIONS
    for line in lines:
        if line in ("Errors", "Warnings"):
            section, current, block = line, None, ""
            continue
        if not section or not line.strip() or set(line) <= {"=", " "}:
            continue
        entry = _ENTRY.match(line)
        if entry:
            comm_hash = int(entry[3], 16)
            current = by_hash.get(comm_hash)
            if current is None:
                current = by_hash[comm_hash] = RasCommunicator(comm_hash)
                report.communicators.append(current)
            current.problems.add(entry[4])
            block, function = entry[4], ALL_FUNCTIONS
            continue
        plain = _PLAIN_ENTRY.match(line)
        if plain:
            current, block = None, plain[1]
            continue
        if block == "DEAD" and current is None:
            process = _PROCESS.match(line)
            if process:
                report.dead_processes.append((int(process[1]), process[2]))
        elif block == "TIMEOUT":
            timeouts = _TIMEOUTS.match(line)
            if timeouts:
                report.timeouts += int(timeouts[1])
        elif current is not None:
            function = _read_entry_line(current, line, function)
    return report


def _read_entry_line(communicator: RasCommunicator, line: str, function: str) -> str:
    """One line of a communicator's Errors/Warnings entry; the function it is about now."""
    named = _FUNCTION.match(line)
    if named:
        return named[1]
    if "different collective operation counts" in line:
        return ALL_FUNCTIONS
    group = _COUNT_GROUP.match(line)
    if group:
        communicator.count_groups.append(CountGroup(function, int(group[1]), int(group[2])))
        return function
    none = _NO_COUNT_GROUP.match(line)
    if none:
        communicator.count_groups.append(CountGroup(function, int(none[1]), 0))
        return function
    rank_count = _RANK_COUNT.match(line)
    if rank_count:
        rank = _rank(communicator, int(rank_count[1]))
        rank.counts[function] = int(rank_count[2])
        if rank_count[4] is not None:
            rank.pid, rank.host = int(rank_count[4]), rank_count[5]
        return function
    missing = _MISSING_RANK.match(line)
    if missing:
        communicator.missing.append(RasMissingRank(int(missing[1]), missing[4], int(missing[3])))
        return function
    old = _MISSING_RANKS_OLD.match(line)
    if old:
        for number in re.findall(r"\d+", old[1]):
            communicator.missing.append(RasMissingRank(int(number)))
    return function


def _rank(communicator: RasCommunicator, number: int) -> RasRank:
    for rank in communicator.ranks:
        if rank.rank == number:
            return rank
    rank = RasRank(number)
    communicator.ranks.append(rank)
    return rank
