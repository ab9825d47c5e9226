"""Replay a packet capture (pcap, pcapng) as events of synthetic processes.

One module per concern, each importing only those listed above it:

* ``fragments``: IPv4 fragment reassembly;
* ``link``: link-layer header skipping, IPv4/IPv6/TCP/UDP decoding (dpkt)
  into TCP segments and UDP datagrams;
* ``files``: pcap/pcapng record readers and :class:`PcapError`;
* ``streams``: TCP stream reassembly (sequence order, retransmissions,
  holes reported as ``missing``);
* ``processes``: endpoints as synthetic processes, with their file
  descriptors and connection ids;
* ``datagrams``: UDP, one DatagramEvent per datagram per traced side;
* ``replay``: TCP flows, and the events of both: :class:`PcapSource`.

``otelbpf.cli.replay`` runs a capture through the pipeline (``otelbpf replay``,
the golden tests).
"""

from otelbpf.sources.pcap.files import PcapError
from otelbpf.sources.pcap.processes import Endpoint, Role
from otelbpf.sources.pcap.replay import PcapSource, Perspective

__all__ = ["Endpoint", "PcapError", "PcapSource", "Perspective", "Role"]
