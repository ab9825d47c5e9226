"""DDS / ROS 2 metric instruments, per topic.

* ``otelbpf.dds.message.size`` (By): one point per sample sent or received,
  by topic and operation: its count is the publish / receive count, its sum
  the bytes (retransmissions are not samples: protocols/rtps/state.py).
* ``otelbpf.dds.latency`` (s): writer's send (its source timestamp) to the
  reader's receive, per topic, on receiving spans.
* ``otelbpf.dds.lost_samples`` ({sample}): samples lost, seen as sequence
  gaps never filled; its sum is the count, per topic.

Topics are low-cardinality in DDS systems (they are declared, not
per-request); writer GUIDs and peer addresses never become metric attributes.
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind, SpanRecord
from otelbpf.metrics.instruments import SpanHistogram

ATTRIBUTES: tuple[str, ...] = (
    sc.MESSAGING_SYSTEM,
    sc.MESSAGING_OPERATION_TYPE,
    sc.MESSAGING_DESTINATION_NAME,
    sc.OTELBPF_DDS_TOPIC_UNKNOWN,
)
_RECEIVING = (SpanKind.CONSUMER, SpanKind.SERVER)


def _any(span: SpanRecord) -> bool:
    return True


def _size(span: SpanRecord) -> float:
    return float(span.attributes.get(sc.MESSAGING_MESSAGE_BODY_SIZE, 0))


def _has_latency(span: SpanRecord) -> bool:
    return span.kind in _RECEIVING and sc.OTELBPF_DDS_SOURCE_LATENCY in span.attributes


def _latency(span: SpanRecord) -> float:
    return float(span.attributes[sc.OTELBPF_DDS_SOURCE_LATENCY])


def _has_loss(span: SpanRecord) -> bool:
    return sc.OTELBPF_DDS_LOST_BEFORE in span.attributes


def _lost(span: SpanRecord) -> float:
    return float(span.attributes[sc.OTELBPF_DDS_LOST_BEFORE])


MESSAGE_SIZE = SpanHistogram(
    name=sc.OTELBPF_DDS_MESSAGE_SIZE,
    unit="By",
    description="Size of DDS samples sent and received (count: samples; sum: bytes), per topic.",
    boundaries=sc.DDS_SIZE_BOUNDARIES,
    attributes=ATTRIBUTES,
    select=_any,
    value=_size,
)
LATENCY = SpanHistogram(
    name=sc.OTELBPF_DDS_LATENCY,
    unit="s",
    description="Time from a DDS writer's send (source timestamp) to a reader's receive, per topic.",
    boundaries=sc.DDS_LATENCY_BOUNDARIES,
    attributes=ATTRIBUTES,
    select=_has_latency,
    value=_latency,
)
LOST_SAMPLES = SpanHistogram(
    name=sc.OTELBPF_DDS_LOST_SAMPLES,
    unit="{sample}",
    description="DDS samples lost before a received one (sequence gaps never filled); the sum counts them.",
    boundaries=sc.DDS_LOST_BOUNDARIES,
    attributes=ATTRIBUTES,
    select=_has_loss,
    value=_lost,
)

INSTRUMENTS: tuple[SpanHistogram, ...] = (MESSAGE_SIZE, LATENCY, LOST_SAMPLES)
