"""Where an exchange becomes a span: one module per protocol, named by its protocol id.

A protocol's semantics maps its exchange (from ``protocols/<id>/``) to the
span's name, attributes and status by the OpenTelemetry semantic
conventions. The span's identity (trace, span and parent IDs, chosen by
``otelbpf.association`` when the exchange started) is given; the semantics
fills in the rest when the exchange ends. Pieces every protocol shares
(network attributes, outcome -> status, truncation flags, the span record
itself) live once, in :mod:`otelbpf.semantics.common`.

Protocols are registered with their semantics in ``otelbpf/registry.py``.
"""

from otelbpf.semantics.common import CallSemantics, SpanOptions, SpanSemantics

__all__ = ["CallSemantics", "SpanOptions", "SpanSemantics"]
