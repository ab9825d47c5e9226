"""RTPS (DDS, ROS 2): samples sent and received become PRODUCER/CONSUMER exchanges.

Sans-IO like every protocol here: ``wire`` decodes messages, ``discovery``
maps writer and reader GUIDs to topics, ``state`` holds what all sessions
share, ``stitch`` turns datagrams into exchanges.
"""

from protocols.rtps.detect import RtpsDetector
from protocols.rtps.types import PROTOCOL, RtpsExchange

__all__ = ["PROTOCOL", "RtpsDetector", "RtpsExchange"]
