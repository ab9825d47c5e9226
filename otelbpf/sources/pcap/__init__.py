"""Replay a packet capture (pcap, pcapng) as events of synthetic processes.

One module per concern:

* ``files``: pcap/pcapng record readers and :class:`PcapError`;
* ``link``: link-layer header skipping, IPv4/IPv6/TCP/UDP decoding (dpkt);
* ``streams``: TCP stream reassembly (sequence order, retransmissions,
  holes reported as ``missing``);
* ``datagrams``: UDP, one DatagramEvent per datagram per traced side, and
  IPv4 fragment reassembly;
* ``replay``: endpoints as synthetic processes, flows, and the events:
  :class:`PcapSource`.

``otelbpf.cli.replay`` runs a capture through the pipeline (``otelbpf replay``,
the golden tests).
"""

from otelbpf.sources.pcap.files import PcapError
from otelbpf.sources.pcap.replay import Endpoint, PcapSource, Perspective, Role

__all__ = ["Endpoint", "PcapError", "PcapSource", "Perspective", "Role"]
