"""Where an RTPS sample becomes a span: messaging semantic conventions for DDS and ROS 2.

A sent sample is a PRODUCER span ``send {topic}``, a received one a
CONSUMER span ``receive {topic}`` (a ROS 2 service request: CLIENT where
sent, SERVER where received, named after the service). ``messaging.system``
is ``dds``: the agent sees DDS on the wire, whatever runs on it; ROS 2 shows
in ``otelbpf.ros2.topic`` / ``otelbpf.ros2.service`` (the DDS topic without
its ``rt/``, ``rq/``, ``rr/`` prefix). ``messaging.message.id`` is the
writer GUID and sequence number, the same in every process that sees the
sample; a receiving span is linked to the sending one by it
(otelbpf.association, rule ``message``).

A writer whose announcement the agent has not seen yet (it was created
before the agent started; SEDP resends it periodically) gives spans named
``send (unknown topic)`` with ``otelbpf.dds.topic.unknown`` and the writer
GUID, until discovery names it.
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import AttributeValue, SpanKind, SpanLink, SpanRecord
from otelbpf.semantics.common import SpanOptions, network_transport, outcome_status, peer_attributes, span_record
from protocols.rtps.discovery import guid_text
from protocols.rtps.types import PROTOCOL, ROS2_REPLY_PREFIX, ROS2_REQUEST_PREFIX, ROS2_TOPIC_PREFIX, RtpsExchange
from protocols.rtps.wire import vendor_name

UNKNOWN_TOPIC = "(unknown topic)"
_SENDING = (SpanKind.PRODUCER, SpanKind.CLIENT)


def ros2_name(topic: str) -> tuple[str, str] | None:
    """(attribute, ROS 2 name) of a DDS topic that follows the ROS 2 mapping, else None.

    ``rt/camera/image`` -> topic ``/camera/image``;
    ``rq/plan_pathRequest`` and ``rr/plan_pathReply`` -> service ``/plan_path``.
    """
    if topic.startswith(ROS2_TOPIC_PREFIX):
        return sc.OTELBPF_ROS2_TOPIC, "/" + topic[len(ROS2_TOPIC_PREFIX) :]
    for prefix, suffix in ((ROS2_REQUEST_PREFIX, "Request"), (ROS2_REPLY_PREFIX, "Reply")):
        if topic.startswith(prefix) and topic.endswith(suffix):
            return sc.OTELBPF_ROS2_SERVICE, "/" + topic[len(prefix) : -len(suffix)]
    return None


def message_id(exchange: RtpsExchange) -> str:
    """Writer GUID + sequence number: ``0110aabb.ccddeeff.00112233.00000102:42``."""
    return f"{guid_text(exchange.writer_guid)}:{exchange.sequence}"


class RtpsSemantics:
    """``SpanSemantics`` for RTPS (protocols/rtps)."""

    protocol = PROTOCOL

    def span(self, start: SpanStart, exchange: RtpsExchange, conn, options: SpanOptions) -> SpanRecord:
        sending = start.kind in _SENDING
        operation = sc.MESSAGING_OPERATION_SEND if sending else sc.MESSAGING_OPERATION_RECEIVE
        topic = exchange.topic
        attrs: dict[str, AttributeValue] = {
            sc.MESSAGING_SYSTEM: sc.MESSAGING_SYSTEM_DDS,
            sc.MESSAGING_OPERATION_TYPE: operation,
            sc.MESSAGING_OPERATION_NAME: operation,
            sc.MESSAGING_MESSAGE_ID: message_id(exchange),
            sc.MESSAGING_MESSAGE_BODY_SIZE: exchange.size,
            sc.OTELBPF_DDS_WRITER_GUID: guid_text(exchange.writer_guid),
            sc.OTELBPF_DDS_SEQUENCE: exchange.sequence,
        }
        if exchange.vendor_id:
            attrs[sc.OTELBPF_DDS_VENDOR] = vendor_name(exchange.vendor_id)
        name = f"{operation} {topic or UNKNOWN_TOPIC}"
        if topic:
            attrs[sc.MESSAGING_DESTINATION_NAME] = topic
            if exchange.type_name:
                attrs[sc.OTELBPF_DDS_TYPE_NAME] = exchange.type_name
            ros2 = ros2_name(topic)
            if ros2 is not None:
                attrs[ros2[0]] = ros2[1]
                if start.kind in (SpanKind.CLIENT, SpanKind.SERVER):  # a ROS 2 service call
                    attrs[sc.RPC_SYSTEM] = "ros2"
                    attrs[sc.RPC_SERVICE] = ros2[1]
                    name = ros2[1]
        else:
            attrs[sc.OTELBPF_DDS_TOPIC_UNKNOWN] = True
        if exchange.fragmented:
            attrs[sc.OTELBPF_DDS_FRAGMENTED] = True
        if not sending:
            if exchange.source_ns and exchange.ts_ns >= exchange.source_ns:
                attrs[sc.OTELBPF_DDS_SOURCE_LATENCY] = (exchange.ts_ns - exchange.source_ns) / 1e9
            if exchange.lost_before:
                attrs[sc.OTELBPF_DDS_LOST_BEFORE] = exchange.lost_before
        network_transport(conn, attrs)
        peer_attributes(conn, attrs)
        status, message = outcome_status(exchange, True, attrs)
        record = span_record(start, exchange, name, attrs, status, message)
        record.links = [SpanLink(sender.trace_id, sender.span_id) for sender in start.links]
        return record


SEMANTICS = RtpsSemantics()
