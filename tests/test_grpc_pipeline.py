"""gRPC and plain HTTP/2 through the in-process pipeline: a real grpcio capture
replayed as both processes' events -> spans (RPC conventions v1.44) and metrics."""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind, StatusCode
from otelbpf.metrics.histograms import SpanMetrics
from otelbpf.semantics.grpc import emit_deprecated_names
from protocols.base import Direction
from protocols.http2.tests.traffic import GRPC_ALL, Conversation
from tests.test_pipeline import accepted, connected, data, make_pipeline

IN, OUT = Direction.INGRESS, Direction.EGRESS
CLIENT_PID, SERVER_PID = 100, 200
METHODS = ["demo.Inference/Predict", "demo.Inference/StreamTokens", "demo.Inference/Upload",
           "demo.Inference/Chat", "demo.Inference/Predict"]


def replay(capture, rpc_dup=False):
    """Client pid 100 (conn 1) and server pid 200 (conn 2) exchange ``capture``."""
    pipeline, out, counters = make_pipeline()
    pipeline.registry.semantics("http2").rpc_dup = rpc_dup
    metrics = SpanMetrics(pipeline.resources, pipeline.registry.instruments())
    events = [connected(1, CLIENT_PID, local_port=40000, peer_port=50051),
              accepted(2, SERVER_PID, local_port=50051, peer_port=40000)]
    for to_server, ts, payload in capture:
        ts = ts + 10
        if to_server == 0:
            events += [data(ts, 1, CLIENT_PID, OUT, payload, fd=6), data(ts + 1, 2, SERVER_PID, IN, payload)]
        else:
            events += [data(ts, 2, SERVER_PID, OUT, payload), data(ts + 1, 1, CLIENT_PID, IN, payload, fd=6)]
    pipeline.handle(events)
    pipeline.finish()
    for span in out.spans:
        metrics.record(span)
    return out.spans, _Points(metrics.collect()), counters


class _Points:
    """Histogram points of every process, by instrument name."""

    def __init__(self, collection) -> None:
        self.collection = collection

    def points(self, name: str) -> list:
        return [point for process in self.collection.processes for point in process.points(name)]


def test_each_call_gives_one_span_per_side_with_rpc_attributes():
    spans, metrics, _ = replay(GRPC_ALL)
    clients = sorted((s for s in spans if s.kind == SpanKind.CLIENT), key=lambda s: s.start_ns)
    servers = sorted((s for s in spans if s.kind == SpanKind.SERVER), key=lambda s: s.start_ns)
    assert [s.name for s in clients] == METHODS == [s.name for s in servers]
    for client, server in zip(clients, servers):
        assert server.parent_span_id == client.span_id and server.trace_id == client.trace_id
        for span in (client, server):
            assert span.attributes[sc.RPC_SYSTEM_NAME] == "grpc"
            assert span.attributes[sc.RPC_METHOD] == span.name
            assert span.attributes[sc.NETWORK_PROTOCOL_VERSION] == "2"
            assert span.attributes[sc.OTELBPF_RPC_METHOD_SOURCE] == "header"
            assert sc.OTELBPF_HTTP2_HPACK_INCOMPLETE not in span.attributes
            assert span.scope == "otelbpf.http2"
    statuses = [s.attributes[sc.RPC_RESPONSE_STATUS_CODE] for s in clients]
    assert statuses == ["OK", "OK", "OK", "OK", "NOT_FOUND"]
    # NOT_FOUND: an error for the client, not for the server
    assert clients[4].status_code == StatusCode.ERROR and clients[4].attributes[sc.ERROR_TYPE] == "NOT_FOUND"
    assert servers[4].status_code == StatusCode.UNSET and sc.ERROR_TYPE not in servers[4].attributes
    assert clients[1].attributes[sc.OTELBPF_RPC_RESPONSE_MESSAGES] == 3
    assert clients[2].attributes[sc.OTELBPF_RPC_REQUEST_MESSAGES] == 3
    assert sc.RPC_SYSTEM_OLD not in clients[0].attributes
    server_points = metrics.points(sc.RPC_SERVER_CALL_DURATION)
    client_points = metrics.points(sc.RPC_CLIENT_CALL_DURATION)
    assert sum(p.count for p in server_points) == 5 == sum(p.count for p in client_points)
    assert {tuple(sorted(p.attributes.items())) for p in client_points} >= {
        ((sc.RPC_METHOD, "demo.Inference/Predict"), (sc.RPC_RESPONSE_STATUS_CODE, "OK"), (sc.RPC_SYSTEM_NAME, "grpc")),
    }
    assert not metrics.points(sc.HTTP_SERVER_REQUEST_DURATION)


def test_rpc_dup_also_writes_the_deprecated_names():
    assert emit_deprecated_names({"OTEL_SEMCONV_STABILITY_OPT_IN": "http, rpc/dup"})
    assert not emit_deprecated_names({"OTEL_SEMCONV_STABILITY_OPT_IN": "rpc"})
    spans, _, _ = replay(GRPC_ALL, rpc_dup=True)
    client = next(s for s in spans if s.kind == SpanKind.CLIENT and s.attributes[sc.RPC_RESPONSE_STATUS_CODE] == "NOT_FOUND")
    assert client.attributes[sc.RPC_SYSTEM_OLD] == "grpc"
    assert client.attributes[sc.RPC_SERVICE_OLD] == "demo.Inference"
    assert client.attributes[sc.RPC_GRPC_STATUS_CODE_OLD] == 5


def test_joined_late_spans_say_so_and_name_unknown_methods_other():
    first = next(i for i, (d, _, b) in enumerate(GRPC_ALL) if d == 0 and len(b) > 9 and b[3] == 1
                 and int.from_bytes(b[5:9], "big") == 9)
    spans, _, _ = replay(GRPC_ALL[first:])
    assert len(spans) == 2
    for span in spans:
        assert span.name == "grpc" and span.attributes[sc.RPC_METHOD] == "_OTHER"
        assert span.attributes[sc.OTELBPF_RPC_METHOD_SOURCE] == "unknown"
        assert span.attributes[sc.OTELBPF_HTTP2_HPACK_INCOMPLETE] is True
        assert span.attributes[sc.RPC_RESPONSE_STATUS_CODE] == "NOT_FOUND"


def test_plain_http2_gets_http_spans_with_version_2():
    conv = Conversation()
    conv.request(1, [(":method", "GET"), (":scheme", "http"), (":path", "/items/42?x=1"), (":authority", "api:8080"),
                     ("user-agent", "curl/8"), ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
                 end_stream=True)
    conv.response(1, [(":status", "503")])
    conv.data(False, 1, b"busy", end_stream=True)
    capture = [(0, 0, bytes(conv.client)), (1, 5, bytes(conv.server))]
    spans, metrics, _ = replay(capture)
    server = next(s for s in spans if s.kind == SpanKind.SERVER)
    client = next(s for s in spans if s.kind == SpanKind.CLIENT)
    assert server.name == "GET /items/{id}" and client.name == "GET"
    assert server.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 503 and server.status_code == StatusCode.ERROR
    assert server.attributes[sc.NETWORK_PROTOCOL_VERSION] == "2" and sc.URL_QUERY not in server.attributes
    assert client.attributes[sc.URL_FULL] == "http://api:8080/items/42"
    assert client.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"  # traceparent propagated
    assert client.attributes[sc.HTTP_RESPONSE_BODY_SIZE] == 4
    assert sum(p.count for p in metrics.points(sc.HTTP_SERVER_REQUEST_DURATION)) == 1
    assert not metrics.points(sc.RPC_SERVER_CALL_DURATION)


def test_a_client_write_cut_short_takes_its_method_from_the_server_end():
    """The client's first write (preface, SETTINGS, HEADERS, DATA) lost its end, as
    a gathered write of more iovecs than the probe copies does; the server read it whole."""
    from dataclasses import replace

    first = next(i for i, (d, _, b) in enumerate(GRPC_ALL) if d == 0 and len(b) > 9 and b[3] == 1)
    pipeline, out, _ = make_pipeline()
    events = [connected(1, CLIENT_PID, local_port=40000, peer_port=50051),
              accepted(2, SERVER_PID, local_port=50051, peer_port=40000)]
    for index, (to_server, ts, payload) in enumerate(GRPC_ALL[: first + 12]):
        ts += 10
        if to_server == 0:
            client_write = data(ts, 1, CLIENT_PID, OUT, payload, fd=6)
            if index == first:  # keep 4 bytes of stream 1's HEADERS frame
                client_write = replace(client_write, data=payload[:4])
            events += [client_write, data(ts + 1, 2, SERVER_PID, IN, payload)]
        else:
            events += [data(ts, 2, SERVER_PID, OUT, payload), data(ts + 1, 1, CLIENT_PID, IN, payload, fd=6)]
    pipeline.handle(events)
    pipeline.finish()
    predict = [s for s in out.spans if s.attributes.get(sc.RPC_METHOD) == "demo.Inference/Predict"]
    client = next(s for s in predict if s.kind == SpanKind.CLIENT)
    server = next(s for s in predict if s.kind == SpanKind.SERVER)
    assert server.attributes[sc.OTELBPF_RPC_METHOD_SOURCE] == "header"
    assert client.attributes[sc.OTELBPF_RPC_METHOD_SOURCE] == "peer"
    assert client.attributes[sc.OTELBPF_HTTP2_HPACK_INCOMPLETE] is True
    assert client.attributes[sc.RPC_RESPONSE_STATUS_CODE] == "OK"
