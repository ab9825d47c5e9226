"""A toy protocol added the way DEVELOPERS.md "Adding a protocol" says: its own
folder (this package stands in for ``protocols/toy/``), its semantics module,
its metric instruments, and one registration line (:func:`register`).

The protocol is line based: a request ``REQ <id> <verb>\\n`` is answered by
``REP <id> <status>\\n``; replies may come in any order (the id is the
correlation key). It runs over TCP (a byte stream, lines split anywhere) and
over UDP (one line per datagram).
"""

from otelbpf.registry import Registry
from tests.toy_protocol.metrics import INSTRUMENTS
from tests.toy_protocol.protocol import PROTOCOL, ToyDetector
from tests.toy_protocol.semantics import SEMANTICS


def register(registry: Registry) -> Registry:
    registry.register(ToyDetector(), SEMANTICS, INSTRUMENTS)  # the one registration line
    return registry


__all__ = ["PROTOCOL", "register"]
