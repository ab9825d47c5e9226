"""Every OpenTelemetry semantic-convention name otelbpf writes, in one place.

Span, metric and resource code imports names from here and never spells an
attribute key itself, so a renamed convention is one edit. Versions followed:
the general, HTTP, network, RPC (v1.44), messaging and resource conventions
of semantic-conventions v1.38+, and GenAI from the semantic-conventions-genai
repository. Names under ``otelbpf.`` are this agent's own (documented in
README "What a span carries").
"""

from __future__ import annotations

# --- error / general ---------------------------------------------------------
ERROR_TYPE = "error.type"
THREAD_ID = "thread.id"

# --- network -------------------------------------------------------------------
NETWORK_PROTOCOL_NAME = "network.protocol.name"
NETWORK_PROTOCOL_VERSION = "network.protocol.version"
NETWORK_TRANSPORT = "network.transport"
NETWORK_PEER_ADDRESS = "network.peer.address"
NETWORK_PEER_PORT = "network.peer.port"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
CLIENT_ADDRESS = "client.address"
CLIENT_PORT = "client.port"

# --- HTTP ------------------------------------------------------------------------
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_REQUEST_METHOD_ORIGINAL = "http.request.method_original"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_ROUTE = "http.route"
HTTP_REQUEST_BODY_SIZE = "http.request.body.size"
HTTP_RESPONSE_BODY_SIZE = "http.response.body.size"
URL_PATH = "url.path"
URL_QUERY = "url.query"
URL_SCHEME = "url.scheme"
URL_FULL = "url.full"
USER_AGENT_ORIGINAL = "user_agent.original"
#: The methods the HTTP conventions know; any other is reported as ``_OTHER``.
HTTP_KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY"}
)
HTTP_OTHER_METHOD = "_OTHER"

# --- HTTP metrics -------------------------------------------------------------------
HTTP_SERVER_REQUEST_DURATION = "http.server.request.duration"
HTTP_CLIENT_REQUEST_DURATION = "http.client.request.duration"
#: Explicit bucket boundaries the HTTP conventions advise for the duration histograms (seconds).
HTTP_DURATION_BOUNDARIES: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip

# --- metrics in general -------------------------------------------------------------------
OTEL_METRIC_OVERFLOW = "otel.metric.overflow"

# --- resource -------------------------------------------------------------------------------
SERVICE_NAME = "service.name"
SERVICE_VERSION = "service.version"
SERVICE_INSTANCE_ID = "service.instance.id"
TELEMETRY_DISTRO_NAME = "telemetry.distro.name"
TELEMETRY_DISTRO_VERSION = "telemetry.distro.version"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
PROCESS_EXECUTABLE_NAME = "process.executable.name"
PROCESS_EXECUTABLE_PATH = "process.executable.path"
PROCESS_COMMAND = "process.command"
CONTAINER_ID = "container.id"
K8S_POD_UID = "k8s.pod.uid"

# --- otelbpf's own span attributes ------------------------------------------------------------
OTELBPF_ASSOCIATION = "otelbpf.association"
OTELBPF_PAYLOAD_TRUNCATED = "otelbpf.payload.truncated"
OTELBPF_RESPONSE_INCOMPLETE = "otelbpf.response.incomplete"
OTELBPF_RESPONSE_BODY_SENDFILE = "otelbpf.response.body.sendfile"
OTELBPF_EXCHANGE_END_REASON = "otelbpf.exchange.end_reason"
OTELBPF_TIME_TO_FIRST_BYTE = "otelbpf.response.time_to_first_byte"
