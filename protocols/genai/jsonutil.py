"""JSON as LLM calls need it: decode a body or an event, or read fields from a body known
only by its head and tail; bounded, never raising.

Shared by the per-call state (protocols/genai/llm.py) and every API module
(protocols/genai/apis/). ``loads`` runs once per decoded stream event, so the module is
compiled (pyproject.toml ``[tool.otelbpf] compiled``).
"""

from __future__ import annotations

import json
from typing import Any

#: Bytes kept of the end of a body too long for its limit (for trailing keys such as ``usage``).
TAIL_LIMIT = 16 * 1024
#: Attempts per key when scanning an oversized body.
_MAX_SCAN_ATTEMPTS = 8
_DECODER = json.JSONDecoder()

#: Keys read from the head of an oversized response (ids and models lead), else its tail.
HEAD_KEYS: tuple[str, ...] = ("id", "model")
#: Keys read from the tail of an oversized response (usage and reasons trail), else its head.
TAIL_KEYS: tuple[str, ...] = (
    "usage", "prompt_eval_count", "eval_count", "done_reason", "status", "incomplete_details", "stop_reason", "meta",
    "details",
)  # fmt: skip


def loads(data: bytes) -> dict | None:
    """A JSON object, or None (anything else, or not JSON). What ``json.loads`` does with
    bytes that start with ``{`` (then UTF-8, as its encoding detection finds), without
    its Python-level steps around the decoder (a third of the time for a stream chunk):
    the same decoder, the same errors, nothing but JSON whitespace after the value."""
    try:
        if data[:1] == b"{" and len(data) > 1 and data[1] != 0:
            text = data.decode("utf-8", "surrogatepass")
            obj, end = _DECODER.raw_decode(text)
            if end != len(text) and text[end:].strip(" \t\n\r"):
                return None  # json.loads: "Extra data"
        else:
            obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def keep(head: bytearray, tail: bytes, data: bytes, limit: int) -> tuple[bytearray, bytes]:
    """Append ``data`` to a body kept as its first ``limit`` bytes plus its last TAIL_LIMIT bytes."""
    room = limit - len(head)
    if room > 0:
        head += data[:room]
        data = data[room:]
    if data:
        tail = (tail + data)[-TAIL_LIMIT:] if len(data) < TAIL_LIMIT else data[-TAIL_LIMIT:]
    return head, tail


def scan(text: str, key: str, last: bool) -> Any:
    """The value after ``"key":`` in a JSON fragment (first or last occurrence not in a string)."""
    needle = f'"{key}"'
    index = text.rfind(needle) if last else text.find(needle)
    attempts = 0
    while index >= 0 and attempts < _MAX_SCAN_ATTEMPTS:
        attempts += 1
        if index == 0 or text[index - 1] != "\\":
            pos = index + len(needle)
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            if pos < len(text) and text[pos] == ":":
                pos += 1
                while pos < len(text) and text[pos] in " \t\r\n":
                    pos += 1
                try:
                    return _DECODER.raw_decode(text, pos)[0]
                except (ValueError, RecursionError):
                    pass
        index = text.rfind(needle, 0, index) if last else text.find(needle, index + 1)
    return None


def scan_keys(head: bytes | bytearray, tail: bytes, keys: tuple[str, ...]) -> dict:
    """``keys`` of a JSON object known only by its head and tail (best effort), each
    from its first occurrence in the head, else its last in the tail (a request's
    fields: the first one wins as in a parse)."""
    text_head = head.decode("utf-8", "replace")
    text_tail = tail.decode("utf-8", "replace")
    out: dict = {}
    for key in keys:
        value = scan(text_head, key, last=False)
        if value is None:
            value = scan(text_tail, key, last=True)
        if value is not None:
            out[key] = value
    return out


def scan_object(
    head: bytes | bytearray,
    tail: bytes,
    skip_to: bytes = b"",
    head_keys: tuple[str, ...] = HEAD_KEYS,
    tail_keys: tuple[str, ...] = TAIL_KEYS,
) -> dict:
    """Top-level-looking fields of a JSON object known only by its head and tail (best effort):
    ``head_keys`` (ids and models) from the head (after ``skip_to`` when given), else the
    tail; ``tail_keys`` (usage, reasons) from the tail, else the head."""
    if skip_to:
        found = head.find(skip_to)
        head = head[found:] if found >= 0 else head
    text_head = head.decode("utf-8", "replace")
    text_tail = tail.decode("utf-8", "replace")
    obj: dict = {}
    for key in head_keys:  # leading fields (an embeddings list puts its model last: the tail)
        value = scan(text_head, key, last=False)
        if value is None:
            value = scan(text_tail, key, last=True)
        if value is not None:
            obj[key] = value
    for key in tail_keys:
        value = scan(text_tail, key, last=True)
        if value is None:
            value = scan(text_head, key, last=False)
        if value is not None:
            obj[key] = value
    return obj


def json_head(data: bytes | bytearray, length: int) -> dict | None:
    """The JSON object that starts a body followed by other bytes (the v2 inference
    protocol's binary tensors): its first ``length`` bytes when the header told it, else
    its first JSON value."""
    if 0 <= length <= len(data):
        return loads(bytes(data[:length]))
    if length > len(data):
        return None  # the head is longer than what was kept: nothing trustworthy
    text = bytes(data).decode("utf-8", "replace")
    try:
        value = _DECODER.raw_decode(text)[0]
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def first_object(data: bytes) -> dict | None:
    """The first item of a JSON list, when it is an object (TGI's ``POST /`` answer)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return value[0]
    return None


def count(value: Any) -> int | None:
    """A token count or size: a non-negative int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def number(value: Any) -> float | None:
    """A finite number as a float (not a bool), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
        return result if result == result and abs(result) != float("inf") else None
    return None


def text_of(content: Any) -> str:
    """Text of a message content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return "" if content is None else json.dumps(content, default=str)[:1024]
