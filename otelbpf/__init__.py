"""otelbpf: zero-code eBPF tracing for AI inference services, exported as OpenTelemetry."""

import protocols  # noqa: F401  (installs the stale-extension guard, protocols/_fresh.py, first)

__version__ = "0.1.0"
