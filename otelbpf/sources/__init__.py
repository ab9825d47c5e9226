"""Event sources: each yields otelbpf.core.events objects (eBPF, pcap, recorded)."""
