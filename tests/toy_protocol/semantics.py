"""Toy exchanges become spans named ``toy {verb}``."""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import StatusCode
from otelbpf.semantics.common import network_transport, outcome_status, peer_attributes, span_record
from tests.toy_protocol.protocol import PROTOCOL


class ToySemantics:
    protocol = PROTOCOL

    def span(self, start, exchange, conn, options):
        attrs = {"toy.verb": exchange.verb, "toy.status": exchange.status}
        network_transport(conn, attrs)
        peer_attributes(conn, attrs)
        status, message = outcome_status(exchange, bool(exchange.status), attrs)
        if exchange.status == "ERR":
            status, attrs[sc.ERROR_TYPE] = StatusCode.ERROR, "ERR"
        return span_record(start, exchange, f"toy {exchange.verb}", attrs, status, message)


SEMANTICS = ToySemantics()
