"""otelbpf: zero-code eBPF tracing for AI inference services, exported as OpenTelemetry."""

__version__ = "0.1.0"
