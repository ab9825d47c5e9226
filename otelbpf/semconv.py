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

# --- RPC / gRPC (semantic-conventions v1.44: docs/rpc/rpc-spans.md, grpc.md, rpc-metrics.md) ---
RPC_SYSTEM_NAME = "rpc.system.name"
RPC_METHOD = "rpc.method"
RPC_METHOD_ORIGINAL = "rpc.method_original"
RPC_RESPONSE_STATUS_CODE = "rpc.response.status_code"
RPC_SYSTEM_GRPC = "grpc"
#: ``rpc.method`` when the method is not known (span name is then ``{rpc.system.name}``).
RPC_OTHER_METHOD = "_OTHER"
RPC_SERVER_CALL_DURATION = "rpc.server.call.duration"
RPC_CLIENT_CALL_DURATION = "rpc.client.call.duration"
#: Bucket boundaries the RPC metric conventions advise (seconds).
RPC_DURATION_BOUNDARIES: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
#: Deprecated names still emitted with ``OTEL_SEMCONV_STABILITY_OPT_IN=rpc/dup``.
RPC_SYSTEM_OLD = "rpc.system"
RPC_SERVICE_OLD = "rpc.service"
RPC_GRPC_STATUS_CODE_OLD = "rpc.grpc.status_code"
#: The ``OTEL_SEMCONV_STABILITY_OPT_IN`` value that asks for both old and new RPC names.
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
SEMCONV_OPT_IN_RPC_DUP = "rpc/dup"
#: gRPC status codes by number (grpc/doc/statuscodes.md), as ``rpc.response.status_code`` writes them.
GRPC_STATUS_NAMES: tuple[str, ...] = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
#: Codes that make a SERVER span an error (grpc.md); on the client every code but OK is one.
GRPC_SERVER_ERROR_STATUSES = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)

# --- GenAI (semantic-conventions-genai: gen-ai-spans.md, gen-ai-metrics.md, registry/attributes/gen-ai.md) ---
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
#: Seconds from the request's first byte to the first output chunk of a streamed response.
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
#: Prompt-cache input tokens read / written (both included in gen_ai.usage.input_tokens).
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
#: Opt-in content (``--capture-genai-content``): JSON in the conventions' message format.
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
GEN_AI_TOKEN_TYPE_INPUT = "input"
GEN_AI_TOKEN_TYPE_OUTPUT = "output"
#: ``gen_ai.operation.name`` well-known values otelbpf writes.
GEN_AI_OPERATION_CHAT = "chat"
GEN_AI_OPERATION_TEXT_COMPLETION = "text_completion"
GEN_AI_OPERATION_EMBEDDINGS = "embeddings"
#: Multimodal content generation (Gemini's generateContent, streamed or not).
GEN_AI_OPERATION_GENERATE_CONTENT = "generate_content"
#: Custom ``gen_ai.operation.name`` values (no well-known one applies; the conventions
#: allow a custom value then): ranking documents against a query (/v1/rerank) and
#: scoring text pairs (/v1/score).
GEN_AI_OPERATION_RERANK = "rerank"
GEN_AI_OPERATION_SCORE = "score"
#: Tensor inference by the v2 inference protocol (Triton, KServe: /v2/models/M/infer).
GEN_AI_OPERATION_INFER = "infer"
#: ``gen_ai.provider.name`` well-known values, and the server hosts that identify them.
GEN_AI_PROVIDER_OPENAI = "openai"
GEN_AI_PROVIDER_AZURE_OPENAI = "azure.ai.openai"
GEN_AI_PROVIDER_ANTHROPIC = "anthropic"
GEN_AI_PROVIDER_DEEPSEEK = "deepseek"
GEN_AI_PROVIDER_GROQ = "groq"
GEN_AI_PROVIDER_MISTRAL_AI = "mistral_ai"
GEN_AI_PROVIDER_MOONSHOT_AI = "moonshot_ai"
GEN_AI_PROVIDER_PERPLEXITY = "perplexity"
GEN_AI_PROVIDER_X_AI = "x_ai"
GEN_AI_PROVIDER_GCP_GEMINI = "gcp.gemini"
GEN_AI_PROVIDER_GCP_VERTEX_AI = "gcp.vertex_ai"
GEN_AI_PROVIDER_AWS_BEDROCK = "aws.bedrock"
#: Custom ``gen_ai.provider.name`` values (none of the well-known ones applies):
#: Ollama's own API, and the OpenAI wire format served by a server that is not
#: known to be OpenAI (vLLM, llama.cpp, SGLang, LiteLLM, a mock: the format
#: flavor is OpenAI's, the provider is not).
GEN_AI_PROVIDER_OLLAMA = "ollama"
GEN_AI_PROVIDER_OPENAI_COMPATIBLE = "openai_compatible"
#: Hugging Face Text Generation Inference's native API (/generate, /generate_stream):
#: not a listed provider; dotted as the conventions' vendor.product values are.
GEN_AI_PROVIDER_HUGGINGFACE_TGI = "huggingface.tgi"
#: The v2 inference protocol (KServe's Open Inference Protocol; Triton, KServe, MLServer
#: and OpenVINO Model Server speak it, and nothing on the wire tells them apart).
GEN_AI_PROVIDER_OPEN_INFERENCE = "open_inference"

# --- GenAI metrics ---------------------------------------------------------------------
GEN_AI_CLIENT_OPERATION_DURATION = "gen_ai.client.operation.duration"
GEN_AI_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
GEN_AI_SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
GEN_AI_SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
#: Bucket boundaries the GenAI metric conventions advise.
GEN_AI_DURATION_BOUNDARIES: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
GEN_AI_TOKEN_USAGE_BOUNDARIES: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BOUNDARIES: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BOUNDARIES: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip

# --- messaging (docs/messaging/messaging-spans.md, messaging-metrics.md) ---------------
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_MESSAGE_BODY_SIZE = "messaging.message.body.size"
MESSAGING_CLIENT_ID = "messaging.client.id"
#: operation types (messaging.operation.type well-known values)
MESSAGING_OPERATION_SEND = "send"
MESSAGING_OPERATION_RECEIVE = "receive"
#: messaging.system for RTPS: no well-known value exists; "dds" names the
#: system on the wire whatever the application (ROS 2 is one DDS user, seen
#: from its ``rt/``/``rq/``/``rr/`` topic names; docs/ros2-dds.md).
MESSAGING_SYSTEM_DDS = "dds"
MESSAGING_CLIENT_SENT_MESSAGES = "messaging.client.sent.messages"
MESSAGING_CLIENT_CONSUMED_MESSAGES = "messaging.client.consumed.messages"
RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"

# --- DDS / ROS 2: otelbpf's own (no convention exists) ----------------------------------------
#: the DDS type name of the topic (``sensor_msgs::msg::dds_::Image_``)
OTELBPF_DDS_TYPE_NAME = "otelbpf.dds.type_name"
#: the writer's GUID (always, so a sample is findable while its topic is unknown)
OTELBPF_DDS_WRITER_GUID = "otelbpf.dds.writer.guid"
OTELBPF_DDS_SEQUENCE = "otelbpf.dds.sequence_number"
#: the topic was not announced by discovery yet (the span then names no destination)
OTELBPF_DDS_TOPIC_UNKNOWN = "otelbpf.dds.topic.unknown"
#: the sample was split into DATA_FRAG submessages and reassembled
OTELBPF_DDS_FRAGMENTED = "otelbpf.dds.fragmented"
#: samples of this writer lost (sequence gaps never filled) just before this one
OTELBPF_DDS_LOST_BEFORE = "otelbpf.dds.lost_before"
#: the DDS implementation of the writer's participant, from the RTPS header's vendor id
#: (``eProsima Fast DDS``, ``Eclipse Cyclone DDS``; ``0x....`` when not in the list)
OTELBPF_DDS_VENDOR = "otelbpf.dds.vendor"
#: the ROS 2 topic or service name: the DDS topic without ``rt/``/``rq/``/``rr/`` (and Request/Reply)
OTELBPF_ROS2_TOPIC = "otelbpf.ros2.topic"
OTELBPF_ROS2_SERVICE = "otelbpf.ros2.service"
#: DDS metrics (otelbpf/metrics/rtps.py)
OTELBPF_DDS_MESSAGE_SIZE = "otelbpf.dds.message.size"
OTELBPF_DDS_LATENCY = "otelbpf.dds.latency"
#: span attribute: seconds from the writer's source timestamp (INFO_TS) to this receive
OTELBPF_DDS_SOURCE_LATENCY = "otelbpf.dds.source_latency"
OTELBPF_DDS_LOST_SAMPLES = "otelbpf.dds.lost_samples"
DDS_SIZE_BOUNDARIES: tuple[float, ...] = (
    64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
)  # fmt: skip
DDS_LATENCY_BOUNDARIES: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
DDS_LOST_BOUNDARIES: tuple[float, ...] = (1, 2, 4, 8, 16, 64, 256, 1024)

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

# --- resource: who made the telemetry, and where (telemetry.sdk.*, k8s.node.name) -------------
# The spans of a traced process are made by otelbpf, not by an SDK inside it:
# telemetry.sdk.name is "otelbpf", telemetry.sdk.language the process's own
# language when it is known (as OpenTelemetry eBPF Instrumentation does).
TELEMETRY_SDK_NAME = "telemetry.sdk.name"
TELEMETRY_SDK_VERSION = "telemetry.sdk.version"
TELEMETRY_SDK_LANGUAGE = "telemetry.sdk.language"
K8S_NODE_NAME = "k8s.node.name"

# --- otelbpf's own span attributes ------------------------------------------------------------
OTELBPF_ASSOCIATION = "otelbpf.association"
OTELBPF_PAYLOAD_TRUNCATED = "otelbpf.payload.truncated"
OTELBPF_RESPONSE_INCOMPLETE = "otelbpf.response.incomplete"
OTELBPF_RESPONSE_BODY_SENDFILE = "otelbpf.response.body.sendfile"
OTELBPF_EXCHANGE_END_REASON = "otelbpf.exchange.end_reason"
OTELBPF_TIME_TO_FIRST_BYTE = "otelbpf.response.time_to_first_byte"
#: otelbpf's own GenAI span attributes (no convention exists for them):
#: output chunks of a streamed response (SSE events / NDJSON lines carrying output),
OTELBPF_GEN_AI_RESPONSE_CHUNKS = "otelbpf.gen_ai.response.chunks"
#: mean seconds between consecutive output chunks ((last - first) / (chunks - 1)),
OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK = "otelbpf.gen_ai.response.time_per_output_chunk"
#: captured prompt/completion text was cut to the capture limit.
OTELBPF_GEN_AI_CONTENT_TRUNCATED = "otelbpf.gen_ai.content.truncated"
#: holes in the response body (bytes the capture lost) that the stream was resumed after,
OTELBPF_GEN_AI_RESPONSE_GAPS = "otelbpf.gen_ai.response.gaps"
#: where gen_ai.usage.* came from when not from this side's own bytes: ``peer`` (the other
#: end of the same call, traced too, read them; as otelbpf.rpc.method.source for gRPC).
OTELBPF_GENAI_USAGE_SOURCE = "otelbpf.genai.usage.source"
#: rerank / score calls: documents sent to be ranked or scored, the request's top_n,
#: and the results the response returned.
OTELBPF_GEN_AI_REQUEST_DOCUMENTS = "otelbpf.gen_ai.request.documents"
OTELBPF_GEN_AI_REQUEST_TOP_N = "otelbpf.gen_ai.request.top_n"
OTELBPF_GEN_AI_RESPONSE_RESULTS = "otelbpf.gen_ai.response.results"
#: v2 inference calls: the model version (the path's, else the response's), the input
#: tensors the request sent and the output tensors the response returned.
OTELBPF_GEN_AI_REQUEST_MODEL_VERSION = "otelbpf.gen_ai.request.model_version"
OTELBPF_GEN_AI_REQUEST_INPUTS = "otelbpf.gen_ai.request.inputs"
OTELBPF_GEN_AI_RESPONSE_OUTPUTS = "otelbpf.gen_ai.response.outputs"
#: otelbpf's own HTTP/2 and gRPC span attributes:
#: some header field of the stream referred to an HPACK entry older than the agent (docs/http2.md),
OTELBPF_HTTP2_HPACK_INCOMPLETE = "otelbpf.http2.hpack_incomplete"
#: the stream's request came through ``Upgrade: h2c``,
OTELBPF_HTTP2_UPGRADED = "otelbpf.http2.upgraded"
#: RST_STREAM / GOAWAY error code that ended the stream,
OTELBPF_HTTP2_RESET_CODE = "otelbpf.http2.error_code"
#: where ``rpc.method`` came from: ``header`` (the decoded :path), ``peer`` (the other end of
#: the connection decoded it for the same stream) or ``unknown``,
OTELBPF_RPC_METHOD_SOURCE = "otelbpf.rpc.method.source"
#: gRPC messages sent / received in the call (length-prefixed messages counted in DATA).
OTELBPF_RPC_REQUEST_MESSAGES = "otelbpf.rpc.request.messages"
OTELBPF_RPC_RESPONSE_MESSAGES = "otelbpf.rpc.response.messages"

# --- GPU: CUDA runtime/driver and NCCL calls (otelbpf's own: no convention exists; docs/gpu.md) ---
#: Instrumentation scopes / CallEvent libraries of the GPU call spans.
OTELBPF_SCOPE_CUDA = "cuda"
OTELBPF_SCOPE_NCCL = "nccl"
#: On every GPU call span: the API function (the span's name), as the code conventions name it.
CODE_FUNCTION_NAME = "code.function.name"
#: Metrics from the GPU call spans (otelbpf/metrics/gpu.py): durations per function, bytes per
#: copy direction (pageable or not), NCCL bytes and durations per operation.
OTELBPF_GPU_CALL_DURATION = "otelbpf.gpu.call.duration"
OTELBPF_GPU_MEMCPY_SIZE = "otelbpf.gpu.memcpy.size"
OTELBPF_NCCL_CALL_DURATION = "otelbpf.nccl.call.duration"
OTELBPF_NCCL_CALL_SIZE = "otelbpf.nccl.call.size"
#: 1 µs to 10 s: a launch-sized call to a long synchronisation or collective.
GPU_DURATION_BOUNDARIES: tuple[float, ...] = (
    1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0,
)
#: 1 KiB to 4 GiB, by powers of 4.
GPU_SIZE_BOUNDARIES: tuple[float, ...] = tuple(float(1024 * 4**i) for i in range(12))
#: On a request span: GPU kernel launches its thread made while serving it
#: (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch;
#: a CUDA-graph replay counts once).
OTELBPF_GPU_KERNEL_LAUNCHES = "otelbpf.gpu.kernel_launches"
#: On a CUDA call span: the CUDA error code the call returned (only when not success).
OTELBPF_GPU_ERROR_CODE = "otelbpf.gpu.error_code"
#: Copies: direction (``host_to_device``, ``device_to_host``, ``device_to_device``,
#: ``host_to_host``, ``default``), bytes, and whether the host side was pageable
#: (not pinned by a cudaHostAlloc/cuMemHostAlloc the agent saw: the copy blocks
#: the calling thread for the whole transfer).
OTELBPF_GPU_MEMCPY_KIND = "otelbpf.gpu.memcpy.kind"
OTELBPF_GPU_MEMCPY_BYTES = "otelbpf.gpu.memcpy.bytes"
OTELBPF_GPU_MEMCPY_PAGEABLE = "otelbpf.gpu.memcpy.pageable"
#: Metrics per process: device memory reserved through the CUDA allocation calls the agent saw
#: (allocated - freed: what a caching allocator holds, not what tensors use), and its high-water mark.
OTELBPF_GPU_MEMORY_RESERVED = "otelbpf.gpu.memory.reserved"
OTELBPF_GPU_MEMORY_RESERVED_MAX = "otelbpf.gpu.memory.reserved.max"
#: Allocation and free calls (device and pinned host memory): bytes and the address.
OTELBPF_GPU_MEMORY_BYTES = "otelbpf.gpu.memory.bytes"
OTELBPF_GPU_MEMORY_ADDRESS = "otelbpf.gpu.memory.address"
#: The stream handle a call was made on (0: the default stream).
OTELBPF_GPU_STREAM = "otelbpf.gpu.stream"
#: NCCL calls: collective (``AllReduce``...), element count, datatype, bytes
#: (count x datatype size), reduction, communicator (its handle, hex), peer or
#: root rank, and for communicator set-up the rank and number of ranks.
OTELBPF_NCCL_OPERATION = "otelbpf.nccl.operation"
OTELBPF_NCCL_COUNT = "otelbpf.nccl.count"
OTELBPF_NCCL_DATATYPE = "otelbpf.nccl.datatype"
OTELBPF_NCCL_BYTES = "otelbpf.nccl.bytes"
OTELBPF_NCCL_REDUCE_OP = "otelbpf.nccl.reduce_op"
OTELBPF_NCCL_COMMUNICATOR = "otelbpf.nccl.communicator"
OTELBPF_NCCL_PEER = "otelbpf.nccl.peer"
OTELBPF_NCCL_ROOT = "otelbpf.nccl.root"
OTELBPF_NCCL_RANK = "otelbpf.nccl.rank"
OTELBPF_NCCL_NRANKS = "otelbpf.nccl.nranks"
#: On ncclCommInitRank spans: the first 16 bytes of the ncclUniqueId (hex), the same in every
#: rank's process: what matches one communicator across processes. Also on the collective
#: spans of a communicator whose ncclCommInitRank was seen.
OTELBPF_NCCL_UNIQUE_ID = "otelbpf.nccl.unique_id"
#: ncclResult_t a call returned (only when not ncclSuccess).
OTELBPF_NCCL_RESULT = "otelbpf.nccl.result"

# --- GPU engine steps (otelbpf's own; docs/gpu.md "Batching engines") ------------------
#: Name of the span of one engine step: GPU work on a thread that serves no request
#: (a continuous-batching worker, vLLM's engine core), linked to the requests in flight.
OTELBPF_GPU_STEP_SPAN_NAME = "gpu step"
#: Its instrumentation scope (``otelbpf.gpu_step``) and span protocol (no metric instruments).
OTELBPF_SCOPE_GPU_STEP = "gpu_step"
#: otelbpf.association of a GPU call span placed under its engine step.
OTELBPF_ASSOCIATION_GPU_STEP = "gpu_step"
#: GPU call spans made during the step (its children).
OTELBPF_GPU_STEP_CALLS = "otelbpf.gpu.step.calls"
#: What ended it: ``synchronize`` (a stream/device/context/event sync returned),
#: ``idle`` (no GPU call or launch for the idle gap), ``max_duration``,
#: ``process_exited``, ``agent_stopped``, ``evicted`` (too many threads with a step open).
OTELBPF_GPU_STEP_END_REASON = "otelbpf.gpu.step.end_reason"
#: Requests (server spans in the step's scope) in flight at any time during the step,
#: and how many of them got no link (beyond the link limit).
OTELBPF_GPU_STEP_REQUESTS = "otelbpf.gpu.step.requests"
OTELBPF_GPU_STEP_LINKS_DROPPED = "otelbpf.gpu.step.links_dropped"

# --- GPU: launches per process, time in launch calls, folded short calls, rank lateness ---
# (otelbpf's own, docs/gpu.md "Metrics", "Short calls", "Slow ranks")
#: Per-process monotonic Sums read from the BPF launch totals (bpf/gpu.c): kernel launches, and
#: (--gpu-launch-time) seconds spent inside the launch calls.
OTELBPF_GPU_KERNEL_LAUNCHES_METRIC = "otelbpf.gpu.kernel.launches"
OTELBPF_GPU_KERNEL_LAUNCH_TIME_METRIC = "otelbpf.gpu.kernel.launch.time"
#: On a request span (--gpu-launch-time): nanoseconds its thread spent inside kernel launch calls.
OTELBPF_GPU_KERNEL_LAUNCH_DURATION = "otelbpf.gpu.kernel_launch.duration"
#: On a request span: the CUDA calls shorter than --gpu-min-call-duration made under it, not
#: exported one by one; three aligned arrays: function, how many calls, their total nanoseconds.
OTELBPF_GPU_FOLDED_CALLS_FUNCTION = "otelbpf.gpu.folded_calls.function"
OTELBPF_GPU_FOLDED_CALLS_COUNT = "otelbpf.gpu.folded_calls.count"
OTELBPF_GPU_FOLDED_CALLS_DURATION = "otelbpf.gpu.folded_calls.duration"
#: On an NCCL collective span matched with the other ranks' on this node: nanoseconds after the
#: first rank it entered this collective, and whether it was the last rank to enter.
OTELBPF_NCCL_LATENESS = "otelbpf.nccl.lateness"
OTELBPF_NCCL_LAST_TO_ENTER = "otelbpf.nccl.last_to_enter"
#: Histogram (s) of OTELBPF_NCCL_LATENESS by communicator (OTELBPF_NCCL_UNIQUE_ID), rank, operation.
OTELBPF_NCCL_COLLECTIVE_LATENESS = "otelbpf.nccl.collective.lateness"
#: 0 (first in, or scheduling noise) to 10 s (a rank stuck in data loading or a checkpoint).
NCCL_LATENESS_BOUNDARIES: tuple[float, ...] = (
    1e-5, 1e-4, 5e-4, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)

# --- NCCL collectives across nodes (otelbpf's own; docs/gpu.md "Slow ranks across nodes") ---
#: On a collective span: NCCL's communicator id (commHash, hashed from the ncclUniqueId; 16 hex
#: digits, as RAS prints it), the same on every rank and node; and the collective's sequence
#: number among the communicator's collectives of its function, from the communicator's creation
#: (NCCL's seqNumber). With the operation they name one instance: its trace.
OTELBPF_NCCL_COMM_HASH = "otelbpf.nccl.comm_hash"
OTELBPF_NCCL_SEQUENCE = "otelbpf.nccl.sequence"
#: On a collective span left in its issuer's trace: why (``setup_not_seen``: the agent came after
#: the communicator's set-up and NCCL's count has not aligned it; ``not_counted``).
OTELBPF_NCCL_UNJOINED = "otelbpf.nccl.unjoined"
#: otelbpf.association of a collective span in its instance's trace (a link to its issuer).
OTELBPF_ASSOCIATION_COLLECTIVE = "collective"
#: On a collective span: the rank's time since its previous collective returned on the same
#: thread (ns), and of it the time waiting for the GPU (synchronisations, blocking and pageable
#: copies), on the CPU and off it (without the thread's off-CPU clock: the last two absent).
OTELBPF_NCCL_INTERVAL_DURATION = "otelbpf.nccl.interval.duration"
OTELBPF_NCCL_INTERVAL_GPU_WAIT = "otelbpf.nccl.interval.gpu_wait"
OTELBPF_NCCL_INTERVAL_ON_CPU = "otelbpf.nccl.interval.on_cpu"
OTELBPF_NCCL_INTERVAL_OFF_CPU = "otelbpf.nccl.interval.off_cpu"
#: Histogram (s) per rank and communicator (comm_hash, rank, nranks) of each collective cycle's
#: time by OTELBPF_NCCL_STATE: ``collective`` (inside the collective: the rank's wait),
#: ``gpu_wait``, ``on_cpu``, ``off_cpu`` (before it, since the previous one), ``host`` (on + off
#: the CPU, when the thread has no off-CPU clock). The slow rank waits least.
OTELBPF_NCCL_TIME = "otelbpf.nccl.time"
OTELBPF_NCCL_STATE = "otelbpf.nccl.state"
#: Gauge per joined rank (comm_hash, rank): ranks in its communicator (a backend compares a
#: communicator's ranks only when all report).
OTELBPF_NCCL_RANKS = "otelbpf.nccl.ranks"
#: RAS (NCCL's own report, otelbpf/sources/nccl_ras.py), gauges per communicator: ranks missing
#: from the last gather, of them considered dead, and per function the spread of the ranks'
#: launched collective counts (highest - lowest), by otelbpf.nccl.operation; per rank of a traced
#: process: its count.
OTELBPF_NCCL_RAS_RANKS_MISSING = "otelbpf.nccl.ras.ranks.missing"
OTELBPF_NCCL_RAS_RANKS_DEAD = "otelbpf.nccl.ras.ranks.dead"
OTELBPF_NCCL_RAS_COUNT_SPREAD = "otelbpf.nccl.ras.collectives.spread"
OTELBPF_NCCL_RAS_RANK_COLLECTIVES = "otelbpf.nccl.ras.rank.collectives"
#: RAS: Sums per communicator and traced rank: replies read, and of them those in which the
#: rank had launched fewer collectives than the communicator's furthest rank (it lags).
OTELBPF_NCCL_RAS_REPLIES = "otelbpf.nccl.ras.replies"
OTELBPF_NCCL_RAS_RANK_BEHIND = "otelbpf.nccl.ras.rank.behind"
