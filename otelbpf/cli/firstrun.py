"""First-run mistakes, said once and with the fix, before anything is
created: an OTLP endpoint without a scheme, a port that belongs to the other
OTLP transport, a --pid that does not exist, spans that could not be
delivered by exit, a backend that does not take metrics.

Checks that can be made before start-up raise ``ValueError`` with the
message the CLI prints; the rest are log lines.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

from otelbpf.cli.outputs import DEFAULT_JSON_FILE, wants_otlp
from otelbpf.otlp import resolve_transport

log = logging.getLogger("otelbpf")

#: The OTLP default ports (OpenTelemetry specification, "OTLP/gRPC", "OTLP/HTTP").
GRPC_PORT = 4317
HTTP_PORT = 4318
#: Exit status of `run --fail-on-drop` when spans were not delivered.
EXIT_DROPPED = 3


def endpoint_from_env(signal_infix: str = "TRACES") -> tuple[str | None, str | None]:
    """(endpoint, the variable it came from) of the OTel variables, or (None, None)."""
    for variable in (f"OTEL_EXPORTER_OTLP_{signal_infix}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value, variable
    return None, None


def check_endpoint(endpoint: str, protocol: str, origin: str) -> None:
    """An endpoint must say http:// (plaintext) or https:// (TLS): without a
    scheme, ``collector:4317`` would silently mean TLS to a plaintext port for
    gRPC, and is no URL at all for HTTP. A port that is the other transport's
    default is named as such."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{origin} {endpoint!r} has no http:// or https:// scheme: "
            f"use http://{endpoint.split('://')[-1]} (plaintext, a Collector in the cluster) or https://... (TLS)"
        )
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{origin} {endpoint!r}: the port is not a number") from None
    if protocol == "grpc" and port == HTTP_PORT:
        log.warning(
            "otelbpf: %s uses port %d, OTLP/HTTP's port, with the grpc protocol: use :%d or --otlp-protocol http/protobuf",
            origin, HTTP_PORT, GRPC_PORT,
        )  # fmt: skip
    elif protocol == "http/protobuf" and port == GRPC_PORT:
        log.warning(
            "otelbpf: %s uses port %d, OTLP/gRPC's port, with http/protobuf: use :%d or --otlp-protocol grpc",
            origin, GRPC_PORT, HTTP_PORT,
        )  # fmt: skip


def otlp_endpoint_and_port(endpoint: str | None, protocol: str | None) -> tuple[str | None, int]:
    """The traces endpoint ``run`` will use and the port it defaults to."""
    transport = resolve_transport(protocol)
    if not endpoint:
        endpoint, _ = endpoint_from_env()
    return endpoint, GRPC_PORT if transport == "grpc" else HTTP_PORT


def check_output_options(args) -> None:
    """The OTLP settings of ``run``/``replay`` are usable (raises ValueError)."""
    if not wants_otlp(args):
        return
    transport = resolve_transport(getattr(args, "otlp_protocol", None))
    if getattr(args, "otlp_endpoint", None):
        check_endpoint(args.otlp_endpoint, transport, "--otlp-endpoint")
        return
    endpoint, variable = endpoint_from_env()
    if endpoint:
        check_endpoint(endpoint, transport, variable)


def check_pids_exist(pids: list[int]) -> None:
    for pid in pids:
        if not os.path.exists(f"/proc/{pid}"):
            raise ValueError(f"--pid {pid}: no such process")


def remove_empty_outputs(args) -> None:
    """The agent did not start: leave no empty output file behind."""
    for path in {getattr(args, "json_file", None) or DEFAULT_JSON_FILE, getattr(args, "metrics_json_file", None)}:
        if path and os.path.isfile(path) and os.path.getsize(path) == 0:
            os.unlink(path)


def undelivered(stats: dict[str, int]) -> int:
    """Spans counted as dropped by the export queues (every sink)."""
    return sum(v for k, v in stats.items() if k == "otelbpf.export.dropped" or k.startswith("otelbpf.export.dropped{"))


def exit_status(stats: dict[str, int], fail_on_drop: bool) -> int:
    """Say once how many spans were not delivered; EXIT_DROPPED with --fail-on-drop."""
    lost = undelivered(stats)
    if not lost:
        return 0
    log.error(
        "otelbpf: %d span(s) could not be delivered (the collector was unreachable or refused them; see the first "
        "export failure above)%s",
        lost,
        "" if fail_on_drop else "; --fail-on-drop makes this exit non-zero",
    )
    return EXIT_DROPPED if fail_on_drop else 0
