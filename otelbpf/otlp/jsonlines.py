"""OTLP/JSON lines files, for any signal: the writer (a sink) and the reader.

One line per export request, in the encoding of the OpenTelemetry
Collector's file exporter, so that files from the agent and from a Collector
can be read by the same tools (the Collector's ``otlpjsonfile`` receiver, jq
scripts, ``read_json_lines``). What a line holds is the signal's business: a
``JsonLinesSink`` is given a ``render(item) -> bytes`` (one whole line with
its newline), ``read_json_lines`` a ``parse(line) -> request``.

The sink appends each line whole and flushes it, so a reader tailing the
file sees whole lines; a write that fails (disk full) is cut back so that the
retry starts a clean line. A reader skips a last line without its newline
(still being written).

``go_escaped``: Go's JSON encoder (the Collector's) escapes ``<``, ``>``,
``&``, U+2028 and U+2029; lines written here do too.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Generic, TypeVar

from otelbpf.otlp.sink import FailureLog, Sink

_log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_GO_ESCAPED = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def go_escaped(text: str) -> str:
    """``text`` with ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as Go's JSON encoder does.

    Each character is first looked for (a fast scan; usually none is there),
    and only then replaced; no replacement contains any of them, so the order
    does not matter.
    """
    if "<" in text or ">" in text or "&" in text or "\u2028" in text or "\u2029" in text:
        for char, escaped in _GO_ESCAPED:
            text = text.replace(char, escaped)
    return text


class JsonLinesSink(Sink[T], Generic[T]):
    """Appends ``render(item)`` (one line) per export to ``path``, flushed so a reader tailing it sees whole lines."""

    def __init__(self, path: str | Path, render: Callable[[T], bytes], *, name: str) -> None:
        self.name = name
        self.path = Path(path)
        self._render = render
        # Opened now so that a bad path fails at startup, not at the first export.
        self._file = open(self.path, "ab")  # noqa: SIM115 - lives as long as the sink
        self._lock = threading.Lock()
        self._failures = FailureLog(_log, name)

    def export(self, item: T) -> bool:
        """Render one line and append it whole; never raises (failures are logged once)."""
        try:
            line = self._render(item)
        except Exception as exc:  # noqa: BLE001 - a sink never raises
            self._failures.failed(type(exc).__name__, exc)
            return False
        with self._lock:
            if self._file.closed:
                return False
            return self._append(line)

    def _append(self, line: bytes) -> bool:
        start = self._file.tell()
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            self._failures.failed(type(exc).__name__, exc)
            self._remove_partial_line(start)
            return False
        self._failures.succeeded()
        return True

    def _remove_partial_line(self, start: int) -> None:
        """After a failed write (disk full), cut the half line so the retry starts a clean one."""
        try:
            self._file.truncate(start)
        except OSError as exc:
            _log.debug("sink %s: could not truncate partial line: %s", self.name, exc)

    def shutdown(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError as exc:
                _log.debug("sink %s: close failed: %s", self.name, exc)


def read_json_lines(path: str | Path, parse: Callable[[str], R], what: str, errors: tuple[type, ...]) -> list[R]:
    """``parse`` of every complete line of a JSON-lines file.

    A last line without its newline is still being written and is skipped;
    a complete line that ``parse`` rejects with one of ``errors`` raises
    ValueError naming the line (``path:number: not an OTLP/JSON <what>: ...``).
    """
    out: list[R] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                out.append(parse(line))
            except errors as exc:
                raise ValueError(f"{path}:{number}: not an OTLP/JSON {what}: {exc}") from exc
    return out
