"""Event sources: each yields otelbpf.events objects (eBPF, pcap, recorded)."""
